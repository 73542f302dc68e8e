"""The code plans what it planned when tests/data/golden_plans.json was written.

Re-runs the ``quick`` subset of the golden snapshot through ``benchmarks/same_plans.py``
(the solver cases always; the shipped policy's cases where torch and sb3-contrib are
installed) and fails on any value or plan that differs. The full snapshot is checked with
``python benchmarks/same_plans.py --check tests/data/golden_plans.json``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden_plans.json"


def _load_script():
    return load_benchmark("same_plans")


@pytest.fixture(scope="module")
def same_plans():
    return _load_script()


@pytest.fixture(scope="module")
def quick_cases(same_plans):
    doc = same_plans.load_golden(GOLDEN)
    return same_plans.select(doc["cases"], "quick")


def _check(same_plans, cases):
    lines: list[str] = []
    n, mismatches, _ = same_plans.check_records(cases, report=lines.append)
    assert n == len(cases)
    assert not mismatches, (f"{len(mismatches)} of {n} cases differ from {GOLDEN.name}:\n"
                            + "\n".join(lines))


def test_quick_subset_covers_solvers_and_policy(same_plans, quick_cases):
    methods = {c["method"] for c in quick_cases}
    assert {"metis", "megatron", "random", "local-search", "exact", "brute"} <= methods
    assert set(same_plans.POLICY_METHODS) <= methods
    # the exact and brute cases are compared only where they were proven optimal
    assert all(c["optimal"] for c in quick_cases if c["method"] in ("exact", "brute"))


def test_solver_cases_same_as_golden(same_plans, quick_cases):
    cases = [c for c in quick_cases if not same_plans.needs_policy(c)]
    assert cases
    _check(same_plans, cases)


def test_policy_cases_same_as_golden(same_plans, quick_cases):
    pytest.importorskip("torch", reason="the shipped policy needs torch (extra 'rl')")
    pytest.importorskip("sb3_contrib", reason="the shipped policy needs sb3-contrib (extra 'rl')")
    cases = [c for c in quick_cases if same_plans.needs_policy(c)]
    assert cases
    _check(same_plans, cases)


def _record(hosts: list[str], value: float = 0.5) -> dict:
    stages = [{"layers": 12, "tp": 1, "replicas": [{"host": h, "gpus": [0]}]} for h in hosts]
    return {"id": "bundled/amp-het-16/gpt2-medium/policy", "method": "policy",
            "inputs": {"cluster": "amp-het-16", "model": "gpt2-medium",
                       "training": "default"},
            "error": "", "found": True, "value_s": value,
            "plan": {"version": 1, "micro_batches": 4, "recompute": "none", "zero": 1,
                     "stages": stages}}


def test_a_tie_between_hosts_of_the_same_hardware_is_the_same_plan(same_plans):
    stored = _record(["v100-1", "v100-0"])
    # Two V100 hosts swapped one-to-one: the cost model cannot tell the plans apart.
    status, msgs = same_plans.compare(stored, _record(["v100-0", "v100-2"]))
    assert status == "ok" and "interchangeable hosts" in msgs[0]
    # A host of other hardware (the T4) is another plan, whatever the value.
    assert same_plans.compare(stored, _record(["t4", "v100-0"]))[0] == "mismatch"
    # Two stored hosts onto one new host is not a renaming.
    assert same_plans.compare(stored, _record(["v100-0", "v100-0"]))[0] == "mismatch"
    # A renaming with another value is a mismatch of the value.
    assert same_plans.compare(stored, _record(["v100-0", "v100-2"], 0.6))[0] == "mismatch"


def test_a_renaming_may_reorder_replicas_and_gpu_numbers(same_plans):
    stored = _record(["v100-1", "v100-0"])
    stored["plan"]["stages"][0]["replicas"] = [{"host": "v100-1", "gpus": [3]},
                                               {"host": "v100-0", "gpus": [0]}]
    new = _record(["v100-1", "v100-0"])
    new["plan"]["stages"][0]["replicas"] = [{"host": "v100-2", "gpus": [0]},
                                            {"host": "v100-1", "gpus": [1]}]
    new["plan"]["stages"][1]["replicas"] = [{"host": "v100-2", "gpus": [1]}]
    assert same_plans.compare(stored, new)[0] == "ok"
    # The same hosts, but one GPU moved from the first stage to the second: another plan.
    new["plan"]["stages"][0]["replicas"] = [{"host": "v100-1", "gpus": [1]}]
    new["plan"]["stages"][1]["replicas"] = [{"host": "v100-2", "gpus": [1]},
                                            {"host": "v100-2", "gpus": [2]}]
    assert same_plans.compare(stored, new)[0] == "mismatch"


def test_refresh_reruns_only_the_cases_on_clusters_with_the_gpu_type(same_plans, tmp_path):
    """After one GPU type's calibration: --refresh re-runs the cases whose cluster has that
    type and keeps the others as stored."""
    doc = same_plans.load_golden(GOLDEN)
    by_id = {c["id"]: c for c in doc["cases"]}
    h100 = dict(by_id["bundled/cloud-mixed/gpt3-125m/metis"], value_s=1.0)
    other = dict(by_id["bundled/amp-het-16/gpt2-medium/metis"], value_s=1.0)
    path = tmp_path / "golden.json"
    path.write_text(same_plans.dump_golden(dict(doc, cases=[h100, other])))
    assert same_plans.main(["--refresh", str(path), "--gpu", "H100-SXM5-80GB"]) == 0
    cases = same_plans.load_golden(path)["cases"]
    assert cases[0]["value_s"] == by_id[h100["id"]]["value_s"]  # re-run
    assert cases[1]["value_s"] == 1.0  # kept
