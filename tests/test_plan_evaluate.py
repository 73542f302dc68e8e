"""``hetpar plan`` and ``hetpar evaluate`` with a small untrained policy.

An untrained policy still yields feasible plans (the masks guarantee it), which is all
these tests need; plan quality is measured by ``hetpar evaluate`` with the shipped policy.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("sb3_contrib")
pytest.importorskip("matplotlib")

from hetpar.agents.evaluate import CSV_COLUMNS, evaluate
from hetpar.agents.io import load_policy, save_policy
from hetpar.agents.planner import plan_with_policy, policy_problem
from cli_helpers import assert_one_line_error, run  # noqa: E402
from hetpar.cluster.topology import load_cluster
from hetpar.costmodel.estimate import CostModel
from hetpar.problem.generator import load_suite, save_instances
from hetpar.costmodel.objective import Objective
from hetpar.errors import ConfigError
from hetpar.problem import PlanSpace, Solution
from hetpar.solvers.refine import refine_plan
from hetpar.workload.model import load_model
from hetpar.workload.training import load_training

SAMPLES = 4


def _untrained(path: Path, max_hosts: int, instances) -> Path:
    from sb3_contrib import MaskablePPO

    from hetpar.envs.env import PlanBuilderEnv

    env = PlanBuilderEnv(instances, max_hosts=max_hosts, bandwidth="robust", samples=SAMPLES)
    from hetpar.agents.policy import HostAttentionPolicy

    model = MaskablePPO(HostAttentionPolicy, env, seed=0, n_steps=64, batch_size=32,
                        policy_kwargs={"dim": 16, "heads": 2, "rounds": 1, "edge_dim": 8,
                                       "value_dim": 16})
    return save_policy(model, path, {"max_hosts": max_hosts,
                                     "env_kwargs": {"bandwidth": "robust",
                                                    "samples": SAMPLES}})


@pytest.fixture(scope="module")
def tiny_instances():
    # Instances 2 and 3 of the tiny suite: exact proves their optimum in seconds.
    return load_suite("tiny").instances(2, start=2)


@pytest.fixture(scope="module")
def policy8(tmp_path_factory, tiny_instances) -> Path:
    return _untrained(tmp_path_factory.mktemp("pol") / "untrained8.zip", 8, tiny_instances)


@pytest.fixture(scope="module")
def policy2(tmp_path_factory, tiny_instances) -> Path:
    two = [i for i in tiny_instances if i.num_hosts <= 2]
    return _untrained(tmp_path_factory.mktemp("pol") / "untrained2.zip", 2, two)




@pytest.mark.parametrize("cluster", ["amp-het-16", "cloud-mixed"])
def test_plan_with_policy_is_feasible_and_scored_like_solve(policy8, cluster):
    bundle = load_policy(policy8)
    cl, model, training = load_cluster(cluster), load_model("gpt2-medium"), load_training(None)
    problem = policy_problem(bundle, cl, model, training, seed=3)
    res = plan_with_policy(bundle, problem)
    assert isinstance(res, Solution) and res.method == "policy-greedy"
    assert res.estimate.feasible and math.isfinite(res.value)
    assert res.inputs["samples"] == SAMPLES and res.objective == "mean"
    assert res.inputs["seed"] == 3 and res.found_by in ("rollout", "refine")
    t = res.timings
    assert res.details["steps"] >= 4 and t["inference"] > 0
    assert 0 < t["forward"] <= t["inference"]
    # The same states as solve(..., samples=K, seed=3) use: the problem's value.
    cm = CostModel(cl, model, training, samples=SAMPLES, seed=3)
    mean, p90 = Objective.parse("mean"), Objective.parse("p90")
    assert cm.evaluate(res.plan).value(mean) == pytest.approx(res.value, rel=1e-12)
    assert problem.value(res.plan) == res.value
    assert res.plan.num_gpus <= cl.num_gpus
    # Deterministic: the same plan again.
    assert plan_with_policy(bundle, problem).plan == res.plan
    # The objective can be overridden: the rollout is the same, the refinement follows it.
    raw = plan_with_policy(bundle, problem, refine=False)
    again = plan_with_policy(bundle, problem.with_objective("p90"), refine=False)
    assert again.plan.to_dict() == raw.plan.to_dict()
    assert again.objective == "p90" and raw.method == "policy-raw"
    assert cm.evaluate(again.plan).value(p90) == pytest.approx(again.value, rel=1e-12)
    # Refinement keeps the rollout's structure and is never worse than it.
    space = PlanSpace(cl, cm.model, training)
    assert raw.value == pytest.approx(res.details["raw_value"], rel=1e-12)
    assert raw.timings["refine"] == 0 and raw.found_by == "rollout"
    assert res.value <= raw.value and res.timings["refine"] > 0
    assert space.decompose(res.plan)[0] == space.decompose(raw.plan)[0]
    # Without a step budget it is the structure's best completion.
    full = plan_with_policy(bundle, problem, refine_steps=None)
    ref = refine_plan(cm, space, Objective.parse("mean"), raw.plan)
    assert full.details["refine_complete"] and ref.complete
    assert full.value == pytest.approx(ref.value, rel=1e-12) and full.value <= res.value


def test_plan_cli_prints_plan_compares_and_writes_estimable_file(capsys, policy8, tmp_path):
    out_file = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "amp-het-16",
                         "--model", "gpt2-medium", "--out", out_file, "--compare", "metis")
    assert code == 0, err
    for text in ("Plan", "Memory per GPU", "policy", "ms of inference", "refinement",
                 "gap T_policy / T_metis - 1", "plan written to"):
        assert text in out, text
    code, out, err = run(capsys, "estimate", "--cluster", "amp-het-16", "--model",
                         "gpt2-medium", "--plan", out_file, "--samples", str(SAMPLES))
    assert code == 0, err
    assert "feasible" in out and "infeasible" not in out


def test_plan_cli_json_gap_is_consistent(capsys, policy8):
    code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                         "--model", "gpt2-medium", "--compare", "megatron", "--json",
                         "--objective", "cvar0.9", "--timings")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["objective"] == "cvar0.9" and doc["inputs"]["samples"] == SAMPLES
    assert doc["inputs"]["cluster"] == "cloud-mixed" and doc["method"] == "policy"
    cmp_ = doc["compare"]
    assert cmp_["method"] == "megatron"
    assert cmp_["policy_gap"] == pytest.approx(doc["value_s"] / cmp_["value_s"] - 1)
    assert doc["timings_s"]["inference"] > 0 and doc["plan"]["stages"]
    # The default: one rollout per allowed micro-batch count, refined, then the structure
    # search.
    d = doc["details"]
    assert d["beam"] == 1 and d["micro_sweep"] and d["candidates"] > 1
    assert doc["timings_s"]["improve"] > 0
    assert doc["value_s"] <= d["improved_from"] <= d["raw_value"]
    # The compared method's result has the same fields as the policy's.
    assert set(cmp_) - {"policy_gap"} == set(doc) - {"compare"}


def test_plan_cli_no_improve_skips_the_structure_search(capsys, policy8):
    code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                         "--model", "gpt2-medium", "--no-improve", "--beam", "3")
    assert code == 0, err
    assert "refinement" in out and "structure search" not in out
    code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                         "--model", "gpt2-medium", "--json", "--improve", "0", "--timings")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["timings_s"]["improve"] == 0.0 and doc["details"]["improve_moves"] == 0
    assert doc["method"] == "policy-greedy" and doc["details"]["improved_from"] is None


def test_plan_cli_beam_one_is_the_single_rollout_and_zero_is_refused(capsys, policy8):
    code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                         "--model", "gpt2-medium", "--json", "--beam", "1")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["details"]["beam"] == 1 and doc["details"]["candidates"] == 1
    code, _, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                       "--model", "gpt2-medium", "--beam", "0")
    assert_one_line_error(code, err, "--beam")


def test_plan_cli_micro_sweep_is_the_default_and_refuses_a_beam(capsys, policy8):
    code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                         "--model", "gpt2-medium", "--json", "--no-improve",
                         "--no-micro-sweep")
    assert code == 0, err
    one = json.loads(out)
    assert not one["details"]["micro_sweep"] and one["details"]["candidates"] == 1
    for flags in ((), ("--micro-sweep",)):
        code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                             "--model", "gpt2-medium", "--json", "--no-improve", *flags)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["details"]["micro_sweep"] and doc["details"]["candidates"] > 1
        assert doc["value_s"] <= one["value_s"] * (1 + 1e-12)
    # A beam replaces the default sweep; asking for both is refused in one line.
    code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                         "--model", "gpt2-medium", "--json", "--no-improve", "--beam", "2")
    assert code == 0, err
    assert not json.loads(out)["details"]["micro_sweep"]
    code, _, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                       "--model", "gpt2-medium", "--beam", "2", "--micro-sweep")
    assert_one_line_error(code, err, "beam or the sweep")


def test_plan_cli_sweep_memory_sets_the_memory_options_swept(capsys, policy8):
    docs = {}
    for k in ("1", "3"):
        code, out, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                             "--model", "gpt2-medium", "--json", "--no-improve",
                             "--sweep-memory", k)
        assert code == 0, err
        docs[k] = json.loads(out)
        assert docs[k]["details"]["sweep_memory"] == int(k)
    # More memory options: more rollouts, and the policy's own option's among them.
    assert docs["3"]["details"]["candidates"] >= docs["1"]["details"]["candidates"]
    assert docs["3"]["details"]["raw_value"] <= docs["1"]["details"]["raw_value"] * (1 + 1e-12)
    for flags, text in ((("--sweep-memory", "0"), "--sweep-memory"),
                        (("--sweep-memory", "2", "--beam", "2"), "only with the sweep"),
                        (("--sweep-memory", "2", "--no-micro-sweep"), "only with the sweep")):
        code, _, err = run(capsys, "plan", "--policy", policy8, "--cluster", "cloud-mixed",
                           "--model", "gpt2-medium", *flags)
        assert_one_line_error(code, err, text)


def test_plan_cluster_larger_than_max_hosts_is_planned_in_slices(capsys, policy2, tmp_path):
    # cloud-mixed's 8 hosts are more than the policy's 2: it plans a replica slice.
    code, out, err = run(capsys, "plan", "--policy", policy2, "--cluster", "cloud-mixed",
                         "--model", "gpt2-medium", "--no-improve")
    assert code == 0, err
    assert "replica slices: 8 hosts are more than the policy observes" in out
    # Slices keep the single rollout unless the sweep is asked for.
    for flags, sweep in (((), False), (("--micro-sweep",), True)):
        code, out, err = run(capsys, "plan", "--policy", policy2, "--cluster", "cloud-mixed",
                             "--model", "gpt2-medium", "--no-improve", "--json", *flags)
        assert code == 0, err
        details = json.loads(out)["details"]
        assert details["micro_sweep"] is sweep and "slices" in details
        assert (details["candidates"] > 1) is sweep
    odd = tmp_path / "odd.yaml"
    odd.write_text("global_batch: 1\n")
    code, _, err = run(capsys, "plan", "--policy", policy2, "--cluster", "cloud-mixed",
                       "--model", "gpt2-medium", "--training", odd)
    assert_one_line_error(code, err, "cloud-mixed", "replica slices of at most 2 hosts")


@pytest.mark.parametrize("kind", ["missing", "corrupt", "not-a-policy"])
def test_plan_bad_policy_file_is_one_line(capsys, tmp_path, kind):
    path = tmp_path / "policy.zip"
    if kind == "corrupt":
        path.write_bytes(b"PK\x03\x04 this is not a zip archive")
    elif kind == "not-a-policy":
        import zipfile
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("data", "{}")
    code, _, err = run(capsys, "plan", "--policy", path, "--cluster", "amp-het-16",
                       "--model", "gpt2-medium")
    assert_one_line_error(code, err, str(path))


def test_evaluate_api_refuses_bad_methods(tiny_instances):
    suite = load_suite("tiny")
    with pytest.raises(ConfigError, match="unknown method"):
        evaluate(suite, 1, ["policy", "magic"])
    with pytest.raises(ConfigError, match="need a policy"):
        evaluate(suite, 1, ["policy", "metis"])


def test_evaluate_cli_bad_input_is_one_line(capsys, policy8, tmp_path):
    code, _, err = run(capsys, "evaluate", "--policy", policy8, "--suite", "tiny", "--n", "1",
                       "--methods", "policy,magic", "--out", tmp_path / "ev")
    assert_one_line_error(code, err, "magic")
    code, _, err = run(capsys, "evaluate", "--policy", tmp_path / "none.zip", "--suite",
                       "tiny", "--n", "1", "--out", tmp_path / "ev")
    assert_one_line_error(code, err, "none.zip")


def test_evaluate_cli_writes_consistent_csv_summary_and_plot(capsys, policy8, tmp_path,
                                                               tiny_instances):
    inst_file = save_instances(tmp_path / "tiny2.yaml", tiny_instances, suite="tiny",
                               max_hosts=4)
    out_dir = tmp_path / "ev"
    methods = ("policy", "policy-beam", "policy-greedy", "policy-raw", "exact", "metis",
               "megatron", "random")
    code, out, err = run(capsys, "evaluate", "--policy", policy8, "--suite", inst_file,
                         "--n", "2", "--time-limit", "30", "--out", out_dir,
                         "--methods", ",".join(methods), "--beam", "3")
    assert code == 0, err
    assert "median gap" in out

    with (out_dir / "results.csv").open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    assert len(rows) == 2 * len(methods)
    assert {r["method"] for r in rows} == set(methods)
    for index in ("0", "1"):
        mine = {r["method"]: r for r in rows if r["index"] == index}
        exact = mine["exact"]
        assert exact["optimal"] == "true", exact
        t_exact = float(exact["value_s"])
        for m, r in mine.items():
            value, gap = float(r["value_s"]), float(r["gap"])
            assert r["reference"] == "exact (optimal)"
            assert r["error"] == ""
            assert gap == pytest.approx(value / t_exact - 1, abs=1e-5)
            assert value >= t_exact * (1 - 1e-9), f"{m} beats a proven optimum"
            assert gap >= 0
            assert r["optimal"] == ("true" if m == "exact" else "false")
            assert int(r["gpus"]) >= 1 and int(r["hosts"]) >= 1 and r["model"]
        assert float(exact["gap"]) == 0.0
        assert 0 < float(mine["policy"]["inference_s"]) < float(mine["policy"]["wall_s"])
        # Refinement never makes the rollout's plan worse, nor the structure search the
        # refined plan, nor the beam (which keeps and refines the greedy rollout) it.
        assert float(mine["policy-greedy"]["value_s"]) <= float(mine["policy-raw"]["value_s"])
        assert float(mine["policy"]["value_s"]) <= float(mine["policy-greedy"]["value_s"])
        assert float(mine["policy-beam"]["value_s"]) <= float(mine["policy-greedy"]["value_s"])

    # results.json: every row with the result fields of 'hetpar solve --json', the
    # isolated exact search's (which answers with its value alone) included.
    doc = json.loads((out_dir / "results.json").read_text())
    keys = set(Solution("metis", "mean", None, None, math.inf, 0.0).to_dict())
    assert len(doc["rows"]) == len(rows)
    for row, csv_row in zip(doc["rows"], rows):
        assert keys <= set(row) and row["method"] == csv_row["method"]
        assert row["value_s"] == pytest.approx(float(csv_row["value_s"]), rel=1e-5)
        assert row["found"] and row["optimal"] == (row["method"] == "exact")
        assert row["plan"] is not None or row["method"] == "exact"

    summary = (out_dir / "summary.md").read_text()
    for text in ("| method |", "median gap", "p90 gap", "worst gap", "wins vs metis",
                 "wins vs megatron", "median latency", "exact proved the optimum on 2 of 2"):
        assert text in summary, text
    exact_line = next(line for line in summary.splitlines() if line.startswith("| exact |"))
    assert "| 0.0% | 0.0% | 0.0% |" in exact_line
    png = (out_dir / "gap_vs_size.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_evaluate_stops_an_exact_search_past_its_hard_limit(tiny_instances):
    suite = load_suite("tiny")
    # No search answers within 10 ms of its process starting: exact is stopped, counts as
    # "no plan", and the gaps fall back to the best plan found.
    res = evaluate(suite, 1, ["exact", "metis"], time_limit=0.01, grace_s=0.0)
    exact, metis = res.of("exact")[0], res.of("metis")[0]
    assert "did not return" in exact.error and not exact.optimal
    assert math.isinf(exact.value_s) and math.isinf(exact.gap)
    assert metis.reference == "best found (metis)" and metis.gap == 0.0
    assert "exact proved the optimum on 0 of 1" in res.summary_markdown()
