"""Which partial plans can still be completed into a plan that fits in memory.

The environment builds a plan from the last pipeline stage to the first. Built in that
order, a stage's memory is known the moment it is closed: under 1F1B the stage built
``j``-th (0 = last) holds ``min(M, j + 1)`` micro-batches of activations whatever the
final pipeline depth, the stage built first carries the LM head, and the stage that
takes the remaining layers is the first pipeline stage and carries the embedding. Memory
is linear in a stage's layer count, so each stage shape has a largest layer count that
fits (its *capacity*), and the layer counts a set of stages can hold exactly is an
interval per stage, combined by sums.

``Completions`` answers, exactly, "from these free GPUs, starting at construction index
``j``, which numbers of remaining layers can still be placed?" as a bit set (bit ``r``
set when ``r`` layers can be). Memory does not depend on the network, so hosts with the
same GPU type and count are interchangeable here; the state is canonicalised by sorting
their free counts, and answers are memoised per (recompute, ZeRO, micro-batch count).
The search stops expanding a state as soon as its answer reaches an upper bound given by
the total free memory, which makes loose instances cheap; tight ones are exhaustive but
memoised.

Before searching, each query asks a greedy *witness*: one sequence of stages built by a
fixed rule (the stage that holds the most layers, its blocks packed onto the fullest
hosts), whose prefixes place an interval of counts each. Every count it reports is backed
by a real completion, so masks stay safe; it answers most "yes" queries of large clusters
in microseconds, where the exhaustive search would spend its whole budget in one corner
of the tree and report a false "no".
"""

from __future__ import annotations

import math

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from types import ModuleType
from typing import Any

from hetpar.costmodel.estimate import CostModel
from hetpar.native import compiled_twin
from hetpar.problem.space import PlanSpace

__all__ = ["Completions", "bits_upto", "HostClasses"]

_PROBE = 16  # search expansions before a query asks the greedy witness


def bits_upto(n: int) -> int:
    """The bit set {1, ..., n}."""
    return ((1 << (n + 1)) - 2) if n > 0 else 0


def _smear_down(x: int, n: int) -> int:
    """OR of ``x >> k`` for k = 1..n, by doubling (O(log n) big-int operations)."""
    s, covered = x >> 1, 1
    while covered < n:
        step = min(covered, n - covered)
        s |= s >> step
        covered += step
    return s


def _smear_up(x: int, n: int) -> int:
    """OR of ``x << k`` for k = 1..n."""
    s, covered = x << 1, 1
    while covered < n:
        step = min(covered, n - covered)
        s |= s << step
        covered += step
    return s


@dataclass(frozen=True)
class HostClasses:
    """Hosts by GPU type (what a stage is made of: memory depends on the type only) and,
    within a type, by GPU count (hosts alike for the completion question)."""

    of_host: tuple[int, ...]  # type index per host (-1: GPUs unusable for this training)
    members: tuple[tuple[int, ...], ...]  # hosts per type
    gpu_type: tuple[str, ...]
    usable_bytes: tuple[float, ...]  # per type
    groups: tuple[tuple[int, ...], ...]  # hosts of one type and GPU count

    @classmethod
    def of(cls, cm: CostModel) -> HostClasses:
        types: dict[str, int] = {}
        groups: dict[tuple[str, int], list[int]] = {}
        of_host: list[int] = []
        members: list[list[int]] = []
        usable: list[float] = []
        for i, h in enumerate(cm.cluster.hosts):
            perf = cm.host_perf(i)
            if perf is None:
                of_host.append(-1)
                continue
            if h.gpu.name not in types:
                types[h.gpu.name] = len(members)
                members.append([])
                usable.append(perf.usable_bytes)
            of_host.append(types[h.gpu.name])
            members[types[h.gpu.name]].append(i)
            groups.setdefault((h.gpu.name, h.num_gpus), []).append(i)
        return cls(tuple(of_host), tuple(tuple(m) for m in members), tuple(types),
                   tuple(usable), tuple(tuple(g) for g in groups.values()))


