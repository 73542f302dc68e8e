"""Advance a training job through a timeline of network states under one strategy.

Within a state every plan's iteration time is constant (the cost model under that
state's bandwidth), so progress is exact: ``elapsed / iteration_time`` iterations. At each
state change the strategy proposes a plan; the simulator switches when the current plan
became invalid, or when the expected gain over the look-ahead window,
``min(lookahead, remaining work) x (1 - T_new / T_cur)``, exceeds the migration cost.
Planning time the strategy charges and migrations are stalls (no progress). When no plan
is possible the job stalls until one is; if that never happens it reports when it
stalled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hetpar.dynamics.scenario import Timeline
from hetpar.dynamics.strategies import Planners, Strategy
from hetpar.plan import Plan

__all__ = ["RunResult", "Segment", "SimSettings", "simulate"]


@dataclass(frozen=True)
class SimSettings:
    iterations: int
    tokens_per_iteration: int
    migration_s: float
    lookahead_s: float = 600.0


@dataclass(frozen=True)
class Segment:
    """An interval of the run: what ran (plan id, seconds per iteration) or why not."""

    start_s: float
    end_s: float
    iter_time_s: float  # nan while stalled
    plan_id: int  # -1 while stalled
    kind: str  # run | migrate | plan | stall


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

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "finished": self.finished,
                "wall_s": self.wall_s if math.isfinite(self.wall_s) else None,
                "iterations": self.iterations, "tokens": self.tokens,
                "switches": self.switches, "forced_switches": self.forced_switches,
                "migration_s": self.migration_s, "planning_charged_s": self.planning_charged_s,
                "planning_wall_s": self.planning_wall_s, "stall_s": self.stall_s,
                "stalled_at_s": self.stalled_at_s, "decisions": self.decisions,
                "switch_times_s": list(self.switch_times), "plans": list(self.plans),
                "events": list(self.events)}


def simulate(timeline: Timeline, strategy: Strategy, planners: Planners,
             settings: SimSettings) -> RunResult:
    n_target = float(settings.iterations)
    done = 0.0
    busy_until = 0.0  # no progress before this (migration or planning stall)
    plan: Plan | None = None
    plan_ids: dict[Plan, int] = {}
    segments: list[Segment] = []
    switch_times: list[float] = []
    events: list[dict[str, Any]] = []
    switches = forced = decisions = 0
    migration_total = charged_total = planning_wall = stall = 0.0
    stalled_at: float | None = None
    finish: float | None = None
    states = timeline.states

    def pid(p: Plan) -> int:
        return plan_ids.setdefault(p, len(plan_ids))

    for k, st in enumerate(states):
        s, e = st.start_s, (st.end_s if k + 1 < len(states) else math.inf)
        if k == 0:
            dec = strategy.initial(st)
        else:
            dec = strategy.on_change(st, plan)
            decisions += 1
        planning_wall += dec.planning_s
        pause_from = max(s, busy_until)
        pause = dec.charged_s
        if pause > 0:
            segments.append(Segment(pause_from, pause_from + pause, math.nan, -1, "plan"))
        charged_total += pause
        cur_t = planners.iteration_time(plan, st)
        cand = dec.candidate
        new_t = planners.iteration_time(cand, st) if cand is not None else math.inf
        switch = False
        if cand is not None and cand != plan and math.isfinite(new_t):
            if plan is None and k == 0:
                switch = True  # the job starts with it: nothing to migrate
            elif not math.isfinite(cur_t):
                switch = True
                forced += 1
            else:
                window = min(settings.lookahead_s, (n_target - done) * cur_t)
                gain = window * (1.0 - new_t / cur_t)
                switch = gain > settings.migration_s
        if switch:
            if k > 0:
                switches += 1
                migration_total += settings.migration_s
                m0 = pause_from + pause
                segments.append(Segment(m0, m0 + settings.migration_s, math.nan, -1, "migrate"))
                pause += settings.migration_s
                switch_times.append(s)
            events.append({"t_s": s, "state": k, "plan": pid(cand), "source": dec.source,
                           "iter_time_s": new_t, "was_s": cur_t if math.isfinite(cur_t)
                           else None, "topology": st.topology})
            plan, cur_t = cand, new_t
        elif not math.isfinite(cur_t):
            plan = None
        busy_until = pause_from + pause
        run_from = max(s, busy_until)
        if plan is None:
            if stalled_at is None:
                stalled_at = s
            end = e
            if math.isfinite(end):
                stall += end - run_from if end > run_from else 0.0
                segments.append(Segment(run_from, end, math.nan, -1, "stall"))
                continue
            segments.append(Segment(run_from, run_from, math.nan, -1, "stall"))
            break
        stalled_at = None
        if run_from >= e:
            continue
        need = (n_target - done) * cur_t
        if run_from + need <= e:
            finish = run_from + need
            done = n_target
            segments.append(Segment(run_from, finish, cur_t, pid(plan), "run"))
            break
        done += (e - run_from) / cur_t
        segments.append(Segment(run_from, e, cur_t, pid(plan), "run"))

    finished = finish is not None
    descr = sorted(plan_ids.items(), key=lambda kv: kv[1])
    return RunResult(
        strategy=strategy.name, finished=finished,
        wall_s=finish if finish is not None else math.inf,
        iterations=done, tokens=done * settings.tokens_per_iteration,
        switches=switches, forced_switches=forced, migration_s=migration_total,
        planning_charged_s=charged_total, planning_wall_s=planning_wall, stall_s=stall,
        stalled_at_s=None if finished else stalled_at, decisions=decisions,
        plans=tuple(p.describe() for p, _ in descr), segments=tuple(segments),
        switch_times=tuple(switch_times), events=tuple(events))
