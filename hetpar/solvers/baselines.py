"""Baselines that users would otherwise pick (docs/solvers.md): Megatron, Metis, random.

Every baseline has the signature ``f(cm, space, objective, *, seed=0, budget=...)`` and
returns a ``Solution``. Candidates are scored with ``CostModel.iteration_times`` (a
candidate counts only if it fits in memory; its value is ``Objective.score``); the winner
is evaluated once more with ``CostModel.evaluate`` for its full estimate. ``evaluations``
counts every cost-model call, that last one included. A baseline that finds no plan that
fits returns ``plan=None`` and ``value=inf`` (``Solution.found`` is then False).

GPUs whose type lacks the training precision (V100 and T4 have no bf16) cannot run the
job at all, so every baseline leaves their hosts out, as a user would.

``megatron``
    One uniform TP x PP x DP layout, as Megatron-LM users write it, blind to
    heterogeneity. GPUs are ranked in host order (host index, then GPU index). For every
    tensor-parallel degree ``tp`` that is a power of two dividing every host's GPU count
    and the model's heads, and every pipeline depth ``pp`` from 1 to
    ``min(layers, gpus / tp)``, the data-parallel degree is ``dp = gpus // (tp * pp)``
    (the last ``gpus - tp * pp * dp`` GPUs stay idle). Rank ``r = tp_rank + tp * (dp_rank
    + dp * stage)`` runs on the ``r``-th GPU, so a stage may mix GPU types (it then runs
    at its slowest replica). Layers are split evenly, earlier stages taking the
    remainder. The micro-batch count ranges over those that split evenly over ``dp``,
    recomputation and ZeRO over what the training spec allows; the best plan that fits
    wins.

``metis``
    A heuristic in the style of Metis (Um et al., USENIX ATC 2024, "Metis: Fast
    Automatic Distributed Training on Heterogeneous GPUs"), restricted to the searched
    plan space (every stage on one GPU type, whole TP blocks of its hosts):

    1. Order the GPU types by speed: peak FLOP/s at the training precision, fastest
       first (ties: more memory first, then name).
    2. Prefer data parallelism: enumerate pipelines with few stages first, for
       ``P = 1, 2, ..., max_stages`` (at most the model's layers). The types a pipeline
       uses are the fastest ``k`` (slower types may stay idle); a composition
       ``n_1 + ... + n_k = P`` (``n_t >= 1``) says how many stages each type gets, and
       only compositions of stages of about equal compute are kept: ``n_t`` within
       ``balance`` (1) of ``P`` times the type's share of the used types' compute
       (``G_t * peak_t``).
    3. Device groups of powers of two: the ``G_t`` GPUs of type ``t`` form ``n_t`` groups
       taken from the binary decomposition of ``G_t`` (12 -> 8 + 4); more stages split
       the largest group in halves (12 in 3 -> 4 + 4 + 4), fewer drop the smallest
       (12 in 1 -> 8). Each stage uses as many GPUs as its group.
    4. Pipeline order: fastest type first (larger groups first within a type); with
       several types also the reverse order (the first stage holds the most
       micro-batches in flight, so memory can favour either).
    5. Intra-stage plan: one tensor-parallel degree per type, capped at the group's size,
       ``dp = group / tp``; groups are packed into the type's hosts, largest first, on
       one host when one has room (best fit), else over the hosts with the most free
       GPUs. Data parallelism first: start from the smallest tp and every GPU of each
       type, then run one pass of coordinate descent, fastest type first, over each
       type's other tp options and its GPU count (half, a quarter, ... of its GPUs, the
       groups of step 3 then taken from that count: idle GPUs can keep a stage off a
       slow link), keeping a change when it improves the layout's best value.
    6. Layers in proportion to stage speed (``tp * dp * peak``), rounded so that every
       stage has at least one layer and they sum to the model's layers.
    7. Memory-aware: ZeRO-1 is used where the training spec allows it (in the cost model
       it shards optimizer states at the same communication volume, so it never loses).
       For each micro-batch count the recomputation modes are tried from cheapest
       (none, selective, full). When the proportional split does not fit, layers move
       from the stages over their memory to those with room for whole layers
       (``CostModel.evaluate`` says each stage's peak and usable bytes; bytes per layer
       are measured once a stage's layers have changed), step by step until it fits or
       no move is left; the next recomputation mode is tried as well. The first mode
       that fits without moving layers ends the ladder (more recomputation only adds
       work to the same split). Where the spec allows ZeRO-2 or -3, they are the
       ladder's last rungs, tried (each with every recomputation mode) only for a
       micro-batch count where nothing fits under ZeRO-1; where the spec allows
       optimizer offload (``offload: [optimizer]``), the same ZeRO stages from 1 up with
       the optimizer on the host follow, under the same rule. A split that fits is also
       scored with each interleaved schedule the spec allows (``virtual_stages``, where
       every stage's layers divide evenly into the chunks), and sequence parallelism is
       on in every plan with a tensor-parallel stage where the spec allows it
       (``PlanSpace.to_plan``).
    8. Keep the best plan that fits, by the objective. Once one fits, the search stops
       after ``patience`` (4) stage counts in a row that do not improve it. ``budget``
       caps the cost-model calls; the order of step 2 decides what is left out when it
       binds.

``random``
    ``budget`` random valid plans of the plan space, drawn with
    ``numpy.random.default_rng(seed)``: a random number of stages (1 to
    ``min(layers, gpus)``), each a stage choice drawn uniformly from those of
    ``space.stage_choices(free)`` (given the GPUs still free) that keep the batch
    divisible, i.e. whose data-parallel degree keeps the least common multiple of all
    stages' degrees a divisor of the global batch, so every draw is valid. The choice is
    sampled without listing the choices, so large clusters cost nothing extra; a draw
    stops early when no GPU is left. Then a random layer split with at least one layer
    per stage (uniform over compositions), a random micro-batch count among those that
    split evenly, a random recomputation mode and ZeRO stage. Deterministic given the
    seed.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.errors import ConfigError
from hetpar.plan import Plan, Replica, Stage
from hetpar.problem.solution import Solution
from hetpar.problem.space import PlanSpace, StageChoice
from hetpar.runtime.rules import get_runtime

__all__ = ["megatron", "metis", "random", "best_of", "BASELINES"]

_RECOMPUTE_COST = {"none": 0, "selective": 1, "full": 2}


# ---- shared machinery ----------------------------------------------------------------------
class _Search:
    """Scores candidates, counts cost-model calls and keeps the best plan that fits."""

    def __init__(self, cm: CostModel, objective: Objective, budget: int | None,
                 deadline: float = math.inf) -> None:
        self.cm = cm
        self.objective = objective
        self.budget = budget
        self.deadline = deadline  # time.time() past which no more candidates are scored
        self.evaluations = 0
        self.feasible = 0
        self.best_plan: Plan | None = None
        self.best_value = math.inf

    @property
    def exhausted(self) -> bool:
        return ((self.budget is not None and self.evaluations >= self.budget)
                or (self.deadline < math.inf and time.time() > self.deadline))

    def _record(self, plan: Plan, times: np.ndarray, fits: bool) -> float:
        value = self.objective.score(times, fits)
        if fits:
            self.feasible += 1
        if value < self.best_value:
            self.best_value = value
            self.best_plan = plan
        return value

    def score(self, plan: Plan) -> float:
        """The plan's objective value (inf if it does not fit), via the fast path."""
        return self.measure(plan)[0]

    def measure(self, plan: Plan) -> tuple[float, list[float], list[float]]:
        """(objective value, inf if it does not fit; each stage's peak bytes per GPU; each
        stage's usable bytes) of an already-valid plan, from one evaluation without the
        report objects (building them was half of Metis's time on mixed-32): what
        ``CostModel.iteration_times`` computes, with the memory figures kept."""
        frame = self.cm.frame(plan)
        core = self.cm.core_split(frame, [st.layers for st in plan.stages])
        self.evaluations += 1
        value = self._record(plan, core.total, core.feasible)
        return value, core.used, [sf.usable_bytes for sf in frame.stages]

    def solution(self, method: str, start: float, details: dict[str, Any]) -> Solution:
        plan = self.best_plan
        est = None
        value = math.inf
        if plan is not None:
            est = self.cm.evaluate(plan)
            self.evaluations += 1
            value = est.value(self.objective)
        details = {"feasible_candidates": self.feasible, **details}
        if self.budget is not None:
            details.setdefault("budget", self.budget)
        return Solution(method=method, objective=self.objective.name,
                        plan=plan if math.isfinite(value) else None,
                        estimate=est if math.isfinite(value) else None, value=value,
                        wall_s=time.perf_counter() - start, evaluations=self.evaluations,
                        details=details)


