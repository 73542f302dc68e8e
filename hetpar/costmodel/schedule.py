"""Pipeline schedule: one-forward-one-backward (1F1B, PipeDream-Flush / Megatron).

Stage ``i`` needs ``t_i`` seconds of forward plus backward work per micro-batch;
boundary ``b`` (between stages b and b+1) needs ``c_b`` seconds to send a micro-batch's
activations forward and their gradients back. Transfers are blocking in Megatron's
non-interleaved 1F1B, so in the steady state a stage's cycle is its work plus its
transfers, ``u_i = t_i + c_{i-1} + c_i``. The first micro-batch crosses every stage and
boundary once and the other M - 1 follow at the pace of the slowest cycle:

    T = sum_i t_i + sum_b c_b + (M - 1) * max_i u_i

which for p identical stages without communication is the textbook (M + p - 1) t.
"""

from __future__ import annotations

import numpy as np

__all__ = ["cycle_transfers", "one_f_one_b"]


def cycle_transfers(boundary_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The schedule's transfer terms: ((k, p) ``c_{i-1} + c_i`` of each stage's cycle,
    (k,) ``sum_b c_b``), from ``boundary_s`` (k, p-1)."""
    k, p = boundary_s.shape[0], boundary_s.shape[1] + 1
    padded = np.zeros((k, p + 1))
    padded[:, 1:p] = boundary_s
    return padded[:, :-1] + padded[:, 1:], boundary_s.sum(axis=1)


def one_f_one_b(stage_s: np.ndarray, boundary_s: np.ndarray, micro_batches: int,
                terms: tuple[np.ndarray, np.ndarray] | None = None,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Pipeline time and steady-state cycle.

    ``stage_s``: (p,) seconds per micro-batch per stage; ``boundary_s``: (k, p-1)
    transfer seconds per sample; ``terms``: its ``cycle_transfers``, when already known.
    Returns ((k,) total seconds, (k,) slowest cycle).
    """
    transfers, crossing = terms if terms is not None else cycle_transfers(boundary_s)
    cycle = (stage_s + transfers).max(axis=1)
    total = stage_s.sum() + crossing + (micro_batches - 1) * cycle
    return total, cycle
