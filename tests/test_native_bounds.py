"""The compiled twin of the bound module (``hatch_build.py``) and the seed tasks.

The twin is ``hetpar/solvers/bounds.py`` compiled by mypyc: it must decide every prefix
exactly as the pure-Python source does, and it must never run once that source changed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import math
import os
import shutil
import time
import types
from pathlib import Path

import numpy as np
import pytest

from hetpar import native
from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.problem import Problem
from hetpar.solvers import bounds, solve
from hetpar.solvers.baselines import metis
from hetpar.solvers.brute import skeletons
from hetpar.solvers.exact import LocalIncumbent, SearchProblem, Task, make_bounds, search_subtree
from hetpar.problem.space import PlanSpace
from tests.test_solver_admissible import small_instance
from tests.test_solvers import tiny_instance

needs_twin = pytest.mark.skipif(
    bounds.NATIVE is None,
    reason="no compiled twin in this install (no C compiler, HETPAR_PURE_PYTHON set, or "
           "bounds.py edited since the package was installed)")


def test_a_twin_built_from_other_source_is_never_used():
    twin = types.ModuleType("twin")
    twin.SOURCE_DIGEST = hashlib.sha256(b"the source it was built from").hexdigest()
    assert native.matching_twin(twin, b"the source it was built from") is twin
    with pytest.warns(RuntimeWarning, match="differs from the source"):
        assert native.matching_twin(twin, b"an edited source") is None
    with pytest.warns(RuntimeWarning):
        assert native.matching_twin(types.ModuleType("no digest"), b"") is None


def test_pure_python_asked_for_loads_no_twin(monkeypatch):
    monkeypatch.setenv("HETPAR_PURE_PYTHON", "1")
    for module in native.TWINS:
        assert native.compiled_twin(module, bounds.__file__) is None


def test_pure_python_can_be_asked_for_one_twin(monkeypatch):
    monkeypatch.setenv("HETPAR_PURE_PYTHON", "feasibility")
    assert native._pure("hetpar.envs.feasibility")
    assert not native._pure("hetpar.solvers.bounds")
    monkeypatch.setenv("HETPAR_PURE_PYTHON", "bounds, feasibility")
    assert native._pure("hetpar.envs.feasibility") and native._pure("hetpar.solvers.bounds")
    monkeypatch.setenv("HETPAR_PURE_PYTHON", "yes")
    assert all(native._pure(m) for m in native.TWINS)
    monkeypatch.delenv("HETPAR_PURE_PYTHON")
    assert not any(native._pure(m) for m in native.TWINS)


@pytest.mark.parametrize("module", sorted(native.TWINS))
def test_an_install_with_a_compiler_builds_the_twin(module):
    """Where a C compiler exists the install compiles every module of ``native.TWINS``
    (hatch_build.py). A twin that is only stale (its source edited since installing) is a
    developer's state, and the module then runs its source, as it should."""
    if os.environ.get("HETPAR_PURE_PYTHON") or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("pure Python asked for, or no C compiler")
    source = importlib.import_module(module)
    twin = native.TWINS[module].rsplit(".", 1)[1]
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    built = [p for p in Path(source.__file__).parent.glob(f"{twin}*")
             if p.name.endswith(suffixes)]
    assert built, (f"the install did not compile {source.__file__} (hatch_build.py; "
                   "install with HETPAR_PURE_PYTHON=1 set to skip it on purpose)")
    if source.NATIVE is None:
        pytest.skip(f"{source.__file__} was edited since the package was installed")


@needs_twin
def test_the_search_runs_the_twin():
    cluster, model, training, objective = tiny_instance(0)
    cm = CostModel(cluster, model, training, samples=4)
    problem = SearchProblem(cm, PlanSpace(cluster, cm.model, training), Objective.parse(objective))
    assert bounds.Bounds is bounds.NATIVE.Bounds is not bounds.PureBounds
    assert type(make_bounds(problem)) is bounds.NATIVE.Bounds


