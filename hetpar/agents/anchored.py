"""PPO kept near the policy it starts from: ``AnchoredMaskablePPO``.

Fine-tuning a behaviour clone with plain PPO made it worse (docs/agents.md): the clone's
value head was never trained on PPO's returns, so the first updates follow advantages
that are mostly the value head's error, and nothing pulls the policy back once it has
drifted. Two changes to sb3-contrib's ``MaskablePPO`` update:

* ``anchor_coef`` > 0 adds ``anchor_coef * KL(anchor || policy)`` to the loss, the
  anchor being a frozen copy of the policy PPO started from (``set_anchor``), the KL
  taken over the masked action distribution of every state in the minibatch. PPO may
  move the policy where its advantages say so, at a price that grows with the distance.
* ``anchor_coef`` = 0 with an anchor: the KL is measured and logged, once an update,
  and not optimised (``hetpar train`` anchors every run that starts from a policy, so
  ``train/kl_anchor`` tells how far PPO has moved from it).
* ``value_warmup`` > 0: the first that many updates train the value head only (the
  value layers after the shared trunk: the policy loss, entropy bonus and anchor term
  are left out, and no other parameter moves), so the advantages are measured against
  a value head fitted to the policy's own returns before the policy moves.

``overlap_envs`` (default True): with the environments in worker processes by groups
(``GroupedVecEnv``, ``RayVecEnv``), rollouts are collected by
``hetpar.agents.rollouts.collect_overlapped``, each group's forward pass overlapping the
other groups' steps; otherwise by sb3-contrib's loop.

``update_threads`` > 0 runs the update on that many torch threads (the rollouts keep the
trainer's): the environment workers are idle while it runs. The anchor is frozen and the
rollout's states do not change during an update, so its masked log-probabilities are
computed once an update, over the whole rollout, not once per minibatch and epoch.

With neither an anchor nor a warm-up the update is sb3-contrib's; with them it is
otherwise sb3-contrib's (clipped surrogate, optional value clipping,
advantage normalisation, ``target_kl`` early stop, gradient clipping), written against
its public rollout buffer and policy interface. Logged besides SB3's ``train/*``:
``train/kl_anchor`` (mean KL to the anchor over the update's minibatches) and
``train/value_warmup`` (1 while warming up).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from stable_baselines3.common.utils import explained_variance

__all__ = ["AnchoredMaskablePPO", "kl_to"]


def _masked_log_probs(policy: Any, obs: Any, masks: Any,
                      ) -> tuple[th.Tensor, th.Tensor | None, th.Tensor]:
    """(normalised log-probabilities of every action, the allowed actions (None without
    masks), the values): sb3-contrib's ``MaskableCategorical`` arithmetic (a masked logit
    set to its -1e8) without building the distribution objects, which cost as much as a
    tenth of an update."""
    latent_pi, latent_vf = policy._latents(obs, masks)
    logits = policy.action_net(latent_pi)
    allowed = None
    if masks is not None:
        allowed = th.as_tensor(masks, dtype=th.bool).reshape(logits.shape)
        logits = logits.masked_fill(~allowed, _HUGE_NEG)
    return logits - logits.logsumexp(-1, keepdim=True), allowed, policy.value_net(latent_vf)


def _masked_parts(policy: Any, obs: Any, masks: Any, actions: th.Tensor,
                  ) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
    """(normalised masked log-probabilities, the actions' log-probabilities, entropies
    (summed over the allowed actions, as sb3-contrib's), values) of a minibatch."""
    log_probs, allowed, values = _masked_log_probs(policy, obs, masks)
    log_prob = log_probs.gather(1, actions[:, None]).squeeze(1)
    p_log_p = log_probs.exp() * log_probs
    if allowed is not None:
        p_log_p = p_log_p.masked_fill(~allowed, 0.0)
    return log_probs, log_prob, -p_log_p.sum(-1), values


# sb3-contrib's value for a masked logit (MaskableCategorical).
_HUGE_NEG = -1e8


_BUFFER_ARRAYS = ("actions", "values", "log_probs", "advantages", "returns", "action_masks")


def _flatten(buffer: Any) -> None:
    """Flatten a rollout buffer to one row per (step, env), as its ``get`` does on its
    first call, without drawing the permutation ``get`` draws."""
    if buffer.generator_ready:
        return
    if isinstance(buffer.observations, dict):
        for key, obs in buffer.observations.items():
            buffer.observations[key] = buffer.swap_and_flatten(obs)
    else:
        buffer.observations = buffer.swap_and_flatten(buffer.observations)
    for name in _BUFFER_ARRAYS:
        setattr(buffer, name, buffer.swap_and_flatten(getattr(buffer, name)))
    buffer.generator_ready = True


def _minibatches(buffer: Any, batch_size: int) -> Any:
    """``(rows, samples)`` of one epoch's minibatches, the samples those of
    ``buffer.get(batch_size)`` (one ``np.random.permutation`` an epoch, so the same
    minibatches under the same seed), with the rows by which the update finds the
    anchor's cached log-probabilities."""
    n = buffer.buffer_size * buffer.n_envs
    indices = np.random.permutation(n)
    _flatten(buffer)
    for start in range(0, n, batch_size):
        rows = indices[start:start + batch_size]
        yield rows, buffer._get_samples(rows)


def _fused_adam_supported() -> bool:
    """Whether this torch has Adam's fused CPU kernel (2.4 and later): one pass over all
    parameters instead of a loop of small tensor ops (about 4 ms -> 1 ms a step)."""
    try:
        th.optim.Adam([th.zeros(1, requires_grad=True)], fused=True)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def kl_to(anchor_log_probs: th.Tensor, log_probs: th.Tensor) -> th.Tensor:
    """Per-row ``KL(anchor || policy)`` of two masked categorical distributions (masked
    actions have probability 0 under both and add nothing)."""
    p = anchor_log_probs.exp()
    # Where p is 0, the masked log-probabilities are huge negative numbers whose
    # difference is harmless once multiplied by 0, but may be inf - inf: zero them.
    diff = th.where(p > 0, anchor_log_probs - log_probs, th.zeros_like(log_probs))
    return (p * diff).sum(-1)


class AnchoredMaskablePPO(MaskablePPO):
    """``MaskablePPO`` with a KL term to a frozen anchor policy and a value warm-up."""

    # A model saved before the option existed loads with it on.
    overlap_envs = True

    def __init__(self, *args: Any, anchor_coef: float = 0.0, value_warmup: int = 0,
                 update_threads: int = 0, overlap_envs: bool = True, **kwargs: Any) -> None:
        self.overlap_envs = bool(overlap_envs)
        self.anchor_coef = float(anchor_coef)
        self.value_warmup = int(value_warmup)
        self.update_threads = int(update_threads)
        self.anchor: Any = None
        self._fused = _fused_adam_supported()
        super().__init__(*args, **kwargs)

    def set_anchor(self, policy: Any | None = None) -> None:
        """Anchor to a frozen copy of ``policy`` (default: the current policy)."""
        anchor = copy.deepcopy(policy if policy is not None else self.policy)
        anchor.set_training_mode(False)
        for p in anchor.parameters():
            p.requires_grad_(False)
        self.anchor = anchor

    def _value_parameters(self) -> list[th.nn.Parameter]:
        """The value head's own layers: ``value_net`` and the extractor's ``value`` MLP
        where the policy has one (``HostAttentionPolicy``)."""
        params = list(self.policy.value_net.parameters())
        head = getattr(self.policy.features_extractor, "value", None)
        if isinstance(head, th.nn.Module):
            params += list(head.parameters())
        return params

    def _excluded_save_params(self) -> list[str]:
        # The anchor is a copy of a policy file the run names; it is not saved twice.
        return [*super()._excluded_save_params(), "anchor"]

    def _anchor_log_probs(self) -> th.Tensor:
        """The anchor's masked log-probabilities of every state of the rollout, in the
        flattened buffer's row order (computed in minibatch-sized pieces)."""
        _flatten(self.rollout_buffer)
        n = self.rollout_buffer.buffer_size * self.rollout_buffer.n_envs
        parts = []
        with th.no_grad():
            for start in range(0, n, self.batch_size):
                rows = np.arange(start, min(n, start + self.batch_size))
                data = self.rollout_buffer._get_samples(rows)
                lp, _, _ = _masked_log_probs(self.anchor, data.observations, data.action_masks)
                parts.append(lp)
        return th.cat(parts)

    def collect_rollouts(self, env: Any, callback: Any, rollout_buffer: Any,
                         n_rollout_steps: int, use_masking: bool = True) -> bool:
        from hetpar.agents.rollouts import collect_overlapped, overlappable

        if self.overlap_envs and use_masking and overlappable(env):
            return collect_overlapped(self, env, callback, rollout_buffer, n_rollout_steps)
        return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps,
                                        use_masking)

    def train(self) -> None:
        threads = th.get_num_threads()
        if self.update_threads > 0 and self.update_threads != threads:
            # The environment workers wait during the update: its matrix products may
            # take every core, and the rollouts go back to the trainer's own count.
            th.set_num_threads(self.update_threads)
            try:
                self._update()
            finally:
                th.set_num_threads(threads)
        else:
            self._update()

    def _update(self) -> None:
        self.policy.set_training_mode(True)
        if self._fused and isinstance(self.policy.optimizer, th.optim.Adam):
            # Set on every update: loading a checkpoint's optimizer state restores the
            # options it was saved with. The arithmetic is Adam's either way.
            for group in self.policy.optimizer.param_groups:
                group["fused"], group["foreach"] = True, False
        self._update_learning_rate(self.policy.optimizer)
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        clip_range_vf = (None if self.clip_range_vf is None else
                         self.clip_range_vf(self._current_progress_remaining))  # type: ignore[operator]
        warming = self._n_updates < self.value_warmup * self.n_epochs
        anchored = self.anchor is not None and self.anchor_coef > 0 and not warming
        value_params = {id(p) for p in self._value_parameters()} if warming else set()
        entropy_losses, pg_losses, value_losses, clip_fractions, kls = [], [], [], [], []
        approx_kl_divs: list[float] = []
        measured = False
        continue_training = True
        loss = th.zeros(())
        anchor_lps = self._anchor_log_probs() if anchored else None
        for epoch in range(self.n_epochs):
            approx_kl_divs = []
            for rows, data in _minibatches(self.rollout_buffer, self.batch_size):
                actions = data.actions
                if isinstance(self.action_space, spaces.Discrete):
                    actions = actions.long().flatten()
                log_probs, log_prob, entropy, values = _masked_parts(
                    self.policy, data.observations, data.action_masks, actions)
                values = values.flatten()
                advantages = data.advantages
                if self.normalize_advantage and len(advantages) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                ratio = th.exp(log_prob - data.old_log_prob)
                surrogate = th.min(advantages * ratio,
                                   advantages * th.clamp(ratio, 1 - clip_range, 1 + clip_range))
                policy_loss = -surrogate.mean()
                pg_losses.append(policy_loss.item())
                clip_fractions.append(th.mean((th.abs(ratio - 1) > clip_range).float()).item())
                values_pred = values if clip_range_vf is None else data.old_values + th.clamp(
                    values - data.old_values, -clip_range_vf, clip_range_vf)
                value_loss = F.mse_loss(data.returns, values_pred)
                value_losses.append(value_loss.item())
                entropy_loss = -th.mean(entropy) if entropy is not None else th.mean(log_prob)
                entropy_losses.append(entropy_loss.item())
                if warming:
                    loss = self.vf_coef * value_loss
                else:
                    loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss
                # With a zero coefficient the KL is only logged: on the first minibatch
                # of the last epoch, an extra forward pass per update rather than per
                # minibatch.
                measure = anchored or (self.anchor is not None and epoch == self.n_epochs - 1
                                       and not measured)
                if measure:
                    measured = True
                    if anchor_lps is not None:
                        anchor_lp = anchor_lps[th.as_tensor(rows)]
                    else:
                        with th.no_grad():
                            anchor_lp, _, _ = _masked_log_probs(self.anchor, data.observations,
                                                                data.action_masks)
                    kl = kl_to(anchor_lp, log_probs).mean()
                    kls.append(kl.item())
                    if anchored:
                        loss = loss + self.anchor_coef * kl
                with th.no_grad():
                    log_ratio = log_prob - data.old_log_prob
                    approx_kl = th.mean((th.exp(log_ratio) - 1) - log_ratio).item()
                approx_kl_divs.append(approx_kl)
                if self.target_kl is not None and approx_kl > 1.5 * self.target_kl \
                        and not warming:
                    continue_training = False
                    break
                self.policy.optimizer.zero_grad()
                loss.backward()
                if warming:
                    # Only the value layers move (Adam skips a parameter without a grad).
                    for p in self.policy.parameters():
                        if id(p) not in value_params:
                            p.grad = None
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
            self._n_updates += 1
            if not continue_training:
                break
        explained_var = explained_variance(self.rollout_buffer.values.flatten(),
                                           self.rollout_buffer.returns.flatten())
        self.logger.record("train/entropy_loss", np.mean(entropy_losses))
        self.logger.record("train/policy_gradient_loss", np.mean(pg_losses))
        self.logger.record("train/value_loss", np.mean(value_losses))
        self.logger.record("train/approx_kl", np.mean(approx_kl_divs))
        self.logger.record("train/clip_fraction", np.mean(clip_fractions))
        self.logger.record("train/loss", loss.item())
        self.logger.record("train/explained_variance", explained_var)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if kls:
            self.logger.record("train/kl_anchor", float(np.mean(kls)))
        self.logger.record("train/value_warmup", float(warming))
