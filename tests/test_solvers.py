"""The plan space, the exact branch and bound (against plain enumeration) and solve()."""

from __future__ import annotations

import math

import numpy as np
import pytest

import hetpar
from hetpar.cluster import parse_cluster
from hetpar.costmodel.objective import Objective
from hetpar.errors import InfeasibleError, PlanError
from hetpar.plan import validate_plan
from hetpar.problem import PlanSpace, Problem
from hetpar.solvers import solve
from hetpar.solvers.brute import compositions, skeletons
from hetpar.workload import parse_model, parse_training

GPU_TYPES = ("V100-SXM2-16GB", "T4-16GB", "A100-SXM4-40GB", "L4-24GB")


def tiny_instance(seed: int):
    """<= 3 hosts of <= 4 GPUs, 2 GPU types, <= 8 layers, random bandwidths."""
    rng = np.random.default_rng(seed)
    types = rng.choice(GPU_TYPES, 2, replace=False)
    n_hosts = int(rng.integers(2, 4))
    hosts = []
    for i in range(n_hosts):
        gpu = str(types[i % 2] if i < 2 else types[rng.integers(2)])
        host = {"name": f"h{i}", "gpu": gpu, "gpus": int(rng.choice([1, 2, 2, 4])),
                "nic_gbps": float(rng.choice([10, 25, 100]))}
        if rng.random() < 0.4:
            mean = float(rng.uniform(0.3, 0.9)) * host["nic_gbps"]
            host["uplink"] = {"bandwidth": {"kind": "lognormal", "mean_gbps": mean,
                                            "cv": float(rng.uniform(0.1, 0.5))}}
        hosts.append(host)
    # Keep the enumeration small: at most 6 GPUs in all.
    while sum(h["gpus"] for h in hosts) > 6:
        big = max(hosts, key=lambda h: h["gpus"])
        big["gpus"] //= 2
    cluster = parse_cluster({"hosts": hosts, "topology": {"kind": "single_switch"}})
    layers = int(rng.integers(2, 6)) if sum(h["gpus"] for h in hosts) > 4 else int(
        rng.integers(2, 9))
    model = parse_model({"name": "tiny", "layers": layers, "hidden": 1024, "heads": 16,
                         "vocab": 32000, "seq_len": 1024})
    modes = ["none", "selective", "full"]
    training = parse_training({"global_batch": int(rng.choice([2, 4, 8])),
                               "recompute": list(rng.choice(modes, int(rng.integers(1, 3)),
                                                            replace=False)),
                               "zero": [0, 1] if rng.random() < 0.5 else [0]})
    objective = str(rng.choice(["mean", "p90", "cvar0.9"]))
    return cluster, model, training, objective


@pytest.mark.parametrize("seed", range(200))
def test_exact_agrees_with_enumeration(seed):
    cluster, model, training, objective = tiny_instance(seed)
    brute = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="brute")
    exact = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="exact")
    assert exact.certificate.optimal
    assert exact.value == pytest.approx(brute.value, rel=1e-9, abs=0.0)
    if brute.found:
        validate_plan(exact.plan, cluster, model, training)
        assert exact.estimate.value(Objective.parse(objective)) == pytest.approx(exact.value, rel=1e-12)
    # Pruning must do real work: never more full evaluations than enumeration.
    assert exact.evaluations <= brute.evaluations
    if brute.found:
        assert exact.found_by in ("metis", "dive", "search")


@pytest.mark.parametrize("workers", [1, 2])
def test_exact_says_which_part_found_its_plan(workers):
    """``found_by``: the seed whose plan stood (metis's, or the dive's when
    better), or the exhaustive search when it found a better one."""
    import time

    from hetpar.costmodel.estimate import CostModel
    from hetpar.costmodel.objective import Objective
    from hetpar.solvers.baselines import metis
    from hetpar.solvers.exact import SearchProblem, dive

    seen = set()
    for seed in range(0, 120, 7):
        cluster, model, training, objective = tiny_instance(seed)
        exact = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="exact", workers=workers)
        if not exact.found:
            continue
        cm = CostModel(cluster, model, training, samples=4, seed=seed)
        space = PlanSpace(cluster, cm.model, training)
        obj = Objective.parse(objective)
        m = metis(cm, space, obj).value
        d, _ = dive(SearchProblem(cm, space, obj), time.time() + 60, m)
        who = exact.found_by
        seen.add(who)
        if who == "metis":
            assert exact.value == m
        elif workers == 1:  # the seeds run first, the dive told to beat metis's plan
            assert exact.value == d < m if who == "dive" else exact.value < min(m, d)
        else:
            # Both seeds run beside the search, the dive against the shared incumbent,
            # which the search may lower first: the dive's plan may differ from its plan
            # alone, and a plan that ties metis's may report first.
            assert exact.value <= m
    assert "search" in seen and len(seen) >= 2


