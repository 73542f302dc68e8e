"""Exact is never worse than a baseline it could have run: the Metis-style and
Megatron-style plans, the policy's and any start plan seed its incumbent, and the answer
names the part that found it (``found_by``)."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetpar
from cli_helpers import assert_one_line_error, run
from hetpar.agents import planning
from hetpar.cluster import parse_cluster
from hetpar.errors import ConfigError, InfeasibleError, PlanError
from hetpar.plan import Plan, Replica, Stage
from hetpar.problem import Problem, Solution
from hetpar.solvers import solve
from hetpar.workload import parse_model, parse_training

GPU_TYPES = ("V100-SXM2-16GB", "V100-SXM2-32GB", "T4-16GB", "A100-SXM4-40GB", "L4-24GB")
# Types of one speed: a stage over both (data parallel) lies outside the plan space.
FAMILIES = (("V100-SXM2-16GB", "V100-SXM2-32GB"), ("A100-SXM4-40GB", "A100-SXM4-80GB"))
BASELINES = ("metis", "megatron", "random")
SEEDED = ("metis", "megatron")  # run by exact itself, whatever its time limit
REL = 1e-12  # the same plan scores the same; this only absorbs float formatting


@st.composite
def tiny_problems(draw: st.DrawFn) -> Problem:
    """tests/test_solvers.py's ``tiny_instance``, drawn by hypothesis: <= 3 hosts, <= 6
    GPUs of 2 types, <= 8 layers, random bandwidths, mean / p90 / CVaR. Half the time the
    types are of one family (``FAMILIES``) with as many GPUs per host, where the best plan
    is often a Megatron-style stage over both types, outside the plan space."""
    family = draw(st.booleans())
    types = list(draw(st.sampled_from(FAMILIES)) if family else draw(
        st.lists(st.sampled_from(GPU_TYPES), min_size=2, max_size=2, unique=True)))
    n_hosts = draw(st.integers(2, 3))
    per_host = draw(st.sampled_from([1, 2, 2, 4]))
    hosts = []
    for i in range(n_hosts):
        nic = draw(st.sampled_from([10.0, 25.0, 100.0, 400.0]))
        gpus = per_host if family else draw(st.sampled_from([1, 2, 2, 4]))
        host = {"name": f"h{i}", "gpu": types[i % 2] if i < 2 else draw(st.sampled_from(types)),
                "gpus": gpus, "nic_gbps": nic}
        if draw(st.booleans()):
            host["uplink"] = {"bandwidth": {"kind": "lognormal",
                                            "mean_gbps": draw(st.floats(0.3, 0.9)) * nic,
                                            "cv": draw(st.floats(0.1, 0.5))}}
        hosts.append(host)
    while sum(h["gpus"] for h in hosts) > 6:
        max(hosts, key=lambda h: h["gpus"])["gpus"] //= 2
    cluster = parse_cluster({"hosts": hosts, "topology": {"kind": "single_switch"}})
    layers = draw(st.integers(2, 5 if cluster.num_gpus > 4 else 8))
    model = parse_model({"name": "tiny", "layers": layers, "hidden": 1024, "heads": 16,
                         "vocab": 32000, "seq_len": 1024})
    modes = draw(st.lists(st.sampled_from(["none", "selective", "full"]), min_size=1,
                          max_size=2, unique=True))
    training = parse_training({"global_batch": draw(st.sampled_from([2, 4, 8])),
                               "recompute": modes,
                               "zero": draw(st.sampled_from([[0], [0, 1]]))})
    return Problem.of(cluster, model, training,
                      objective=draw(st.sampled_from(["mean", "p90", "cvar0.9"])),
                      samples=4, seed=draw(st.integers(0, 1000)))


def _baselines(problem: Problem) -> dict[str, float]:
    return {m: solve(problem, m, budget=30).value for m in BASELINES}


def _never_worse(value: float, baselines: dict[str, float], methods: tuple[str, ...]) -> None:
    for m in methods:
        assert value <= baselines[m] * (1 + REL), (m, value, baselines[m])


def _exact_value(problem: Problem, **options) -> float:
    """Exact's value; infinite where it finds that no plan of the space fits (and no seed
    does either)."""
    try:
        sol = solve(problem, "exact", **options)
    except InfeasibleError:
        return math.inf
    if sol.found:
        assert sol.value == problem.value(sol.plan)
        assert sol.found_by in ("metis", "megatron", "dive", "search")
    return sol.value


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=tiny_problems())
def test_exact_is_never_worse_than_a_baseline(problem):
    """Searched to the end, and stopped before its search starts: exact's value is at most
    every baseline's (random's only when searched: it is no seed)."""
    try:
        base = _baselines(problem)
    except InfeasibleError:
        return  # the model fits nowhere: every method refuses alike (tests/test_solvers.py)
    _never_worse(_exact_value(problem), base, BASELINES)
    _never_worse(_exact_value(problem, time_limit=1e-6), base, SEEDED)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=tiny_problems())
def test_the_deadline_search_is_never_worse_than_a_baseline(problem):
    """``certify=False`` (the re-planner's search) takes the same seeds."""
    try:
        base = _baselines(problem)
    except InfeasibleError:
        return
    _never_worse(_exact_value(problem, time_limit=60, certify=False), base, BASELINES)
    _never_worse(_exact_value(problem, time_limit=1e-6, certify=False), base, SEEDED)


# ---- a plan outside the space ------------------------------------------------------------

# One V100 16 GB, one V100 32 GB and one T4 on 100 Gb/s: the best plan is data parallel
# over both V100s, a stage of two GPU types that the plan space has not (its optimum is
# 0.0887 s) and that the Megatron-style grid misses (0.0929 s: it lays out all 3 GPUs).
V100S = {"hosts": [{"name": "a", "gpu": "V100-SXM2-16GB", "gpus": 1, "nic_gbps": 100},
                   {"name": "b", "gpu": "V100-SXM2-32GB", "gpus": 1, "nic_gbps": 100},
                   {"name": "c", "gpu": "T4-16GB", "gpus": 1, "nic_gbps": 100}],
         "topology": {"kind": "single_switch"}}
TINY = {"name": "tiny", "layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000,
        "seq_len": 1024}
TRAINING = {"global_batch": 8}


def _two_v100_problem() -> Problem:
    return Problem.of(parse_cluster(V100S), parse_model(TINY), parse_training(TRAINING),
                      samples=4)


def _data_parallel_v100s() -> Plan:
    return Plan((Stage(4, 1, (Replica("a", (0,)), Replica("b", (0,)))),), 1, "none", 1)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_start_better_than_everything_else_is_the_answer(workers):
    problem = _two_v100_problem()
    start = _data_parallel_v100s()
    value = problem.value(start)
    space_optimum = solve(problem, "brute").value
    others = [space_optimum, *_baselines(problem).values()]
    assert value < min(others)  # it lies outside the space and beats all of it
    sol = solve(problem, "exact", workers=workers, starts=[start])
    assert sol.plan == start and sol.value == value and sol.found_by == "start"
    # Searched to the end: no plan of the space beats it, and the bound says so.
    assert sol.optimal and sol.lower_bound == value and sol.gap == 0.0
    assert sol.details["starts"] == [{"found_by": "start", "value_s": value}]
    assert set(sol.timings) >= {"starts", "metis", "megatron", "dive", "search"}
    named = solve(problem, "exact", starts=[("policy", start)], time_limit=1e-6)
    assert named.plan == start and named.found_by == "policy"
    assert named.lower_bound <= named.value
    deadline = solve(problem, "exact", starts=[start], time_limit=30, certify=False)
    assert deadline.plan == start and deadline.found_by == "start" and deadline.optimal


def test_a_start_no_better_than_the_search_loses_the_credit():
    problem = _two_v100_problem()
    alone = solve(problem, "exact")
    worst = solve(problem, "random", budget=5)
    sol = solve(problem, "exact", starts=[worst.plan])
    assert sol.value == alone.value and sol.found_by == alone.found_by != "start"
    # Of equal plans a baseline's keeps the credit, a start's the dive's and the search's.
    assert alone.found_by in ("dive", "search")
    tie = solve(problem, "exact", starts=[alone.plan])
    assert tie.value == alone.value and tie.found_by == "start"
    metis = solve(problem, "metis")
    megatron = solve(problem, "megatron")
    for workers in (1, 2):
        tie = solve(problem, "exact", starts=[metis.plan], workers=workers, time_limit=1e-6)
        assert tie.value == metis.value
        # One worker credits metis first; with several, seeds of equal value are credited
        # to whichever reported first (docs/solvers.md), and here megatron's ties metis's.
        equal = {"metis"} | ({"megatron"} if workers > 1 and megatron.value == metis.value
                             else set())
        assert tie.found_by in equal, (workers, tie.found_by)


def test_start_plans_are_checked_against_the_problem():
    problem = _two_v100_problem()
    bad = Plan((Stage(4, 1, (Replica("nowhere", (0,)),)),), 1, "none", 0)
    with pytest.raises(PlanError, match=r"start plan 1 \(start\).*unknown host 'nowhere'"):
        solve(problem, "exact", starts=[bad])
    wrong_layers = Plan((Stage(3, 1, (Replica("a", (0,)),)),), 1, "none", 0)
    with pytest.raises(PlanError, match="layers"):
        solve(problem, "exact", starts=[_data_parallel_v100s(), ("policy", wrong_layers)])
    with pytest.raises(ConfigError, match="exact search only"):
        solve(problem, "metis", starts=[_data_parallel_v100s()])
    with pytest.raises(ConfigError, match="not a plan"):
        solve(problem, "exact", starts=["plan.json"])


def test_the_seeds_keep_the_proof_on_amp_het_16():
    """Megatron's plan (0.4665 s) does not beat metis's (0.4511 s) there: the search
    visits the nodes it visited before the seed joined, and proves the same optimum."""
    problem = Problem.of(hetpar.load_cluster("amp-het-16"), hetpar.load_model("gpt2-medium"),
                         hetpar.load_training(None), samples=8, seed=0)
    sol = solve(problem, "exact")
    assert sol.optimal and sol.value == 0.33408564985229194
    assert sol.certificate.nodes <= 54_271


# ---- the policy's plan as a start (planning.plan) ----------------------------------------

def test_planning_passes_the_policys_plan_as_a_start(monkeypatch):
    """``planning.plan(problem, "exact")`` plans with the policy first; its plan stands
    when nothing beats it. ``policy_start=False`` skips it, without torch it is skipped
    with a note."""
    pytest.importorskip("torch")
    import sys

    from hetpar.agents import planner

    problem = _two_v100_problem()
    start = _data_parallel_v100s()
    calls = []

    def fake(bundle, problem_, **settings):
        calls.append(settings)
        return Solution("policy", problem_.objective.name, start, problem_.estimate(start),
                        problem_.value(start), 0.0, found_by="rollout")

    monkeypatch.setattr(planner, "plan_with_policy", fake)
    sol = planning.plan(problem, "exact", time_limit=30)
    assert sol.plan == start and sol.found_by == "policy"
    assert "policy" in sol.timings and calls and calls[0]["budget_s"] == 0.25 * 30
    assert calls[0]["improve_evaluations"] > 0  # the full planner, not policy-greedy
    assert sol.details["starts"] == [{"found_by": "policy", "value_s": problem.value(start)}]
    off = planning.plan(problem, "exact", policy_start=False)
    assert off.found_by != "policy" and "policy" not in off.timings and len(calls) == 1
    with pytest.raises(ConfigError, match="policy_start"):
        planning.plan(problem, "metis", policy_start=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    skipped = planning.plan(problem, "exact")
    assert skipped.found_by != "policy" and "torch" in skipped.details["policy_start"]


def test_the_policy_start_is_skipped_on_clusters_the_policy_does_not_handle(monkeypatch):
    pytest.importorskip("torch")
    from hetpar.agents.io import load_policy

    bundle = load_policy(None)
    # Three kinds of host, one of each, for a policy observing two: no replica slice.
    monkeypatch.setitem(bundle.meta, "max_hosts", 2)
    sol = planning.plan(_two_v100_problem(), "exact", policy=bundle)
    assert sol.found and "cannot be cut into replica slices" in sol.details["policy_start"]
    monkeypatch.setitem(bundle.meta, "max_hosts", 32)
    monkeypatch.setitem(bundle.meta["env_kwargs"], "max_layers", 2)
    sol = planning.plan(_two_v100_problem(), "exact", policy=bundle)
    assert sol.found and "max_layers" in sol.details["policy_start"]


def test_the_shipped_policys_plan_seeds_exact():
    pytest.importorskip("torch")
    problem = _two_v100_problem()
    sol = planning.plan(problem, "exact")  # no limit: the policy plans unhurried
    policy = planning.plan(problem, "policy")
    assert sol.value <= policy.value
    assert [s["found_by"] for s in sol.details["starts"]] == ["policy"]
    assert sol.details["starts"][0]["value_s"] == policy.value


# ---- the consumer cluster of the issue ---------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("model", ["gpt2-xl", "llama3-8b"])
def test_exact_with_a_short_limit_is_no_worse_than_megatron_on_consumer_gpus(model, workers):
    """4 hosts of RTX 4090 / 3090 on 10 GbE (configs/clusters/consumer-16.yaml). With
    Llama 3 8B the Megatron-style plan beats the Metis-style one by 18%; a limit too
    short for the search used to return Metis's."""
    problem = Problem.of(hetpar.load_cluster("consumer-16"), hetpar.load_model(model),
                         hetpar.load_training(None), samples=8, seed=0)
    base = {m: solve(problem, m).value for m in SEEDED}
    sol = solve(problem, "exact", workers=workers, time_limit=0.05)
    _never_worse(sol.value, base, SEEDED)
    if base["megatron"] < base["metis"]:
        assert sol.found_by in ("megatron", "dive", "search")


# ---- the command line --------------------------------------------------------------------

def _files(tmp_path):
    paths = []
    for name, doc in (("v100s", V100S), ("tiny", TINY), ("training", TRAINING)):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(doc))
    cluster, model, training = paths
    start = tmp_path / "start.json"
    _data_parallel_v100s().save(start)
    return ["solve", "--cluster", cluster, "--model", model, "--training", training,
            "--samples", "4", "--seed", "0"], start


def test_cli_start_plans_seed_the_exact_search(capsys, tmp_path):
    base, start = _files(tmp_path)
    code, out, err = run(capsys, *base, "--start", start, "--no-policy-start", "--json",
                         "--timings")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["found_by"] == "start" and doc["optimal"]
    assert doc["plan"] == Plan.load(start).to_dict()
    assert "policy" not in doc["timings_s"]
    code, out, err = run(capsys, *base, "--start", start, "--start", start,
                         "--no-policy-start", "--time-limit", "5")
    assert code == 0, err
    assert "best plan found by a start plan (--start)" in " ".join(out.split())


def test_cli_bad_start_plans_are_one_line(capsys, tmp_path):
    base, start = _files(tmp_path)
    missing = tmp_path / "missing.json"
    code, _, err = run(capsys, *base, "--start", missing, "--no-policy-start")
    assert_one_line_error(code, err, "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    code, _, err = run(capsys, *base, "--start", broken, "--no-policy-start")
    assert_one_line_error(code, err, "broken.json", "malformed JSON")
    elsewhere = tmp_path / "elsewhere.json"
    doc = json.loads(start.read_text())
    doc["stages"][0]["replicas"][0]["host"] = "nowhere"
    elsewhere.write_text(json.dumps(doc))
    code, _, err = run(capsys, *base, "--start", elsewhere, "--no-policy-start")
    assert_one_line_error(code, err, "elsewhere.json", "unknown host 'nowhere'")
    code, _, err = run(capsys, *base, "--method", "metis", "--start", start)
    assert_one_line_error(code, err, "--start", "exact search only")

