"""The exact search's bounds never exceed the cost model's value of any plan they cover.

On random small instances every plan of the space is enumerated (or a random sample of
them) and scored with the cost model; each bound that covers the plan (the pool bound of
every proper prefix, the closed bound of the whole pipeline, the bound of the whole space)
must then report it may reach a target just above the plan's value.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from hetpar.cluster import parse_cluster
from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.solvers.bounds import Bounds
from hetpar.solvers.brute import compositions, skeletons
from hetpar.solvers.exact import SearchProblem, make_bounds
from hetpar.problem.space import PlanSpace
from hetpar.workload import parse_model, parse_training
from tests.test_solvers import GPU_TYPES, tiny_instance

# Checking every prefix of up to 1500 plans takes 5-30 s per instance on a busy 2-core
# machine: the default run checks a subset, HETPAR_LONG_TESTS=1 checks them all. (The
# exact search is also checked end to end against enumeration on 200 tiny instances.)
_LONG = bool(os.environ.get("HETPAR_LONG_TESTS"))
TINY_SEEDS = range(40) if _LONG else range(0, 40, 3)
SMALL_SEEDS = range(40) if _LONG else range(0, 40, 4)
FLOOR_SEEDS = range(30) if _LONG else range(0, 30, 3)


def small_instance(seed: int):
    """Up to 4 hosts on one or two switches (uplinks of different speeds), 2 GPU types,
    <= 8 GPUs, a model whose head is heavy next to its layers."""
    rng = np.random.default_rng(10_000 + seed)
    types = rng.choice(GPU_TYPES, 2, replace=False)
    n_hosts = int(rng.integers(2, 5))
    hosts = []
    for i in range(n_hosts):
        gpu = str(types[i % 2] if i < 2 else types[rng.integers(2)])
        host = {"name": f"h{i}", "gpu": gpu, "gpus": int(rng.choice([1, 2, 2, 4])),
                "nic_gbps": float(rng.choice([5, 10, 25, 100, 400]))}
        if rng.random() < 0.3:
            mean = float(rng.uniform(0.3, 0.9)) * host["nic_gbps"]
            host["uplink"] = {"bandwidth": {"kind": "lognormal", "mean_gbps": mean,
                                            "cv": float(rng.uniform(0.1, 0.5))}}
        hosts.append(host)
    while sum(h["gpus"] for h in hosts) > 8:
        big = max(hosts, key=lambda h: h["gpus"])
        big["gpus"] //= 2
    if rng.random() < 0.5:
        topology = {"kind": "leaf_spine", "hosts_per_leaf": 2, "spines": 1,
                    "uplink_gbps": float(rng.choice([10, 100]))}
    else:
        topology = {"kind": "single_switch"}
    cluster = parse_cluster({"hosts": hosts, "topology": topology})
    layers = int(rng.integers(2, 7))
    hidden = int(rng.choice([512, 1024, 2048]))
    model = parse_model({"name": "small", "layers": layers, "hidden": hidden, "heads": 16,
                         "vocab": int(rng.choice([8000, 50000])), "seq_len": 1024})
    modes = ["none", "selective", "full"]
    training = parse_training({"global_batch": int(rng.choice([2, 4, 8, 16])),
                               "recompute": list(rng.choice(modes, int(rng.integers(1, 3)),
                                                            replace=False)),
                               "zero": [0, 1] if rng.random() < 0.5 else [0]})
    objective = str(rng.choice(["mean", "p90", "cvar0.9"]))
    return cluster, model, training, objective


def _small_bounds(seed: int) -> tuple[CostModel, PlanSpace, Bounds]:
    """The cost model, space and bounds of ``small_instance(seed)`` (4 samples)."""
    cluster, model, training, objective = small_instance(seed)
    cm = CostModel(cluster, model, training, samples=4, seed=seed)
    space = PlanSpace(cluster, cm.model, training)
    return cm, space, make_bounds(SearchProblem(cm, space, Objective.parse(objective)))


def _check_bounds(cluster, model, training, objective, seed, budget=1500):
    cm = CostModel(cluster, model, training, samples=4, seed=seed)
    space = PlanSpace(cluster, cm.model, training)
    obj = Objective.parse(objective)
    bounds = make_bounds(SearchProblem(cm, space, obj))
    zero = max(space.zero_stages)
    rng = np.random.default_rng(seed)
    plans = []
    for stages in skeletons(space, cm.model.layers):
        for split in compositions(cm.model.layers, len(stages)):
            for m in space.micro_batch_options([s.dp for s in stages]):
                for rc in space.recompute_modes:
                    plans.append((stages, split, m, rc))
    if len(plans) > budget:
        plans = [plans[i] for i in rng.choice(len(plans), budget, replace=False)]
    checked = 0
    for stages, split, m, rc in plans:
        plan = space.to_plan(stages, split, m, rc, zero)
        core = cm.core(plan)
        if not core.feasible:
            continue
        value = obj(core.total)
        # A relative slack for rounding only: a bound above the value is a bug.
        target = value * (1 + 1e-9) + 1e-12
        checked += 1
        assert bounds.root_alive(m, rc, target), (stages, split, m, rc, value)
        free = space.capacity
        for k, st in enumerate(stages, start=1):
            free = space.take(free, st)
            closed, opened, _ = bounds.prefix_status(tuple(stages[:k]), free, m, rc, target)
            if k < len(stages):
                assert opened, (k, stages, split, m, rc, value)
            else:
                assert closed, (stages, split, m, rc, value)
    return checked


@pytest.mark.slow
@pytest.mark.parametrize("seed", TINY_SEEDS)
def test_bounds_never_exceed_a_tiny_plan(seed):
    cluster, model, training, objective = tiny_instance(seed)
    _check_bounds(cluster, model, training, objective, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SMALL_SEEDS)
def test_bounds_never_exceed_a_small_plan(seed):
    cluster, model, training, objective = small_instance(seed)
    _check_bounds(cluster, model, training, objective, seed)


def test_crossing_terms_are_below_the_cost_models_transfers():
    """The per-side crossing charges are at most the boundary time the cost model gives
    a micro-batch that leaves a host for another host or type, and the entry into the
    stages the GPUs off a stage's hosts could form is at most the boundary into any of
    them."""
    entered = 0
    for seed in range(20):
        cluster, model, training, objective = small_instance(seed)
        cm = CostModel(cluster, model, training, samples=4, seed=seed)
        space = PlanSpace(cluster, cm.model, training)
        bounds = make_bounds(SearchProblem(cm, space, Objective.parse(objective)))
        skel = [s for s in skeletons(space, 2) if len(s) == 2]
        for a, b in skel[:200]:
            for m in space.micro_batch_options([a.dp, b.dp]):
                real = bounds.boundary(a, b, m)
                if set(a.hosts).isdisjoint(b.hosts):
                    # b is among the stages the GPUs off a's hosts could form.
                    off_a = tuple(0 if h in a.hosts else f
                                  for h, f in enumerate(space.capacity))
                    assert bounds.entry_time(off_a, m) <= real * (1 + 1e-9), (a, b, m)
                    entered += 1
                    # Whole micro-batches leave a's hosts and enter b's.
                    assert bounds.type_crossing(tuple(b.hosts), m) <= real * (1 + 1e-9)
                    assert bounds.type_crossing(tuple(a.hosts), m) <= real * (1 + 1e-9)
                    if len(a.hosts) == 1 and len(b.hosts) == 1:
                        assert bounds.crossing_time(a.hosts[0], m) <= real * (1 + 1e-9)
                if len(a.hosts) == 1 and len(b.hosts) > 1 and b.gpu_type == a.gpu_type \
                        and math.isfinite(real):
                    tp_blocks = tuple(sorted((space.capacity[h] // b.tp
                                              for h in space.hosts_of_type[b.gpu_type]
                                              if cluster.hosts[h].num_gpus % b.tp == 0),
                                             reverse=True))
                    y = bounds.spread_crossing(b.gpu_type, b.dp, tp_blocks, m)
                    assert y <= real * (1 + 1e-9)
    assert entered > 0


def _phase_floor(obj: Objective, samples: np.ndarray) -> float:
    """What a bound may use of a per-sample term: its mean (mean, CVaR) or least value."""
    return float(samples.min() if obj.kind == "quantile" else samples.mean())


@pytest.mark.slow
@pytest.mark.parametrize("seed", FLOOR_SEEDS)
def test_tied_and_spread_floors_are_below_the_data_parallel_phase(seed):
    """The floors under the data-parallel phase (the tied embedding's exchange between
    the first and the last stage, closed or in every case of an extension, and the spread
    stages' shared uplinks) never exceed the phase the cost model gives the plan."""
    cluster, model, training, objective = small_instance(seed)
    cm = CostModel(cluster, model, training, samples=4, seed=seed)
    space = PlanSpace(cluster, cm.model, training)
    obj = Objective.parse(objective)
    bounds = make_bounds(SearchProblem(cm, space, obj))
    zero = max(space.zero_stages)
    rng = np.random.default_rng(seed)
    skel = [s for s in skeletons(space, cm.model.layers) if len(s) >= 2]
    if len(skel) > 300:
        skel = [skel[i] for i in rng.choice(len(skel), 300, replace=False)]
    checked = 0
    for stages in skel:
        splits = list(compositions(cm.model.layers, len(stages)))
        split = splits[int(rng.integers(len(splits)))]
        ms = space.micro_batch_options([s.dp for s in stages])
        if not ms:
            continue
        plan = space.to_plan(stages, split, ms[-1], space.recompute_modes[0], zero)
        dp = _phase_floor(obj, np.asarray(cm.core(plan).dp_time, dtype=float)
                          * np.ones(cm.num_samples))
        slack = dp * (1 + 1e-9) + 1e-12
        assert bounds.tied_closed(stages[0], stages[-1]) <= slack, (stages, dp)
        free = space.capacity
        for k in range(1, len(stages)):
            free = space.take(free, stages[k - 1])
            last = stages[-1]
            covered = []
            for floor, last_hosts in bounds.tied_open(stages[0], free):
                if last_hosts is None:
                    holds = set(last.hosts).isdisjoint(stages[0].hosts)
                else:
                    holds = not set(last.hosts).isdisjoint(last_hosts)
                if holds:
                    covered.append(floor)
            assert covered and min(covered) <= slack, (k, stages, dp, covered)
            for t in space.types:
                spread = sum(n for st, n in zip(stages[k:], split[k:])
                             if st.gpu_type == t and len(st.hosts) >= 2)
                tfree = tuple(free[h] for h in space.hosts_of_type[t])
                assert bounds.spread_share(t, tfree) * spread <= slack, (k, stages, t)
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_pool_crossings_are_below_the_cost_models_transfers(seed):
    """The crossings charged to the stages still to build (``pool_capacities``' q half
    crossings at ``pool_adjacency_time`` each) never exceed the transfers the cost model
    gives their boundaries: r host runs on distinct hosts and x spread runs in one
    sequence have at least ``_adjacency_units(r, y)`` half crossings for some y <= x."""
    cm, space, bounds = _small_bounds(seed)
    rng = np.random.default_rng(seed)
    skel = [s for s in skeletons(space, cm.model.layers) if len(s) >= 2]
    if len(skel) > 300:
        skel = [skel[i] for i in rng.choice(len(skel), 300, replace=False)]
    checked = 0
    for stages in skel:
        for m in space.micro_batch_options([s.dp for s in stages]):
            free = space.capacity
            for k in range(1, len(stages)):
                free = space.take(free, stages[k - 1])
                rest = stages[k:]
                real = sum(bounds.boundary(x, y, m) for x, y in zip(rest, rest[1:]))
                hosts = {st.hosts[0] for st in rest if len(st.hosts) == 1}
                spread_runs = sum(1 for i, st in enumerate(rest) if len(st.hosts) > 1
                                  and (i == 0 or len(rest[i - 1].hosts) == 1))
                units = min(Bounds._adjacency_units(len(hosts), y)
                            for y in range(min(spread_runs, 1), spread_runs + 1))
                charged = units * bounds.pool_adjacency_time(free, m)
                assert charged <= real * (1 + 1e-9) + 1e-12, (k, stages, m, charged, real)
                checked += 1
    assert checked > 0


def test_adjacency_units_are_the_fewest_half_crossings():
    """Over every sequence of r host runs (on distinct hosts) and y spread runs (never
    two spread runs side by side: they would be one run), the fewest half
    crossings (two per boundary between host runs, one per boundary touching a spread
    run) is at least ``_adjacency_units``, and equal for some sequence."""
    import itertools

    for r in range(5):
        for y in range(4):
            best = math.inf
            for seq in set(itertools.permutations("h" * r + "s" * y)):
                if any(a == b == "s" for a, b in zip(seq, seq[1:])):
                    continue
                units = sum(2 if a == b == "h" else 1 for a, b in zip(seq, seq[1:]))
                best = min(best, units)
            if math.isfinite(best):
                assert Bounds._adjacency_units(r, y) <= best, (r, y)
                assert Bounds._adjacency_units(r, y) == best, (r, y)


@pytest.mark.parametrize("seed", range(0, 40, 5))
def test_spread_total_is_the_multi_tables_largest_entry(seed):
    _, space, bounds = _small_bounds(seed)
    rng = np.random.default_rng(seed)
    for t in space.types:
        cap = tuple(space.capacity[h] for h in space.hosts_of_type[t])
        for _ in range(10):
            free = tuple(int(rng.integers(0, c + 1)) for c in cap)
            if not sum(free):
                continue
            m = int(rng.choice(space.micro_batch_options([1])))
            rc = space.recompute_modes[0]
            budget = float(rng.uniform(0.01, 2.0))
            floor = float(rng.choice([0.0, rng.uniform(0.0, 0.5)]))
            table = bounds._multi_table(t, free, m, rc, budget, 3, floor)
            assert bounds._spread_total(t, free, m, rc, budget, floor) == max(table[sum(free)])


@pytest.mark.parametrize("seed", range(0, 40, 5))
def test_fill_asked_against_a_need_decides_as_the_full_fill(seed):
    """``_fill(..., need)`` may stop at a cheaper bound, but only once that bound reaches
    ``need``: it is never above the full fill, and below ``need`` exactly when it is."""
    cm, space, bounds = _small_bounds(seed)
    rng = np.random.default_rng(seed)
    skel = [s for s in skeletons(space, cm.model.layers) if len(s) >= 2]
    checked = 0
    for i in rng.choice(len(skel), min(len(skel), 60), replace=False):
        stages = skel[i]
        k = int(rng.integers(1, len(stages)))
        prefix = tuple(stages[:k])
        free = space.capacity
        for st in prefix:
            free = space.take(free, st)
        ms = space.micro_batch_options([s.dp for s in prefix])
        if not ms:
            continue
        m = int(rng.choice(ms))
        rc = space.recompute_modes[0]
        profs = [bounds.profile(st, m, rc, j, k, j == 0, False) for j, st in enumerate(prefix)]
        if any(p is None for p in profs):
            continue
        pool_types = [(t, tuple(free[h] for h in space.hosts_of_type[t])) for t in space.types]
        pool_types = [(t, g) for t, g in pool_types if any(g)]
        if not pool_types:
            continue
        pool_a = bounds.pool_min_layer_time(pool_types, m, rc)
        target = float(rng.uniform(0.05, 3.0))
        pool = (pool_types, pool_a, target, free, True, True)
        icpt = [(m - 1) * p.b + p.d0 for p in profs]
        slope = [(m - 1) * p.a + p.d for p in profs]
        for tau in np.linspace(0.0, target, 7)[1:]:
            full = bounds._fill(profs, icpt, slope, float(tau), m, rc, pool)
            for need in (0.5 * full, full, 1.5 * full + 1e-6, float(rng.uniform(0, 0.5))):
                if not math.isfinite(need):
                    continue
                quick = bounds._fill(profs, icpt, slope, float(tau), m, rc, pool, need=need)
                assert quick <= full * (1 + 1e-12) + 1e-15
                assert (quick < need) == (full < need), (tau, need, quick, full)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("seed", range(0, 40, 5))
def test_head_shift_is_below_every_last_stages_loss(seed):
    """Holding the head costs every stage shape the pool tables count, under every
    crossing time they may add and every all-reduce they use, at least ``head_shift``
    layers (where it can hold one with the head); ``head_time`` is at most what the
    cost model adds to a last stage on any host."""
    cm, space, bounds = _small_bounds(seed)
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(12):
        free = tuple(int(rng.integers(0, c + 1)) for c in space.capacity)
        pool_types = [(t, tuple(free[h] for h in space.hosts_of_type[t])) for t in space.types]
        pool_types = [(t, g) for t, g in pool_types if any(g)]
        if not pool_types:
            continue
        m = int(rng.choice(space.micro_batch_options([1])))
        rc = str(rng.choice(space.recompute_modes))
        budget = float(rng.uniform(0.01, 2.0))
        floor = float(rng.choice([0.0, rng.uniform(0.0, 0.3)]))
        shift = bounds.head_shift(pool_types, m, rc, budget, floor)
        for t, tfree in pool_types:
            hosts = space.hosts_of_type[t]
            crossings = [bounds.crossing_time(h, m) for h in hosts]
            crossings.append(bounds.type_crossing(tuple(h for h, f in zip(hosts, tfree) if f), m))
            for tp, dp, blocks, (a, b, cap) in bounds._shapes(t, tfree, m, rc):
                head = bounds.head_time(t, tp, dp, m, rc)
                for h in space.eligible_hosts(t, tp):
                    perf = cm.host_perf(h)
                    seqs = cm.training.global_batch / m / dp
                    work = [cm.stage_work(perf, seqs, tp, n, False, last, rc).total
                            for last in (False, True) for n in (1, 2)]
                    assert head <= (2 * work[2] - work[3]) - (2 * work[0] - work[1]) + 1e-15
                ds = {bounds._shape_dp(t, tp, dp, blocks),
                      bounds._shape_dp(t, tp, dp, blocks, min_hosts=2)}
                ds |= {bounds._shape_dp(t, tp, dp, (f // tp,)) for f in tfree
                       if f >= tp * dp}
                xs = [0.0] + [e * c for c in crossings for e in (1, 2)]
                xs += [e * bounds.spread_crossing(t, dp, blocks, m) for e in (1, 2)
                       if dp >= 2 and sum(1 for x in blocks if x) >= 2]
                for d in ds:
                    if not math.isfinite(d):
                        continue
                    for x in xs:
                        with_head = bounds._capacity(a, b + x + head, d, cap, budget, m, floor)
                        if with_head >= 1:
                            without = bounds._capacity(a, b + x, d, cap, budget, m, floor)
                            assert without - with_head >= shift, (t, tp, dp, d, x, shift)
                            checked += 1
    assert checked > 0