def _prefixes(space: PlanSpace, layers: int, limit: int, rng: np.random.Generator):
    """Up to ``limit`` distinct prefixes (with their free GPUs) of the space's pipelines."""
    seen = {}
    for stages in skeletons(space, layers):
        free = space.capacity
        for k, st in enumerate(stages, start=1):
            free = space.take(free, st)
            seen.setdefault(tuple(stages[:k]), free)
    items = list(seen.items())
    if len(items) > limit:
        items = [items[i] for i in rng.choice(len(items), limit, replace=False)]
    return items


@needs_twin
@pytest.mark.parametrize("seed", range(0, 40, 5))
def test_the_twin_decides_every_prefix_as_the_source(seed):
    """Same verdicts (closed, extended, by memory) for random prefixes of small instances
    under every (M, recompute) pair and targets below, at and above the optimum."""
    cluster, model, training, objective = small_instance(seed)
    cm = CostModel(cluster, model, training, samples=4, seed=seed)
    space = PlanSpace(cluster, cm.model, training)
    obj = Objective.parse(objective)
    zero = max(space.zero_stages)
    pure = bounds.PureBounds(cm, space, obj, zero)
    twin = bounds.NATIVE.Bounds(cm, space, obj, zero)
    best = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="exact").value
    targets = [best * f for f in (0.6, 0.9, 0.99, 1.0, 1.01, 1.2, 2.0)] + [math.inf]
    rng = np.random.default_rng(seed)
    compared = 0
    for prefix, free in _prefixes(space, cm.model.layers, 60, rng):
        for m in space.micro_batch_options([s.dp for s in prefix]):
            for rc in space.recompute_modes:
                for target in targets:
                    assert twin.prefix_status(prefix, free, m, rc, target) == \
                        pure.prefix_status(prefix, free, m, rc, target), (prefix, m, rc, target)
                    compared += 1
                assert twin.root_alive(m, rc, best) == pure.root_alive(m, rc, best)
    assert compared > 0


