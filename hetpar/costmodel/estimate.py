"""Scoring a plan: ``CostModel`` (a reusable context) and the ``Estimate`` it returns.

A ``CostModel`` binds a cluster, model, training spec, calibrated constants and a fixed
set of K bandwidth states (drawn once from a seeded generator), so that many plans are
compared under the same draws (common random numbers). Everything that depends only on
the plan is plain Python arithmetic; everything that depends on bandwidth is a numpy
operation over the K states at once.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetpar.cluster.topology import Cluster
from hetpar.costmodel.comm import (colocated_split, colocated_transfers, ring_allreduce_time,
                                   sharded_dp_traffic)
from hetpar.costmodel.compute import GpuPerf, StageWork, gpu_perf, stage_work
from hetpar.costmodel.constants import GIB, CostConstants, load_constants
from hetpar.costmodel.memory import in_flight, stage_bytes
from hetpar.costmodel.offload import host_step_seconds_per_param
from hetpar.costmodel.objective import Objective, cvar
from hetpar.costmodel.frame import CoreTerms, PlanFrame, SplitTables, StageFrame
from hetpar.costmodel.schedule import interleaved_transfers, one_f_one_b, pipeline_total
from hetpar.errors import ConfigError, PlanError
from hetpar.plan import Plan, validate_plan
from hetpar.workload.model import ModelSpec
from hetpar.workload.training import TrainingSpec

__all__ = ["CostModel", "CoreTerms", "Estimate", "StageCost", "ReplicaMemory", "estimate"]

# Pipeline structures whose frames a CostModel keeps (the oldest go first): a search
# closes one structure at a time, so recent ones are what it asks for again.
_FRAME_CACHE = 4096

# Host pairs between two stages from which their transfers are taken as arrays, where the
# cluster's network allows (``Cluster.route_bulk``): the same figures, bit for bit (each
# channel's bytes summed in the same order), without a Python step per pair. Between two
# stages of hundreds of hosts each every host sends to every other (``colocated_transfers``).
BULK_PAIRS = 4096
BULK_BLOCK = 1 << 20


def _shares(hosts: tuple[int, ...]) -> dict[int, float]:
    """Each host's share of a stage's replicas (summing to 1)."""
    out: dict[int, float] = {}
    for h in hosts:
        out[h] = out.get(h, 0.0) + 1.0 / len(hosts)
    return out



@dataclass(frozen=True)
class ReplicaMemory:
    """Peak memory of each GPU of one replica (all its GPUs hold the same)."""

    stage: int
    host: str
    gpus: tuple[int, ...]
    gpu_type: str
    used_bytes: float
    usable_bytes: float
    capacity_bytes: float

    @property
    def headroom_bytes(self) -> float:
        return self.usable_bytes - self.used_bytes

    @property
    def fits(self) -> bool:
        return self.used_bytes <= self.usable_bytes


@dataclass(frozen=True)
class StageCost:
    """Per micro-batch costs of a stage's slowest replica, and its transfers (means)."""

    index: int
    layers: int
    tp: int
    dp: int
    gpu_types: tuple[str, ...]
    hosts: tuple[str, ...]
    work: StageWork
    p2p_in_s: float
    p2p_out_s: float
    dp_intra_s: float
    params_per_gpu: float
    memory_bytes: float  # the largest over its replicas
    usable_bytes: float  # the smallest over its replicas

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.index, "layers": self.layers, "tp": self.tp, "dp": self.dp,
            "gpu_types": list(self.gpu_types), "hosts": list(self.hosts),
            "fwd_s": self.work.fwd, "bwd_s": self.work.bwd, "recompute_s": self.work.recompute,
            "tp_comm_s": self.work.tp_comm, "overhead_s": self.work.overhead,
            "work_s": self.work.total, "p2p_in_s": self.p2p_in_s, "p2p_out_s": self.p2p_out_s,
            "dp_intra_s": self.dp_intra_s, "params_per_gpu": self.params_per_gpu,
            "memory_gib": self.memory_bytes / GIB, "usable_gib": self.usable_bytes / GIB,
        }


@dataclass(frozen=True)
class Estimate:
    """The cost model's verdict on one plan.

    ``iter_time`` holds the iteration time in seconds under each of the K bandwidth
    states; ``breakdown`` splits its mean into additive terms.
    """

    plan: Plan
    iter_time: np.ndarray
    feasible: bool
    stages: tuple[StageCost, ...]
    memory: tuple[ReplicaMemory, ...]
    breakdown: Mapping[str, float]
    overflow: tuple[str, ...]
    tokens_per_iter: int
    model_flops_per_iter: float
    peak_flops: float
    samples: int = field(default=0)
    # GPU types of the plan without fitted efficiencies of their own, and the calibration
    # entry each reads instead (``CostConstants.gpu_key``: its architecture's, or
    # ``default``).
    uncalibrated: tuple[str, ...] = field(default=())
    uncalibrated_reads: tuple[str, ...] = field(default=())

    @property
    def iter_time_mean(self) -> float:
        return float(self.iter_time.mean())

    @property
    def iter_time_p50(self) -> float:
        return float(np.quantile(self.iter_time, 0.5))

    @property
    def iter_time_p90(self) -> float:
        return float(np.quantile(self.iter_time, 0.9))

    def cvar(self, alpha: float = 0.9) -> float:
        return cvar(self.iter_time, alpha)

    @property
    def iter_time_cvar90(self) -> float:
        return self.cvar(0.9)

    def value(self, objective: Objective) -> float:
        """The objective's value in seconds; infinite for a plan that does not fit."""
        return objective.score(self.iter_time, self.feasible)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_iter / self.iter_time_mean

    @property
    def mfu(self) -> float:
        """Model FLOPs (no recomputation) per second over the peak of the GPUs used."""
        return self.model_flops_per_iter / self.iter_time_mean / self.peak_flops

    @property
    def memory_per_gpu(self) -> dict[str, float]:
        """Peak bytes per GPU, keyed ``host:gpu``."""
        return {f"{m.host}:{g}": m.used_bytes for m in self.memory for g in m.gpus}

    @property
    def min_headroom_bytes(self) -> float:
        return min(m.headroom_bytes for m in self.memory)

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "overflow": list(self.overflow),
            "iter_time_s": {"mean": self.iter_time_mean, "p50": self.iter_time_p50,
                            "p90": self.iter_time_p90, "cvar90": self.iter_time_cvar90,
                            "min": float(self.iter_time.min()), "max": float(self.iter_time.max()),
                            "samples": int(self.iter_time.size)},
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "breakdown_s": dict(self.breakdown),
            "uncalibrated_gpus": list(self.uncalibrated),
            "uncalibrated_reads": dict(zip(self.uncalibrated, self.uncalibrated_reads)),
            "stages": [s.to_dict() for s in self.stages],
            "memory": [{"stage": m.stage, "host": m.host, "gpus": list(m.gpus),
                        "gpu_type": m.gpu_type, "used_gib": m.used_bytes / GIB,
                        "usable_gib": m.usable_bytes / GIB,
                        "headroom_gib": m.headroom_bytes / GIB} for m in self.memory],
            "plan": self.plan.to_dict(),
        }


