"""Asking single actions of the environment (allows, masked_argmax) instead of its mask."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from hetpar.envs.env import PlanBuilderEnv  # noqa: E402
from hetpar.problem.generator import load_suite  # noqa: E402


def _twins(suite: str, count: int) -> tuple[PlanBuilderEnv, PlanBuilderEnv]:
    """Two environments over the same instances with tables of their own: one is only
    asked single actions, the other builds every mask."""
    insts = load_suite(suite).instances(count)
    return tuple(PlanBuilderEnv(insts, max_hosts=20, bandwidth="robust", samples=2)
                 for _ in range(2))


@pytest.mark.parametrize("suite,seed", [("test-iid", 0), ("test-larger", 1), ("test-geo", 2)])
def test_single_actions_and_the_masked_argmax_agree_with_the_mask(suite, seed):
    lazy, full = _twins(suite, 3)
    rng = np.random.default_rng(seed)
    phases_seen = set()
    for episode in range(3):
        lazy.reset(seed=episode, options={"instance": episode})
        full.reset(seed=episode, options={"instance": episode})
        while True:
            phases_seen.add(lazy.phase_name())
            superset = lazy.phase_actions()
            # Coarse logits, so that ties (broken by index, as argmax does) occur.
            logits = rng.integers(-3, 4, lazy.layout.n).astype(np.float32)
            choice = lazy.masked_argmax(logits)
            some = rng.choice(np.flatnonzero(superset), 4)
            answers = [lazy.allows(int(a)) for a in some]
            mask = full.action_masks()
            assert not (mask & ~superset).any()  # the phase's actions hold every allowed one
            assert choice == int(np.argmax(np.where(mask, logits, -np.inf)))
            assert answers == [bool(mask[a]) for a in some]
            assert not lazy.allows(int(np.flatnonzero(~superset)[0]))
            action = int(rng.choice(np.flatnonzero(mask)))
            _, _, done, _, _ = lazy.step(action)
            full.step(action)
            if done:
                break
    assert {"memory", "micro_batches", "tp", "blocks"} <= phases_seen


def test_a_lazy_state_computes_no_tp_mask_for_a_confident_choice():
    """In the TP phase the mask is one completion search per TP degree; the masked argmax
    of logits that favour an allowed degree asks that one degree only."""
    env, _ = _twins("test-larger", 1)
    env.reset(seed=0, options={"instance": 0})
    while env.phase_name() != "tp":
        env.step(int(np.flatnonzero(env.action_masks())[0]))
    fresh = env.snapshot()
    allowed = np.flatnonzero(env.action_masks())
    env.restore(fresh)
    env._ep.ctx.masks.clear()  # forget the mask just built
    assert env.known_masks() is None
    logits = np.zeros(env.layout.n, dtype=np.float32)
    logits[allowed[-1]] = 5.0
    asked = []
    real = env._tp_allowed

    def counted(tp):
        asked.append(tp)
        return real(tp)

    env._tp_allowed = counted
    assert env.masked_argmax(logits) == allowed[-1]
    assert len(asked) == 1 and env.known_masks() is None


def test_stepping_a_forbidden_action_is_still_refused_without_a_mask():
    env, _ = _twins("test-iid", 1)
    env.reset(seed=0, options={"instance": 0})
    forbidden = int(np.flatnonzero(~env.phase_actions())[0])
    _, _, done, _, info = env.step(forbidden)
    assert info.get("invalid_action") and not done
