"""Advance a training job through a timeline of network states under one strategy.

Within a state every plan's iteration time is constant (the cost model under that
state's bandwidth), so progress is exact: ``elapsed / iteration_time`` iterations. At each
state change the strategy offers plans; the switch rule (``switching.py``, the same for
every strategy) gives each the time it is expected to save over the rest of the run, and
the job switches to the best whose saving exceeds its migration (``migration.py``: the
state that changes owner, over the links of this state, plus a restart). When the plan
running loses a host, the work since the last checkpoint is lost and the job restarts
from the checkpoint on the best plan offered (reading it back from storage). Checkpoints
are written every ``checkpoint_interval_s`` of the run, each a stall. Planning time a
strategy charges and migrations are stalls too. When no plan is possible the job stalls
until one is; if that never happens it reports when it stalled.

``advance`` is the one account of progress, checkpoints and stalls within a state: the
hindsight oracle (``oracle.py``) runs its schedules through it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hetpar.dynamics.scenario import Migration, Timeline
from hetpar.dynamics.strategies import Planners, Strategy
from hetpar.dynamics.switching import SwitchRule
from hetpar.plan import Plan

__all__ = ["Progress", "RunResult", "Segment", "SimSettings", "advance", "plan_hosts",
           "simulate"]


@dataclass(frozen=True)
class SimSettings:
    iterations: int
    tokens_per_iteration: int
    migration: Migration = field(default_factory=Migration)
    params: float = 0.0  # the model's parameters (checkpoint bytes)
    rule: SwitchRule = field(default_factory=SwitchRule)

    @property
    def checkpoint_write_s(self) -> float:
        return self.migration.write_s(self.params)

    @property
    def reload_s(self) -> float:
        return self.migration.reload_s(self.params)


@dataclass(frozen=True)
class Segment:
    """An interval of the run: what ran (plan id, seconds per iteration) or why not."""

    start_s: float
    end_s: float
    iter_time_s: float  # nan while stalled
    plan_id: int  # -1 while stalled
    kind: str  # run | migrate | plan | stall | checkpoint | recover


@dataclass(frozen=True)
class Progress:
    """Where a job stands: iterations done, when its current stall ends, the iterations
    its last checkpoint holds."""

    done: float = 0.0
    busy_until: float = 0.0
    checkpoint: float = 0.0


def advance(pos: Progress, iter_s: float, start: float, end: float, target: float,
            settings: SimSettings, segments: list[Segment] | None = None, plan_id: int = -1,
            ) -> tuple[Progress, float | None]:
    """Run from ``start`` to ``end`` at ``iter_s`` seconds per iteration (inf: no plan)
    after the stall ``pos.busy_until``; checkpoints at multiples of the interval. Returns
    the new position and the finish time if ``target`` iterations are reached."""
    every = settings.migration.checkpoint_interval_s
    write = settings.checkpoint_write_s
    done, busy, ck = pos.done, pos.busy_until, pos.checkpoint
    if not math.isfinite(iter_s):
        return pos, None  # no plan: no progress and nothing to checkpoint
    t = start
    while t < end:
        if busy > t and done <= ck:
            # Stalled with nothing unsaved: no checkpoint is due before the stall ends.
            skip = math.floor(busy / every) * every if math.isfinite(every) else busy
            if skip > t:
                t = min(skip, end)
                continue
        nxt = (math.floor(t / every) + 1) * every if math.isfinite(every) else math.inf
        seg_end = min(end, nxt)
        run_from = max(t, busy)
        if run_from < seg_end:
            need = (target - done) * iter_s
            if run_from + need <= seg_end:
                if segments is not None:
                    segments.append(Segment(run_from, run_from + need, iter_s, plan_id, "run"))
                return Progress(target, busy, ck), run_from + need
            done += (seg_end - run_from) / iter_s
            if segments is not None:
                segments.append(Segment(run_from, seg_end, iter_s, plan_id, "run"))
        if nxt <= end and done > ck:  # a checkpoint only holds something new
            ck = done
            w0 = max(busy, nxt)
            busy = w0 + write
            if segments is not None and write > 0:
                segments.append(Segment(w0, busy, math.nan, -1, "checkpoint"))
        t = seg_end
    return Progress(done, busy, ck), None


def plan_hosts(plan: Plan) -> frozenset[str]:
    return frozenset(r.host for st in plan.stages for r in st.replicas)


@dataclass(frozen=True)
class RunResult:
    strategy: str
    finished: bool
    wall_s: float  # time to finish the iterations (inf when the job stalls for ever)
    iterations: float
    tokens: float
    switches: int
    forced_switches: int
    migration_s: float
    planning_charged_s: float
    planning_wall_s: float
    stall_s: float  # time with no feasible plan
    stalled_at_s: float | None  # when the job stalled for good (None: it did not)
    decisions: int
    plans: tuple[str, ...]  # descriptions by plan id
    segments: tuple[Segment, ...]
    switch_times: tuple[float, ...]
    events: tuple[dict[str, Any], ...] = field(default=())
    failures: int = 0  # host losses under the running plan
    lost_iterations: float = 0.0  # work lost to them (since the last checkpoint)
    moved_bytes: float = 0.0  # model state moved by switches
    plan_objects: tuple[Plan, ...] = ()  # by plan id

    @property
    def tokens_per_hour(self) -> float:
        return self.tokens / self.wall_s * 3600.0 if self.finished and self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "finished": self.finished,
                "wall_s": self.wall_s if math.isfinite(self.wall_s) else None,
                "iterations": self.iterations, "tokens": self.tokens,
                "tokens_per_hour": self.tokens_per_hour,
                "switches": self.switches, "forced_switches": self.forced_switches,
                "migration_s": self.migration_s, "moved_bytes": self.moved_bytes,
                "failures": self.failures, "lost_iterations": self.lost_iterations,
                "planning_charged_s": self.planning_charged_s,
                "planning_wall_s": self.planning_wall_s, "stall_s": self.stall_s,
                "stalled_at_s": self.stalled_at_s, "decisions": self.decisions,
                "switch_times_s": list(self.switch_times), "plans": list(self.plans),
                "events": list(self.events)}


def simulate(timeline: Timeline, strategy: Strategy, planners: Planners,
             settings: SimSettings) -> RunResult:
    n_target = float(settings.iterations)
    pos = Progress()
    plan: Plan | None = None
    plan_ids: dict[Plan, int] = {}
    segments: list[Segment] = []
    switch_times: list[float] = []
    events: list[dict[str, Any]] = []
    switches = forced = decisions = failures = 0
    migration_total = charged_total = planning_wall = stall = lost = moved = 0.0
    stalled_at: float | None = None
    finish: float | None = None
    states = timeline.states
    rule = settings.rule

    def rate(p: Plan, k: int) -> float:
        t = planners.iteration_time(p, states[k])
        return 1.0 / t if math.isfinite(t) and t > 0 else 0.0

    belief = rule.belief(rate)

    def pid(p: Plan) -> int:
        return plan_ids.setdefault(p, len(plan_ids))

    for k, st in enumerate(states):
        s, e = st.start_s, (st.end_s if k + 1 < len(states) else math.inf)
        if k == 0:
            dec = strategy.initial(st)
        else:
            belief.observe(states[k - 1].end_s - states[k - 1].start_s)
            dec = strategy.on_change(st, plan)
            decisions += 1
        planning_wall += dec.planning_s
        busy = max(s, pos.busy_until)
        if dec.charged_s > 0:
            segments.append(Segment(busy, busy + dec.charged_s, math.nan, -1, "plan"))
            busy += dec.charged_s
            charged_total += dec.charged_s
        pos = Progress(pos.done, busy, pos.checkpoint)
        work = n_target - pos.done
        # A host of the running plan is gone: the work since the checkpoint with it.
        failed = plan is not None and bool(plan_hosts(plan) & set(st.lost_hosts))
        if failed:
            failures += 1
            lost += pos.done - pos.checkpoint
            pos = Progress(pos.checkpoint, pos.busy_until, pos.checkpoint)
            work = n_target - pos.done
        cur_t = planners.iteration_time(plan, st) if not failed else math.inf
        options = [(o, planners.iteration_time(o, st), src) for o, src in dec.options
                   if o is not None and o != plan]
        options = [o for o in options if math.isfinite(o[1])]
        choice: tuple[Plan, float, str] | None = None
        cost = 0.0
        kind = "migrate"
        flows = None
        if k == 0 or plan is None or not math.isfinite(cur_t):
            # No choice but to (re)start: the option expected to finish soonest.
            if options:
                choice = min(options, key=lambda o: (
                    rule.remaining_s(o[0], o[1], work, belief, k), o[1]))
                if k == 0:
                    cost = 0.0
                elif plan is None or failed:
                    # From the checkpoint (after a failure, or a stall with no plan).
                    cost, kind = settings.reload_s, "recover"
                else:  # the plan's hosts are there but it no longer runs (e.g. memory)
                    flows = planners.flows(plan, choice[0], st)
                    cost = planners.switch_s(plan, choice[0], st, settings.migration)
                if k > 0:
                    forced += 1
        else:
            best = 0.0
            for o, t_o, src in options:
                m = planners.switch_s(plan, o, st, settings.migration)
                back = (planners.switch_s(o, plan, st, settings.migration)
                        if rule.kind == "expected" else 0.0)
                net = rule.saving_s(plan, cur_t, o, t_o, work, belief, k, back) - m
                if net > best:
                    best, choice, cost = net, (o, t_o, src), m
                    flows = planners.flows(plan, o, st)
        if choice is not None:
            new, new_t, src = choice
            if k > 0:
                switches += 1
                migration_total += cost
                if flows is not None:
                    moved += flows.moved_bytes
                segments.append(Segment(pos.busy_until, pos.busy_until + cost, math.nan, -1,
                                        kind))
                pos = Progress(pos.done, pos.busy_until + cost, pos.checkpoint)
                switch_times.append(s)
            events.append({"t_s": s, "state": k, "plan": pid(new), "source": src,
                           "iter_time_s": new_t, "was_s": cur_t if math.isfinite(cur_t)
                           else None, "migration_s": cost, "failure": failed,
                           "topology": st.topology})
            plan, cur_t = new, new_t
        elif not math.isfinite(cur_t):
            plan = None
        if plan is None:
            if stalled_at is None:
                stalled_at = s
            if math.isfinite(e):
                run_from = max(s, pos.busy_until)
                stall += max(0.0, e - run_from)
                segments.append(Segment(run_from, e, math.nan, -1, "stall"))
                continue
            segments.append(Segment(s, s, math.nan, -1, "stall"))
            break
        stalled_at = None
        pos, finish = advance(pos, cur_t, s, e, n_target, settings, segments, pid(plan))
        if finish is not None:
            break

    finished = finish is not None
    descr = sorted(plan_ids.items(), key=lambda kv: kv[1])
    return RunResult(
        strategy=strategy.name, finished=finished,
        wall_s=finish if finish is not None else math.inf,
        iterations=pos.done, tokens=pos.done * settings.tokens_per_iteration,
        switches=switches, forced_switches=forced, migration_s=migration_total,
        planning_charged_s=charged_total, planning_wall_s=planning_wall, stall_s=stall,
        stalled_at_s=None if finished else stalled_at, decisions=decisions,
        plans=tuple(p.describe() for p, _ in descr), segments=tuple(segments),
        switch_times=tuple(switch_times), events=tuple(events), failures=failures,
        lost_iterations=lost, moved_bytes=moved,
        plan_objects=tuple(p for p, _ in descr))
