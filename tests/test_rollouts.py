"""Overlapped rollout collection (``hetpar.agents.rollouts``): each worker group's forward
pass runs while the other groups step, with the policy's forward pass in numpy. The
buffer must hold each environment's own trajectory, row for row, and the numpy pass the
torch policy's distribution and values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sb3_contrib")

from hetpar.agents.anchored import AnchoredMaskablePPO, _masked_parts  # noqa: E402
from hetpar.agents.policy import HostAttentionPolicy  # noqa: E402
from hetpar.agents.rollouts import _NumpyActor, overlappable  # noqa: E402
from hetpar.agents.train import _env_kwargs, _make_env_fn, load_train_config  # noqa: E402
from hetpar.agents.vecenv import GroupedVecEnv  # noqa: E402

SMALL = dict(dim=32, heads=2, rounds=1, edge_dim=16, value_dim=16)


def _fns(n: int) -> list:
    cfg = load_train_config("tiny")
    return [_make_env_fn(cfg.suite, {**_env_kwargs(cfg), "instances": 8}, rank, 0, True)
            for rank in range(n)]


def _model(venv: GroupedVecEnv, overlap: bool = True) -> AnchoredMaskablePPO:
    model = AnchoredMaskablePPO(HostAttentionPolicy, venv, policy_kwargs=SMALL, n_steps=24,
                                batch_size=32, seed=0, device="cpu", overlap_envs=overlap)
    with torch.no_grad():  # heads away from their near-uniform start: distinct actions
        for p in model.policy.parameters():
            p.mul_(4.0)
    return model


def _collect(model: AnchoredMaskablePPO) -> None:
    _, callback = model._setup_learn(model.n_steps * model.n_envs, callback=None)
    callback.on_training_start(locals(), globals())
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)


def test_overlapped_buffer_holds_each_environments_trajectory() -> None:
    """5 environments in 2 groups (3 and 2): replaying the buffer's actions through the same
    environments, seeded alike, gives back its observations, masks, rewards and episode
    starts at every step, across episode ends."""
    venv = GroupedVecEnv(_fns(5), workers=2)
    replay = GroupedVecEnv(_fns(5), workers=2)
    try:
        model = _model(venv)
        assert overlappable(venv) and model.overlap_envs
        _collect(model)
        buf = model.rollout_buffer
        replay.seed(0)
        obs = replay.reset()
        from sb3_contrib.common.maskable.utils import get_action_masks

        masks = get_action_masks(replay)
        episodes = 0
        for t in range(model.n_steps):
            for key in obs:
                assert np.array_equal(buf.observations[key][t], obs[key]), (t, key)
            assert np.array_equal(buf.action_masks[t].astype(bool), masks.astype(bool)), t
            actions = buf.actions[t].reshape(-1).astype(np.int64)
            assert masks[np.arange(len(actions)), actions].all()  # allowed actions only
            obs, rewards, dones, _ = replay.step(actions)
            masks = get_action_masks(replay)
            assert np.allclose(buf.rewards[t], rewards), t
            if t + 1 < model.n_steps:
                assert np.array_equal(buf.episode_starts[t + 1].astype(bool), dones), t
            episodes += int(dones.sum())
        assert episodes >= 5
        # What the next rollout starts from is where the environments are.
        for key in obs:
            assert np.array_equal(model._last_obs[key], obs[key]), key
        assert np.array_equal(model._last_episode_starts, dones)
    finally:
        venv.close()
        replay.close()


def test_overlapped_and_sequential_rollouts_train_alike() -> None:
    """The same weights, the same environments: the overlapped and sb3-contrib's loop give
    rollouts of the same shape and sense (values and advantages finite, the same number
    of transitions), and a short learn() runs with both."""
    for overlap in (True, False):
        venv = GroupedVecEnv(_fns(4), workers=2)
        try:
            model = _model(venv, overlap)
            model.learn(2 * model.n_steps * model.n_envs)
            buf = model.rollout_buffer
            assert buf.full and np.isfinite(buf.advantages).all()
            assert model.num_timesteps == 2 * model.n_steps * model.n_envs
        finally:
            venv.close()


def test_numpy_actor_is_the_torch_policy() -> None:
    """The numpy forward pass samples allowed actions only, and its log-probabilities and
    values are the torch policy's for those actions."""
    venv = GroupedVecEnv(_fns(4), workers=2)
    try:
        model = _model(venv)
        policy = model.policy
        assert _NumpyActor.fits(policy)
        actor = _NumpyActor(policy)
        venv.seed(3)
        obs = venv.reset()
        from sb3_contrib.common.maskable.utils import get_action_masks

        torch.manual_seed(0)
        for _ in range(30):
            masks = get_action_masks(venv)
            actions, values, log_probs = actor(obs, masks)
            assert masks[np.arange(len(actions)), actions].all()
            tensors = {k: torch.as_tensor(v) for k, v in obs.items()}
            with torch.no_grad():
                _, want_lp, _, want_v = _masked_parts(policy, tensors, masks,
                                                      torch.as_tensor(actions))
            assert torch.allclose(log_probs, want_lp, atol=1e-4), (log_probs, want_lp)
            assert torch.allclose(values, want_v, atol=1e-4)
            obs, _, _, _ = venv.step(actions)
    finally:
        venv.close()


def test_group_steps_are_a_whole_step_and_block_other_requests() -> None:
    """Stepping the groups one at a time gives what one step of all gives; while a group
    steps, any other request is refused in one line (its reply would be misread), and
    close() collects the unanswered step."""
    a, b = GroupedVecEnv(_fns(4), workers=2), GroupedVecEnv(_fns(4), workers=2)
    try:
        for venv in (a, b):
            venv.seed(5)
            venv.reset()
        rng = np.random.default_rng(1)
        from sb3_contrib.common.maskable.utils import get_action_masks

        for _ in range(12):
            masks = get_action_masks(a)
            assert np.array_equal(masks, get_action_masks(b))
            actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
            whole = a.step(actions)
            parts = []
            for w, group in enumerate(b.groups):
                b.step_group_async(w, actions[group.start:group.stop])
            for w in range(len(b.groups)):
                parts.append(b.step_group_wait(w))
            for key in whole[0]:
                assert np.array_equal(whole[0][key],
                                      np.concatenate([p[0][key] for p in parts]))
            assert np.array_equal(whole[1], np.concatenate([p[1] for p in parts]))
            assert np.array_equal(whole[2], np.concatenate([p[2] for p in parts]))
            assert np.array_equal(get_action_masks(a), np.concatenate([p[4] for p in parts]))
        first = b.groups[0]
        b.step_group_async(0, [int(np.flatnonzero(m)[0])
                               for m in get_action_masks(b)[first.start:first.stop]])
        with pytest.raises(RuntimeError, match="stepping"):
            b.get_attr("max_hosts")
        with pytest.raises(RuntimeError, match="stepping"):
            b.step_group_async(0, [0, 0])
    finally:
        a.close()
        b.close()  # collects group 0's step
    assert b.closed
