"""The command line: the bundled default works, and bad input is one line with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, run  # noqa: E402
from hetpar.cli.main import main
from hetpar.configio import bundled_dir

PLAN = str(bundled_dir() / "plans" / "amp-het-16-gpt2.json")
BASE = ["estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium"]




def test_estimate_bundled_default_prints_breakdown(capsys):
    code, out, err = run(capsys, *BASE, "--plan", PLAN, "--samples", "4")
    assert code == 0, err
    for text in ("Per stage and micro-batch", "pipeline steady state", "Memory per GPU",
                 "tokens/s", "feasible"):
        assert text in out


def test_estimate_json_is_one_object_with_the_api_fields(capsys):
    code, out, _ = run(capsys, *BASE, "--plan", PLAN, "--samples", "8", "--seed", "3",
                       "--objective", "cvar0.9", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["feasible"] is True
    assert data["iter_time_s"]["samples"] == 8
    assert data["objective"]["name"] == "cvar0.9"
    assert data["objective"]["value_s"] >= data["iter_time_s"]["mean"] - 1e-12
    assert sum(data["breakdown_s"].values()) == pytest.approx(data["iter_time_s"]["mean"])
    assert len(data["stages"]) == 8 and len(data["memory"]) == 16


def test_estimate_is_reproducible_given_the_seed(capsys):
    args = ["estimate", "--cluster", "cloud-mixed", "--model", "gpt2-medium", "--plan"]
    plan = {"version": 1, "micro_batches": 8, "stages": [
        {"layers": 12, "tp": 2, "replicas": [{"host": "a100-0", "gpus": [0, 1]},
                                             {"host": "h100-0", "gpus": [0, 1]}]},
        {"layers": 12, "tp": 1, "replicas": [{"host": "l4-0", "gpus": [0]},
                                             {"host": "l4-1", "gpus": [0]}]}]}
    path = Path(__file__).parent / "_tmp_cloud_plan.json"
    path.write_text(json.dumps(plan))
    try:
        first = run(capsys, *args, str(path), "--json", "--seed", "7")[1]
        second = run(capsys, *args, str(path), "--json", "--seed", "7")[1]
        other = run(capsys, *args, str(path), "--json", "--seed", "8")[1]
    finally:
        path.unlink()
    a, b, c = (json.loads(x)["iter_time_s"] for x in (first, second, other))
    assert a == b
    assert a["mean"] != c["mean"]  # log-normal links: another seed, other draws
    assert a["max"] > a["min"]


@pytest.mark.parametrize("argv", [[], ["--help"], ["estimate", "--help"], ["validate", "--help"],
                                  ["calibrate", "--help"], ["list", "--help"]])
def test_help_is_complete(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == (2 if not argv else 0)
    if argv:
        assert "usage: hetpar" in out


def test_list_names_bundled_configs(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    for name in ("amp-het-16", "llama3-70b", "T4-16GB", "default"):
        assert name in out


# ---- bad input: one line naming file, field and problem; exit status 2 ------------------

def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


CLUSTER_OK = """\
name: tiny
hosts:
  - {name: a, gpu: A100-SXM4-40GB, gpus: 2, nic_gbps: 100}
  - {name: b, gpu: T4, gpus: 2, nic_gbps: 50}
topology: {kind: single_switch}
"""


def tiny_plan(**changes) -> dict:
    plan = {"version": 1, "micro_batches": 4, "recompute": "none", "zero": 0, "stages": [
        {"layers": 12, "tp": 2, "replicas": [{"host": "a", "gpus": [0, 1]}]},
        {"layers": 12, "tp": 2, "replicas": [{"host": "b", "gpus": [0, 1]}]}]}
    plan.update(changes)
    return plan


def estimate(capsys, tmp_path, cluster: str = CLUSTER_OK, plan: dict | str | None = None,
             extra: tuple[str, ...] = ()) -> tuple[int, str, str]:
    cpath = write(tmp_path, "cluster.yaml", cluster)
    plan = tiny_plan() if plan is None else plan
    ppath = write(tmp_path, "plan.json", plan if isinstance(plan, str) else json.dumps(plan))
    return run(capsys, "estimate", "--cluster", cpath, "--model", "gpt2-medium", "--plan", ppath,
               "--samples", "2", *extra)


def test_tiny_instance_is_fine(capsys, tmp_path):
    code, out, err = estimate(capsys, tmp_path)
    assert code == 0, err


def test_malformed_yaml(capsys, tmp_path):
    code, _, err = estimate(capsys, tmp_path, cluster="hosts: [\n  - {name: a, gpu: T4\n")
    assert_one_line_error(code, err, "cluster.yaml", "line", "malformed YAML")


def test_unknown_gpu_type(capsys, tmp_path):
    code, _, err = estimate(capsys, tmp_path, cluster=CLUSTER_OK.replace("gpu: T4", "gpu: T5"))
    assert_one_line_error(code, err, "cluster.yaml", "hosts[1].gpu", "unknown GPU type 'T5'")


@pytest.mark.parametrize("value", ["0", "-10"])
def test_zero_or_negative_bandwidth(capsys, tmp_path, value):
    code, _, err = estimate(capsys, tmp_path,
                            cluster=CLUSTER_OK.replace("nic_gbps: 50", f"nic_gbps: {value}"))
    assert_one_line_error(code, err, "cluster.yaml", "hosts[1].nic_gbps", "must be positive")


def test_negative_link_bandwidth_model(capsys, tmp_path):
    cluster = CLUSTER_OK.replace(
        "nic_gbps: 50}", "nic_gbps: 50, uplink: {bandwidth: {kind: lognormal, mean_gbps: -5, cv: 0.2}}}")
    code, _, err = estimate(capsys, tmp_path, cluster=cluster)
    assert_one_line_error(code, err, "cluster.yaml", "mean_gbps", "must be positive")


def test_unreachable_host(capsys, tmp_path):
    cluster = """\
