"""Runtime profiles (hetpar.runtime): which plans Megatron-LM and DeepSpeed can run, the
exact search over those plans, launch layouts, the frameworks' rank groups and export."""

from __future__ import annotations

import json
import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetpar
from hetpar.errors import InfeasibleError, PlanError
from hetpar.plan import Plan, Replica, Stage
from hetpar.problem import Problem
from hetpar.runtime.export import export_plan, megatron_args, read_export
from hetpar.runtime.launch import (check_layout, launch_layout, megatron_groups,
                                   orthogonal_groups, plan_from_layout)
from hetpar.runtime.rules import (allowed_splits, check_plan, host_runs, runnable_by,
                                  split_ok, stage_extends, structure_ok, uniform_split)
from hetpar.solvers import solve
from hetpar.solvers.baselines import megatron as megatron_baseline
from hetpar.solvers.brute import compositions, skeletons

from cli_helpers import assert_one_line_error, run
from test_solvers import tiny_instance

CLUSTERS = ("amp-het-16", "amp-homo-16", "cloud-mixed", "consumer-16", "dgx-a100-superpod-16",
            "dgx-a100-superpod-32", "dgx-a100-superpod-4", "trace-demo", "wan-two-region")


def _plan(*stages: tuple[int, int, list[tuple[str, tuple[int, ...]]]], m: int = 4,
          rc: str = "none", zero: int = 1) -> Plan:
    return Plan(tuple(Stage(n, tp, tuple(Replica(h, g) for h, g in reps))
                      for n, tp, reps in stages), m, rc, zero)


# A pipeline whose stages share hosts at their boundaries (v100-0 -> v100-1 -> v100-2),
# with the plan's GPUs out of index order: the launch must list them as the plan does.
SHARED = _plan((6, 1, [("v100-0", (2,)), ("v100-0", (3,))]),
               (6, 1, [("v100-0", (0,)), ("v100-1", (1,))]),
               (6, 1, [("v100-1", (0,)), ("v100-2", (0,))]),
               (6, 1, [("v100-2", (1,)), ("v100-2", (2,))]), rc="selective")


# ---- rules -----------------------------------------------------------------------------------
def test_host_runs_orders_shared_hosts_at_stage_boundaries():
    assert host_runs([["a", "b"], ["c", "b"], ["c"]]) == [["a", "b"], ["b", "c"], ["c"]]
    # A host over three stages holds the middle one alone.
    assert host_runs([["a", "b"], ["b"], ["b", "c"]]) == [["a", "b"], ["b"], ["b", "c"]]
    assert host_runs([["a", "b"], ["a", "b"]]) is None  # two hosts shared at one boundary
    assert host_runs([["a"], ["b"], ["a"]]) is None  # a host comes back
    assert host_runs([["a", "b"], ["b", "c"], ["b"]]) is None  # b must end stage 1
    assert host_runs([["a", "b", "c"], ["a", "d"]]) == [["b", "c", "a"], ["a", "d"]]


def test_check_plan_names_each_rule_a_framework_needs():
    assert runnable_by(SHARED) == ("any", "megatron", "deepspeed")
    mixed_tp = _plan((12, 2, [("v100-0", (0, 1))]), (12, 1, [("v100-1", (0,)), ("v100-1", (1,))]))
    assert any("TP degrees" in w for w in check_plan(mixed_tp, "megatron"))
    mixed_dp = _plan((12, 1, [("v100-0", (0,))]), (12, 1, [("v100-1", (0,)), ("v100-1", (1,))]))
    assert any("replicas" in w for w in check_plan(mixed_dp, "megatron"))
    back = _plan((8, 1, [("v100-0", (0,))]), (8, 1, [("v100-1", (0,))]),
                 (8, 1, [("v100-0", (1,))]))
    assert any("order of the hosts" in w for w in check_plan(back, "megatron"))
    uneven = _plan((5, 1, [("v100-0", (0,))]), (7, 1, [("v100-1", (0,))]),
                   (6, 1, [("v100-2", (0,))]), (6, 1, [("v100-3", (0,))]))
    assert any("first and the last" in w for w in check_plan(uneven, "megatron"))
    assert check_plan(uneven, "any") == []
    ends = _plan((4, 1, [("v100-0", (0,))]), (7, 1, [("v100-1", (0,))]),
                 (7, 1, [("v100-2", (0,))]), (6, 1, [("v100-3", (0,))]))
    assert check_plan(ends, "megatron") == []
    assert any("uniform partition" in w for w in check_plan(ends, "deepspeed"))
    zero3 = _plan((24, 1, [("v100-0", (0,))]), zero=3)
    assert any("ZeRO stage 3" in w for w in check_plan(zero3, "megatron"))


