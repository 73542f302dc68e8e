"""Replica slices (hetpar.problem.slices, hetpar.agents.sliced): a cluster larger than the
policy observes, planned as one slice whose plan is run many times over."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import assert_one_line_error, run
from hetpar.cli.render import host_list
from hetpar.cluster.topology import parse_cluster
from hetpar.errors import ConfigError
from hetpar.plan import validate_plan
from hetpar.problem import Problem
from hetpar.problem.generator import load_suite
from hetpar.problem.slices import slice_problem, slice_widths, zones
from hetpar.solvers import solve
from hetpar.workload import parse_model, parse_training


def _cluster(a: int = 40, v: int = 24, per_leaf: int = 8, uplink_gbps: float | str = 800,
             sites: int = 1) -> dict:
    """A100 and V100 hosts on a leaf-spine fabric; with ``sites`` > 1, that many copies
    of it joined by a slow WAN link from each site's spine to the next."""
    if sites == 1:
        return {"name": "ls", "hosts": [
            {"name": "a", "count": a, "gpu": "A100-SXM4-80GB", "gpus": 8, "nic_gbps": 200},
            {"name": "v", "count": v, "gpu": "V100-SXM2-32GB", "gpus": 8, "nic_gbps": 100,
             "uplink": {"bandwidth": {"kind": "lognormal", "mean_gbps": 80, "cv": 0.3}}}],
            "topology": {"kind": "leaf_spine", "hosts_per_leaf": per_leaf, "spines": 2,
                         "uplink_gbps": uplink_gbps}}
    hosts, switches, links = [], [], []
    for s in range(sites):
        switches.append(f"site{s}")
        for kind, count, gpu, nic in (("a", a, "A100-SXM4-80GB", 200),
                                      ("v", v, "V100-SXM2-32GB", 100)):
            hosts.append({"name": f"{kind}{s}", "count": count, "gpu": gpu, "gpus": 8,
                          "nic_gbps": nic, "switch": f"site{s}"})
        if s:
            links.append({"a": f"site{s - 1}", "b": f"site{s}", "capacity_gbps": 10,
                          "latency_us": 20000})
    return {"name": "geo", "hosts": hosts, "switches": switches, "links": links}


MODEL = {"name": "m", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 50257,
         "seq_len": 2048}


def _problem(doc: dict, batch: int = 512) -> Problem:
    return Problem.of(parse_cluster(doc), parse_model(MODEL),
                      parse_training({"global_batch": batch, "recompute": ["none", "full"],
                                      "zero": [0, 1]}), samples=4, seed=0)


def test_zones_split_at_links_slower_than_the_nics():
    leaf = parse_cluster(_cluster())
    assert len(set(zones(leaf).values())) == 1  # leaves and spine: one fabric
    geo = parse_cluster(_cluster(a=4, v=2, sites=3))
    z = zones(geo)
    assert len(set(z.values())) == 3 and z["site0"] != z["site1"] != z["site2"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=6),
       st.sampled_from([1, 6, 32, 96, 512, 1000, 4096]), st.integers(1, 40))