@pytest.mark.parametrize("tail", [0, 1, 2])
@pytest.mark.parametrize("seed", range(0, 200, 5))
def test_the_split_tree_agrees_with_enumeration(seed, tail, monkeypatch):
    """The same law with every pipeline's layer split found by the branch and bound over
    splits (not by scoring all of them at once, which tiny instances always allow): leaf
    by leaf (tail 0) and with the last 1-2 stages' splits scored in batches per prefix."""
    import hetpar.solvers.exact as exact_module

    monkeypatch.setattr(exact_module, "ENUMERATE_SPLITS", 0)
    monkeypatch.setattr(exact_module, "_TAIL_STAGES", tail)
    cluster, model, training, objective = tiny_instance(seed)
    brute = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="brute")
    exact = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="exact")
    assert exact.certificate.optimal
    assert exact.value == pytest.approx(brute.value, rel=1e-9, abs=0.0)


def test_identical_hosts_are_searched_once():
    cluster = parse_cluster({"hosts": [{"name": "a", "count": 3, "gpu": "T4", "gpus": 2,
                                        "nic_gbps": 25}],
                             "topology": {"kind": "single_switch"}})
    model = parse_model({"name": "m", "layers": 4, "hidden": 1024, "heads": 16,
                         "vocab": 32000, "seq_len": 1024})
    training = parse_training({"global_batch": 4, "recompute": ["none"], "zero": [0]})
    space = PlanSpace(cluster, model, training)
    assert space.classes == ((0, 1, 2),)
    brute = solve(Problem.of(cluster, model, training, samples=1), method="brute")
    exact = solve(Problem.of(cluster, model, training, samples=1), method="exact")
    assert exact.value == pytest.approx(brute.value, rel=1e-12)
    assert exact.certificate.pruned_symmetry > 0


def test_stochastic_uplinks_break_symmetry():
    cluster = parse_cluster({"hosts": [{"name": "a", "count": 2, "gpu": "T4", "gpus": 2,
                                        "nic_gbps": 25,
                                        "uplink": {"bandwidth": {"kind": "lognormal",
                                                                 "mean_gbps": 20, "cv": 0.3}}}],
                             "topology": {"kind": "single_switch"}})
    model = hetpar.load_model("gpt2-medium")
    assert PlanSpace(cluster, model, hetpar.load_training()).classes == ()


def test_space_round_trip_and_rules():
    cluster = hetpar.load_cluster("amp-het-16")
    model = hetpar.load_model("gpt2-medium")
    training = hetpar.load_training()
    space = PlanSpace(cluster, model, training)
    assert space.tp_options == {"V100-SXM2-16GB": (1, 2, 4), "T4-16GB": (1, 2, 4)}
    assert space.classes == ((0, 1, 2),)
    plan = hetpar.Plan.load(hetpar.configio.bundled_dir() / "plans" / "amp-het-16-gpt2.json")
    stages, layers = space.decompose(plan)
    again = space.to_plan(stages, layers, plan.micro_batches, plan.recompute, plan.zero)
    assert space.decompose(again) == (stages, layers)
    validate_plan(again, cluster, model, training)
    # Every stage choice fits what is free and uses one GPU type.
    free = (4, 1, 0, 3)
    for st in space.stage_choices(free):
        assert all(b * st.tp <= free[h] for h, b in zip(st.hosts, st.blocks))
        assert {cluster.hosts[h].gpu.name for h in st.hosts} == {st.gpu_type}
    assert space.micro_batch_options([2, 4]) == (1, 2, 4, 8)
    mixed = hetpar.Plan.from_dict({"micro_batches": 4, "stages": [
        {"layers": 24, "tp": 1, "replicas": [{"host": "v100-0", "gpus": [0]},
                                             {"host": "t4", "gpus": [0]}]}]})
    with pytest.raises(PlanError, match="mixes GPU types"):
        space.decompose(mixed)


def test_enumeration_helpers_count_what_they_should():
    assert len(list(compositions(6, 3))) == math.comb(5, 2)
    cluster = parse_cluster({"hosts": [{"name": "a", "gpu": "T4", "gpus": 2, "nic_gbps": 10}],
                             "topology": {"kind": "single_switch"}})
    space = PlanSpace(cluster, hetpar.load_model("gpt2-medium"), hetpar.load_training())
    # One host of 2 GPUs: [tp2], [tp1 x1], [tp1 x2], [tp1 x1, tp1 x1].
    assert len(list(skeletons(space, 24))) == 4


