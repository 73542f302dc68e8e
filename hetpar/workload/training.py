"""Training settings: batch, precision and which memory-saving options a plan may use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpar.configio import Reader, load_document, resolve_config
from hetpar.limits import MAX_GLOBAL_BATCH, MAX_SEQ_LEN

__all__ = ["TrainingSpec", "load_training", "parse_training", "RECOMPUTE_MODES",
           "OFFLOAD_MODES"]

RECOMPUTE_MODES = ("none", "selective", "full")
# What a plan's ``offload`` may be: the optimizer states and step on the GPU or the host.
OFFLOAD_MODES = ("none", "optimizer")


@dataclass(frozen=True)
class TrainingSpec:
    """``global_batch`` is in sequences; ``seq_len`` (if set) overrides the model's.

    ``recompute_modes`` and ``zero_stages`` are the options plans may choose from;
    ``sequence_parallel`` lets them use Megatron-LM's sequence parallelism, which the
    searchers then turn on in every plan with a tensor-parallel stage (it is never slower
    and never needs more memory in the cost model); ``virtual_stages`` the chunk counts of
    the interleaved 1F1B schedule they may use (1, plain 1F1B, always);
    ``offload_modes`` the optimizer offload modes they may use (``none`` always; with
    ``optimizer``, the exact search and Metis end their memory ladders with it:
    ``plan.offload``); ``flash_attention`` drops the s^2 attention activations and their
    memory traffic;
    ``framework`` selects the calibrated framework constants (configs/calibration.yaml).
    """

    global_batch: int
    seq_len: int | None = None
    precision: str = "fp16"
    recompute_modes: tuple[str, ...] = RECOMPUTE_MODES
    zero_stages: tuple[int, ...] = (0, 1)
    flash_attention: bool = False
    sequence_parallel: bool = False
    virtual_stages: tuple[int, ...] = (1,)
    offload_modes: tuple[str, ...] = ("none",)
    framework: str = "megatron-lm"
    name: str = "training"

    def __post_init__(self) -> None:
        # Plain 1F1B is always a plan's option; the searchers rely on 1 coming first.
        object.__setattr__(self, "virtual_stages", tuple(sorted({1, *self.virtual_stages})))
        object.__setattr__(self, "offload_modes", tuple(
            m for m in OFFLOAD_MODES if m == "none" or m in self.offload_modes))

    @property
    def bytes_per_value(self) -> int:
        return 2


_KEYS = frozenset({"name", "description", "global_batch", "seq_len", "precision", "recompute",
                   "zero", "flash_attention", "framework", "sequence_parallel",
                   "virtual_stages", "offload"})


def _int_list(r: Reader, key: str, default: list[int], allowed: range, what: str,
              ) -> list[int]:
    """A list of integers from ``allowed`` (a single one accepted), or one error line."""
    raw = r.raw(key, default)
    values = [raw] if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(values, list) or not values or any(
            not isinstance(v, int) or isinstance(v, bool) or v not in allowed for v in values):
        raise r.error(key, f"expected {what}, got {values!r}")
    return values


def parse_training(data: Any, source: str = "<dict>") -> TrainingSpec:
    r = Reader.of(data, source)
    r.check_keys(_KEYS)
    r.str("description", "")  # free text, but text
    modes = r.raw("recompute", list(RECOMPUTE_MODES))
    modes = [modes] if isinstance(modes, str) else modes
    if not isinstance(modes, list) or not modes or any(m not in RECOMPUTE_MODES for m in modes):
        raise r.error("recompute", f"expected a list drawn from {', '.join(RECOMPUTE_MODES)}, "
                                   f"got {r.raw('recompute')!r}")
    zero = _int_list(r, "zero", [0, 1], range(4),
                     "a list drawn from 0 (off), 1 (ZeRO-1: optimizer states sharded), 2 (and "
                     "gradients) and 3 (and weights, as FSDP)")
    virtual = _int_list(r, "virtual_stages", [1], range(1, 65),
                        "a list of chunk counts per stage (1 to 64) for the interleaved "
                        "schedule")
    offload = r.raw("offload", ["none"])
    offload = [offload] if isinstance(offload, str) else offload
    if not isinstance(offload, list) or not offload or any(m not in OFFLOAD_MODES
                                                           for m in offload):
        raise r.error("offload", f"expected a list drawn from {', '.join(OFFLOAD_MODES)} "
                                 f"(activation offload is not modelled), got {offload!r}")
    seq_len = r.int("seq_len", None, minimum=1, maximum=MAX_SEQ_LEN)
    return TrainingSpec(
        global_batch=r.int("global_batch", minimum=1, maximum=MAX_GLOBAL_BATCH,
                           why=" sequences (hetpar.limits.MAX_GLOBAL_BATCH)"),
        seq_len=seq_len,
        precision=r.choice("precision", ("fp16", "bf16"), "fp16"),
        recompute_modes=tuple(dict.fromkeys(modes)),
        zero_stages=tuple(sorted(set(zero))),
        flash_attention=r.bool("flash_attention", False),
        sequence_parallel=r.bool("sequence_parallel", False),
        virtual_stages=tuple(virtual),
        offload_modes=tuple(offload),
        framework=r.str("framework", "megatron-lm"),
        name=r.str("name", Path(source).stem if source != "<dict>" else "training"),
    )


def load_training(path_or_dict: str | Path | dict[str, Any] | None = None) -> TrainingSpec:
    """A training file, a bundled one by name, a dict, or (None) the bundled default."""
    if isinstance(path_or_dict, dict):
        return parse_training(path_or_dict)
    path = resolve_config(path_or_dict or "default", "training")
    return parse_training(load_document(path), str(path))
