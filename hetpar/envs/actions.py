"""The flat action space of ``PlanBuilder-v0``: which index means which decision."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

__all__ = ["ActionLayout", "RECOMPUTE_MODES", "ZERO_STAGES", "KINDS"]

RECOMPUTE_MODES = ("none", "selective", "full")
ZERO_STAGES = (0, 1)
# In index order: memory options, micro-batch count, open a stage with a TP degree, add a
# TP block from a host, close the stage with a number of layers.
KINDS = ("memory", "micro_batches", "tp", "host", "layers")


@dataclass(frozen=True)
class ActionLayout:
    """Index ranges of the five decision kinds in one ``Discrete`` space.

    * ``memory``: one slot per (recompute mode, ZeRO stage) pair;
    * ``micro_batches``: slot ``i`` is the ``i``-th smallest divisor of the global batch;
    * ``tp``: slot ``i`` opens a stage with tensor-parallel degree ``2**i``;
    * ``host``: slot ``h`` adds a TP block of the open stage from host ``h``;
    * ``layers``: slot ``k - 1`` closes the open stage with ``k`` layers.
    """

    max_hosts: int
    max_micro: int = 16
    max_tp_log2: int = 4
    max_layers: int = 128

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        return (len(RECOMPUTE_MODES) * len(ZERO_STAGES), self.max_micro, self.max_tp_log2 + 1,
                self.max_hosts, self.max_layers)

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        out, acc = [], 0
        for n in self.sizes:
            out.append(acc)
            acc += n
        return tuple(out)

    @cached_property
    def n(self) -> int:
        return sum(self.sizes)

    def start(self, kind: str) -> int:
        return self.offsets[KINDS.index(kind)]

    def decode(self, action: int) -> tuple[str, int]:
        """(kind, slot within the kind) of a flat action index."""
        if not 0 <= action < self.n:
            raise ValueError(f"action {action} outside 0..{self.n - 1}")
        for kind, off, size in zip(KINDS, self.offsets, self.sizes):
            if action < off + size:
                return kind, action - off
        raise AssertionError("unreachable")

    # ---- encoders ------------------------------------------------------------------------
    def memory(self, recompute: str, zero: int) -> int:
        return self.start("memory") + RECOMPUTE_MODES.index(recompute) * len(ZERO_STAGES) + \
            ZERO_STAGES.index(zero)

    @staticmethod
    def memory_option(slot: int) -> tuple[str, int]:
        return RECOMPUTE_MODES[slot // len(ZERO_STAGES)], ZERO_STAGES[slot % len(ZERO_STAGES)]

    def micro(self, slot: int) -> int:
        return self.start("micro_batches") + slot

    def tp(self, tp: int) -> int:
        return self.start("tp") + tp.bit_length() - 1

    def host(self, h: int) -> int:
        return self.start("host") + h

    def layers(self, k: int) -> int:
        return self.start("layers") + k - 1
