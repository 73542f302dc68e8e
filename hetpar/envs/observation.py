"""Observation of ``PlanBuilder-v0``: fixed-size padded arrays, no meaning in host order.

Every feature is scaled to about [0, 1] (quantities spanning decades on a log scale), so
one policy reads clusters, models and networks of any size alike. Host ``i``'s row and
the ``i``-th row and column of the bandwidth tensor always describe the same host, so
permuting the hosts of an instance permutes the observation the same way.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from hetpar.envs.context import InstanceContext, log_scale

__all__ = ["HOST_FEATURES", "PAIR_FEATURES", "GLOBAL_FEATURES", "observation_space",
           "static_host_features", "static_globals", "pair_features"]

HOST_FEATURES = (
    "peak_tflops", "effective_tflops", "usable_memory", "hbm_bandwidth", "gpus",
    "scaleup_bandwidth", "nic_bandwidth", "can_train",
    "free_fraction", "open_stage_fraction", "closed_stages_fraction", "can_add_block",
    "layers_per_gpu", "previous_stage_fraction", "same_type_as_open_stage",
)
PAIR_FEATURES = ("bandwidth_mean", "bandwidth_cv", "bandwidth_now", "latency")
GLOBAL_FEATURES = (
    "phase_memory", "phase_micro_batches", "phase_tp", "phase_blocks",
    "recompute_none", "recompute_selective", "recompute_full", "zero",
    "micro_batches", "micro_batch_sequences", "layers_left", "stages_built",
    "open_tp", "open_dp", "open_capacity", "open_capacity_first", "open_closable",
    "model_params", "model_layers", "model_hidden", "seq_len", "global_batch",
    "robust_mode", "cluster_gpus", "cluster_hosts", "ideal_time", "network_cv",
)
_STATIC = 8  # host features that do not change within an episode


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
        out[i, 0] = log_scale(peak / 1e12 + 1e-9, 1.0, 4000.0) if perf else 0.0
        out[i, 1] = log_scale(perf.flops / 1e12, 1.0, 4000.0) if perf else 0.0
        out[i, 2] = log_scale(perf.usable_bytes / 2**30, 1.0, 512.0) if perf else 0.0
        out[i, 3] = log_scale(h.gpu.hbm_GBps, 100.0, 20000.0)
        out[i, 4] = min(h.num_gpus / 16.0, 1.0)
        out[i, 5] = log_scale(h.intra_GBps, 1.0, 2000.0)
        out[i, 6] = log_scale(h.nic_gbps, 0.1, 6400.0)
        out[i, 7] = 1.0 if perf else 0.0
    return out


def static_globals(ctx: InstanceContext, max_hosts: int, max_layers: int,
                   robust: bool) -> np.ndarray:
    """The global features that do not change within an episode (model, cluster)."""
    g = np.zeros(len(GLOBAL_FEATURES), dtype=np.float32)
    model, training = ctx.cm.model, ctx.instance.training
    g[17] = log_scale(model.total_params, 1e7, 1e13)
    g[18] = min(model.layers / max_layers, 1.0)
    g[19] = log_scale(model.hidden, 64.0, 65536.0)
    g[20] = log_scale(ctx.cm.seq_len, 64.0, 131072.0)
    g[21] = log_scale(training.global_batch, 1.0, 65536.0)
    g[22] = float(robust)
    g[23] = log_scale(ctx.cluster.num_gpus, 1.0, 4096.0)
    g[24] = len(ctx.cluster.hosts) / max_hosts
    g[25] = log_scale(ctx.ideal_s, 1e-4, 1e4)
    g[26] = min(max((link.bandwidth.cv() for link in ctx.cluster.links), default=0.0), 1.0)
    return g


def pair_features(ctx: InstanceContext, max_hosts: int, draw: np.ndarray | None) -> np.ndarray:
    """Route features between hosts: bottleneck mean, its variability, the bandwidth of
    this episode's draw (the mean in robust mode) and the latency. The diagonal describes
    the host's own scale-up fabric."""
    cluster = ctx.cluster
    n = len(cluster.hosts)
    means = np.array([link.bandwidth.mean() for link in cluster.links])
    cvs = np.array([link.bandwidth.cv() for link in cluster.links])
    now = means if draw is None else np.asarray(draw, dtype=float).reshape(-1)
    out = np.zeros((max_hosts, max_hosts, len(PAIR_FEATURES)), dtype=np.float32)
    for i in range(n):
        host = cluster.hosts[i]
        intra_gbps = host.intra_GBps * 8.0
        out[i, i] = (log_scale(intra_gbps, 0.1, 1e5), 0.0, log_scale(intra_gbps, 0.1, 1e5),
                     log_scale(host.intra_latency_s + 1e-7, 1e-7, 1.0))
        for j in range(n):
            if i == j:
                continue
            links = np.fromiter((ch // 2 for ch in cluster.routes[i][j]), dtype=np.intp)
            k = links[np.argmin(means[links])]
            out[i, j] = (log_scale(float(means[k]), 0.1, 1e5), min(float(cvs[k]), 1.0),
                         log_scale(float(now[links].min()), 0.1, 1e5),
                         log_scale(cluster.route_latency[i][j] + 1e-7, 1e-7, 1.0))
    return out
