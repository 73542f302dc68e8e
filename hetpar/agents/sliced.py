"""The policy on clusters larger than its observation: it plans one replica slice.

A policy observes at most ``max_hosts`` hosts (32 for the shipped one). A larger cluster
is cut into replica slices (``hetpar.problem.slices``): the policy plans the slice's
problem, whose hosts each stand for ``g`` alike hosts, and the plan is expanded to the
whole cluster, every stage's data parallelism g-fold. The slice is tried at several sizes
(``SLICE_SIZES`` hosts at most, up to the policy's ``max_hosts``): a narrow slice is close
to the clusters the policy was trained on, a wide one leaves fewer hosts idle and lets
the pipeline mix more kinds of host. Each expanded plan is scored by the whole cluster's
cost model and the best is kept: the same ranking of the policy's own candidates that
a beam search makes, no search of other plans.
"""

from __future__ import annotations

import math
import time
from typing import Any

from hetpar.errors import ConfigError, InfeasibleError
from hetpar.problem import Problem
from hetpar.problem.slices import Slicing, slice_problem
from hetpar.problem.solution import Solution
from hetpar.runtime.rules import check_plan, host_runs

__all__ = ["SLICE_SIZES", "plan_on_slices"]

#: Most slice hosts of each slice the policy plans (capped at its ``max_hosts``).
SLICE_SIZES = (8, 16, 32)

# Options of a planner call that name the whole cluster's problem, not a slice's.
_WHOLE_ONLY = ("instance", "cache", "incumbent")


def slicings(problem: Problem, max_hosts: int,
             sizes: tuple[int, ...] = SLICE_SIZES) -> list[Slicing]:
    """The distinct slicings of ``problem`` of at most each of ``sizes`` hosts (a size
    over ``max_hosts`` stands for ``max_hosts``); a size no width allows is left out."""
    out: list[Slicing] = []
    for size in sorted({min(s, max_hosts) for s in sizes}):
        try:
            sl = slice_problem(problem, size)
        except ConfigError:
            continue
        if all(sl.width != o.width for o in out):
            out.append(sl)
    return out


def plan_on_slices(bundle: Any, problem: Problem, *, method: str,
                   sizes: tuple[int, ...] = SLICE_SIZES, **settings: Any) -> Solution:
    """``planner.plan_with_policy`` on each slicing of ``problem`` (``slicings``), the
    best expanded plan by ``problem``'s score. ``details["slices"]`` names the slice kept
    and every one tried. InfeasibleError when the model fits no slice; ConfigError when
    the cluster cannot be sliced."""
    from hetpar.agents import planner

    called = time.perf_counter()
    for key in _WHOLE_ONLY:
        settings.pop(key, None)
    budget = settings.pop("budget_s", None)
    runtime = settings.get("runtime", "any")
    cuts = slicings(problem, bundle.max_hosts, sizes)
    if not cuts:  # the widest slice asked for: its error says why
        slice_problem(problem, min(max(sizes), bundle.max_hosts))
    whole_s = time.perf_counter() - called  # slicing, expanding and scoring on the cluster
    tried: list[dict[str, Any]] = []
    best: tuple[float, Slicing, Solution, Any] | None = None
    timings: dict[str, float] = {}
    evaluations = 0
    reasons: list[str] = []
    for sl in cuts:
        left = None if budget is None else budget - (time.perf_counter() - called)
        if left is not None and left <= 0 and best is not None:
            break
        try:
            sol = planner.plan_with_policy(bundle, sl.problem, method=method,
                                           budget_s=left, **settings)
        except InfeasibleError as exc:
            reasons.append(f"{len(sl.members)} hosts of width {sl.width}: {exc}")
            continue
        assert sol.plan is not None  # the policy's masks guarantee a plan that fits
        t0 = time.perf_counter()
        order = None if runtime == "any" else host_runs(
            [[r.host for r in st.replicas] for st in sol.plan.stages])
        plan = sl.expand(sol.plan) if order is None else sl.expand_in_order(sol.plan, order)
        cannot = check_plan(plan, runtime)
        if cannot:
            reasons.append(f"{len(sl.members)} hosts of width {sl.width}: the expanded plan "
                           f"breaks {runtime}'s rules ({cannot[0]})")
            continue
        value = problem.value(plan)
        whole_s += time.perf_counter() - t0
        evaluations += sol.evaluations + 1
        for part, s in sol.timings.items():
            timings[part] = timings.get(part, 0.0) + s
        tried.append({**sl.describe(), "slice_value_s": sol.value, "value_s": value})
        if best is None or value < best[0]:
            best = (value, sl, sol, plan)
    if best is None or not math.isfinite(best[0]):
        raise InfeasibleError(f"{problem.model.name} fits no replica slice of the cluster"
                              f"{'' if runtime == 'any' else ' that ' + runtime + ' runs'}: "
                              + "; ".join(reasons or ["every expanded plan overflows"]))
    value, sl, sol, plan = best
    timings["slicing"] = whole_s
    details = {**sol.details, "slices": {**sl.describe(), "slice_value_s": sol.value,
                                         "tried": tried}}
    return Solution(sol.method, sol.objective, plan, problem.cost_model.evaluate(plan), value,
                    time.perf_counter() - called, evaluations=evaluations,
                    found_by=sol.found_by, timings=timings, details=details,
                    inputs=problem.describe())
