"""Scoring a plan: ``CostModel`` (a reusable context) and the ``Estimate`` it returns.

A ``CostModel`` binds a cluster, model, training spec, calibrated constants and a fixed
set of K bandwidth states (drawn once from a seeded generator), so that many plans are
compared under the same draws (common random numbers). Everything that depends only on
the plan is plain Python arithmetic; everything that depends on bandwidth is a numpy
operation over the K states at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetpar.cluster.topology import Cluster
from hetpar.costmodel.comm import ring_allreduce_time, sequence_overlaps
from hetpar.costmodel.compute import GpuPerf, StageWork, gpu_perf, stage_work
from hetpar.costmodel.constants import CostConstants, load_constants
from hetpar.costmodel.memory import (in_flight, layer_activation_bytes, logits_bytes,
                                     stage_params_per_gpu)
from hetpar.costmodel.objective import Objective, cvar
from hetpar.costmodel.schedule import one_f_one_b
from hetpar.errors import ConfigError, PlanError
from hetpar.plan import Plan, validate_plan
from hetpar.workload.model import ModelSpec
from hetpar.workload.training import TrainingSpec

__all__ = ["CostModel", "Estimate", "StageCost", "ReplicaMemory", "estimate"]

GIB = 2**30


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

    def value(self, objective: Objective | str = "mean") -> float:
        """The objective's value in seconds; infinite for a plan that does not fit."""
        if not self.feasible:
            return float("inf")
        obj = objective if isinstance(objective, Objective) else Objective.parse(objective)
        return obj(self.iter_time)

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
            "stages": [s.to_dict() for s in self.stages],
            "memory": [{"stage": m.stage, "host": m.host, "gpus": list(m.gpus),
                        "gpu_type": m.gpu_type, "used_gib": m.used_bytes / GIB,
                        "usable_gib": m.usable_bytes / GIB,
                        "headroom_gib": m.headroom_bytes / GIB} for m in self.memory],
            "plan": self.plan.to_dict(),
        }


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
        self.seq_len = training.seq_len or model.seq_len
        self.model = model.with_seq_len(self.seq_len)
        self.constants = constants or load_constants()
        self.framework = self.constants.framework(training.framework)
        if bandwidth is None:
            if samples < 0:
                raise ConfigError("", "samples", f"must not be negative, got {samples}")
            bandwidth = (cluster.mean_link_bandwidth() if samples == 0 else
                         cluster.sample_link_bandwidth(np.random.default_rng(seed), samples))
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
        self._overlap_cache: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}

    # ---- helpers ---------------------------------------------------------------------
    def _host_perf(self, host_idx: int, source: str, where: str) -> GpuPerf:
        perf = self._perf[host_idx]
        if perf is None:
            host = self.cluster.hosts[host_idx]
            raise PlanError(source, where, f"host {host.name!r} has {host.gpu.name}, which "
                                           f"lacks {self.training.precision} support")
        return perf

    def _work(self, perf: GpuPerf, seqs: float, tp: int, layers: int, first: bool,
              last: bool, recompute: str) -> StageWork:
        key = (perf.name, perf.intra_bw, seqs, tp, layers, first, last, recompute)
        work = self._work_cache.get(key)
        if work is None:
            work = stage_work(self.model, self.seq_len, seqs, tp, layers, first, last, recompute,
                              self.training.flash_attention, perf, self.constants,
                              self.framework)
            self._work_cache[key] = work
        return work

    def _overlaps(self, a: int, b: int, total: int) -> list[tuple[int, int, int]]:
        key = (a, b, total)
        out = self._overlap_cache.get(key)
        if out is None:
            out = self._overlap_cache[key] = sequence_overlaps(a, b, total)
        return out

    def _phase(self, loads: dict[int, float]) -> np.ndarray | float:
        """Bottleneck time of concurrent flows given bytes per directed channel."""
        if not loads:
            return 0.0
        chans = np.fromiter(loads.keys(), dtype=np.intp, count=len(loads))
        vols = np.fromiter(loads.values(), dtype=float, count=len(loads))
        return (self.inv_bw[:, chans] * vols).max(axis=1)

    # ---- the model ----------------------------------------------------------------------
    def evaluate(self, plan: Plan, *, validate: bool = True, source: str = "<plan>",
                 allow_empty_stages: bool = False) -> Estimate:
        if validate:
            validate_plan(plan, self.cluster, self.model, self.training, source=source,
                          allow_empty_stages=allow_empty_stages)
        c = self.constants
        fw = self.framework
        model = self.model
        s = self.seq_len
        index = self.cluster.host_index
        routes = self.cluster.routes
        lat = self.cluster.route_latency_s
        mb = self.training.global_batch // plan.micro_batches
        p = plan.num_stages
        k = self.num_samples
        zero = plan.zero == 1
        act_bytes_per_seq = s * model.hidden * 2.0

        stage_s = np.empty(p)
        boundary = np.zeros((k, max(p - 1, 0)))
        works: list[StageWork] = []
        memories: list[ReplicaMemory] = []
        dp_loads: dict[int, float] = {}
        dp_intra = [0.0] * p
        dp_lat = 0.0
        opt_s = 0.0
        host_ids = [[index[r.host] for r in st.replicas] for st in plan.stages]
        for i, st in enumerate(plan.stages):
            first, last = i == 0, i == p - 1
            seqs = mb / st.dp
            slowest: StageWork | None = None
            params = stage_params_per_gpu(model, st.layers, st.tp, first, last)
            states = params * (c.weight_bytes + c.grad_bytes) + params * fw.optimizer_bytes / (
                st.dp if zero else 1)
            act = st.layers * layer_activation_bytes(model, seqs, s, st.tp, plan.recompute,
                                                     self.training.flash_attention)
            act *= in_flight(i, p, plan.micro_batches)
            if plan.recompute == "full" and st.layers:
                # Recomputing a layer materialises its full activations once more.
                act += layer_activation_bytes(model, seqs, s, st.tp, "none",
                                              self.training.flash_attention)
            if last:
                act += logits_bytes(model, seqs, s, st.tp, fw.logits_bytes_per_value)
            used = states + act
            intra_bw = float("inf")
            intra_step = 0.0
            for j, (rep, h) in enumerate(zip(st.replicas, host_ids[i])):
                perf = self._host_perf(h, source, f"stages[{i}].replicas[{j}]")
                work = self._work(perf, seqs, st.tp, st.layers, first, last, plan.recompute)
                if slowest is None or work.total > slowest.total:
                    slowest = work
                memories.append(ReplicaMemory(i, rep.host, rep.gpus, perf.name, used,
                                              perf.usable_bytes,
                                              self.cluster.hosts[h].gpu.memory_bytes))
                opt_s = max(opt_s, params / (st.dp if zero else 1) * c.optimizer_bytes_per_param
                            / perf.hbm)
                intra_bw = min(intra_bw, perf.intra_bw)
                intra_step = max(intra_step, perf.intra_step_s)
            assert slowest is not None
            works.append(slowest)
            stage_s[i] = slowest.total

            if st.dp > 1:
                grad = params * c.grad_bytes
                order: dict[int, int] = {}
                for h in host_ids[i]:
                    order[h] = order.get(h, 0) + 1
                hosts = list(order)
                per_host = max(order.values())
                # Replicas sharing a host reduce over its scale-up link first.
                dp_intra[i] = ring_allreduce_time(grad, per_host, intra_bw, intra_step)
                n = len(hosts)
                if n > 1:
                    ring_bytes = 2.0 * (n - 1) / n * grad * st.tp
                    hop_lat = 0.0
                    for a, b in zip(hosts, hosts[1:] + hosts[:1]):
                        for ch in routes[a][b]:
                            dp_loads[ch] = dp_loads.get(ch, 0.0) + ring_bytes
                        hop_lat = max(hop_lat, lat[a, b])
                    dp_lat = max(dp_lat, 2.0 * (n - 1) * (hop_lat + fw.step_latency_s))

            if not last:
                nxt = plan.stages[i + 1]
                loads: dict[int, float] = {}
                intra_t = 0.0
                hop_lat = 0.0
                copies = st.tp if fw.p2p_copy_per_tp_rank else 1
                lanes = 1 if fw.p2p_copy_per_tp_rank else min(st.tp, nxt.tp)
                for a, b, n_seq in self._overlaps(st.dp, nxt.dp, mb):
                    src, dst = host_ids[i][a], host_ids[i + 1][b]
                    vol = n_seq * act_bytes_per_seq * copies
                    if src == dst:
                        # The tp GPUs send in parallel, each over its own scale-up link.
                        intra_t = max(intra_t, vol / (lanes * copies * intra_bw) + intra_step)
                    else:
                        for ch in routes[src][dst]:
                            loads[ch] = loads.get(ch, 0.0) + vol
                        hop_lat = max(hop_lat, lat[src, dst])
                inter = self._phase(loads)
                if loads:
                    inter = inter + hop_lat + fw.step_latency_s
                # Activations forward and their gradients back: the same volumes mirrored.
                boundary[:, i] = 2.0 * np.maximum(inter, intra_t)

        if fw.tied_embedding_sync and model.tied_embeddings and p > 1:
            # Megatron all-reduces the tied embedding's gradient between first and last stage.
            emb = model.vocab * model.hidden * c.grad_bytes
            for a, b in zip(host_ids[0], host_ids[-1]):
                if a != b:
                    for x, y in ((a, b), (b, a)):
                        for ch in routes[x][y]:
                            dp_loads[ch] = dp_loads.get(ch, 0.0) + emb
                    dp_lat = max(dp_lat, 2.0 * (lat[a, b] + fw.step_latency_s))

        pipe, cycle = one_f_one_b(stage_s, boundary, plan.micro_batches)
        dp_inter = self._phase(dp_loads)
        dp_time = max(dp_intra) + dp_inter + (dp_lat if dp_loads else 0.0)
        total = pipe + dp_time + opt_s + fw.iteration_overhead_s
        total = np.broadcast_to(total, (k,)).astype(float)

        fill = float(stage_s.sum() + boundary.sum(axis=1).mean())
        breakdown = {
            "pipeline_fill": fill,
            "pipeline_steady": float((plan.micro_batches - 1) * cycle.mean()),
            "dp_allreduce": float(np.mean(dp_time)),
            "optimizer": opt_s,
            "fixed_overhead": fw.iteration_overhead_s,
        }
        mean_boundary = boundary.mean(axis=0) if p > 1 else np.zeros(0)
        stages = tuple(
            StageCost(
                index=i, layers=st.layers, tp=st.tp, dp=st.dp,
                gpu_types=tuple(dict.fromkeys(m.gpu_type for m in memories if m.stage == i)),
                hosts=tuple(dict.fromkeys(r.host for r in st.replicas)),
                work=works[i],
                p2p_in_s=float(mean_boundary[i - 1]) if i > 0 else 0.0,
                p2p_out_s=float(mean_boundary[i]) if i < p - 1 else 0.0,
                dp_intra_s=dp_intra[i],
                params_per_gpu=stage_params_per_gpu(model, st.layers, st.tp, i == 0, i == p - 1),
                memory_bytes=max(m.used_bytes for m in memories if m.stage == i),
                usable_bytes=min(m.usable_bytes for m in memories if m.stage == i),
            )
            for i, st in enumerate(plan.stages))
        overflow = tuple(
            f"stage {m.stage} on {m.host} ({m.gpu_type}) needs {m.used_bytes / GIB:.2f} GiB per "
            f"GPU of {m.usable_bytes / GIB:.2f} GiB usable (over by "
            f"{(m.used_bytes - m.usable_bytes) / GIB:.2f} GiB)"
            for m in memories if not m.fits)
        tokens = self.training.global_batch * s
        flops_per_token = 3.0 * (model.layers * model.layer_fwd_flops_per_token(s)
                                 + model.head_fwd_flops_per_token)
        peak = sum(self._perf[h].peak_flops * st.tp  # type: ignore[union-attr]
                   for st, hs in zip(plan.stages, host_ids) for h in hs)
        return Estimate(plan=plan, iter_time=total, feasible=not overflow, stages=stages,
                        memory=tuple(memories), breakdown=breakdown, overflow=overflow,
                        tokens_per_iter=tokens, model_flops_per_iter=flops_per_token * tokens,
                        peak_flops=peak, samples=k)


def estimate(cluster: Cluster, model: ModelSpec, training: TrainingSpec, plan: Plan, *,
             samples: int = 32, seed: int = 0, constants: CostConstants | None = None,
             bandwidth: np.ndarray | None = None) -> Estimate:
    """Estimate one plan: validates it, draws ``samples`` bandwidth states with ``seed``."""
    cm = CostModel(cluster, model, training, constants=constants, samples=samples, seed=seed,
                   bandwidth=bandwidth)
    return cm.evaluate(plan)
