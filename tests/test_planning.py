"""The one planner contract: ``hetpar.agents.planning.plan`` reaches every method and
returns a ``Solution``; ``hetpar solve``, ``hetpar plan`` and ``hetpar evaluate`` print
the same result fields."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from cli_helpers import assert_one_line_error, run
from hetpar.agents import planning
from hetpar.cluster.topology import parse_cluster
from hetpar.errors import ConfigError
from hetpar.problem import Problem, Solution
from hetpar.solvers import solve
from hetpar.workload import parse_model, parse_training

POLICY_METHODS = planning.POLICY_METHODS


def _tiny_problem(**kw) -> Problem:
    """Two hosts of two GPUs and a 4-layer model: brute enumerates it in a second."""
    cluster = parse_cluster({"hosts": [{"name": "a", "gpu": "A100-SXM4-40GB", "gpus": 2,
                                        "nic_gbps": 100},
                                       {"name": "t", "gpu": "T4-16GB", "gpus": 2,
                                        "nic_gbps": 25}],
                             "topology": {"kind": "single_switch"}})
    model = parse_model({"name": "tiny", "layers": 4, "hidden": 1024, "heads": 16,
                         "vocab": 32000, "seq_len": 1024})
    training = parse_training({"global_batch": 8, "recompute": ["none", "full"],
                               "zero": [0, 1]})
    return Problem.of(cluster, model, training, samples=4, seed=1, **kw)


@pytest.fixture(scope="module")
def shipped():
    pytest.importorskip("sb3_contrib")
    from hetpar.agents.io import default_policy_path, load_policy

    if not default_policy_path().is_file():
        pytest.skip("no shipped policy in this checkout")
    return load_policy(None)


@pytest.mark.parametrize("method", [m for m in planning.METHODS if m not in POLICY_METHODS])
def test_every_solver_method_answers_with_a_solution(method):
    problem = _tiny_problem()
    sol = planning.plan(problem, method)
    assert isinstance(sol, Solution) and sol.method == method and sol.found
    assert sol.value == problem.value(sol.plan)  # scored by the problem, like every method
    assert sol.inputs == problem.describe() and sol.found_by and sol.timings
    assert sol.wall_s > 0 and set(sol.to_dict()) == set(_solve_keys())
    if method in ("exact", "brute"):
        assert sol.optimal


@pytest.mark.parametrize("method", POLICY_METHODS)
def test_every_policy_method_answers_with_a_solution(shipped, method):
    problem = _tiny_problem()
    sol = planning.plan(problem, method, policy=shipped)
    assert isinstance(sol, Solution) and sol.method == method and sol.found
    assert sol.value == problem.value(sol.plan)
    assert sol.found_by in ("rollout", "refine", "improve")
    assert set(sol.timings) == {"setup", "inference", "forward", "refine", "improve"}
    assert sol.details["raw_value"] >= sol.value and not sol.optimal
    assert sol.lower_bound is None and set(sol.to_dict()) == set(_solve_keys())
    best = planning.plan(problem, "exact").value
    assert sol.value >= best * (1 - 1e-12)


def test_policy_presets_and_overrides(shipped):
    problem = _tiny_problem()
    raw = planning.plan(problem, "policy-raw", policy=shipped)
    assert raw.found_by == "rollout" and raw.timings["refine"] == 0
    assert raw.timings["improve"] == 0
    beam = planning.plan(problem, "policy-beam", policy=shipped, beam=2)
    assert beam.details["beam"] == 2 and beam.details["improve_evaluations"] > 0
    greedy = planning.plan(problem, "policy-greedy", policy=shipped)
    assert greedy.details["beam"] == 1 and greedy.details["improve_evaluations"] == 0
    assert greedy.details["improved_from"] is None


def test_local_search_starts_from_metis_and_is_never_worse():
    problem = _tiny_problem()
    metis = planning.plan(problem, "metis")
    ls = planning.plan(problem, "local-search", max_evaluations=500)
    assert ls.details["start_value"] == metis.value and ls.value <= metis.value
    assert ls.found_by in ("metis", "improve") and set(ls.timings) == {"metis", "improve"}


def test_unknown_methods_and_foreign_options_are_refused():
    problem = _tiny_problem()
    with pytest.raises(ConfigError, match="unknown method"):
        planning.plan(problem, "magic")
    with pytest.raises(ConfigError, match="beam"):
        planning.plan(problem, "metis", beam=2)
    with pytest.raises(ConfigError, match="workers"):
        planning.plan(problem, "policy", workers=2)


def test_the_policy_methods_without_torch_are_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # ``import torch`` raises ImportError
    with pytest.raises(ConfigError, match=r"rl.* extra"):
        planning.plan(_tiny_problem(), "policy")


def test_importing_the_contract_does_not_import_torch():
    code = ("import sys, hetpar.agents as a, hetpar.agents.planning; a.plan; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_deadline_search_is_the_exact_search_when_it_finishes():
    """``certify=False`` (the re-planner's exact search) finds the optimum of a search
    that ends within its limit, certifies it, and is refused where it does not apply."""
    problem = _tiny_problem()
    proof = solve(problem, "exact")
    fast = solve(problem, "exact", time_limit=60.0, certify=False)
    assert fast.optimal and fast.value == pytest.approx(proof.value, rel=1e-12)
    assert fast.certificate.lower_bound == fast.value and fast.found_by in ("metis", "search")
    stopped = solve(problem, "exact", time_limit=1e-9, certify=False)
    assert not stopped.optimal and stopped.certificate.stopped == "time limit"
    assert stopped.found_by == "metis" and stopped.lower_bound <= stopped.value
    with pytest.raises(ConfigError, match="certify"):
        solve(problem, "exact", workers=2, certify=False)
    with pytest.raises(ConfigError, match="certify"):
        solve(problem, "metis", certify=False)


def _solve_keys() -> list[str]:
    sol = solve(_tiny_problem(), "metis")
    return list(sol.to_dict())


# ---- the commands print the same fields --------------------------------------------------

def test_plan_and_solve_json_have_the_same_result_fields(capsys, shipped):
    args = ("--cluster", "amp-het-16", "--model", "gpt2-medium", "--samples", "4", "--json",
            "--timings")  # every field of Solution.to_dict (without: all but the timings)
    code, out, err = run(capsys, "solve", "--method", "metis", *args)
    assert code == 0, err
    solved = json.loads(out)
    code, out, err = run(capsys, "plan", "--no-improve", *args)
    assert code == 0, err
    planned = json.loads(out)
    assert set(planned) == set(solved) == set(_solve_keys())
    assert planned["inputs"] == solved["inputs"]  # one problem, read the same way
    assert planned["method"] == "policy-greedy" and solved["method"] == "metis"


def test_plan_and_solve_print_the_same_summary(capsys, shipped):
    args = ("--cluster", "amp-het-16", "--model", "gpt2-medium", "--samples", "4")
    code, solved, err = run(capsys, "solve", "--method", "local-search", *args)
    assert code == 0, err
    code, planned, err = run(capsys, "plan", *args)
    assert code == 0, err
    for out, method in ((solved, "local-search"), (planned, "policy")):
        text = " ".join(out.split())
        assert f"{method}: objective mean = " in text
        assert "over 4 bandwidth samples (seed 0)" in text and "plans scored in" in text
        assert "time: " in text
    assert "ms of inference" in planned and "structure search" in planned


def test_solve_local_search_bad_time_limit_is_one_line(capsys):
    code, _, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       "--method", "local-search", "--time-limit", "0")
    assert_one_line_error(code, err, "--time-limit")


def test_evaluate_rows_carry_the_result_fields(capsys, shipped, tmp_path):
    pytest.importorskip("matplotlib")
    methods = "policy-raw,metis,local-search"
    code, out, err = run(capsys, "evaluate", "--suite", "tiny", "--n", "1", "--methods",
                         methods, "--samples", "4", "--out", tmp_path / "ev", "--json",
                         "--timings")
    assert code == 0, err
    doc = json.loads(out)
    assert [r["method"] for r in doc["rows"]] == methods.split(",")
    keys = set(_solve_keys())
    for row in doc["rows"]:
        assert keys <= set(row), keys - set(row)
        assert {"suite", "index", "instance", "reference", "reference_gap", "error"} <= set(row)
        assert row["found"] and math.isfinite(row["value_s"]) and row["plan"]["stages"]
        assert row["inputs"]["samples"] == 4 and row["inputs"]["seed"] == 0
    saved = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert [r["value_s"] for r in saved["rows"]] == [r["value_s"] for r in doc["rows"]]