def test_splits_follow_the_frameworks():
    assert uniform_split(10, 4) == (3, 3, 2, 2)  # partition_uniform: the first get more
    assert split_ok((3, 3, 2, 2), hetpar.runtime.get_runtime("deepspeed"))
    assert not split_ok((2, 3, 3, 2), hetpar.runtime.get_runtime("deepspeed"))
    rows = allowed_splits(12, (12, 12, 12, 12), "ends")
    assert all(len(set(r[1:-1])) == 1 and sum(r) == 12 for r in rows)
    # Every composition with equal middle counts, and nothing else.
    want = {c for c in compositions(12, 4) if c[1] == c[2]}
    assert {tuple(map(int, r)) for r in rows} == want
    capped = allowed_splits(12, (2, 12, 12, 3), "ends")
    assert all(r[0] <= 2 and r[3] <= 3 for r in capped) and len(capped)


@pytest.mark.parametrize("seed", range(40))
def test_prefix_and_structure_rules_agree_with_the_plan_rules(seed):
    """Node by node (StageChoice) and on the finished plan (Plan) the rules are one."""
    cluster, model, training, _ = tiny_instance(seed)
    space = Problem.of(cluster, model, training, samples=1).space
    rt = hetpar.runtime.get_runtime("megatron")
    for stages in skeletons(space, 4):
        ok = structure_ok(stages, rt)
        # A structure passes iff each of its prefixes passed when it was extended.
        assert ok == all(stage_extends(stages[:i], stages[i], rt) for i in range(len(stages)))
        even = space.to_plan(stages, [1] * len(stages), 1, "none", 0)
        assert ok == (check_plan(even, "megatron") == [])


