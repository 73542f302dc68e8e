"""A ``MaskablePPO`` policy whose size does not depend on the cluster: host attention.

``HostAttentionPolicy`` reads the ``PlanBuilder-v0`` observation (``hosts``, ``host_mask``,
``pairs``, ``globals``) and produces one logit per flat action and a state value:

1. **Encoders**: the global features go through an MLP (``g``); each host's features go
   through a shared MLP, plus a projection of ``g`` (``h_i``).
2. **Host attention** (``rounds`` rounds, default 2): multi-head attention over the real
   hosts, where the score of host ``i`` attending to host ``j`` gets a per-head bias from
   an edge MLP on the pair features of ``(i, j)`` (bandwidth mean, variability, this
   episode's draw, latency), and the message adds an edge embedding of those pair
   features weighted by the attention. Padded hosts are masked out as keys and zeroed.
   Each round is a pre-norm transformer block (attention + feed-forward, residual).
3. **Pooling**: masked mean and max of the host embeddings with ``g`` through an MLP
   gives the pooled embedding ``z``.
4. **Heads**: memory, micro-batch and TP logits are linear in ``z``; **host logits are
   pointer-style**: an MLP of ``[h_i, z]`` per host, so they permute with the hosts and
   exist for any host count; **layer logits are scale-free**: for each ``k`` an MLP of
   per-``k`` features (``k/L``, ``k/layers_left``, ``1 - k/layers_left``, ``k ==
   layers_left``, ``k`` over the open stage's capacity, ``log k``) plus a projection of
   ``z``; the value comes from an MLP of ``z``.

Work is done only on the first ``n`` host rows, ``n`` the largest real host index in the
batch plus one, so a policy with ``max_hosts=32`` costs little on 4-host clusters.

Implementation in SB3 terms: the features extractor returns the logits and a value
latent side by side, the ``mlp_extractor`` splits them, ``action_net`` is the identity
and ``value_net`` a linear layer; action masking is sb3-contrib's (masked logits).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from hetpar.envs.actions import ActionLayout
from hetpar.envs.types import GLOBAL_FEATURES, HOST_FEATURES, PAIR_FEATURES, GlobalFeature

__all__ = ["HostAttentionExtractor", "HostAttentionPolicy", "layout_from_spaces",
           "layer_slots_allowed"]

_G = GlobalFeature
_LAYER_FEATURES = 6
# Below these sizes (a rollout's batch of one row per environment) gathering the rows that
# need computing costs more than the rows it skips: host rows, and batch rows for the
# layer-count head.
_PACK_MIN_ROWS = 512
_PACK_MIN_BATCH = 64


def layout_from_spaces(observation_space: gym.spaces.Dict, n_actions: int,
                       max_micro: int = 16, max_tp_log2: int = 4) -> ActionLayout:
    """The action layout of an env from its spaces (max_layers is what remains)."""
    max_hosts = int(observation_space["hosts"].shape[0])
    layout = ActionLayout(max_hosts, max_micro, max_tp_log2, 1)
    max_layers = n_actions - (layout.n - 1)
    if max_layers < 1:
        raise ValueError(f"{n_actions} actions do not fit the layout of {max_hosts} hosts")
    return ActionLayout(max_hosts, max_micro, max_tp_log2, max_layers)


def _mlp(sizes: list[int], last_act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class _Softmax(th.autograd.Function):
    """``softmax`` over the last axis. torch's CPU kernel is slow on rows as short as a
    cluster's hosts (about 1.2 ms for 256 x 4 x 7 x 7 against 0.4 ms for these few
    elementwise passes, backward included: 2.0 -> 0.8 ms)."""

    @staticmethod
    def forward(ctx: Any, x: th.Tensor) -> th.Tensor:  # type: ignore[override]
        y = (x - x.amax(-1, keepdim=True)).exp_()
        y /= y.sum(-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: th.Tensor) -> th.Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True))


class _AttentionBlock(nn.Module):
    """Pre-norm multi-head attention over hosts with pair-feature bias and messages."""

    def __init__(self, dim: int, heads: int, edge_dim: int) -> None:
        super().__init__()
        self.heads, self.dk = heads, dim // heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.edge_bias = nn.Linear(edge_dim, heads)
        self.edge_msg = nn.Linear(edge_dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))

    def forward(self, h: th.Tensor, edges: th.Tensor, key_mask: th.Tensor,
                rows: th.Tensor | None = None, pair_rows: th.Tensor | None = None,
                ) -> th.Tensor:
        # h (B, n, d); edges (B, n, n, e), or with pair_rows (P, e): the pairs of real hosts
        # only, pair_rows their flat indices into B * n * n; key_mask (B, n) bool, True =
        # real host. rows: the flat indices (into B * n) of the real hosts, or None for all.
        b, n, d = h.shape
        x = _pack(h.reshape(b * n, d), rows)
        qkv = _unpack(self.qkv(self.norm1(x)), rows, b * n)
        q, k, v = qkv.view(b, n, 3, self.heads, self.dk).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, n, dk)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.dk)
        bias = self.edge_bias(edges)
        if pair_rows is not None:
            # A pair with a padded host gets no bias: its score is masked out (a padded
            # key) or its row is dropped (a padded query), as before.
            bias = _unpack(bias, pair_rows, b * n * n).view(b, n, n, self.heads)
        scores = scores + bias.permute(0, 3, 1, 2)
        scores = scores.masked_fill(~key_mask[:, None, None, :], -1e9)
        attn = _Softmax.apply(scores)  # (B, heads, n, n)
        msg = (attn @ v).transpose(1, 2).reshape(b, n, d)
        # sum_j a_ij (W e_ij + c) = W (sum_j a_ij e_ij) + c sum_j a_ij: the edge message is
        # linear, so it is applied after the attention-weighted sum of the edge embeddings
        # (B n e) rather than to every pair (B n n e -> B n n d): the same function, a
        # fraction of the work of a training step.
        mean_attn = attn.mean(1)  # (B, n, n)
        if pair_rows is None:
            pooled = (mean_attn[..., None] * edges).sum(2)  # (B, n, e)
        else:
            # The padded pairs' weights are 0 (masked keys) or their rows dropped: the sum
            # over the real pairs only, into their query host's row.
            weights = mean_attn.reshape(-1).index_select(0, pair_rows)
            pooled = edges.new_zeros((b * n, edges.shape[-1])).index_add(
                0, pair_rows // n, weights[:, None] * edges).view(b, n, -1)
        msg = msg + nn.functional.linear(pooled, self.edge_msg.weight) + \
            mean_attn.sum(-1, keepdim=True) * self.edge_msg.bias
        x = x + self.out(_pack(msg.reshape(b * n, d), rows))
        x = x + self.ffn(self.norm2(x))
        if rows is None:
            return x.view(b, n, d) * key_mask[..., None].to(h.dtype)
        return _unpack(x, rows, b * n).view(b, n, d)


def _pack(x: th.Tensor, rows: th.Tensor | None) -> th.Tensor:
    """``x``'s ``rows`` (``x`` itself when ``rows`` is None)."""
    return x if rows is None else x.index_select(0, rows)


