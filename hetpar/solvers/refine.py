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
from dataclasses import dataclass, field

from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.plan import Plan
from hetpar.solvers.exact import LocalIncumbent, Problem, Searcher, _Stop
from hetpar.solvers.space import PlanSpace

__all__ = ["Refinement", "refine_plan"]


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


@dataclass
class _BudgetSearcher(Searcher):
    """A searcher that also stops after ``max_steps`` clock checks (one per search node):
    a budget that, unlike a time limit, gives the same answer on every machine."""

    max_steps: int | None = None
    steps: int = field(default=0)

    def _check_time(self) -> None:
        self.steps += 1
        if self.max_steps is not None and self.steps > self.max_steps:
            raise _Stop
        super()._check_time()


def refine_plan(cm: CostModel, space: PlanSpace, objective: Objective, plan: Plan, *,
                max_steps: int | None = None, time_limit: float | None = None,
                beat: float = math.inf) -> Refinement:
    """The best (micro-batches, recompute, layer split) for ``plan``'s stages and hosts.

    ``plan`` must lie in ``space`` (``PlanSpace.decompose`` raises PlanError otherwise).
    The ZeRO stage is the space's largest, as in the exact search; the given plan is kept
    when nothing strictly better is found. With ``beat`` (a value another plan already
    reaches) only completions better than it are sought, so the bounds prune more: a
    caller comparing several structures refines the best first and passes its value."""
    start = time.perf_counter()
    stages, _ = space.decompose(plan)
    core = cm.core(plan)
    before = objective(core.total) if core.feasible else math.inf
    deadline = time.time() + time_limit if time_limit is not None else math.inf
    incumbent = min(before, beat)
    searcher = _BudgetSearcher(Problem(cm, space, objective, deadline, incumbent),
                               LocalIncumbent(incumbent), max_steps=max_steps)
    complete = True
    try:
        searcher.close(stages)
    except _Stop:
        complete = False
    best, value = plan, before
    if searcher.best_plan is not None and searcher.best_value < before:
        best, value = searcher.best_plan, searcher.best_value
    return Refinement(best, value, before, complete, time.perf_counter() - start,
                      searcher.counters.leaves, searcher.steps)
