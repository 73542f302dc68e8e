"""Planners and re-planning strategies for a training run on a changing network.

Every planner sees one network state (the cluster in force and its bandwidth vector, or
for ``robust`` a set of sampled states) as a ``Problem`` (``Planners.problem``) and
returns a ``Solution`` through ``hetpar.agents.planning.plan``: the plan, its value in
that state and the wall time it took.

* ``static``: the best plan for the start state (time-limited exact search, planned
  offline before the job starts); keeps it unless it becomes invalid (a host it uses is
  lost), then re-plans the same way.
* ``robust``: the CVaR-optimal plan over bandwidth states drawn from the scenario's
  processes (an independent realisation), kept like ``static``'s.
* ``policy``: starts from ``static``'s plan and, at every change, asks the trained policy
  for a plan for the new state (milliseconds, charged as stall); candidates are that plan,
  the plans already used in this run and ``robust``'s plan (planned offline with
  ``static``'s), those still valid.
* ``exact``: the same with the time-limited exact search; the oracle does not pay its
  planning time, ``exact-rt`` (realistic) pays it as stall.

The time-limited exact search is ``solve(..., certify=False)``: a hard deadline, the
Metis-style and Megatron-style seeds (not the policy's plan), no ranking of subtrees and
no lower-bound bisection (those can run minutes past the limit on 16-GPU clusters, and a
re-planner must decide in time).

The simulator (``simulator.py``) decides whether to switch to the candidate: only when the
expected gain over the look-ahead window exceeds the migration cost, or when the current
plan is no longer valid.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetpar.agents import planning
from hetpar.cluster.bandwidth import Constant
from hetpar.cluster.topology import Cluster
from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.dynamics.scenario import NetworkState
from hetpar.errors import HetparError, InfeasibleError, PlanError
from hetpar.plan import Plan, validate_plan
from hetpar.problem import Problem, Solution
from hetpar.workload.model import ModelSpec
from hetpar.workload.training import TrainingSpec

__all__ = [
    "STRATEGIES",
    "Decision",
    "Planners",
    "PolicyUnavailable",
    "REPLAN_BEAM",
    "REPLAN_BUDGET_S",
    "REPLAN_REFINE_STEPS",
    "Strategy",
    "cluster_at",
    "make_strategy",
]

STRATEGIES = ("static", "robust", "policy", "exact", "exact-rt")

# The policy re-planner's defaults: one rollout and a short refinement decide fast and
# already beat static and robust (docs/results-dynamic.md measures wider beams).
REPLAN_BEAM = 1
REPLAN_REFINE_STEPS = 150
# Wall-clock budget of one policy decision: the refinement (anytime) stops when it is
# spent, so a slow machine or a long pipeline costs plan polish, not a late decision.
REPLAN_BUDGET_S = 0.045


class PolicyUnavailable(Exception):
    """No trained policy could be loaded (the ``policy`` strategy is skipped)."""


def _no_plan(method: str, objective: Objective, wall_s: float = 0.0) -> Solution:
    """A planner's answer where nothing fits (or no cluster is left)."""
    return Solution(method, objective.name, None, None, math.inf, wall_s)


def cluster_at(cluster: Cluster, bandwidth: np.ndarray) -> Cluster:
    """The same cluster with every link constant at ``bandwidth`` (Gb/s, links order)."""
    links = tuple(dataclasses.replace(lk, bandwidth=Constant(float(b)))
                  for lk, b in zip(cluster.links, bandwidth))
    return dataclasses.replace(cluster, links=links)