def _unpack(x: th.Tensor, rows: th.Tensor | None, total: int) -> th.Tensor:
    """The (total, ...) tensor whose ``rows`` are ``x`` and others 0 (``x`` itself when
    ``rows`` is None)."""
    if rows is None:
        return x
    return x.new_zeros((total, *x.shape[1:])).index_copy(0, rows, x)


class HostAttentionExtractor(BaseFeaturesExtractor):
    """Observation -> [logits of every action | value latent] (see the module docstring)."""

    def __init__(self, observation_space: gym.spaces.Dict, n_actions: int, dim: int = 64,
                 heads: int = 4, rounds: int = 2, edge_dim: int = 32, value_dim: int = 64,
                 max_micro: int = 16, max_tp_log2: int = 4) -> None:
        super().__init__(observation_space, features_dim=n_actions + value_dim)
        self.layout = layout_from_spaces(observation_space, n_actions, max_micro, max_tp_log2)
        self.n_actions, self.value_dim = n_actions, value_dim
        nh, npair, ng = len(HOST_FEATURES), len(PAIR_FEATURES), len(GLOBAL_FEATURES)
        self.glob = _mlp([ng, dim, dim])
        self.host_in = _mlp([nh, dim, dim], last_act=False)
        self.glob_to_host = nn.Linear(dim, dim)
        self.edge = _mlp([npair, edge_dim, edge_dim])
        self.blocks = nn.ModuleList(_AttentionBlock(dim, heads, edge_dim) for _ in range(rounds))
        self.norm = nn.LayerNorm(dim)
        self.pool = _mlp([3 * dim, dim, dim])
        sizes = self.layout.sizes
        self.memory_head = nn.Linear(dim, sizes[0])
        self.micro_head = nn.Linear(dim, sizes[1])
        self.tp_head = nn.Linear(dim, sizes[2])
        self.host_head = _mlp([2 * dim, dim, 1], last_act=False)
        self.layer_z = nn.Linear(dim, dim // 2)
        self.layer_k = nn.Linear(_LAYER_FEATURES, dim // 2)
        self.layer_out = nn.Sequential(nn.ReLU(), nn.Linear(dim // 2, dim // 2), nn.ReLU(),
                                       nn.Linear(dim // 2, 1))
        self.value = _mlp([dim, value_dim])
        # Per-host layers on real hosts' rows only (a switch for the tests' dense check).
        self.pack_rows = True
        self.register_buffer("ks", th.arange(1, self.layout.max_layers + 1, dtype=th.float32),
                             persistent=False)
        for head in (self.memory_head, self.micro_head, self.tp_head, self.host_head[-1],
                     self.layer_out[-1]):
            nn.init.orthogonal_(head.weight, gain=0.01)
            nn.init.zeros_(head.bias)

    def _layer_features(self, g: th.Tensor, slots: int) -> th.Tensor:
        max_layers = float(self.layout.max_layers)
        total = (g[:, _G.MODEL_LAYERS] * max_layers).clamp(min=1.0)[:, None]  # L
        left = (g[:, _G.LAYERS_LEFT:_G.LAYERS_LEFT + 1] * total).clamp(min=1.0)
        cap = (g[:, _G.OPEN_CAPACITY:_G.OPEN_CAPACITY + 1] * total).clamp(min=1.0)
        k = self.ks[None, :slots]
        feats = [k / total, (k / left).clamp(max=4.0), (1.0 - k / left).clamp(min=-3.0),
                 (th.abs(k - left) < 0.5).to(g.dtype), (k / cap).clamp(max=4.0),
                 (th.log1p(k) / math.log1p(max_layers)).expand_as(total * k)]
        return th.stack(feats, dim=-1)  # (B, slots, F)

    def forward(self, obs: dict[str, th.Tensor], layer_slots: int | None = None,
                layer_rows: th.Tensor | None = None) -> th.Tensor:
        """[logits | value latent] of a batch. With ``layer_slots``, the layer-count logits
        are computed for ``k <= layer_slots`` only and the others are 0; with
        ``layer_rows`` (bool per row), only for those rows and 0 in the others: for callers
        whose action masks forbid them (PPO's passes: ``HostAttentionPolicy``), as the
        head costs in proportion to the slots and rows it scores (a layer count is decided
        in about 3 of 10 steps)."""
        hosts, mask, pairs, g = obs["hosts"], obs["host_mask"], obs["pairs"], obs["globals"]
        b, max_hosts = mask.shape
        real = mask > 0.5
        any_real = real.any(0)
        n = int(th.nonzero(any_real).max().item()) + 1 if bool(any_real.any()) else 1
        real_n = real[:, :n]
        gz = self.glob(g)
        # The per-host layers run on the real hosts' rows only (a batch pads every
        # cluster to its largest: on train-mixed about a third of the rows are padding);
        # padded rows are 0, as the dense formula makes them.
        rows = th.nonzero(real_n.reshape(-1)).squeeze(1) \
            if self.pack_rows and b * n >= _PACK_MIN_ROWS else None
        hx = _pack(hosts[:, :n].reshape(b * n, -1), rows)
        h = _unpack(self.host_in(hx), rows, b * n).view(b, n, -1) + \
            self.glob_to_host(gz)[:, None, :]
        h = h * real_n[..., None].to(h.dtype)
        # The pair layers likewise on the pairs of two real hosts (about half the pairs of
        # a train-mixed batch).
        pair_rows = None
        if rows is not None:
            pair_rows = th.nonzero((real_n[:, :, None] & real_n[:, None, :]).reshape(-1)
                                   ).squeeze(1)
            edges = self.edge(pairs[:, :n, :n].reshape(b * n * n, -1).index_select(0, pair_rows))
        else:
            edges = self.edge(pairs[:, :n, :n])
        # A row without real hosts (never produced by the env) must not give NaNs.
        key_mask = real_n | ~real_n.any(1, keepdim=True)
        for block in self.blocks:
            h = block(h, edges, key_mask, rows, pair_rows)
        h = self.norm(h) * real_n[..., None].to(h.dtype)
        count = real_n.sum(1, keepdim=True).clamp(min=1).to(h.dtype)
        mean = h.sum(1) / count
        mx = h.masked_fill(~real_n[..., None], -1e4).amax(1).clamp(min=-1e3)
        z = self.pool(th.cat([mean, mx, gz], dim=-1))
        # The host head's first layer on [h_i, z], split: z's part once per row.
        first, rest = self.host_head[0], self.host_head[1:]
        assert isinstance(first, nn.Linear)
        dim = h.shape[-1]
        zpart = nn.functional.linear(z, first.weight[:, dim:], first.bias)
        if rows is None:
            hidden = nn.functional.linear(h, first.weight[:, :dim]) + zpart[:, None, :]
            host_logits = rest(hidden).squeeze(-1) * real_n.to(h.dtype)
        else:
            hidden = nn.functional.linear(_pack(h.reshape(b * n, dim), rows),
                                          first.weight[:, :dim]) + zpart[rows // n]
            host_logits = _unpack(rest(hidden).squeeze(-1), rows, b * n).view(b, n)
        if n < max_hosts:
            host_logits = th.cat([host_logits, host_logits.new_zeros(b, max_hosts - n)], dim=1)
        slots = self.layout.max_layers if layer_slots is None else \
            min(max(int(layer_slots), 0), self.layout.max_layers)
        if slots and layer_rows is not None and b >= _PACK_MIN_BATCH and \
                not bool(layer_rows.all()):
            lrows = th.nonzero(layer_rows).squeeze(1)
            kf = self.layer_k(self._layer_features(g[lrows], slots))  # (R, slots, d/2)
            part = self.layer_out(kf + self.layer_z(z[lrows])[:, None, :]).squeeze(-1)
            layer_logits = _unpack(nn.functional.pad(part, (0, self.layout.max_layers - slots)),
                                   lrows, b)
        elif slots:
            kf = self.layer_k(self._layer_features(g, slots))  # (B, slots, d/2)
            layer_logits = self.layer_out(kf + self.layer_z(z)[:, None, :]).squeeze(-1)
            if slots < self.layout.max_layers:
                layer_logits = th.cat([layer_logits, layer_logits.new_zeros(
                    b, self.layout.max_layers - slots)], dim=1)
        else:
            layer_logits = z.new_zeros(b, self.layout.max_layers)
        logits = th.cat([self.memory_head(z), self.micro_head(z), self.tp_head(z),
                         host_logits, layer_logits], dim=1)
        return th.cat([logits, self.value(z)], dim=1)


class _Split(nn.Module):
    """``mlp_extractor`` stand-in: splits [logits | value latent]."""

    def __init__(self, n_actions: int, value_dim: int) -> None:
        super().__init__()
        self.latent_dim_pi, self.latent_dim_vf = n_actions, value_dim

    def forward(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: th.Tensor) -> th.Tensor:
        return features[:, :self.latent_dim_pi]

    def forward_critic(self, features: th.Tensor) -> th.Tensor:
        return features[:, self.latent_dim_pi:]


class HostAttentionPolicy(MaskableActorCriticPolicy):
    """``MaskableActorCriticPolicy`` with ``HostAttentionExtractor`` producing the logits.

    ``policy_kwargs`` (in the training config): ``dim``, ``heads``, ``rounds``,
    ``edge_dim``, ``value_dim``, ``max_micro``, ``max_tp_log2`` (the env's ``max_micro``
    and ``log2(max_tp)``). Parameters do not depend on ``max_hosts``.
    """

    def __init__(self, observation_space: gym.spaces.Dict, action_space: gym.spaces.Discrete,
                 lr_schedule: Any, dim: int = 64, heads: int = 4, rounds: int = 2,
                 edge_dim: int = 32, value_dim: int = 64, max_micro: int = 16,
                 max_tp_log2: int = 4, **kwargs: Any) -> None:
        kwargs.pop("features_extractor_class", None)
        extractor_kwargs = dict(n_actions=int(action_space.n), dim=dim, heads=heads,
                                rounds=rounds, edge_dim=edge_dim, value_dim=value_dim,
                                max_micro=max_micro, max_tp_log2=max_tp_log2)
        kwargs["features_extractor_kwargs"] = extractor_kwargs
        kwargs.setdefault("ortho_init", False)
        kwargs["share_features_extractor"] = True
        kwargs["net_arch"] = []
        self._arch = dict(dim=dim, heads=heads, rounds=rounds, edge_dim=edge_dim,
                          value_dim=value_dim, max_micro=max_micro, max_tp_log2=max_tp_log2)
        super().__init__(observation_space, action_space, lr_schedule,
                         features_extractor_class=HostAttentionExtractor, **kwargs)

    def _build_mlp_extractor(self) -> None:
        ex = self.features_extractor
        assert isinstance(ex, HostAttentionExtractor)
        self.mlp_extractor = _Split(ex.n_actions, ex.value_dim)  # type: ignore[assignment]

    def _build(self, lr_schedule: Any) -> None:
        self._build_mlp_extractor()
        self.action_net = nn.Identity()
        self.value_net = nn.Linear(self.mlp_extractor.latent_dim_vf, 1)
        nn.init.orthogonal_(self.value_net.weight, gain=1.0)
        nn.init.zeros_(self.value_net.bias)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1),
                                              **self.optimizer_kwargs)

    # PPO's two passes, as sb3-contrib writes them, but the extractor is told how many
    # layer-count slots the masks can allow, so it scores no others (their logits are
    # masked out whatever they are: the distribution is the same).
    def forward(self, obs: th.Tensor, deterministic: bool = False,
                action_masks: np.ndarray | None = None,
                ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        latent_pi, latent_vf = self._latents(obs, action_masks)
        values = self.value_net(latent_vf)
        distribution = self._get_action_dist_from_latent(latent_pi)
        if action_masks is not None:
            distribution.apply_masking(action_masks)
        actions = distribution.get_actions(deterministic=deterministic)
        log_prob = distribution.log_prob(actions)
        actions = actions.reshape((-1, *self.action_space.shape))  # type: ignore[misc]
        return actions, values, log_prob

    def evaluate_actions(self, obs: th.Tensor, actions: th.Tensor,
                         action_masks: th.Tensor | np.ndarray | None = None,
                         ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        latent_pi, latent_vf = self._latents(obs, action_masks)
        distribution = self._get_action_dist_from_latent(latent_pi)
        if action_masks is not None:
            distribution.apply_masking(action_masks)
        log_prob = distribution.log_prob(actions)
        values = self.value_net(latent_vf)
        return values, log_prob, distribution.entropy()

    def _latents(self, obs: Any, action_masks: th.Tensor | np.ndarray | None,
                 ) -> tuple[th.Tensor, th.Tensor]:
        ex = self.features_extractor
        assert isinstance(ex, HostAttentionExtractor)
        slots, rows = (None, None) if action_masks is None else \
            layer_slots_allowed(action_masks, ex.layout, rows=True)
        features = ex(preprocess_obs(obs, self.observation_space,
                                     normalize_images=self.normalize_images),
                      layer_slots=slots, layer_rows=rows)
        return self.mlp_extractor(features)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.pop("features_extractor_class", None)
        data.pop("features_extractor_kwargs", None)
        data.pop("net_arch", None)
        data.pop("share_features_extractor", None)
        data.update(self._arch)
        return data

    def logits(self, obs: dict[str, np.ndarray] | dict[str, th.Tensor]) -> th.Tensor:
        """Unmasked action logits for a batch of observations (numpy or torch)."""
        tensors, _ = self.obs_to_tensor(obs)  # type: ignore[arg-type]
        with th.no_grad():
            features = self.extract_features(tensors)  # type: ignore[arg-type]
            return self.action_net(self.mlp_extractor.forward_actor(features))


def layer_slots_allowed(action_masks: th.Tensor | np.ndarray, layout: ActionLayout, *,
                        rows: bool = False) -> Any:
    """One more than the last layer-count slot that some row of ``action_masks`` allows
    (0 when none does): the layer logits a masked pass needs. With ``rows``, also a bool
    tensor of the rows that allow some layer count: ``(slots, rows)``."""
    start = layout.start("layers")
    block = action_masks.reshape(-1, layout.n)[:, start:start + layout.max_layers]
    if isinstance(block, th.Tensor):
        block = block.cpu().numpy()
    block = np.asarray(block, dtype=bool)
    cols = np.flatnonzero(block.any(axis=0))
    slots = int(cols[-1]) + 1 if cols.size else 0
    if not rows:
        return slots
    return slots, th.from_numpy(block.any(axis=1))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