def test_widths_divide_the_batch_and_fit_the_slice(counts, batch, most):
    widths = slice_widths(counts, batch, most)
    for g in widths:
        assert batch % g == 0 and 0 < sum(c // g for c in counts) <= most
    if widths:  # the first leaves the fewest hosts idle of all the widths that qualify
        used = [g * sum(c // g for c in counts) for g in widths]
        assert used[0] == max(used)
    every = [g for g in range(1, max(counts) + 1)
             if batch % g == 0 and 0 < sum(c // g for c in counts) <= most]
    assert sorted(widths) == every


def test_a_slice_stands_for_alike_hosts_and_trains_a_share_of_the_batch():
    problem = _problem(_cluster())  # 40 A100 + 24 V100 hosts
    sl = slice_problem(problem, 8)
    assert sl.width == 8 and len(sl.members) == 8 and not sl.idle  # 5 A100 + 3 V100
    assert sl.problem.training.global_batch == 512 // 8
    names = [h.name for h in sl.problem.cluster.hosts]
    assert names == list(sl.members)
    full = problem.cluster
    seen = [m for ms in sl.members.values() for m in ms]
    assert len(seen) == len(set(seen)) == len(full.hosts)
    for head, ms in sl.members.items():
        assert ms[0] == head and len(ms) == sl.width
        kinds = {(full.host(m).gpu.name, full.host(m).nic_gbps) for m in ms}
        assert len(kinds) == 1
    # The V100 uplinks' mean (log-normal, clipped at 100 Gb/s) is what their slice hosts get.
    mean = {l.a: l.bandwidth.mean() for l in sl.problem.cluster.links}
    real = {l.a: l.bandwidth.mean() for l in full.links}
    assert mean["v-0"] == pytest.approx(real["v-0"]) and 70 < mean["v-0"] < 80
    assert mean["a-0"] == pytest.approx(200)
    with pytest.raises(ConfigError, match="width"):
        slice_problem(problem, 8, width=7)  # 7 does not divide the batch


def test_an_oversubscribed_leaf_shares_its_uplink():
    # 8 hosts of 200 Gb/s under a leaf whose uplinks carry 2 x 400 Gb/s: 100 Gb/s each.
    doc = _cluster(a=64, uplink_gbps=400)
    doc["hosts"] = doc["hosts"][:1]
    sl = slice_problem(_problem(doc), 8)
    assert [l.bandwidth.mean() for l in sl.problem.cluster.links] == [pytest.approx(100)] * 8


def test_sites_keep_their_wan_link_at_a_share_of_its_capacity():
    sl = slice_problem(_problem(_cluster(a=16, v=8, sites=2)), 8)
    wan = [l for l in sl.problem.cluster.links if l.a.startswith("site")]
    assert len(wan) == 1 and wan[0].capacity_gbps == pytest.approx(10 / sl.width)
    assert wan[0].latency_s == pytest.approx(0.02)


def test_expanded_plans_are_the_slice_plan_run_width_times():
    problem = _problem(_cluster(), batch=256)
    sl = slice_problem(problem, 8)
    sol = solve(sl.problem, "metis")
    plan = sl.expand(sol.plan)
    validate_plan(plan, problem.cluster, problem.model, problem.training)
    assert plan.micro_batches == sol.plan.micro_batches
    assert plan.num_gpus == sl.width * sol.plan.num_gpus
    for small, big in zip(sol.plan.stages, plan.stages):
        assert (big.layers, big.tp, big.dp) == (small.layers, small.tp, small.dp * sl.width)
    est_small, est_big = sl.problem.estimate(sol.plan), problem.estimate(plan)
    for a, b in zip(est_small.stages, est_big.stages):
        # Every GPU computes what it did in the slice...
        assert b.work.fwd == pytest.approx(a.work.fwd) and b.work.bwd == pytest.approx(a.work.bwd)
    # ... and holds no more (ZeRO shards spread over more replicas).
    most = {r.stage: r.used_bytes for r in est_small.memory}
    assert all(r.used_bytes <= most[r.stage] * (1 + 1e-9) for r in est_big.memory)
    assert math.isfinite(problem.value(plan))


def test_a_megatron_slice_plan_expands_along_a_host_order():
    """Stages sharing a slice host would share all the hosts it stands for under
    ``expand``; ``expand_in_order`` fills the members one after another instead, so a
    plan Megatron-LM runs on the slice is one it runs on the cluster, with the same
    degrees and layers."""
    from hetpar.plan import Plan, Replica, Stage
    from hetpar.runtime.rules import check_plan, host_runs

    doc = _cluster()
    doc["hosts"] = doc["hosts"][:1]
    doc["hosts"][0]["count"] = 16
    problem = _problem(doc, batch=64)
    sl = slice_problem(problem, 4)
    assert sl.width == 4
    a, b, c, d = list(sl.members)[:4]
    # Four stages of 2 replicas of TP 2 over slice hosts a | a b | b c | c d.
    small = Plan((Stage(6, 2, (Replica(a, (0, 1)), Replica(a, (2, 3)))),
                  Stage(6, 2, (Replica(a, (4, 5)), Replica(b, (0, 1)))),
                  Stage(6, 2, (Replica(b, (2, 3)), Replica(c, (0, 1)))),
                  Stage(6, 2, (Replica(c, (2, 3)), Replica(d, (0, 1))))), 8, "full", 1)
    assert check_plan(small, "megatron") == []
    assert check_plan(sl.expand(small), "megatron")  # the plain expansion breaks the order
    order = host_runs([[r.host for r in st.replicas] for st in small.stages])
    big = sl.expand_in_order(small, order)
    assert check_plan(big, "megatron") == []
    validate_plan(big, problem.cluster, problem.model, problem.training)
    for s, g in zip(small.stages, big.stages):
        assert (g.layers, g.tp, g.dp) == (s.layers, s.tp, s.dp * sl.width)
    gpus = [(r.host, x) for st in big.stages for r in st.replicas for x in r.gpus]
    assert len(gpus) == len(set(gpus))  # no GPU taken twice


def test_hosts_of_assorted_nics_are_sliced_by_gpu_type():
    doc = _cluster(a=64, v=0)
    doc["hosts"] = [{"name": f"a{i}", "gpu": "A100-SXM4-80GB", "gpus": 8,
                     "nic_gbps": 100 + i} for i in range(64)]  # 64 kinds of host
    problem = _problem(doc)
    sl = slice_problem(problem, 8)
    assert sl.width == 8 and len(sl.members) == 8
    validate_plan(sl.expand(solve(sl.problem, "metis").plan), problem.cluster, problem.model,
                  problem.training)


def test_a_batch_too_small_to_share_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="global batch 8"):
        slice_problem(_problem(_cluster(), batch=8), 4)


# ---- the policy on slices ---------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    pytest.importorskip("sb3_contrib")
    from hetpar.agents.io import default_policy_path, load_policy

    if not default_policy_path().is_file():
        pytest.skip("no shipped policy in this checkout")
    return load_policy(None)


def test_the_policy_plans_a_cluster_larger_than_it_observes(shipped):
    from hetpar.agents import planning

    problem = _problem(_cluster())  # 64 hosts, the policy observes 32
    assert len(problem.cluster.hosts) > shipped.max_hosts
    sol = planning.plan(problem, "policy-greedy", policy=shipped)
    validate_plan(sol.plan, problem.cluster, problem.model, problem.training)
    assert sol.value == problem.value(sol.plan)
    sl = sol.details["slices"]
    assert sl["hosts"] == 64 and sl["slice_hosts"] <= shipped.max_hosts
    assert sol.value == min(t["value_s"] for t in sl["tried"])
    assert len({t["width"] for t in sl["tried"]}) == len(sl["tried"]) >= 2
    again = planning.plan(problem, "policy-greedy", policy=shipped)
    assert again.plan == sol.plan  # deterministic
    raw = planning.plan(problem, "policy-raw", policy=shipped, slice_sizes=(16,))
    assert [t["slice_hosts"] <= 16 for t in raw.details["slices"]["tried"]] == [True]


def test_the_policy_plans_a_large_cluster_under_a_runtime(shipped):
    from hetpar.agents import planning
    from hetpar.runtime.rules import check_plan

    problem = _problem(_cluster())
    for runtime in ("megatron", "deepspeed"):
        sol = planning.plan(problem, "policy-greedy", policy=shipped, runtime=runtime)
        assert check_plan(sol.plan, runtime) == []
        validate_plan(sol.plan, problem.cluster, problem.model, problem.training)
        assert sol.value == problem.value(sol.plan)


def test_test_xl_instances_are_large_and_planned_in_slices(shipped):
    from hetpar.agents import planning

    suite = load_suite("test-xl")
    inst = suite.instance(3)
    assert 128 <= inst.num_hosts <= 2048
    problem = Problem.from_instance(inst, samples=4)
    sol = planning.plan(problem, "policy-raw", policy=shipped, slice_sizes=(8,))
    validate_plan(sol.plan, problem.cluster, problem.model, problem.training)


def test_hetpar_plan_on_a_large_cluster(shipped, capsys, tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_cluster()))
    code, out, err = run(capsys, "plan", "--cluster", path, "--model", "gpt3-350m",
                         "--no-improve", "--samples", "2")
    assert code == 0, err
    assert "replica slices" in out and "64 hosts are more than the policy observes" in out
    code, out, _ = run(capsys, "plan", "--cluster", path, "--model", "gpt3-350m",
                       "--no-improve", "--samples", "2", "--json")
    assert code == 0 and json.loads(out)["found"]
    odd = tmp_path / "odd.yaml"
    odd.write_text("global_batch: 1\n")
    code, _, err = run(capsys, "plan", "--cluster", path, "--model", "gpt3-350m",
                       "--no-improve", "--samples", "2", "--training", odd)
    assert_one_line_error(code, err, "replica slices of at most 32 hosts",
                          "global batch 1 (give a larger batch)")


def test_long_host_lists_are_shown_as_runs():
    assert host_list(["a-0", "a-1"]) == "a-0,a-1"
    names = [f"h100-{i}" for i in range(100)] + ["odd"] + [f"a100-{i}" for i in range(4, 9)]
    assert host_list(names) == "h100-0..h100-99,odd,a100-4..a100-8 (106 hosts)"


def test_hetpar_evaluate_plans_test_xl_in_slices(shipped, capsys, tmp_path):
    code, out, err = run(capsys, "evaluate", "--suite", "test-xl", "--n", "1", "--methods",
                         "policy-raw", "--samples", "2", "--out", tmp_path)
    assert code == 0, err
    rows = json.loads((tmp_path / "results.json").read_text())
    assert "policy-raw" in json.dumps(rows) and "| policy-raw | 1/1 |" in out


def test_exact_starts_from_the_policys_slice_plan(shipped):
    from hetpar.agents import planning

    problem = _problem(_cluster())  # 64 hosts
    sol = planning.plan(problem, "exact", policy=shipped, time_limit=3.0)
    assert "policy_start" not in sol.details
    starts = sol.details["starts"]
    assert [s["found_by"] for s in starts] == ["policy"] and sol.value <= starts[0]["value_s"]
