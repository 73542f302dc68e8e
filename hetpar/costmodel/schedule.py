"""Pipeline schedule: one-forward-one-backward (1F1B, PipeDream-Flush / Megatron).

Stage ``i`` needs ``t_i`` seconds of forward plus backward work per micro-batch;
boundary ``b`` (between stages b and b+1) needs ``c_b`` seconds to send a micro-batch's
activations forward and their gradients back. Transfers are blocking in Megatron's
non-interleaved 1F1B, so in the steady state a stage's cycle is its work plus its
transfers, ``u_i = t_i + c_{i-1} + c_i``. The first micro-batch crosses every stage and
boundary once and the other M - 1 follow at the pace of the slowest cycle:

    T = sum_i t_i + sum_b c_b + (M - 1) * max_i u_i

which for p identical stages without communication is the textbook (M + p - 1) t.

Interleaved 1F1B (Narayanan et al., 2021) cuts each stage's layers into ``v`` chunks
placed round-robin, so a micro-batch crosses every boundary ``v`` times and the wrap from
the last stage back to the first ``v - 1`` times per pass; in the steady state a stage's
cycle is ``u_i = t_i + v (c_{i-1} + c_i)``, plus ``(v - 1) c_w`` on the first and last
stage. The warm-up and cool-down run in chunks of 1/v of a stage's work, which divides
the bubble by ``v``:

    T = M max_i u_i + (F - max_i u_i) / v,   F = sum_i t_i + v sum_b c_b + (v - 1) c_w

(``F``, one micro-batch's trip through every chunk). At ``v = 1`` this is the form above;
for identical stages without communication it is Megatron-LM's (M + (p - 1) / v) t.
Transfers stay blocking, as in the calibrated non-interleaved schedule.
"""

from __future__ import annotations

import numpy as np

__all__ = ["cycle_transfers", "interleaved_transfers", "one_f_one_b", "pipeline_total"]


def cycle_transfers(boundary_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The schedule's transfer terms: ((k, p) ``c_{i-1} + c_i`` of each stage's cycle,
    (k,) ``sum_b c_b``), from ``boundary_s`` (k, p-1)."""
    k, p = boundary_s.shape[0], boundary_s.shape[1] + 1
    padded = np.zeros((k, p + 1))
    padded[:, 1:p] = boundary_s
    return padded[:, :-1] + padded[:, 1:], boundary_s.sum(axis=1)


def interleaved_transfers(boundary_s: np.ndarray, wrap_s: np.ndarray, virtual: int,
                          ) -> tuple[np.ndarray, np.ndarray]:
    """``cycle_transfers`` under ``virtual`` chunks per stage: ((k, p) the transfers of
    each stage's cycle, (k,) the transfers of one micro-batch's trip through every chunk),
    with ``wrap_s`` (k,) the round trip from the last stage back to the first."""
    transfers, crossing = cycle_transfers(boundary_s)
    if virtual == 1:
        return transfers, crossing
    transfers = virtual * transfers
    transfers[:, 0] += (virtual - 1) * wrap_s
    transfers[:, -1] += (virtual - 1) * wrap_s
    return transfers, virtual * crossing + (virtual - 1) * wrap_s


def pipeline_total(work_sum: np.ndarray, crossing: np.ndarray, cycle: np.ndarray,
                   micro_batches: int, virtual: int = 1) -> np.ndarray:
    """The schedule's total from the stages' work sum, the transfers of one trip through
    every chunk and the slowest cycle (arrays that broadcast): the module docstring's two
    forms, the plain one exactly as written there."""
    if virtual == 1:
        return work_sum + crossing + (micro_batches - 1) * cycle
    return micro_batches * cycle + (work_sum + crossing - cycle) / virtual


def one_f_one_b(stage_s: np.ndarray, boundary_s: np.ndarray, micro_batches: int,
                terms: tuple[np.ndarray, np.ndarray] | None = None, virtual: int = 1,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Pipeline time and steady-state cycle.

    ``stage_s``: (p,) seconds per micro-batch per stage; ``boundary_s``: (k, p-1)
    transfer seconds per sample; ``terms``: its ``cycle_transfers`` (or, with ``virtual``
    > 1 chunks per stage, its ``interleaved_transfers``), when already known.
    Returns ((k,) total seconds, (k,) slowest cycle).
    """
    if terms is None and virtual > 1:
        raise ValueError("an interleaved schedule needs its interleaved_transfers terms")
    transfers, crossing = terms if terms is not None else cycle_transfers(boundary_s)
    cycle = (stage_s + transfers).max(axis=1)
    return pipeline_total(stage_s.sum(), crossing, cycle, micro_batches, virtual), cycle
