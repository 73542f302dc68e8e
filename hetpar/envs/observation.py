"""Observation of ``PlanBuilder-v0``: fixed-size padded arrays, no meaning in host order.

The columns are named in ``types.py`` (``HostFeature``, ``PairFeature``, ``GlobalFeature``),
with their scales; this module computes the ones that stay fixed within an episode and the
environment the rest.

Every feature is scaled to about [0, 1] (quantities spanning decades on a log scale), so
one policy reads clusters, models and networks of any size alike. Host ``i``'s row and
the ``i``-th row and column of the bandwidth tensor always describe the same host, so
permuting the hosts of an instance permutes the observation the same way.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from hetpar.envs.context import InstanceContext, log_scale
from hetpar.envs.types import (GLOBAL_FEATURES, HOST_FEATURES, PAIR_FEATURES, GlobalFeature,
                               HostFeature, PairFeature)

__all__ = ["HOST_FEATURES", "PAIR_FEATURES", "GLOBAL_FEATURES", "observation_space",
           "static_host_features", "static_globals", "pair_features"]

H, P, G = HostFeature, PairFeature, GlobalFeature


def observation_space(max_hosts: int) -> spaces.Dict:
    def box(*shape: int) -> spaces.Box:
        return spaces.Box(0.0, 1.0, shape=shape, dtype=np.float32)

    return spaces.Dict({
        "hosts": box(max_hosts, len(HOST_FEATURES)),
        "host_mask": box(max_hosts),
        "pairs": box(max_hosts, max_hosts, len(PAIR_FEATURES)),
        "globals": box(len(GLOBAL_FEATURES)),
    })


def static_host_features(ctx: InstanceContext, max_hosts: int) -> np.ndarray:
    out = np.zeros((max_hosts, len(HOST_FEATURES)), dtype=np.float32)
    for i, h in enumerate(ctx.cluster.hosts):
        perf = ctx.cm.host_perf(i)
        peak = h.gpu.peak_flops(ctx.instance.training.precision) if perf else 0.0
        out[i, H.PEAK_TFLOPS] = log_scale(peak / 1e12 + 1e-9, 1.0, 4000.0) if perf else 0.0
        out[i, H.EFFECTIVE_TFLOPS] = log_scale(perf.flops / 1e12, 1.0, 4000.0) if perf else 0.0
        out[i, H.USABLE_MEMORY] = (log_scale(perf.usable_bytes / 2**30, 1.0, 512.0) if perf
                                   else 0.0)
        out[i, H.HBM_BANDWIDTH] = log_scale(h.gpu.hbm_GBps, 100.0, 20000.0)
        out[i, H.GPUS] = min(h.num_gpus / 16.0, 1.0)
        out[i, H.SCALEUP_BANDWIDTH] = log_scale(h.intra_GBps, 1.0, 2000.0)
        out[i, H.NIC_BANDWIDTH] = log_scale(h.nic_gbps, 0.1, 6400.0)
        out[i, H.CAN_TRAIN] = 1.0 if perf else 0.0
    return out


def static_globals(ctx: InstanceContext, max_hosts: int, max_layers: int,
                   robust: bool) -> np.ndarray:
    """The global features that do not change within an episode (model, cluster)."""
    g = np.zeros(len(GLOBAL_FEATURES), dtype=np.float32)
    model, training = ctx.cm.model, ctx.instance.training
    g[G.MODEL_PARAMS] = log_scale(model.total_params, 1e7, 1e13)
    g[G.MODEL_LAYERS] = min(model.layers / max_layers, 1.0)
    g[G.MODEL_HIDDEN] = log_scale(model.hidden, 64.0, 65536.0)
    g[G.SEQ_LEN] = log_scale(ctx.cm.seq_len, 64.0, 131072.0)
    g[G.GLOBAL_BATCH] = log_scale(training.global_batch, 1.0, 65536.0)
    g[G.ROBUST_MODE] = float(robust)
    g[G.CLUSTER_GPUS] = log_scale(ctx.cluster.num_gpus, 1.0, 4096.0)
    g[G.CLUSTER_HOSTS] = len(ctx.cluster.hosts) / max_hosts
    g[G.IDEAL_TIME] = log_scale(ctx.ideal_s, 1e-4, 1e4)
    g[G.NETWORK_CV] = min(max((link.bandwidth.cv() for link in ctx.cluster.links),
                              default=0.0), 1.0)
    return g


def _log_scale(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    v = (np.log10(np.maximum(x, 1e-12)) - np.log10(lo)) / (np.log10(hi) - np.log10(lo))
    return np.clip(v, 0.0, 1.0)


def pair_features(ctx: InstanceContext, max_hosts: int, draw: np.ndarray | None,
                  static: np.ndarray | None = None, routes: np.ndarray | None = None,
                  ) -> np.ndarray:
    """Route features between hosts: bottleneck mean, its variability, the bandwidth of
    this episode's draw (the mean in robust mode) and the latency. The diagonal describes
    the host's own scale-up fabric. With ``static`` (the features without a draw) and
    ``routes`` (``Cluster.route_link_indices``) only the draw channel is recomputed: once
    per episode."""
    cluster = ctx.cluster
    n = len(cluster.hosts)
    routes = cluster.route_link_indices() if routes is None else routes
    if static is None:
        means = np.array([link.bandwidth.mean() for link in cluster.links] + [np.inf])
        cvs = np.array([link.bandwidth.cv() for link in cluster.links] + [0.0])
        out = np.zeros((max_hosts, max_hosts, len(PAIR_FEATURES)), dtype=np.float32)
        if n:
            # The bottleneck link of each route: its mean and its variability.
            k = np.take_along_axis(routes, np.argmin(means[routes], axis=2)[..., None],
                                   axis=2)[..., 0]
            out[:n, :n, P.BANDWIDTH_MEAN] = _log_scale(means[k], 0.1, 1e5)
            out[:n, :n, P.BANDWIDTH_CV] = np.minimum(cvs[k], 1.0)
            out[:n, :n, P.BANDWIDTH_NOW] = out[:n, :n, P.BANDWIDTH_MEAN]
            out[:n, :n, P.LATENCY] = _log_scale(
                np.asarray(cluster.route_latency_s)[:n, :n] + 1e-7, 1e-7, 1.0)
        for i, host in enumerate(cluster.hosts):
            # The diagonal: the host's own scale-up fabric, which does not vary.
            intra = log_scale(host.intra_GBps * 8.0, 0.1, 1e5)
            out[i, i, P.BANDWIDTH_MEAN] = out[i, i, P.BANDWIDTH_NOW] = intra
            out[i, i, P.BANDWIDTH_CV] = 0.0
            out[i, i, P.LATENCY] = log_scale(host.intra_latency_s + 1e-7, 1e-7, 1.0)
        static = out
    if draw is None:
        return static
    out = static.copy()
    now = np.append(np.asarray(draw, dtype=float).reshape(-1), np.inf)
    low = now[routes].min(axis=2)
    diag = out[np.arange(n), np.arange(n), P.BANDWIDTH_NOW].copy()
    out[:n, :n, P.BANDWIDTH_NOW] = _log_scale(low, 0.1, 1e5)
    out[np.arange(n), np.arange(n), P.BANDWIDTH_NOW] = diag
    return out