# ---- rank groups -------------------------------------------------------------------------------
def test_orthogonal_groups_match_megatron_cores_documented_example():
    # megatron/core/parallel_state.py, generate_masked_orthogonal_rank_groups: sizes
    # [tp, dp, pp] = [2, 3, 4], the dp groups are [0, 2, 4], [1, 3, 5], ..., [19, 21, 23].
    dp = orthogonal_groups([2, 3, 4], [False, True, False])
    assert dp[0] == [0, 2, 4] and dp[1] == [1, 3, 5] and dp[-1] == [19, 21, 23]
    assert len(dp) == 8


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_groups_follow_the_tp_dp_pp_rank_formula(tp, dp, pp):
    groups = megatron_groups(tp, dp, pp)

    def rank(t, d, p):
        return t + tp * (d + dp * p)

    assert sorted(map(sorted, groups["tp"])) == sorted(
        sorted(rank(t, d, p) for t in range(tp)) for d in range(dp) for p in range(pp))
    assert groups["pp"] == [[rank(t, d, p) for p in range(pp)]
                            for d in range(dp) for t in range(tp)]
    for group in groups["dp"]:
        assert len({r % tp for r in group}) == 1 and len({r // (tp * dp) for r in group}) == 1


def test_launch_layout_places_every_replica_on_its_gpus():
    launch = launch_layout(SHARED)
    assert [h.host for h in launch.hosts] == ["v100-0", "v100-1", "v100-2"]
    assert launch.hosts[0].gpus == (2, 3, 0)  # stage 0's GPUs, then stage 1's
    assert check_layout(SHARED, launch) == []
    # The groups rebuilt from the launch are the plan's stages and replicas exactly.
    assert plan_from_layout(launch, [6] * 4, 4, "selective", 1) == SHARED
    with pytest.raises(PlanError, match="order of the hosts"):
        launch_layout(_plan((8, 1, [("v100-0", (0,))]), (8, 1, [("v100-1", (0,))]),
                            (8, 1, [("v100-0", (1,))])))


# ---- the exact search over a runtime's plans ------------------------------------------------------
def _best_runnable(problem: Problem, runtime: str) -> float:
    """Enumeration: every plan of the space the runtime can run, and the baselines'."""
    space, cm = problem.space, problem.cost_model
    obj = problem.objective
    best = math.inf
    for stages in skeletons(space, problem.model.layers):
        for split in compositions(problem.model.layers, len(stages)):
            for m in space.micro_batch_options([s.dp for s in stages]):
                for rc in space.recompute_modes:
                    for zero in space.zero_stages:
                        for v in space.virtual_allowed(split, m):
                            plan = space.to_plan(stages, split, m, rc, zero, v)
                            if not check_plan(plan, runtime):
                                best = min(best, obj.score(*cm.iteration_times(plan)))
    for fn in (megatron_baseline,):
        sol = fn(cm, space, obj)
        if sol.found and not check_plan(sol.plan, runtime):
            best = min(best, sol.value)
    return best


def _runtime_search_is_enumeration(problem: Problem, runtime: str):
    """Exact over ``runtime``'s plans against enumeration (``_best_runnable``): refused
    where no runnable plan exists (None), else proven, runnable and equal (the solution)."""
    want = _best_runnable(problem, runtime)
    if not math.isfinite(want):
        with pytest.raises(InfeasibleError):
            solve(problem, "exact", runtime=runtime)
        return None
    sol = solve(problem, "exact", runtime=runtime)
    assert sol.certificate.optimal
    assert check_plan(sol.plan, runtime) == []
    assert sol.value == pytest.approx(want, rel=1e-9, abs=0.0)
    return sol


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("runtime", ["megatron", "deepspeed"])
def test_exact_over_a_runtime_agrees_with_enumeration(seed, runtime):
    cluster, model, training, objective = tiny_instance(seed)
    problem = Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed)
    sol = _runtime_search_is_enumeration(problem, runtime)
    if sol is None:
        return
    assert runtime in sol.to_dict()["runtimes"]
    assert sol.inputs["runtime"] == runtime
    # The runtime's optimum is never better than the whole space's.
    assert sol.value >= solve(problem, "exact").value * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("runtime", ["megatron", "deepspeed"])
def test_a_runtime_search_over_interleaving_and_zero_stages(seed, runtime):
    """With 2 chunks per stage and ZeRO 0-3 allowed: Megatron-LM interleaves even splits
    only and runs ZeRO 0/1, DeepSpeed's pipeline engine neither interleaves nor runs ZeRO
    2/3 with a pipeline; exact over each runtime still equals enumeration."""
    cluster, model, training, objective = tiny_instance(seed)
    training = dataclasses.replace(training, virtual_stages=(1, 2), zero_stages=(0, 1, 2, 3))
    problem = Problem.of(cluster, model, training, objective=objective, samples=4, seed=seed)
    _runtime_search_is_enumeration(problem, runtime)


def test_two_workers_search_the_runtimes_plans_too():
    problem = Problem.of(hetpar.load_cluster("amp-homo-16"), hetpar.load_model("gpt2-medium"),
                         hetpar.load_training(), samples=4)
    one = solve(problem, "exact", runtime="megatron", time_limit=60)
    two = solve(problem, "exact", runtime="megatron", workers=2, time_limit=60)
    assert one.certificate.optimal and two.certificate.optimal
    assert two.value == pytest.approx(one.value, rel=1e-9)
    assert check_plan(two.plan, "megatron") == []


def test_a_baseline_plan_a_runtime_cannot_run_is_refused():
    problem = Problem.of(hetpar.load_cluster("amp-het-16"), hetpar.load_model("gpt2-medium"),
                         hetpar.load_training(), samples=4)
    metis = solve(problem, "metis")
    if check_plan(metis.plan, "megatron"):
        with pytest.raises(InfeasibleError, match="cannot run on megatron"):
            solve(problem, "metis", runtime="megatron")
    else:
        assert solve(problem, "metis", runtime="megatron").value == metis.value


# ---- export -------------------------------------------------------------------------------------
def _instance(name: str):
    return (hetpar.load_cluster(name), hetpar.load_model("gpt2-medium"),
            hetpar.load_training())


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed", "torchrun"])
def test_export_round_trips_a_pipeline_that_shares_hosts(tmp_path, fmt):
    cluster, model, training = _instance("amp-het-16")
    if fmt == "deepspeed":
        # Layers 6/6/6/6 are DeepSpeed's uniform partition; the launcher sorts each host's
        # GPUs, so the plan it runs is the renumbered one it writes as plan.json.
        files = export_plan(SHARED, fmt, tmp_path, model, training)
        back = read_export(tmp_path, fmt)
        assert back == Plan.load(tmp_path / "plan.json")
        problem = Problem.of(cluster, model, training, samples=4)
        assert problem.value(back) == problem.value(SHARED)
        assert [sorted((r.host, len(r.gpus)) for r in s.replicas) for s in back.stages] == \
            [sorted((r.host, len(r.gpus)) for r in s.replicas) for s in SHARED.stages]
    else:
        files = export_plan(SHARED, fmt, tmp_path, model, training)
        assert read_export(tmp_path, fmt) == SHARED
    names = {f.name for f in files}
    assert {"launch.sh", "ranks.json", "README.md"} <= names
    ranks = json.loads((tmp_path / "ranks.json").read_text())["ranks"]
    assert len(ranks) == 8 and [r["rank"] for r in ranks] == list(range(8))


@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_export_of_a_megatron_plan_on_every_bundled_cluster(tmp_path, cluster_name):
    """A plan the megatron runtime runs (the Megatron-style baseline's where it can run
    it, else exact's over megatron's plans) exports, checks its rank groups against the
    plan and reads back as the same plan."""
    cluster, model, training = _instance(cluster_name)
    problem = Problem.of(cluster, model, training, samples=2)
    sol = solve(problem, "megatron")
    plan = sol.plan
    if check_plan(plan, "megatron"):
        plan = solve(problem, "exact", runtime="megatron", time_limit=5).plan
    assert check_layout(plan, launch_layout(plan)) == []
    export_plan(plan, "megatron", tmp_path, model, training, cluster_name)
    assert read_export(tmp_path, "megatron") == plan
    args = (tmp_path / "megatron.args").read_text().split()
    assert args[args.index("--pipeline-model-parallel-size") + 1] == str(plan.num_stages)


def test_megatron_args_name_uneven_ends_and_options():
    model, training = hetpar.load_model("gpt2-medium"), hetpar.load_training()
    plan = _plan((4, 1, [("v100-0", (0,))]), (7, 1, [("v100-1", (0,))]),
                 (7, 1, [("v100-2", (0,))]), (6, 1, [("v100-3", (0,))]), m=8, rc="full")
    args = megatron_args(plan, model, training)
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "4"
    assert args[args.index("--decoder-last-pipeline-num-layers") + 1] == "6"
    assert args[args.index("--micro-batch-size") + 1] == "4"  # 32 / (8 x 1)
    assert "--use-distributed-optimizer" in args and "full" in args
    with pytest.raises(PlanError, match="megatron export"):
        megatron_args(_plan((12, 2, [("v100-0", (0, 1))]),
                            (12, 1, [("v100-1", (0,)), ("v100-1", (1,))])), model, training)


# ---- command line --------------------------------------------------------------------------------
def test_cli_export_writes_files_and_refuses_what_a_format_cannot_express(tmp_path, capsys):
    plan_file = tmp_path / "plan.json"
    SHARED.save(plan_file)
    out = tmp_path / "mg"
    code, stdout, _ = run(capsys, "export", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                          "--plan", plan_file, "--format", "megatron", "--out", out)
    assert code == 0 and (out / "megatron.args").exists() and "README.md" in stdout
    bad = tmp_path / "bad.json"
    _plan((12, 2, [("v100-0", (0, 1))]),
          (12, 1, [("v100-1", (0,)), ("v100-1", (1,))])).save(bad)
    code, _, err = run(capsys, "export", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       "--plan", bad, "--format", "deepspeed", "--out", tmp_path / "ds")
    assert_one_line_error(code, err, "deepspeed export", "TP degrees")
    assert not (tmp_path / "ds").exists()


def test_cli_estimate_says_which_runtimes_run_the_plan(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    _plan((12, 2, [("v100-0", (0, 1))]),
          (12, 1, [("v100-1", (0,)), ("v100-1", (1,))])).save(bad)
    code, out, err = run(capsys, "estimate", "--cluster", "amp-het-16", "--model",
                         "gpt2-medium", "--plan", bad, "--samples", "2", "--runtime", "megatron")
    assert code == 0
    assert "runs on: any" in out and "not on megatron" in out.replace("\n", " ")
    assert "warning: megatron cannot run this plan" in err
    code, out, _ = run(capsys, "estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       "--plan", bad, "--samples", "2", "--json")
    assert json.loads(out)["runtimes"] == ["any"]


def test_cli_solve_with_a_runtime_returns_a_plan_it_runs(capsys):
    code, out, _ = run(capsys, "solve", "--cluster", "trace-demo", "--model", "gpt2-medium",
                       "--samples", "2", "--runtime", "deepspeed", "--no-policy-start", "--json")
    assert code == 0
    doc = json.loads(out)
    assert "deepspeed" in doc["runtimes"] and doc["inputs"]["runtime"] == "deepspeed"
    assert doc["optimal"]
    assert check_plan(Plan.from_dict(doc["plan"]), "deepspeed") == []



def test_cli_plan_with_a_runtime_reports_its_gap_to_the_policys_plan(capsys):
    pytest.importorskip("torch")
    code, out, err = run(capsys, "plan", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                         "--runtime", "megatron", "--time-limit", "5", "--no-improve",
                         "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert check_plan(Plan.from_dict(doc["plan"]), "megatron") == []
    rt = doc["runtime"]
    assert rt["name"] == "megatron"
    assert rt["gap_to_any"] == pytest.approx(doc["value_s"] / rt["any_value_s"] - 1.0)
