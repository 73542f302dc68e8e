"""The host-attention policy's forward pass in numpy, for planning.

A planning rollout calls the network once per decision on a batch of one to a few
observations. At that size torch spends its time dispatching ~150 small operators (about
2 ms per call on one core), not computing; the same arithmetic in numpy costs a fraction
of that. ``NumpyLogits`` copies the weights of a ``HostAttentionExtractor`` and computes
exactly its action logits (the value head is left out: planning does not need it;
``forward`` also gives the latent it reads, for ``hetpar.agents.rollouts``, whose training
rollouts call the network as often). The tests compare it with the torch module on random
and real observations; PPO's gradient steps use the torch module.

The arithmetic is rearranged where that saves whole array operations, which is what a call
costs here: each layer norm's affine part and the attention's 1/sqrt(dk) are folded into
the weights of the linear layer after them, the attention scores are laid out (key, query)
so that the softmax reduces over a non-contiguous axis (numpy vectorises that across the
contiguous one; a reduction over a contiguous axis of 16 runs as many short loops), the
pair messages are one stacked matrix product, and key masks are skipped when every host
of the batch is real (planning on one cluster).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from hetpar.envs.types import GlobalFeature as G

__all__ = ["NumpyLogits"]

_LAYER_FEATURES = 6
_LAYER_MEMO = 512  # memoised layer-count projections kept (16 KB each at 128 layers)


def _mlp(seq: Any) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """An ``nn.Sequential`` of Linear and ReLU as [(W^T, b) | None for ReLU]."""
    from torch import nn

    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for mod in seq:
        if isinstance(mod, nn.Linear):
            out.append(_linear(mod))
        elif isinstance(mod, nn.ReLU):
            out.append(None)
        else:  # pragma: no cover - the extractor is built of these two only
            raise TypeError(f"unexpected module {type(mod).__name__} in an MLP")
    return out


def _linear(mod: Any) -> tuple[np.ndarray, np.ndarray]:
    return (mod.weight.detach().cpu().numpy().astype(np.float32).T.copy(),
            mod.bias.detach().cpu().numpy().astype(np.float32).copy())


def _norm(mod: Any) -> tuple[np.ndarray, np.ndarray, float]:
    return (mod.weight.detach().cpu().numpy().astype(np.float32).copy(),
            mod.bias.detach().cpu().numpy().astype(np.float32).copy(), float(mod.eps))


def _dense(x: np.ndarray, layer: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    # One 2-D matrix product: numpy's matmul on stacked arrays loops over small products.
    w, b = layer
    return (x.reshape(-1, x.shape[-1]) @ w + b).reshape(*x.shape[:-1], w.shape[1])


def _run(layers: list[tuple[np.ndarray, np.ndarray] | None], x: np.ndarray) -> np.ndarray:
    for layer in layers:
        if layer is None:
            np.maximum(x, 0.0, out=x)
        else:
            x = _dense(x, layer)
    return x


def _standardise(x: np.ndarray, eps: float) -> np.ndarray:
    """A layer norm without its affine part (folded into the next linear layer)."""
    # Means over the last axis as products with a column of 1/d: a third cheaper than
    # np.add.reduce over a short contiguous axis (and several times cheaper than .mean).
    d = x.shape[-1]
    flat = x.reshape(-1, d)
    avg = _averager(d)
    centred = flat - flat @ avg
    var = (centred * centred) @ avg
    var += np.float32(eps)
    centred /= np.sqrt(var, out=var)
    return centred.reshape(x.shape)


@functools.cache
def _averager(d: int) -> np.ndarray:
    out = np.full((d, 1), 1.0 / d, dtype=np.float32)
    out.flags.writeable = False
    return out


def _layer_norm(x: np.ndarray, p: tuple[np.ndarray, np.ndarray, float]) -> np.ndarray:
    out = _standardise(x, p[2])
    out *= p[0]
    out += p[1]
    return out


def _fold_norm(norm: tuple[np.ndarray, np.ndarray, float],
               layer: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``layer`` applied after ``norm``'s affine part, as one linear layer:
    (x * g + c) @ W + b = x @ (g[:, None] * W) + (c @ W + b)."""
    g, c, _ = norm
    w, b = layer
    return (g[:, None] * w).astype(np.float32), (c @ w + b).astype(np.float32)