@dataclass
class Planners:
    """Shared planning context with memo tables (shared by strategies and seeds: plans
    depend only on the state, and a cached plan is charged its first measured time)."""

    model: ModelSpec
    training: TrainingSpec
    time_limit_s: float = 5.0
    policy_path: str | None = None
    trust_pickle: bool = False  # a format-1 (pickled) policy file may be loaded
    beam: int | None = None  # of the policy's planning (None: REPLAN_BEAM)
    refine_steps: int | None = None  # of each refinement (None: REPLAN_REFINE_STEPS)
    refine_candidates: int | None = None  # structures refined besides the greedy one
    decision_budget_s: float | None = REPLAN_BUDGET_S  # of a policy decision (None: none)
    robust_objective: str = "cvar0.9"
    robust_samples: int = 32
    # Per topology, the problem whose cost model every state of it shares (its
    # bandwidth-free tables: work, memory, flows).
    _problems: dict[str, Problem] = field(default_factory=dict)
    _scores: dict[tuple, float] = field(default_factory=dict)
    _plans: dict[tuple, Solution] = field(default_factory=dict)
    _bundle: Any = None
    _plan_cache: Any = None  # the policy planner's environments per topology (PlanCache)
    _bundle_error: str = ""
    policy_latencies: list[float] = field(default_factory=list)
    exact_latencies: list[float] = field(default_factory=list)

    # -- scoring -----------------------------------------------------------------------
    def problem(self, state: NetworkState, bandwidth: np.ndarray | None = None,
                objective: str = "mean") -> Problem:
        """The planning problem of ``state``: its cluster under its bandwidth (or under
        the (K, links) states ``bandwidth``), scored by ``objective``."""
        assert state.cluster is not None
        base = self._problems.get(state.topology)
        if base is None:
            base = Problem.of(state.cluster, self.model, self.training, samples=1
                              ).with_bandwidth(state.bandwidth[None, :])
            _ = base.cost_model  # built once per topology: the states' problems share it
            self._problems[state.topology] = base
        out = base.with_bandwidth(state.bandwidth[None, :] if bandwidth is None else bandwidth)
        return out if objective == "mean" else out.with_objective(objective)

    def cost_model(self, state: NetworkState) -> CostModel:
        return self.problem(state).cost_model

    def valid(self, plan: Plan | None, state: NetworkState) -> bool:
        if plan is None or state.cluster is None:
            return False
        try:
            validate_plan(plan, state.cluster, self.model, self.training)
        except PlanError:
            return False
        return True

    def iteration_time(self, plan: Plan | None, state: NetworkState) -> float:
        """Seconds per iteration of ``plan`` in ``state`` (inf: invalid or does not fit)."""
        if not self.valid(plan, state):
            return math.inf
        key = (state.key, plan)
        hit = self._scores.get(key)
        if hit is None:
            times, fits = self.cost_model(state).iteration_times(plan)  # type: ignore[arg-type]
            hit = self._scores[key] = float(times[0]) if fits else math.inf
        return hit

    # -- planners ----------------------------------------------------------------------
    def _bounded_exact(self, problem: Problem) -> Solution:
        """The exact search under a hard deadline (``certify=False``); no plan when
        nothing fits."""
        start = time.perf_counter()
        try:
            # Without the policy's plan as a start: this is the oracle the policy's
            # strategy is measured against, and it must not load a policy per state.
            return planning.plan(problem, "exact", time_limit=self.time_limit_s,
                                 certify=False, policy_start=False)
        except InfeasibleError:
            return _no_plan("exact", problem.objective, time.perf_counter() - start)

    def exact(self, state: NetworkState) -> Solution:
        if state.cluster is None:
            return _no_plan("exact", Objective("mean"))
        key = ("exact", state.key)
        hit = self._plans.get(key)
        if hit is None:
            hit = self._bounded_exact(self.problem(state))
            self._plans[key] = hit
            self.exact_latencies.append(hit.wall_s)
        return hit

    def robust(self, state: NetworkState, states: np.ndarray) -> Solution:
        """CVaR-optimal plan for ``state``'s topology over sampled bandwidth ``states``
        ((K, links of state.cluster))."""
        if state.cluster is None:
            return _no_plan("robust", Objective.parse(self.robust_objective))
        key = ("robust", state.topology, np.round(states, 6).tobytes())
        hit = self._plans.get(key)
        if hit is None:
            hit = self._bounded_exact(self.problem(state, states, self.robust_objective))
            self._plans[key] = hit
        return hit

    def bundle(self) -> Any:
        if self._bundle is None and not self._bundle_error:
            try:
                from hetpar.agents.io import load_policy
                self._bundle = load_policy(self.policy_path,
                                           trust_pickle=self.trust_pickle)
            except (HetparError, ImportError) as exc:
                self._bundle_error = str(exc)
        if self._bundle is None:
            raise PolicyUnavailable(self._bundle_error)
        return self._bundle

    def warm_policy(self, state: NetworkState) -> None:
        """Plan once for ``state`` before the job starts, as static's plan is made, so
        that the policy planner's environment, masks and cost tables for this topology
        exist when the first change comes (the result is neither kept nor timed)."""
        if state.cluster is None or self._bundle_error:
            return
        self.policy(state, record=False)

    def policy(self, state: NetworkState, incumbent: float = math.inf, *,
               record: bool = True) -> Solution:
        """The policy's plan for ``state``; ``incumbent``: the value in ``state`` of the
        best plan the caller already holds, which the refinement then has to beat. The
        result's method is ``policy`` (the timeline's name of this planner)."""
        mean = Objective("mean")
        if state.cluster is None:
            return _no_plan("policy", mean)
        key = ("policy", state.key, incumbent)
        hit = self._plans.get(key)
        if hit is None:
            from hetpar.agents.planner import REFINE_CANDIDATES, PlanCache
            bundle = self.bundle()
            if self._plan_cache is None:
                self._plan_cache = PlanCache()
            # A decision is a latency-critical section: the cyclic collector, triggered by
            # its allocations, would otherwise walk the whole run's heap (exact searches'
            # caches: ~300k objects) inside it now and then. Re-enabled right after; the
            # decision's own garbage is collected then.
            collecting = gc.isenabled()
            gc.disable()
            start = time.perf_counter()
            try:
                # The environment sees every link constant at the state's bandwidth (one
                # state: nothing to sample), and the plan is scored in that state.
                problem = Problem.of(cluster_at(state.cluster, state.bandwidth), self.model,
                                     self.training, objective=mean, samples=1)
                sol: Solution | None = planning.plan(
                    problem, "policy-greedy", policy=bundle, beam=self.beam or REPLAN_BEAM,
                    refine=True, improve_evaluations=0,
                    refine_steps=self.refine_steps or REPLAN_REFINE_STEPS,
                    refine_candidates=REFINE_CANDIDATES if self.refine_candidates is None
                    else self.refine_candidates,
                    cache=self._plan_cache, incumbent=incumbent,
                    budget_s=self.decision_budget_s)
            except HetparError:
                sol = None  # e.g. more hosts than the policy handles
            finally:
                wall = time.perf_counter() - start
                if collecting:
                    gc.enable()
            # The decision's latency is the whole call, as the simulator charges it.
            hit = (_no_plan("policy", mean, wall) if sol is None else
                   dataclasses.replace(sol, method="policy", wall_s=wall))
            if record:
                self._plans[key] = hit
                self.policy_latencies.append(wall)
        return hit


