"""The compiled twin of the action masks' completion search (``hatch_build.py``; that the
install builds it is tested with the bounds' twin, in test_native_bounds.py).

The twin is ``hetpar/envs/feasibility.py`` compiled by mypyc: every query must get the
pure-Python source's answer, budget cuts included, so that a policy sees the same masks
(and ``hetpar plan`` returns the same plans) with or without a C compiler.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetpar.envs import context as context_module
from hetpar.envs import feasibility
from hetpar.envs.actions import RECOMPUTE_MODES, ZERO_STAGES
from hetpar.envs.context import InstanceContext
from hetpar.envs.env import PlanBuilderEnv, random_masked_action
from hetpar.problem.generator import load_suite

needs_twin = pytest.mark.skipif(
    feasibility.NATIVE is None,
    reason="no compiled twin in this install (no C compiler, HETPAR_PURE_PYTHON set, or "
           "feasibility.py edited since the package was installed)")

CASES = [("train-small", 0), ("train-mixed", 3), ("test-larger", 1), ("test-hard", 2)]


@needs_twin
def test_the_environment_runs_the_twin():
    ctx = InstanceContext.build(load_suite("train-small").instance(0), samples=1,
                                constants=None, max_micro=16)
    assert feasibility.Completions is feasibility.NATIVE.Completions
    assert feasibility.Completions is not feasibility.PureCompletions
    assert type(ctx.classes) is feasibility.NATIVE.HostClasses
    oracle = ctx.oracle("none", 1, ctx.feasible_micro("none", 1)[0])
    assert type(oracle) is feasibility.NATIVE.Completions


def _pair(ctx: InstanceContext, rc: str, zero: int, m: int, budget: int):
    pure = feasibility.PureCompletions(ctx.cm, ctx.space, feasibility.PureHostClasses.of(ctx.cm),
                                       rc, zero, m, budget=budget)
    twin = feasibility.NATIVE.Completions(ctx.cm, ctx.space,
                                          feasibility.NATIVE.HostClasses.of(ctx.cm), rc, zero, m,
                                          budget=budget)
    return pure, twin


@needs_twin
@pytest.mark.parametrize("suite,index", CASES)
def test_the_twin_answers_every_query_as_the_source(suite, index):
    """Random states and wanted counts, closed and open, with the default budget and a
    tiny one (where answers depend on exactly where the search was cut)."""
    ctx = InstanceContext.build(load_suite(suite).instance(index), samples=1, constants=None,
                                max_micro=16)
    rng = np.random.default_rng(index)
    layers = ctx.cm.model.layers
    checked = 0
    for rc in RECOMPUTE_MODES:
        for zero in ZERO_STAGES:
            if not ctx.allowed_memory_option(rc, zero):
                continue
            for m in ctx.feasible_micro(rc, zero)[-2:]:
                for budget in (400, 3):
                    pure, twin = _pair(ctx, rc, zero, m, budget)
                    for _ in range(25):
                        free = list(ctx.full_free)
                        for _ in range(int(rng.integers(0, 5))):
                            h = int(rng.integers(len(free)))
                            if free[h]:
                                free[h] -= 1 << int(rng.integers(0, free[h].bit_length()))
                        j = int(rng.integers(0, 4))
                        want = int(rng.integers(1, 1 << min(layers, 60))) << 1
                        want &= (1 << (layers + 1)) - 2
                        want = want or 1 << layers
                        assert twin.closed_all(free, j, want) == pure.closed_all(free, j, want)
                        assert twin.witness_closed(free, j) == pure.witness_closed(free, j)
                        cls = int(rng.integers(len(ctx.classes.members)))
                        tp = int(rng.choice(pure._tps[cls]))
                        assert twin.open(free, j, cls, tp, 1, want) == \
                            pure.open(free, j, cls, tp, 1, want)
                        checked += 1
                    assert twin.stats() == pure.stats()
    assert checked


@needs_twin
def test_masks_along_rollouts_are_the_sources(monkeypatch):
    """The environment's masks, step by step along random episodes, with the twin and
    with the pure-Python source."""
    def run() -> list[bytes]:
        env = PlanBuilderEnv("train-mixed", max_hosts=32, instances=6)
        rng = np.random.default_rng(7)
        env.reset(seed=3)
        out = []
        for _ in range(400):
            out.append(env.action_masks().tobytes())
            _, _, done, trunc, _ = env.step(random_masked_action(env, rng))
            if done or trunc:
                env.reset()
        return out

    compiled = run()
    monkeypatch.setattr(context_module, "Completions", feasibility.PureCompletions)
    monkeypatch.setattr(context_module, "HostClasses", feasibility.PureHostClasses)
    assert run() == compiled
