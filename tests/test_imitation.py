"""Imitation pre-training: expert-plan cache, demonstrations, behaviour cloning, and the
``imitation:`` section of ``hetpar train``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")

from hetpar.agents.imitation import (ImitationConfig, behaviour_clone,  # noqa: E402
                                     demonstrations, expert_plans)
from hetpar.agents.io import load_policy  # noqa: E402
from hetpar.agents.train import load_train_config, parse_train_config, train  # noqa: E402
from hetpar.costmodel.estimate import CostModel  # noqa: E402
from hetpar.costmodel.objective import Objective  # noqa: E402
from hetpar.envs.env import PlanBuilderEnv  # noqa: E402
from hetpar.problem.generator import load_suite  # noqa: E402
from hetpar.errors import ConfigError  # noqa: E402
from hetpar.problem import Problem
from hetpar.solvers import solve  # noqa: E402

METIS = ImitationConfig(experts=("metis",), epochs=1)
MEAN = Objective.parse("mean")


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _env() -> PlanBuilderEnv:
    return PlanBuilderEnv("tiny", max_hosts=8, bandwidth="robust", samples=8, instances=32)


def _metis_plans(env: PlanBuilderEnv, n: int) -> dict:
    out = {}
    for i in range(n):
        inst = env.source.get(i)
        out[i] = solve(Problem.of(inst.cluster, inst.model, inst.training, samples=8), method="metis").plan
    return out


def test_expert_plans_are_the_best_method_and_cached(tmp_path: Path) -> None:
    cache = tmp_path / "experts.jsonl"
    cfg = ImitationConfig(experts=("metis", "megatron"))
    plans = expert_plans("tiny", range(3), objective="mean", samples=8, cfg=cfg, cache=cache)
    suite = load_suite("tiny")
    for i, plan in plans.items():
        inst = suite.instance(i)
        sols = [solve(Problem.of(inst.cluster, inst.model, inst.training, samples=8, seed=0), method=m)
                for m in ("metis", "megatron")]
        cm = CostModel(inst.cluster, inst.model, inst.training, samples=8, seed=0)
        assert plan is not None
        assert cm.evaluate(plan).value(MEAN) == pytest.approx(min(s.value for s in sols),
                                                              rel=1e-9)
    lines = cache.read_text().splitlines()
    assert len(lines) == 4 and "expert_cache" in json.loads(lines[0])
    # A second call computes nothing new; a longer range only the missing instances.
    again = expert_plans("tiny", range(3), objective="mean", samples=8, cfg=cfg, cache=cache)
    assert {i: p.to_dict() for i, p in again.items()} == {i: p.to_dict()
                                                          for i, p in plans.items()}
    assert len(cache.read_text().splitlines()) == 4
    expert_plans("tiny", range(5), objective="mean", samples=8, cfg=cfg, cache=cache)
    assert len(cache.read_text().splitlines()) == 6


def test_expert_cache_for_other_settings_or_garbage_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "experts.jsonl"
    expert_plans("tiny", range(1), objective="mean", samples=8, cfg=METIS, cache=cache)
    with pytest.raises(ConfigError, match="expert plans for another setting"):
        expert_plans("tiny", range(1), objective="p90", samples=8, cfg=METIS, cache=cache)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")  # e.g. created by a run killed at once: used as a new cache
    expert_plans("tiny", range(1), objective="mean", samples=8, cfg=METIS, cache=empty)
    assert "expert_cache" in json.loads(empty.read_text().splitlines()[0])
    junk = tmp_path / "junk.jsonl"
    junk.write_text("hello\n")
    with pytest.raises(ConfigError, match="not a hetpar expert-plan cache"):
        expert_plans("tiny", range(1), objective="mean", samples=8, cfg=METIS, cache=junk)


def test_a_line_cut_short_is_recomputed(tmp_path: Path) -> None:
    cache = tmp_path / "experts.jsonl"
    first = expert_plans("tiny", range(2), objective="mean", samples=8, cfg=METIS, cache=cache)
    lines = cache.read_text().splitlines()
    cache.write_text("\n".join([*lines[:2], lines[2][:15]]) + "\n")  # as if killed mid-write
    notes: list[str] = []
    again = expert_plans("tiny", range(2), objective="mean", samples=8, cfg=METIS, cache=cache,
                         log=notes.append)
    assert any("unreadable line skipped" in n for n in notes)
    assert again[1].to_dict() == first[1].to_dict()


def test_demonstrations_replay_the_expert_exactly() -> None:
    env = _env()
    plans = _metis_plans(env, 4)
    demos = demonstrations(env, plans)
    assert not demos.skipped and set(demos.expert_reward) == set(range(4))
    assert len(demos) > 0
    # Every recorded action is allowed by its mask, and each decision had a real choice.
    assert demos.masks[np.arange(len(demos)), demos.actions].all()
    assert (demos.masks.sum(axis=1) > 1).all()
    for i in range(4):
        rows = demos.episode == i
        assert np.allclose(demos.returns[rows], demos.expert_reward[i])
        # The return is the environment's reward for the expert's finished plan.
        env.reset(options={"instance": i})
        reward = 0.0
        for a in env.actions_for(plans[i]):
            _, reward, *_ = env.step(a)
        assert reward == pytest.approx(demos.expert_reward[i])
        assert 0 < reward <= 1
    skipped = demonstrations(env, {0: plans[0], 1: None})
    assert skipped.skipped == {1: "no expert plan"}


def test_behaviour_cloning_reproduces_the_expert_on_its_instances(tmp_path: Path) -> None:
    from sb3_contrib import MaskablePPO

    from hetpar.agents.policy import HostAttentionPolicy

    torch.manual_seed(0)
    env = _env()
    plans = _metis_plans(env, 3)
    demos = demonstrations(env, plans)
    model = MaskablePPO(HostAttentionPolicy, env, seed=0, device="cpu", n_steps=64,
                        policy_kwargs={"dim": 32, "heads": 4, "rounds": 2, "edge_dim": 16,
                                       "value_dim": 32})
    before = _accuracy(model, demos)
    cfg = ImitationConfig(experts=("metis",), epochs=100, batch_size=8, learning_rate=3e-3,
                          holdout=0.0)
    stats = behaviour_clone(model, demos, cfg, seed=0, tb_dir=tmp_path / "tb")
    assert any((tmp_path / "tb").iterdir())  # TensorBoard curves written
    # Not 100%: the expert's pick among interchangeable hosts is arbitrary (the policy is
    # equivariant and cannot tell them apart), and two instances share a state with
    # different expert picks. Everything else is learnt.
    assert before < 0.3 and stats["accuracy"] >= 0.7
    assert _accuracy(model, demos) == pytest.approx(stats["accuracy"], abs=0.05)


def _accuracy(model, demos) -> float:
    obs = {k: torch.as_tensor(v) for k, v in demos.obs.items()}
    with torch.no_grad():
        dist = model.policy.get_distribution(obs, action_masks=demos.masks)
        return float((dist.get_actions(deterministic=True).numpy() == demos.actions).mean())


def test_imitation_config_section() -> None:
    base = {"suite": "tiny", "total_timesteps": 0, "imitation": {"experts": ["metis"]}}
    cfg = parse_train_config(base, "x")
    assert cfg.imitation is not None and cfg.imitation["experts"] == ["metis"]
    assert parse_train_config(cfg.as_dict(), "x").imitation == cfg.imitation
    with pytest.raises(ConfigError, match=r"imitation.experts"):
        parse_train_config({**base, "imitation": {"experts": ["oracle"]}}, "x")
    with pytest.raises(ConfigError, match=r"imitation.epochz: unknown field"):
        parse_train_config({**base, "imitation": {"epochz": 3}}, "x")
    with pytest.raises(ConfigError, match=r"imitation.holdout"):
        parse_train_config({**base, "imitation": {"holdout": 1.5}}, "x")
    with pytest.raises(ConfigError, match=r"total_timesteps"):  # PPO-only runs need steps
        parse_train_config({"suite": "tiny", "total_timesteps": 0}, "x")
    assert load_train_config("clone").imitation is not None


def test_train_with_imitation_only(tmp_path: Path) -> None:
    data = load_train_config("tiny").as_dict()
    data.update(total_timesteps=0)
    data["eval"].update(n=1, exact_time_limit=2)
    data["imitation"] = {"experts": ["metis"], "instances": 6, "epochs": 2, "batch_size": 32}
    cfg = parse_train_config(data, "ci", name="ci")
    res = train(cfg, run_name="im", runs_dir=tmp_path, progress=False)
    run = tmp_path / "im"
    assert (run / "imitation_policy.zip").is_file() and res.final_policy is not None
    assert (run / "best_policy.zip").is_file()
    history = [json.loads(line) for line in (run / "eval_history.jsonl").read_text().splitlines()]
    assert history[0]["phase"] == "imitation"
    bundle = load_policy(run / "imitation_policy.zip")
    assert bundle.meta["imitation"]["expert_plans"] == 6
    assert any((tmp_path / "expert-cache").glob("tiny-mean-8-metis-*.jsonl"))
    assert any(m.startswith("imitation epoch 2/2") for m in res.log)


def test_expert_cache_records_the_bandwidth_seed(tmp_path: Path) -> None:
    """Expert plans are scored under DEFAULT_SEED's draws (as the training's references);
    a cache written before the seed was recorded was made with seed 0 and stays valid,
    a cache of another seed is refused."""
    cache = tmp_path / "experts.jsonl"
    expert_plans("tiny", range(1), objective="mean", samples=8, cfg=METIS, cache=cache)
    lines = cache.read_text().splitlines()
    key = json.loads(json.loads(lines[0])["expert_cache"])
    assert key["seed"] == 0
    del key["seed"]
    old = json.dumps({"expert_cache": json.dumps(key, sort_keys=True)})
    cache.write_text("\n".join([old, *lines[1:]]) + "\n")
    expert_plans("tiny", range(1), objective="mean", samples=8, cfg=METIS, cache=cache)
    with pytest.raises(ConfigError, match="expert plans for another setting"):
        expert_plans("tiny", range(1), objective="mean", samples=8, cfg=METIS, cache=cache,
                     seed=1)


def test_policy_experts_label_with_the_search_from_the_policys_plan(tmp_path: Path) -> None:
    """Expert iteration: ``policy-beam`` labels an instance with hetpar plan's pipeline from
    the policy's beam search (the same plan ``planning.plan`` gives), and the cache is
    bound to the policy file's weights: another policy's plans are refused."""
    from hetpar.agents import planning
    from hetpar.agents.io import policy_path

    cache = tmp_path / "experts.jsonl"
    cfg = ImitationConfig(experts=("policy-beam", "metis"), policy="shipped")
    plans = expert_plans("tiny", range(2), objective="mean", samples=8, cfg=cfg, cache=cache)
    suite = load_suite("tiny")
    rows = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    for i, plan in plans.items():
        inst = suite.instance(i)
        problem = Problem.from_instance(inst, objective="mean", samples=8, seed=0)
        beam = planning.plan(problem, "policy-beam", policy="shipped")
        metis = solve(problem, method="metis")
        assert plan is not None
        assert problem.value(plan) == pytest.approx(min(beam.value, metis.value), rel=1e-9)
        row = next(r for r in rows if r["index"] == i)
        assert row["method"] in ("policy-beam", "metis")
    key = json.loads(json.loads(cache.read_text().splitlines()[0])["expert_cache"])
    import hashlib
    assert key["policy_sha256"] == hashlib.sha256(policy_path("shipped").read_bytes()).hexdigest()
    with pytest.raises(ConfigError, match="expert plans for another setting"):
        expert_plans("tiny", range(2), objective="mean", samples=8,
                     cfg=ImitationConfig(experts=("policy-beam", "metis"), policy="clone"),
                     cache=cache)
    with pytest.raises(ConfigError, match="imitation.policy: cannot read the policy file"):
        expert_plans("tiny", range(1), objective="mean", samples=8,
                     cfg=ImitationConfig(experts=("policy",), policy=str(tmp_path / "none.zip")),
                     cache=tmp_path / "other.jsonl")


def test_imitation_policy_key() -> None:
    base = {"suite": "tiny", "total_timesteps": 0,
            "imitation": {"experts": ["policy-beam", "metis"], "policy": "clone"}}
    cfg = parse_train_config(base, "x")
    assert cfg.imitation is not None and cfg.imitation["policy"] == "clone"
    assert parse_train_config(cfg.as_dict(), "x").imitation == cfg.imitation
    with pytest.raises(ConfigError, match=r"imitation.policy"):
        parse_train_config({**base, "imitation": {"experts": ["policy"], "policy": 3}}, "x")
    assert load_train_config("exit").imitation["experts"] == ["policy-beam", "metis"]