@dataclass(frozen=True)
class Decision:
    """A strategy's proposal at a state change."""

    candidate: Plan | None  # the plan it would run (may be the current one)
    planning_s: float  # wall time of planning (measured, or the cached first measurement)
    charged_s: float  # the part charged to the run as stall
    source: str = ""  # which planner produced the candidate


class Strategy:
    """Base: keep the current plan while valid, else re-plan with ``fallback``."""

    name = "static"
    adaptive = False

    def __init__(self, planners: Planners, robust_states: np.ndarray | None = None,
                 base_links: tuple[str, ...] = ()) -> None:
        self.p = planners
        self.library: list[Plan] = []
        self.robust_states = robust_states
        self.base_links = base_links

    def plan_for(self, state: NetworkState) -> Solution:
        return self.p.exact(state)

    def initial(self, state: NetworkState) -> Decision:
        res = self.plan_for(state)
        if res.plan is not None:
            self.library.append(res.plan)
        return Decision(res.plan, res.wall_s, 0.0, res.method)

    def on_change(self, state: NetworkState, current: Plan | None) -> Decision:
        if self.p.valid(current, state):
            return Decision(current, 0.0, 0.0, "keep")
        res = self.plan_for(state)
        if res.plan is not None and res.plan not in self.library:
            self.library.append(res.plan)
        return Decision(res.plan, res.wall_s, 0.0, res.method)


    def robust_plan(self, state: NetworkState) -> Solution:
        """The CVaR-optimal plan for ``state``'s topology over the sampled bandwidth."""
        assert self.robust_states is not None
        if state.cluster is None:
            return _no_plan("", Objective.parse(self.p.robust_objective))
        from hetpar.dynamics.traces import link_name
        cols = [self.base_links.index(link_name(lk)) for lk in state.cluster.links]
        return self.p.robust(state, self.robust_states[:, cols])


