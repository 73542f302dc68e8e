"""``GroupedVecEnv``: several training environments per worker process, masks sent with
each step; the same environments, episodes and masks as SB3's ``SubprocVecEnv``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")

from sb3_contrib.common.maskable.utils import get_action_masks  # noqa: E402
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import SubprocVecEnv  # noqa: E402

from hetpar.agents.train import _env_kwargs, _make_env_fn, load_train_config  # noqa: E402
from hetpar.agents.vecenv import GroupedVecEnv, default_workers  # noqa: E402


def _fns(n: int) -> list:
    cfg = load_train_config("tiny")
    return [_make_env_fn(cfg.suite, {**_env_kwargs(cfg), "instances": 8}, rank, 0, True)
            for rank in range(n)]


def assert_steps_alike(a, b, steps: int, min_episodes: int) -> None:  # noqa: ANN001
    """Two vectorised environments of the same factories, seeded alike and given the same
    actions: equal observations, rewards, dones, infos and masks, across episode ends
    (auto-reset)."""
    for venv in (a, b):
        venv.seed(11)
    obs = [a.reset(), b.reset()]
    rng = np.random.default_rng(0)
    episodes = 0
    for _ in range(steps):
        masks = [get_action_masks(a), get_action_masks(b)]
        assert np.array_equal(masks[0], masks[1])
        for key in obs[1]:
            assert np.array_equal(obs[0][key], obs[1][key]), key
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks[0]])
        (o_a, r_a, d_a, i_a), (o_b, r_b, d_b, i_b) = a.step(actions), b.step(actions)
        assert np.array_equal(r_a, r_b) and r_a.dtype == r_b.dtype
        assert np.array_equal(d_a, d_b)
        for x, y in zip(i_a, i_b):
            assert x.keys() == y.keys()
            if "terminal_observation" in x:
                for key in x["terminal_observation"]:
                    assert np.array_equal(x["terminal_observation"][key],
                                          y["terminal_observation"][key])
        assert list(a.reset_infos) == list(b.reset_infos)
        episodes += int(d_a.sum())
        obs = [o_a, o_b]
    assert episodes >= min_episodes


def test_grouped_environments_step_as_subprocess_ones() -> None:
    """5 environments in 2 workers (groups of 3 and 2) and SubprocVecEnv."""
    fns = _fns(5)
    grouped, plain = GroupedVecEnv(fns, workers=2), SubprocVecEnv(fns)
    try:
        assert grouped.workers == 2 and grouped.num_envs == 5
        assert_steps_alike(grouped, plain, 120, 10)
    finally:
        grouped.close()
        plain.close()


def test_grouped_environments_answer_by_index() -> None:
    fns = _fns(3)
    venv = GroupedVecEnv(fns, workers=2)
    try:
        venv.seed(0)
        venv.reset()
        assert venv.has_attr("action_masks") and not venv.has_attr("no_such_attribute")
        names = venv.env_method("phase_name")
        assert names == ["memory"] * 3
        assert venv.get_attr("max_hosts", indices=[2, 0]) == [8, 8]
        venv.set_attr("invalid_action_reward", -2.0, indices=[1])
        assert venv.get_attr("invalid_action_reward") == [-1.0, -2.0, -1.0]
        assert venv.env_is_wrapped(Monitor) == [True] * 3
        # Masks asked after another call come from the workers, and equal the sent ones.
        sent = get_action_masks(venv)
        venv.env_method("phase_name", indices=[1])
        assert np.array_equal(get_action_masks(venv), sent)
        assert np.array_equal(np.stack(venv.env_method("action_masks", indices=[2])), sent[2:])
    finally:
        venv.close()
    assert 1 <= default_workers(64) <= 64 and default_workers(1) == 1


def test_default_worker_count_starts() -> None:
    """``workers=None`` (what ``hetpar train`` passes): one process per core."""
    venv = GroupedVecEnv(_fns(3))
    try:
        assert venv.workers == default_workers(3)
        venv.seed(0)
        assert venv.reset()["hosts"].shape[0] == 3
    finally:
        venv.close()
