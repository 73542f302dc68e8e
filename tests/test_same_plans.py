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
