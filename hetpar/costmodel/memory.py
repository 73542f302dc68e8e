"""Per-GPU memory: model states, activations (Korthikanti et al., 2022) and logits.

Activation bytes per transformer layer for ``b`` sequences of length ``s`` with
tensor-parallel degree ``t`` (2-byte values, no sequence parallelism):

* ``none``:      s b (10 h + A / t) + 5 a s^2 b / t     (the s^2 term vanishes with flash attention)
* ``selective``: s b (10 h + A / t)                      (attention core recomputed)
* ``full``:      2 s b h                                 (only the layer input is kept)

where ``A = 4 h + 4 h_kv + c f`` bytes per token are the tensor-split activations
(Q, K, V, attention output, MLP intermediates; ``c`` = 4 for GeLU, 6 for SwiGLU), which
gives Korthikanti's 24 h for GPT (h_kv = h, f = 4 h).

``stage_bytes`` adds them up for one GPU of a stage and ``gpu_usable_bytes`` is what a GPU
offers: the one statement of what fits, used by the cost model
(``CostModel.stage_memory``) and by the suite generator's fit check alike.
"""

from __future__ import annotations

from typing import Any

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
                           flash: bool) -> float:
    """Bytes one layer keeps for backward, per micro-batch of ``seqs`` sequences."""
    tokens = seqs * seq_len
    if mode == "full":
        return 2.0 * tokens * model.hidden
    base = tokens * (10.0 * model.hidden + split_activation_bytes_per_token(model) / tp)
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


def in_flight(stage: int, num_stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once under 1F1B."""
    return min(num_stages - stage, micro_batches)


def logits_bytes(model: ModelSpec, seqs: float, seq_len: int, tp: int,
                 bytes_per_value: float) -> float:
    """Logits, their fp32 copy for the loss and the logit gradients on the last stage."""
    return seqs * seq_len * model.vocab / tp * bytes_per_value


def stage_bytes(model: ModelSpec, seq_len: int, layers: Any, tp: int, dp: int, seqs: float,
                inflight: int, first: bool, last: bool, recompute: str, zero: bool, *,
                flash: bool, constants: CostConstants, framework: FrameworkConstants,
                ) -> tuple[Any, Any]:
    """(parameters per GPU, peak bytes per GPU) of a stage of ``layers`` layers on ``tp``
    GPUs per replica and ``dp`` replicas, with micro-batches of ``seqs`` sequences of which
    it holds ``inflight`` at once under 1F1B: model states (optimizer states sharded over
    the replicas under ZeRO-1), activations, the layer a full recomputation materialises
    and the last stage's logits. ``layers`` may be an int or an array of counts
    (elementwise the same arithmetic, so the same values)."""
    c, fw = constants, framework
    params = stage_params_per_gpu(model, layers, tp, first, last)
    states = params * (c.weight_bytes + c.grad_bytes) + params * fw.optimizer_bytes / (
        dp if zero else 1)
    act = layers * layer_activation_bytes(model, seqs, seq_len, tp, recompute, flash) * inflight
    if recompute == "full":
        # Recomputing a layer materialises its full activations once more.
        act = act + (layers > 0) * layer_activation_bytes(model, seqs, seq_len, tp, "none",
                                                          flash)
    if last:
        act = act + logits_bytes(model, seqs, seq_len, tp, fw.logits_bytes_per_value)
    return params, states + act


def gpu_usable_bytes(gpu: GpuType, framework: FrameworkConstants) -> float:
    """Bytes of one GPU a plan may fill: its memory less fragmentation and the framework's
    reserve; never negative (a GPU smaller than the reserve holds nothing: no plan fits)."""
    return max(0.0, gpu.memory_bytes * (1.0 - framework.fragmentation) - framework.reserve_bytes)