def test_parallel_search_finds_the_same_optimum():
    cluster, model, training, objective = tiny_instance(7)
    one = solve(Problem.of(cluster, model, training, objective=objective, samples=4), method="exact")
    two = solve(Problem.of(cluster, model, training, objective=objective, samples=4), method="exact", workers=2)
    assert two.certificate.workers == 2 and two.certificate.optimal
    assert two.value == pytest.approx(one.value, rel=1e-12)


def test_time_limit_returns_incumbent_bound_and_gap():
    # 2.5 s, not 1: the seeds and the dive take about half a second of the limit on an
    # idle machine and twice that on a loaded one, and the search must visit some nodes.
    # (A proof takes 5-12 s with one worker, so the limit still stops it.)
    cluster = hetpar.load_cluster("amp-het-16")
    sol = solve(Problem.of(cluster, hetpar.load_model("gpt2-medium"), hetpar.load_training(), samples=4), method="exact", time_limit=2.5)
    cert = sol.certificate
    assert sol.found and cert.stopped == "time limit" and not cert.optimal
    assert 0 < cert.lower_bound <= sol.value
    assert sol.gap == pytest.approx(sol.value / cert.lower_bound - 1)
    assert cert.nodes > 0 and cert.space_size > cert.leaves


def test_exact_beats_both_baselines_on_the_mixed_cloud_cluster_within_its_limit():
    """The issue's quality target on cloud-mixed, as a user runs it: a 7B model needs
    the A100 hosts besides the H100 ones, and a short anytime search returns a plan
    faster than metis's (H100 only) and megatron's (its bound is still far below)."""
    cluster = hetpar.load_cluster("cloud-mixed")
    model, training = hetpar.load_model("llama2-7b"), hetpar.load_training()
    exact = solve(Problem.of(cluster, model, training, samples=4), method="exact", time_limit=6.0)
    assert exact.found and not exact.certificate.optimal
    assert exact.certificate.lower_bound <= exact.value
    validate_plan(exact.plan, cluster, model, training)
    for method in ("metis", "megatron"):
        base = solve(Problem.of(cluster, model, training, samples=4), method=method)
        assert base.found and exact.value < 0.95 * base.value, method


def test_a_model_that_fits_nowhere_is_refused():
    cluster = parse_cluster({"hosts": [{"name": "a", "gpu": "T4", "gpus": 1, "nic_gbps": 10}],
                             "topology": {"kind": "single_switch"}})
    with pytest.raises(InfeasibleError, match="no feasible plan: the smallest per-GPU "
                                              "footprint is .* GiB, the largest GPU has"):
        solve(Problem.of(cluster, hetpar.load_model("llama2-70b"), hetpar.load_training()), method="exact")


@pytest.mark.parametrize("method", ["megatron", "metis", "random"])
def test_exact_is_never_beaten_by_a_baseline(method):
    cluster, model, training, objective = tiny_instance(11)
    exact = solve(Problem.of(cluster, model, training, objective=objective, samples=4), method="exact")
    base = solve(Problem.of(cluster, model, training, objective=objective, samples=4), method=method)
    if base.found and exact.plan is not None:
        # Megatron plans may leave the space (mixed-type stages); the others may not.
        if method != "megatron":
            assert exact.value <= base.value * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_compute_floor_never_exceeds_the_optimum(seed):
    """The fallback bound of a time-limited search is a true lower bound."""
    from hetpar.costmodel.estimate import CostModel
    from hetpar.solvers.api import _compute_floor
    cluster, model, training, objective = tiny_instance(seed)
    brute = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="brute")
    if brute.found:
        cm = CostModel(cluster, model, training, samples=4, seed=seed)
        assert _compute_floor(cm) <= brute.value


