"""Admissible lower bounds of the iteration time, for branch and bound.

Every bound here is at most the cost model's value for every plan it covers. They rest on
the cost model's structure: a stage's work per micro-batch is affine in its layers,
``t_i = a_i n_i + b_i``; its memory is affine in its layers; and the iteration is

    T = sum_i t_i + sum_b c_b + (M - 1) max_i (t_i + c_{i-1} + c_i) + T_dp + T_opt + F

with ``T_dp`` at least any stage's own gradient all-reduce, which grows by ``d_i`` per
layer. Bandwidth-dependent terms are reduced over the K samples by the mean (valid for
the mean and for CVaR, which is never below the mean) or the minimum (valid for any
quantile).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from hetpar.costmodel.compute import GpuPerf
from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.native import compiled_twin
from hetpar.problem.space import PlanSpace, StageChoice

__all__ = ["StageProfile", "Bounds", "NATIVE", "PureBounds", "PureStageProfile",
           "root_bound", "pure_root_bound"]



def _ends_knapsack(items: list[tuple[int, int, int]], capacity: int) -> list[list[float]]:
    """``best[g][e]``: the most layers stages of weight ``w`` (GPUs), ``ends`` paid sides
    and ``value`` layers can hold with exactly ``g`` GPUs and ``e`` (0-2) paid sides in
    all; -inf where no combination has that weight (unbounded knapsack)."""
    neg = -math.inf
    best = [[neg] * 3 for _ in range(capacity + 1)]
    best[0][0] = 0.0
    for g in range(1, capacity + 1):
        row = best[g]
        for w, ends, value in items:
            if w > g:
                continue
            prev = best[g - w]
            for e in range(ends, 3):
                if prev[e - ends] + value > row[e]:
                    row[e] = prev[e - ends] + value
    return best

def _greedy(items: list[tuple[float, float]], layers: int, pool_cost: float,
            pool_room: float) -> float:
    """Least ``sum a n`` placing ``layers`` layers: every stage of ``items`` ((a, cap),
    by increasing ``a``) holds one, then the cheapest slots are filled first, the pool's
    ``pool_room`` layers at ``pool_cost`` each."""
    total = 0.0
    for a, _ in items:
        total += a
    left = float(layers - len(items))
    merged = sorted([(a, cap - 1) for a, cap in items] + [(pool_cost, pool_room)])
    for a, room in merged:
        take = min(left, room)
        total += a * take
        left -= take
        if left <= 0:
            break
    return total


def _lagrangian(items: list[tuple[float, float]], layers: int, pool_room: float,
                lines: list[tuple[float, float]], gpus: int, stage_a: list[float],
                other: float = math.inf) -> float:
    """Best bound ``greedy(price(mu)) - mu gpus`` over multipliers ``mu >= 0`` of a GPU
    budget (``greedy``: ``_greedy`` of ``items`` and ``pool_room`` pool layers), a pool
    layer priced at ``min(other, min_s (a_s + mu c_s))`` over the ``lines`` (a_s, c_s).
    The function is concave and piecewise linear in ``mu``, so its maximum lies at a
    kink: where two lines cross, or one crosses a prefix stage's ``a_i`` (``stage_a``)
    or ``other``; and 0."""
    mus = {0.0}
    crossings = stage_a if math.isinf(other) else [*stage_a, other]
    for i, (a1, c1) in enumerate(lines):
        for a2, c2 in lines[i + 1:]:
            if c1 != c2:
                mu = (a2 - a1) / (c1 - c2)
                if mu > 0:
                    mus.add(mu)
        if c1 > 0:
            for a in crossings:
                if a > a1:
                    mus.add((a - a1) / c1)
    best = -math.inf
    for mu in mus:
        price = other
        for a, c in lines:
            if a + mu * c < price:
                price = a + mu * c
        best = max(best, _greedy(items, layers, price, pool_room) - mu * gpus)
    return best


def _dedupe(items: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Knapsack items (GPUs, sides, layers): only the most layers per (GPUs, sides)."""
    best: dict[tuple[int, int], int] = {}
    for w, e, v in items:
        if v > best.get((w, e), 0):
            best[(w, e)] = v
    return [(w, e, v) for (w, e), v in best.items()]


def _affine(f) -> tuple[float, float]:
    """(slope, intercept) of a function affine in the layer count for counts >= 1."""
    one, two = f(1), f(2)
    return two - one, one - (two - one)


@dataclass(frozen=True)
class StageProfile:
    """Affine costs of one stage at one position under (M, recompute, ZeRO)."""

    a: float  # seconds per layer per micro-batch
    b: float  # fixed seconds per micro-batch
    d: float  # gradient all-reduce seconds per layer (lower bound)
    cap: int  # most layers that fit in memory
    d0: float  # gradient all-reduce seconds of its embedding or head (lower bound)
    opt_a: float  # optimizer seconds per layer
    opt_b: float  # fixed optimizer seconds


# A pool of stages still to build, as ``_fill`` takes it: (free GPUs per host of each type
# with any, least per-layer time, target, free GPUs per host, whether the first of them
# may continue the prefix's last stage (None: no prefix), whether its type has room).
Pool = tuple[list[tuple[str, tuple[int, ...]]], float, float, tuple[int, ...], bool | None,
             bool]
# What ``prefix_status`` derives from a prefix for its threshold tests (``_alive``).
PrefixData = tuple[list[StageProfile], StageProfile | None, float, float, float, list[float],
                   list[float], list[tuple[str, tuple[int, ...]]], float, tuple[int, ...],
                   bool]


class _ThresholdTest:
    """One threshold test of ``Bounds._alive``: the fill of a threshold, and whether the
    thresholds of an interval may beat the target."""

    def __init__(self, bounds: Bounds, profs: list[StageProfile], icpt: list[float],
                 slope: list[float], m: int, rc: str, pool: Pool | None, floor: float,
                 last_hosts: frozenset[int] | None, e_hosts: frozenset[int] | None,
                 room: float, share: float = 1.0) -> None:
        self.bounds = bounds
        self.share = share  # of the stages' work the fill counts (Bounds.work_share)
        self.profs = profs
        self.icpt = icpt
        self.slope = slope
        self.m = m
        self.rc = rc
        self.pool = pool
        self.floor = floor
        self.last_hosts = last_hosts
        self.e_hosts = e_hosts
        self.room = room

    def fill(self, tau: float, need: float = math.inf) -> float:
        """The least work sum under ``tau``, at the bounds' share of the fill."""
        share = self.share
        return share * self.bounds._fill(self.profs, self.icpt, self.slope, tau, self.m,
                                         self.rc, self.pool, self.floor, self.last_hosts,
                                         self.e_hosts, need / share)

    def passes(self, lo: float, hi: float, f_hi: float, depth: int) -> bool:
        """Whether thresholds in [lo, hi] may beat the target (``f_hi``: a lower bound of
        the fill at ``hi``); halved ``depth`` times where they may, so that the bound
        loses less than the grid's step to its discreteness."""
        if lo + f_hi >= self.room:
            return False
        if depth == 0:
            return True
        mid = 0.5 * (lo + hi)
        f_mid = self.fill(mid, self.room - lo)
        return self.passes(lo, mid, f_mid, depth - 1) or self.passes(mid, hi, f_hi, depth - 1)