class Completions:
    """Exact completion sets for one (instance, recompute, ZeRO, micro-batch count).

    A *state* is the free GPUs per host plus the construction index ``j`` of the next
    stage; an *open* state also has the stage being built: its GPU type, ``tp`` and the
    number of blocks (replicas) taken so far.
    """

    def __init__(self, cm: CostModel, space: PlanSpace, classes: HostClasses, recompute: str,
                 zero: int, micro_batches: int, budget: int = 400,
                 shared_caps: dict | None = None, witness: bool = True) -> None:
        self.cm = cm
        self.space = space
        self.classes = classes
        self.recompute = recompute
        self.zero = zero == 1
        self.m = micro_batches
        self.mb = cm.training.global_batch // micro_batches  # sequences per micro-batch
        self.layers = cm.model.layers
        self._closed: dict[tuple, list[int]] = {}
        self._open: dict[tuple, list[int]] = {}
        self._all = bits_upto(self.layers)
        self._singletons = all(len(g) == 1 for g in classes.groups)
        self._keys: dict[tuple[int, ...], tuple] = {}  # free vector -> canonical key
        # Per group of alike hosts: its one host, or a getter of its hosts' free counts.
        self._key_parts: tuple[int | itemgetter, ...] = tuple(
            g[0] if len(g) == 1 else itemgetter(*g) for g in classes.groups)
        self._caps: dict[tuple, int] = {}
        self._density: dict[tuple, float] = {}
        self._witness: dict[tuple, int] = {}  # canonical closed state -> witnessed counts
        # Capacities and memory coefficients, shared by the oracles of one instance.
        self.shared_caps: dict[tuple, Any] = {} if shared_caps is None else shared_caps
        self.budget = budget
        self.use_witness = witness  # off: the exhaustive search alone (tests compare them)
        self._left = budget
        self.queries = 0
        self.cut_queries = 0  # queries whose answer may be a false "unreachable"
        self._dps = tuple(d for d in range(1, self.mb + 1) if self.mb % d == 0)
        counts = [h.num_gpus for h in cm.cluster.hosts]
        self._counts = counts
        # tp options per type, and the hosts whose GPU count each tp divides.
        self._tps = tuple(space.tp_options[t] for t in classes.gpu_type)
        self._eligible = {(c, tp): tuple(h for h in classes.members[c] if counts[h] % tp == 0)
                          for c in range(len(classes.members)) for tp in self._tps[c]}
        self._blocks = {key: sum(counts[h] // key[1] for h in hosts)
                        for key, hosts in self._eligible.items()}

    # ---- stage capacities --------------------------------------------------------------
    def capacity(self, cls: int, tp: int, dp: int, j: int, first: bool) -> int:
        """Most layers a stage of ``dp`` blocks of ``tp`` GPUs of type ``cls`` holds when
        built ``j``-th from the end (0 = last pipeline stage); 0 when none fit."""
        key = (cls, tp, dp, j if j < self.m else self.m, first)
        hit = self._caps.get(key)
        if hit is not None:
            return hit
        if self.mb % dp:
            cap = 0
        else:
            # Shared by the oracles of every micro-batch count with the same micro-batch
            # size and activations in flight.
            inflight = min(self.m, j + 1)
            shared = (cls, tp, dp, self.mb, inflight, first, j == 0, self.recompute, self.zero)
            cap = self.shared_caps.get(shared, -1)
            if cap < 0:
                cap = self.shared_caps[shared] = self._capacity(
                    self.classes.usable_bytes[cls], tp, dp, inflight, first, j == 0)
        self._caps[key] = cap
        return cap

    def _affine(self, tp: int, dp: int, inflight: int, first: bool, last: bool,
                ) -> tuple[float, float]:
        """(bytes with one layer, bytes per further layer): memory is affine in layers."""
        key = ("affine", tp, dp, self.mb, inflight, first, last, self.recompute, self.zero)
        hit = self.shared_caps.get(key)
        if hit is not None:
            return hit
        seqs = self.mb / dp
        one = self.cm.stage_memory(1, tp, dp, seqs, inflight, first, last, self.recompute,
                                   self.zero)[1]
        two = self.cm.stage_memory(2, tp, dp, seqs, inflight, first, last, self.recompute,
                                   self.zero)[1]
        out = self.shared_caps[key] = (one, two - one)
        return out

    def _capacity(self, usable: float, tp: int, dp: int, inflight: int, first: bool,
                  last: bool) -> int:
        seqs = self.mb / dp

        def mem(k: int) -> float:
            return self.cm.stage_memory(k, tp, dp, seqs, inflight, first, last,
                                        self.recompute, self.zero)[1]

        one, per = self._affine(tp, dp, inflight, first, last)
        if one > usable:
            return 0
        cap = self.layers if per <= 0 else min(self.layers, 1 + int((usable - one) // per))
        # The closed form may round across the boundary: a capacity must truly fit (what
        # the masks promise); one layer less than possible is harmless and unlikely.
        while cap > 1 and mem(cap) > usable:
            cap -= 1
        return cap

    # ---- canonical states ---------------------------------------------------------------
    def key(self, free: Sequence[int]) -> tuple:
        """Canonical form of a free vector: sorted free counts per class of hosts."""
        raw = tuple(free)
        if self._singletons:
            return raw
        hit = self._keys.get(raw)
        if hit is None:
            hit = self._keys[raw] = tuple(
                [free[g] if isinstance(g, int) else tuple(sorted(g(free)))
                 for g in self._key_parts])
        return hit

    def density(self, cls: int, j: int) -> float:
        """An upper bound on the layers per GPU that any stage of type ``cls`` built at
        index ``j`` or later holds: activations held only grow with ``j`` (beyond the
        head-carrying last stage), so indices ``j`` and ``max(j, 1)`` bound them all; the
        closed form is used without the boundary checks of ``capacity`` (cheap)."""
        key = (cls, min(j, self.m))
        hit = self._density.get(key)
        if hit is None:
            best = 0.0
            usable = self.classes.usable_bytes[cls]
            for tp in self._tps[cls]:
                # Only as many replicas as the type's hosts have blocks of tp GPUs.
                most = self._blocks[cls, tp]
                for dp in self._dps:
                    if dp > most:
                        break
                    for jj in {j, max(j, 1)}:
                        for first in (False, True):
                            one, per = self._affine(tp, dp, min(self.m, jj + 1), first, jj == 0)
                            if one <= usable:
                                # Rounded down, with slack for rounding: still a bound.
                                n = self.layers if per <= 0 else \
                                    1 + math.floor((usable - one) / per + 1e-9)
                                best = max(best, min(n, self.layers) / (tp * dp))
            hit = self._density[key] = best
        return hit

    def upper(self, free: Sequence[int], j: int, extra: float = 0.0) -> int:
        """Layers that the free GPUs could hold at most from construction index ``j``
        (plus ``extra`` layers' worth of GPUs already in an open stage: rounded down once,
        with the rest, since each part rounded down alone could fall below the truth)."""
        total = extra
        for c, m in enumerate(self.classes.members):
            n = 0
            for h in m:
                n += free[h]
            if n:
                total += n * self.density(c, j)
        return min(self.layers, int(total + 1e-9))

    # ---- completion sets ---------------------------------------------------------------
    # Queries are goal-directed: "can any of these counts still be placed?". A memo entry
    # is [counts known reachable, counts whose answer is known]; a search stops at the
    # first reachable count asked for, and learns "unreachable" only from a complete
    # search. A search that runs out of budget reports what it found: missing counts are
    # then treated as unreachable (masks stay safe, since every reachable count is backed
    # by a completion whose states are memoised and are found again).
    def closed(self, free: Sequence[int], j: int, want: int) -> bool:
        """Whether some count ``r`` of remaining layers with bit ``r`` set in ``want`` can
        be placed from a state with no open stage."""
        free = list(free)
        got = self._answer(lambda w: self._closed_rec(free, j, w),
                           lambda: self.witness_closed(free, j), want)
        self._count()
        return bool(got)

    def closed_all(self, free: Sequence[int], j: int, want: int) -> int:
        """Exactly which counts in ``want`` can be placed from a state with no open stage
        (fewer when the search budget runs out)."""
        found = 0
        free = list(free)
        while want:
            got = self._answer(lambda w: self._closed_rec(free, j, w),
                               lambda: self.witness_closed(free, j), want)
            self._count()
            if not got:
                break
            found |= got
            want &= ~got
        return found

    def open(self, free: Sequence[int], j: int, cls: int, tp: int, dp: int, want: int) -> bool:
        """The same for an open stage of class ``cls`` with ``dp`` blocks already taken
        (``free`` is after taking them)."""
        free = list(free)
        got = self._answer(lambda w: self._open_rec(free, j, cls, tp, dp, w),
                           lambda: self.witness_open(free, j, cls, tp, dp), want)
        self._count()
        return bool(got)

    def _answer(self, search: Callable[[int], int], witness: Callable[[], int],
                want: int) -> int:
        """The wanted counts found reachable: a short probe of the search (memo hits and
        fast paths answer most queries), then the witness, then the search with its whole
        budget (which resumes from what the probe memoised)."""
        if self.use_witness:
            self._left = _PROBE
            got = search(want) & want
            if got or self._left > 0:  # found, or searched in full within the probe
                return got
            got = witness() & want
            if got:
                self._left = 1  # answered by the witness: not a query cut by the budget
                return got
        self._left = self.budget
        return search(want) & want

    # ---- greedy witnesses ----------------------------------------------------------------
    def witness_closed(self, free: Sequence[int], j: int) -> int:
        """Counts of remaining layers that one greedily built completion places from a
        state with no open stage (a subset of the reachable counts)."""
        key = (self.key(free), min(j, self.m))
        hit = self._witness.get(key)
        if hit is None:
            hit = self._witness[key] = self._chain(list(free), j)
        return hit

    def witness_open(self, free: Sequence[int], j: int, cls: int, tp: int, dp: int) -> int:
        """The same for an open stage of ``dp`` blocks (``free`` is after taking them): the
        stage grows to each replica count that divides the micro-batch, its blocks packed
        greedily, then closes as the first stage or before a greedy completion."""
        free = list(free)
        out, taken, d = 0, [], dp
        avail = self._free_blocks(free, cls, tp)
        while True:
            if not self.mb % d:
                out |= bits_upto(self.capacity(cls, tp, d, j, True))
                cap = self.capacity(cls, tp, d, j, False)
                if cap:
                    out |= _smear_up(self.witness_closed(free, j + 1), cap)
            nxt = next((e for e in self._dps if e > d), 0)
            if not nxt or nxt - dp > avail:
                break
            taken += self._take(free, cls, tp, nxt - d)
            d = nxt
        for h in taken:
            free[h] += tp
        return out & self._all

    def _free_blocks(self, free: Sequence[int], cls: int, tp: int) -> int:
        return sum(free[h] // tp for h in self._eligible[cls, tp])

    def _take(self, free: list[int], cls: int, tp: int, n: int) -> list[int]:
        """Take ``n`` blocks of ``tp`` GPUs of type ``cls`` from the hosts with the fewest
        free GPUs first (which keeps whole hosts free for wide TP later); the hosts taken
        from, one entry per block."""
        taken: list[int] = []
        for h in sorted(self._eligible[cls, tp], key=lambda h: free[h]):
            while free[h] >= tp and len(taken) < n:
                free[h] -= tp
                taken.append(h)
            if len(taken) == n:
                break
        return taken

    def _level(self, free: Sequence[int], j: int,
               ) -> tuple[list[tuple[int, int, int, int]], tuple[int, int, int, int] | None]:
        """The stage shapes the free GPUs allow at index ``j``: (capacity as the first
        stage, type, tp, replicas) of each, and the shape that holds the most layers as
        a stage before others, fewest GPUs on ties (``(capacity, type, tp, replicas)``)."""
        firsts: list[tuple[int, int, int, int]] = []
        best: tuple[int, int, int, int] | None = None
        for c in range(len(self.classes.members)):
            for tp in self._tps[c]:
                avail = self._free_blocks(free, c, tp)
                for d in self._dps:
                    if d > avail:
                        break
                    firsts.append((self.capacity(c, tp, d, j, True), c, tp, d))
                    cap = self.capacity(c, tp, d, j, False)
                    if cap and (best is None or cap > best[0] or
                                cap == best[0] and tp * d < best[2] * best[3]):
                        best = (cap, c, tp, d)
        return firsts, best

    def _chain(self, free: list[int], j: int) -> int:
        """Build stages from index ``j`` on: at each index, every stage shape that fits the
        free GPUs may close the plan as its first stage (an interval of counts); otherwise
        the shape of ``_level`` is placed and the chain goes on with what is left. ``free``
        is restored."""
        firsts, best = self._level(free, j)
        out = 0
        for cap, *_ in firsts:
            out |= bits_upto(cap)
        if best is not None and out & self._all != self._all:
            cap, c, tp, d = best
            taken = self._take(free, c, tp, d)
            out |= _smear_up(self.witness_closed(free, j + 1), cap)
            for h in taken:
                free[h] += tp
        return out & self._all

    def witness_completion(self, free: Sequence[int], j: int, r: int, *,
                           open_stage: tuple[int, int, int] | None = None,
                           ) -> list[tuple[int, int, tuple[int, ...], int]] | None:
        """The completion behind a witnessed count ``r``: stages in construction order as
        (type, tp, the host of each block, layers), the open stage ``(type, tp, replicas
        taken)`` first (its blocks so far are not listed); None when ``r`` is not
        witnessed. For tests and diagnostics: it retraces ``_chain`` and ``witness_open``."""
        free = list(free)
        out: list[tuple[int, int, tuple[int, ...], int]] = []
        if open_stage is not None:
            cls, tp, dp = open_stage
            grown: list[int] = []
            d = dp
            while True:
                if not self.mb % d:
                    if self.capacity(cls, tp, d, j, True) >= r:
                        return [(cls, tp, tuple(grown), r)]
                    cap = self.capacity(cls, tp, d, j, False)
                    for k in range(1, min(cap, r - 1) + 1):
                        if self.witness_closed(free, j + 1) >> (r - k) & 1:
                            rest = self.witness_completion(free, j + 1, r - k)
                            assert rest is not None
                            return [(cls, tp, tuple(grown), k)] + rest
                nxt = next((e for e in self._dps if e > d), 0)
                if not nxt or nxt - d > self._free_blocks(free, cls, tp):
                    return None
                grown += self._take(free, cls, tp, nxt - d)
                d = nxt
        firsts, best = self._level(free, j)
        for cap, c, tp, d in firsts:
            if cap >= r:
                return [(c, tp, tuple(self._take(free, c, tp, d)), r)]
        if best is None:
            return None
        cap, c, tp, d = best
        taken = tuple(self._take(free, c, tp, d))
        for k in range(1, min(cap, r - 1) + 1):
            if self.witness_closed(free, j + 1) >> (r - k) & 1:
                rest = self.witness_completion(free, j + 1, r - k)
                assert rest is not None
                return out + [(c, tp, taken, k)] + rest
        return None

    def _count(self) -> None:
        self.queries += 1
        if self._left <= 0:
            self.cut_queries += 1

    def _closed_rec(self, free: list[int], j: int, want: int) -> int:
        # Fast path, no memo: a simple completion (one stage per host) places a wanted count.
        # Fast path, no memo: one block alone, as the first stage, holds a wanted count.
        low = want & -want  # the smallest wanted count, as a bit
        for c in range(len(self.classes.members)):
            for tp in self._tps[c]:
                for h in self._eligible[c, tp]:
                    if free[h] >= tp:
                        first = bits_upto(self.capacity(c, tp, 1, j, True))
                        if first & low:
                            return first
                        break
        key = (self.key(free), min(j, self.m))
        entry = self._closed.get(key)
        if entry is None:
            entry = self._closed[key] = [0, self._all & ~bits_upto(self.upper(free, j))]
        if entry[0] & want or not want & ~entry[1]:
            return entry[0]
        want &= ~entry[1]
        self._left -= 1
        for c in range(len(self.classes.members)):
            for tp in reversed(self._tps[c]):
                if self._extend(entry, free, j, c, tp, 1, want) is not False:
                    return entry[0]
        if self._left > 0:
            entry[1] |= want  # searched in full: none of these counts is reachable
        return entry[0]

    def _open_rec(self, free: list[int], j: int, cls: int, tp: int, dp: int, want: int) -> int:
        if not self.mb % dp:
            # Fast path, no memo: closing now as the first stage holds a wanted count.
            quick = bits_upto(self.capacity(cls, tp, dp, j, True))
            if quick & want:
                return quick
        key = (self.key(free), min(j, self.m), cls, tp, dp)
        entry = self._open.get(key)
        if entry is None:
            ub = self.upper(free, j, tp * dp * self.density(cls, j))
            entry = self._open[key] = [0, self._all & ~bits_upto(ub)]
        if entry[0] & want or not want & ~entry[1]:
            return entry[0]
        want &= ~entry[1]
        self._left -= 1
        got = self._close_set(free, j, cls, tp, dp, want)
        entry[0] |= got
        entry[1] |= got
        if got & want:
            return entry[0]
        if dp < self.mb and self._extend(entry, free, j, cls, tp, dp + 1, want) is not False:
            return entry[0]
        if self._left > 0:
            entry[1] |= want
        return entry[0]

    def _extend(self, entry: list[int], free: list[int], j: int, cls: int, tp: int, dp: int,
                want: int) -> bool | None:
        """Try the open stage with its ``dp``-th block from each distinct host, recording
        what is found in ``entry``: True once a wanted count is reachable, None when the
        budget runs out, False when no host gives one."""
        for h in self._distinct(free, self._eligible[cls, tp], tp):
            if self._left <= 0:
                return None
            free[h] -= tp
            got = self._open_rec(free, j, cls, tp, dp, want)
            free[h] += tp
            entry[0] |= got
            entry[1] |= got
            if got & want:
                return True
        return False

    def _close_set(self, free: list[int], j: int, cls: int, tp: int, dp: int, want: int) -> int:
        """Reachable counts (some among ``want`` if any is) if the open stage closes now."""
        if self.mb % dp:
            return 0
        out = bits_upto(self.capacity(cls, tp, dp, j, True))
        if out & want:
            return out
        cap = self.capacity(cls, tp, dp, j, False)
        if not cap:
            return out
        # This stage takes k = 1..cap layers: the rest must place want - k.
        rest_want = _smear_down(want, cap) & self._all
        if rest_want:
            rest = self._closed_rec(free, j + 1, rest_want)
            out |= _smear_up(rest, cap) & self._all
        return out

    def _distinct(self, free: Sequence[int], members: Sequence[int], tp: int) -> list[int]:
        """One host per distinct (GPU count, free count) that can give a block of ``tp``
        GPUs, most free first (hosts alike in both give the same answers)."""
        seen: set[tuple[int, int]] = set()
        out = []
        for h in sorted(members, key=lambda h: -free[h]):
            key = (self._counts[h], free[h])
            if free[h] >= tp and key not in seen:
                seen.add(key)
                out.append(h)
        return out

    def stats(self) -> dict[str, int]:
        return {"closed_states": len(self._closed), "open_states": len(self._open),
                "queries": self.queries, "cut_queries": self.cut_queries}


# ---- the compiled twin ------------------------------------------------------------------
# ``hatch_build.py`` compiles this very file with mypyc into ``_feasibility_native``
# (``hetpar/native.py``): the same searches, the same answers, in about half the time.
# The twin replaces the classes above only while it was built from this file's text as
# it stands.
PureCompletions = Completions
PureHostClasses = HostClasses

# The module the masks run: the compiled twin, or None (this file as it stands).
NATIVE: ModuleType | None = compiled_twin(__name__, __file__)
if NATIVE is not None:
    globals().update(Completions=NATIVE.Completions, HostClasses=NATIVE.HostClasses)