hosts:
  - {name: a, gpu: A100-SXM4-40GB, gpus: 2, nic_gbps: 100, switch: s1}
  - {name: b, gpu: T4, gpus: 2, nic_gbps: 50, switch: s2}
switches: [s1, s2]
"""
    code, _, err = estimate(capsys, tmp_path, cluster=cluster)
    assert_one_line_error(code, err, "cluster.yaml", "hosts[1]", "unreachable")


def test_plan_uses_a_gpu_twice(capsys, tmp_path):
    plan = tiny_plan()
    plan["stages"][1]["replicas"][0] = {"host": "a", "gpus": [1, 0]}
    code, _, err = estimate(capsys, tmp_path, plan=plan)
    assert_one_line_error(code, err, "plan.json", "stages[1].replicas[0].gpus", "already used")


def test_plan_uses_a_gpu_the_host_lacks(capsys, tmp_path):
    plan = tiny_plan()
    plan["stages"][1]["replicas"][0] = {"host": "b", "gpus": [1, 2]}
    code, _, err = estimate(capsys, tmp_path, plan=plan)
    assert_one_line_error(code, err, "plan.json", "has no GPU 2")


def test_layers_do_not_sum(capsys, tmp_path):
    plan = tiny_plan()
    plan["stages"][0]["layers"] = 11
    code, _, err = estimate(capsys, tmp_path, plan=plan)
    assert_one_line_error(code, err, "plan.json", "stages", "sum to 23", "has 24")


def test_batch_does_not_divide(capsys, tmp_path):
    code, _, err = estimate(capsys, tmp_path, plan=tiny_plan(micro_batches=5))
    assert_one_line_error(code, err, "plan.json", "micro_batches", "does not divide evenly")


def test_micro_batch_does_not_split_over_replicas(capsys, tmp_path):
    plan = tiny_plan(micro_batches=16)  # 2 sequences per micro-batch over 3 replicas
    plan["stages"][0] = {"layers": 12, "tp": 1, "replicas": [
        {"host": "a", "gpus": [0]}, {"host": "a", "gpus": [1]}, {"host": "b", "gpus": [0]}]}
    plan["stages"][1] = {"layers": 12, "tp": 1, "replicas": [{"host": "b", "gpus": [1]}]}
    code, _, err = estimate(capsys, tmp_path, plan=plan)
    assert_one_line_error(code, err, "plan.json", "stages[0].replicas", "3 replicas")


def test_malformed_plan_json(capsys, tmp_path):
    code, _, err = estimate(capsys, tmp_path, plan='{"version": 1, "stages": [')
    assert_one_line_error(code, err, "plan.json", "malformed JSON")


def test_missing_plan_file(capsys):
    code, _, err = run(capsys, *BASE, "--plan", "no/such/plan.json")
    assert_one_line_error(code, err, "no/such/plan.json", "no such file")


def test_unknown_bundled_model(capsys):
    code, _, err = run(capsys, "estimate", "--cluster", "amp-het-16", "--model", "gpt-5",
                       "--plan", PLAN)
    assert_one_line_error(code, err, "gpt-5", "no bundled model")


def test_bad_objective(capsys):
    code, _, err = run(capsys, *BASE, "--plan", PLAN, "--objective", "median-ish")
    assert_one_line_error(code, err, "objective")


def test_bf16_on_a_gpu_without_it(capsys, tmp_path):
    training = write(tmp_path, "bf16.yaml", "global_batch: 32\nprecision: bf16\n")
    code, _, err = estimate(capsys, tmp_path, extra=("--training", training))
    assert_one_line_error(code, err, "stages[1].replicas[0]", "lacks bf16")


def test_a_plan_that_does_not_fit_is_reported_not_crashed(capsys, tmp_path):
    plan = tiny_plan(micro_batches=1)  # 32 sequences at once on T4s
    code, out, err = estimate(capsys, tmp_path, plan=plan)
    assert code == 0, err
    assert "infeasible" in out and "over by" in out


def test_console_script_entry_point_exits_2_without_traceback(tmp_path):
    bad = write(tmp_path, "c.yaml", "hosts: 3\n")
    proc = subprocess.run([sys.executable, "-m", "hetpar", "estimate", "--cluster", bad,
                           "--model", "gpt2-medium", "--plan", PLAN],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "hosts" in proc.stderr and "Traceback" not in proc.stderr


def test_calibrate_cannot_write_reports_the_path(capsys, tmp_path, monkeypatch):
    import hetpar.fidelity.calibrate as cal
    from hetpar.costmodel.constants import load_constants
    monkeypatch.setattr(cal, "fit_constants", lambda: (load_constants(), {}))
    code, _, err = run(capsys, "calibrate", "--out", str(tmp_path / "missing" / "c.yaml"))
    assert_one_line_error(code, err, "missing/c.yaml", "cannot write")


# ---- hetpar solve -----------------------------------------------------------------------

def test_solve_writes_a_plan_that_estimate_accepts(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, text, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                          "--method", "metis", "--samples", "4", "--out", str(out))
    assert code == 0, err
    assert "metis: objective mean" in text and out.is_file()
    code, text, err = run(capsys, "estimate", "--cluster", "amp-het-16", "--model",
                          "gpt2-medium", "--plan", str(out), "--samples", "4", "--json")
    assert code == 0, err
    assert json.loads(text)["feasible"] is True


def test_solve_exact_with_a_time_limit_reports_bound_and_gap(capsys):
    code, text, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                          "--time-limit", "1", "--samples", "4", "--json")
    assert code == 0, err
    data = json.loads(text)
    cert = data["certificate"]
    assert cert["stopped"] == "time limit" and not cert["optimal"]
    assert cert["lower_bound_s"] <= data["value_s"] and data["gap"] >= 0
    assert data["found_by"] in ("metis", "megatron", "policy", "dive", "search")
    code, text, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                          "--time-limit", "1", "--samples", "4")
    assert code == 0, err
    assert "best plan found by the" in " ".join(text.split())


def test_solve_a_model_that_fits_nowhere(capsys, tmp_path):
    cluster = write(tmp_path, "one.yaml", "hosts: [{name: a, gpu: T4, gpus: 1, nic_gbps: 10}]\n"
                                          "topology: {kind: single_switch}\n")
    code, _, err = run(capsys, "solve", "--cluster", cluster, "--model", "llama2-70b")
    assert_one_line_error(code, err, "no feasible plan: the smallest per-GPU footprint is",
                          "the largest GPU has")


@pytest.mark.parametrize("args, needle", [(["--workers", "0"], "--workers"),
                                          (["--time-limit", "-1"], "--time-limit"),
                                          (["--objective", "p1000"], "objective")])
def test_solve_bad_options(capsys, args, needle):
    code, _, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       *args)
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize("stopped, why", [
    ("interrupted", "interrupted before any plan that fits was found"),
    ("time limit", "the time limit passed before any plan that fits was found"),
])
def test_solve_without_a_plan_says_why_in_one_line(capsys, monkeypatch, stopped, why):
    """An exact search stopped before any plan (Ctrl-C, or the limit, while the seeds
    still run on the workers) ends with one line naming the reason, exit status 2."""
    import hetpar.solvers.api as api
    from hetpar.problem.solution import Certificate, Solution

    cert = Certificate(optimal=False, lower_bound=0.0, nodes=0, leaves=0, space_size=1.0,
                       space_size_exact=False, wall_s=0.1, workers=2, stopped=stopped)
    monkeypatch.setattr(api, "solve", lambda *a, **k: Solution(
        "exact", "mean", None, None, float("inf"), 0.1, evaluations=0, certificate=cert))
    code, _, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       "--method", "exact", "--workers", "2")
    assert_one_line_error(code, err, why)


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``hetpar solve --json | head``: the closed pipe ends the command with the shell's
    SIGPIPE status and no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "hetpar", "solve", "--cluster", "amp-het-16",
                             "--model", "gpt2-medium", "--method", "metis", "--samples", "2",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command writes anything
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141
    assert b"Traceback" not in err and not err.strip()
