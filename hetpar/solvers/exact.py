"""Exact search: branch and bound over the plan space, in parallel over subtrees.

The search builds the pipeline stage by stage (``PlanSpace.stage_choices``). At every
prefix it

1. breaks symmetry: of plans equal up to a permutation of interchangeable hosts only the
   lexicographic leader is visited (``SymmetryCheck``);
2. prunes by memory and by bound: for each micro-batch count and recompute mode, the
   prefix's stages and what the free GPUs could still build must be able to hold every
   layer in memory and within the incumbent's time (``Bounds.prefix_alive``, which
   needs no full evaluation);
3. closes the prefix as a complete pipeline and solves its layer split exactly
   (``best_split``): a depth-first search over each stage's layer count, pruned by an
   admissible bound built from the cost model's affine structure (a water-filling bound of
   the slowest pipeline cycle plus fixed costs), with the cost model itself at the
   leaves.

ZeRO-1, where the training spec allows it, is never worse than none in the cost model
(same traffic, less memory, a shorter optimizer step), so only the highest allowed stage
is searched. Subtrees below the first stage are tasks for a ``SearchExecutor``; workers
share the incumbent. With a time limit the search returns the best plan found, a proven
lower bound and the gap.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.frame import PlanFrame, SplitTables
from hetpar.costmodel.objective import Objective
from hetpar.errors import InfeasibleError
from hetpar.plan import Plan
from hetpar.solvers.bounds import Bounds, StageProfile, root_bound
from hetpar.solvers.climb import best_move, climb
from hetpar.problem.space import PlanSpace, StageChoice, SymmetryCheck
from hetpar.runtime.rules import (allowed_splits, check_plan, get_runtime, stage_extends,
                                  structure_ok, usable_free)

__all__ = ["BudgetSearcher", "SearchProblem", "TaskResult", "SEEDS", "SearchExecutor",
           "InlineExecutor", "Incumbent", "search_subtree", "best_split", "root_tasks",
           "split_task", "Task", "estimate_space_size", "few_collections",
           "prefix_lower_bound", "root_lower_bound", "make_bounds", "dive_structures", "dive"]


@contextlib.contextmanager
def few_collections(threshold: int = 100_000) -> Iterator[None]:
    """Run the block with the cyclic garbage collector's first generation collected
    every ``threshold`` allocations instead of 700, then restore the setting. The search
    allocates millions of short-lived tuples and lists, none of them in cycles, and the
    collections that this triggers traverse every cached bound table: 14% of a proof on
    amp-het-16 (27.6 s against 23.8 s without any collection, side by side)."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], threshold), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


@dataclass(frozen=True)
class SearchProblem:
    """Everything a worker needs (picklable)."""

    cm: CostModel
    space: PlanSpace
    objective: Objective
    deadline: float = math.inf  # time.time() after which workers stop
    seed_value: float = math.inf  # a plan of the space already known (e.g. a heuristic's)
    # The framework the plans must run on (hetpar.runtime.rules): the search visits only
    # its plans; the bounds, which hold over the whole space, hold over them too.
    runtime: str = "any"
    # time.time() after which the baselines' seed tasks stop with their best plan so far:
    # the deadline, or the bound's grace after the start where that is later, so that
    # they finish wherever they take a second or two and the answer is never worse.
    seeds_until: float = math.inf


class Incumbent(Protocol):
    """The best objective value found so far, shared by all workers."""

    def get(self) -> float: ...
    def offer(self, value: float) -> None: ...


@dataclass
class LocalIncumbent:
    value: float = math.inf

    def get(self) -> float:
        return self.value

    def offer(self, value: float) -> None:
        self.value = min(self.value, value)


