"""The hindsight oracle: the best schedule of plans for a whole run, knowing its future.

Given the run's timeline, the oracle finds when to run which plan by dynamic programming
over the network states, with the same account of progress, checkpoints, failures and
migrations as every strategy (``simulator.advance``, ``migration.py``). Its plans are
each distinct state's plan from a node-budgeted exact search (proven optimal for that
state where the search finishes, else given with its lower bound) and every plan the
strategies ran, so that no strategy's schedule lies outside its space: every strategy's
regret to it is >= 0. Switches happen at state changes, as the strategies'.

The DP keeps, per plan, the Pareto front of (iterations done, end of the current stall,
iterations the last checkpoint holds): more done, an earlier end of stall and a later
checkpoint are each never worse for the rest of the run, so a dominated position is
dropped. A front is cut to ``MAX_FRONT`` positions (most done first) where it would grow
beyond it; ``OracleResult.front_cut`` says whether that happened (then the schedule is
the best found, not proven best over the space).

``lower_bound_s`` bounds every schedule of every plan of the space from below: each
state run at its certified lower bound on the iteration time, with free switches and no
failure losses (checkpoint writes are paid by every schedule and kept).

``failure_blind`` runs the same DP but learns of each failure only when it happens
(planning with hindsight on the timeline as known until then): the part of a strategy's
regret that needs no foresight of failures (docs/dynamics.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hetpar.dynamics.scenario import NetworkState, Timeline
from hetpar.dynamics.simulator import Progress, SimSettings, advance, plan_hosts
from hetpar.dynamics.strategies import Planners
from hetpar.plan import Plan
from hetpar.problem import Solution

__all__ = ["MAX_FRONT", "ORACLE_NODES", "OracleResult", "failure_blind", "hindsight"]

# Search steps of each state's exact search: where it ends within them, the state's plan
# is proven optimal. Deterministic, unlike a time limit.
ORACLE_NODES = 60_000
MAX_FRONT = 32


@dataclass(frozen=True)
class OracleResult:
    wall_s: float  # the best schedule's finish (inf: none finishes)
    lower_bound_s: float  # no schedule of any plan of the space finishes before
    iterations: float
    switches: int
    failures: int
    migration_s: float
    schedule: tuple[tuple[float, int], ...]  # (time, plan id) of each start or switch
    plans: tuple[Plan, ...]
    states: int  # distinct network states of the run
    certified: int  # of them, those whose exact search finished (plan proven optimal)
    front_cut: bool
    max_front: int

    @property
    def finished(self) -> bool:
        return math.isfinite(self.wall_s)

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s if self.finished else None,
                "lower_bound_s": self.lower_bound_s if math.isfinite(self.lower_bound_s)
                else None,
                "switches": self.switches, "failures": self.failures,
                "migration_s": self.migration_s,
                "schedule": [{"t_s": t, "plan": i} for t, i in self.schedule],
                "plans": [p.describe() for p in self.plans],
                "distinct_states": self.states, "certified_states": self.certified,
                "front_cut": self.front_cut, "max_front": self.max_front}


@dataclass(frozen=True)
class _Label:
    pos: Progress
    history: tuple  # (previous history, (time, plan id)) or ()
    switches: int
    failures: int
    migration_s: float


def _dominated(a: Progress, b: Progress) -> bool:
    """``b`` is at least as good as ``a`` in every respect."""
    return b.done >= a.done and b.busy_until <= a.busy_until and b.checkpoint >= a.checkpoint


def _front(labels: list[_Label]) -> tuple[list[_Label], bool]:
    labels.sort(key=lambda lb: (-lb.pos.done, lb.pos.busy_until, -lb.pos.checkpoint,
                                lb.switches))
    keep: list[_Label] = []
    for lb in labels:
        if not any(_dominated(lb.pos, k.pos) for k in keep):
            keep.append(lb)
    cut = len(keep) > MAX_FRONT
    return keep[:MAX_FRONT], cut


def _state_solutions(states: Iterable[NetworkState], planners: Planners,
                     node_limit: int) -> dict[tuple, Solution]:
    out: dict[tuple, Solution] = {}
    for st in states:
        if st.key not in out:
            out[st.key] = planners.certified(st, node_limit)
    return out


def _plans_of(sols: dict[tuple, Solution], extra_plans: Iterable[Plan]) -> list[Plan]:
    plans: list[Plan] = []
    for p in [*(s.plan for s in sols.values()), *extra_plans]:
        if p is not None and p not in plans:
            plans.append(p)
    return plans


@dataclass
class _Pass:
    """What one pass of the dynamic programme over a run of states found."""

    finishes: list[tuple[float, _Label, int]]  # (finish time, label, plan index)
    labels: dict[int, list[_Label]]  # the fronts after the last state (if none finished)
    cut: bool = False
    max_front: int = 0


def _dp(states: Sequence[NetworkState], plans: list[Plan], planners: Planners,
        settings: SimSettings, start: dict[int, list[_Label]] | None = None,
        forced: dict[float, int] | None = None) -> _Pass:
    """The schedules over ``states`` (each ends at its ``end_s``; the run's last at inf)
    from the positions ``start`` (plan index -> front; None: a fresh run at the first
    state's start). With ``forced`` (state start -> plan index), only the schedule that
    switches exactly there, to those plans, and keeps its plan elsewhere. Stops at the
    first state in which some schedule finishes."""
    n_target = float(settings.iterations)
    hosts = [plan_hosts(p) for p in plans]
    reload_s = settings.reload_s
    labels = start
    out = _Pass([], {})
    for st in states:
        s, e = st.start_s, st.end_s
        times = np.array([planners.iteration_time(p, st) for p in plans])
        valid = [i for i in range(len(plans)) if math.isfinite(times[i])]
        want = forced.get(s) if forced is not None else None
        targets = valid if forced is None else [j for j in valid if j == want]
        new: dict[int, list[_Label]] = {}

        def add(i: int, lb: _Label) -> None:
            new.setdefault(i, []).append(lb)

        if labels is None:
            for i in targets:
                add(i, _Label(Progress(), ((), (s, i)), 0, 0, 0.0))
            if not valid:
                add(-1, _Label(Progress(), (), 0, 0, 0.0))
        else:
            lost = set(st.lost_hosts)
            for i, front in labels.items():
                for lb in front:
                    failed = i >= 0 and bool(hosts[i] & lost)
                    pos = lb.pos
                    if failed:
                        pos = Progress(pos.checkpoint, pos.busy_until, pos.checkpoint)
                    pos = Progress(pos.done, max(s, pos.busy_until), pos.checkpoint)
                    keeps = i >= 0 and not failed and i in valid and \
                        (want is None or want == i)
                    fails = lb.failures + failed
                    if keeps:
                        add(i, _Label(pos, lb.history, lb.switches, fails, lb.migration_s))
                    for j in targets:
                        if j == i:
                            continue
                        # From the checkpoint with no plan or a failed one, else live.
                        cost = (reload_s if i < 0 or failed else
                                planners.switch_s(plans[i], plans[j], st, settings.migration))
                        add(j, _Label(Progress(pos.done, pos.busy_until + cost, pos.checkpoint),
                                      (lb.history, (s, j)), lb.switches + 1, fails,
                                      lb.migration_s + cost))
                    if not valid and not keeps:
                        add(-1, _Label(pos, lb.history, lb.switches, fails, lb.migration_s))
        labels = {}
        for i, front in new.items():
            iter_s = float(times[i]) if i >= 0 else math.inf
            moved: list[_Label] = []
            for lb in front:
                pos, fin = advance(lb.pos, iter_s, s, e, n_target, settings)
                done = _Label(Progress(pos.done, max(pos.busy_until, e) if math.isfinite(e)
                                       else pos.busy_until, pos.checkpoint),
                              lb.history, lb.switches, lb.failures, lb.migration_s)
                if fin is not None:
                    out.finishes.append((fin, done, i))
                else:
                    moved.append(done)
            if moved:
                labels[i], cut = _front(moved)
                out.cut |= cut
                out.max_front = max(out.max_front, len(labels[i]))
        if out.finishes or not labels:
            break
    out.labels = labels or {}
    return out


def _schedule(history: tuple) -> list[tuple[float, int]]:
    sched: list[tuple[float, int]] = []
    h = history
    while h:
        h, step = h
        sched.append(step)
    return sched[::-1]


def _first_finish(p: _Pass) -> tuple[float, _Label]:
    """The earliest finish of a pass (fewest switches among equals) and its label."""
    fin, best, _ = min(p.finishes, key=lambda f: (f[0], f[1].switches))
    return fin, best


def _result(p: _Pass, lower: float, n_target: float, plans: list[Plan],
            sols: dict[tuple, Solution], cut: bool, max_front: int) -> OracleResult:
    certified = sum(bool(s.certificate and s.certificate.optimal) for s in sols.values())
    if not p.finishes:
        return OracleResult(math.inf, lower, 0.0, 0, 0, 0.0, (), tuple(plans), len(sols),
                            certified, cut, max_front)
    fin, best = _first_finish(p)
    return OracleResult(fin, min(lower, fin), n_target, best.switches, best.failures,
                        best.migration_s, tuple(_schedule(best.history)), tuple(plans),
                        len(sols), certified, cut, max_front)


def hindsight(timeline: Timeline, planners: Planners, settings: SimSettings,
              extra_plans: Iterable[Plan] = (), *,
              node_limit: int = ORACLE_NODES) -> OracleResult:
    """The best schedule for ``timeline`` over each state's exact plan and
    ``extra_plans`` (the strategies'), and a lower bound on every schedule."""
    sols = _state_solutions(timeline.states, planners, node_limit)
    plans = _plans_of(sols, extra_plans)
    found = _dp(timeline.states, plans, planners, settings)
    lower = _fluid_bound(timeline, planners, settings, sols, plans)
    return _result(found, lower, float(settings.iterations), plans, sols, found.cut,
                   found.max_front)


def _clip(states: Sequence[NetworkState], start: float, end: float = math.inf,
          ) -> list[NetworkState]:
    """The states' parts within [start, end)."""
    return [replace(st, start_s=max(st.start_s, start), end_s=min(st.end_s, end))
            for st in states if st.end_s > start and st.start_s < end]


def failure_blind(timeline: Timeline, known: Sequence[tuple[float, Timeline]],
                  planners: Planners, settings: SimSettings,
                  extra_plans: Iterable[Plan] = (), *,
                  node_limit: int = ORACLE_NODES) -> OracleResult:
    """The hindsight oracle that learns of each failure only when it happens.

    ``known``: for 0 and each failure time ``t`` (``scenario.failure_times``), in order,
    the timeline as known at ``t`` (``build_timeline(known_at(scenario, t), rng)`` with
    the run's seed): the future bandwidth, and the failures under way, but no failure yet
    to come. From each ``t`` on it follows the best schedule for the timeline known then,
    up to the next failure, which it meets like any strategy (the work since the last
    checkpoint of a plan that loses a host is lost). Its plans are each known state's
    exact plan and ``extra_plans``. It isolates what a strategy loses by planning worse
    from what no strategy can avoid without foreseeing failures; it is a reference, not a
    bound: a strategy can beat it by chance, e.g. by not using, for other reasons, a host
    that then fails."""
    if not known or known[0][0] != 0.0:
        raise ValueError("known timelines must start with the one known at 0")
    all_states = [st for _, tl in known for st in tl.states] + list(timeline.states)
    sols = _state_solutions(all_states, planners, node_limit)
    plans = _plans_of(sols, extra_plans)
    real_sols = {st.key: sols[st.key] for st in timeline.states}
    lower = _fluid_bound(timeline, planners, settings, real_sols, plans)
    n_target = float(settings.iterations)
    current: dict[int, list[_Label]] | None = None
    cut, max_front = False, 0
    for k, (t, tl) in enumerate(known):
        t_next = known[k + 1][0] if k + 1 < len(known) else math.inf
        plan = _dp(_clip(tl.states, t), plans, planners, settings, current)
        cut, max_front = cut or plan.cut, max(max_front, plan.max_front)
        if not plan.finishes:
            return _result(plan, lower, n_target, plans, real_sols, cut, max_front)
        fin, best = _first_finish(plan)
        if fin <= t_next:
            return _result(plan, lower, n_target, plans, real_sols, cut, max_front)
        # Run that schedule on the real states up to the next failure.
        forced = {when: j for when, j in _schedule(best.history) if t <= when < t_next}
        ran = _dp(_clip(timeline.states, t, t_next), plans, planners, settings, current,
                  forced)
        current = ran.labels
    raise AssertionError("the last known timeline runs to the end")  # pragma: no cover


def _fluid_bound(timeline: Timeline, planners: Planners, settings: SimSettings,
                 sols: dict[tuple, Solution], plans: list[Plan]) -> float:
    pos = Progress()
    states = timeline.states
    for k, st in enumerate(states):
        s, e = st.start_s, (st.end_s if k + 1 < len(states) else math.inf)
        sol = sols[st.key]
        lb = sol.certificate.lower_bound if sol.certificate else sol.value
        best = min([lb, *(planners.iteration_time(p, st) for p in plans)])
        pos, fin = advance(pos, best, s, e, float(settings.iterations), settings)
        if fin is not None:
            return fin
    return math.inf
