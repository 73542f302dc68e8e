"""Communication: ring collectives, pipeline transfers and link sharing.

Concurrent flows share each directed channel (max-min fair). A phase of concurrent
flows ends when its most loaded channel drains: ``max_c load_c / bandwidth_c``. For
flows of equal size this is exactly the max-min fair completion time (the flows of the
first saturated channel get the smallest fair share and finish last, together); for
unequal sizes it is the time at which work-conserving sharing empties that channel.
"""

from __future__ import annotations


__all__ = ["ring_allreduce_time", "colocated_transfers", "colocated_split",
           "sharded_dp_traffic"]


def ring_allreduce_time(nbytes: float, n: int, bytes_per_s: float, step_latency_s: float) -> float:
    """Ring all-reduce of ``nbytes`` per member over ``n`` members: 2(n-1)/n bytes/bw + 2(n-1) lat."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bytes_per_s + 2.0 * (n - 1) * step_latency_s


def sharded_dp_traffic(zero: int, micro_batches: int, weight_bytes: float,
                       grad_bytes: float) -> tuple[float, float]:
    """A stage's data-parallel traffic per iteration under ZeRO stage ``zero``, relative
    to what stages 0 and 1 are charged (one gradient all-reduce, 2 g bytes per parameter
    on each ring hop): (bytes on each ring hop, collective steps). ZeRO-1 (Megatron-LM's
    distributed optimizer) reduce-scatters the accumulated gradients and all-gathers the
    updated weights once. ZeRO-2 keeps no whole gradient, so it also reduce-scatters the
    gradients of every micro-batch but the last (M - 1 more, g each); ZeRO-3 (FSDP) does
    that too and gathers every layer's weights before its forward and again before its
    backward on every micro-batch, against ZeRO-1's one gather (2 M - 1 more, w each). So
    each stage moves at least what the one below it moves (the search relies on it), and
    at M = 1 with w = g ZeRO-3 moves 1.5 all-reduces, the ZeRO paper's figure. No overlap
    with compute is counted: an upper estimate."""
    if zero < 2:
        return 1.0, 1.0
    m = float(micro_batches)
    extra_rs = (m - 1.0) * grad_bytes
    if zero == 2:
        return 1.0 + extra_rs / (2.0 * grad_bytes), (m + 1.0) / 2.0
    return 1.0 + (extra_rs + (2.0 * m - 1.0) * weight_bytes) / (2.0 * grad_bytes), 1.5 * m


def colocated_transfers(src: dict[int, float], dst: dict[int, float],
                        ) -> list[tuple[int, int, float]]:
    """How a stage hands data to the next: (src host, dst host, fraction of the total).

    ``src`` and ``dst`` give each host's share of the sender and receiver replicas (each
    summing to 1). Data-parallel ranks are numbered so that as much as possible stays on
    its host; what must cross hosts goes from surplus to deficit hosts in proportion. The
    result depends only on how many replicas each host holds, not on their order.
    """
    out, surplus, deficit, total = colocated_split(src, dst)
    for h, s in surplus:
        for g, d in deficit:
            out.append((h, g, s * d / total))
    return out


def colocated_split(src: dict[int, float], dst: dict[int, float],
                    ) -> tuple[list[tuple[int, int, float]], list[tuple[int, float]],
                               list[tuple[int, float]], float]:
    """``colocated_transfers`` before its cross product: (the transfers that stay on a
    host, the sorted (host, surplus) and (host, deficit) items, the summed surplus). Host
    ``h`` sends ``s * d / total`` to host ``g`` for each (h, s) and (g, d), in this order;
    a large cluster's cost model takes the product as arrays."""
    out = []
    surplus: dict[int, float] = {}
    deficit: dict[int, float] = {}
    for h in src.keys() | dst.keys():
        a, b = src.get(h, 0.0), dst.get(h, 0.0)
        if min(a, b) > 0:
            out.append((h, h, min(a, b)))
        if a > b:
            surplus[h] = a - b
        elif b > a:
            deficit[h] = b - a
    total = sum(surplus.values())
    return out, sorted(surplus.items()), sorted(deficit.items()), total
