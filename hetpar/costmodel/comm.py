"""Communication: ring collectives, pipeline transfers and link sharing.

Concurrent flows share each directed channel (max-min fair). A phase of concurrent
flows ends when its most loaded channel drains: ``max_c load_c / bandwidth_c``. For
flows of equal size this is exactly the max-min fair completion time (the flows of the
first saturated channel get the smallest fair share and finish last, together); for
unequal sizes it is the time at which work-conserving sharing empties that channel.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ring_allreduce_time", "channel_phase_time", "sequence_overlaps"]


def ring_allreduce_time(nbytes: float, n: int, bytes_per_s: float, step_latency_s: float) -> float:
    """Ring all-reduce of ``nbytes`` per member over ``n`` members: 2(n-1)/n bytes/bw + 2(n-1) lat."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bytes_per_s + 2.0 * (n - 1) * step_latency_s


def channel_phase_time(channels: np.ndarray, loads: np.ndarray, inv_bw: np.ndarray) -> np.ndarray:
    """Time for channels to carry ``loads`` bytes, per bandwidth sample.

    ``inv_bw`` is (samples, channels) seconds per byte; returns (samples,).
    """
    return (inv_bw[:, channels] * loads).max(axis=1)


def sequence_overlaps(src_parts: int, dst_parts: int, total: int) -> list[tuple[int, int, int]]:
    """(src replica, dst replica, sequences) for handing ``total`` sequences split evenly over
    ``src_parts`` replicas to ``dst_parts`` replicas (contiguous ranges, as data loaders do)."""
    a, b = total // src_parts, total // dst_parts
    out = []
    i = j = 0
    lo = 0
    while lo < total:
        hi = min((i + 1) * a, (j + 1) * b)
        out.append((i, j, hi - lo))
        lo = hi
        if lo == (i + 1) * a:
            i += 1
        if lo == (j + 1) * b:
            j += 1
    return out
