"""Pieces of the exact search checked against plain references."""

from __future__ import annotations

import numpy as np
import pytest

import hetpar
from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.solvers.exact import SearchProblem, _SuffixFill, root_tasks
from hetpar.problem.space import PlanSpace


def _waterfill_reference(a: list[float], g: list[float], total: float) -> float:
    """min over real n_i >= 1 with sum n_i = total of max_i (a_i n_i + g_i), by bisection."""
    lo = max(ai + gi for ai, gi in zip(a, g))
    if total <= len(a):
        return lo
    hi = lo + max(a) * total
    for _ in range(200):
        mid = (lo + hi) / 2
        need = sum(max(1.0, (mid - gi) / ai) for ai, gi in zip(a, g))
        hi, lo = (mid, lo) if need >= total else (hi, mid)
    return hi


@pytest.mark.parametrize("seed", range(20))
def test_closed_form_water_filling_matches_bisection(seed):
    rng = np.random.default_rng(seed)
    p = int(rng.integers(1, 7))
    a = list(rng.uniform(0.01, 2.0, p))
    g = list(rng.uniform(0.0, 3.0, p))
    fill = _SuffixFill(a, g)
    for j in range(p):
        for total in (1, p, 3 * p + 1, 40):
            want = _waterfill_reference(a[j:], g[j:], float(max(total, p - j)))
            assert fill(j, float(max(total, p - j))) == pytest.approx(want, rel=1e-9)


def test_deeper_task_split_covers_the_same_prefixes():
    cluster = hetpar.load_cluster("amp-het-16")
    model = hetpar.load_model("gpt2-medium")
    training = hetpar.load_training()
    cm = CostModel(cluster, model, training, samples=1)
    space = PlanSpace(cluster, cm.model, training)
    problem = SearchProblem(cm, space, Objective.parse("mean"))
    one = root_tasks(problem, depth=1)
    two = root_tasks(problem, depth=2)
    assert all(t.expand for t in one)
    # Every first stage is either expanded whole or closed alone with its children split.
    firsts = {t.prefix for t in one}
    assert {t.prefix[:1] for t in two} == firsts
    closed_only = {t.prefix for t in two if not t.expand}
    assert closed_only <= firsts
    assert len(two) > len(one) and all(len(t.prefix) <= 2 for t in two)
    assert len({t.prefix for t in two}) == len(two)