def _prepare_block(blk: Any) -> dict[str, Any]:
    heads, dk = int(blk.heads), int(blk.dk)
    norm1, norm2 = _norm(blk.norm1), _norm(blk.norm2)
    w, b = _fold_norm(norm1, _linear(blk.qkv))
    scale = np.ones(w.shape[1], dtype=np.float32)
    scale[:heads * dk] = 1.0 / math.sqrt(dk)  # the query columns come first
    ffn = _mlp(blk.ffn)
    first = ffn[0]
    assert first is not None
    return {"heads": heads, "dk": dk, "eps1": norm1[2], "eps2": norm2[2],
            "qkv": ((w * scale).astype(np.float32), (b * scale).astype(np.float32)),
            "edge_bias": _linear(blk.edge_bias), "edge_msg": _linear(blk.edge_msg),
            "out": _linear(blk.out), "ffn": [_fold_norm(norm2, first), *ffn[1:]]}


_ALL = slice(None)


def _rows(need: np.ndarray | None, start: int, stop: int) -> np.ndarray | slice | None:
    """The batch rows whose masks allow an action in [start, stop): _ALL, an index array,
    or None for no row. A head computed for part of a batch costs that part (the host and
    layer heads are a fifth of a pass; a speculative batch mixes decision kinds)."""
    if need is None:
        return _ALL
    want = need[:, start:stop].any(1)
    if want.all():
        return _ALL
    return np.flatnonzero(want) if want.any() else None