def _optimizer_s(params: Any, sf: StageFrame, zero: int, offload: bool,
                 c: CostConstants) -> Any:
    """The optimizer step's seconds on one GPU of a stage holding ``params`` parameters
    per GPU (an int or an array): over its HBM, or on its host when offloaded."""
    owned = params / (sf.dp if zero else 1)
    if offload:
        return owned * sf.host_step_per_param
    return owned * c.optimizer_bytes_per_param / sf.hbm


class CostModel:
    """Scores plans for one (cluster, model, training) under fixed bandwidth states.

    ``samples`` bandwidth states are drawn with ``seed``; ``samples=0`` uses each link's
    mean bandwidth instead; ``bandwidth`` gives the states explicitly as a
    (K, links) array in Gb/s in the order of ``cluster.links``.
    """

    def __init__(self, cluster: Cluster, model: ModelSpec, training: TrainingSpec, *,
                 constants: CostConstants | None = None, samples: int = 32, seed: int = 0,
                 bandwidth: np.ndarray | None = None) -> None:
        self.cluster = cluster
        self.training = training
        # What a caller that names no plan asks about (the searchers' bounds and masks):
        # the searched plans use sequence parallelism exactly when the spec allows it.
        self.sequence_parallel = training.sequence_parallel
        self.seq_len = training.seq_len or model.seq_len
        self.model = model.with_seq_len(self.seq_len)
        self.constants = constants or load_constants()
        self.framework = self.constants.framework(training.framework)
        if bandwidth is None:
            bandwidth = cluster.bandwidth_states(samples, seed)
        bandwidth = np.atleast_2d(np.asarray(bandwidth, dtype=float))
        if bandwidth.shape[1] != len(cluster.links) or not np.all(bandwidth > 0):
            raise ConfigError("", "bandwidth", f"expected positive (K, {len(cluster.links)}) "
                                               f"link bandwidths, got shape {bandwidth.shape}")
        self.link_gbps = bandwidth
        self.inv_bw = 1.0 / (cluster.channel_bytes_per_s(bandwidth) * self.framework.net_efficiency)
        self.num_samples = bandwidth.shape[0]
        self._perf: list[GpuPerf | None] = []
        by_kind: dict[tuple, GpuPerf | None] = {}
        for host in cluster.hosts:
            key = (host.gpu, host.intra_kind, host.intra_GBps, host.intra_latency_s)
            if key not in by_kind:
                try:
                    by_kind[key] = gpu_perf(host, training.precision, self.constants,
                                            self.framework)
                except ConfigError:
                    by_kind[key] = None  # reported if a plan uses this host
            self._perf.append(by_kind[key])
        self._work_cache: dict[tuple, StageWork] = {}
        self._transfer_cache: dict[tuple, list[tuple[int, int, float]]] = {}
        self._memory_cache: dict[tuple, tuple[float, float]] = {}
        self._flow_cache: dict[tuple, tuple[dict[int, float], float, float]] = {}
        self._frames: dict[tuple, PlanFrame] = {}
        self._crossing_cache: dict[tuple, tuple[dict[int, float], float, float]] = {}
        self._row_cache: dict[tuple, tuple[np.ndarray, ...]] = {}

    def with_bandwidth(self, bandwidth: np.ndarray) -> CostModel:
        """The same context under other bandwidth states (K, links) in Gb/s.

        The memoised work, memory and flow tables do not depend on bandwidth, so the copy
        shares them: scoring one plan per fresh bandwidth draw stays cheap."""
        bandwidth = np.atleast_2d(np.asarray(bandwidth, dtype=float))
        if bandwidth.shape[1] != len(self.cluster.links) or not np.all(bandwidth > 0):
            raise ConfigError("", "bandwidth", f"expected positive (K, {len(self.cluster.links)})"
                                               f" link bandwidths, got shape {bandwidth.shape}")
        other = copy.copy(self)
        other.link_gbps = bandwidth
        other.inv_bw = 1.0 / (self.cluster.channel_bytes_per_s(bandwidth)
                              * self.framework.net_efficiency)
        other.num_samples = bandwidth.shape[0]
        other._frames = {}  # they hold bandwidth terms
        return other

    @property
    def model_flops_per_iter(self) -> float:
        """Model FLOPs of one iteration (forward and backward, no recomputation)."""
        model = self.model
        per_token = 3.0 * (model.layers * model.layer_fwd_flops_per_token(self.seq_len)
                           + model.head_fwd_flops_per_token)
        return per_token * self.training.global_batch * self.seq_len

    # ---- helpers ---------------------------------------------------------------------
    def _host_perf(self, host_idx: int, source: str, stage: int, replica: int) -> GpuPerf:
        perf = self._perf[host_idx]
        if perf is None:
            host = self.cluster.hosts[host_idx]
            raise PlanError(source, f"stages[{stage}].replicas[{replica}]",
                            f"host {host.name!r} has {host.gpu.name}, which lacks "
                            f"{self.training.precision} support")
        return perf

    def host_perf(self, host: int) -> GpuPerf | None:
        """Effective rates of a host's GPUs (None if they lack the training precision)."""
        return self._perf[host]

    def stage_work(self, perf: GpuPerf, seqs: float, tp: int, layers: int, first: bool,
                   last: bool, recompute: str, sp: bool | None = None, chunks: int = 1,
                   cp: int = 1) -> StageWork:
        """Per micro-batch work of one replica (memoised; ``perf`` from ``host_perf``;
        ``sp`` None: as the training spec's searched plans)."""
        if sp is None:
            sp = self.sequence_parallel
        # perfs live as long as self
        key = (id(perf), seqs, tp, layers, first, last, recompute, sp, chunks, cp)
        work = self._work_cache.get(key)
        if work is None:
            work = stage_work(self.model, self.seq_len, seqs, tp, layers, first, last, recompute,
                              self.training.flash_attention, perf, self.constants,
                              self.framework, sp=sp, chunks=chunks, cp=cp)
            self._work_cache[key] = work
        return work

    def _transfers(self, src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[int, int, float]]:
        """``colocated_transfers`` between two replica host lists, memoised."""
        key = (src, dst)
        out = self._transfer_cache.get(key)
        if out is None:
            out = self._transfer_cache[key] = colocated_transfers(_shares(src), _shares(dst))
        return out

    def _bulk_loads(self, src: tuple[int, ...], dst: tuple[int, ...],
                    volume: Callable[[np.ndarray], np.ndarray], both_ways: bool = False,
                    ) -> tuple[list[tuple[int, int, float]], dict[int, float], float] | None:
        """The flows of ``_transfers(src, dst)`` taken as arrays, where they cross at least
        ``BULK_PAIRS`` host pairs and the network allows (else None): (the transfers that
        stay on a host, bytes per channel of the crossing ones, each of ``volume(share)``
        bytes, and with ``both_ways`` as much back, their longest route's latency). Each
        channel's bytes are summed from 0.0 flow by flow in the loop's order and the
        channels kept in order of first use, so the figures are the loop's, bit for bit;
        the pairs go in blocks of about ``BULK_BLOCK`` to bound the memory."""
        if len(set(src)) * len(set(dst)) < BULK_PAIRS:
            return None
        stay, surplus, deficit, total = colocated_split(_shares(src), _shares(dst))
        if len(surplus) * len(deficit) < BULK_PAIRS:
            return None
        hs = np.array([h for h, _ in surplus], dtype=np.int64)
        ss = np.array([x for _, x in surplus])
        gs = np.array([g for g, _ in deficit], dtype=np.int64)
        ds = np.array([x for _, x in deficit])
        size = self.cluster.num_channels
        acc = np.zeros(size)
        unused = np.iinfo(np.int64).max
        first = np.full(size, unused, dtype=np.int64)
        seen = 0
        longest = 0.0
        rows = max(1, BULK_BLOCK // len(gs))
        for r0 in range(0, len(hs), rows):
            x = np.repeat(hs[r0:r0 + rows], len(gs))
            y = np.tile(gs, len(x) // len(gs))
            there = self.cluster.route_bulk(x, y)
            if there is None:
                return None
            chans, lats = there
            vols = volume((ss[r0:r0 + rows, None] * ds[None, :]).ravel() / total)
            if both_ways:  # pair after pair: there, then back
                back = self.cluster.route_bulk(y, x)[0]  # type: ignore[index]
                chans = np.stack([chans, back], axis=1).reshape(-1, chans.shape[1])
                vols = np.repeat(vols, 2)
            flat = chans.ravel()
            keep = flat >= 0
            flat = flat[keep]
            np.add.at(acc, flat, np.repeat(vols, chans.shape[1])[keep])  # in order
            np.minimum.at(first, flat, np.arange(seen, seen + len(flat)))
            seen += len(flat)
            longest = max(longest, float(lats.max()))
        used = np.flatnonzero(first != unused)
        order = used[np.argsort(first[used], kind="stable")]
        return stay, dict(zip(order.tolist(), acc[order].tolist())), longest

    def phase_time(self, loads: dict[int, float]) -> np.ndarray | float:
        """Bottleneck time (per sample) of concurrent flows given bytes per directed
        channel: see comm.py for why this is their max-min fair completion time."""
        if not loads:
            return 0.0
        chans = np.fromiter(loads.keys(), dtype=np.intp, count=len(loads))
        vols = np.fromiter(loads.values(), dtype=float, count=len(loads))
        return (self.inv_bw[:, chans] * vols).max(axis=1)

    def boundary_flows(self, src: tuple[int, ...], dst: tuple[int, ...], tp_src: int,
                       tp_dst: int, mb: int, intra_bw: float, intra_step: float,
                       ) -> tuple[dict[int, float], float, float]:
        """One micro-batch's activations from a stage's replicas (hosts ``src``) to the
        next's: (bytes per directed channel, seconds of the intra-host part, latency of
        the inter-host part). Memoised: it depends on the plan only through these."""
        key = (src, dst, tp_src, tp_dst, mb, intra_bw, intra_step)
        hit = self._flow_cache.get(key)
        if hit is not None:
            return hit
        fw = self.framework
        copies = tp_src if fw.p2p_copy_per_tp_rank else 1
        lanes = 1 if fw.p2p_copy_per_tp_rank else min(tp_src, tp_dst)
        loads, local, hop_lat = self._crossings(src, dst, mb, copies)
        # The tp GPUs send in parallel, each over its own scale-up link.
        intra_t = local / (lanes * copies * intra_bw) + intra_step if local >= 0 else 0.0
        out = (loads, intra_t, hop_lat + fw.step_latency_s if loads else 0.0)
        self._flow_cache[key] = out
        return out

    def _crossings(self, src: tuple[int, ...], dst: tuple[int, ...], mb: int, copies: int,
                   ) -> tuple[dict[int, float], float, float]:
        """Where one micro-batch's activations go between two replica host lists: (bytes
        per directed channel between hosts, the largest volume that stays on a host or -1,
        the longest route's latency). Geometry alone, memoised in a table that copies of
        this model under other constants share (``with_constants``)."""
        key = (src, dst, mb, copies)
        hit = self._crossing_cache.get(key)
        if hit is not None:
            return hit
        routes, lat = self.cluster.route_views()
        per_seq = self.seq_len * self.model.hidden * 2.0
        loads: dict[int, float] = {}
        local = -1.0
        hop_lat = 0.0
        bulk = self._bulk_loads(src, dst, lambda share: share * mb * per_seq * copies)
        if bulk is not None:
            stay, loads, longest = bulk
            for _, _, part in stay:
                local = max(local, part * mb * per_seq * copies)
            out = self._crossing_cache[key] = (loads, local, max(hop_lat, longest))
            return out
        for a, b, share in self._transfers(src, dst):
            vol = share * mb * per_seq * copies
            if a == b:
                local = max(local, vol)
            else:
                for ch in routes[a][b]:
                    loads[ch] = loads.get(ch, 0.0) + vol
                hop_lat = max(hop_lat, lat[a][b])
        out = self._crossing_cache[key] = (loads, local, hop_lat)
        return out

    def stage_memory(self, layers: int, tp: int, dp: int, seqs: float, inflight: float,
                     first: bool, last: bool, recompute: str, zero: int,
                     sp: bool | None = None, gathered: bool = True,
                     offload: bool = False) -> tuple[float, float]:
        """(parameters per GPU, peak bytes per GPU) of a stage; the same on every replica.

        ``inflight`` is how many micro-batches' activations it holds at once under 1F1B;
        ``sp`` None: as the training spec's searched plans; ``gathered=False``: without
        ZeRO-3's gathered layers, a lower bound affine in the layer count (bounds);
        ``offload``: the optimizer states in host memory (``plan.offload``)."""
        if sp is None:
            sp = self.sequence_parallel
        key = (layers, tp, dp, seqs, first, last, inflight, recompute, int(zero), sp, gathered,
               offload)
        hit = self._memory_cache.get(key)
        if hit is not None:
            return hit
        params, used = self._stage_bytes(layers, tp, dp, seqs, inflight, first, last,
                                         recompute, zero, sp, gathered, offload)
        out = self._memory_cache[key] = (params, used)
        return out

    def _stage_bytes(self, layers: Any, tp: int, dp: int, seqs: float, inflight: float,
                     first: bool, last: bool, recompute: str, zero: int,
                     sp: bool | None = None, gathered: bool = True,
                     offload: bool = False) -> tuple[Any, Any]:
        """``stage_memory`` unmemoised; ``layers`` may be an int or an array of counts
        (elementwise the same arithmetic, so the same values)."""
        return stage_bytes(self.model, self.seq_len, layers, tp, dp, seqs, inflight, first,
                           last, recompute, int(zero), flash=self.training.flash_attention,
                           constants=self.constants, framework=self.framework,
                           sp=self.sequence_parallel if sp is None else sp,
                           gathered=gathered, offload=offload)

    def frame(self, plan: Plan, source: str = "<plan>") -> PlanFrame:
        """The layer-independent terms of ``plan``'s pipeline structure (memoised): every
        plan that differs from it only in its layer split shares them."""
        index = self.cluster.host_index
        host_ids = tuple(tuple(index[r.host] for r in st.replicas) for st in plan.stages)
        offload = plan.offload != "none"
        key = (host_ids, tuple(st.tp for st in plan.stages), plan.micro_batches,
               plan.recompute, plan.zero, plan.sequence_parallel, plan.virtual_stages,
               plan.context_parallel, offload)
        hit = self._frames.get(key)
        if hit is None:
            hit = self._build_frame(host_ids, key[1], plan.micro_batches, plan.recompute,
                                    plan.zero, source, plan.sequence_parallel,
                                    plan.virtual_stages, plan.context_parallel, offload)
            if len(self._frames) >= _FRAME_CACHE:
                del self._frames[next(iter(self._frames))]  # the oldest
            self._frames[key] = hit
        return hit

    def _build_frame(self, host_ids: tuple[tuple[int, ...], ...], tps: tuple[int, ...], m: int,
                     recompute: str, zero: int, source: str, sp: bool = False,
                     virtual: int = 1, cp: int = 1, offload: bool = False) -> PlanFrame:
        c = self.constants
        fw = self.framework
        model = self.model
        routes, lat = self.cluster.route_views()  # a large cluster's: pair by pair
        mb = self.training.global_batch // m
        p = len(host_ids)
        step = fw.step_latency_s
        dp_volume, dp_steps = sharded_dp_traffic(zero, m, c.weight_bytes, c.grad_bytes)
        stages: list[StageFrame] = []
        dp_coef: dict[int, list[float]] = {}  # channel -> bytes per parameter of each stage
        dp_fixed: dict[int, float] = {}
        dp_lat = 0.0
        # Pipeline boundaries: flat (channel, load) lists with a start offset per boundary
        # that has inter-host flows, so one numpy reduction times them all.
        b_chans: list[int] = []
        b_loads: list[float] = []
        b_starts: list[int] = []
        b_cols: list[int] = []
        b_lat: list[float] = []
        b_intra = [0.0] * max(p - 1, 0)
        for i, (ids, tp) in enumerate(zip(host_ids, tps)):
            perfs = tuple(self._perf[h] for h in ids)
            if None in perfs:  # a host whose GPUs lack the training precision
                j = perfs.index(None)
                self._host_perf(ids[j], source, i, j)
            # Identical hosts share one GpuPerf object: cost each kind of replica once.
            kinds = tuple({id(perf): perf for perf in perfs}.values())
            usable = hbm = intra_bw = math.inf
            intra_step = host_step = 0.0
            for k in kinds:
                usable, hbm = min(usable, k.usable_bytes), min(hbm, k.hbm)
                intra_bw, intra_step = min(intra_bw, k.intra_bw), max(intra_step, k.intra_step_s)
                if offload and k is not None:  # (None ruled out above)
                    host_step = max(host_step, host_step_seconds_per_param(
                        c.grad_bytes, c.weight_bytes, c.optimizer_bytes_per_param,
                        k.host_bw, k.cpu_optimizer_bw))
            dp = len(ids)
            order: dict[int, int] = {}
            for h in ids:
                order[h] = order.get(h, 0) + 1
            sf = StageFrame(tp=tp, dp=dp, seqs=mb / dp, inflight=in_flight(i, p, m, virtual),
                            first=i == 0, last=i == p - 1, host_ids=ids,
                            perfs=perfs,  # type: ignore[arg-type]  (None ruled out above)
                            kinds=kinds,  # type: ignore[arg-type]
                            usable_bytes=usable, hbm=hbm, intra_bw=intra_bw,
                            intra_step=intra_step, host_members=max(order.values()),
                            host_step_per_param=host_step)
            stages.append(sf)
            hosts = list(order)
            n = len(hosts)
            if dp > 1 and n > 1:
                # A ring over the hosts; each hop's channels carry 2(n-1)/n of the gradient.
                # (ZeRO-2/3 move dp_volume times as much: comm.sharded_dp_traffic.)
                per_param = 2.0 * (n - 1) / n * c.grad_bytes * tp * dp_volume
                hop_lat = 0.0
                for a, b in zip(hosts, hosts[1:] + hosts[:1]):
                    for ch in routes[a][b]:
                        dp_coef.setdefault(ch, [0.0] * p)[i] += per_param
                    hop_lat = max(hop_lat, lat[a][b])
                dp_lat = max(dp_lat, 2.0 * (n - 1) * (hop_lat + step) * dp_steps)
            if i < p - 1:
                loads, b_intra[i], hop = self.boundary_flows(
                    ids, host_ids[i + 1], tp, tps[i + 1], mb, sf.intra_bw, sf.intra_step)
                if loads:
                    b_starts.append(len(b_chans))
                    b_cols.append(i)
                    b_chans.extend(loads)
                    b_loads.extend(loads.values())
                    b_lat.append(hop)
        if virtual > 1 and p > 1:
            # Interleaving's wrap from the last stage's chunks to the first's: one more column.
            last = stages[-1]
            loads, wrap_intra, hop = self.boundary_flows(
                host_ids[-1], host_ids[0], tps[-1], tps[0], mb, last.intra_bw, last.intra_step)
            b_intra.append(wrap_intra)
            if loads:
                b_starts.append(len(b_chans))
                b_cols.append(p - 1)
                b_chans.extend(loads)
                b_loads.extend(loads.values())
                b_lat.append(hop)

        if fw.tied_embedding_sync and model.tied_embeddings and p > 1:
            # Megatron all-reduces the tied embedding's gradient between first and last stage.
            # Replica pairs (first, last) exchange the gradient both ways.
            emb = model.vocab * model.hidden * c.grad_bytes * min(len(host_ids[0]),
                                                                  len(host_ids[-1]))
            bulk = self._bulk_loads(host_ids[0], host_ids[-1], lambda share: share * emb,
                                    both_ways=True)
            if bulk is not None:
                dp_fixed = bulk[1]
                dp_lat = max(dp_lat, 2.0 * (bulk[2] + step))
            for a, b, share in (() if bulk is not None else
                                self._transfers(host_ids[0], host_ids[-1])):
                if a != b:
                    for x, y in ((a, b), (b, a)):
                        for ch in routes[x][y]:
                            dp_fixed[ch] = dp_fixed.get(ch, 0.0) + share * emb
                    dp_lat = max(dp_lat, 2.0 * (lat[a][b] + step))

        k = self.num_samples
        # Activations forward and their gradients back: the same volumes mirrored.
        boundary = np.empty((k, len(b_intra)))
        boundary[:] = b_intra
        boundary *= 2.0
        if b_chans:
            times = self.inv_bw[:, b_chans] * np.array(b_loads)
            inter = np.maximum.reduceat(times, b_starts, axis=1) + np.array(b_lat)
            boundary[:, b_cols] = np.maximum(boundary[:, b_cols], 2.0 * inter)
        wrap = np.zeros(k)
        if virtual > 1 and p > 1:
            boundary, wrap = boundary[:, :p - 1].copy(), boundary[:, p - 1].copy()
        transfers, crossing = interleaved_transfers(boundary, wrap, virtual)
        inv_bw, per_param, fixed = self._merged_channels(dp_coef, dp_fixed, p)
        return PlanFrame(
            stages=tuple(stages), micro_batches=m, recompute=recompute, zero=zero,
            sequence_parallel=sp, virtual_stages=virtual, wrap=wrap, context_parallel=cp,
            dp_volume=dp_volume, offload=offload,
            boundary=boundary, cycle_transfers=transfers, boundary_total=crossing,
            dp_inv_bw=inv_bw, dp_per_param=per_param, dp_fixed=fixed, dp_latency=dp_lat)

    def _merged_channels(self, dp_coef: dict[int, list[float]], dp_fixed: dict[int, float],
                         p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The all-reduce channels as (inv_bw (K, G), per_param (G, p), fixed (G,)), with
        the channels that carry the same load merged into one column each.

        A channel's time is ``inv_bw * load`` and only the slowest counts, so channels of
        equal load (every uplink of a symmetric fabric, every hop of a ring) are one column
        whose ``inv_bw`` is their largest: ``max_c(inv_c * l) == max_c(inv_c) * l`` for
        ``l >= 0``, exactly in floating point too (rounding is monotone). A fat-tree's 40
        channels are 4-8 loads, and the (N, K, C) product of a block of splits is most of
        what scoring the block costs."""
        groups: dict[tuple[float, ...], list[int]] = {}
        for ch in dict.fromkeys([*dp_coef, *dp_fixed]):
            row = (*dp_coef.get(ch, [0.0] * p), dp_fixed.get(ch, 0.0))
            groups.setdefault(row, []).append(ch)
        rows = list(groups)
        inv_bw = np.empty((self.inv_bw.shape[0], len(rows)))
        for j, chans in enumerate(groups.values()):
            inv_bw[:, j] = self.inv_bw[:, chans].max(axis=1)
        table = np.array(rows, dtype=float).reshape(len(rows), p + 1)
        return inv_bw, table[:, :p].copy(), table[:, p].copy()

    def core(self, plan: Plan, source: str = "<plan>") -> CoreTerms:
        """The whole model for one plan, without building the report objects."""
        return self.core_split(self.frame(plan, source), [st.layers for st in plan.stages])

    def core_split(self, frame: PlanFrame, layers: Sequence[int]) -> CoreTerms:
        """``core`` of the plan with ``frame``'s structure and these layers per stage."""
        c = self.constants
        recompute, zero = frame.recompute, frame.zero
        sp, chunks, cp = frame.sequence_parallel, frame.virtual_stages, frame.context_parallel
        p = frame.num_stages
        works: list[StageWork] = []
        params_l: list[float] = []
        used_l: list[float] = []
        dp_intra = [0.0] * p
        opt_s = 0.0
        feasible = True
        for i, (sf, n) in enumerate(zip(frame.stages, layers)):
            params, used = self.stage_memory(n, sf.tp, sf.dp, sf.seqs, sf.inflight, sf.first,
                                             sf.last, recompute, zero, sp,
                                             offload=frame.offload)
            slowest: StageWork | None = None
            for perf in sf.kinds:
                work = self.stage_work(perf, sf.seqs, sf.tp, n, sf.first, sf.last, recompute,
                                       sp, chunks, cp)
                if slowest is None or work.total > slowest.total:
                    slowest = work
            assert slowest is not None
            feasible = feasible and used <= sf.usable_bytes
            works.append(slowest)
            params_l.append(params)
            used_l.append(used)
            opt_s = max(opt_s, _optimizer_s(params, sf, zero, frame.offload, c))
            if sf.host_members > 1:
                # Replicas sharing a host reduce over its scale-up link first.
                dp_intra[i] = ring_allreduce_time(params * c.grad_bytes, sf.host_members,
                                                  sf.intra_bw, sf.intra_step) * frame.dp_volume
        stage_s = np.array([w.total for w in works])
        pipe, cycle = one_f_one_b(stage_s, frame.boundary, frame.micro_batches,
                                  (frame.cycle_transfers, frame.boundary_total), chunks)
        dp_time: np.ndarray | float = max(dp_intra)
        if frame.dp_fixed.size:
            # The all-reduces run concurrently: their max-min fair completion (comm.py).
            loads = frame.dp_per_param @ np.array(params_l) + frame.dp_fixed
            dp_time = dp_time + ((frame.dp_inv_bw * loads).max(axis=1) + frame.dp_latency)
        total = pipe + dp_time + (opt_s + self.framework.iteration_overhead_s)
        return CoreTerms(total, feasible, works, params_l, used_l, frame.perfs, frame.host_ids,
                         frame.boundary, stage_s, cycle, dp_time, dp_intra, opt_s)

    def split_tables(self, frame: PlanFrame) -> SplitTables:
        """``frame``'s per-stage terms for every layer count of each stage (the
        layer-dependent half of ``core_split``, tabulated for a batch of splits)."""
        rows = [self._stage_row(sf, frame.recompute, frame.zero, frame.sequence_parallel,
                                frame.virtual_stages, frame.dp_volume, frame.context_parallel,
                                frame.offload)
                for sf in frame.stages]
        return SplitTables(*(np.stack(col) for col in zip(*rows)))

    def _stage_row(self, sf: StageFrame, recompute: str, zero: int, sp: bool = False,
                   chunks: int = 1, dp_volume: float = 1.0, cp: int = 1,
                   offload: bool = False) -> tuple[np.ndarray, ...]:
        """One stage's (work, params, fits, opt, intra) for 0..L layers (memoised: stages
        of the same kinds, shape and position recur across structures)."""
        key = (tuple(id(k) for k in sf.kinds), sf.tp, sf.dp, sf.seqs, sf.inflight, sf.first,
               sf.last, recompute, int(zero), sp, chunks, dp_volume, cp, sf.usable_bytes, sf.hbm,
               sf.host_members, sf.intra_bw, sf.intra_step, offload, sf.host_step_per_param)
        hit = self._row_cache.get(key)
        if hit is not None:
            return hit
        c = self.constants
        n = np.arange(self.model.layers + 1)
        par, used = self._stage_bytes(n, sf.tp, sf.dp, sf.seqs, sf.inflight, sf.first,
                                      sf.last, recompute, zero, sp, offload=offload)
        # The slowest kind, as core_split picks it (stage_work is elementwise arithmetic).
        work = np.max([stage_work(self.model, self.seq_len, sf.seqs, sf.tp, n, sf.first,
                                  sf.last, recompute, self.training.flash_attention, perf,
                                  c, self.framework, sp=sp, chunks=chunks, cp=cp).total
                       for perf in sf.kinds], axis=0)
        work[0] = np.inf  # a stage holds at least one layer
        params = np.asarray(par, dtype=float)
        fits = np.asarray(used <= sf.usable_bytes)
        opt = _optimizer_s(params, sf, zero, offload, c)
        intra = np.zeros(len(n))
        if sf.host_members > 1:
            intra = ring_allreduce_time(params * c.grad_bytes, sf.host_members, sf.intra_bw,
                                        sf.intra_step) * dp_volume
        out = self._row_cache[key] = (work, params, fits, opt, intra)
        for a in out:
            a.setflags(write=False)
        return out

    def score_splits(self, frame: PlanFrame, tables: SplitTables, splits: np.ndarray,
                     cutoff: float = math.inf) -> tuple[np.ndarray, np.ndarray]:
        """Iteration seconds ((N, K)) and whether each fits in memory ((N,)) of the N layer
        splits ``splits`` ((N, p) layers per stage) of ``frame``'s structure: what
        ``core_split`` gives each of them, in one vectorised pass.

        With a finite ``cutoff`` (a search's incumbent), rows that do not fit, and rows
        whose every sample is certainly above ``cutoff``, come back as not fitting with
        infinite seconds, unscored: a bound per row (the stages' work, the least transfers
        of any sample, the all-reduce's latency only) settles most rows of a block for
        O(p) work instead of O(K p + K C). Any objective that is at least its least sample
        (mean, quantile, CVaR) is then certainly above ``cutoff`` for them too."""
        # Flat indices into the (p, L+1) tables: one take per table.
        flat = splits + np.arange(frame.num_stages) * tables.work.shape[1]
        stage_s = tables.work.take(flat)  # (N, p)
        feasible = _row_all(tables.fits.take(flat))
        # Terms one per row, with no sample axis: the floor and the full score share them.
        intra = _row_max(tables.intra.take(flat))
        opt_s = _row_max(tables.opt.take(flat)) + self.framework.iteration_overhead_s
        n = len(splits)
        if math.isfinite(cutoff) and n:
            keep = feasible & (self._split_floor(frame, stage_s, intra, opt_s)
                               <= cutoff * (1.0 + _CUTOFF_SLACK))
            rows = np.flatnonzero(keep)
            if len(rows) < n:
                totals = np.full((n, frame.boundary_total.shape[0]), np.inf)
                if len(rows):
                    totals[rows] = self._split_totals(frame, tables, flat[rows],
                                                      stage_s[rows], intra[rows],
                                                      opt_s[rows])
                return totals, keep
        return self._split_totals(frame, tables, flat, stage_s, intra, opt_s), feasible

    def _split_totals(self, frame: PlanFrame, tables: SplitTables, flat: np.ndarray,
                      stage_s: np.ndarray, intra: np.ndarray, opt_s: np.ndarray,
                      ) -> np.ndarray:
        """``score_splits``' seconds ((N, K)) of the rows whose flat table indices are
        ``flat``, stage seconds ``stage_s`` ((N, p)), slowest intra-host all-reduce
        ``intra`` and optimizer step plus fixed overhead ``opt_s`` ((N,) each)."""
        m = frame.micro_batches
        transfers = frame.cycle_transfers
        if transfers.shape[0] == 1:
            cycle = (stage_s + transfers[0]).max(axis=1)[:, None]
        else:
            cycle = _max_over(stage_s, transfers, np.add)
        total = pipeline_total(stage_s.sum(axis=1)[:, None], frame.boundary_total[None, :],
                               cycle, m, frame.virtual_stages)
        dp_time = intra[:, None]
        if frame.dp_fixed.size:
            params = tables.params.take(flat)
            loads = params @ frame.dp_per_param.T + frame.dp_fixed  # (N, C)
            dp_time = dp_time + (_max_over(loads, frame.dp_inv_bw, np.multiply)
                                 + frame.dp_latency)
        return total + dp_time + opt_s[:, None]

    @staticmethod
    def _split_floor(frame: PlanFrame, stage_s: np.ndarray, intra: np.ndarray,
                     opt_s: np.ndarray) -> np.ndarray:
        """A lower bound ((N,)) of every sample of ``_split_totals``: the same terms in the
        same order, each sample's transfers replaced by the least over the samples and the
        all-reduce across hosts by its latency (every operation is monotone, so the bound
        holds in floating point too)."""
        least = frame.cycle_transfers.min(axis=0, keepdims=True)  # (1, p)
        cycle = _max_over(stage_s, least, np.add)[:, 0]
        total = pipeline_total(stage_s.sum(axis=1), float(frame.boundary_total.min()), cycle,
                               frame.micro_batches, frame.virtual_stages)
        dp_time = intra + frame.dp_latency if frame.dp_fixed.size else intra
        return total + dp_time + opt_s

    def with_constants(self, constants: CostConstants) -> CostModel:
        """The same cluster, model, training and bandwidth states under other constants
        (what the calibration fit asks for at every step). Only the tables of where data
        goes (colocated transfers, the channels each crossing uses) carry over: every
        time, memory and bandwidth term is recomputed from ``constants``."""
        other = CostModel(self.cluster, self.model, self.training, constants=constants,
                          bandwidth=self.link_gbps)
        other._transfer_cache = self._transfer_cache
        other._crossing_cache = self._crossing_cache
        return other

    def iteration_times(self, plan: Plan) -> tuple[np.ndarray, bool]:
        """Fast path for search: (iteration seconds per bandwidth sample, fits in memory).

        The plan must already be valid (no validation here)."""
        core = self.core(plan, "<plan>")
        return core.total, core.feasible

    def evaluate(self, plan: Plan, *, validate: bool = True, source: str = "<plan>",
                 allow_empty_stages: bool = False) -> Estimate:
        """Validate (unless told not to) and estimate a plan, with its full report."""
        if validate:
            validate_plan(plan, self.cluster, self.model, self.training, source=source,
                          allow_empty_stages=allow_empty_stages)
        core = self.core(plan, source)
        p = plan.num_stages
        fw = self.framework
        total = core.total
        steady = float((plan.micro_batches - 1) * core.cycle.mean())
        if plan.virtual_stages == 1:
            fill = float(core.stage_s.sum() + core.boundary.sum(axis=1).mean())
        else:  # what the pipeline takes beyond its steady state
            fill = float(np.mean(total - core.dp_time) - core.opt_s
                         - fw.iteration_overhead_s) - steady
        breakdown = {
            "pipeline_fill": fill,
            "pipeline_steady": steady,
            "dp_allreduce": float(np.mean(core.dp_time)),
            "optimizer": core.opt_s,
            "fixed_overhead": fw.iteration_overhead_s,
        }
        mean_boundary = core.boundary.mean(axis=0)
        memories = []
        stages = []
        for i, st in enumerate(plan.stages):
            reps = [ReplicaMemory(i, r.host, r.gpus, perf.name, core.used[i], perf.usable_bytes,
                                  self.cluster.hosts[h].gpu.memory_bytes)
                    for r, h, perf in zip(st.replicas, core.host_ids[i], core.perfs[i])]
            memories.extend(reps)
            stages.append(StageCost(
                index=i, layers=st.layers, tp=st.tp, dp=st.dp,
                gpu_types=tuple(dict.fromkeys(m.gpu_type for m in reps)),
                hosts=tuple(dict.fromkeys(r.host for r in st.replicas)),
                work=core.works[i],
                p2p_in_s=float(mean_boundary[i - 1]) if i > 0 else 0.0,
                p2p_out_s=float(mean_boundary[i]) if i < p - 1 else 0.0,
                dp_intra_s=core.dp_intra[i], params_per_gpu=core.params[i],
                memory_bytes=core.used[i], usable_bytes=min(m.usable_bytes for m in reps)))
        overflow = tuple(
            f"stage {m.stage} on {m.host} ({m.gpu_type}) needs {m.used_bytes / GIB:.2f} GiB per "
            f"GPU of {m.usable_bytes / GIB:.2f} GiB usable (over by "
            f"{(m.used_bytes - m.usable_bytes) / GIB:.2f} GiB)"
            for m in memories if not m.fits)
        tokens = self.training.global_batch * self.seq_len
        peak = sum(perf.peak_flops * st.tp
                   for st, perfs in zip(plan.stages, core.perfs) for perf in perfs)
        reads = {perf.name: perf.efficiency_key for perfs in core.perfs for perf in perfs
                 if perf.efficiency_key != perf.name}
        uncalibrated = tuple(sorted(reads))
        return Estimate(plan=plan, iter_time=np.broadcast_to(total, (self.num_samples,)).copy(),
                        feasible=not overflow, stages=tuple(stages), memory=tuple(memories),
                        breakdown=breakdown, overflow=overflow, tokens_per_iter=tokens,
                        model_flops_per_iter=self.model_flops_per_iter, peak_flops=peak,
                        samples=self.num_samples, uncalibrated=uncalibrated,
                        uncalibrated_reads=tuple(reads[t] for t in uncalibrated))


# Relative slack of ``score_splits``' cutoff: its bound takes other paths through the same
# arithmetic than the full score, so rows within rounding of the cutoff are scored.
_CUTOFF_SLACK = 1e-9


def _max_over(rows: np.ndarray, per_sample: np.ndarray, op: Any) -> np.ndarray:
    """``op(rows[:, None, :], per_sample[None, :, :]).max(axis=2)`` for ``rows`` (N, C)
    and ``per_sample`` (K, C): one (N, K) pass per column. numpy reduces a short last axis
    element by element, about 7x slower than these passes at C = 5-8, K = 16; the maximum
    is exact, so the result is the same bit for bit."""
    out = op(rows[:, 0, None], per_sample[None, :, 0])
    tmp = np.empty_like(out)
    for j in range(1, rows.shape[1]):
        op(rows[:, j, None], per_sample[None, :, j], out=tmp)
        np.maximum(out, tmp, out=out)
    return out


def _row_max(a: np.ndarray) -> np.ndarray:
    """``a.max(axis=1)`` of an (N, p) array, column by column (see ``_max_over``)."""
    out = a[:, 0].copy()
    for j in range(1, a.shape[1]):
        np.maximum(out, a[:, j], out=out)
    return out


def _row_all(a: np.ndarray) -> np.ndarray:
    """``a.all(axis=1)`` of an (N, p) boolean array, column by column."""
    out = a[:, 0].copy()
    for j in range(1, a.shape[1]):
        np.logical_and(out, a[:, j], out=out)
    return out


def estimate(cluster: Cluster, model: ModelSpec, training: TrainingSpec, plan: Plan, *,
             samples: int = 32, seed: int = 0, constants: CostConstants | None = None,
             bandwidth: np.ndarray | None = None) -> Estimate:
    """Estimate one plan: validates it, draws ``samples`` bandwidth states with ``seed``."""
    cm = CostModel(cluster, model, training, constants=constants, samples=samples, seed=seed,
                   bandwidth=bandwidth)
    return cm.evaluate(plan)
