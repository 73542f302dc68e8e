"""PlanBuilder-v0 under a framework's runtime (``runtime="megatron"|"deepspeed"``): the
masks allow exactly the plans the framework runs that fit, never lead into a dead end,
and the policy plans through them."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

pytest.importorskip("gymnasium")

import hetpar  # noqa: E402
from hetpar.envs import runtime_feasibility  # noqa: E402
from hetpar.envs.env import PlanBuilderEnv, random_masked_action  # noqa: E402
from hetpar.errors import ConfigError, InfeasibleError  # noqa: E402
from hetpar.plan import Plan  # noqa: E402
from hetpar.runtime.rules import check_plan  # noqa: E402

from cli_helpers import run  # noqa: E402
from test_env import all_plans, feasible_small_instances  # noqa: E402

RUNTIMES = ("megatron", "deepspeed")


def _oracle_stats(env: PlanBuilderEnv) -> dict[str, int]:
    out = {"queries": 0, "cut_queries": 0}
    for ctx in env._cache.values():
        for oracle in ctx._rt_oracles.values():
            for k in out:
                out[k] += oracle.stats()[k]
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_runtime_masks_allow_exactly_the_runnable_plans_that_fit(seed, runtime):
    """Every plan of the space that fits and that the runtime runs is buildable; no other
    plan is (the rules of ``check_plan``, on plans of up to 6 GPUs, enumerated)."""
    (inst,) = feasible_small_instances(1, start=1000 * seed)
    try:
        env = PlanBuilderEnv(inst, bandwidth="robust", samples=2, runtime=runtime)
    except InfeasibleError:
        pytest.skip("no plan of this instance runs on the runtime")
    env.reset(seed=0)
    cm = env.context.cm
    runnable = 0
    for plan in itertools.islice(all_plans(env.context.space, cm.model.layers), 1500):
        env.reset(seed=0)
        want = cm.iteration_times(plan)[1] and not check_plan(plan, runtime)
        allowed = True
        for a in env.actions_for(plan):
            if not env.action_masks()[a]:
                allowed = False
                break
            _, _, term, _, info = env.step(a)
        assert allowed == want, (plan, check_plan(plan, runtime))
        if want:
            runnable += 1
            assert term and check_plan(info["plan"], runtime) == []
    assert runnable > 0
    assert _oracle_stats(env)["cut_queries"] == 0  # exhaustive: nothing hidden


def _random_episodes(env: PlanBuilderEnv, runtime: str, episodes: int) -> None:
    rng = np.random.default_rng(0)
    for ep in range(episodes):
        env.reset(seed=ep)
        done = False
        while not done:
            assert env.action_masks().any(), f"dead end in episode {ep}: {env.state}"
            _, r, term, trunc, info = env.step(random_masked_action(env, rng))
            done = term or trunc
        assert term and info["feasible"] and r > 0
        assert check_plan(info["plan"], runtime) == []
        hetpar.validate_plan(info["plan"], env.instance.cluster, env.instance.model,
                             env.instance.training)


@pytest.mark.parametrize("suite", ["train-mixed", "test-larger"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_random_masked_episodes_under_a_runtime_end_runnable(suite, runtime):
    """On clusters of up to 16 hosts, where the search is budgeted, no episode meets a
    dead end and every plan runs on the runtime."""
    env = PlanBuilderEnv(suite, instances=12, runtime=runtime)
    _random_episodes(env, runtime, 12)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_witnessed_answers_alone_keep_the_masks_safe(monkeypatch, runtime):
    """With no search at all, every "yes" comes from the greedy witness, which memoises
    its completion: episodes still never meet a dead end and end with runnable plans."""
    monkeypatch.setattr(runtime_feasibility, "RUNTIME_BUDGET", 0)
    monkeypatch.setattr(runtime_feasibility, "_PROBE", 0)
    try:
        env = PlanBuilderEnv("test-larger", instances=6, runtime=runtime)
    except InfeasibleError:
        pytest.skip("the witness finds no plan of some instance")
    _random_episodes(env, runtime, 12)
    stats = _oracle_stats(env)
    assert stats["queries"] > 0
    small = feasible_small_instances(6, start=7)
    for inst in small:
        try:
            env = PlanBuilderEnv(inst, runtime=runtime)
        except InfeasibleError:
            continue
        _random_episodes(env, runtime, 5)


def test_the_runtime_fixes_the_degrees_after_the_first_stage():
    env = PlanBuilderEnv("train-mixed", instances=4, runtime="megatron")
    rng = np.random.default_rng(1)
    for ep in range(6):
        env.reset(seed=ep)
        while env.phase_name() != "done":
            if env.phase_name() == "tp" and env.state.built:
                first = env.state.built[0][0]
                lay = env.layout
                tps = [1 << i for i in range(lay.max_tp_log2 + 1)
                       if env.action_masks()[lay.tp(1 << i)]]
                assert tps == [first.tp]
            env.step(random_masked_action(env, rng))


def test_runtime_errors_are_one_line():
    with pytest.raises(ConfigError, match="unknown runtime"):
        PlanBuilderEnv("train-mixed", instances=2, runtime="alpa")
    inst = feasible_small_instances(1)[0]
    sp = dataclasses.replace(inst, training_doc={**inst.training_doc,
                                                 "sequence_parallel": True})
    assert sp.training.sequence_parallel
    with pytest.raises(ConfigError, match="no sequence parallelism"):
        PlanBuilderEnv(sp, runtime="deepspeed")


# ---- the policy under a runtime -------------------------------------------------------------

@pytest.mark.parametrize("cluster", ["amp-het-16", "cloud-mixed"])
def test_the_policy_plans_under_a_runtimes_masks(cluster):
    pytest.importorskip("torch")
    from hetpar.agents import planning
    from hetpar.agents.io import load_policy
    from hetpar.agents.planner import policy_problem

    bundle = load_policy(None)
    model = "llama2-7b" if cluster == "cloud-mixed" else "gpt2-medium"
    problem = policy_problem(bundle, hetpar.load_cluster(cluster), hetpar.load_model(model),
                             hetpar.load_training())
    for runtime in RUNTIMES:
        sol = planning.plan(problem, "policy", policy=bundle, runtime=runtime)
        assert check_plan(sol.plan, runtime) == []
        assert sol.details["runtime"] == runtime
        assert "improve_skipped" in sol.details  # the structure search leaves the runtime
        raw = planning.plan(problem, "policy-raw", policy=bundle, runtime=runtime)
        assert check_plan(raw.plan, runtime) == []
        assert sol.value <= raw.value * (1 + 1e-12)  # refinement never makes it worse


def test_cli_plan_no_improve_under_a_runtime_is_the_policys_own_plan(capsys):
    pytest.importorskip("torch")
    code, out, err = run(capsys, "plan", "--cluster", "consumer-16", "--model", "gpt2-xl",
                         "--runtime", "deepspeed", "--no-improve", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rt = doc["runtime"]
    assert rt["searched"] is False
    assert rt["policy_value_s"] == pytest.approx(doc["value_s"])
    assert check_plan(Plan.from_dict(doc["plan"]), "deepspeed") == []
    assert doc["method"] == "policy-greedy"


def test_cli_plan_refuses_an_unknown_runtime_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's choices
        run(capsys, "plan", "--cluster", "amp-het-16", "--model", "gpt2-medium",
            "--runtime", "alpa")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "alpa" in err and "Traceback" not in err


def test_cli_plan_under_a_runtime_searches_from_the_policys_runnable_plan(capsys):
    pytest.importorskip("torch")
    code, out, err = run(capsys, "plan", "--cluster", "trace-demo", "--model", "gpt2-medium",
                         "--runtime", "megatron", "--time-limit", "3", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rt = doc["runtime"]
    assert rt["searched"] is True
    assert doc["value_s"] <= rt["policy_value_s"] * (1 + 1e-12)  # the policy's plan seeds it
    assert check_plan(Plan.from_dict(doc["plan"]), "megatron") == []
