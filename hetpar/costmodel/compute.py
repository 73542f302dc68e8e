"""Compute time of a pipeline stage's work for one micro-batch on one GPU type.

Matmul FLOPs run at ``gemm_efficiency`` x peak; memory-bound work (norms, softmax,
dropout, activations, the loss) streams bytes at ``hbm_efficiency`` x HBM bandwidth; and
every pass of a layer pays the framework's fixed cost per micro-batch (kernel launches,
framework code). That fixed cost is what makes small per-GPU matrices run further from
peak: the effective efficiency of a layer, ``F / (peak * time)``, falls as ``F``
shrinks, and sooner on a faster GPU. Backward costs twice the forward; recomputation
adds the forward it repeats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from hetpar.cluster.topology import Host
from hetpar.costmodel.comm import ring_allreduce_time
from hetpar.costmodel.constants import CostConstants, FrameworkConstants
from hetpar.costmodel.memory import (attention_score_bytes, gpu_usable_bytes,
                                     layer_activation_bytes)
from hetpar.costmodel.offload import HOST_OPTIMIZER_GBPS
from hetpar.workload.model import ModelSpec

__all__ = ["GpuPerf", "StageWork", "gpu_perf", "stage_work"]


@dataclass(frozen=True)
class GpuPerf:
    """Effective rates of one host's GPUs under the calibrated constants."""

    name: str
    flops: float  # FLOP/s of large matmuls
    hbm: float  # bytes/s of memory-bound kernels
    intra_bw: float  # bytes/s per GPU per direction over the host's scale-up link
    intra_step_s: float  # latency of one collective step inside the host
    usable_bytes: float  # memory a plan may fill
    peak_flops: float
    # Optimizer offload (costmodel/offload.py): bytes/s per direction of the GPU's PCIe
    # link to its host, and of host memory for its share of the CPU optimizer step.
    host_bw: float = math.inf
    cpu_optimizer_bw: float = math.inf
    # The calibration entry its efficiencies come from (``CostConstants.gpu_key``).
    efficiency_key: str = "default"


def gpu_perf(host: Host, precision: str, c: CostConstants, fw: FrameworkConstants) -> GpuPerf:
    key = c.gpu_key(host.gpu.name, host.gpu.architecture)
    eff = c.gpu[key]
    peak = host.gpu.peak_flops(precision)
    return GpuPerf(
        name=host.gpu.name,
        flops=peak * eff.gemm,
        hbm=host.gpu.hbm_GBps * 1e9 * eff.hbm,
        intra_bw=host.intra_GBps * 1e9 * c.intra_efficiency.get(host.intra_kind, 0.6),
        intra_step_s=host.intra_latency_s + fw.step_latency_s,
        usable_bytes=gpu_usable_bytes(host.gpu, fw),
        peak_flops=peak,
        host_bw=host.gpu.pcie_GBps * 1e9,
        cpu_optimizer_bw=HOST_OPTIMIZER_GBPS * 1e9 / max(1, host.num_gpus),
        efficiency_key=key,
    )


@dataclass(frozen=True)
class StageWork:
    """Seconds one replica spends per micro-batch (forward + backward + extras)."""

    fwd: float
    bwd: float
    recompute: float
    tp_comm: float
    overhead: float

    @cached_property
    def total(self) -> float:
        return self.fwd + self.bwd + self.recompute + self.tp_comm + self.overhead


def stage_work(model: ModelSpec, seq_len: int, seqs: float, tp: int, layers: int, first: bool,
               last: bool, recompute: str, flash: bool, perf: GpuPerf,
               c: CostConstants, fw: FrameworkConstants, *, sp: bool = False,
               chunks: int = 1, cp: int = 1) -> StageWork:
    """``sp``: sequence parallelism (the LayerNorm and dropout work split over the TP group
    too; its reduce-scatter and all-gather move what the all-reduce moved); ``chunks``:
    virtual stages, each pass of a micro-batch through one paying the per-micro-batch cost;
    ``cp``: context parallelism, ``seqs`` then being this GPU's share of the micro-batch's
    sequences over every GPU of its data- and context-parallel groups (its tokens: the
    compute, activations and attention are those of that many whole sequences)."""
    tokens = seqs * seq_len
    h = model.hidden
    mm_flops = tokens * 2.0 * model.matmul_params_per_layer / tp
    attn_flops = tokens * 4.0 * seq_len * h / tp
    stream = c.elementwise_traffic * layer_activation_bytes(model, seqs, seq_len, tp, "none",
                                                            flash, sp)
    layer_fwd = (mm_flops + attn_flops) / perf.flops + stream / perf.hbm
    passes = 3.0  # forward, and a backward that launches twice the kernels
    if recompute == "full":
        layer_rc = layer_fwd
        passes = 4.0
    elif recompute == "selective":
        scores = 0.0 if flash else attention_score_bytes(model, seqs, seq_len, tp)
        layer_rc = attn_flops / perf.flops + c.elementwise_traffic * scores / perf.hbm
    else:
        layer_rc = 0.0
    fwd = layers * layer_fwd
    bwd = 2.0 * fwd
    overhead = layers * passes * fw.layer_overhead_s + chunks * fw.microbatch_overhead_s

    # Megatron: two all-reduces of the layer output in forward, two in backward, and the
    # forward's two again when the whole layer is recomputed.
    n_allreduce = 6 if recompute == "full" else 4
    act_bytes = tokens * h * 2.0
    tp_comm = layers * n_allreduce * ring_allreduce_time(act_bytes, tp, perf.intra_bw,
                                                         perf.intra_step_s)
    if cp > 1:
        # Ring attention (Megatron-core's p2p context parallelism): each GPU passes its
        # keys and values around the group's ring, cp - 1 hops forward and again with their
        # gradients backward (three transfers' worth), over the host's scale-up link,
        # overlapped with the attention it computes meanwhile: only the excess is exposed.
        kv_bytes = tokens * 2.0 * model.kv_dim * 2.0 / tp
        hops = 3.0 * (cp - 1)
        ring = hops * (kv_bytes / perf.intra_bw + perf.intra_step_s)
        attention = 3.0 * attn_flops / perf.flops
        tp_comm = tp_comm + layers * max(0.0, ring - attention)
    if first:
        emb = c.elementwise_traffic * tokens * h * 2.0 / perf.hbm
        fwd += emb
        bwd += 2.0 * emb
    if last:
        head_flops = tokens * model.head_fwd_flops_per_token / tp
        loss_stream = tokens * model.vocab / tp * fw.logits_bytes_per_value / perf.hbm
        fwd += head_flops / perf.flops + loss_stream
        bwd += 2.0 * head_flops / perf.flops + loss_stream
    return StageWork(fwd, bwd, layers * layer_rc, tp_comm, overhead)
