"""Same seed, same output: every planning command run twice prints the same ``--json`` bytes.

Each command runs as two real ``hetpar`` processes side by side (two processes on a busy
machine: any dependence on timing shows). ``--json`` leaves out the wall-clock figures
unless ``--timings`` (``hetpar.cli.jsonout``); what may still differ is said in
docs/solvers.md ("Same seed, same output"): a search stopped by its time limit, several
exact workers, and replan's strategies that charge measured planning time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN = str(ROOT / "configs" / "plans" / "amp-het-16-gpt2.json")
SMALL = ["--cluster", "dgx-a100-superpod-4", "--model", "gpt3-125m", "--samples", "4",
         "--seed", "3"]


def assert_same_twice(args: list[str], out_dir: Path | None = None) -> dict:
    """Run ``hetpar ARGS`` twice at once (each with its own ``--out`` folder under
    ``out_dir``, whose name is no part of the JSON) and compare what they print."""
    env = {**os.environ, "PYTHONHASHSEED": "random"}  # string sets in another order each run
    procs = []
    for i in (1, 2):
        extra = ["--out", str(out_dir / f"run{i}")] if out_dir is not None else []
        procs.append(subprocess.Popen([sys.executable, "-m", "hetpar", *args, *extra],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      cwd=ROOT, env=env))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()[-2000:]
        outs.append(out)
    assert outs[0] == outs[1], f"hetpar {' '.join(args)}: two runs printed different JSON"
    return json.loads(outs[0])


def test_estimate():
    doc = assert_same_twice(["estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                             "--plan", PLAN, "--samples", "16", "--seed", "5", "--json"])
    assert doc["instance"]["seed"] == 5


@pytest.mark.parametrize("method", ["megatron", "metis", "random", "local-search"])
def test_solve_baselines(method):
    doc = assert_same_twice(["solve", *SMALL, "--method", method, "--json"])
    assert doc["found"] and "wall_s" not in doc and "timings_s" not in doc


def test_solve_local_search_with_a_limit_it_does_not_reach():
    assert_same_twice(["solve", *SMALL, "--method", "local-search", "--time-limit", "300",
                       "--json"])


def test_solve_exact_with_and_without_a_limit_it_does_not_reach():
    """No limit: the same bytes twice. A limit the search never reaches changes nothing:
    the same bytes again (a limit that stops the search may not; docs/solvers.md)."""
    base = ["solve", *SMALL, "--method", "exact", "--no-policy-start", "--json"]
    free = assert_same_twice(base)
    assert free["optimal"] and free["certificate"]["stopped"] == ""
    assert "wall_s" not in free["certificate"]
    limited = assert_same_twice([*base, "--time-limit", "300"])
    assert limited == free


def test_solve_brute(tmp_path):
    cluster = tmp_path / "two-hosts.yaml"
    cluster.write_text("name: two-hosts\n"
                       "hosts:\n"
                       "  - {name: a, gpu: A100-SXM4-40GB, gpus: 2, nic_gbps: 100}\n"
                       "  - {name: t, gpu: T4-16GB, gpus: 1, nic_gbps: 25}\n"
                       "topology: {kind: single_switch}\n")
    training = tmp_path / "training.yaml"
    training.write_text("global_batch: 8\n")
    doc = assert_same_twice(["solve", "--cluster", str(cluster), "--model", "gpt3-125m",
                             "--training", str(training), "--samples", "4",
                             "--method", "brute", "--json"])
    assert doc["found"]


def test_timings_flag_puts_the_wall_clock_back():
    out = subprocess.run([sys.executable, "-m", "hetpar", "solve", *SMALL, "--method", "metis",
                          "--json", "--timings"], capture_output=True, cwd=ROOT, check=True)
    doc = json.loads(out.stdout)
    assert doc["wall_s"] > 0 and "search" in doc["timings_s"]


def test_plan():
    pytest.importorskip("torch")
    doc = assert_same_twice(["plan", *SMALL, "--improve", "2000", "--compare", "metis",
                             "--json"])
    assert doc["found"] and "wall_s" not in doc["compare"]


def test_evaluate(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    args = ["evaluate", "--suite", "tiny", "--n", "1", "--samples", "4",
            "--methods", "policy,exact,metis,megatron,random,local-search",
            "--time-limit", "300", "--json"]
    doc = assert_same_twice(args, tmp_path)
    rows = doc["rows"]
    assert {r["method"] for r in rows} >= {"exact", "metis"}
    assert all("wall_s" not in r for r in rows)


def test_replan(tmp_path):
    pytest.importorskip("matplotlib")
    # Searches stop after node budgets, not clocks: the scenario's own model, searches cut
    # short by their budget, the same bytes twice. (Without the hindsight oracle, whose
    # certifying searches were 20 of each run's 23 s: test_oracle.py runs the command
    # twice with it and compares the output.)
    args = ["replan", "--scenario", "stable-dc", "--strategies", "static,robust,exact",
            "--iterations", "3000", "--node-limit", "3000", "--json", "--no-oracle"]
    doc = assert_same_twice(args, tmp_path)
    assert set(doc["runs"]) == {"static", "robust", "exact"}
    assert "exact_latency_s" not in doc
    assert all("planning_wall_s" not in r for runs in doc["runs"].values() for r in runs)
