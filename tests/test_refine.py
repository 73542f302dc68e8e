"""``refine_plan``: the best completion of a fixed structure, against enumeration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_solvers import tiny_instance

from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.problem import PlanSpace
from hetpar.solvers.brute import compositions, skeletons
from hetpar.solvers.refine import refine_plan


def _structures(space: PlanSpace, rng: np.random.Generator, n: int, layers: int):
    """Random structures with at least one completion to compare."""
    found = [st for st in skeletons(space, 3) if len(st) <= layers
             and space.micro_batch_options([s.dp for s in st])]
    picks = rng.choice(len(found), size=min(n, len(found)), replace=False)
    return [found[int(i)] for i in picks]


@pytest.mark.parametrize("seed", range(60))
def test_refinement_is_the_best_completion_of_the_structure(seed):
    cluster, model, training, objective = tiny_instance(seed)
    obj = Objective.parse(objective)
    cm = CostModel(cluster, model, training, samples=4, seed=seed)
    space = PlanSpace(cluster, cm.model, training)
    rng = np.random.default_rng(seed)
    zero = max(space.zero_stages)
    checked = 0
    for stages in _structures(space, rng, 3, model.layers):
        ms = space.micro_batch_options([s.dp for s in stages])
        splits = list(compositions(model.layers, len(stages)))
        # Every completion with the space's largest ZeRO stage, as the exact search uses.
        values = []
        for split in splits:
            for m in ms:
                for rc in space.recompute_modes:
                    times, fits = cm.iteration_times(space.to_plan(stages, split, m, rc, zero))
                    values.append(obj(times) if fits else math.inf)
        best = min(values)
        # Start from a random completion (fitting or not) of the structure.
        start = space.to_plan(stages, splits[int(rng.integers(len(splits)))],
                              ms[int(rng.integers(len(ms)))],
                              space.recompute_modes[int(rng.integers(len(space.recompute_modes)))],
                              int(rng.choice(space.zero_stages)))
        ref = refine_plan(cm, space, obj, start)
        before = cm.evaluate(start).value(obj)
        assert ref.complete and ref.before == pytest.approx(before, rel=1e-12)
        assert ref.value == pytest.approx(min(best, before), rel=1e-9)
        assert ref.value <= before
        # Same structure: the stages, their order, GPU types, TP degrees and hosts.
        assert space.decompose(ref.plan)[0] == stages
        if math.isfinite(ref.value):
            assert cm.evaluate(ref.plan).value(obj) == pytest.approx(ref.value, rel=1e-12)
        checked += 1
    assert checked > 0


def test_a_time_limit_keeps_the_given_plan_at_worst():
    cluster, model, training, objective = tiny_instance(3)
    obj = Objective.parse(objective)
    cm = CostModel(cluster, model, training, samples=4, seed=3)
    space = PlanSpace(cluster, cm.model, training)
    stages = next(iter(skeletons(space, 1)))
    plan = space.to_plan(stages, (model.layers,), 1, space.recompute_modes[0],
                         max(space.zero_stages))
    ref = refine_plan(cm, space, obj, plan, time_limit=1e-9)
    assert not ref.complete
    assert ref.value <= ref.before
    assert space.decompose(ref.plan)[0] == stages
