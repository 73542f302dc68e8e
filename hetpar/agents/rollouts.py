"""Rollout collection that overlaps the policy's forward passes with the environments' steps.

sb3-contrib's ``MaskablePPO.collect_rollouts`` alternates two waits: the trainer computes
every environment's action in one forward pass while the environment workers sit idle,
then the workers step while the trainer sits idle. With the environments in worker
processes by groups (``GroupedVecEnv``, one group per worker), ``collect_overlapped``
computes group ``g``'s next actions while the other groups are still stepping: as soon as
a group's step comes back, its next forward pass runs and its next step is sent, so on
two cores the trainer and one worker are busy at once instead of one of them.

Each environment sees what it sees under sb3-contrib's loop: its own observations, masks
and the actions the policy samples for them, step after step, and the rollout buffer
gets the same rows (step ``t`` of every environment together), the same bootstrapped
rewards at truncations, the same last values. What differs is the order in which the
policy's samples are drawn from torch's random stream (group by group instead of all
environments at once), so a run is as reproducible under its seed as before but not
the same run as sb3-contrib's loop. Callbacks see each vector step as sb3-contrib shows
it (``dones``, ``infos``, ``rewards``, ``actions``, ``values``, ``log_probs``; not
``new_obs``, which no hetpar callback reads and which would cost a copy of every
observation each step), while the first groups' next steps are already under way: a callback must
not ask the environments anything in ``on_step`` (``GroupedVecEnv`` refuses such a
request); at rollout start and end nothing is under way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import obs_as_tensor

from hetpar.agents.anchored import _HUGE_NEG

__all__ = ["collect_overlapped", "overlappable"]


def overlappable(env: Any) -> bool:
    """Whether ``env`` can step its environments a group at a time (a ``GroupedVecEnv``
    or ``RayVecEnv`` of at least two groups)."""
    from hetpar.agents.vecenv import GroupedVecEnv

    return isinstance(env, GroupedVecEnv) and env.workers >= 2




class _NumpyActor:
    """The rollout's forward pass of a ``HostAttentionPolicy`` in numpy
    (``hetpar.agents.inference.NumpyLogits`` and the value head on its latent): actions
    sampled from the masked distribution with torch's generator (``torch.multinomial``,
    as sb3-contrib's ``MaskableCategorical.sample``), their log-probabilities and the
    values, as the torch policy's ``forward`` gives them up to float rounding. At a
    group's few rows torch spends about 2 ms a call dispatching operators, numpy 0.3-0.7
    ms. Built from the weights at the start of a rollout (they change only in updates)."""

    def __init__(self, policy: Any) -> None:
        from hetpar.agents.inference import NumpyLogits

        ex = policy.features_extractor
        self.logits = NumpyLogits(ex)
        hidden, out = ex.value[0], policy.value_net
        self.value_w = hidden.weight.detach().numpy().astype(np.float32).T.copy()
        self.value_b = hidden.bias.detach().numpy().astype(np.float32).copy()
        self.out_w = out.weight.detach().numpy().astype(np.float32).T.copy()
        self.out_b = out.bias.detach().numpy().astype(np.float32).copy()

    @staticmethod
    def fits(policy: Any) -> bool:
        from torch import nn

        from hetpar.agents.policy import HostAttentionExtractor

        ex = getattr(policy, "features_extractor", None)
        return isinstance(ex, HostAttentionExtractor) and isinstance(ex.value, nn.Sequential) \
            and len(ex.value) == 2 and isinstance(ex.value[1], nn.ReLU) \
            and isinstance(getattr(policy, "action_net", None), nn.Identity)

    def __call__(self, obs: dict[str, np.ndarray], masks: np.ndarray,
                 ) -> tuple[np.ndarray, th.Tensor, th.Tensor]:
        allowed = np.asarray(masks, dtype=bool)
        logits, z = self.logits.forward(obs, allowed)
        logits = np.where(allowed, logits, np.float32(_HUGE_NEG))
        top = logits.max(1, keepdims=True)
        log_probs = logits - (top + np.log(np.exp(logits - top).sum(1, keepdims=True)))
        probs = th.from_numpy(np.exp(log_probs))
        actions = th.multinomial(probs, 1, True).squeeze(1)
        chosen = th.from_numpy(log_probs).gather(1, actions[:, None]).squeeze(1)
        values = np.maximum(z @ self.value_w + self.value_b, 0.0) @ self.out_w + self.out_b
        return actions.numpy(), th.from_numpy(values.astype(np.float32)), chosen


def _rows(obs: dict[str, np.ndarray], group: range) -> dict[str, np.ndarray]:
    return {key: value[group.start:group.stop] for key, value in obs.items()}


def collect_overlapped(model: Any, env: Any, callback: BaseCallback, rollout_buffer: Any,
                       n_rollout_steps: int) -> bool:
    """``MaskablePPO.collect_rollouts`` (with masking) for an ``overlappable`` env, each
    group's forward pass overlapping the other groups' steps (module docstring). True
    when ``n_rollout_steps`` steps were collected, False when a callback stopped it."""
    assert model._last_obs is not None, "No previous observation was provided"
    policy = model.policy
    policy.set_training_mode(False)
    rollout_buffer.reset()
    groups = env.groups
    obs = [_rows(model._last_obs, g) for g in groups]
    all_masks = np.asarray(get_action_masks(env))
    masks = [all_masks[g.start:g.stop] for g in groups]
    starts = [np.asarray(model._last_episode_starts[g.start:g.stop]) for g in groups]
    numpy_actor = _NumpyActor(policy) if _NumpyActor.fits(policy) and \
        str(model.device) == "cpu" else None
    callback.on_rollout_start()

    def act(w: int) -> tuple[Any, ...]:
        """Group ``w``'s actions on its current observations, sent to its worker; what the
        buffer keeps of the step (observations, actions, values, log-probabilities,
        masks, episode starts)."""
        if numpy_actor is not None:
            actions, values, log_probs = numpy_actor(obs[w], masks[w])
        else:
            with th.no_grad():
                actions, values, log_probs = policy(obs_as_tensor(obs[w], model.device),
                                                    action_masks=masks[w])
            actions = actions.cpu().numpy()
        env.step_group_async(w, actions)
        return obs[w], actions, values, log_probs, masks[w], starts[w]

    taken = [act(w) for w in range(len(groups))]
    dones = np.zeros(env.num_envs, dtype=bool)
    n_steps = 0
    while n_steps < n_rollout_steps:
        stepped: list[tuple[Any, ...]] = []
        for w in range(len(groups)):
            new_obs, rewards, group_dones, infos, new_masks = env.step_group_wait(w)
            _bootstrap_truncated(model, rewards, group_dones, infos)
            stepped.append((taken[w], new_obs, rewards, group_dones, infos))
            obs[w], masks[w], starts[w] = new_obs, new_masks, group_dones
            if n_steps + 1 < n_rollout_steps:
                # Group w's next forward pass, while the groups after it still step.
                taken[w] = act(w)
        record = _join(stepped)
        model.num_timesteps += env.num_envs
        dones, infos = record["dones"], record["infos"]
        callback.update_locals(record)
        if not callback.on_step():
            if n_steps + 1 < n_rollout_steps:
                _drain(env, obs, masks, starts)
            model._last_obs = {k: np.concatenate([o[k] for o in obs]) for k in obs[0]}
            model._last_episode_starts = np.concatenate(starts)
            return False
        model._update_info_buffer(infos, dones)
        n_steps += 1
        rollout_buffer.add(record["obs"], record["actions"].reshape(-1, 1), record["rewards"],
                           record["episode_starts"], record["values"], record["log_probs"],
                           action_masks=record["action_masks"])
    new_obs = {k: np.concatenate([o[k] for o in obs]) for k in obs[0]}
    model._last_obs = new_obs
    model._last_episode_starts = dones
    with th.no_grad():
        # The value of the last observations (no masks needed: no action is taken).
        values = policy.predict_values(obs_as_tensor(new_obs, model.device))
    rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
    callback.on_rollout_end()
    return True


def _bootstrap_truncated(model: Any, rewards: np.ndarray, dones: np.ndarray,
                         infos: list[dict[str, Any]]) -> None:
    """A truncated episode's last reward plus ``gamma`` times the value of the state it
    was cut at (sb3's handling of time limits, its issue 633), in place."""
    for idx, done in enumerate(dones):
        if done and infos[idx].get("terminal_observation") is not None \
                and infos[idx].get("TimeLimit.truncated", False):
            terminal_obs = model.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
            with th.no_grad():
                terminal_value = model.policy.predict_values(terminal_obs)[0]
            rewards[idx] += model.gamma * terminal_value


def _join(stepped: list[tuple[Any, ...]]) -> dict[str, Any]:
    """One vector step of every group, in environment order, under the names
    sb3-contrib's loop gives callbacks."""
    taken = [s[0] for s in stepped]
    return {
        "obs": {k: np.concatenate([t[0][k] for t in taken]) for k in taken[0][0]},
        "actions": np.concatenate([t[1] for t in taken]),
        "values": th.cat([t[2] for t in taken]),
        "log_probs": th.cat([t[3] for t in taken]),
        "action_masks": np.concatenate([t[4] for t in taken]),
        "episode_starts": np.concatenate([t[5] for t in taken]),
        "rewards": np.concatenate([s[2] for s in stepped]),
        "dones": np.concatenate([s[3] for s in stepped]),
        "infos": [info for s in stepped for info in s[4]],
    }


def _drain(env: Any, obs: list[Any], masks: list[Any], starts: list[Any]) -> None:
    """Collect the steps already sent when a callback stops the rollout, so the workers
    and ``model._last_obs`` agree (those transitions are not trained on)."""
    for w in range(len(obs)):
        new_obs, _, group_dones, _, new_masks = env.step_group_wait(w)
        obs[w], masks[w], starts[w] = new_obs, new_masks, group_dones