def best_of(cm: CostModel, objective: Objective, plans: Iterable[Plan],
            ) -> tuple[Plan | None, float, int]:
    """(best plan that fits, its objective value, cost-model calls) over valid ``plans``.

    The plan is None and the value inf when none fits; ties keep the first plan."""
    search = _Search(cm, objective, None)
    for plan in plans:
        search.score(plan)
    return search.best_plan, search.best_value, search.evaluations


def _runs_precision(space: PlanSpace, host: int) -> bool:
    try:
        space.cluster.hosts[host].gpu.peak_flops(space.training.precision)
    except ConfigError:
        return False
    return True


def _type_speed(space: PlanSpace, gpu_type: str) -> float:
    host = space.cluster.hosts[space.hosts_of_type[gpu_type][0]]
    return host.gpu.peak_flops(space.training.precision)


def _usable_types(space: PlanSpace) -> list[str]:
    """GPU types that run the training precision, fastest first."""
    types = [t for t in space.types if _runs_precision(space, space.hosts_of_type[t][0])]
    mem = {t: space.cluster.hosts[space.hosts_of_type[t][0]].gpu.memory_bytes for t in types}
    return sorted(types, key=lambda t: (-_type_speed(space, t), -mem[t], t))


def _even_split(total: int, parts: int) -> list[int]:
    q, r = divmod(total, parts)
    return [q + 1 if i < r else q for i in range(parts)]