def test_a_first_level_too_large_to_list_is_searched_lazily(monkeypatch):
    """Many hosts give hundreds of millions of first stages: a time-limited search takes
    them lazily, searches subtrees, and bounds the stages it never reached by the root
    bound, which is above the compute floor."""
    import hetpar.solvers.api as api
    from hetpar.problem.generator import load_suite
    from hetpar.solvers.api import _compute_floor, answer_grace
    from hetpar.solvers.exact import LIST_STAGES

    # The Metis-style seed takes 3 s of these 6 on this cluster, twice that on a loaded
    # CI machine, which left no time to search: the seeds are not this test's subject.
    monkeypatch.setattr(api, "_BASELINES", ("megatron",))

    inst = load_suite("test-larger").instance(0)
    problem = Problem.of(inst.cluster, inst.model, inst.training, samples=4)
    assert problem.space.count_stage_choices(problem.space.capacity) > 1000 * LIST_STAGES
    for workers in (1, 2):
        sol = solve(problem, method="exact", time_limit=6, workers=workers)
        cert = sol.certificate
        assert sol.found and cert.stopped == "time limit" and cert.nodes > 0
        assert _compute_floor(problem.cost_model) < cert.lower_bound <= sol.value
        assert sol.value <= solve(problem, method="megatron").value
        # (The promise itself is benchmarks/time_limits.py's to measure, not a timed test's.)
        assert sol.wall_s <= 6 + answer_grace(6) + 10.0


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("seed", range(0, 40, 4))
def test_a_lazy_first_level_proves_what_a_listed_one_does(seed, workers, monkeypatch):
    """With every level taken lazily (LIST_STAGES = 0) the search is the same search: the
    same optimum, proven, on one worker and two."""
    import hetpar.solvers.api as api
    import hetpar.solvers.exact as exact

    cluster, model, training, objective = tiny_instance(seed)
    problem = Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed)
    listed = solve(problem, method="exact", workers=workers)
    monkeypatch.setattr(exact, "LIST_STAGES", 0)
    monkeypatch.setattr(api, "LIST_STAGES", 0)
    monkeypatch.setattr(api, "RANK_WINDOW", 3)  # several ranking windows
    lazy = solve(problem, method="exact", workers=workers)
    assert lazy.certificate.optimal and listed.certificate.optimal
    assert lazy.value == pytest.approx(listed.value, rel=1e-12)
    if workers == 1:
        assert lazy.certificate.nodes > 0


def test_stages_by_size_are_the_sorted_listing():
    for seed in range(20):
        cluster, model, training, _ = tiny_instance(seed)
        space = PlanSpace(cluster, model, training)
        for free in (space.capacity, tuple(max(0, c - 1) for c in space.capacity)):
            for largest in (True, False):
                listed = sorted(space.stage_choices(free),
                                key=lambda s: -s.gpus if largest else s.gpus)
                assert list(space.stage_choices_by_size(free, largest)) == listed


def test_count_stage_choices_matches_the_listing():
    for seed in range(10):
        cluster, model, training, _ = tiny_instance(seed)
        space = PlanSpace(cluster, model, training)
        for free in (space.capacity, tuple(max(0, c - 1) for c in space.capacity)):
            assert space.count_stage_choices(free) == len(list(space.stage_choices(free)))


def test_stage_choice_at_indexes_the_listing():
    for seed in range(10):
        cluster, model, training, _ = tiny_instance(seed)
        space = PlanSpace(cluster, model, training)
        for free in (space.capacity, tuple(max(0, c - 1) for c in space.capacity)):
            listed = list(space.stage_choices(free))
            assert [space.stage_choice_at(free, k) for k in range(len(listed))] == listed
            with pytest.raises(IndexError):
                space.stage_choice_at(free, len(listed))


def test_space_size_probes_draw_as_a_listing_would():
    """The random probes of estimate_space_size index the stage choices instead of listing
    them (seconds per draw on 80,000-150,000 first stages, which made exact overrun its
    time limit by more than 30 s on test-larger-4, -7, -8 and test-geo-0): the same draws
    give the same estimate as the listing."""
    import math

    import numpy as np

    from hetpar.problem.generator import load_suite
    from hetpar.solvers.exact import estimate_space_size

    inst = load_suite("test-iid").instance(0)
    space = PlanSpace(inst.cluster, inst.model, inst.training)
    size, exact_count = estimate_space_size(space, probes=6, seed=3)
    assert not exact_count  # too many to count: the probes ran
    layers = space.model.layers
    n_opts = len(space.recompute_modes) * len(space.zero_stages)
    rng, estimates = np.random.default_rng(3), []
    for _ in range(6):
        free, prefix, weight, total = space.capacity, (), 1.0, 0.0
        while len(prefix) < layers:
            choices = list(space.stage_choices(free))
            if not choices:
                break
            weight *= len(choices)
            st = choices[int(rng.integers(len(choices)))]
            prefix += (st,)
            free = space.take(free, st)
            total += weight * (math.comb(layers - 1, len(prefix) - 1) * n_opts
                               * len(space.micro_batch_options([s.dp for s in prefix])))
        estimates.append(total)
    assert size == pytest.approx(float(np.mean(estimates)), rel=1e-12)


