"""Best completion of a fixed pipeline structure: micro-batches, recompute and layer split.

A plan's *structure* (its stages in pipeline order, each with a GPU type, a TP degree and
the hosts its replicas come from) is the combinatorial part of the search. Given the
structure, the exact search's layer-split subroutine (``exact.best_split`` through
``Searcher.close``) finds the best micro-batch count, recompute mode and layer split in
milliseconds, with the same bounds and memory pruning as the full search. The policy
planner uses it to polish a rollout: a learned structure with exact inner choices, the
two levels of Alpa-style planners.

The result is never worse than the plan given: the search starts with that plan's value
as its incumbent and only replaces it with a strictly better completion. It is anytime:
``max_steps`` (search steps, deterministic: the same plan on every machine) and
``time_limit`` (seconds) stop it early; ``complete`` says whether the structure's optimum
was proven.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.plan import Plan
from hetpar.solvers.bounds import Bounds
from hetpar.solvers.exact import BudgetSearcher, LocalIncumbent, SearchProblem, _Stop
from hetpar.problem.space import PlanSpace, StageChoice

__all__ = ["Completion", "Refinement", "complete_structure", "refine_plan"]


@dataclass(frozen=True)
class Refinement:
    plan: Plan  # the best plan found with the given plan's structure
    value: float  # its objective value (seconds)
    before: float  # the given plan's value
    complete: bool  # every completion of the structure was bounded or evaluated
    wall_s: float
    evaluations: int  # completions evaluated by the cost model
    steps: int  # search steps taken (what ``max_steps`` limits)

    @property
    def improved(self) -> bool:
        return self.value < self.before


@dataclass(frozen=True)
class Completion:
    plan: Plan | None  # the best completion better than ``beat`` (None: none found)
    value: float  # its objective value (inf without a plan)
    complete: bool  # every completion of the structure was bounded or evaluated
    evaluations: int
    steps: int


def complete_structure(cm: CostModel, space: PlanSpace, objective: Objective,
                       stages: tuple[StageChoice, ...], *, max_steps: int | None = None,
                       time_limit: float | None = None, beat: float = math.inf,
                       bounds: Bounds | None = None,
                       max_evaluations: int | None = None, runtime: str = "any") -> Completion:
    """The best (micro-batches, recompute, layer split) of the structure ``stages``
    whose value is below ``beat``, by the exact search's layer-split subroutine, within
    ``max_steps`` search nodes and about ``max_evaluations`` scored completions (checked
    at each node: one node may score a block of up to ``exact.ENUMERATE_SPLITS``).
    ``bounds`` (``make_bounds`` of the same cost model, space and objective) carries
    its stage profiles over from call to call: building them costs more than most
    completions. ``runtime``: only the layer splits and ZeRO stages that framework runs
    (``hetpar.runtime.rules``; the structure must be one it runs)."""
    deadline = time.time() + time_limit if time_limit is not None else math.inf
    searcher = BudgetSearcher(SearchProblem(cm, space, objective, deadline, beat,
                                            runtime=runtime),
                              LocalIncumbent(beat), bounds=bounds, max_steps=max_steps,
                              max_evaluations=max_evaluations)
    complete = True
    try:
        searcher.close(tuple(stages))
    except _Stop:
        complete = False
    found = searcher.best_plan is not None and searcher.best_value < beat
    return Completion(searcher.best_plan if found else None,
                      searcher.best_value if found else math.inf, complete,
                      searcher.counters.leaves, searcher.steps)


def refine_plan(cm: CostModel, space: PlanSpace, objective: Objective, plan: Plan, *,
                max_steps: int | None = None, time_limit: float | None = None,
                beat: float = math.inf, bounds: Bounds | None = None,
                runtime: str = "any") -> Refinement:
    """The best (micro-batches, recompute, layer split) for ``plan``'s stages and hosts.

    ``plan`` must lie in ``space`` (``PlanSpace.decompose`` raises PlanError otherwise).
    The ZeRO stage is the space's largest, as in the exact search; the given plan is kept
    when nothing strictly better is found. With ``beat`` (a value another plan already
    reaches) only completions better than it are sought, so the bounds prune more: a
    caller comparing several structures refines the best first and passes its value."""
    start = time.perf_counter()
    stages, _ = space.decompose(plan)
    core = cm.core(plan)
    before = objective.score(core.total, core.feasible)
    done = complete_structure(cm, space, objective, stages, max_steps=max_steps,
                              time_limit=time_limit, beat=min(before, beat), bounds=bounds,
                              runtime=runtime)
    best, value = plan, before
    if done.plan is not None and done.value < before:
        best, value = done.plan, done.value
    return Refinement(best, value, before, done.complete, time.perf_counter() - start,
                      done.evaluations, done.steps)
