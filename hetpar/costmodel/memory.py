"""Per-GPU memory: model states, activations (Korthikanti et al., 2022) and logits.

Activation bytes per transformer layer for ``b`` sequences of length ``s`` with
tensor-parallel degree ``t`` (2-byte values, no sequence parallelism):

* ``none``:      s b (10 h + A / t) + 5 a s^2 b / t     (the s^2 term vanishes with flash attention)
* ``selective``: s b (10 h + A / t)                      (attention core recomputed)
* ``full``:      2 s b h                                 (only the layer input is kept)

Sequence parallelism splits the LayerNorm and dropout activations (the 10 h) and the
layer input kept by full recomputation over the TP group as well: s b (10 h + A) / t,
and 2 s b h / t (Korthikanti et al., 2022, Table 2: 34 s b h / t for GPT).

where ``A = 4 h + 4 h_kv + c f`` bytes per token are the tensor-split activations
(Q, K, V, attention output, MLP intermediates; ``c`` = 4 for GeLU, 6 for SwiGLU), which
gives Korthikanti's 24 h for GPT (h_kv = h, f = 4 h).

``stage_bytes`` adds them up for one GPU of a stage and ``gpu_usable_bytes`` is what a GPU
offers: the one statement of what fits, used by the cost model
(``CostModel.stage_memory``) and by the suite generator's fit check alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetpar.cluster.gpu import GpuType
from hetpar.costmodel.constants import CostConstants, FrameworkConstants
from hetpar.workload.model import ModelSpec

__all__ = ["layer_activation_bytes", "stage_params_per_gpu", "in_flight", "logits_bytes",
           "attention_score_bytes", "stage_bytes", "gpu_usable_bytes"]


def split_activation_bytes_per_token(model: ModelSpec) -> float:
    mlp = 6 if model.gated else 4
    return 4.0 * model.hidden + 4.0 * model.kv_dim + mlp * model.ffn_hidden


def attention_score_bytes(model: ModelSpec, seqs: float, seq_len: int, tp: int) -> float:
    """Softmax output, its dropout mask and dropout output: 5 a s^2 b / t bytes."""
    return 5.0 * model.heads * seq_len * seq_len * seqs / tp


def layer_activation_bytes(model: ModelSpec, seqs: float, seq_len: int, tp: int, mode: str,
                           flash: bool, sp: bool = False) -> float:
    """Bytes one layer keeps for backward, per micro-batch of ``seqs`` sequences
    (``sp``: with sequence parallelism)."""
    tokens = seqs * seq_len
    if mode == "full":
        return 2.0 * tokens * model.hidden / (tp if sp else 1)
    base = tokens * (10.0 * model.hidden / (tp if sp else 1)
                     + split_activation_bytes_per_token(model) / tp)
    if mode == "selective" or flash:
        return base
    return base + attention_score_bytes(model, seqs, seq_len, tp)


def stage_params_per_gpu(model: ModelSpec, layers: int, tp: int, first: bool, last: bool) -> float:
    """Parameters one GPU of a stage holds (embedding on the first stage, head on the last)."""
    params = layers * model.params_per_layer / tp
    if first:
        params += model.embedding_params / tp
    if last:
        params += model.final_norm_params
        # A tied head shares the embedding when both sit on the same stage.
        if not (first and model.tied_embeddings):
            params += model.head_params / tp
    return params


def in_flight(stage: int, num_stages: int, micro_batches: int, virtual: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at once under 1F1B; with
    ``virtual`` > 1 chunks per stage (interleaved 1F1B), in whole-stage units: Megatron-LM
    runs 2 (p - i - 1) + (v - 1) p warm-up chunk passes, then holds one more, each chunk
    1/v of the stage's layers, so stage 0 holds p + (p - 1) / v micro-batches: the
    (1 + (p - 1) / (p v)) factor of Korthikanti et al. (2022), section 4.2.3."""
    if virtual == 1:
        return min(num_stages - stage, micro_batches)
    chunks = 2 * (num_stages - stage - 1) + (virtual - 1) * num_stages + 1
    return min(chunks, micro_batches * virtual) / virtual


def logits_bytes(model: ModelSpec, seqs: float, seq_len: int, tp: int,
                 bytes_per_value: float) -> float:
    """Logits, their fp32 copy for the loss and the logit gradients on the last stage."""
    return seqs * seq_len * model.vocab / tp * bytes_per_value


def stage_bytes(model: ModelSpec, seq_len: int, layers: Any, tp: int, dp: int, seqs: float,
                inflight: float, first: bool, last: bool, recompute: str, zero: int, *,
                flash: bool, constants: CostConstants, framework: FrameworkConstants,
                sp: bool = False, gathered: bool = True, offload: bool = False,
                ) -> tuple[Any, Any]:
    """(parameters per GPU, peak bytes per GPU) of a stage of ``layers`` layers on ``tp``
    GPUs per replica and ``dp`` replicas, with micro-batches of ``seqs`` sequences of which
    it holds ``inflight`` at once under 1F1B: model states (sharded over the replicas:
    optimizer states from ZeRO-1, gradients from ZeRO-2, weights from ZeRO-3, which then
    gathers two layers' weights, the one computing and the one prefetched, and holds one
    layer's full gradients before they are reduce-scattered: so ZeRO-3 never needs more
    than ZeRO-1, nor ZeRO-1 more than ZeRO-0), activations (``sp``: with
    sequence parallelism), the layer a full recomputation materialises and the last
    stage's logits. ``layers`` may be an int or an array of counts (elementwise the same
    arithmetic, so the same values). ``gathered=False`` leaves out ZeRO-3's gathered layers:
    a lower bound affine in ``layers`` from one layer on, what the searchers' memory bounds
    need (the gathered part stops growing at two layers). ``offload``: the optimizer
    states live in host memory (optimizer offload), so none of their bytes are on the GPU;
    weights and gradients stay as without it."""
    c, fw = constants, framework
    params = stage_params_per_gpu(model, layers, tp, first, last)
    optimizer = 0.0 if offload else fw.optimizer_bytes
    if zero < 2:
        states = params * (c.weight_bytes + c.grad_bytes) + params * optimizer / (
            dp if zero else 1)
    else:
        weights = params * c.weight_bytes / (dp if zero >= 3 else 1)
        states = weights + params * (c.grad_bytes + optimizer) / dp
        if zero >= 3 and gathered:
            # Of a gathered layer a GPU already holds its own 1/dp shard.
            layer = model.params_per_layer / tp * (1.0 - 1.0 / dp)
            states = states + layer * (np.minimum(layers, 2) * c.weight_bytes
                                       + np.minimum(layers, 1) * c.grad_bytes)
    act = layers * layer_activation_bytes(model, seqs, seq_len, tp, recompute, flash,
                                          sp) * inflight
    if recompute == "full":
        # Recomputing a layer materialises its full activations once more.
        act = act + (layers > 0) * layer_activation_bytes(model, seqs, seq_len, tp, "none",
                                                          flash, sp)
    if last:
        act = act + logits_bytes(model, seqs, seq_len, tp, fw.logits_bytes_per_value)
    return params, states + act


def gpu_usable_bytes(gpu: GpuType, framework: FrameworkConstants) -> float:
    """Bytes of one GPU a plan may fill: its memory less fragmentation and the framework's
    reserve; never negative (a GPU smaller than the reserve holds nothing: no plan fits)."""
    return max(0.0, gpu.memory_bytes * (1.0 - framework.fragmentation) - framework.reserve_bytes)