@pytest.mark.parametrize("seed", range(0, 200, 10))
def test_tasks_below_two_stages_find_the_optimum(seed):
    """Subtrees rooted two stages deep (``root_tasks(depth=2)``), each passed the
    (M, recompute) pairs its first stage leaves open, still cover the optimum."""
    from hetpar.costmodel.estimate import CostModel
    from hetpar.costmodel.objective import Objective
    from hetpar.solvers.exact import LocalIncumbent, SearchProblem, root_tasks, search_subtree
    from hetpar.problem.space import PlanSpace

    cluster, model, training, objective = tiny_instance(seed)
    brute = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="brute")
    cm = CostModel(cluster, model, training, samples=4, seed=seed)
    problem = SearchProblem(cm, PlanSpace(cluster, cm.model, training), Objective.parse(objective))
    incumbent = LocalIncumbent()
    best = math.inf
    for task in root_tasks(problem, depth=2):
        result = search_subtree(problem, task, incumbent)
        assert result.finished
        best = min(best, result.value)
    assert best == pytest.approx(brute.value, rel=1e-9, abs=0.0)


@pytest.mark.parametrize("seed", range(5, 200, 20))
def test_split_tasks_cover_the_optimum(seed):
    """``split_task`` (the largest subtree cut one stage deeper, for several workers)
    covers the same plans: every first stage's task split still finds the optimum, and
    its parts are its prefix closed plus one task per canonical next stage."""
    from hetpar.costmodel.estimate import CostModel
    from hetpar.costmodel.objective import Objective
    from hetpar.solvers.exact import LocalIncumbent, SearchProblem, root_tasks, search_subtree, split_task
    from hetpar.problem.space import PlanSpace

    cluster, model, training, objective = tiny_instance(seed)
    brute = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="brute")
    cm = CostModel(cluster, model, training, samples=4, seed=seed)
    space = PlanSpace(cluster, cm.model, training)
    problem = SearchProblem(cm, space, Objective.parse(objective))
    incumbent = LocalIncumbent()
    best = math.inf
    for task in root_tasks(problem, depth=1):
        parts = split_task(problem, task)
        if len(parts) > 1:
            assert not parts[0].expand and parts[0].prefix == task.prefix
            assert all(p.expand and p.prefix[:-1] == task.prefix for p in parts[1:])
        for part in parts:
            result = search_subtree(problem, part, incumbent)
            assert result.finished
            best = min(best, result.value)
    assert best == pytest.approx(brute.value, rel=1e-9, abs=0.0)


def test_small_spaces_are_counted_exactly():
    """The probes decide whether counting is worth trying: a tiny space is still counted,
    a large one only estimated (without walking 20,000 nodes first)."""
    from hetpar.solvers.exact import estimate_space_size

    cluster, model, training, _ = tiny_instance(3)
    space = PlanSpace(cluster, model, training)
    size, exact_count = estimate_space_size(space, probes=8)
    assert exact_count and size >= 1
    big = hetpar.load_cluster("amp-het-16")
    size, exact_count = estimate_space_size(
        PlanSpace(big, hetpar.load_model("gpt2-medium"), hetpar.load_training()), probes=8)
    assert not exact_count and size > 1e9


@pytest.mark.parametrize("seed", range(15, 200, 20))
def test_split_parts_cover_the_optimum(seed):
    """``split_task(..., parts=n)`` (the largest subtree in one part per worker, each
    part every n-th subtree below its prefix, part 0 also closing it) covers the same
    plans: with the other first stages searched whole, the optimum is found."""
    from hetpar.costmodel.estimate import CostModel
    from hetpar.costmodel.objective import Objective
    from hetpar.solvers.exact import LocalIncumbent, SearchProblem, root_tasks, search_subtree, split_task
    from hetpar.problem.space import PlanSpace

    cluster, model, training, objective = tiny_instance(seed)
    brute = solve(Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed), method="brute")
    cm = CostModel(cluster, model, training, samples=4, seed=seed)
    problem = SearchProblem(cm, PlanSpace(cluster, cm.model, training), Objective.parse(objective))
    for n in (2, 3):
        incumbent = LocalIncumbent()
        best = math.inf
        for task in root_tasks(problem, depth=1):
            parts = split_task(problem, task, parts=n)
            if len(parts) > 1:
                assert [p.part for p in parts] == [(k, n) for k in range(n)]
                assert all(p.prefix == task.prefix and p.expand for p in parts)
                assert split_task(problem, parts[1], parts=n) == [parts[1]]  # no re-split
            for part in parts:
                result = search_subtree(problem, part, incumbent)
                assert result.finished
                best = min(best, result.value)
        assert best == pytest.approx(brute.value, rel=1e-9, abs=0.0)