@dataclass
class Counters:
    nodes: int = 0
    leaves: int = 0
    pruned_bound: int = 0
    pruned_memory: int = 0
    pruned_symmetry: int = 0

    def add(self, other: Counters) -> None:
        for name in ("nodes", "leaves", "pruned_bound", "pruned_memory", "pruned_symmetry"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class TaskResult:
    value: float
    plan: Plan | None
    counters: Counters
    finished: bool
    wall_s: float = 0.0  # a seed task's own seconds (its part of the answer's timings)
    steps: int = 0  # search steps taken under a step budget (``max_steps``)


class _Stop(Exception):
    """Raised inside a search when the deadline passes."""


@dataclass
class Searcher:
    """One worker's depth-first search; holds per-process caches."""

    problem: SearchProblem
    incumbent: Incumbent
    bounds: Bounds | None = None  # reuse one per process: it caches stage profiles
    counters: Counters = field(default_factory=Counters)
    best_value: float = math.inf
    best_plan: Plan | None = None
    _tick: int = 0
    _combos: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        p = self.problem
        self.runtime = get_runtime(p.runtime)
        self.zeros = zero_options(p.space.zero_stages, self.runtime.zero_stages)
        if not self.zeros:
            raise InfeasibleError(
                f"{self.runtime.name} runs ZeRO {' or '.join(map(str, self.runtime.zero_stages))}"
                f" with pipeline parallelism; the training spec allows only "
                f"{', '.join(map(str, p.space.zero_stages))}")
        self.zero = self.zeros[0]  # the structure's frame is built for the first
        # Without a pipeline a runtime may run more stages (DeepSpeed: ZeRO 0-3).
        self._zeros_single = zero_options(p.space.zero_stages, self.runtime.zero_for(1))
        if self.bounds is None:
            self.bounds = make_bounds(p)
        self.layers = p.cm.model.layers

    def zeros_for(self, stages: int) -> tuple[int, ...]:
        """The ZeRO stages a pipeline of this many stages tries (``zero_options``)."""
        return self.zeros if stages > 1 else self._zeros_single

    def offload_zeros(self, stages: int) -> tuple[int, ...]:
        """The ZeRO stages it also tries with the optimizer on the host, where the space
        allows offload (``PlanSpace.offloads``; it needs ZeRO >= 1)."""
        if not self.problem.space.offloads:
            return ()
        return tuple(z for z in self.zeros_for(stages) if z >= 1)

    def chunk_counts(self, stages: int, m: int) -> tuple[int, ...]:
        """The chunk counts above 1 a closed pipeline may interleave with: the space's
        (``PlanSpace.virtual_allowed`` less the split's divisibility), where the runtime
        interleaves at all; each split still needs ``runtime.interleaves``."""
        if stages < 2 or m % stages or self.runtime.interleaving == "none":
            return ()
        return tuple(v for v in self.problem.space.virtual_options if v > 1)

    # ---- shared state --------------------------------------------------------------
    def target(self) -> float:
        return min(self.incumbent.get(), self.best_value)

    def _check_time(self) -> None:
        # Every call: a node's bounds can take tens of milliseconds on large clusters,
        # far more than reading the clock.
        if time.time() > self.problem.deadline:
            raise _Stop

    def offer(self, value: float, plan: Plan) -> None:
        if value < self.best_value:
            self.best_value, self.best_plan = value, plan
            self.incumbent.offer(value)

    # ---- skeleton tree ----------------------------------------------------------------
    def combos(self, dps: Iterable[int]) -> list[tuple[int, str]]:
        """(micro-batch count, recompute mode) pairs valid for these replica counts."""
        key = tuple(sorted(set(dps)))
        out = self._combos.get(key)
        if out is None:
            space = self.problem.space
            out = self._combos[key] = [(m, rc) for m in space.micro_batch_options(key)
                                       for rc in space.recompute_modes]
        return out

    def status(self, prefix: tuple[StageChoice, ...], free: tuple[int, ...],
               inherited: frozenset[tuple[int, str]] | None,
               ) -> tuple[list[tuple[int, str]], frozenset[tuple[int, str]]]:
        """(combinations under which the prefix closed as a pipeline may beat the
        incumbent, combinations under which some extension may); counts prunes.

        Only combinations still open at the parent are tried (``inherited``; None at a
        task's root): the parent's bound already covers this prefix's extensions."""
        target = self.target()
        memory_only = True
        closed: list[tuple[int, str]] = []
        opened: list[tuple[int, str]] = []
        for combo in self.combos(s.dp for s in prefix):
            if inherited is not None and combo not in inherited:
                memory_only = False
                continue
            # Between pairs too: on large clusters one pair's bounds can take a second.
            self._check_time()
            c_ok, o_ok, by_memory = self.bounds.prefix_status(prefix, free, combo[0], combo[1],
                                                              target)
            if c_ok:
                closed.append(combo)
            if o_ok:
                opened.append(combo)
            memory_only &= by_memory
        if not closed and not opened:
            if memory_only:
                self.counters.pruned_memory += 1
            else:
                self.counters.pruned_bound += 1
        return closed, frozenset(opened)

    def walk(self, prefix: tuple[StageChoice, ...], free: tuple[int, ...],
             sym: SymmetryCheck, inherited: frozenset[tuple[int, str]] | None = None,
             part: tuple[int, int] = (0, 1)) -> None:
        """Search every plan starting with ``prefix``; with ``part = (k, n)`` only the
        k-th of n parts of them (``Task.part``)."""
        self._check_time()
        # A runtime's host order rules out the hosts the prefix is done with: neither its
        # extensions nor its bound may count their GPUs.
        free = usable_free(prefix, free, self.runtime)
        k, n = part
        counted = self.counters
        if k:
            self.counters = Counters()  # the node and its prunes are part 0's to count
        try:
            self.counters.nodes += 1
            closed, opened = self.status(prefix, free, inherited)
        finally:
            self.counters = counted
        if not closed and not opened:
            return
        if closed and k == 0:
            self.close(prefix, closed)
        if len(prefix) >= self.layers or not opened:
            return
        space = self.problem.space
        part_of: dict[int, int] = {}
        if space.count_stage_choices(free) > LIST_STAGES:
            # Too many children to list (many hosts with room): visited lazily, in the
            # same order. A part's GPU counts are then every n-th of those the groups
            # could form, canonical or not (still one part for each child), and only its
            # own are generated: skipping the others took seconds past a deadline.
            mine: set[int] | None = None
            if n > 1:
                sizes = sorted({tp * d for _, tp, _, room in space.stage_groups(free)
                                for d in range(1, sum(room) + 1)}, reverse=True)
                mine = {g for j, g in enumerate(sizes) if j % n == k}
            restricted = not self.runtime.unrestricted
            if self.runtime.uniform and prefix:
                # Every stage has the first one's GPU count: the others are never built.
                mine = {prefix[0].gpus} & (mine if mine is not None else {prefix[0].gpus})
            for stage in space.stage_choices_by_size(free, sizes=mine):
                # A child passed over is a step too: runs of them visit no node, and on
                # many interchangeable hosts nearly every child is one (a budget of steps
                # that did not count them ran for hours on 64 hosts).
                if restricted and not stage_extends(prefix, stage, self.runtime):
                    self._check_time()
                    continue
                nxt = sym.extend(stage)
                if nxt is None:
                    self.counters.pruned_symmetry += k == 0
                    self._check_time()
                else:
                    self.walk(prefix + (stage,), space.take(free, stage), nxt, opened)
            return
        children = sorted(space.stage_choices(free), key=lambda s: -s.gpus)
        if not self.runtime.unrestricted:
            children = [c for c in children if stage_extends(prefix, c, self.runtime)]
        canonical = [(stage, nxt) for stage in children
                     if (nxt := sym.extend(stage)) is not None]
        if k == 0:
            self.counters.pruned_symmetry += len(children) - len(canonical)
        if n > 1:
            # A part takes every n-th of the children's distinct GPU counts (largest
            # first), not every n-th child: children that take as many GPUs leave as many
            # free, and their subtrees reach many of the same states, whose bound tables
            # the worker then builds once (docs/history/solvers-rounds.md, eighth round).
            sizes = sorted({stage.gpus for stage, _ in canonical}, reverse=True)
            part_of = {g: j % n for j, g in enumerate(sizes)}
        for stage, nxt in canonical:
            if n == 1 or part_of[stage.gpus] == k:
                self.walk(prefix + (stage,), space.take(free, stage), nxt, opened)

    # ---- closing a prefix: the best layer split -----------------------------------------
    def close(self, stages: tuple[StageChoice, ...],
              combos: Iterable[tuple[int, str]] | None = None) -> None:
        p = len(stages)
        for m, rc in self.combos(s.dp for s in stages) if combos is None else combos:
            profiles = []
            for i, st in enumerate(stages):
                prof = self.bounds.profile(st, m, rc, i, p, i == 0, i == p - 1)
                if prof is None:
                    break
                profiles.append(prof)
            else:
                if sum(min(pr.cap, self.layers) for pr in profiles) < self.layers or min(
                        pr.cap for pr in profiles) < 1:
                    self.counters.pruned_memory += 1
                    continue
                if self.runtime.splits != "any":
                    self._close_runtime(stages, profiles, m, rc)
                else:
                    best_split(self, stages, profiles, m, rc)

    def _close_runtime(self, stages: tuple[StageChoice, ...], profiles: list[StageProfile],
                       m: int, rc: str) -> None:
        """The best of the few layer splits the runtime can express (Megatron-LM's even
        split with its own first and last counts, DeepSpeed's uniform partition), all
        scored at once."""
        caps = tuple(min(pr.cap, self.layers) for pr in profiles)
        splits = allowed_splits(self.layers, caps, self.runtime.splits)
        if not len(splits):
            self.counters.pruned_memory += 1
            return
        self._check_time()
        cm, space = self.problem.cm, self.problem.space
        frame = cm.frame(space.to_plan(stages, tuple(int(n) for n in splits[0]), m, rc,
                                       self.zero))
        _score_block(self, stages, frame, cm.split_tables(frame), splits, m, rc)


def zero_options(allowed: Sequence[int], runnable: Sequence[int]) -> tuple[int, ...]:
    """The ZeRO stages a search must try, in increasing order: those the spec allows and
    the runtime runs, less ZeRO-0 where ZeRO-1 is allowed (never faster, never smaller).
    From ZeRO-1 up a stage is never faster than the one below it, so a split takes the
    first of them that fits (``best_split``, ``_score_block``); the bounds take the memory
    of the most sharded one without its gathered layers, less than any of them needs."""
    zeros = sorted(z for z in allowed if z in runnable)
    if 1 in zeros and 0 in zeros:
        zeros.remove(0)
    return tuple(zeros)


@dataclass
class BudgetSearcher(Searcher):
    """A searcher that also stops after ``max_steps`` clock checks (one per search node),
    once ``max_evaluations`` completions are scored (an enumerated block of splits counts
    each), or once ``stop()`` says so. Budgets of steps and completions, unlike a time
    limit, give the same answer on every machine: the dive closes each structure within
    a step budget, the refinement and the structure local search (``refine.py``,
    ``local_search.py``) complete structures within both."""

    max_steps: int | None = None
    max_evaluations: int | None = None
    stop: Callable[[], bool] | None = None
    steps: int = 0

    def _check_time(self) -> None:
        self.steps += 1
        if self.max_steps is not None and self.steps > self.max_steps:
            raise _Stop
        if self.max_evaluations is not None and self.counters.leaves >= self.max_evaluations:
            raise _Stop
        if self.stop is not None and self.stop():
            raise _Stop
        super()._check_time()


class _SuffixFill:
    """``min over real n_i >= 1 with sum_i n_i = total of max_i (a_i n_i + g_i)`` for
    every suffix ``i >= j`` of the stages, in O(1) per query.

    At any level ``tau >= max_i (a_i + g_i)`` every stage can hold its one layer, so the
    layers a level admits are ``sum_i (tau - g_i) / a_i``, linear in ``tau``: the least
    level is ``max(max_i (a_i + g_i), (total + sum_i g_i / a_i) / sum_i 1 / a_i)``. The
    suffix sums and maxima are tabulated once per pipeline (the search asks for every
    suffix at every node of the split tree)."""

    def __init__(self, a: list[float], g: list[float]) -> None:
        p = len(a)
        self.lo = [-math.inf] * (p + 1)
        self.inv = [0.0] * (p + 1)
        self.ga = [0.0] * (p + 1)
        self.free = [False] * (p + 1)  # a stage with a == 0 holds any number of layers
        for i in range(p - 1, -1, -1):
            self.lo[i] = max(self.lo[i + 1], a[i] + g[i])
            if a[i] > 0:
                self.inv[i] = self.inv[i + 1] + 1.0 / a[i]
                self.ga[i] = self.ga[i + 1] + g[i] / a[i]
                self.free[i] = self.free[i + 1]
            else:
                self.inv[i], self.ga[i], self.free[i] = self.inv[i + 1], self.ga[i + 1], True

    def __call__(self, j: int, total: float) -> float:
        lo = self.lo[j]
        if self.free[j] or self.inv[j] <= 0:
            return lo
        return max(lo, (total + self.ga[j]) / self.inv[j])


def best_split(s: Searcher, stages: tuple[StageChoice, ...], prof: list[StageProfile], m: int,
               rc: str) -> None:
    """Exact best layer split of a complete pipeline for one (M, recompute) choice."""
    p = len(stages)
    L = s.layers
    space, cm, objective = s.problem.space, s.problem.cm, s.problem.objective

    frame = None  # the structure's transfer terms, shared by every split (costmodel/frame.py)

    def evaluate(split: tuple[int, ...]) -> tuple[float, np.ndarray | None]:
        nonlocal frame
        plan = None  # built only when needed: for the first frame, or a better plan
        if frame is None:
            plan = space.to_plan(stages, split, m, rc, s.zero)
            frame = cm.frame(plan)
        core = cm.core_split(frame, split)
        s.counters.leaves += 1
        value = objective.score(core.total, core.feasible)
        best_opts: tuple[int, int, str] = (s.zero, 1, "none")
        zeros = s.zeros_for(p)
        offload_zeros = s.offload_zeros(p)
        chunks = [v for v in s.chunk_counts(p, m)
                  if all(n % v == 0 for n in split) and s.runtime.interleaves(split)]
        for v in (1, *chunks):
            at_z = value if v == 1 else math.inf
            zero = s.zero if v == 1 else -1
            for z in zeros if v > 1 else [z for z in zeros if z != s.zero]:
                if math.isfinite(at_z) and zero >= 1:
                    break  # a higher ZeRO stage is never faster (comm.sharded_dp_traffic)
                other = cm.core_split(cm.frame(space.to_plan(stages, split, m, rc, z, v)),
                                      split)
                score = objective.score(other.total, other.feasible)
                if score < at_z or zero < 0:
                    at_z, zero = score, z
            off = "none"
            # The optimizer on the host: never faster than the same ZeRO stage without it,
            # nor than a lower one with it, so tried below the first ZeRO stage >= 1 that
            # fits without it, up to the first that fits with it.
            fits_at = zero if math.isfinite(at_z) and zero >= 1 else math.inf
            for z in offload_zeros:
                if z >= fits_at:
                    break
                other = cm.core_split(cm.frame(space.to_plan(stages, split, m, rc, z, v,
                                                              "optimizer")), split)
                score = objective.score(other.total, other.feasible)
                if score < at_z or zero < 0:
                    at_z, zero, off = score, z, "optimizer"
                if math.isfinite(score):
                    break
            if at_z < value:
                value, best_opts, plan = at_z, (zero, v, off), None
        if value < s.best_value:
            s.offer(value, plan or space.to_plan(stages, split, m, rc, *best_opts))
        return value, core.boundary

    # A first split in proportion to each stage's speed, within memory. Transfer times do
    # not depend on the split: bound without them first, and only if that does not prune,
    # evaluate the first split, whose report gives them (and a first incumbent).
    a = [pr.a for pr in prof]
    # The stages' work enters the fill at the bounds' share (1/v for the most chunks the
    # space allows: Bounds.work_share); their cycles and all-reduces in full.
    assert s.bounds is not None  # made in __post_init__
    share = s.bounds.closed_share(p, m)
    fixed0 = s.bounds.fixed + share * sum(pr.b for pr in prof)
    gam0 = [pr.b for pr in prof]
    target = s.target()
    # Two bounds of the same relaxation: the cheap one minimises the work sum and the
    # slowest cycle apart (O(p)), the root bound jointly (a line search); the cheap one
    # settles most structures a refinement or search rules out.
    opt_least = max(pr.opt_a + pr.opt_b for pr in prof)
    apart = _SuffixFill([(m - 1) * pr.a + pr.d for pr in prof],
                        [(m - 1) * pr.b + pr.d0 for pr in prof])(0, L)
    if fixed0 + share * (sum(a) + (L - p) * min(a)) + apart + opt_least >= target or \
            root_bound(prof, [share * x for x in a], gam0, m, L, fixed0) >= target:
        s.counters.pruned_bound += 1
        return
    speed = [1.0 / pr.a if pr.a > 0 else 1.0 for pr in prof]
    start = _proportional(L, speed, [pr.cap for pr in prof])
    if start is None:
        s.counters.pruned_memory += 1
        return
    caps = [min(pr.cap, L - (p - 1)) for pr in prof]
    suffix_min_a = [min(a[i:]) for i in range(p)] + [math.inf]
    _, boundary = evaluate(start)
    if p > 1 and _count_splits(L, caps) <= ENUMERATE_SPLITS:
        assert frame is not None  # built by the first evaluation
        _enumerate_splits(s, stages, frame, caps, m, rc)
        return
    c = s.bounds.reduce(boundary) if p > 1 else np.zeros(0)
    cin = [0.0] + list(c)
    cout = list(c) + [0.0]
    gam = [pr.b + ci + co for pr, ci, co in zip(prof, cin, cout)]
    fixed = fixed0 + float(sum(c))

    n = [0] * p
    # Two bounds of the slowest-cycle and all-reduce terms: apart, (M-1) max_i u_i +
    # max_i d_i n_i; and together, max_i ((M-1) u_i + d_i n_i), whose water-filling over
    # the stages still to fill sees that the all-reduce also grows with their layers.
    joint_a = [(m - 1) * pr.a + pr.d for pr in prof]
    joint_g = [(m - 1) * g + pr.d0 for g, pr in zip(gam, prof)]

    fill_cycle = _SuffixFill(a, gam)
    fill_joint = _SuffixFill(joint_a, joint_g)
    # Suffix maxima of the least all-reduce and optimizer time of a stage (one layer).
    dp_suffix = [-math.inf] * (p + 1)
    opt_suffix = [-math.inf] * (p + 1)
    for i in range(p - 1, -1, -1):
        dp_suffix[i] = max(dp_suffix[i + 1], prof[i].d + prof[i].d0)
        opt_suffix[i] = max(opt_suffix[i + 1], prof[i].opt_a + prof[i].opt_b)

    def lower(j: int, used: int, work: float, cycle: float, dp: float, opt: float,
              joint: float) -> float:
        """Bound of any completion once stages < j have their layers."""
        rest = L - used
        if j < p:
            tail = fill_cycle(j, rest)
            joint_tail = fill_joint(j, rest)
            dp_rest = dp_suffix[j]
            opt_rest = opt_suffix[j]
            work += suffix_min_a[j] * rest
        else:
            tail = joint_tail = dp_rest = opt_rest = -math.inf
        apart = (m - 1) * max(cycle, tail) + max(dp, dp_rest, 0.0)
        together = max(joint, joint_tail)
        return fixed + share * work + max(apart, together) + max(opt, opt_rest, 0.0)

    # The last stages' splits under a fixed prefix are few: scored in one vectorised pass
    # instead of walking their subtree node by node.
    frontier = max(p - _TAIL_STAGES, 1)
    tail_caps = tuple(caps[frontier:])
    tables: list[SplitTables] = []
    # Tails are scored in batches of prefixes (a pass costs little more for 2000 splits
    # than for 20); the incumbent that prunes the tree is updated at every batch.
    pending: list[np.ndarray] = []
    pending_rows = [0]

    def flush() -> None:
        if not pending:
            return
        assert frame is not None  # built by the first evaluation
        if not tables:
            tables.append(cm.split_tables(frame))
        block = np.concatenate(pending) if len(pending) > 1 else pending[0]
        pending.clear()
        pending_rows[0] = 0
        _score_block(s, stages, frame, tables[0], block, m, rc)

    def dfs(j: int, used: int, work: float, cycle: float, dp: float, opt: float,
            joint: float) -> None:
        s._check_time()
        if j == frontier:
            tails = _compositions(L - used, tail_caps)
            if len(tails):
                splits = np.empty((len(tails), p), dtype=np.intp)
                splits[:, :j] = n[:j]
                splits[:, j:] = tails
                pending.append(splits)
                pending_rows[0] += len(splits)
                if pending_rows[0] >= _SCORE_CHUNK:
                    flush()
            return
        if j == p - 1:
            k = L - used
            if k < 1 or k > caps[j]:
                return
            n[j] = k
            split = tuple(n)
            if split == start:
                return
            bound = lower(p, L, work + a[j] * k, max(cycle, a[j] * k + gam[j]),
                          max(dp, prof[j].d * k + prof[j].d0),
                          max(opt, prof[j].opt_a * k + prof[j].opt_b),
                          max(joint, joint_a[j] * k + joint_g[j]))
            if bound >= s.target():
                s.counters.pruned_bound += 1
                return
            evaluate(split)
            return
        left = p - 1 - j
        hi = min(caps[j], L - used - left)
        for k in sorted(range(1, hi + 1), key=lambda k: abs(k - start[j])):
            n[j] = k
            args = (work + a[j] * k, max(cycle, a[j] * k + gam[j]),
                    max(dp, prof[j].d * k + prof[j].d0),
                    max(opt, prof[j].opt_a * k + prof[j].opt_b),
                    max(joint, joint_a[j] * k + joint_g[j]))
            if lower(j + 1, used + k, *args) >= s.target():
                s.counters.pruned_bound += 1
                continue
            dfs(j + 1, used + k, *args)

    if max(lower(0, 0, 0.0, -math.inf, 0.0, 0.0, -math.inf),
           root_bound(prof, [share * x for x in a], gam, m, L, fixed)) >= s.target():
        s.counters.pruned_bound += 1
        return
    try:
        dfs(0, 0, 0.0, -math.inf, 0.0, 0.0, -math.inf)
    finally:
        flush()  # also when the search is stopped: what it reached is scored


# A pipeline whose layer splits within memory number at most this many has every split
# scored in one vectorised pass (CostModel.score_splits) instead of the branch and bound
# over splits: below it, scoring all of them costs less than the bounds' node-by-node walk
# (benchmarks/solver_ladder.py --splits compares the two).
ENUMERATE_SPLITS = 6000


def _count_splits(total: int, caps: list[int]) -> int:
    """How many splits of ``total`` layers give stage i between 1 and ``caps[i]`` layers
    (a bounded-compositions count, by dynamic programming over the stages)."""
    ways = [1] + [0] * total
    for cap in caps:
        nxt = [0] * (total + 1)
        run = 0
        for t in range(total + 1):
            # nxt[t] = sum of ways[t - k] for k in 1..cap, as a sliding window.
            if t >= 1:
                run += ways[t - 1]
            if t - cap - 1 >= 0:
                run -= ways[t - cap - 1]
            nxt[t] = run
        ways = nxt
    return ways[total]


@functools.lru_cache(maxsize=256)
def _compositions(total: int, caps: tuple[int, ...]) -> np.ndarray:
    """Every split of ``total`` layers with 1 <= n_i <= caps[i] ((N, p), read-only), in
    lexicographic order."""
    p = len(caps)
    rows = np.zeros((1, 0), dtype=np.intp)
    used = np.zeros(1, dtype=np.intp)
    for i, cap in enumerate(caps):
        rest_min = p - 1 - i  # the stages after this one hold a layer each
        rest_max = sum(caps[i + 1:])
        if i == p - 1:
            k = total - used
            keep = (k >= 1) & (k <= cap)
            rows = np.column_stack([rows[keep], k[keep]])
            break
        ks = np.arange(1, cap + 1)
        new_used = used[:, None] + ks[None, :]
        keep = (new_used + rest_min <= total) & (new_used + rest_max >= total)
        parent, col = np.nonzero(keep)
        rows = np.column_stack([rows[parent], ks[col]])
        used = new_used[parent, col]
    rows.setflags(write=False)
    return rows


def _enumerate_splits(s: Searcher, stages: tuple[StageChoice, ...], frame: PlanFrame,
                      caps: list[int], m: int, rc: str) -> None:
    """``best_split`` by scoring every split within the memory caps at once."""
    s._check_time()
    _score_block(s, stages, frame, s.problem.cm.split_tables(frame),
                 _compositions(s.layers, tuple(caps)), m, rc)


def _score_rows(cm: CostModel, objective: Objective, frame: PlanFrame, tables: SplitTables,
                splits: np.ndarray, cutoff: float = math.inf) -> np.ndarray:
    """The objective's values of ``splits`` ((N, p)) of one structure, in chunks; rows
    that do not fit, or that are certainly above ``cutoff``, are inf
    (``CostModel.score_splits``)."""
    values = np.full(len(splits), np.inf)
    for lo in range(0, len(splits), _SCORE_CHUNK):
        chunk = splits[lo:lo + _SCORE_CHUNK]
        totals, fits = cm.score_splits(frame, tables, chunk, cutoff)
        values[lo:lo + len(chunk)] = objective.score_rows(totals, fits)
    return values


def _score_block(s: Searcher, stages: tuple[StageChoice, ...], frame: PlanFrame,
                 tables: SplitTables, splits: np.ndarray, m: int, rc: str) -> None:
    """Score the layer splits ``splits`` ((N, p)) of one structure; offer the best. Each
    split takes its best ZeRO stage and chunk count: per chunk count, the first stage from
    ZeRO-1 up that fits (a higher one is never faster: only the splits the ones before could
    not fit, or ZeRO-0 where ZeRO-1 is not allowed, are scored again)."""
    cm, objective, space = s.problem.cm, s.problem.objective, s.problem.space
    # Only a split below the incumbent is offered: rows certainly above it are left
    # unscored (inf, as if they did not fit; a higher ZeRO stage is never faster).
    cutoff = s.best_value
    values = _score_rows(cm, objective, frame, tables, splits, cutoff)
    s.counters.leaves += len(splits)
    zero = np.full(len(splits), s.zero)
    virtual = np.ones(len(splits), dtype=np.intp)
    offload = np.zeros(len(splits), dtype=bool)
    p = len(stages)
    zeros = s.zeros_for(p)
    offload_zeros = s.offload_zeros(p)
    for v in (1, *s.chunk_counts(p, m)):
        ok = (splits % v == 0).all(axis=1)
        if v > 1 and s.runtime.interleaving == "even":  # Runtime.interleaves, row by row
            ok &= (splits == splits[:, :1]).all(axis=1)
        rows = np.arange(len(splits)) if v == 1 else np.flatnonzero(ok)
        if not len(rows):
            continue
        at = values[rows] if v == 1 else np.full(len(rows), np.inf)
        at_zero = zero[rows] if v == 1 else np.full(len(rows), -1)
        for z in zeros if v > 1 else [z for z in zeros if z != s.zero]:
            redo = np.flatnonzero(~np.isfinite(at) | (at_zero < 1))
            if not len(redo):
                break
            picked = splits[rows[redo]]
            other = cm.frame(space.to_plan(stages, tuple(int(n) for n in picked[0]), m, rc,
                                           z, v))
            got = _score_rows(cm, objective, other, cm.split_tables(other), picked, cutoff)
            better = (got < at[redo]) | (at_zero[redo] < 0)
            at[redo[better]] = got[better]
            at_zero[redo[better]] = z
        # The optimizer on the host (``best_split``'s rule, row by row): below the first
        # ZeRO stage >= 1 that fits without it, up to the first that fits with it.
        at_off = np.zeros(len(rows), dtype=bool)
        fits_at = np.where(np.isfinite(at) & (at_zero >= 1), at_zero, np.iinfo(np.intp).max)
        done = np.zeros(len(rows), dtype=bool)
        for z in offload_zeros:
            redo = np.flatnonzero(~done & (z < fits_at))
            if not len(redo):
                break
            picked = splits[rows[redo]]
            other = cm.frame(space.to_plan(stages, tuple(int(n) for n in picked[0]), m, rc,
                                           z, v, "optimizer"))
            got = _score_rows(cm, objective, other, cm.split_tables(other), picked, cutoff)
            better = (got < at[redo]) | (at_zero[redo] < 0)
            at[redo[better]] = got[better]
            at_zero[redo[better]] = z
            at_off[redo[better]] = True
            done[redo[np.isfinite(got)]] = True
        gain = at < values[rows]
        values[rows[gain]] = at[gain]
        zero[rows[gain]] = at_zero[gain]
        virtual[rows[gain]] = v
        offload[rows[gain]] = at_off[gain]
    best = int(np.argmin(values))
    if values[best] < s.best_value:
        split = tuple(int(n) for n in splits[best])
        s.offer(float(values[best]), space.to_plan(stages, split, m, rc, int(zero[best]),
                                                   int(virtual[best]),
                                                   "optimizer" if offload[best] else "none"))


_SCORE_CHUNK = 2048  # splits per vectorised pass (bounds the (N, K, p) temporaries)
_TAIL_STAGES = 4  # stages whose splits the split tree scores at once under each prefix


def _proportional(total: int, speed: list[float], caps: list[int]) -> tuple[int, ...] | None:
    """An integer split near ``total`` in proportion to ``speed`` with 1 <= n_i <= caps_i."""
    p = len(speed)
    if sum(min(c, total) for c in caps) < total or min(caps) < 1:
        return None
    n = [1] * p
    left = total - p
    if left < 0:
        return None
    while left > 0:
        # Give the next layer to the stage that stays least loaded.
        options = [i for i in range(p) if n[i] < caps[i]]
        i = min(options, key=lambda k: (n[k] + 1) / speed[k])
        n[i] += 1
        left -= 1
    return tuple(n)


# ---- tasks and executors -------------------------------------------------------------

SEEDS = ("metis", "megatron", "dive")


@dataclass(frozen=True)
class Task:
    """One independent piece of the search: every plan whose pipeline starts with
    ``prefix`` (``expand``), or only the prefix closed as a pipeline (not ``expand``:
    its extensions are other tasks); or, with ``seed`` (one of ``SEEDS``), a heuristic
    that offers its plan as an incumbent (the Metis-style or Megatron-style baseline, or
    the ``dive`` until the wall-clock time ``until``). Run on the workers instead of
    before them, seeds keep every worker busy from the start (they were 13-18% of a proof
    on two)."""

    prefix: tuple[StageChoice, ...]
    expand: bool = True
    seed: str = ""
    until: float = math.inf
    # (k, n): only the k-th of n parts of the plans below ``prefix``: part k searches the
    # subtrees of the canonical next stages whose GPU count is the j-th largest of theirs
    # with j % n == k, and part 0 also closes the prefix. One worker runs a part's
    # subtrees one after the other, so they share its bound tables (siblings that take
    # as many GPUs reach many of the same free GPUs).
    part: tuple[int, int] = (0, 1)

    def free(self, space: PlanSpace) -> tuple[int, ...]:
        free = space.capacity
        for st in self.prefix:
            free = space.take(free, st)
        return free


# More stages than this at a level of the stage tree and the search visits them lazily
# (``PlanSpace.stage_choices_by_size``) instead of listing and sorting them: listing the
# 397,505 first stages of test-larger instance 8 took 1.5-5 s, and the first stages of
# a 16-host cluster (389 million on test-larger instance 0) do not fit in memory.
LIST_STAGES = 100_000


def first_stage_tasks(space: PlanSpace, largest_first: bool = True, *,
                      until: float = math.inf, cut: list[bool] | None = None,
                      ) -> Iterator[Task]:
    """One task per canonical first stage, lazily, ordered by GPU count (descending
    with ``largest_first``, as ``root_tasks``; ascending: the largest subtrees first).

    Past ``until`` (``time.time()``) it stops, appending True to ``cut``: on a cluster of
    hundreds of identical hosts nearly every stage is a symmetric copy, and finding the
    next canonical one took minutes, far past any time limit."""
    sym = SymmetryCheck.start(space)
    timed = math.isfinite(until)
    for stage in space.stage_choices_by_size(space.capacity, largest_first):
        if timed and time.time() > until:
            if cut is not None:
                cut.append(True)
            return
        if sym.extend(stage) is not None:
            yield Task((stage,))


def root_tasks(problem: SearchProblem, depth: int = 1) -> list[Task]:
    """The canonical prefixes of ``depth`` stages, each rooting an independent subtree,
    and every shorter canonical prefix as a close-only task. Splitting deeper gives
    several workers many small tasks instead of a few dominant ones."""
    space = problem.space
    out: list[Task] = []

    def grow(prefix: tuple[StageChoice, ...], free: tuple[int, ...],
             sym: SymmetryCheck) -> None:
        for stage in sorted(space.stage_choices(free), key=lambda s: -s.gpus):
            nxt = sym.extend(stage)
            if nxt is None or not stage_extends(prefix, stage, runtime):
                continue
            here = prefix + (stage,)
            rest = space.take(free, stage)
            if len(here) >= depth or len(here) >= space.model.layers or not any(rest):
                out.append(Task(here))
            else:
                out.append(Task(here, expand=False))
                grow(here, rest, nxt)

    runtime = get_runtime(problem.runtime)
    grow((), space.capacity, SymmetryCheck.start(space))
    return out


def split_task(problem: SearchProblem, task: Task, parts: int | None = None) -> list[Task]:
    """The same plans as ``task`` (which expands) as smaller tasks: its prefix closed as
    a pipeline, and one task per canonical stage that may follow it; or, with ``parts``,
    ``parts`` tasks that each search the subtrees of every ``parts``-th GPU count of
    those stages (``Task.part``).
    For balancing several workers: one subtree can hold half of a search."""
    space = problem.space
    free = task.free(space)
    sym: SymmetryCheck | None = SymmetryCheck.start(space)
    for st in task.prefix:
        assert sym is not None  # a task's prefix is canonical
        sym = sym.extend(st)
    if (not task.expand or sym is None or len(task.prefix) >= space.model.layers
            or not any(free) or task.part != (0, 1)):
        return [task]
    if parts is not None:
        return [Task(task.prefix, part=(k, parts)) for k in range(parts)]
    out = [Task(task.prefix, expand=False)]
    for stage in sorted(space.stage_choices(free), key=lambda s: -s.gpus):
        if sym.extend(stage) is not None:
            out.append(Task(task.prefix + (stage,)))
    return out


def dive_structures(space: PlanSpace) -> list[tuple[StageChoice, ...]]:
    """A few pipeline structures worth closing before the exhaustive search, for a first
    incumbent: the hosts of one or more GPU types in host order, at one TP degree, as one
    stage per TP block (a deep pipeline) or per host (data parallel inside the host), or
    as one stage per type (data parallel over its hosts) at any TP degree per type; and
    the same with the first host's last stage moved to the end, so that the first and
    the last stage share a host (their tied embedding's exchange then stays inside it)."""
    layers = space.model.layers
    orders: list[tuple[str, ...]] = [(t,) for t in space.types]
    if 1 < len(space.types) <= 3:
        # Every ordered subset of the types, not only orders of all of them: a slow type
        # in the pipeline can cost more than it brings (on cloud-mixed the L4 hosts made
        # every all-type order worse than the Metis-style plan; with GPT-3 6.7B, A100
        # then H100 alone beat it by 7%).
        orders += [order for r in range(2, len(space.types) + 1)
                   for order in itertools.permutations(space.types, r)]
    levels = sorted({tp for t in space.types for tp in space.tp_options[t]})
    candidates: list[list[StageChoice]] = []
    for order in orders:
        for level in levels:
            for per_block in (True, False):
                stages: list[StageChoice] = []
                for t in order:
                    tps = [tp for tp in space.tp_options[t] if tp <= level]
                    if not tps:
                        continue
                    tp = max(tps)
                    for h in space.eligible_hosts(t, tp):
                        blocks = space.capacity[h] // tp
                        if per_block:
                            stages += [StageChoice(t, tp, (h,), (1,))] * blocks
                        elif blocks:
                            stages.append(StageChoice(t, tp, (h,), (blocks,)))
                        if len(stages) > layers:
                            break  # more stages than layers: never a plan (thousands of hosts)
                    if len(stages) > layers:
                        break
                if len(stages) <= layers:
                    candidates.append(stages)
        # One stage per type, data parallel over all of its hosts, each type at its own
        # TP degree (every combination): the Metis-style plans' shape. On mixed-32 the
        # optimum is one (H100 at TP 1, then A100 at TP 2), which no uniform degree gives.
        per_type = [[space.stage_from_counts(t, tp, hosts, [space.capacity[h] // tp
                                                             for h in hosts])
                     for tp in space.tp_options[t]
                     if (hosts := space.eligible_hosts(t, tp))] for t in order]
        candidates += [list(combo) for combo in itertools.product(*per_type)]
    out: list[tuple[StageChoice, ...]] = []
    seen: set[tuple[StageChoice, ...]] = set()
    for stages in candidates:
        variants = [tuple(stages)]
        first = [i for i, st in enumerate(stages) if st.hosts == stages[0].hosts]
        if stages and len(first) > 1 and first[-1] < len(stages) - 1:
            moved = stages[:first[-1]] + stages[first[-1] + 1:] + [stages[first[-1]]]
            variants.append(tuple(moved))
        for v in variants:
            if v and len(v) <= layers and v not in seen:
                seen.add(v)
                out.append(v)
    return out


def dive(problem: SearchProblem, until: float, incumbent: float | Incumbent = math.inf,
         steps: int = 400, stop: Callable[[], bool] | None = None,
         ) -> tuple[float, Plan | None]:
    """The best plan of ``dive_structures`` found before ``until`` (``time.time()``), each
    structure closed under every micro-batch count and recompute mode by the exact layer
    split search cut to ``steps`` search nodes (its first split, in proportion to stage
    speed, is always scored), then a hill climb (``climb.climb``) from the best structure:
    split one stage into two on the same hosts (half the TP degree, or half the replicas)
    or merge two neighbours on one host into one of twice the TP degree, or swap two
    neighbours on the same hosts. A first incumbent near the optimum prunes far more than
    a heuristic's plan; the search stays exact whatever the dive finds. ``incumbent``: a
    value to beat, or a shared incumbent that the dive reads and offers each plan to.
    ``stop``: ends the dive at once when it returns True (the search it seeds is over)."""
    shared = LocalIncumbent(incumbent) if isinstance(incumbent, float | int) else incumbent
    s = BudgetSearcher(replace(problem, deadline=min(problem.deadline, until)), shared,
                       max_steps=steps, stop=stop)
    layers = problem.space.model.layers

    def score(stages: tuple[StageChoice, ...], _bar: float) -> tuple[float, None]:
        """Best value found for the structure (inf if none); raises _Stop past until, or
        once stopped. The bar is the searcher's own (the shared incumbent, which every
        plan found is offered to), so ``_bar`` adds nothing."""
        before = (s.best_value, s.best_plan)
        s.best_value, s.best_plan = math.inf, None
        try:
            for combo in s.combos(st.dp for st in stages):
                s.steps = 0  # a step budget per combination: one cannot starve the others
                try:
                    s.close(stages, [combo])
                except _Stop:
                    if time.time() > until or (stop is not None and stop()):
                        raise
        finally:
            value = s.best_value
            if value >= before[0]:
                s.best_value, s.best_plan = before
        return value, None

    runtime = get_runtime(problem.runtime)

    def moves(stages: tuple[StageChoice, ...]) -> list[tuple[StageChoice, ...]]:
        return [mv for mv in _split_moves(stages, layers) + _merge_moves(problem.space, stages)
                if structure_ok(mv, runtime)]

    try:
        # The shallowest structures first: they are the cheapest to close.
        found = best_move(sorted((st for st in dive_structures(problem.space)
                                  if structure_ok(st, runtime)), key=len), score, math.inf)
        if found is not None:
            climb(found[0], found[1], None, moves, score)
    except _Stop:
        pass
    return s.best_value, s.best_plan


def _merge_moves(space: PlanSpace, stages: tuple[StageChoice, ...],
                 ) -> list[tuple[StageChoice, ...]]:
    """Structures with two neighbouring single-replica stages of one host and TP degree
    merged into one stage of twice that degree (where the space allows it), or with two
    different neighbours on the same hosts swapped."""
    out = []
    for i, (a, b) in enumerate(itertools.pairwise(stages)):
        if a == b and a.dp == 1 and len(a.hosts) == 1:
            tp = 2 * a.tp
            if tp in space.tp_options[a.gpu_type] and space.capacity[a.hosts[0]] % tp == 0:
                out.append(stages[:i] + (StageChoice(a.gpu_type, tp, a.hosts, (1,)),)
                           + stages[i + 2:])
        elif a != b and a.hosts == b.hosts:
            out.append(stages[:i] + (b, a) + stages[i + 2:])
    return out


def _split_moves(stages: tuple[StageChoice, ...], layers: int,
                 ) -> list[tuple[StageChoice, ...]]:
    """Structures with one stage split in two on its own hosts: a single-host stage of one
    replica into two of half its TP degree, or a stage of several replicas into two of
    about half of them each (whole hosts, or one host's blocks halved)."""
    if len(stages) >= layers:
        return []
    out = []
    for i, st in enumerate(stages):
        parts: list[tuple[StageChoice, StageChoice]] = []
        if st.dp == 1 and st.tp > 1:
            one = StageChoice(st.gpu_type, st.tp // 2, st.hosts, (1,))
            parts.append((one, one))
        elif st.dp > 1 and len(st.hosts) == 1 and st.blocks[0] % 2 == 0:
            one = StageChoice(st.gpu_type, st.tp, st.hosts, (st.blocks[0] // 2,))
            parts.append((one, one))
        elif len(st.hosts) > 1:
            k = len(st.hosts) // 2
            parts.append((StageChoice(st.gpu_type, st.tp, st.hosts[:k], st.blocks[:k]),
                          StageChoice(st.gpu_type, st.tp, st.hosts[k:], st.blocks[k:])))
        for a, b in parts:
            out.append(stages[:i] + (a, b) + stages[i + 1:])
    return out


def bounds_of(cm: CostModel, space: PlanSpace, objective: Objective) -> Bounds:
    """The bounds of one (cost model, space, objective), at the space's largest ZeRO stage
    as the search assumes; one object reused across searches keeps its stage profiles."""
    return Bounds(cm, space, objective, max(space.zero_stages))


def make_bounds(problem: SearchProblem) -> Bounds:
    return bounds_of(problem.cm, problem.space, problem.objective)


def search_subtree(problem: SearchProblem, task: Task | tuple[StageChoice, ...],
                   incumbent: Incumbent, bounds: Bounds | None = None,
                   stop: Callable[[], bool] | None = None,
                   max_steps: int | None = None) -> TaskResult:
    """Search one task (a bare prefix means every plan that starts with it). ``stop``: a
    seed task's dive ends early when it returns True (every subtree is done).
    ``max_steps``: a budget of search steps (one per node), after which the task stops
    unfinished: the same answer on every machine."""
    if not isinstance(task, Task):
        task = Task(tuple(task))
    if task.seed:
        return _run_seed(problem, task, incumbent, stop)
    if time.time() > problem.deadline:
        # Past the limit a task is answered unfinished before any bound is built: with
        # thousands of first stages queued, building each one's root bound outran the
        # limit many times over.
        return TaskResult(math.inf, None, Counters(), False)
    s = (Searcher(problem, incumbent, bounds) if max_steps is None else
         BudgetSearcher(problem, incumbent, bounds, max_steps=max_steps))
    space = problem.space
    free = space.capacity
    sym = SymmetryCheck.start(space)
    for st in task.prefix:
        free = space.take(free, st)
        sym = sym.extend(st)  # type: ignore[assignment]
    finished = True
    try:
        if task.expand:
            # As in one walk from the root: the prefix's own prefixes pass down the
            # (M, recompute) pairs their extensions may still use, and a subtree whose
            # ancestor has none left is not searched. (Their nodes are the close-only
            # tasks' and counted there.)
            inherited = None
            head = space.capacity
            counted = s.counters
            s.counters = Counters()
            for k in range(1, len(task.prefix)):
                head = space.take(head, task.prefix[k - 1])
                _, inherited = s.status(task.prefix[:k], head, inherited)
                if not inherited:
                    break
            s.counters = counted
            if inherited is None or inherited:
                s.walk(task.prefix, free, sym, inherited, task.part)
        else:
            s.counters.nodes += 1
            closed, _ = s.status(task.prefix, free, None)
            if closed:
                s.close(task.prefix, closed)
    except _Stop:
        finished = False
    return TaskResult(s.best_value, s.best_plan, s.counters, finished,
                      steps=s.steps if isinstance(s, BudgetSearcher) else 0)


def _run_seed(problem: SearchProblem, task: Task, incumbent: Incumbent,
              stop: Callable[[], bool] | None = None) -> TaskResult:
    """A seed task: the heuristic's plan, offered to the incumbent. ``stop``: the dive
    ends when it returns True. The Megatron-style plan may lie outside the space (a stage
    may mix GPU types): its value still prunes, since the answer is the best of every
    task's plan, the seeds' included."""
    start = time.perf_counter()
    plan: Plan | None = None
    value = math.inf
    if task.seed in ("metis", "megatron"):
        from hetpar.solvers import baselines
        sol = getattr(baselines, task.seed)(
            problem.cm, problem.space, problem.objective, deadline=problem.seeds_until,
            **({"runtime": problem.runtime} if task.seed == "megatron" else {}))
        if sol.found and not check_plan(sol.plan, problem.runtime):
            value, plan = sol.value, sol.plan
    elif task.seed == "dive":
        value, plan = dive(problem, min(task.until, problem.deadline), incumbent, stop=stop)
    else:
        raise ValueError(f"unknown seed task {task.seed!r} (known: {', '.join(SEEDS)})")
    if plan is not None:
        incumbent.offer(value)
    return TaskResult(value, plan, Counters(), True, time.perf_counter() - start)


class SearchExecutor(Protocol):
    """Runs subtree tasks; another backend (e.g. Ray) only needs these three members."""

    workers: int

    def run(self, problem: SearchProblem, tasks: Iterable[Task],
            on_result: Callable[[int, TaskResult], None],
            bounds: Bounds | None = None) -> None:
        """Run the tasks, reporting each result with the task's position in ``tasks``;
        ``bounds``: tables the caller built for this problem already (e.g. ranking the
        tasks), which a backend may reuse. ``tasks`` may be lazy (millions of first
        stages): a backend takes them one by one as workers free up, the seed tasks
        (first) always, and no others once the problem's deadline has passed."""
        ...

    def incumbent(self) -> float: ...


@dataclass
class InlineExecutor:
    """Runs tasks one after the other in this process."""

    workers: int = 1
    _incumbent: LocalIncumbent = field(default_factory=LocalIncumbent)

    def run(self, problem: SearchProblem, tasks: Iterable[Task],
            on_result: Callable[[int, TaskResult], None],
            bounds: Bounds | None = None) -> None:
        self._incumbent.offer(problem.seed_value)
        if bounds is None:
            bounds = make_bounds(problem)
        for i, task in enumerate(tasks):
            if not task.seed and time.time() > problem.deadline:
                return
            on_result(i, search_subtree(problem, task, self._incumbent, bounds))

    def incumbent(self) -> float:
        return self._incumbent.get()


def estimate_space_size(space: PlanSpace, probes: int = 400, seed: int = 0,
                        until: float = math.inf) -> tuple[float, bool]:
    """Plans in the space (without symmetry reduction): counted when small, else Knuth's
    random-probe estimate of the stage tree times each pipeline's splits and options.
    Past ``until`` (``time.perf_counter``) it stops probing (one probe at least) and does
    not count: on thousands of distinct hosts each probe takes a good part of a second,
    and a search stopped by its time limit must still answer within its grace."""
    layers = space.model.layers
    n_opts = len(space.recompute_modes) * len(space.zero_stages)

    def as_float(n: int) -> float:  # counts of thousands of hosts pass 1e308
        return float(n) if n.bit_length() < 1000 else math.inf

    def leaf_weight(stages: tuple[StageChoice, ...]) -> float:
        p = len(stages)
        return as_float(math.comb(layers - 1, p - 1) * n_opts
                        * len(space.micro_batch_options([s.dp for s in stages])))

    rng = np.random.default_rng(seed)
    estimates = []
    tree = []  # the same probes' estimates of the stage tree's nodes
    for _ in range(probes):
        if estimates and time.perf_counter() > until:
            break
        free, prefix, weight, total, nodes = space.capacity, (), 1.0, 0.0, 1.0
        while len(prefix) < layers:
            n = space.count_stage_choices(free)
            if not n:
                break
            weight *= as_float(n)
            nodes += weight
            # Beyond int64 (hundreds of hosts), 62 random bits scaled to n stand in (a
            # float would overflow past 1e308, thousands of distinct hosts).
            pick = int(rng.integers(n)) if n < 2**62 else (int(rng.integers(2**62)) * n) >> 62
            st = space.stage_choice_at(free, pick)
            prefix = prefix + (st,)
            free = space.take(free, st)
            leaves = leaf_weight(prefix)
            if leaves:  # (inf * 0 would be NaN where the weight overflowed)
                total += weight * leaves
        estimates.append(total)
        tree.append(nodes)

    # Count exactly with a node budget, unless the probes say the tree exceeds it by far
    # (walking the budget's nodes only to give up cost a proof a noticeable share).
    budget = [20_000]

    def count(free: tuple[int, ...], prefix: tuple[StageChoice, ...]) -> float:
        total = leaf_weight(prefix) if prefix else 0.0
        if len(prefix) < layers:
            for st in space.stage_choices(free):
                budget[0] -= 1
                if budget[0] < 0:
                    raise OverflowError
                total += count(space.take(free, st), prefix + (st,))
        return total

    if (not tree or float(np.mean(tree)) <= 10 * budget[0]) and time.perf_counter() <= until:
        try:
            return count(space.capacity, ()), True
        except OverflowError:
            pass
    # Beyond float range (hundreds of hosts) the estimate says only "astronomical".
    mean = float(np.mean(estimates))
    return (mean if math.isfinite(mean) else 1e308), False


def prefix_lower_bound(bounds: Bounds, searcher_combos: Callable, prefix: tuple[StageChoice, ...],
                       free: tuple[int, ...], upper: float, steps: int = 16,
                       until: float = math.inf, lower: float = 0.0) -> float:
    """The least iteration time any plan extending ``prefix`` may have (bisection on the
    pruning test, which is monotone in its target), from ``lower``, a bound known to hold
    for them. Past ``until`` (``time.perf_counter``) it returns the bracket's lower end
    as it stands: weaker, still a bound."""
    combos = searcher_combos(s.dp for s in prefix)

    def alive(target: float) -> bool:
        # Past ``until`` between pairs: "may beat it" (True), which only keeps the bound
        # where it was (hundreds of pairs take seconds on thousands of hosts).
        return any(time.perf_counter() > until or bounds.prefix_alive(prefix, free, m, rc,
                                                                      target)[0]
                   for m, rc in combos)

    if not math.isfinite(upper):
        upper = 1.0
        while time.perf_counter() < until and not alive(upper) and upper < 1e9:
            upper *= 2
    return _bisect_bound(alive, upper, steps, until, lower)


def _bisect_bound(alive: Callable[[float], bool], upper: float, steps: int,
                  until: float, lower: float = 0.0) -> float:
    """The least target ``alive`` (monotone: no plan below a dead target) admits, within
    ``(upper - lower) * 2**-steps``; past ``until`` the bracket's lower end (``lower`` at
    worst). ``lower``: a bound known already. Bracketed from it rather than from 0, the
    same steps end closer: stopped searches on large clusters have time for a few, and
    from 0 their bounds came out at round fractions of the answer (1/2, 3/4, 11/16)."""
    lower = max(0.0, lower) if math.isfinite(lower) else 0.0
    if not math.isfinite(upper) or time.perf_counter() >= until or lower >= upper:
        return min(lower, upper) if math.isfinite(upper) else lower
    if not alive(upper):
        return upper
    lo, hi = lower, upper
    for _ in range(steps):
        if time.perf_counter() >= until:
            break
        mid = (lo + hi) / 2
        if alive(mid):
            hi = mid
        else:
            lo = mid
    return lo


def root_lower_bound(bounds: Bounds, searcher_combos: Callable, upper: float, steps: int = 12,
                     until: float = math.inf, lower: float = 0.0) -> float:
    """The least iteration time any plan of the space may have (bisection on
    ``Bounds.root_alive``, monotone in its target, from ``lower``, a bound known to hold);
    past ``until`` the bracket's lower end as it stands (``lower`` at worst)."""
    combos = searcher_combos(())

    def alive(target: float) -> bool:
        # Past ``until`` between pairs: True, as in ``prefix_lower_bound``.
        return any(time.perf_counter() > until or bounds.root_alive(m, rc, target)
                   for m, rc in combos)

    return _bisect_bound(alive, upper, steps, until, lower)