class NumpyLogits:
    """Action logits of a ``HostAttentionExtractor``, computed with numpy."""

    def __init__(self, extractor: Any) -> None:
        ex = extractor
        self.n_actions = int(ex.n_actions)
        self.max_layers = int(ex.layout.max_layers)
        self.glob = _mlp(ex.glob)
        self.host_in = _mlp(ex.host_in)
        self.glob_to_host = _linear(ex.glob_to_host)
        self.edge = _mlp(ex.edge)
        self.blocks = [_prepare_block(b) for b in ex.blocks]
        self.norm = _norm(ex.norm)
        self.pool = _mlp(ex.pool)
        self.heads = [_linear(ex.memory_head), _linear(ex.micro_head), _linear(ex.tp_head)]
        host_head = _mlp(ex.host_head)
        # Its first layer reads [h, z]: split, so that z's part is computed once per
        # observation rather than once per host.
        first = host_head[0]
        assert first is not None
        dim = first[0].shape[0] // 2
        self.host_h = first[0][:dim].copy()
        self.host_z = (first[0][dim:].copy(), first[1])
        self.host_rest = host_head[1:]
        self.layer_z = _linear(ex.layer_z)
        self.layer_k = _linear(ex.layer_k)
        self.layer_out = _mlp(ex.layer_out)
        self.ks = np.arange(1, self.max_layers + 1, dtype=np.float32)
        # The pair features are the same at every step of a planning episode: their terms
        # (edge embeddings, per-block score biases and messages) are kept for the last one.
        self._edge_key: bytes | None = None
        self._edge_terms: list[tuple[np.ndarray, np.ndarray]] = []
        # The layer-count features are a function of three globals (model layers, layers
        # left, the open stage's capacity) that recur step after step and episode after
        # episode: their projection is memoised per batch of those values.
        self._layer_cols = [int(G.MODEL_LAYERS), int(G.LAYERS_LEFT), int(G.OPEN_CAPACITY)]
        self._layer_terms: dict[bytes, np.ndarray] = {}

    def _edges(self, pairs: np.ndarray) -> tuple[list[tuple[np.ndarray, np.ndarray]], bool]:
        """Per block (score bias (B|1, heads, key, query), message terms (B|1, n, n, d)),
        and whether they are shared by the whole batch (computed once, batch axis 1)."""
        shared = bool((pairs == pairs[:1]).all())
        if shared:
            key = pairs[0].tobytes() + bytes(str(pairs.shape[1:]), "ascii")
            if key == self._edge_key:
                return self._edge_terms, True
            pairs = pairs[:1]
        edges = _run(self.edge, pairs.copy())
        # edges[b, i, j] is the pair (query i, key j): the bias goes to (b, head, j, i).
        terms = [(np.ascontiguousarray(_dense(edges, blk["edge_bias"]).transpose(0, 3, 2, 1)),
                  _dense(edges, blk["edge_msg"])) for blk in self.blocks]
        if shared:
            self._edge_key, self._edge_terms = key, terms
        return terms, shared

    def _layer_projection(self, g: np.ndarray) -> np.ndarray:
        """``layer_k`` of the layer-count features of ``g`` (B, max_layers, d)."""
        key = g[:, self._layer_cols].tobytes()
        hit = self._layer_terms.get(key)
        if hit is None:
            if len(self._layer_terms) >= _LAYER_MEMO:
                self._layer_terms.clear()
            hit = _dense(self._layer_features(g), self.layer_k)
            hit.flags.writeable = False
            self._layer_terms[key] = hit
        return hit

    def _layer_features(self, g: np.ndarray) -> np.ndarray:
        max_layers = float(self.max_layers)
        total = np.maximum(g[:, G.MODEL_LAYERS] * max_layers, 1.0)[:, None]
        left = np.maximum(g[:, G.LAYERS_LEFT][:, None] * total, 1.0)
        cap = np.maximum(g[:, G.OPEN_CAPACITY][:, None] * total, 1.0)
        k = self.ks[None, :]
        feats = [k / total, np.minimum(k / left, 4.0), np.maximum(1.0 - k / left, -3.0),
                 (np.abs(k - left) < 0.5).astype(np.float32), np.minimum(k / cap, 4.0),
                 np.broadcast_to(np.log1p(k) / math.log1p(max_layers), (g.shape[0], k.size))]
        return np.stack(feats, axis=-1).astype(np.float32)

    def __call__(self, obs: dict[str, np.ndarray], need: np.ndarray | None = None,
                 ) -> np.ndarray:
        """Logits (B, n_actions) of a batch of observations (arrays with a batch axis).

        ``need`` (the batch's action masks, (B, n_actions) booleans, or their union,
        (n_actions,)) lets the heads of the decision kinds a mask excludes be skipped for
        its observation (host choice, layer count, the three small heads); those logits
        are left at 0, for a caller that masks them."""
        return self.forward(obs, need)[0]

    def forward(self, obs: dict[str, np.ndarray], need: np.ndarray | None = None,
                ) -> tuple[np.ndarray, np.ndarray]:
        """(logits as ``__call__`` gives them, the pooled latent ``z`` (B, dim) the heads and
        the extractor's value head read)."""
        hosts = np.asarray(obs["hosts"], dtype=np.float32)
        mask = np.asarray(obs["host_mask"], dtype=np.float32)
        pairs = np.asarray(obs["pairs"], dtype=np.float32)
        g = np.asarray(obs["globals"], dtype=np.float32)
        b, max_hosts = mask.shape
        real = mask > 0.5
        any_real = real.any(0)
        n = int(np.flatnonzero(any_real).max()) + 1 if any_real.any() else 1
        real_n = real[:, :n]
        # Every host of every observation real (one cluster's planning): no masking needed.
        key_mask = None if real_n.all() else real_n | ~real_n.any(1, keepdims=True)
        realf = None if key_mask is None else real_n[..., None].astype(np.float32)
        gz = _run(self.glob, g)
        h = _run(self.host_in, hosts[:, :n].copy())
        h += _dense(gz, self.glob_to_host)[:, None, :]
        if realf is not None:
            h *= realf
        terms, shared = self._edges(pairs[:, :n, :n])
        for blk, (bias, msg) in zip(self.blocks, terms):
            h = self._block(blk, h, bias, msg, shared, key_mask)
        h = _layer_norm(h, self.norm)
        if realf is not None:
            h *= realf
            count = np.maximum(real_n.sum(1, keepdims=True), 1).astype(np.float32)
            mean = h.sum(1) / count
            mx = np.maximum(np.where(real_n[..., None], h, -1e4).max(1), -1e3)
        else:
            mean = np.add.reduce(h, axis=1) * np.float32(1.0 / n)
            mx = np.maximum(np.maximum.reduce(h, axis=1), -1e3)
        z = _run(self.pool, np.concatenate([mean, mx, gz], axis=-1))
        small = sum(w_.shape[1] for w_, _ in self.heads)
        host_at, layer_at = small, small + max_hosts
        out = np.zeros((b, self.n_actions), dtype=np.float32)
        rows = None if need is None else np.broadcast_to(need, (b, self.n_actions))
        if rows is None or rows[:, :small].any():
            out[:, :small] = np.concatenate([z @ w_ + b_ for w_, b_ in self.heads], axis=1)
        pick = _rows(rows, host_at, layer_at)
        if pick is not None:
            hp, zp = (h, z) if pick is _ALL else (h[pick], z[pick])
            hz = (hp.reshape(-1, hp.shape[-1]) @ self.host_h).reshape(hp.shape[0], n, -1)
            hz += _dense(zp, self.host_z)[:, None, :]
            host_logits = _run(self.host_rest, hz)[..., 0]
            if realf is not None:
                host_logits *= real_n if pick is _ALL else real_n[pick]
            if pick is _ALL:
                out[:, host_at:host_at + n] = host_logits
            else:
                out[pick, host_at:host_at + n] = host_logits
        pick = _rows(rows, layer_at, self.n_actions)
        if pick is not None:
            gp, zp = (g, z) if pick is _ALL else (g[pick], z[pick])
            kf = self._layer_projection(gp)
            out[pick if pick is not _ALL else slice(None), layer_at:] = _run(
                self.layer_out, kf + _dense(zp, self.layer_z)[:, None, :])[..., 0]
        return out, z

    @staticmethod
    def _block(blk: dict[str, Any], h: np.ndarray, bias: np.ndarray, edge_msg: np.ndarray,
               shared: bool, key_mask: np.ndarray | None) -> np.ndarray:
        b, n, d = h.shape
        heads, dk = blk["heads"], blk["dk"]
        qkv = _dense(_standardise(h, blk["eps1"]), blk["qkv"]).reshape(b, n, 3, heads, dk)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (B, heads, n, dk)
        scores = k @ q.transpose(0, 1, 3, 2)  # (B, heads, key, query), 1/sqrt(dk) folded in
        scores += bias
        if key_mask is not None:
            scores = np.where(key_mask[:, None, :, None], scores, -1e9)
        scores -= np.maximum.reduce(scores, axis=2, keepdims=True)
        attn = np.exp(scores, out=scores)
        attn /= np.add.reduce(attn, axis=2, keepdims=True)
        msg = (attn.transpose(0, 1, 3, 2) @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
        mean_attn = np.add.reduce(attn, axis=1)  # (B, key j, query i)
        mean_attn *= np.float32(1.0 / heads)
        if shared:
            # sum_j a[b, i, j] E[i, j, :] as one product per query host i: (i, b, j) @ (i, j, d)
            msg += (mean_attn.transpose(2, 0, 1) @ edge_msg[0]).transpose(1, 0, 2)
        else:
            msg += (mean_attn.transpose(0, 2, 1)[:, :, None, :] @ edge_msg)[:, :, 0, :]
        h = h + _dense(msg, blk["out"])
        h += _run(blk["ffn"], _standardise(h, blk["eps2"]))
        if key_mask is not None:
            h *= key_mask[..., None]
        return h
