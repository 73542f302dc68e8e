"""Planners and re-planning strategies for a training run on a changing network.

Every planner sees one network state (the cluster in force and its bandwidth vector, or
for ``robust`` a set of sampled states) as a ``Problem`` (``Planners.problem``) and
returns a ``Solution`` through ``hetpar.agents.planning.plan``: the plan, its value in
that state and the wall time it took.

* ``static``: the best plan for the start state (node-budgeted exact search, planned
  offline before the job starts); keeps it unless it becomes invalid (a host it uses is
  lost), then re-plans the same way.
* ``robust``: the CVaR-optimal plan over bandwidth states drawn from the scenario's
  processes (an independent realisation), kept like ``static``'s.
* ``library``: the re-planners' ablation: starts with ``static``'s plan and holds
  ``robust``'s; at a change offers those two (no planner), re-planning like ``static``
  only when neither can run. What a re-planner gains over it, its planner gains.
* ``policy``: starts from ``static``'s plan and, at every change, asks the trained policy
  for a plan for the new state (charged ``POLICY_CHARGE_S``); it offers that plan, the
  plans already used in this run and ``robust``'s plan, those still valid.
* ``exact``: the same with the node-budgeted exact search, its planning not charged;
  ``exact-rt`` charges it (``EXACT_NODE_S`` per node).

The re-planners' exact search is ``solve(..., certify=False, node_limit=REPLAN_NODES)``:
the Metis-style and Megatron-style seeds (not the policy's plan), the first-stage
subtrees in order, stopped after a number of search steps, so the same plans on every
machine (``time_limit_s`` with ``node_limit=None``: a clock instead).

The simulator (``simulator.py``) picks among the offered plans with the switch rule
(``switching.py``), the same for every strategy.
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
from hetpar.dynamics.migration import Flows, migration_flows, migration_s
from hetpar.dynamics.scenario import Migration, NetworkState
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
    "REPLAN_SWEEP_MEMORY",
    "REPLAN_BUDGET_S",
    "REPLAN_NODES",
    "POLICY_CHARGE_S",
    "EXACT_NODE_S",
    "REPLAN_REFINE_STEPS",
    "Strategy",
    "cluster_at",
    "make_strategy",
]

STRATEGIES = ("static", "robust", "library", "policy", "exact", "exact-rt")

# The policy re-planner's defaults: the planner's micro-batch sweep over the policy's own
# memory option (one greedy rollout per allowed micro-batch count, in lockstep) and a
# short refinement. Against one rollout (what ``beam=1`` asks for instead), it
# took the policy's wall time on spot-preemptions from 18,458 to 16,668 s, cloud-congested
# 5,120 -> 4,718 s and host-loss 5,774 -> 5,599 s (3 seeds; the 3 most likely memory
# options gave the same plans), for decisions of 43-72 ms median against 13-18 ms
# (docs/results-dynamic.md).
REPLAN_SWEEP_MEMORY = 1
REPLAN_REFINE_STEPS = 150
# Wall-clock budget of one policy decision, for a caller who wants one (``hetpar replan
# --decision-ms``): the refinement (anytime) stops when it is spent, so a slow machine
# costs plan polish, not a late decision, but the plans then depend on the machine. The
# simulator's default is none: the refinement's step budget alone bounds a decision.
REPLAN_BUDGET_S = 0.045
# Search steps of one exact re-planning search (``solve(certify=False, node_limit=)``):
# about 2 s on a 4-host cluster on the machine the docs' figures come from, and the same
# plans on every machine.
REPLAN_NODES = 20_000
# What a decision is charged as stall, modelled rather than measured so that a run's
# results do not depend on the machine: a policy decision its latency target (decisions
# measure well under it: docs/results-dynamic.md), an exact search per node visited (the
# rate measured on 4-host scenarios, docs/results-dynamic.md).
POLICY_CHARGE_S = 0.05
EXACT_NODE_S = 2.5e-4


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
    depend only on the state; what a decision is charged is modelled, not measured)."""

    model: ModelSpec
    training: TrainingSpec
    time_limit_s: float = 5.0  # of an exact search when ``node_limit`` is None
    node_limit: int | None = REPLAN_NODES
    policy_path: str | None = None
    trust_pickle: bool = False  # a format-1 (pickled) policy file may be loaded
    beam: int | None = None  # of the policy's planning (None: the sweep; 1: one rollout)
    refine_steps: int | None = None  # of each refinement (None: REPLAN_REFINE_STEPS)
    refine_candidates: int | None = None  # structures refined besides the greedy one
    decision_budget_s: float | None = None  # of a policy decision (None: none)
    robust_objective: str = "cvar0.9"
    robust_samples: int = 32
    # Per topology, the problem whose cost model every state of it shares (its
    # bandwidth-free tables: work, memory, flows).
    _problems: dict[str, Problem] = field(default_factory=dict)
    _scores: dict[tuple, float] = field(default_factory=dict)
    _plans: dict[tuple, Solution] = field(default_factory=dict)
    _flows: dict[tuple, Flows] = field(default_factory=dict)
    bytes_per_param: float = 14.0  # of the model state a migration moves
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
        if plan is None:
            return math.inf
        key = (state.key, plan)
        hit = self._scores.get(key)
        if hit is None:
            if not self.valid(plan, state):
                hit = math.inf
            else:
                times, fits = self.cost_model(state).iteration_times(plan)
                hit = float(times[0]) if fits else math.inf
            self._scores[key] = hit
        return hit

    def switch_s(self, a: Plan, b: Plan, state: NetworkState, migration: Migration) -> float:
        """Seconds a live switch from ``a`` to ``b`` stalls the job in ``state``."""
        return migration_s(self.flows(a, b, state), state.bandwidth, migration)

    def flows(self, a: Plan, b: Plan, state: NetworkState) -> Flows:
        """What switching from ``a`` to ``b`` moves on ``state``'s cluster (its links'
        bytes: the same in every bandwidth state of one topology)."""
        assert state.cluster is not None
        key = (a, b, state.topology)
        hit = self._flows.get(key)
        if hit is None:
            hit = self._flows[key] = migration_flows(
                a, b, state.cluster, self.model, self.cost_model(state).constants,
                self.bytes_per_param)
        return hit

    # -- planners ----------------------------------------------------------------------
    def _bounded_exact(self, problem: Problem, node_limit: int | None = None) -> Solution:
        """The exact search (``certify=False``) after ``node_limit`` steps (None: this
        context's ``node_limit``, else its ``time_limit_s``); no plan when nothing fits."""
        start = time.perf_counter()
        limit = node_limit or self.node_limit
        try:
            # Without the policy's plan as a start: the exact re-planner is measured
            # against the policy's, and it must not load a policy per state.
            if limit is not None:
                return planning.plan(problem, "exact", certify=False, policy_start=False,
                                     node_limit=limit)
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

    def certified(self, state: NetworkState, node_limit: int) -> Solution:
        """The hindsight oracle's plan for ``state``: the exact search under a budget of
        ``node_limit`` steps, proven optimal where it finishes (its certificate says
        so), else the best found with a lower bound (the root bound's bisection)."""
        if state.cluster is None:
            return _no_plan("exact", Objective("mean"))
        key = ("certified", state.key, node_limit)
        hit = self._plans.get(key)
        if hit is None:
            hit = self._plans[key] = self._bounded_exact(self.problem(state), node_limit)
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
                # The sweep over the policy's own memory option (2-8 rollouts in
                # lockstep, not hetpar plan's 5-28), unless a beam is asked for.
                decoding: dict[str, Any] = (
                    {"micro_sweep": True, "sweep_memory": REPLAN_SWEEP_MEMORY}
                    if self.beam is None else {"beam": self.beam, "micro_sweep": False})
                sol: Solution | None = planning.plan(
                    problem, "policy-greedy", policy=bundle, **decoding,
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
    """A strategy's proposal at a state change: the plans it offers (each with the
    planner that produced it); the simulator's switch rule picks among them."""

    options: tuple[tuple[Plan, str], ...]
    planning_s: float  # wall time of planning (measured, or the cached first measurement)
    charged_s: float  # the part charged to the run as stall (a modelled time: see
    # POLICY_CHARGE_S and EXACT_NODE_S, so that results do not depend on the machine)

    @property
    def candidate(self) -> Plan | None:
        return self.options[0][0] if self.options else None


def _offer(plan: Plan | None, source: str) -> tuple[tuple[Plan, str], ...]:
    return ((plan, source),) if plan is not None else ()


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
        return Decision(_offer(res.plan, res.method), res.wall_s, 0.0)

    def on_change(self, state: NetworkState, current: Plan | None) -> Decision:
        if self.p.valid(current, state):
            return Decision(_offer(current, "keep"), 0.0, 0.0)
        res = self.plan_for(state)
        if res.plan is not None and res.plan not in self.library:
            self.library.append(res.plan)
        return Decision(_offer(res.plan, res.method), res.wall_s, 0.0)


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
        self.name = {"policy": "policy", "library": "library",
                     "exact": "exact-rt" if charge else "exact"}[method]

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
        known = [(self.p.iteration_time(plan, state), plan) for plan in self.library]
        if self.method == "library":
            # The ablation of the re-planners: no planner at a change, only the plans held
            # before the job (static's and robust's), re-planned as static re-plans when
            # none of them can run.
            held = tuple((plan, "library") for t, plan in known if math.isfinite(t))
            if held:
                return Decision(held, 0.0, 0.0)
            res = self.p.exact(state)
            if res.plan is not None and res.plan not in self.library:
                self.library.append(res.plan)
            return Decision(_offer(res.plan, res.method), res.wall_s, 0.0)
        if self.method == "policy":
            # The library's best in this state is what the policy's plan must beat: its
            # refinement prunes every completion that would not (fewer search steps).
            res = self.p.policy(state, min((o[0] for o in known), default=math.inf))
            charge = POLICY_CHARGE_S
        else:
            res = self.p.exact(state)
            charge = (res.certificate.nodes if res.certificate else 0) * EXACT_NODE_S
        options = list(_offer(res.plan, res.method))
        options += [(plan, "library") for t, plan in known
                    if math.isfinite(t) and plan != res.plan]
        if res.plan is not None and res.plan not in self.library:
            self.library.append(res.plan)
        return Decision(tuple(options), res.wall_s, charge if self.charge else 0.0)


def make_strategy(name: str, planners: Planners, *, robust_states: np.ndarray | None = None,
                  base_links: tuple[str, ...] = ()) -> Strategy:
    kw: dict[str, Any] = {"robust_states": robust_states, "base_links": base_links}
    if name == "static":
        return Strategy(planners, **kw)
    if name == "robust":
        return Robust(planners, **kw)
    if name == "library":
        return Replanner(planners, "library", False, **kw)
    if name == "policy":
        planners.bundle()  # raises PolicyUnavailable early
        return Replanner(planners, "policy", True, **kw)
    if name == "exact":
        return Replanner(planners, "exact", False, **kw)
    if name == "exact-rt":
        return Replanner(planners, "exact", True, **kw)
    raise HetparError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")