@needs_twin
@pytest.mark.parametrize("seed", range(6))
def test_the_twin_bounds_a_split_as_the_source(seed):
    """``root_bound`` compiled gives the source's value bit for bit, on random stage
    profiles: some with room for every layer, some with too little memory (inf), some
    whose least threshold must be found by bisection first."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        p = int(rng.integers(1, 9))
        layers = int(rng.integers(p, 97))
        fields = [dict(a=float(rng.uniform(1e-4, 1e-2)), b=float(rng.uniform(0, 1e-2)),
                       d=float(rng.choice([0.0, rng.uniform(0, 1e-3)])),
                       cap=int(rng.integers(0, layers + 3)), d0=float(rng.uniform(0, 1e-2)),
                       opt_a=float(rng.uniform(0, 1e-3)), opt_b=float(rng.uniform(0, 1e-2)))
                  for _ in range(p)]
        a = [f["a"] * float(rng.uniform(0.2, 1.0)) for f in fields]
        gam = [f["b"] + float(rng.uniform(0, 1e-2)) for f in fields]
        m = int(rng.integers(1, 33))
        fixed = float(rng.uniform(0, 0.1))
        pure = bounds.pure_root_bound([bounds.PureStageProfile(**f) for f in fields], a, gam,
                                      m, layers, fixed)
        twin = bounds.NATIVE.root_bound([bounds.NATIVE.StageProfile(**f) for f in fields], a,
                                        gam, m, layers, fixed)
        assert twin == pure or (math.isinf(twin) and math.isinf(pure)), (fields, m, layers)


def test_seed_tasks_offer_the_heuristics_plans():
    cluster, model, training, objective = tiny_instance(11)
    cm = CostModel(cluster, model, training, samples=4, seed=11)
    space = PlanSpace(cluster, cm.model, training)
    obj = Objective.parse(objective)
    problem = SearchProblem(cm, space, obj)
    optimum = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=11), method="brute").value

    incumbent = LocalIncumbent()
    got = search_subtree(problem, Task((), seed="metis"), incumbent)
    expected = metis(cm, space, obj)
    assert got.finished and got.counters.nodes == 0
    assert got.value == expected.value == incumbent.get()
    assert got.plan is not None and cm.evaluate(got.plan).feasible

    dived = search_subtree(problem, Task((), seed="dive", until=time.time() + 30), incumbent)
    assert dived.finished and optimum <= dived.value * (1 + 1e-12)
    assert incumbent.get() == min(got.value, dived.value)
    with pytest.raises(ValueError, match="unknown seed task"):
        search_subtree(problem, Task((), seed="anneal"), incumbent)


@pytest.mark.parametrize("seed", range(3, 200, 40))
def test_two_workers_agree_with_enumeration(seed):
    """Seeds on the pool, the largest subtree split: the optimum is the same."""
    cluster, model, training, objective = tiny_instance(seed)
    brute = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="brute")
    two = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="exact", workers=2)
    assert two.certificate.optimal and two.certificate.workers == 2
    assert two.value == pytest.approx(brute.value, rel=1e-9, abs=0.0)


def test_a_stopped_dive_ends_at_once():
    """``dive(..., stop=...)`` (the pool sets it once every subtree is searched) ends at
    its next search node, with what it has scored so far."""
    from hetpar.solvers.exact import dive

    cluster, model, training, objective = tiny_instance(21)
    cm = CostModel(cluster, model, training, samples=4, seed=21)
    problem = SearchProblem(cm, PlanSpace(cluster, cm.model, training), Objective.parse(objective))
    calls = []

    def stop() -> bool:
        calls.append(1)
        return True

    value, plan = dive(problem, time.time() + 60, stop=stop)
    assert len(calls) <= 2  # the first check stops it (and the structure's loop re-checks)
    full, _ = dive(problem, time.time() + 60)
    assert full <= value
    assert (plan is None) == (not math.isfinite(value))


def _cloud_problem(model: str) -> tuple[CostModel, PlanSpace, Objective, SearchProblem]:
    import hetpar

    cluster = hetpar.load_cluster("cloud-mixed")
    training = hetpar.load_training("default")
    cm = CostModel(cluster, hetpar.load_model(model), training, samples=4)
    space = PlanSpace(cluster, cm.model, training)
    obj = Objective.parse("mean")
    return cm, space, obj, SearchProblem(cm, space, obj)


def test_dive_structures_leave_slow_types_out_and_mix_tp_degrees():
    """On three GPU types the dive also tries pipelines without the slowest type, and one
    stage per type at each type's own TP degree (the Metis-style shape)."""
    from hetpar.solvers.exact import dive_structures

    _, space, _, _ = _cloud_problem("gpt2-medium")
    types = set(space.types)
    assert len(types) == 3
    found = dive_structures(space)
    assert len(found) == len(set(found))
    used = [{st.gpu_type for st in s} for s in found]
    assert any(len(u) == 2 for u in used)  # an ordered pair of types, without the third
    for a, b in (("H100-SXM5-80GB", "A100-SXM4-80GB"), ("A100-SXM4-80GB", "H100-SXM5-80GB")):
        for tp_a, tp_b in ((1, 2), (2, 1), (8, 4)):
            want = ((a, tp_a, space.eligible_hosts(a, tp_a)),
                    (b, tp_b, space.eligible_hosts(b, tp_b)))
            assert any(tuple((st.gpu_type, st.tp, st.hosts) for st in s) == want
                       and all(st.gpus == sum(space.capacity[h] for h in st.hosts)
                               for st in s) for s in found), want


@pytest.mark.parametrize("model", ["llama2-7b", "gpt3-6.7b"])
def test_the_dive_beats_metis_and_megatron_on_cloud_mixed(model):
    """On the mixed cloud cluster the Metis-style plan runs on the H100 hosts alone; a
    pipeline of A100 then H100 stages is faster by the cost model, and the dive (so the
    exact search's first incumbent) finds one."""
    from hetpar.solvers.baselines import megatron
    from hetpar.solvers.exact import dive

    cm, space, obj, problem = _cloud_problem(model)
    value, plan = dive(problem, time.time() + 120)
    assert plan is not None
    est = cm.evaluate(plan)
    assert est.feasible and est.value(obj) == pytest.approx(value, rel=1e-12)
    assert value < 0.97 * metis(cm, space, obj).value
    assert value < 0.9 * megatron(cm, space, obj).value
    types = {cm.cluster.host(r.host).gpu.name
             for st in plan.stages for r in st.replicas}
    assert len(types) >= 2