class Robust(Strategy):
    name = "robust"

    def plan_for(self, state: NetworkState) -> Solution:
        return self.robust_plan(state)


class Replanner(Strategy):
    """Re-plans at every change with ``planner``; candidates are its plan and the
    still-valid plans used before in this run (re-scoring a known plan costs a
    cost-model call)."""

    adaptive = True

    def __init__(self, planners: Planners, method: str, charge: bool, **kw: Any) -> None:
        super().__init__(planners, **kw)
        self.method = method
        self.charge = charge
        self.name = {"policy": "policy", "exact": "exact-rt" if charge else "exact"}[method]

    def initial(self, state: NetworkState) -> Decision:
        """``static``'s plan; the CVaR-robust plan, also planned before the job starts, is
        kept as a candidate for later changes (a plan that no state favours much but that
        holds up when links degrade)."""
        dec = super().initial(state)
        if self.method == "policy":
            self.p.warm_policy(state)
        if self.robust_states is not None:
            robust = self.robust_plan(state)
            if robust.plan is not None and robust.plan not in self.library:
                self.library.append(robust.plan)
        return dec

    def on_change(self, state: NetworkState, current: Plan | None) -> Decision:
        known = [(self.p.iteration_time(plan, state), i + 1, plan, "library")
                 for i, plan in enumerate(self.library)]
        if self.method == "policy":
            # The library's best in this state is what the policy's plan must beat: its
            # refinement prunes every completion that would not (fewer search steps).
            res = self.p.policy(state, min((o[0] for o in known), default=math.inf))
        else:
            res = self.p.exact(state)
        options = [(self.p.iteration_time(res.plan, state), 0, res.plan, res.method), *known]
        value, _, best, source = min(options, key=lambda o: (o[0], o[1]))
        if not math.isfinite(value):
            best, source = None, res.method
        if best is not None and best not in self.library:
            self.library.append(best)
        return Decision(best, res.wall_s, res.wall_s if self.charge else 0.0, source)


def make_strategy(name: str, planners: Planners, *, robust_states: np.ndarray | None = None,
                  base_links: tuple[str, ...] = ()) -> Strategy:
    kw: dict[str, Any] = {"robust_states": robust_states, "base_links": base_links}
    if name == "static":
        return Strategy(planners, **kw)
    if name == "robust":
        return Robust(planners, **kw)
    if name == "policy":
        planners.bundle()  # raises PolicyUnavailable early
        return Replanner(planners, "policy", True, **kw)
    if name == "exact":
        return Replanner(planners, "exact", False, **kw)
    if name == "exact-rt":
        return Replanner(planners, "exact", True, **kw)
    raise HetparError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")
