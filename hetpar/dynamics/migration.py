"""What a switch between two plans moves, over which links, and how long it takes.

A plan places every layer's model state on GPUs: the stage holding the layer splits it
into ``tp`` slices, one per GPU of a replica, and every replica holds the weights of its
slice; the optimizer state (fp32 master weights and Adam's moments) is held by every
replica too, or, under ZeRO-1, split into ``dp`` shards of the slice, one per replica.
Each layer's state is laid out as one vector ``[0, 1)``: tp slice ``j`` of ``t`` is
``[j/t, (j+1)/t)`` and ZeRO shard ``r`` of ``d`` is the ``r``-th ``d``-th of that slice.

Switching from plan A to plan B moves, for every GPU of B and every layer it holds, the
parts of its weight and optimizer intervals it did not already hold under A: from a GPU
of the same host that held them (over the host's scale-up fabric) or else from the host
of A that holds them with the fastest route (over the network, every route's bytes
added on its links). The migration takes the slower of the two (network: the busiest
link's bytes over its bandwidth in the state of the switch; scale-up: the busiest GPU's
bytes in over its per-GPU bandwidth) plus the restart. Gradients do not move: they are
rebuilt by the first iteration after the switch. The embedding belongs to the first
layer and the head and final norm to the last, as every plan places them.

The network part is returned as bytes per directed channel (``Flows``), independent of
the bandwidth: the simulator and the hindsight oracle price one pair of plans in many
network states of one topology with one vectorised division.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import lcm

import numpy as np

from hetpar.cluster.topology import Cluster
from hetpar.costmodel.constants import CostConstants
from hetpar.dynamics.scenario import Migration
from hetpar.plan import Plan, Stage
from hetpar.workload.model import ModelSpec

__all__ = ["Flows", "migration_flows", "migration_s", "unit_params"]


@dataclass(frozen=True, eq=False)
class Flows:
    """Bytes a switch moves: per directed channel of the cluster's network (its
    ``channel`` order, 2 per link), and the scale-up seconds of the busiest GPU."""

    channel_bytes: np.ndarray  # (channels,)
    intra_s: float
    network_bytes: float
    intra_bytes: float
    local_bytes: float  # state already in place (not moved)

    @property
    def moved_bytes(self) -> float:
        return self.network_bytes + self.intra_bytes

    def seconds(self, link_gbps: np.ndarray) -> float:
        """Transfer seconds under the links' bandwidth (Gb/s, links order)."""
        if not self.channel_bytes.any():
            return self.intra_s
        rate = np.repeat(np.asarray(link_gbps, dtype=float), 2) * (1e9 / 8)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(self.channel_bytes > 0, self.channel_bytes / rate, 0.0)
        return max(float(t.max()), self.intra_s)


def unit_params(model: ModelSpec) -> np.ndarray:
    """Parameters of each layer's state: the embedding on the first, head and final
    norm on the last."""
    out = np.full(model.layers, float(model.params_per_layer))
    out[0] += model.embedding_params
    out[-1] += model.head_params + model.final_norm_params
    return out


def _stage_of_layer(plan: Plan) -> np.ndarray:
    return np.repeat(np.arange(plan.num_stages), [s.layers for s in plan.stages])


def _holdings(stage: Stage, q: int, zero: bool) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """(weight cells, optimizer cells) each GPU of ``stage`` holds, in ``q`` cells."""
    t, d = stage.tp, stage.dp
    out: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    cells = np.arange(q)
    for r, rep in enumerate(stage.replicas):
        for j, gpu in enumerate(rep.gpus):
            w = (cells * t // q) == j
            if zero:
                o = w & (((cells - j * q // t) * t * d // q) == r)
            else:
                o = w
            out[(rep.host, gpu)] = (w, o)
    return out


def migration_flows(a: Plan, b: Plan, cluster: Cluster, model: ModelSpec,
                    constants: CostConstants, bytes_per_param: float = 14.0) -> Flows:
    """The bytes that switching from ``a`` to ``b`` moves on ``cluster`` (the cluster
    of the state the switch happens in: every host of both plans must be in it)."""
    w_bytes = constants.weight_bytes
    o_bytes = max(bytes_per_param - w_bytes, 0.0)
    params = unit_params(model)
    sa, sb = _stage_of_layer(a), _stage_of_layer(b)
    hosts = cluster.host_index
    n_ch = 2 * len(cluster.links)
    channel = np.zeros(n_ch)
    intra_in: dict[tuple[str, int], float] = {}
    network = intra = local = 0.0
    # Route preference of each target host: the source hosts by their route's narrowest
    # link capacity, widest first (a fixed order: the same in every bandwidth state).
    caps = np.array([lk.capacity_gbps for lk in cluster.links])
    best_route: dict[tuple[str, str], float] = {}

    def width(src: str, dst: str) -> float:
        key = (src, dst)
        if key not in best_route:
            route = cluster.route(hosts[src], hosts[dst])
            best_route[key] = float(min((caps[ch // 2] for ch in route), default=math.inf))
        return best_route[key]

    # Layers with the same (stage in a, stage in b) move alike: one pass per pair.
    pairs: dict[tuple[int, int], float] = {}
    for layer in range(model.layers):
        key = (int(sa[layer]), int(sb[layer]))
        pairs[key] = pairs.get(key, 0.0) + float(params[layer])
    for (ia, ib), p in pairs.items():
        st_a, st_b = a.stages[ia], b.stages[ib]
        q = lcm(st_a.tp * st_a.dp, st_b.tp * st_b.dp)
        held = _holdings(st_a, q, bool(a.zero))
        need = _holdings(st_b, q, bool(b.zero))
        by_host: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for (host, _), (w, o) in held.items():
            hw, ho = by_host.get(host, (np.zeros(q, bool), np.zeros(q, bool)))
            by_host[host] = (hw | w, ho | o)
        cell_w, cell_o = p * w_bytes / q, p * o_bytes / q
        for gpu_key, (w, o) in need.items():
            host = gpu_key[0]
            had = held.get(gpu_key)
            if had is not None:
                local += float((w & had[0]).sum() * cell_w + (o & had[1]).sum() * cell_o)
                w, o = w & ~had[0], o & ~had[1]
            same = by_host.get(host)
            moved_in = 0.0
            if same is not None:
                n = float((w & same[0]).sum() * cell_w + (o & same[1]).sum() * cell_o)
                moved_in += n
                w, o = w & ~same[0], o & ~same[1]
            intra += moved_in
            intra_in[gpu_key] = intra_in.get(gpu_key, 0.0) + moved_in
            if not (w.any() or o.any()):
                continue
            sources = sorted((h for h in by_host if h != host),
                             key=lambda h: (-width(h, host), hosts[h]))
            for src in sources:
                hw, ho = by_host[src]
                n = float((w & hw).sum() * cell_w + (o & ho).sum() * cell_o)
                if n <= 0:
                    continue
                w, o = w & ~hw, o & ~ho
                network += n
                for ch in cluster.route(hosts[src], hosts[host]):
                    channel[ch] += n
                if not (w.any() or o.any()):
                    break
    intra_s = 0.0
    for (host, _), n in intra_in.items():
        if n > 0:
            intra_s = max(intra_s, n / (cluster.hosts[hosts[host]].intra_GBps * 1e9))
    return Flows(channel, intra_s, network, intra, local)


def migration_s(flows: Flows, link_gbps: np.ndarray, migration: Migration) -> float:
    """Seconds a switch stalls the job: the transfer under ``link_gbps`` and the restart."""
    return flows.seconds(link_gbps) + migration.restart_s
