"""DAgger with a lookahead expert (``hetpar.agents.dagger``): labels at the policy's own
states, each the first action of the best plan a beam of the policy finds from there."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")

from hetpar.agents.dagger import (lookahead_demonstrations,  # noqa: E402
                                  merge_demonstrations)
from hetpar.agents.io import default_policy_path, load_policy  # noqa: E402
from hetpar.agents.planner import _beam_search, forward_for  # noqa: E402
from hetpar.envs.env import PlanBuilderEnv  # noqa: E402
from hetpar.errors import HetparError  # noqa: E402

ENV = dict(suite="test-iid", max_hosts=32, objective="mean", bandwidth="robust", samples=2,
           instances=4, max_layers=128, max_micro=16, max_tp=16)


@pytest.fixture(scope="module")
def shipped():
    if not default_policy_path().is_file():
        pytest.skip("no shipped policy in this checkout")
    return load_policy(None)


def _rollout_value(env, forward, actions_first: int) -> float:
    """The greedy rollout's plan value after taking ``actions_first`` at the current state."""
    _, _, done, _, info = env.step(actions_first)
    while not done:
        obs = env._observation()
        mask = env.action_masks()
        logits = forward([obs], [mask])[0]
        _, _, done, _, info = env.step(int(np.argmax(np.where(mask, logits, -np.inf))))
    return float(info["objective_s"])


def test_beam_firsts_name_the_root_action_of_every_finished_plan(shipped):
    env = PlanBuilderEnv(**ENV)
    forward = forward_for(shipped.model.policy)
    env.reset(options={"instance": 1})
    # Go a few decisions in, so the root is not the episode's first state, and on to a
    # state with a choice.
    for _ in range(3):
        env.step(int(np.flatnonzero(env.action_masks())[0]))
    while int(env.action_masks().sum()) == 1:
        env.step(int(np.flatnonzero(env.action_masks())[0]))
    root = env.snapshot()
    mask = env.action_masks().copy()
    firsts: list[int] = []
    with torch.inference_mode():
        plans, _, _ = _beam_search(env, forward, shipped, 4, firsts)
    assert len(firsts) == len(plans) and len(plans) >= 1
    env.restore(root)
    logits = np.where(mask, forward([env._observation()], [mask])[0], -np.inf)
    assert logits[firsts[0]] == pytest.approx(logits.max(), abs=1e-6)  # the greedy one
    for plan, first in zip(plans, firsts):
        assert mask[first]
        assert env.plan_value(plan) < float("inf")


def test_labels_are_allowed_and_never_worse_than_the_policys_own_action(shipped):
    demos, stats = lookahead_demonstrations(str(shipped.path), ENV, [0, 1, 2], width=4)
    assert len(demos) == stats.decisions > 0
    assert demos.masks[np.arange(len(demos)), demos.actions].all()
    assert (demos.returns > 0).all()
    assert set(demos.episode.tolist()) == {0, 1, 2}
    assert 0 <= stats.changed <= stats.decisions and stats.mean_gain >= 0
    # Each label leads to a plan at least as good as the policy's own continuation: the
    # greedy rollouts after the label and after the policy's action, compared at the
    # first decision of instance 0.
    env = PlanBuilderEnv(**ENV)
    forward = forward_for(shipped.model.policy)
    obs, _ = env.reset(options={"instance": 0})
    while int(env.action_masks().sum()) == 1:
        obs, *_ = env.step(int(np.flatnonzero(env.action_masks())[0]))
    root, mask = env.snapshot(), env.action_masks().copy()
    own = int(np.argmax(np.where(mask, forward([obs], [mask])[0], -np.inf)))
    own_value = _rollout_value(env, forward, own)
    env.restore(root)
    firsts: list[int] = []
    with torch.inference_mode():
        plans, _, _ = _beam_search(env, forward, shipped, 4, firsts)
    values = [env.plan_value(p) for p in plans]
    assert demos.actions[0] == firsts[int(np.argmin(values))]
    assert min(values) <= own_value * (1 + 1e-12)


def test_labelling_is_deterministic_and_merges(shipped):
    a, _ = lookahead_demonstrations(str(shipped.path), ENV, [3], width=2)
    b, _ = lookahead_demonstrations(str(shipped.path), ENV, [3], width=2)
    assert np.array_equal(a.actions, b.actions) and np.array_equal(a.masks, b.masks)
    both = merge_demonstrations([a, b])
    assert len(both) == 2 * len(a)
    assert both.obs["hosts"].shape[0] == 2 * len(a)


def test_a_beam_of_one_is_refused(shipped):
    with pytest.raises(HetparError, match="width of at least 2"):
        lookahead_demonstrations(str(shipped.path), ENV, [0], width=1)


def test_dagger_config_section() -> None:
    from hetpar.agents.train import parse_train_config
    from hetpar.errors import ConfigError

    base = {"suite": "tiny", "total_timesteps": 0, "finetune": {"init_policy": "shipped"},
            "dagger": {"width": 4, "rounds": 2}}
    cfg = parse_train_config(base, "x")
    assert cfg.dagger is not None and cfg.dagger["width"] == 4 and cfg.dagger["rounds"] == 2
    assert parse_train_config(cfg.as_dict(), "x").dagger == cfg.dagger
    with pytest.raises(ConfigError, match=r"dagger.widht: unknown field"):
        parse_train_config({**base, "dagger": {"widht": 4}}, "x")
    with pytest.raises(ConfigError, match=r"dagger.width"):
        parse_train_config({**base, "dagger": {"width": 1}}, "x")
    with pytest.raises(ConfigError, match=r"a policy to start from|start from"):
        parse_train_config({"suite": "tiny", "total_timesteps": 0, "dagger": {}}, "x")


def test_train_with_dagger_from_the_shipped_policy(tmp_path, shipped) -> None:
    import json

    from hetpar.agents.train import load_train_config, parse_train_config, train

    data = load_train_config("tiny").as_dict()
    data.update(total_timesteps=0)
    data["env"].update(max_hosts=32, max_layers=128, max_micro=16, max_tp=16)
    data["policy_kwargs"] = {"dim": 64, "heads": 4, "rounds": 2, "edge_dim": 32,
                             "value_dim": 64}
    data["eval"].update(n=1, exact_time_limit=2)
    data["finetune"] = {"init_policy": "shipped"}
    data["dagger"] = {"instances": 3, "width": 2, "epochs": 2, "batch_size": 16}
    cfg = parse_train_config(data, "ci", name="ci")
    res = train(cfg, run_name="dg", runs_dir=tmp_path, progress=False)
    run = tmp_path / "dg"
    assert (run / "dagger_policy.zip").is_file() and res.final_policy is not None
    history = [json.loads(line) for line in (run / "eval_history.jsonl").read_text().splitlines()]
    assert history[0]["phase"] == "dagger"
    meta = load_policy(run / "dagger_policy.zip").meta["dagger"]
    assert meta["rounds"] == 1 and meta["decisions_labelled"] > 0
    assert any(m.startswith("imitation epoch 2/2") for m in res.log)
    assert any("DAgger round 1/1" in m for m in res.log)