@dataclass
class Bounds:
    """Bound computations for one problem; caches are per process (not shared)."""

    cm: CostModel
    space: PlanSpace
    objective: Objective
    zero: int
    inv_bw: np.ndarray = field(init=False)
    # inv_bw with a 0 appended: index -1, the padding of ``routes_around``'s rows, reads it.
    inv_bw_padded: np.ndarray = field(init=False)
    _profiles: dict = field(default_factory=dict, init=False)
    _knap: dict = field(default_factory=dict, init=False)
    # Plans may put the optimizer on the host (PlanSpace.offloads): memory is bounded with
    # it there (less), time without it (an offloaded step is never faster).
    offloads: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.inv_bw = self.reduce(self.cm.inv_bw)
        self.inv_bw_padded = np.append(self.inv_bw, 0.0)
        self.offloads = self.space.offloads
        self.batch = self.cm.training.global_batch
        self.layers = self.cm.model.layers
        self.fixed = self.cm.framework.iteration_overhead_s
        # Under the interleaved schedule with v chunks a pipeline's fill costs only 1/v of
        # its stages' work (costmodel/schedule.py: T >= (M-1) max u_i + sum_i t_i / v +
        # sum_b c_b): every bound counts the work sum at this share, for the largest v the
        # space allows (1: plain 1F1B, the bounds as they were).
        self.work_share = 1.0 / max(self.space.virtual_options)
        grad_per_param = self.cm.constants.grad_bytes
        self.layer_grad = self.cm.model.params_per_layer * grad_per_param
        self.opt_bytes = self.cm.constants.optimizer_bytes_per_param

    def closed_share(self, stages: int, m: int) -> float:
        """``work_share`` for a pipeline known to have ``stages`` stages and ``m``
        micro-batches: only a chunk count a split of it may take counts (2 stages or more,
        micro-batches a multiple of the stage count, at most ``L / stages`` chunks: each
        stage holds a multiple of them); 1 where none is left."""
        if self.work_share == 1.0 or stages < 2 or m % stages:
            return 1.0
        most = max((v for v in self.space.virtual_options if v <= self.layers // stages),
                   default=1)
        return 1.0 / most

    def reduce(self, samples: np.ndarray) -> np.ndarray:
        """Per-sample figures -> one figure a bound may use for this objective."""
        if self.objective.kind == "quantile":
            return samples.min(axis=0)
        return samples.mean(axis=0)

    # ---- per stage --------------------------------------------------------------------
    def _perfs(self, stage: StageChoice) -> list[GpuPerf]:
        kinds = {}
        for h in stage.hosts:
            perf = self.cm.host_perf(h)
            if perf is None:
                return []
            kinds[id(perf)] = perf
        return list(kinds.values())

    def profile(self, stage: StageChoice, m: int, rc: str, position: int, stages: int,
                first: bool, last: bool) -> StageProfile | None:
        """The stage's affine costs; None if it cannot run (precision, uneven split)."""
        mb = self.batch // m
        if mb % stage.dp:
            return None
        inflight = min(stages - position, m)
        key = (stage, m, rc, inflight, first, last)
        hit = self._profiles.get(key, False)
        if hit is not False:
            return hit
        perfs = self._perfs(stage)
        if not perfs:
            self._profiles[key] = None
            return None
        seqs = mb / stage.dp
        cm = self.cm
        a = -math.inf
        b = math.inf
        for perf in perfs:
            a1, b1 = _affine(lambda n: cm.stage_work(perf, seqs, stage.tp, n, first, last, rc).total)
            a, b = max(a, a1), min(b, b1)
        # Memory is affine in layers. A prefix's stages may still gain followers (more
        # micro-batches in flight) or stay last (the logits): bound by the lighter case.
        z = self.zero
        cases = [(inflight, first, last)]
        if position == stages - 1 and not last:
            cases.append((1, first, True))
        usable = min(p.usable_bytes for p in perfs)
        cap = 0
        for held, is_first, is_last in cases:
            per_layer, m0 = _affine(lambda n: cm.stage_memory(
                n, stage.tp, stage.dp, seqs, held, is_first, is_last, rc, z,
                gathered=False, offload=self.offloads)[1])
            if usable >= m0 + per_layer:
                cap = max(cap, self.layers if per_layer <= 0 else
                          int(math.floor((usable - m0) / per_layer)))
        d = self._dp_seconds(stage, perfs, self.cm.model.params_per_layer / stage.tp)
        params0 = cm.stage_memory(0, stage.tp, stage.dp, seqs, 1, first, last, rc, z)[0]
        shard = stage.dp if self.zero >= 1 else 1
        hbm = min(p.hbm for p in perfs)
        opt_a = self.cm.model.params_per_layer / stage.tp / shard * self.opt_bytes / hbm
        opt_b = params0 / shard * self.opt_bytes / hbm
        d0 = self._dp_seconds(stage, perfs, params0)
        prof = StageProfile(a, b, d, min(cap, self.layers), d0, opt_a, opt_b)
        self._profiles[key] = prof
        return prof

    def _dp_seconds(self, stage: StageChoice, perfs: list[GpuPerf], params: float) -> float:
        """Bandwidth time of the stage's own gradient all-reduce of ``params`` per GPU."""
        if stage.dp <= 1 or params <= 0:
            return 0.0
        grad = params * self.cm.constants.grad_bytes
        per_host = max(stage.blocks)
        intra_bw = min(p.intra_bw for p in perfs)
        d = 2.0 * (per_host - 1) / per_host * grad / intra_bw if per_host > 1 else 0.0
        n = len(stage.hosts)
        if n > 1:
            ring = 2.0 * (n - 1) / n * grad * stage.tp
            routes = self.cm.cluster.route_views()[0]
            hosts = list(stage.hosts)
            worst = 0.0
            for x, y in zip(hosts, hosts[1:] + hosts[:1]):
                for ch in routes[x][y]:
                    worst = max(worst, ring * float(self.inv_bw[ch]))
            d += worst
        return d

    # ---- shapes of stages not placed yet ------------------------------------------------
    def _shape_costs(self, gpu_type: str, tp: int, dp: int, m: int, rc: str,
                     ) -> tuple[float, float, int] | None:
        """Best case (a, b, cap) of any stage of this shape on hosts of the type."""
        key = ("shape", gpu_type, tp, dp, m, rc)
        hit = self._profiles.get(key, False)
        if hit is not False:
            return hit
        out = None
        if (self.batch // m) % dp:
            # Its replicas could not share a micro-batch evenly: no such stage (profile).
            self._profiles[key] = None
            return None
        seqs = self.batch / m / dp
        for h in self.space.eligible_hosts(gpu_type, tp):
            perf = self.cm.host_perf(h)
            if perf is None:
                continue
            a, b = _affine(lambda n: self.cm.stage_work(perf, seqs, tp, n, False, False, rc).total)
            # Fewest activations in flight, neither embedding nor logits: the lightest case.
            per_layer, m0 = _affine(lambda n: self.cm.stage_memory(
                n, tp, dp, seqs, 1, False, False, rc, self.zero, gathered=False,
                offload=self.offloads)[1])
            cap = (self.layers if per_layer <= 0 else
                   max(0, int(math.floor((perf.usable_bytes - m0) / per_layer))))
            out = (a, b, cap) if out is None else (min(out[0], a), min(out[1], b),
                                                   max(out[2], cap))
        self._profiles[key] = out
        return out

    def _shape_dp(self, gpu_type: str, tp: int, dp: int, blocks: tuple[int, ...],
                  min_hosts: int = 1) -> float:
        """Least per-layer all-reduce of ``dp`` replicas of ``tp`` GPUs when the hosts of the
        type have ``blocks`` free TP blocks (sorted, most first), spread over at least
        ``min_hosts`` hosts; inf if they cannot."""
        if dp < min_hosts:
            return math.inf
        if dp <= 1:
            return 0.0 if blocks and blocks[0] >= 1 else math.inf
        key = ("shape_dp", gpu_type, tp, dp, blocks, min_hosts)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        hosts = self.space.eligible_hosts(gpu_type, tp)
        perfs = [p for p in (self.cm.host_perf(h) for h in hosts) if p is not None]
        grad = self.layer_grad / tp
        intra_bw = max(p.intra_bw for p in perfs)
        # A ring over n hosts sends its bytes out of every one of them: at least the
        # n-th fastest cut (seconds per byte, smallest first) among the type's hosts.
        cuts = sorted(self.cut_inv((h,)) for h in hosts)
        best = math.inf
        held = 0
        for n, free_blocks in enumerate(blocks, start=1):
            held += free_blocks
            if free_blocks < 1:
                break  # no further host has room
            if held < dp or n < min_hosts:
                continue  # n hosts are too few for dp replicas
            per_host = -(-dp // n)
            d = 2.0 * (per_host - 1) / per_host * grad / intra_bw if per_host > 1 else 0.0
            if n > 1:
                d += 2.0 * (n - 1) / n * grad * tp * cuts[min(n, len(cuts)) - 1]
            best = min(best, d)
            if n >= dp:
                break
        self._profiles[key] = best
        return best

    def _capacity(self, a: float, b: float, d: float, cap: int, budget: float, m: int,
                  floor: float = 0.0) -> int:
        """Most layers a stage can hold while the iteration stays under the budget.

        ``floor``: a lower bound of the whole data-parallel phase that holds whatever the
        stage's own all-reduce (``tied_floor``): the stage's term is then
        ``(M-1)(a n + b) + max(d n, floor)``, and both parts must fit."""
        room = budget - (m - 1) * b
        if room <= 0:
            return 0
        if math.isinf(room):
            return max(0, min(cap, self.layers))
        slope = (m - 1) * a + d
        by_time = self.layers if slope <= 0 else int(math.floor(room / slope * (1 + 1e-12)))
        if floor > 0:
            if room - floor <= 0:
                return 0
            if a > 0 and m > 1:
                by_time = min(by_time, math.floor((room - floor) / ((m - 1) * a)
                                                  * (1 + 1e-12)))
        return max(0, min(cap, by_time))

    def _type_blocks(self, gpu_type: str, free: tuple[int, ...],
                     ) -> Iterator[tuple[int, tuple[int, ...]]]:
        """(TP degree, free TP blocks of the type's hosts that can hold one, most first)
        for each TP degree of the type (``free``: GPUs per host of the type)."""
        hosts = self.space.hosts_of_type[gpu_type]
        for tp in self.space.tp_options[gpu_type]:
            yield tp, tuple(sorted((f // tp for f, h in zip(free, hosts)
                                    if self.cm.cluster.hosts[h].num_gpus % tp == 0),
                                   reverse=True))

    def _shapes(self, gpu_type: str, free: tuple[int, ...], m: int, rc: str,
                least_dp: int = 1,
                ) -> Iterator[tuple[int, int, tuple[int, ...], tuple[float, float, int]]]:
        """(tp, dp, blocks, ``_shape_costs``) of every stage shape of at least
        ``least_dp`` replicas that the type's free GPUs can form."""
        for tp, blocks in self._type_blocks(gpu_type, free):
            for dp in range(least_dp, sum(blocks) + 1):
                shape = self._shape_costs(gpu_type, tp, dp, m, rc)
                if shape is not None:
                    yield tp, dp, blocks, shape

    def _ended_items(self, gpus: int, shape: tuple[float, float, int], d: float,
                     cross: float, budget: float, m: int, floor: float,
                     ) -> list[tuple[int, int, int]]:
        """(GPUs, paid ends, most layers) of one stage shape when 0, 1 or 2 of its sides
        pay ``cross`` in its cycle; only the cases that hold a layer."""
        out = []
        for ends in (0, 1, 2):
            value = self._capacity(shape[0], shape[1] + ends * cross, d, shape[2], budget,
                                   m, floor)
            if value > 0:  # a stage holds at least one layer
                out.append((gpus, ends, value))
        return out

    def knapsack(self, gpu_type: str, free: tuple[int, ...], m: int, rc: str,
                 budget: float, floor: float = 0.0) -> int:
        """Most layers stages built from the free GPUs of a type (``free``: per host of the
        type) can hold under a threshold ``budget`` on ``(M-1)(a n + b) + d n``. Relaxed:
        stages only compete for the type's GPU count, and each stage's all-reduce is
        bounded from the fewest hosts that have room for its replicas."""
        if len(self._knap) > 200_000:
            self._knap.clear()
        key = (gpu_type, free, m, rc, budget, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        total = sum(free)
        items = []
        for tp, dp, blocks, shape in self._shapes(gpu_type, free, m, rc):
            d = self._shape_dp(gpu_type, tp, dp, blocks)
            value = self._capacity(shape[0], shape[1], d, shape[2], budget, m, floor)
            if value > 0:
                items.append((tp * dp, value))
        best = [0] * (total + 1)
        for g in range(1, total + 1):
            v = best[g - 1]
            for w, val in items:
                if w <= g:
                    v = max(v, best[g - w] + val)
            best[g] = v
        self._knap[key] = best[total]
        return best[total]

    # ---- pool stages with their crossings -------------------------------------------
    def crossing_time(self, host: int, m: int) -> float:
        """Least reduced round trip of a whole micro-batch between ``host`` and any other
        host, either way: what a stage of that host alone pays on a side whose
        neighbour has no replica there. (The data crosses every channel of the route, so
        the time is at least its slowest channel's; copies per TP rank only add.)"""
        key = ("cross", host, m)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        out_ch, _, in_ch, _ = self.cm.cluster.routes_around(host, (host,))
        best = math.inf
        if len(out_ch):
            inv = self.inv_bw_padded  # the rows' padding (-1) reads 0, below every time
            best = min(float(inv[out_ch].max(axis=1).min()),
                       float(inv[in_ch].max(axis=1).min()))
        if not math.isfinite(best):
            best = 0.0
        volume = self.batch / m * self.cm.seq_len * self.cm.model.hidden * 2.0
        # The whole micro-batch goes to one other host: its route's latency and one
        # framework step come on top of the bytes, both ways.
        out = 2.0 * (volume * best + self._least_latency((host,)))
        self._profiles[key] = out
        return out

    def _least_latency(self, hosts: tuple[int, ...]) -> float:
        """Least latency of an inter-host transfer leaving or entering ``hosts`` (route
        latency plus the framework's step, which the cost model adds to every boundary
        with inter-host flows); 0 if no host lies outside."""
        key = ("lat", hosts)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        best = math.inf
        for a in hosts:
            _, out_lat, _, in_lat = self.cm.cluster.routes_around(a, hosts)
            if len(out_lat):
                best = min(best, float(out_lat.min()), float(in_lat.min()))
        out = best + self.cm.framework.step_latency_s if math.isfinite(best) else 0.0
        self._profiles[key] = out
        return out

    def cut_inv(self, hosts: tuple[int, ...]) -> float:
        """Reduced seconds per byte, at least, of data entering or leaving the host set
        ``hosts`` (either way, the smaller).

        Every flow from outside into the set ends on a last-hop channel into one of its
        hosts (every flow out starts on a first hop out of one), so a transfer moving
        ``V`` bytes across takes at least ``V`` over those channels' summed bandwidth:
        their most loaded channel carries at least its share. 0 if nothing lies outside."""
        key = ("cut", hosts)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        into: set[int] = set()
        out_of: set[int] = set()
        for h in hosts:
            first, last = self.cm.cluster.end_hops(h, hosts)
            out_of |= first
            into |= last
        best = math.inf
        for chans in (into, out_of):
            if chans:
                rate = (1.0 / self.cm.inv_bw[:, sorted(chans)]).sum(axis=1)  # bytes/s
                best = min(best, float(self.reduce(1.0 / rate)))
        out = best if math.isfinite(best) else 0.0
        self._profiles[key] = out
        return out

    def _volume(self, m: int) -> float:
        """Activation bytes of one micro-batch at a stage boundary (one direction)."""
        return self.batch / m * self.cm.seq_len * self.cm.model.hidden * 2.0

    def type_crossing(self, hosts: tuple[int, ...], m: int) -> float:
        """Least round trip of a micro-batch entering or leaving ``hosts`` whole: what a
        stage on those hosts pays on a side whose neighbour has no replica there."""
        return 2.0 * (self._volume(m) * self.cut_inv(hosts) + self._least_latency(hosts))

    def spread_crossing(self, gpu_type: str, dp: int, blocks: tuple[int, ...], m: int,
                        ) -> float:
        """Least round trip a stage of ``dp`` replicas spread over two or more hosts of the
        type pays on a side whose neighbour is not on the same hosts in the same
        proportions (``blocks``: the free TP blocks per host, most first).

        With a neighbour on one host ``x`` that holds a share ``s < 1`` of the spread
        stage, ``(1 - s) V`` bytes cross the cut around ``x``, and
        ``s <= min(blocks[0], dp - 1) / dp``. With any other neighbour (another host,
        another type, a stage spread elsewhere) the host holding the largest share,
        at least ``1 / min(dp, hosts with room)``, receives or sends at least that
        share of ``V`` through its own cut."""
        key = ("spread", gpu_type, dp, blocks, m)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        hosts = self.space.hosts_of_type[gpu_type]
        n_all = len(self.cm.cluster.hosts)
        inv_type = min(self.cut_inv((h,)) for h in hosts)
        share = min(blocks[0], dp - 1) / dp
        room = min(dp, sum(1 for b in blocks if b > 0))
        inv = inv_type * min(1.0 - share, 1.0 / max(room, 1))
        lat = min(self._least_latency((h,)) for h in range(n_all))
        out = 2.0 * (self._volume(m) * inv + lat)
        self._profiles[key] = out
        return out

    def _run_table(self, host: int, free: int, m: int, rc: str, budget: float,
                   floor: float = 0.0) -> list[list[float]]:
        """``R[g][e]``: most layers a run of consecutive stages on ``host`` alone can hold
        under the threshold with at most ``g`` of its free GPUs, when ``e`` of its ends
        (0, 1 or 2; on one stage or two) cross to another host; -inf without a run."""
        key = ("run", host, free, m, rc, budget, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        gpu_type = self.cm.cluster.hosts[host].gpu.name
        cross = self.crossing_time(host, m)
        n_gpus = self.cm.cluster.hosts[host].num_gpus
        items = []  # (GPUs, ends it carries, layers)
        for tp in self.space.tp_options[gpu_type]:
            if n_gpus % tp:
                continue
            for dp in range(1, free // tp + 1):
                shape = self._shape_costs(gpu_type, tp, dp, m, rc)
                if shape is None:
                    continue
                d = self._shape_dp(gpu_type, tp, dp, (free // tp,))
                items += self._ended_items(tp * dp, shape, d, cross, budget, m, floor)
        neg = -math.inf
        best = _ends_knapsack(_dedupe(items), free)
        # A run has at least one stage and may leave GPUs idle. (Its ends are counted
        # exactly: the caller requires enough of them in all.)
        out = [[neg] * 3 for _ in range(free + 1)]
        for g in range(1, free + 1):
            for e in range(3):
                out[g][e] = max(best[g][e], out[g - 1][e])
        self._knap[key] = out
        return out

    def _multi_table(self, gpu_type: str, free: tuple[int, ...], m: int, rc: str,
                     budget: float, most: int, floor: float = 0.0) -> list[list[float]]:
        """``X[g][c]``: most layers stages of the type spread over two or more hosts
        (their all-reduce crosses hosts) can hold under the threshold with ``g`` GPUs,
        when they make up at most ``c`` spread runs (maximal sequences of consecutive
        spread stages).

        A spread run sits between two runs on single hosts (or ends the pipeline, or
        continues the prefix) and frees their sides from the full crossing, but pays
        on its own sides at least ``spread_crossing`` each: ``q`` runs have at least
        ``2 q - 2`` sides in all, so ``x`` spread stages with ``e`` paid sides make at
        most ``min(x, e // 2 + 1)`` runs. (Counted per type, which only adds runs.)"""
        key = ("multi", gpu_type, free, m, rc, budget, most, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        total = sum(free)
        items = self._spread_items(gpu_type, free, m, rc, budget, floor)
        neg = -math.inf
        most_e = 2 * most
        # best[g][(x, e)]: x spread stages (capped at ``most``), e paid sides (capped)
        best: list[dict[tuple[int, int], float]] = [dict() for _ in range(total + 1)]
        best[0][(0, 0)] = 0.0
        for g in range(1, total + 1):
            row = best[g]
            for w, ends, value in items:
                if w > g:
                    continue
                for (x, e), v in best[g - w].items():
                    x1, e1 = x + 1, e + ends
                    k = (x1 if x1 < most else most, e1 if e1 < most_e else most_e)
                    w1 = v + value
                    if w1 > row.get(k, neg):
                        row[k] = w1
        out = [[neg] * (most + 1) for _ in range(total + 1)]
        for g in range(total + 1):
            cells = out[g]
            if g:
                cells[:] = out[g - 1]  # GPUs may stay idle
            cells[0] = 0.0
            for (x, e), v in best[g].items():
                c = min(x, e // 2 + 1)
                if v > cells[c]:
                    cells[c] = v
        self._knap[key] = out
        return out

    def _spread_items(self, gpu_type: str, free: tuple[int, ...], m: int, rc: str,
                      budget: float, floor: float) -> list[tuple[int, int, int]]:
        """(GPUs, paid sides, most layers) of every stage shape of the type spread over
        two or more hosts with room, without the dominated ones."""
        items = []
        for tp, dp, blocks, shape in self._shapes(gpu_type, free, m, rc, least_dp=2):
            d = self._shape_dp(gpu_type, tp, dp, blocks, min_hosts=2)
            if not math.isfinite(d):
                continue
            cross = self.spread_crossing(gpu_type, dp, blocks, m)
            items += self._ended_items(tp * dp, shape, d, cross, budget, m, floor)
        return _dedupe(items)

    def _spread_total(self, gpu_type: str, free: tuple[int, ...], m: int, rc: str,
                      budget: float, floor: float) -> float:
        """Most layers spread stages of the type can hold at all: ``_multi_table``'s
        largest entry, by a knapsack over GPUs alone (no runs or sides to track)."""
        key = ("spread_total", gpu_type, free, m, rc, budget, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        total = sum(free)
        items: dict[int, int] = {}
        for w, _, value in self._spread_items(gpu_type, free, m, rc, budget, floor):
            items[w] = max(items.get(w, 0), value)
        best = [0] * (total + 1)
        for g in range(1, total + 1):
            v = best[g - 1]
            for w, value in items.items():
                if w <= g and best[g - w] + value > v:
                    v = best[g - w] + value
            best[g] = v
        self._knap[key] = best[total]
        return best[total]

    def spread_share(self, gpu_type: str, free: tuple[int, ...]) -> float:
        """Least seconds of the data-parallel phase per layer held by stages of the type
        spread over two or more of its hosts with room (``free``: GPUs per host of the
        type).

        A ring over ``n >= 2`` hosts sends ``2 (n-1) / n`` of a layer's gradient out of
        each of them, at least twice the gradient in all, and every byte leaves its host
        on one of the first-hop channels out of these hosts: all the spread stages' rings
        share them, so the phase is at least their summed bytes over those channels'
        summed bandwidth (the most loaded channel carries at least its share)."""
        hosts = tuple(h for h, f in zip(self.space.hosts_of_type[gpu_type], free) if f)
        key = ("spread_share", hosts)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        first: set[int] = set()
        for h in hosts:
            first |= self.cm.cluster.end_hops(h, (h,))[0]
        chans = sorted(first)
        out = 0.0
        if len(hosts) >= 2 and chans:
            rate = (1.0 / self.cm.inv_bw[:, chans]).sum(axis=1)  # bytes/s per sample
            out = 2.0 * self.layer_grad * float(self.reduce(1.0 / rate))
        self._profiles[key] = out
        return out

    def _spread_limited(self, gpu_type: str, free: tuple[int, ...], m: int, rc: str,
                        budget: float, most: int, floor: float) -> list[list[float]]:
        """``_multi_table`` with the spread stages' layers ``X`` in all limited by their
        shared uplinks (``spread_share``: the data-parallel phase is at least
        ``kappa X``, a floor under every spread stage's term). The table under the floor
        ``kappa X`` only shrinks as ``X`` grows, so the ``X`` it admits form a range
        ``[0, X*]``; every entry is capped at ``X*``."""
        multi = self._multi_table(gpu_type, free, m, rc, budget, most, floor)
        total = sum(free)
        top = max(multi[total])
        kappa = self.spread_share(gpu_type, free)
        if top <= 0 or kappa <= 0:
            return multi
        key = ("spread_limited", gpu_type, free, m, rc, budget, most, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit

        # x admitted: _spread_total under the floor kappa x still holds x layers.
        lo, hi = 0, int(min(top, self.layers))  # 0 is admitted; find the largest x
        if self._spread_total(gpu_type, free, m, rc, budget, max(floor, kappa * hi)) >= hi:
            lo = hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._spread_total(gpu_type, free, m, rc, budget,
                                  max(floor, kappa * mid)) >= mid:
                lo = mid
            else:
                hi = mid
        out = multi if lo >= top else [[min(v, float(lo)) for v in row] for row in multi]
        self._knap[key] = out
        return out

    def pool_capacities(self, free: tuple[int, ...], m: int, rc: str, budget: float,
                        entry_free: bool, floor: float = 0.0,
                        last_hosts: frozenset[int] | None = None,
                        entry_hosts: frozenset[int] | None = None,
                        ) -> tuple[tuple[int, float], ...]:
        """``(q, layers)`` pairs, by increasing ``q``: the stages still to be built from
        the ``free`` GPUs hold at most ``layers`` layers under a threshold ``budget`` on
        ``(M-1)(a n + b + crossings) + d n`` when at least ``q`` of their boundaries are
        crossings between hosts (each adds a round trip to the pipeline's fill), counting
        the transfers between hosts that their order forces.

        Relaxation: every such stage lies on one host, or spreads over several hosts of
        its type (its all-reduce then crosses hosts). Stages on one host form one run per
        host (more runs only add crossings). Each run is entered through a crossing and
        left through one, except that the last run is not left, the first may continue
        the prefix's last stage (``entry_free``), and a run of stages spread over several
        hosts may sit between two runs and spare their sides (it pays its own sides,
        ``_multi_table``). A crossing costs its end stage of the run at least
        ``crossing_time`` of that run's host in its cycle.

        ``last_hosts``: the pipeline's last stage lies on one of these hosts (``tied_floor``
        splits the search into that case and its complement). Unless a spread run may
        hold the last stage, the run left unleft is then on one of them, so the runs on
        other hosts miss at most the free entry's side (``deficit``: the sides they do not
        pay, two per run less what they pay). ``entry_hosts``: the first stage after the
        prefix lies on one of these hosts (the continuation), so the runs on other hosts
        miss at most the last run's side; and when the continuation and the last stage
        share one single host and other runs exist, that host's runs are two (one left,
        one entered): no side goes unpaid. ``floor`` as in ``_capacity``."""
        if len(self._knap) > 200_000:
            self._knap.clear()
        key = ("pool", free, m, rc, budget, entry_free, floor, last_hosts, entry_hosts)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        n_hosts = sum(1 for f in free if f)
        most_x = max(1, n_hosts)  # more spread stages than runs absorb nothing more
        neg = -math.inf
        # combined[(runs, ends, spread runs, some run pays no side, deficit of the runs
        # off last_hosts, deficit of the runs off entry_hosts)] -> most layers, over the
        # types so far. A run that pays no side is the only segment, or has a spread run
        # beside it: with two or more runs and no spread run, every run pays a side.
        Key = tuple[int, int, int, int, int, int]
        combined: dict[Key, float] = {(0, 0, 0, 0, 0, 0): 0.0}
        for gpu_type in self.space.types:
            hosts = self.space.hosts_of_type[gpu_type]
            tfree = tuple(free[h] for h in hosts)
            total = sum(tfree)
            if not total:
                continue
            multi = self._spread_limited(gpu_type, tfree, m, rc, budget, most_x, floor)
            spread = any(v > 0 for v in multi[total][1:])
            # runs[g][(r, e, z)] over the type's hosts, one host after the other. Without
            # a useful spread stage nothing else competes for a host's GPUs: each run
            # takes them all (its table is monotone in them).
            span = total if spread else 0
            runs: list[dict[tuple[int, int, int, int, int], float]] = [
                dict() for _ in range(span + 1)]
            runs[0][(0, 0, 0, 0, 0)] = 0.0
            used = 0
            for h, f in zip(hosts, tfree):
                if not f:
                    continue
                table = self._run_table(h, f, m, rc, budget, floor)
                off = last_hosts is not None and h not in last_hosts
                off_e = entry_hosts is not None and h not in entry_hosts
                nxt: list[dict[tuple[int, int, int, int, int], float]] = [
                    dict(d) for d in runs]
                sizes = range(1, f + 1) if spread else (f,)
                # (GPUs, paid ends, layers, pays no side, deficits) of each run it may hold
                entries = [(g, ends, table[g][ends], int(ends == 0),
                            2 - ends if off else 0, 2 - ends if off_e else 0)
                           for g in sizes for ends in range(3) if table[g][ends] != neg]
                # (Conditionals, not min(): these loops run millions of times.)
                for g0 in range(used + 1):
                    for (r, e, z, nd, ne), v in runs[g0].items():
                        r1 = r + 1
                        for g, ends, val, z0, dnd, dne in entries:
                            x_nd, x_ne = nd + dnd, ne + dne
                            k5 = (r1, e + ends, z | z0, x_nd if x_nd < 3 else 3,
                                  x_ne if x_ne < 3 else 3)
                            cell = nxt[g0 + g] if spread else nxt[0]
                            w = v + val
                            if w > cell.get(k5, neg):
                                cell[k5] = w
                runs = nxt
                if spread:
                    used += f
            per_type: dict[Key, float] = {}
            for g1 in range(span + 1):
                row = multi[total - g1] if spread else [0.0]
                for (r, e, z, nd, ne), v in runs[g1].items():
                    for x in range(len(row)):
                        if row[x] == neg:
                            continue
                        k = (r, e, x, z, nd, ne)
                        if v + row[x] > per_type.get(k, neg):
                            per_type[k] = v + row[x]
            merged: dict[Key, float] = {}
            for (r1, e1, x1, z1, d1, n1), v1 in combined.items():
                for (r2, e2, x2, z2, d2, n2), v2 in per_type.items():
                    x, d, n = x1 + x2, d1 + d2, n1 + n2
                    k = (r1 + r2, e1 + e2, x if x < most_x else most_x, z1 | z2,
                         d if d < 3 else 3, n if n < 3 else 3)
                    w = v1 + v2
                    if w > merged.get(k, neg):
                        merged[k] = w
            combined = merged
        # Deficits allowed off last_hosts (only the continuation's side, if it may lie
        # there) and off entry_hosts (only the last run's side, if it may lie there).
        off_last = 3 if last_hosts is None else int(
            entry_free and (entry_hosts is None or not entry_hosts <= last_hosts))
        off_entry = 3 if entry_hosts is None else int(
            last_hosts is None or not last_hosts <= entry_hosts)
        same_one = (entry_hosts is not None and last_hosts is not None
                    and len(entry_hosts) == 1 and entry_hosts == last_hosts)
        by_charge: dict[int, float] = {}
        for (r, e, x, z, nd, ne), v in combined.items():
            if r == 0 or (e >= 2 * r - 1 - int(entry_free) - 2 * x
                          and not (z and x == 0 and r >= 2)
                          and not (x == 0 and (nd > off_last or ne > off_entry))
                          and not (x == 0 and same_one and r >= 2 and e < 2 * r)):
                # r host runs (on r distinct hosts) and at most x spread runs (at least
                # one if x > 0) between them: the boundaries joining two host runs are
                # whole crossings, the others half ones at least (``pool_adjacency``).
                q = min(self._adjacency_units(r, y) for y in range(min(x, 1), x + 1))
                by_charge[q] = max(by_charge.get(q, 0.0), v)
        # Only the options that hold more layers for more crossings are worth keeping.
        out: list[tuple[int, float]] = []
        for q in sorted(by_charge):
            if not out or by_charge[q] > out[-1][1]:
                out.append((q, by_charge[q]))
        if not out:
            out = [(0, 0.0)]
        result = tuple(out)
        self._knap[key] = result
        return result

    @staticmethod
    def _adjacency_units(runs: int, spread: int) -> int:
        """Least crossing cost, in half crossings, of ``runs`` host runs (on distinct
        hosts) and ``spread`` spread runs in one sequence: at least
        ``runs - 1 - spread`` boundaries join two host runs (two halves each), and the
        other boundaries of the ``runs + spread - 1`` touch a spread run (one half)."""
        if runs == 0:
            return 0
        joins = max(0, runs - 1 - spread)
        return 2 * joins + (runs + spread - 1 - joins)

    def pool_adjacency_time(self, free: tuple[int, ...], m: int) -> float:
        """Least round trip of half a crossing between stages still to build: a boundary
        between two stages on different hosts (both with room) costs at least either
        host's ``crossing_time``, so at least the second least of them; one between a
        stage spread over hosts and any other at least ``spread_crossing``. The figure
        is the least of half the first and the second."""
        key = ("adjacency", free, m)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        times = sorted(self.crossing_time(h, m) for h, f in enumerate(free) if f)
        half = 0.5 * times[1] if len(times) >= 2 else 0.0
        for gpu_type in self.space.types:
            tfree = tuple(free[h] for h in self.space.hosts_of_type[gpu_type])
            for _, blocks in self._type_blocks(gpu_type, tfree):
                if sum(1 for x in blocks if x) < 2:
                    continue
                for dp in range(2, sum(blocks) + 1):
                    half = min(half, self.spread_crossing(gpu_type, dp, blocks, m))
        self._profiles[key] = half
        return half

    def _type_table(self, gpu_type: str, free: tuple[int, ...], m: int, rc: str,
                    budget: float, cross: float, floor: float = 0.0) -> list[float]:
        """``T[e]``: most layers stages of one type (``free``: GPUs per host of the type)
        can hold under the threshold when ``e`` of their sides (0, 1 or 2) pay ``cross``;
        -inf if none. Stages only compete for the type's GPU count (as ``knapsack``)."""
        key = ("type", gpu_type, free, m, rc, budget, cross, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        total = sum(free)
        items = []
        for tp, dp, blocks, shape in self._shapes(gpu_type, free, m, rc):
            d = self._shape_dp(gpu_type, tp, dp, blocks)
            items += self._ended_items(tp * dp, shape, d, cross, budget, m, floor)
        neg = -math.inf
        best = _ends_knapsack(_dedupe(items), total)
        out = [neg, neg, neg]
        for g in range(1, total + 1):
            for e in range(3):
                out[e] = max(out[e], best[g][e])
        self._knap[key] = out
        return out

    def type_capacity(self, free: tuple[int, ...], m: int, rc: str, budget: float,
                      entry_free: bool, floor: float = 0.0) -> float:
        """Most layers the stages still to be built can hold under the threshold, by GPU
        type: consecutive stages of one type form a type run, entered and left through
        the cut around the type's hosts with room (stages of other types lie outside
        it), which costs each side at least ``type_crossing``. Every type used has a run;
        the last run is not left, and the first is not entered if it continues the
        prefix's last stage's type (``entry_free``: that type has room)."""
        if len(self._knap) > 200_000:
            self._knap.clear()
        key = ("types", free, m, rc, budget, entry_free, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        neg = -math.inf
        # combined[(runs, runs paying one side, runs paying none)] -> most layers. Every
        # junction between runs charges one side to each of its two runs, so with two or
        # more runs each pays a side, and only the first (entered for free) and the last
        # (never left) may pay just one.
        combined: dict[tuple[int, int, int], float] = {(0, 0, 0): 0.0}
        for gpu_type in self.space.types:
            hosts = self.space.hosts_of_type[gpu_type]
            tfree = tuple(free[h] for h in hosts)
            if not any(tfree):
                continue
            room = tuple(h for h, f in zip(hosts, tfree) if f)
            table = self._type_table(gpu_type, tfree, m, rc, budget,
                                     self.type_crossing(room, m), floor)
            merged = dict(combined)
            for (r, n1, n0), v in combined.items():
                for ends in range(3):
                    if table[ends] == neg:
                        continue
                    k = (r + 1, min(3, n1 + (ends == 1)), min(2, n0 + (ends == 0)))
                    if v + table[ends] > merged.get(k, neg):
                        merged[k] = v + table[ends]
            combined = merged
        best = 0.0
        for (r, n1, n0), v in combined.items():
            if r == 0 or (r == 1 and n0 <= int(entry_free)) or (
                    r >= 2 and n0 == 0 and n1 <= 1 + int(entry_free)):
                best = max(best, v)
        self._knap[key] = best
        return best

    # ---- transfers ----------------------------------------------------------------------
    @staticmethod
    def _replica_hosts(stage: StageChoice) -> tuple[int, ...]:
        return tuple(h for h, b in zip(stage.hosts, stage.blocks) for _ in range(b))

    def boundary(self, src: StageChoice, dst: StageChoice, m: int) -> float:
        """Reduced round-trip transfer time of one micro-batch between two stages."""
        key = ("boundary", src, dst, m)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        perfs = self._perfs(src)
        if not perfs:
            return 0.0
        loads, intra, lat = self.cm.boundary_flows(
            self._replica_hosts(src), self._replica_hosts(dst), src.tp, dst.tp,
            self.batch // m, min(p.intra_bw for p in perfs), max(p.intra_step_s for p in perfs))
        times = np.full(self.cm.num_samples, intra)
        if loads:
            times = np.maximum(times, self.cm.phase_time(loads) + lat)
        out = float(self.reduce(2.0 * times))
        self._profiles[key] = out
        return out

    def exit_time(self, stage: StageChoice, free: tuple[int, ...], m: int) -> float:
        """Least round trip from ``stage`` to any stage after it: zero if one of its hosts
        has GPUs left, else its whole micro-batch must leave through its hosts' uplinks
        and enter the free hosts (``entry_time``), whichever side is slower."""
        if any(free[h] for h in stage.hosts):
            return 0.0
        return max(self._uplink_time(stage, m), self.entry_time(free, m))

    def _uplink_time(self, stage: StageChoice, m: int) -> float:
        """Least round trip of a micro-batch out through the uplinks of ``stage``'s hosts."""
        key = ("exit", stage, m)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        rate = np.zeros(self.cm.num_samples)
        for h in stage.hosts:
            first = self.cm.cluster.end_hops(h, (h,))[0]
            if not first:
                continue
            # Data leaving h crosses one of its first hops; their rates add up at best.
            rate += sum(1.0 / self.cm.inv_bw[:, ch] for ch in first)
        if not np.all(rate > 0):
            self._profiles[key] = 0.0
            return 0.0
        copies = stage.tp if self.cm.framework.p2p_copy_per_tp_rank else 1
        out = float(self.reduce(2.0 * self._volume(m) * copies / rate))
        self._profiles[key] = out
        return out

    def entry_time(self, free: tuple[int, ...], m: int) -> float:
        """Least round trip into a stage built from the ``free`` GPUs (none on the hosts
        of the stage before it) from outside its hosts: the host that receives the
        largest share, at least ``1 / k`` of the micro-batch with ``k`` the free hosts of
        its type, takes it in through its own cut. On a slow host after a fast one this
        side is the larger of the boundary's two (``exit_time``)."""
        room = tuple(h for h, f in enumerate(free) if f)
        key = ("entry", room, m)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        per_type: dict[str, int] = {}
        for h in room:
            t = self.cm.cluster.hosts[h].gpu.name
            per_type[t] = per_type.get(t, 0) + 1
        best = math.inf
        lat = math.inf
        for h in room:
            k = per_type[self.cm.cluster.hosts[h].gpu.name]
            best = min(best, self.cut_inv((h,)) / k)
            lat = min(lat, self._least_latency((h,)))
        out = 2.0 * (self._volume(m) * best + lat) if math.isfinite(best) else 0.0
        self._profiles[key] = out
        return out

    # ---- the tied embedding's gradient exchange ---------------------------------------
    def _tied_bytes(self) -> float:
        """Bytes per replica pair of the embedding gradient that the cost model exchanges
        between the first and the last stage of a pipeline of two or more stages (tied
        input and output embeddings); 0 where it exchanges none."""
        model = self.cm.model
        if not (self.cm.framework.tied_embedding_sync and model.tied_embeddings):
            return 0.0
        return float(model.vocab * model.hidden * self.cm.constants.grad_bytes)

    def _tied_time(self, diff: dict[int, float], nbytes: float) -> float:
        """Least time of the tied exchange when host ``h`` holds a share ``diff[h]`` more
        (or less) of the first stage's replicas than of the last's.

        The cost model sends the surplus hosts' shares to the deficit hosts and back, so
        ``|a_h - b_h| nbytes`` leave and enter host ``h`` through its cut, and every such
        pair pays its route's latency and a step twice. The phase's time is at least
        the most loaded host's, whatever else (the stages' own all-reduces) shares it."""
        bw = lat = 0.0
        for h, x in diff.items():
            if x > 1e-12:
                bw = max(bw, x * nbytes * self.cut_inv((h,)))
                lat = max(lat, 2.0 * self._least_latency((h,)))
        return bw + lat

    def tied_closed(self, first: StageChoice, last: StageChoice) -> float:
        """Least time of the tied exchange of a pipeline with these first and last
        stages (two or more stages): a floor under its data-parallel phase."""
        nbytes = self._tied_bytes()
        if nbytes <= 0:
            return 0.0
        key = ("tied", first, last)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        diff: dict[int, float] = {}
        for h, b in zip(first.hosts, first.blocks):
            diff[h] = diff.get(h, 0.0) + b / first.dp
        for h, b in zip(last.hosts, last.blocks):
            diff[h] = diff.get(h, 0.0) - b / last.dp
        out = self._tied_time({h: abs(x) for h, x in diff.items()},
                              nbytes * min(first.dp, last.dp))
        self._profiles[key] = out
        return out

    def tied_open(self, first: StageChoice, free: tuple[int, ...],
                  ) -> list[tuple[float, frozenset[int] | None]]:
        """Cases covering every extension of a prefix whose first stage is ``first``, each
        (floor under the data-parallel phase, hosts one of which holds the last stage or
        None): the last stage (built from ``free``) has no replica on the first's hosts,
        so their whole shares cross; or it has one on a host of the first with room, and
        only the shares of the first's full hosts must cross."""
        nbytes = self._tied_bytes()
        if nbytes <= 0:
            return [(0.0, None)]
        shares = {h: b / first.dp for h, b in zip(first.hosts, first.blocks)}
        apart = self._tied_time(shares, nbytes)
        room = frozenset(h for h in first.hosts if free[h])
        if not room:
            return [(apart, None)]
        full = {h: x for h, x in shares.items() if h not in room}
        return [(apart, None), (self._tied_time(full, nbytes), room)]

    # ---- prefixes ---------------------------------------------------------------------
    GRID = 24  # thresholds tried between zero and the target
    # Free GPUs above which the crossing-aware pool capacities (``pool_capacities``) are
    # left out of the fill (a weaker bound, still a bound): their tables grow with the
    # free GPUs times the runs over the free hosts, and at 99 free GPUs on 16 hosts one
    # node's took 14 s compiled (test-larger instance 0), where at 40 on 10 hosts a call
    # took at most 23 ms in pure Python.
    POOL_GPUS = 48
    REFINE = 3  # halvings of a grid interval that may beat the target

    def prefix_alive(self, prefix: tuple[StageChoice, ...], free: tuple[int, ...], m: int,
                     rc: str, target: float) -> tuple[bool, bool]:
        """(may a plan starting with ``prefix`` beat ``target``, is it memory that rules it
        out). Covers the prefix closed as a pipeline and every extension of it."""
        closed, opened, by_memory = self.prefix_status(prefix, free, m, rc, target)
        return closed or opened, by_memory

    def prefix_status(self, prefix: tuple[StageChoice, ...], free: tuple[int, ...], m: int,
                      rc: str, target: float) -> tuple[bool, bool, bool]:
        """(may the prefix closed as a pipeline beat ``target``, may some extension of it
        by one or more stages, is it memory that rules both out).

        The two halves are reported apart because each is inherited: a combination whose
        extensions are all ruled out here stays ruled out for every longer prefix (the
        bound covers them and the target only falls), so the search passes the open
        combinations down and closes a prefix only under the closed ones.

        With ``u_i = a_i n_i + g_i`` (work plus transfers) the iteration is at least
        ``fixed + sum_i a_i n_i + max_i ((M-1) u_i + d_i n_i + e_i)`` (``e_i``: the
        all-reduce of a stage's embedding or head). For a threshold ``tau`` on the maximum
        each stage holds at most ``(tau - (M-1) g_i - e_i) / ((M-1) a_i + d_i)`` layers,
        and stages still to be built from the free GPUs at most what a knapsack over
        stage shapes allows, each layer costing at least the cheapest shape's ``a``. The
        cheapest filling of the layers is then a greedy over costs; since it only falls as
        ``tau`` grows, ``tau_k + fill(tau_{k+1})`` bounds every threshold between two grid
        points."""
        if not math.isfinite(target):
            # Without an incumbent only memory can rule a prefix out.
            for i, st in enumerate(prefix):
                prof = self.profile(st, m, rc, i, len(prefix), i == 0, False)
                if prof is None or prof.cap < 1:
                    return False, False, prof is not None
            return True, True, False
        n = len(prefix)
        profiles = []
        for i, st in enumerate(prefix):
            prof = self.profile(st, m, rc, i, n, i == 0, False)
            if prof is None:
                return False, False, False
            if prof.cap < 1:
                return False, False, True
            profiles.append(prof)
        trans = [self.boundary(x, y, m) for x, y in zip(prefix, prefix[1:])]
        base = self.fixed + self.work_share * sum(p.b for p in profiles) + sum(trans)
        if base >= target:
            return False, False, False
        pool_types = [(t, tuple(free[h] for h in self.space.hosts_of_type[t]))
                      for t in self.space.types]
        pool_types = [(t, g) for t, g in pool_types if any(g)]
        exit_ = self.exit_time(prefix[-1], free, m) if pool_types else math.inf
        pool_a = self.pool_min_layer_time(pool_types, m, rc) if pool_types else math.inf
        c_in = [0.0] + trans
        last = prefix[-1]
        # The first stage after the prefix may share its last stage's host (or take part
        # of a spread stage's data locally) and then enters without a full crossing.
        entry_free = len(last.hosts) > 1 or any(free[h] for h in last.hosts)
        entry_type_free = any(t == last.gpu_type for t, _ in pool_types)
        # Closed, the prefix's last stage is the pipeline's last: it computes the head and
        # the loss (and holds the logits). Extended, some stage still to build does.
        closing = self.profile(last, m, rc, n - 1, n, n == 1, True)
        # The tied embedding's exchange between the first and the last stage floors the
        # data-parallel phase (``tied_closed``, ``tied_open``): closed, it is known; an
        # extension either ends away from the first stage's hosts or on one with room.
        tied_c = self.tied_closed(prefix[0], last) if n >= 2 else 0.0
        last_fixed = self.pool_last_fixed(pool_types, m, rc) if pool_types else 0.0

        # (The threshold test is a method and a small class, not closures: compiled, a
        # closure's environment and the closure hold each other, a cycle that only the
        # garbage collector frees; it took 15% of a proof.)
        prefix_data = (profiles, closing, base, last_fixed, target, trans, c_in, pool_types,
                       pool_a, free, entry_type_free)
        closed_ok = closing is not None and closing.cap >= 1 and self._alive(
            prefix_data, m, rc, True, 0.0, entry_free, None, tied_c, None)
        open_ok = False
        if math.isfinite(exit_):
            # Extended: the stage after the prefix has a replica on a host of its last
            # stage with room (no crossing; the pool's first run continues there), or it
            # does not (the last stage's micro-batch leaves its hosts whole, as if they
            # were full). And the last stage is away from the first stage's hosts, or on
            # one of them with room (``tied_open``).
            room_hosts = frozenset(h for h in last.hosts if free[h])
            if room_hosts and pool_types:
                full = tuple(0 if h in last.hosts else f for h, f in enumerate(free))
                conts = [(0.0, True, room_hosts),
                         (self.exit_time(last, full, m), len(last.hosts) > 1, None)]
            else:
                conts = [(exit_, entry_free, None)]
            cases = [(ex, e_free, e_hosts, floor, last_hosts)
                     for floor, last_hosts in self.tied_open(prefix[0], free)
                     for ex, e_free, e_hosts in conts]
            # Every case only shrinks what the stages may hold: when the bound without
            # the split rules the extensions out, so does every case, and this one pass
            # settles most of the prefixes the search prunes.
            if len(cases) == 1 or self._alive(prefix_data, m, rc, False, exit_, entry_free,
                                              None, 0.0, None):
                for ex, e_free, e_hosts, floor, last_hosts in cases:
                    if self._alive(prefix_data, m, rc, False, ex, e_free, e_hosts, floor,
                                   last_hosts):
                        open_ok = True
                        break
        return closed_ok, open_ok, False

    def _alive(self, prefix_data: PrefixData, m: int, rc: str, closed: bool, ex: float,
               e_free: bool, e_hosts: frozenset[int] | None, floor: float,
               last_hosts: frozenset[int] | None) -> bool:
        """``prefix_status``'s threshold test for the prefix closed, or extended under one
        case (``prefix_data``: what ``prefix_status`` derived from the prefix)."""
        (profiles, closing, base, last_fixed, target, trans, c_in, pool_types, pool_a, free,
         entry_type_free) = prefix_data
        profs: list[StageProfile]
        if closed:
            assert closing is not None  # the caller tests it first
            profs = profiles[:-1] + [closing]
            share = self.closed_share(len(profs), m)
            fixed = base + (share - self.work_share) * sum(p.b for p in profiles) + \
                share * (closing.b - profiles[-1].b)
        else:
            profs = profiles
            share = self.work_share
            fixed = base + ex + share * last_fixed
        room = target - fixed
        if room <= floor:
            return False  # the data-parallel phase alone leaves no room
        c_out = trans + [ex]
        gam = [p.b + ci + co for p, ci, co in zip(profs, c_in, c_out)]
        slope = [(m - 1) * p.a + p.d for p in profs]
        # A stage's term (M-1) u_i + (its all-reduce) is slope_i n_i + icpt_i; the
        # all-reduce of its embedding or head adds to the intercept.
        icpt = [(m - 1) * g + p.d0 for g, p in zip(gam, profs)]
        grid = [room * j / self.GRID for j in range(self.GRID + 1)]
        pool: Pool | None = None if closed else (pool_types, pool_a, target, free, e_free,
                                                 entry_type_free)
        # Whether a threshold admits every layer at all only grows with it (every
        # capacity does): bisect for the first grid point that does, then scan up.
        # (Below the floor no stage fits.)
        first = next((j for j in range(1, self.GRID + 1) if grid[j] > floor), None)
        if first is None:
            return False
        test = _ThresholdTest(self, profs, icpt, slope, m, rc, pool, floor, last_hosts,
                              e_hosts, room, share)
        lo_j, hi_j = first - 1, self.GRID  # fill(lo_j) inf (or none), fill(hi_j) ?
        top = test.fill(grid[hi_j], room - grid[hi_j - 1])
        if not math.isfinite(top):
            return False
        # The top interval first; if it (or each of its halves) is refuted, the lower
        # ones are scanned below.
        if test.passes(grid[hi_j - 1], grid[hi_j], top, self.REFINE):
            return True
        # fill only falls as the threshold grows, so no threshold j passes once
        # grid[j-1] + top >= room: only the grid points below that are tried.
        last_j = hi_j - 1
        while last_j >= 1 and grid[last_j - 1] + top >= room:
            last_j -= 1
        if last_j < first:
            return False
        while hi_j - lo_j > 1:
            mid = (lo_j + hi_j) // 2
            if math.isfinite(test.fill(grid[mid])):
                hi_j = mid
            else:
                lo_j = mid
        for j in range(hi_j, last_j + 1):
            if test.passes(grid[j - 1], grid[j], test.fill(grid[j], room - grid[j - 1]),
                           self.REFINE):
                return True
        return False

    def root_alive(self, m: int, rc: str, target: float) -> bool:
        """Whether some plan of the whole space may beat ``target`` under (M, recompute):
        the pool bound of ``prefix_status`` with every GPU free and no prefix (the first
        stage is entered from nowhere). A bound for every plan at once, for certificates
        whose subtrees were not all bounded in time."""
        free = self.space.capacity
        pool_types = [(t, tuple(free[h] for h in self.space.hosts_of_type[t]))
                      for t in self.space.types]
        pool_types = [(t, g) for t, g in pool_types if any(g)]
        fixed = self.fixed + self.work_share * self.pool_last_fixed(pool_types, m, rc)
        room = target - fixed
        if room <= 0:
            return False
        pool_a = self.pool_min_layer_time(pool_types, m, rc)
        grid = [room * k / self.GRID for k in range(self.GRID + 1)]
        for lo, hi in zip(grid, grid[1:]):
            # (Without the host-level pool capacity: over the whole cluster its tables
            # cost more than a certificate's grace allows.)
            fill = self.work_share * self._fill([], [], [], hi, m, rc,
                                                (pool_types, pool_a, target, free, None, True))
            if lo + fill < room:
                return True
        return False

    def _fill(self, profiles: list[StageProfile], icpt: list[float], slope: list[float],
              tau: float, m: int, rc: str, pool: Pool | None, floor: float = 0.0,
              last_hosts: frozenset[int] | None = None,
              entry_hosts: frozenset[int] | None = None, need: float = math.inf) -> float:
        """Least ``sum a_i n_i`` placing every layer with each stage's term
        ``slope_i n_i + icpt_i`` under threshold ``tau`` (inf if impossible); with a
        ``floor`` under the data-parallel phase, also ``(M-1) u_i + floor`` (``_capacity``).

        ``need``: the caller only asks whether the fill is below it, so a cheaper lower
        bound of the fill is returned as soon as one reaches it (the crossing-aware pool
        capacities, most of a node's time, are then never computed)."""
        L = self.layers
        caps = []
        for p, ic, sl in zip(profiles, icpt, slope):
            room = tau - ic
            cap = p.cap if sl <= 0 else min(p.cap, room / sl)
            if floor > 0 and m > 1 and p.a > 0:
                # ic - d0 = (M-1) g_i: the stage's term without its own all-reduce.
                cap = min(cap, (tau - floor - (ic - p.d0)) / ((m - 1) * p.a))
            # A stage holds a whole number of layers (the relative slack only absorbs
            # rounding, as in ``_capacity``).
            cap = math.floor(cap * (1 + 1e-12)) if math.isfinite(cap) else cap
            if cap < 1:
                return math.inf
            caps.append(cap)
        items = sorted(zip((p.a for p in profiles), caps))
        extra = 0.0
        pool_a = math.inf
        if pool is not None:
            pool_types, pool_a, target, free, entry_free, entry_type_free = pool
            # The knapsack table is cached on grid points of the target; use the next one up.
            key_tau = target * math.ceil(tau / target * self.GRID) / self.GRID
            # The floor enters the cached tables rounded down to a grid of the target
            # (a lower floor is still one), so that prefixes share them.
            step = target / (4 * self.GRID)
            floor = step * math.floor(floor / step) if floor > 0 else 0.0
            extra = sum(self.knapsack(t, g, m, rc, key_tau, floor) for t, g in pool_types)
            # One of the stages still to build is the pipeline's last: its head and loss
            # take room in its cycle, which costs its shape ``shift`` layers at least.
            shift = self.head_shift(pool_types, m, rc, key_tau, floor)
            if extra - shift < 1:
                return math.inf  # the stages to build hold no layer with the head
            extra -= shift
            if math.isfinite(need):
                if sum(caps) + extra < L:
                    return math.inf
                # The finer capacities below only lower ``extra``, which only raises the
                # greedy; and the Lagrangian prices pool layers at no less than pool_a.
                cheap = _greedy(items, L, pool_a, extra)
                if cheap >= need:
                    return cheap
            # Only while the layers still fit are the finer, crossing-aware capacities
            # worth their cost; each is an upper bound, so the least of them is one.
            if extra + sum(caps) >= L and len(pool_types) > 1:
                extra = min(extra, self.type_capacity(free, m, rc, key_tau,
                                                      entry_type_free, floor) - shift)
            if (extra + sum(caps) >= L and entry_free is not None
                    and sum(free) <= self.POOL_GPUS):
                # The pool's host runs, one host after another, cross between hosts:
                # each such boundary adds its round trip to the pipeline's fill.
                per = self.pool_adjacency_time(free, m)
                options = [(q * per, min(extra, cap - shift)) for q, cap in self.pool_capacities(
                    free, m, rc, key_tau, entry_free, floor, last_hosts, entry_hosts)]
                # (The stages to build hold a layer each, the last one with its head.)
                options = [(add, cap) for add, cap in options
                           if cap >= 1 and sum(caps) + cap >= L]
                if not options:
                    return math.inf
                # Least over the options, each first at its cheap bound (the greedy at
                # pool_a): the Lagrangian only for those that may still be the least.
                cands = sorted((add + _greedy(items, L, pool_a, cap), add, cap)
                               for add, cap in options)
                best = math.inf
                for low, add, cap in cands:
                    if low >= best or low >= need:
                        return min(best, low)
                    best = min(best, add + self._pool_fill(items, pool_types, pool_a, m, rc,
                                                           key_tau, floor, cap))
                return best
        if sum(caps) + extra < L:
            return math.inf
        if pool is None or extra <= 0:
            return _greedy(items, L, pool_a, extra)
        return self._pool_fill(items, pool_types, pool_a, m, rc, key_tau, floor, extra)

    def _pool_fill(self, items: list[tuple[float, float]], pool_types, pool_a: float,
                   m: int, rc: str, key_tau: float, floor: float, extra: float) -> float:
        """``_fill``'s least work sum once the pool may hold ``extra`` layers."""
        L = self.layers
        if extra <= 0:
            return _greedy(items, L, pool_a, extra)
        # Each pool layer costs the per-layer time of the stage shape holding it, and a
        # shape holding layers at a fast per-layer time takes many GPUs for the few
        # layers the threshold lets it hold. Lagrangian relaxation of the GPU budget G:
        # a stage of shape s (w_s GPUs, at most cap_s layers) holding x layers uses at
        # least x w_s / cap_s GPUs, so for every mu >= 0 the fill is at least the greedy
        # with pool layers at min_s (a_s + mu w_s / cap_s), less mu G. Any mu gives a
        # bound; the function is concave and piecewise linear, so its maximum lies at a
        # kink: where two shapes' lines cross or one crosses a prefix stage's a_i.
        lines = self._pool_lines(pool_types, m, rc, key_tau, floor)
        if not lines:
            return _greedy(items, L, pool_a, extra)
        gpus = sum(sum(g) for _, g in pool_types)
        stage_a = [a for a, _ in items]
        # mu = 0 prices pool layers at the least a_s, never below pool_a's figure.
        best = _lagrangian(items, L, extra, lines, gpus, stage_a)
        by_type = self._pool_type_lines(pool_types, m, rc, key_tau, floor)
        if len(by_type) < 2:
            return best
        # A stage holds GPUs of one type only: the budget of one type's GPUs alone, priced
        # by its own multiplier (the other types' shapes at their own a_s), is also a
        # relaxation, tighter where another type's GPUs are slow (they no longer lend
        # their count to the fast type).
        for gpu_type, (own, count) in by_type.items():
            other = min(a for t, (ls, _) in by_type.items() if t != gpu_type for a, _ in ls)
            best = max(best, _lagrangian(items, L, extra, own, count, stage_a, other))
        return best

    def _pool_type_lines(self, pool_types: list[tuple[str, tuple[int, ...]]], m: int,
                         rc: str, budget: float, floor: float = 0.0,
                         ) -> dict[str, tuple[list[tuple[float, float]], int]]:
        """``_pool_lines`` of each type apart, with the type's free GPU count; types
        whose GPUs form no shape under the threshold are left out."""
        key = ("type_lines", tuple(pool_types), m, rc, budget, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        out = {}
        for gpu_type, free in pool_types:
            lines = self._pool_lines([(gpu_type, free)], m, rc, budget, floor)
            if lines:
                out[gpu_type] = (lines, sum(free))
        self._knap[key] = out
        return out

    def _pool_lines(self, pool_types: list[tuple[str, tuple[int, ...]]], m: int, rc: str,
                    budget: float, floor: float = 0.0) -> list[tuple[float, float]]:
        """(a_s, w_s / cap_s) of every stage shape the free GPUs could form that holds a
        layer under the threshold ``budget``, without the dominated ones (another shape
        no worse on both), by increasing ``a_s``."""
        key = ("lines", tuple(pool_types), m, rc, budget, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        raw = []
        for gpu_type, free in pool_types:
            for tp, dp, blocks, shape in self._shapes(gpu_type, free, m, rc):
                d = self._shape_dp(gpu_type, tp, dp, blocks)
                cap = self._capacity(shape[0], shape[1], d, shape[2], budget, m, floor)
                if cap > 0:
                    raw.append((shape[0], tp * dp / cap))
        raw.sort()
        out: list[tuple[float, float]] = []
        for a, c in raw:
            if not out or c < out[-1][1]:
                out.append((a, c))
        self._knap[key] = out
        return out

    def head_time(self, gpu_type: str, tp: int, dp: int, m: int, rc: str) -> float:
        """Least seconds per micro-batch that computing the head and the loss adds to a
        stage of this shape (on any host of the type): what the pipeline's last stage
        pays in its cycle on top of its layers."""
        key = ("head", gpu_type, tp, dp, m, rc)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        seqs = self.batch / m / dp
        best = math.inf
        for h in self.space.eligible_hosts(gpu_type, tp):
            perf = self.cm.host_perf(h)
            if perf is None:
                continue
            _, b_last = _affine(lambda n: self.cm.stage_work(perf, seqs, tp, n, False, True,
                                                              rc).total)
            _, b_mid = _affine(lambda n: self.cm.stage_work(perf, seqs, tp, n, False, False,
                                                             rc).total)
            best = min(best, b_last - b_mid)
        out = max(0.0, best) if math.isfinite(best) else 0.0
        self._profiles[key] = out
        return out

    def head_shift(self, pool_types: list[tuple[str, tuple[int, ...]]], m: int, rc: str,
                   budget: float, floor: float = 0.0) -> float:
        """Fewest layers that holding the head costs the pipeline's last stage when it is
        built from the free GPUs, under a threshold ``budget`` (inf: no stage they could
        form holds a layer with the head).

        Every capacity table of the pool counts a stage of shape s as
        ``_capacity(a_s, b_s + x, d, cap_s)`` for some crossing time ``x >= 0`` and
        all-reduce ``d`` (the shape's, on one host or spread). The head adds ``h_s`` to
        ``b``: time alone then admits at least ``floor((M-1) h_s / slope)`` layers
        fewer (``floor(u) - floor(u - y) >= floor(y)``), memory may cap both, and the
        difference is least at ``x = 0``. So a plan's stages, its last stage counted
        without its head, form an entry of the tables holding at least the least such
        difference more layers than the plan's stages do."""
        key = ("head_shift", tuple(pool_types), m, rc, budget, floor)
        hit = self._knap.get(key)
        if hit is not None:
            return hit
        best = math.inf
        unbounded = 1 << 30
        for gpu_type, tfree in pool_types:
            hosts = self.space.hosts_of_type[gpu_type]
            for tp, dp, blocks, (a, b, cap) in self._shapes(gpu_type, tfree, m, rc):
                head = self.head_time(gpu_type, tp, dp, m, rc)
                dps = {self._shape_dp(gpu_type, tp, dp, blocks),
                       self._shape_dp(gpu_type, tp, dp, blocks, min_hosts=2)}
                for h, f in zip(hosts, tfree):
                    if f >= tp * dp and self.cm.cluster.hosts[h].num_gpus % tp == 0:
                        dps.add(self._shape_dp(gpu_type, tp, dp, (f // tp,)))
                for d in dps:
                    if not math.isfinite(d):
                        continue
                    by_time = self._capacity(a, b, d, unbounded, budget, m, floor)
                    if by_time < 1 or self._capacity(a, b + head, d, cap, budget, m,
                                                     floor) < 1:
                        continue  # in no table, or never the last stage
                    slope = (m - 1) * a + d
                    alpha = math.floor((m - 1) * head / slope) if slope > 0 else 0
                    best = min(best, min(alpha, max(0, cap - by_time + alpha)))
                    if best <= 0:
                        self._knap[key] = 0
                        return 0
        self._knap[key] = best
        return best

    def pool_last_fixed(self, pool_types: list[tuple[str, tuple[int, ...]]], m: int,
                        rc: str) -> float:
        """Least fixed time per micro-batch (its ``b`` plus the head and loss) of any stage
        the free GPUs could form as the pipeline's last stage: an extension's last stage
        is built from them, and its work enters the pipeline's fill."""
        key = ("last_fixed", tuple(pool_types), m, rc)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        best = math.inf
        seq = self.batch / m
        per_micro = int(self.batch // m)
        for gpu_type, free in pool_types:
            for tp, blocks in self._type_blocks(gpu_type, free):
                # Hosts of one perf give one value: each distinct perf once (2,000 hosts of
                # one type made this loop most of a root bound's time).
                perfs: dict[int, GpuPerf] = {}
                for h in self.space.eligible_hosts(gpu_type, tp):
                    hp = self.cm.host_perf(h)
                    if hp is not None:
                        perfs.setdefault(id(hp), hp)
                for dp in range(1, min(sum(blocks), per_micro) + 1):
                    if per_micro % dp:
                        continue
                    for perf in perfs.values():
                        work = self.cm.stage_work(perf, seq / dp, tp, 1, False, True, rc).total
                        layer = self.cm.stage_work(perf, seq / dp, tp, 2, False, True, rc).total
                        # work(1) - (work(2) - work(1)): the stage's part that no layer pays
                        best = min(best, 2.0 * work - layer)
        out = best if math.isfinite(best) else 0.0
        self._profiles[key] = out
        return out

    def pool_min_layer_time(self, pool_types: list[tuple[str, tuple[int, ...]]], m: int,
                            rc: str) -> float:
        """Least per-layer time of any stage the free GPUs could form."""
        key = ("min_layer", tuple(pool_types), m, rc)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        best = math.inf
        for gpu_type, free in pool_types:
            for _, _, _, shape in self._shapes(gpu_type, free, m, rc):
                best = min(best, shape[0])
        self._profiles[key] = best
        return best


# ---- the exact search's root bound of a layer split -----------------------------------
_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0
_GOLDEN_STEPS = 22  # brackets the minimiser to 2.5e-5 of the thresholds' range
_EDGE_STEPS = 24  # bisection steps for the least threshold with a placement


def _tau_cost(tau: float, mem: list[float], icpt: list[float], slope: list[float],
              a: list[float], order: list[int], sum_a: float, layers: int) -> float:
    """``root_bound``'s objective at threshold ``tau``: inf where no placement exists."""
    p = len(mem)
    caps: list[float] = []
    least = math.inf
    total_caps = 0.0
    for i in range(p):
        cap = min(mem[i], (tau - icpt[i]) / slope[i]) if slope[i] > 0 else mem[i]
        caps.append(cap)
        least = min(least, cap)
        total_caps += cap
    # With a tolerance: at tau = hi, (tau - icpt) / slope is L up to rounding, and a
    # cap of 1.9999999 for 2 layers must not make a feasible split look infeasible.
    if least < 1 - 1e-9 or total_caps < layers * (1 - 1e-12) - 1e-9:
        return math.inf
    total = sum_a
    left = float(layers - p)
    for i in order:
        take = min(left, caps[i] - 1)
        total += a[i] * take
        left -= take
        if left <= 0:
            break
    return tau + total


def root_bound(prof: list[StageProfile], a: list[float], gam: list[float], m: int,
               layers: int, fixed: float) -> float:
    """The exact search's bound of a complete pipeline's best layer split, before any
    layer is placed (``exact.best_split``; here to run compiled with the rest).

    With ``u_i = a_i n_i + g_i`` the iteration is at least
    ``fixed + sum_i a_i n_i + max_i ((M-1) u_i + d_i n_i) + max_i opt_i``: a sum of maxima
    is at least the maximum of the sums. For a threshold ``tau`` on the maximum each stage
    can hold at most ``(tau - (M-1) g_i) / ((M-1) a_i + d_i)`` layers, and the cheapest
    way to place the rest fills the stages of smallest ``a_i`` first; the bound minimises
    ``tau + sum a_i n_i`` over ``tau`` (a convex function of tau) with layers taken as real.
    """
    p = len(prof)
    slope = [(m - 1) * pr.a + pr.d for pr in prof]
    icpt = [(m - 1) * gam[i] + prof[i].d0 for i in range(p)]
    mem = [float(min(pr.cap, layers)) for pr in prof]
    order = sorted(range(p), key=lambda i: a[i])
    sum_a = 0.0
    for x in a:
        sum_a += x
    lo = -math.inf
    hi = -math.inf
    for i in range(p):
        lo = max(lo, slope[i] + icpt[i])
        hi = max(hi, slope[i] * layers + icpt[i])
    if not math.isfinite(_tau_cost(hi, mem, icpt, slope, a, order, sum_a, layers)):
        return math.inf
    # Below some threshold no placement exists (cost inf); above it the cost is convex.
    # The fill (cost - tau) falls as tau grows, so over any bracket [x, y] the cost is at
    # least x + fill(y): a bound, where the cost at a point would only approximate one.
    edge = math.inf
    if not math.isfinite(_tau_cost(lo, mem, icpt, slope, a, order, sum_a, layers)):
        bad, good = lo, hi
        for _ in range(_EDGE_STEPS):
            mid = (bad + good) / 2
            if math.isfinite(_tau_cost(mid, mem, icpt, slope, a, order, sum_a, layers)):
                good = mid
            else:
                bad = mid
        edge = bad + (_tau_cost(good, mem, icpt, slope, a, order, sum_a, layers) - good)
        lo = good
    # Golden-section search: one cost evaluation per step (a ternary search needs two),
    # and for a convex cost a minimiser stays in [lo, hi].
    c = hi - _INV_PHI * (hi - lo)
    d = lo + _INV_PHI * (hi - lo)
    fc = _tau_cost(c, mem, icpt, slope, a, order, sum_a, layers)
    fd = _tau_cost(d, mem, icpt, slope, a, order, sum_a, layers)
    for _ in range(_GOLDEN_STEPS):
        if fc <= fd:
            hi, d, fd = d, c, fc
            c = hi - _INV_PHI * (hi - lo)
            fc = _tau_cost(c, mem, icpt, slope, a, order, sum_a, layers)
        else:
            lo, c, fc = c, d, fd
            d = lo + _INV_PHI * (hi - lo)
            fd = _tau_cost(d, mem, icpt, slope, a, order, sum_a, layers)
    best = min(edge, lo + (_tau_cost(hi, mem, icpt, slope, a, order, sum_a, layers) - hi))
    opt = -math.inf
    for pr in prof:
        opt = max(opt, pr.opt_a + pr.opt_b)
    return fixed + best + opt


# ---- the compiled twin ------------------------------------------------------------------
# ``hatch_build.py`` compiles this very file with mypyc into ``_bounds_native`` (about
# twice as fast; same arithmetic, same decisions; ``hetpar/native.py``). The twin replaces
# the classes above only while it was built from this file's text as it stands.
PureBounds = Bounds
PureStageProfile = StageProfile
pure_root_bound = root_bound

# The module the search runs: the compiled twin, or None (this file as it stands).
NATIVE: ModuleType | None = compiled_twin(__name__, __file__)
if NATIVE is not None:
    globals().update(Bounds=NATIVE.Bounds, StageProfile=NATIVE.StageProfile,
                     root_bound=NATIVE.root_bound)
