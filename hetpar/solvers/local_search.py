"""Local search over pipeline structures, each completed exactly.

The refinement (``refine.py``) finds the best micro-batches, recompute mode and layer
split for one structure; which structure (stages, their GPU types, TP degrees and hosts)
is the policy's choice. A learned policy's typical miss is a structure one edit away from
a much better one: a stage of slow GPUs that the pipeline would be faster without, a TP
degree one step off, two stages that should be one. ``improve_structure`` climbs from a
plan's structure through such edits (``structure_neighbours``), completing each
neighbour with the refinement's exact search, which only looks for completions better
than the best plan so far (so most neighbours are bounded away in a few steps). At a
local optimum of single edits it looks two edits away before it stops: dropping a stage
of slow GPUs often pays only once another stage's TP degree changes to hold its layers.
Before the single edits it takes global moves while one improves (``global_moves``):
drop every stage of one GPU type, add a stage over a type's idle GPUs, coarsen the
pipeline (``coarsenings``: runs of ..., 4, 2 consecutive stages merged), or start afresh
from a site's GPUs (``site_seeds``: one wide stage, or one stage per host, over one GPU
type within one of ``host_groups``, the clusters of hosts joined by fast routes).
No structure is completed twice (targets only fall, so one that failed stays beaten).
The climb itself (``climb.climb``) is the one the exact search's warm-start dive uses.

The budget is a count of scored completions (deterministic: the same plan on every
machine; an enumerated block of layer splits counts each split) and optionally seconds.
The result is never worse than the plan given.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import networkx as nx
import numpy as np

from hetpar.cluster.topology import Cluster
from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.plan import Plan
from hetpar.solvers.climb import climb
from hetpar.solvers.exact import SearchProblem, make_bounds
from hetpar.solvers.refine import complete_structure, refine_plan
from hetpar.problem.space import PlanSpace, StageChoice

__all__ = ["Improvement", "coarsenings", "global_moves", "host_groups", "improve_structure",
           "site_seeds", "structure_neighbours"]

Structure = tuple[StageChoice, ...]
# Scored completions per climb: at most about a second on one core at 16 bandwidth samples
# (about 5 us each).
DEFAULT_EVALUATIONS = 200_000
# Neighbour structures completed per climb at most. Scored completions bound a climb's time
# only while a completion's set-up is small beside its scoring: from a 24-stage start
# (test-hard-5 under the sweep) each neighbour cost 4.6 ms for 34 scored completions, and
# the climb took 57 s within the 200,000. On 29 held-out climbs from the sweep's starts the
# most neighbours completed was 679 (docs/agents.md, "Planning"), so a count (the same plan
# on every machine) that none of them reaches.
DEFAULT_NEIGHBOURS = 1_000


@dataclass(frozen=True)
class Improvement:
    plan: Plan  # the best plan found
    value: float  # its objective value (seconds)
    before: float  # the given plan's value
    moves: int  # edits accepted (0: the given structure was kept)
    neighbours: int  # structures completed
    steps: int  # search steps taken over all completions
    evaluations: int  # completions scored (what ``max_evaluations`` limits)
    wall_s: float

    @property
    def improved(self) -> bool:
        return self.value < self.before


def _stage(gpu_type: str, tp: int, use: dict[int, int]) -> StageChoice:
    hosts = tuple(sorted(h for h, b in use.items() if b > 0))
    return StageChoice(gpu_type, tp, hosts, tuple(use[h] for h in hosts))


def _emitter(space: PlanSpace, stages: Structure,
             ) -> Callable[[Structure], Iterator[Structure]]:
    """A filter for candidate structures: non-empty, no more stages than layers, neither
    ``stages`` nor one already emitted through it."""
    seen = {stages}

    def emit(cand: Structure) -> Iterator[Structure]:
        if cand and len(cand) <= space.model.layers and cand not in seen:
            seen.add(cand)
            yield cand

    return emit


def structure_neighbours(space: PlanSpace, stages: Structure) -> Iterator[Structure]:
    """Structures one edit away from ``stages``, each within the space's stage rules
    (every stage one GPU type, a TP degree of its options dividing its hosts' GPU
    counts, at least one block, no host over its GPUs) and distinct from ``stages``:
    drop a stage; change a stage's TP degree over the same GPUs; merge two adjacent
    stages of one type and degree; split a stage in two (by hosts, or one host's blocks
    in halves); grow a stage by one block or by a whole free host; shrink it by one
    block; swap two adjacent stages. The order is fixed, so the search is
    reproducible."""
    p = len(stages)
    hosts = space.cluster.hosts
    free = functools.reduce(space.take, stages, space.capacity)
    emit = _emitter(space, stages)

    for i, st in enumerate(stages):
        use = dict(zip(st.hosts, st.blocks))
        # Drop the stage: its layers go to the others.
        if p > 1:
            yield from emit(stages[:i] + stages[i + 1:])
        # The same GPUs at another TP degree.
        for tp in space.tp_options[st.gpu_type]:
            if tp == st.tp:
                continue
            gpus = {h: b * st.tp for h, b in use.items()}
            if all(g % tp == 0 and hosts[h].num_gpus % tp == 0 for h, g in gpus.items()):
                yield from emit(stages[:i] + (_stage(st.gpu_type, tp,
                                                     {h: g // tp for h, g in gpus.items()}),)
                                + stages[i + 1:])
        # Split in two adjacent stages.
        if len(st.hosts) > 1:
            cut = len(st.hosts) // 2
            first = {h: use[h] for h in st.hosts[:cut]}
            second = {h: use[h] for h in st.hosts[cut:]}
            yield from emit(stages[:i] + (_stage(st.gpu_type, st.tp, first),
                                          _stage(st.gpu_type, st.tp, second)) + stages[i + 1:])
        elif st.blocks[0] > 1:
            h, b = st.hosts[0], st.blocks[0]
            yield from emit(stages[:i] + (_stage(st.gpu_type, st.tp, {h: b // 2}),
                                          _stage(st.gpu_type, st.tp, {h: b - b // 2}))
                            + stages[i + 1:])
        # Grow by one block, or by every free block of a host.
        for h in space.eligible_hosts(st.gpu_type, st.tp):
            room = free[h] // st.tp
            if room < 1:
                continue
            for add in dict.fromkeys((1, room)):
                grown = dict(use)
                grown[h] = grown.get(h, 0) + add
                yield from emit(stages[:i] + (_stage(st.gpu_type, st.tp, grown),)
                                + stages[i + 1:])
        # Shrink by one block (a stage keeps at least one).
        if st.dp > 1:
            for h in st.hosts:
                shrunk = dict(use)
                shrunk[h] -= 1
                yield from emit(stages[:i] + (_stage(st.gpu_type, st.tp, shrunk),)
                                + stages[i + 1:])
        if i + 1 < p:
            nxt = stages[i + 1]
            # Merge with the next stage.
            if nxt.gpu_type == st.gpu_type and nxt.tp == st.tp:
                merged = dict(use)
                for h, b in zip(nxt.hosts, nxt.blocks):
                    merged[h] = merged.get(h, 0) + b
                yield from emit(stages[:i] + (_stage(st.gpu_type, st.tp, merged),)
                                + stages[i + 2:])
            # Swap with the next stage (pipeline order sets the transfers).
            yield from emit(stages[:i] + (nxt, st) + stages[i + 2:])


def global_moves(space: PlanSpace, stages: Structure,
                 seeds: Iterable[Structure] | None = None) -> Iterator[Structure]:
    """Structures far from ``stages`` in single edits, for the climb's first phase: every
    stage of one GPU type dropped (a slow type, or a site behind a slow link, that the
    pipeline is faster without), one stage added at either end over all the free GPUs of
    a type (GPUs the plan leaves idle), at each of the type's TP degrees that they
    allow, the ``coarsenings``, and ``seeds`` (default: the ``site_seeds``, which do not
    depend on ``stages``: a climb lists them once). Each is within the space's stage
    rules; replica counts of new stages divide the global batch."""
    emit = _emitter(space, stages)

    types = list(dict.fromkeys(st.gpu_type for st in stages))
    if len(types) > 1:
        for t in types:
            yield from emit(tuple(st for st in stages if st.gpu_type != t))
    free = functools.reduce(space.take, stages, space.capacity)
    batch = space.training.global_batch
    for t in space.types:
        for tp in space.tp_options[t]:
            use = {h: free[h] // tp for h in space.eligible_hosts(t, tp) if free[h] >= tp}
            if not use:
                continue
            stage = _even_replicas(space, [(t, tp, use)], batch, grow=False, free=free)
            if stage is None:
                continue
            yield from emit(stage + stages)
            yield from emit(stages + stage)
    for cand in coarsenings(space, stages):
        yield from emit(cand)
    for cand in site_seeds(space) if seeds is None else seeds:
        yield from emit(cand)


def host_groups(cluster: Cluster) -> tuple[tuple[int, ...], ...]:
    """Nested groups of hosts joined by fast routes (single linkage on the routes'
    bottleneck mean bandwidth): for each distinct bottleneck value, the connected
    components of the hosts whose routes are at least that fast, whole cluster last.
    Sites behind slow WAN links, racks behind an oversubscribed spine and single hosts
    all come out without a threshold to tune."""
    n = len(cluster.hosts)
    means = np.array([link.bandwidth.mean() for link in cluster.links] + [np.inf])
    bott = means[cluster.route_link_indices()].min(axis=2)
    np.fill_diagonal(bott, np.inf)
    groups: dict[tuple[int, ...], None] = {(h,): None for h in range(n)}
    for theta in sorted({float(b) for b in bott[np.isfinite(bott)]}, reverse=True):
        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from(zip(*np.nonzero(bott >= theta)))
        for comp in nx.connected_components(graph):
            groups.setdefault(tuple(sorted(int(h) for h in comp)), None)
    groups.setdefault(tuple(range(n)), None)
    return tuple(groups)


def site_seeds(space: PlanSpace) -> Iterator[Structure]:
    """Fresh starts from no plan's structure: for each ``host_groups`` group, GPU type in
    it and TP degree, every GPU of the type there in one data-parallel stage, and (two
    hosts or more) a pipeline of one stage per host. A policy that spread a pipeline over
    sites, or split one host's GPUs into stages of mixed TP degrees, is many single edits
    from a plan that keeps to one site or one wide stage; these are each one completion.
    Replica counts are trimmed to divide the global batch."""
    batch = space.training.global_batch
    cap = space.capacity
    for group in host_groups(space.cluster):
        members = set(group)
        for t in space.types:
            for tp in space.tp_options[t]:
                hosts = [h for h in space.eligible_hosts(t, tp) if h in members]
                if not hosts:
                    continue
                wide = _even_replicas(space, [(t, tp, {h: cap[h] // tp for h in hosts})],
                                      batch, grow=False)
                if wide is not None:
                    yield wide
                if 1 < len(hosts) <= space.model.layers:
                    deep = _even_replicas(space, [(t, tp, {h: cap[h] // tp}) for h in hosts],
                                          batch, grow=False)
                    if deep is not None:
                        yield deep


def coarsenings(space: PlanSpace, stages: Structure) -> Iterator[Structure]:
    """Shallower pipelines of about the same GPUs: consecutive runs of ``k`` stages of one
    GPU type and TP degree merged into one stage each (their blocks become its
    data-parallel replicas), for k = ..., 8, 4, 2 from the whole pipeline down (the
    shallowest first: they are the cheapest to complete, and a good one bounds the deeper
    ones' searches). A merged
    stage whose replica count divides no micro-batch of the global batch is trimmed to
    the nearest count that does, and (as a second candidate) grown into free GPUs of its
    type to the next one. A deep pipeline of small stages is the typical miss of a
    policy on a cluster larger than those it trained on, and a climb by single merges
    pays a full scan of neighbours for every stage it removes."""
    p = len(stages)
    batch = space.training.global_batch
    seen = {stages}
    k = 2
    while k < p:
        k *= 2
    while k >= 2:
        groups: list[list[StageChoice]] = []
        for st in stages:
            last = groups[-1] if groups else None
            if last and len(last) < k and st.gpu_type == last[0].gpu_type and \
                    st.tp == last[0].tp:
                last.append(st)
            else:
                groups.append([st])
        merged = []
        for run in groups:
            use: dict[int, int] = {}
            for r in run:
                for h, b in zip(r.hosts, r.blocks):
                    use[h] = use.get(h, 0) + b
            merged.append((run[0].gpu_type, run[0].tp, use))
        for grow in (False, True):
            cand = _even_replicas(space, merged, batch, grow)
            if cand is not None and len(cand) < p and cand not in seen:
                seen.add(cand)
                yield cand
        k //= 2


def _even_replicas(space: PlanSpace, merged: list[tuple[str, int, dict[int, int]]],
                   batch: int, grow: bool, free: tuple[int, ...] | None = None,
                   ) -> Structure | None:
    """The merged stages with replica counts that divide the global batch: blocks taken
    off (from the hosts with fewest first, so whole hosts come free) or, with ``grow``,
    added from free GPUs of the stage's type (hosts it uses first); None when growing
    finds too few. ``free``: the GPUs free besides ``merged`` (default: all but theirs)."""
    if free is None:
        free = list(space.capacity)
        for _, tp, use in merged:
            for h, b in use.items():
                free[h] -= b * tp
    else:
        free = list(free)
    out = []
    for gpu_type, tp, use in merged:
        use = dict(use)
        dp = sum(use.values())
        if batch % dp:
            if grow:
                want = next((d for d in range(dp + 1, batch + 1) if batch % d == 0), None)
                if want is None:
                    return None
                order = sorted(space.eligible_hosts(gpu_type, tp),
                               key=lambda h, use=use: (h not in use, h))
                for h in order:
                    while dp < want and free[h] >= tp:
                        use[h] = use.get(h, 0) + 1
                        free[h] -= tp
                        dp += 1
                if dp < want:
                    return None
            else:
                want = max(d for d in range(1, dp) if batch % d == 0)
                for h in sorted(use, key=lambda h: (use[h], -h)):
                    while dp > want and use[h] > 0:
                        use[h] -= 1
                        free[h] += tp
                        dp -= 1
        out.append(_stage(gpu_type, tp, use))
    return tuple(out)


def improve_structure(cm: CostModel, space: PlanSpace, objective: Objective, plan: Plan, *,
                      max_evaluations: int | None = DEFAULT_EVALUATIONS,
                      neighbour_steps: int = 150, time_limit: float | None = None,
                      beat: float = math.inf, depth: int = 2,
                      max_neighbours: int | None = DEFAULT_NEIGHBOURS) -> Improvement:
    """Hill-climb from ``plan``'s structure: complete every neighbour exactly (within
    ``neighbour_steps`` search steps each) and move to the best one that improves, until
    none does (with ``depth`` 2, also none two edits away) or ``max_evaluations`` scored
    completions (over the whole climb; the
    budget that sets its cost), ``max_neighbours`` neighbour completions or ``time_limit``
    seconds are spent. ``plan`` itself is
    refined first. ``beat``: a value the caller already holds (only better completions
    are sought; the refined ``plan`` comes back when none is found)."""
    start = time.perf_counter()
    deadline = start + time_limit if time_limit is not None else math.inf
    budget = math.inf if max_evaluations is None else max_evaluations
    bounds = make_bounds(SearchProblem(cm, space, objective))
    first = refine_plan(cm, space, objective, plan, max_steps=neighbour_steps,
                        time_limit=time_limit, beat=beat, bounds=bounds)
    best_plan, best = first.plan, first.value
    steps, used, neighbours = first.steps, first.evaluations, 0
    current, _ = space.decompose(best_plan)

    most = math.inf if max_neighbours is None else max_neighbours

    def spent() -> bool:
        return used >= budget or neighbours >= most or time.perf_counter() >= deadline

    # Every structure completed so far: one that did not beat the target then cannot
    # beat it now (targets only fall), so none is completed twice.
    tried: set[Structure] = {current}

    def score(cand: Structure, target: float) -> tuple[float, Plan | None]:
        """The best completion of ``cand`` below ``target`` (inf and None if none)."""
        nonlocal steps, used, neighbours
        left = None if time_limit is None else max(deadline - time.perf_counter(), 0.0)
        done = complete_structure(
            cm, space, objective, cand, max_steps=neighbour_steps, time_limit=left,
            beat=target, bounds=bounds,
            max_evaluations=None if max_evaluations is None else int(budget - used))
        steps += done.steps
        used += done.evaluations
        neighbours += 1
        return done.value, done.plan

    # Global moves first while one improves: a few completions can remove most of a deep
    # pipeline's stages, a whole GPU type or site, or put idle GPUs to work, which single
    # edits would do one full scan of neighbours at a time.
    seeds = tuple(site_seeds(space))
    current, best, best_plan, taken = climb(
        current, best, best_plan, lambda at: global_moves(space, at, seeds), score,
        beat=beat, spent=spent, tried=tried)

    def edits(at: Structure) -> Iterator[Structure]:
        return structure_neighbours(space, at)

    # Then single edits; at a local optimum of those, a look two edits away (a stage of
    # slow GPUs may only be worth dropping once another stage changes its TP degree).
    current, best, best_plan, more = climb(
        current, best, best_plan, edits, score, beat=beat, spent=spent, tried=tried,
        lookahead=edits if depth > 1 else None)
    moves = taken + more
    return Improvement(best_plan, best, first.before, moves, neighbours, steps, used,
                       time.perf_counter() - start)
