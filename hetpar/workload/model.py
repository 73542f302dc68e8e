"""Transformer model specs and the per-layer parameter and FLOP counts derived from them.

Counts follow Narayanan et al. (SC 2021) for GPT and generalise to grouped-query
attention (``kv_heads < heads``) and gated (SwiGLU) MLPs, as in Llama.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from hetpar.configio import Reader, load_document, resolve_config
from hetpar.limits import MAX_LAYERS, MAX_MODEL_DIM, MAX_SEQ_LEN, MAX_VOCAB

__all__ = ["ModelSpec", "load_model", "parse_model"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    mlp: str = "gelu"  # gelu | swiglu
    position: str = "learned"  # learned | rope
    norm: str = "layernorm"  # layernorm | rmsnorm
    tied_embeddings: bool = True
    bias: bool = True

    @cached_property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @cached_property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @cached_property
    def gated(self) -> bool:
        return self.mlp == "swiglu"

    @cached_property
    def matmul_params_per_layer(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        return h * (h + 2 * self.kv_dim) + h * h + (3 if self.gated else 2) * h * f

    @cached_property
    def params_per_layer(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        bias = (h + 2 * self.kv_dim) + h + (2 if self.gated else 1) * f + h if self.bias else 0
        norms = 2 * (2 * h if self.norm == "layernorm" else h)
        return self.matmul_params_per_layer + bias + norms

    @cached_property
    def embedding_params(self) -> int:
        pos = self.seq_len * self.hidden if self.position == "learned" else 0
        return self.vocab * self.hidden + pos

    @cached_property
    def head_params(self) -> int:
        """LM head weights (a separate copy on the last stage even when tied, as Megatron)."""
        return self.vocab * self.hidden

    @cached_property
    def final_norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    @cached_property
    def total_params(self) -> int:
        head = 0 if self.tied_embeddings else self.head_params
        return (self.layers * self.params_per_layer + self.embedding_params + head
                + self.final_norm_params)

    def layer_fwd_flops_per_token(self, seq_len: int | None = None) -> float:
        """Matmul FLOPs of one layer's forward pass per token (attention scores included)."""
        s = seq_len or self.seq_len
        return 2.0 * self.matmul_params_per_layer + 4.0 * s * self.hidden

    @cached_property
    def head_fwd_flops_per_token(self) -> float:
        return 2.0 * self.hidden * self.vocab

    def with_seq_len(self, seq_len: int | None) -> ModelSpec:
        return self if seq_len is None or seq_len == self.seq_len else replace(self, seq_len=seq_len)

    def summary(self) -> str:
        return (f"{self.name}: {self.total_params / 1e9:.2f}B params, {self.layers} layers, "
                f"h={self.hidden}, heads={self.heads}/{self.kv_heads} kv, ffn={self.ffn_hidden}, "
                f"V={self.vocab}, s={self.seq_len}")


_KEYS = frozenset({"name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                   "seq_len", "mlp", "position", "norm", "tied_embeddings", "bias",
                   "description", "source", "params_B"})


def parse_model(data: Any, source: str = "<dict>") -> ModelSpec:
    r = Reader.of(data, source)
    r.check_keys(_KEYS)
    r.str("description", ""), r.str("source", "")  # free text, but text
    hidden = r.int("hidden", minimum=1, maximum=MAX_MODEL_DIM)
    heads = r.int("heads", minimum=1, maximum=MAX_MODEL_DIM)
    if hidden % heads:
        raise r.error("heads", f"hidden size {hidden} is not divisible by {heads} heads")
    kv_heads = r.int("kv_heads", heads, minimum=1)
    if heads % kv_heads:
        raise r.error("kv_heads", f"{heads} heads are not divisible into {kv_heads} KV groups")
    mlp = r.choice("mlp", ("gelu", "swiglu"), "gelu")
    spec = ModelSpec(
        name=r.str("name", Path(source).stem),
        layers=r.int("layers", minimum=1, maximum=MAX_LAYERS),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=r.int("ffn_hidden", 4 * hidden, minimum=1, maximum=4 * MAX_MODEL_DIM),
        vocab=r.int("vocab", minimum=1, maximum=MAX_VOCAB),
        seq_len=r.int("seq_len", minimum=1, maximum=MAX_SEQ_LEN),
        mlp=mlp,
        position=r.choice("position", ("learned", "rope"), "learned"),
        norm=r.choice("norm", ("layernorm", "rmsnorm"), "layernorm"),
        tied_embeddings=r.bool("tied_embeddings", True),
        bias=r.bool("bias", True),
    )
    if r.has("params_B"):
        # A stated size guards against typos in the architecture numbers.
        stated = r.number("params_B", positive=True) * 1e9
        if abs(spec.total_params - stated) > 0.1 * stated:
            raise r.error("params_B", f"states {stated / 1e9:.2f}B but the architecture gives "
                                      f"{spec.total_params / 1e9:.2f}B parameters")
    return spec


def load_model(path_or_name: str | Path) -> ModelSpec:
    """Load a model file, or a bundled model by name (``gpt2-medium``, ``llama2-7b``)."""
    path = resolve_config(path_or_name, "models")
    return parse_model(load_document(path), str(path))