def _ends_split(total: int, parts: int) -> list[int]:
    """Even, with the remainder on the first and the last part (half each, the first
    the larger)."""
    q, r = divmod(total, parts)
    if parts == 1 or not r:
        return [q] * parts
    out = [q] * parts
    out[0] += (r + 1) // 2
    out[-1] += r // 2
    return out


# ---- megatron ------------------------------------------------------------------------------
def megatron(cm: CostModel, space: PlanSpace, objective: Objective, *, seed: int = 0,
             budget: int = 100_000, runtime: str = "any",
             deadline: float = math.inf) -> Solution:
    """Best uniform TP x PP x DP layout over GPUs ranked in host order (module docstring).

    ``seed`` is unused (the grid is deterministic); ``budget`` caps cost-model calls.
    ``runtime="megatron"``: layer splits Megatron-LM can express (the remainder of an
    uneven split on the first and last stage, not spread over the first stages), so that
    every layout is one it runs (the host order makes the ranks contiguous already).
    ``deadline`` (a ``time.time()``): stop there with the best plan so far, as the budget
    does (an exact search seeded by it keeps its time limit on thousands of hosts)."""
    del seed
    start = time.perf_counter()
    search = _Search(cm, objective, budget, deadline)
    cluster, training = space.cluster, space.training
    layers = space.model.layers
    hosts = [h for h in range(len(cluster.hosts)) if _runs_precision(space, h)]
    ranked = [(h, g) for h in hosts for g in range(cluster.hosts[h].num_gpus)]
    n = len(ranked)
    tps: list[int] = []
    if hosts:
        t = 1
        smallest = min(cluster.hosts[h].num_gpus for h in hosts)
        while t <= smallest:
            if space.model.heads % t == 0 and all(cluster.hosts[h].num_gpus % t == 0
                                                  for h in hosts):
                tps.append(t)
            t *= 2
    layouts = 0
    best: dict[str, Any] = {}
    for tp in tps:
        for pp in range(1, min(layers, n // tp) + 1):
            if search.exhausted:
                break
            dp = n // (tp * pp)
            split = _ends_split(layers, pp) if runtime == "megatron" else _even_split(layers, pp)
            stages = []
            for s in range(pp):
                reps = []
                for d in range(dp):
                    base = tp * (d + dp * s)
                    block = ranked[base:base + tp]
                    host = block[0][0]
                    assert all(h == host for h, _ in block), "tp block straddles hosts"
                    reps.append(Replica(cluster.hosts[host].name, tuple(g for _, g in block)))
                stages.append(Stage(split[s], tp, tuple(reps)))
            layouts += 1
            for m in space.micro_batch_options([dp]):
                for rc in training.recompute_modes:
                    for z in training.zero_stages:
                        if runtime != "any" and z > 1:
                            continue  # both frameworks run ZeRO 0 or 1 with pipelines
                        if search.exhausted:
                            break
                        before = search.best_plan
                        sp = training.sequence_parallel and any(s.tp > 1 for s in stages)
                        # Interleaving where the spec allows it and the runtime runs it.
                        for v in space.virtual_allowed(split, m):
                            if v == 1 or get_runtime(runtime).interleaves(tuple(split)):
                                value = search.score(Plan(tuple(stages), m, rc, z, sp, v))
                                # The optimizer on the host where the spec allows it, only
                                # where the plan does not fit without (never faster).
                                if not math.isfinite(value) and space.offloads and z >= 1 \
                                        and not search.exhausted:
                                    search.score(Plan(tuple(stages), m, rc, z, sp, v,
                                                      offload="optimizer"))
                        if search.best_plan is not before:
                            best = {"tp": tp, "pp": pp, "dp": dp, "idle_gpus": n - tp * pp * dp}
    return search.solution("megatron", start, {
        "layouts": layouts, "tp_options": tps, "gpus_ranked": n, **best,
        "budget_exhausted": search.exhausted})


# ---- metis ---------------------------------------------------------------------------------
def _pow2_groups(gpus: int, n: int) -> list[int] | None:
    """``n`` power-of-two group sizes from ``gpus`` GPUs, as many GPUs used as possible."""
    if n < 1 or gpus < n:
        return None
    parts = [1 << b for b in range(gpus.bit_length() - 1, -1, -1) if gpus >> b & 1]
    while len(parts) < n:
        big = parts.pop(0)  # the largest (parts stay sorted descending)
        parts = sorted(parts + [big // 2, big // 2], reverse=True)
    return parts[:n]


def _compositions(total: int, k: int) -> Iterator[tuple[int, ...]]:
    """Tuples of ``k`` positive integers summing to ``total``, lexicographically."""
    for cuts in itertools.combinations(range(1, total), k - 1):
        bounds = (0, *cuts, total)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:]))


def _pack(space: PlanSpace, free: list[int], gpu_type: str, tp: int,
          gpus: int) -> StageChoice | None:
    """A stage of ``gpus`` GPUs in blocks of ``tp`` from the type's hosts; updates ``free``."""
    eligible = [h for h in space.eligible_hosts(gpu_type, tp) if free[h] >= tp]
    need = gpus // tp
    one = [h for h in eligible if free[h] >= gpus]
    take: dict[int, int] = {}
    if one:
        h = min(one, key=lambda i: (free[i], i))
        take[h] = need
    else:
        for h in sorted(eligible, key=lambda i: (-free[i], i)):
            if need == 0:
                break
            b = min(free[h] // tp, need)
            take[h] = b
            need -= b
        if need:
            return None
    for h, b in take.items():
        free[h] -= b * tp
    hosts = tuple(sorted(take))
    return StageChoice(gpu_type, tp, hosts, tuple(take[h] for h in hosts))


def _proportional_layers(total: int, weights: Sequence[float]) -> list[int] | None:
    """Layers in proportion to ``weights``: at least one each, summing to ``total``."""
    p = len(weights)
    if p > total:
        return None
    wsum = float(sum(weights))
    raw = [total * w / wsum for w in weights]
    out = [max(1, math.floor(x)) for x in raw]
    while sum(out) > total:
        i = max((j for j in range(p) if out[j] > 1), key=lambda j: (out[j] - raw[j], -j))
        out[i] -= 1
    while sum(out) < total:
        i = max(range(p), key=lambda j: (raw[j] - out[j], -j))
        out[i] += 1
    return out


def _build_layout(space: PlanSpace, used: Sequence[str], groups: Sequence[Sequence[int]],
                  tps: Sequence[int], fastest_first: bool) -> tuple[StageChoice, ...] | None:
    """Stages of the given groups (per type, descending) in pipeline order, or None."""
    free = list(space.capacity)
    stages: list[StageChoice] = []
    for t, sizes, tp in zip(used, groups, tps):
        for size in sizes:  # largest groups packed first
            st = _pack(space, free, t, min(tp, size), size)
            if st is None:
                return None
            stages.append(st)
    return tuple(stages) if fastest_first else tuple(reversed(stages))


def _rebalance(search: _Search, space: PlanSpace, stages: Sequence[StageChoice],
               layers: Sequence[int], m: int, rc: str, zero: int,
               first: tuple[list[float], list[float]], offload: str = "none") -> float:
    """Move layers off overflowing stages until the plan fits; its value (inf if never).

    ``first``: the stages' peak and usable bytes under ``layers``, already measured (the
    plan was just scored). Each step measures every stage's peak memory, estimates a
    stage's bytes per layer (from two observations once its layers have changed, else
    its bytes over its layers, an overestimate), and moves from each overflowing stage
    the layers it needs to drop to the stages with room for whole layers, most room
    first. Gives up when a one-layer stage overflows, no stage has room or a split
    repeats."""
    layers = list(layers)
    p = len(layers)
    prev: list[tuple[int, float] | None] = [None] * p
    slope: list[float | None] = [None] * p
    seen: set[tuple[int, ...]] = set()
    used, usable = first
    while tuple(layers) not in seen:
        if seen:
            if search.exhausted:
                return math.inf
            value, used, usable = search.measure(space.to_plan(stages, layers, m, rc, zero,
                                                               offload=offload))
            if math.isfinite(value):
                return value
        seen.add(tuple(layers))
        for i in range(p):
            if prev[i] is not None and prev[i][0] != layers[i]:
                d = (used[i] - prev[i][1]) / (layers[i] - prev[i][0])
                if d > 0:
                    slope[i] = d
            prev[i] = (layers[i], used[i])
        per_layer = [slope[i] or used[i] / layers[i] for i in range(p)]
        need = {i: math.ceil((used[i] - usable[i]) / per_layer[i])
                for i in range(p) if used[i] > usable[i]}
        if any(layers[i] == 1 for i in need):
            return math.inf  # a stage of one layer overflows: moving layers cannot help
        room = {i: math.floor((usable[i] - used[i]) / per_layer[i])
                for i in range(p) if i not in need}
        moved = False
        for donor in sorted(need, key=lambda i: (-need[i], i)):
            want = min(need[donor], layers[donor] - 1)
            while want > 0:
                taker = max(room, key=lambda i: (room[i], -i), default=None)
                if taker is None or room[taker] < 1:
                    break
                k = min(want, room[taker])
                layers[donor] -= k
                layers[taker] += k
                room[taker] -= k
                want -= k
                moved = True
        if not moved:
            return math.inf
    return math.inf


def metis(cm: CostModel, space: PlanSpace, objective: Objective, *, seed: int = 0,
          budget: int = 50_000, max_stages: int = 16, patience: int = 4,
          balance: float = 1.0, deadline: float = math.inf) -> Solution:
    """Metis-style heterogeneity-aware heuristic (steps in the module docstring).

    ``seed`` is unused (the heuristic is deterministic); ``budget`` caps cost-model calls;
    ``max_stages`` bounds the pipeline depth; once a plan fits, the search stops after
    ``patience`` consecutive stage counts that do not improve it. ``deadline`` (a
    ``time.time()``) ends it as the budget does."""
    del seed
    start = time.perf_counter()
    search = _Search(cm, objective, budget, deadline)
    training = space.training
    nlayers = space.model.layers
    types = _usable_types(space)
    speed = {t: _type_speed(space, t) for t in types}
    total_of = {t: sum(space.cluster.hosts[h].num_gpus for h in space.hosts_of_type[t])
                for t in types}
    modes = sorted(training.recompute_modes, key=lambda r: _RECOMPUTE_COST.get(r, 99))
    # ZeRO-1 where allowed (never slower than 0, and 2 and 3 add traffic); else the least.
    zero = max((z for z in training.zero_stages if z <= 1), default=min(training.zero_stages))
    # The memory ladder's last rungs: ZeRO-2 and -3 where the spec allows them, tried for a
    # micro-batch count only where nothing fits under ``zero`` (they shard gradients and
    # weights at the price of more traffic).
    zeros = [zero, *sorted(z for z in training.zero_stages if z > max(zero, 1))]
    # Then, where the spec allows optimizer offload, the same ZeRO stages from 1 up with
    # the optimizer on the host (it buys memory for host copies and a CPU step,
    # costmodel/offload.py), under the same rule.
    rungs = [(z, "none") for z in zeros]
    if space.offloads:
        rungs += [(z, "optimizer") for z in zeros if z >= 1]
    limit = min(max_stages, nlayers) if types else 0
    done: dict[tuple[StageChoice, ...], float] = {}
    counters = {"rebalanced_fits": 0}
    best: dict[str, Any] = {}

    def score_layout(stages: tuple[StageChoice, ...], info: dict[str, Any]) -> float:
        """Best value of a stage layout over micro-batch counts and the memory ladder."""
        if stages in done:
            return done[stages]
        layers = _proportional_layers(nlayers, [s.gpus * speed[s.gpu_type] for s in stages])
        assert layers is not None
        out = math.inf
        for m in space.micro_batch_options([s.dp for s in stages]):
            got = math.inf  # under this micro-batch count
            for z, off in rungs:
                if (z, off) != (zero, "none") and math.isfinite(got):
                    break  # a higher rung only where nothing fits under the lower ones
                for rc in modes:
                    if search.exhausted:
                        break
                    before = search.best_plan
                    value, used, usable = search.measure(space.to_plan(
                        stages, layers, m, rc, z, offload=off))
                    fitted = math.isfinite(value)
                    if not fitted:
                        value = _rebalance(search, space, stages, layers, m, rc, z,
                                           (used, usable), off)
                        counters["rebalanced_fits"] += math.isfinite(value)
                    else:
                        # The interleaved schedule of the same split, where the spec allows
                        # it: a shorter bubble for more transfers and activations in flight.
                        for v in space.virtual_allowed(layers, m):
                            if v > 1 and not search.exhausted:
                                value = min(value, search.score(space.to_plan(
                                    stages, layers, m, rc, z, virtual_stages=v,
                                    offload=off)))
                    if search.best_plan is not before:
                        best.clear()
                        best.update(info, tp_per_stage=[s.tp for s in stages],
                                    dp_per_stage=[s.dp for s in stages], rebalanced=not fitted)
                    got = min(got, value)
                    if fitted:
                        break  # more recomputation only adds work to the same split
            out = min(out, got)
        if not search.exhausted:
            done[stages] = out
        return out

    stale = 0
    depth = 0
    for p in range(1, limit + 1):
        if search.exhausted or stale >= patience:
            break
        depth = p
        before_p = search.best_value
        for k in range(1, min(p, len(types)) + 1):
            used = types[:k]
            share = [total_of[t] * speed[t] for t in used]
            ideal = [p * w / sum(share) for w in share]
            for counts in _compositions(p, k):
                # Stages of about equal compute: a type's stage count within one of its
                # share of the pipeline's compute.
                if any(abs(n - x) > balance for n, x in zip(counts, ideal)):
                    continue
                full = [_pow2_groups(total_of[t], n) for t, n in zip(used, counts)]
                if any(g is None for g in full):
                    continue
                # Coordinates: each type's tp (capped at its largest group) and how many
                # of its GPUs it uses (all, half, a quarter, ...: idle GPUs can keep a
                # stage off a slow link or drop a straggler).
                coords: list[tuple[str, int, list[int]]] = []
                for j, (t, g) in enumerate(zip(used, full)):
                    coords.append(("tp", j, [tp for tp in space.tp_options[t] if tp <= g[0]]))
                    coords.append(("gpus", j, [total_of[t] >> i
                                               for i in range(total_of[t].bit_length())
                                               if total_of[t] >> i >= counts[j]]))
                for fastest_first in ((True, False) if k > 1 else (True,)):
                    info = {"types": list(used), "stages_per_type": list(counts),
                            "fastest_first": fastest_first}

                    def value_of(state: dict[str, list[int]]) -> float:
                        groups = [_pow2_groups(g, n) for g, n in zip(state["gpus"], counts)]
                        stages = _build_layout(space, used, groups, state["tp"], fastest_first)
                        if stages is None:
                            return math.inf
                        return score_layout(stages, {**info, "tp_per_type": state["tp"],
                                                     "gpus_per_type": state["gpus"]})

                    # Data parallelism first: the smallest tp and every GPU of each type,
                    # then one pass of coordinate descent, fastest type first.
                    state = {"tp": [o[0] for kind, _, o in coords if kind == "tp"],
                             "gpus": [total_of[t] for t in used]}
                    current = value_of(state)
                    for kind, j, options in coords:
                        for o in options:
                            if o == state[kind][j] or search.exhausted:
                                continue
                            cand = {**state, kind: [*state[kind][:j], o, *state[kind][j + 1:]]}
                            v = value_of(cand)
                            if v < current:
                                current, state = v, cand
        if math.isfinite(search.best_value):
            stale = 0 if search.best_value < before_p else stale + 1
    return search.solution("metis", start, {
        "layouts": len(done), "types_by_speed": types, "max_stages": limit,
        "stages_searched": depth, "rebalanced_fits": counters["rebalanced_fits"],
        "zero": zero, "zero_ladder": zeros,
        "offload_ladder": [z for z, off in rungs if off != "none"],
        "best_layout": dict(best),
        "budget_exhausted": search.exhausted})


# ---- random --------------------------------------------------------------------------------
def _random_stage(space: PlanSpace, free: Sequence[int], types: Sequence[str], lcm: int,
                  rng: np.random.Generator) -> StageChoice | None:
    """A stage choice drawn uniformly from those of ``space.stage_choices(free)`` (of
    ``types``) whose data-parallel degree ``d`` keeps ``lcm(lcm, d)`` a divisor of the
    global batch, so that some micro-batch count splits every stage evenly; None if none.

    Sampled without listing the choices: for each (type, tp) the number of block-count
    vectors with each sum ``d`` is a product of polynomials ``1 + x + ... + x^r`` (kept
    scaled, with the scale in log space); a sum is drawn by these counts, then the
    vector host by host, backwards, given the sum still to place."""
    batch = space.training.global_batch
    options = []  # (type, tp, hosts, ranges, prefix polynomials)
    cells = []  # (option, d, log count)
    for t, tp, hosts, ranges in space.stage_groups(free, types):
        if not hosts:
            continue
        polys = [np.ones(1)]
        logscale = 0.0
        for r in ranges:
            q = np.convolve(polys[-1], np.ones(r + 1))
            top = q.max()
            polys.append(q / top)
            logscale += math.log(top)
        last = polys[-1]
        for d in range(1, len(last)):
            if last[d] > 0 and batch % math.lcm(lcm, d) == 0:
                cells.append((len(options), d, math.log(last[d]) + logscale))
        options.append((t, tp, hosts, ranges, polys))
    if not cells:
        return None
    logw = np.array([c[2] for c in cells])
    w = np.exp(logw - logw.max())
    opt, d, _ = cells[int(rng.choice(len(cells), p=w / w.sum()))]
    t, tp, hosts, ranges, polys = options[opt]
    counts = [0] * len(hosts)
    left = d
    for j in range(len(hosts) - 1, -1, -1):
        before = polys[j]  # counts of the hosts before j, by their sum
        cs = [c for c in range(min(ranges[j], left) + 1) if left - c < len(before)]
        wj = np.array([before[left - c] for c in cs])
        c = cs[int(rng.choice(len(cs), p=wj / wj.sum()))]
        counts[j] = c
        left -= c
    assert left == 0
    return space.stage_from_counts(t, tp, hosts, counts)


def random(cm: CostModel, space: PlanSpace, objective: Objective, *, seed: int = 0,
           budget: int = 200) -> Solution:
    """Best of ``budget`` random valid plans of the space (module docstring)."""
    start = time.perf_counter()
    search = _Search(cm, objective, None)
    rng = np.random.default_rng(seed)
    training = space.training
    layers = space.model.layers
    types = _usable_types(space)
    usable = {h for t in types for h in space.hosts_of_type[t]}
    capacity = tuple(c if h in usable else 0 for h, c in enumerate(space.capacity))
    max_p = min(layers, sum(capacity))
    draws = 0
    while max_p >= 1 and draws < budget:
        p = int(rng.integers(1, max_p + 1))
        free: Sequence[int] = capacity
        stages: list[StageChoice] = []
        lcm = 1
        for _ in range(p):
            st = _random_stage(space, free, types, lcm, rng)
            if st is None:
                break  # no GPU left (or none that keeps the batch divisible)
            stages.append(st)
            free = space.take(free, st)
            lcm = math.lcm(lcm, st.dp)
        if not stages:
            break
        draws += 1
        n = len(stages)
        cuts = sorted(int(c) + 1 for c in rng.choice(layers - 1, n - 1, replace=False)) \
            if n > 1 else []
        bounds = [0, *cuts, layers]
        split = [b - a for a, b in zip(bounds, bounds[1:])]
        options = space.micro_batch_options([s.dp for s in stages])
        m = int(options[int(rng.integers(len(options)))])
        rc = training.recompute_modes[int(rng.integers(len(training.recompute_modes)))]
        z = int(training.zero_stages[int(rng.integers(len(training.zero_stages)))])
        search.score(space.to_plan(stages, split, m, rc, z))
    return search.solution("random", start, {"seed": seed, "budget": budget,
                                             "valid_plans": draws})


BASELINES = {"megatron": megatron, "metis": metis, "random": random}
