"""Which partial plans a framework's runtime can still complete (``--runtime``).

``feasibility.Completions`` answers the completion question over hetpar's whole plan
space, where hosts of one GPU type and count are interchangeable. A runtime such as
Megatron-LM or DeepSpeed (``hetpar.runtime.rules``) adds three rules that break that
symmetry or the interval structure its bit sets rely on:

* **one TP degree and one replica count** for every stage: the stage built first (the
  last pipeline stage) fixes both for the rest of the episode;
* **a host order**: stages lie along an order of the hosts, so a stage may continue on
  at most one host of the stage built just before it (the *going-on* hosts: that stage's
  hosts but the one it continued on, or that host when it was alone), and every other
  host used before is finished;
* **the layer split** the framework expresses: Megatron-LM's even split with free first
  and last stages ("ends"), DeepSpeed's ``partition_uniform`` ("uniform").

Built back to front, the environment meets the rules in mirror image, and each is
symmetric under reversing the pipeline, so they are checked in construction order.

``RuntimeCompletions`` answers by a depth-first search over the environment's own
steps (a block from a host, a close with a layer count), memoised on a canonical state:
fresh hosts of one group (GPU type and count) are alike, going-on hosts and the open
stage's hosts by (group, free GPUs). Each search has a node budget. A "yes" is always a
completion it found, and every state on that completion is memoised "yes", so the
environment finds the next step of it again: masks built from these answers never lead
into a dead end. A search cut by its budget answers "no" (counted in ``cut_queries``),
which may hide a completable action on a large cluster but never allows a wrong one;
on small clusters the search is exhaustive and the masks allow exactly the runnable
plans (tests compare them with an enumeration).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from hetpar.envs.feasibility import Completions
from hetpar.runtime.rules import Runtime, uniform_split

__all__ = ["RuntimeCompletions", "RUNTIME_BUDGET"]

RUNTIME_BUDGET = 4_000  # search nodes per query before it answers "no"
_PROBE = 64  # search nodes before a query asks the greedy witness


class _OutOfBudget(Exception):
    pass


class RuntimeCompletions:
    """Completion answers under ``runtime`` for one (instance, recompute, ZeRO, micro-batch
    count), sharing ``base``'s capacities and host classes.

    The public queries take the environment's episode as it stands: ``built`` (closed
    stages in construction order, as ``(StageChoice, layers)``), ``free`` (free GPUs per
    host), and for an open stage its type, TP degree and blocks per host."""

    def __init__(self, base: Completions, runtime: Runtime, budget: int | None = None,
                 ) -> None:
        if runtime.unrestricted or not (runtime.uniform and runtime.contiguous):
            raise ValueError(f"runtime {runtime.name!r}: only uniform, host-ordered runtimes "
                             f"restrict the environment")
        self.base = base
        self.runtime = runtime
        self.budget = RUNTIME_BUDGET if budget is None else budget
        self.layers = base.layers
        self.mb = base.mb
        classes = base.classes
        self._group = [-1] * len(classes.of_host)
        for g, hosts in enumerate(classes.groups):
            for h in hosts:
                self._group[h] = g
        self._n_groups = len(classes.groups)
        self._memo: dict[tuple, bool] = {}
        self._left = 0
        self.queries = 0
        self.cut_queries = 0
        self._uniform_rev: dict[int, tuple[int, ...]] = {}

    # ---- the layer-split rule, in construction order -------------------------------------
    # Its state after the closes so far: "ends" keeps the middle count once the second
    # stage is built (None before); "uniform" keeps the stage counts p still consistent
    # (None: every count).
    def _rev_split(self, p: int) -> tuple[int, ...]:
        hit = self._uniform_rev.get(p)
        if hit is None:
            hit = self._uniform_rev[p] = uniform_split(self.layers, p)[::-1]
        return hit

    def _candidates(self, sst: Any) -> Iterable[int]:
        return range(1, self.layers + 1) if sst is None else sst

    def _nonfinal(self, sst: Any, j: int, r: int, cap: int) -> list[int]:
        """Layer counts a stage built ``j``-th may close with when stages follow, largest
        first (at most ``cap`` and fewer than the ``r`` layers left)."""
        top = min(cap, r - 1)
        if top < 1:
            return []
        if self.runtime.splits == "ends":
            if j >= 2:
                return [sst] if sst <= top else []
            return list(range(top, 0, -1))
        ks = {self._rev_split(p)[j] for p in self._candidates(sst) if p > j + 1}
        return sorted((k for k in ks if k <= top), reverse=True)

    def _after(self, sst: Any, j: int, k: int) -> Any:
        if self.runtime.splits == "ends":
            return k if j == 1 else sst
        return frozenset(p for p in self._candidates(sst)
                         if p > j + 1 and self._rev_split(p)[j] == k)

    def _final_ok(self, sst: Any, j: int) -> bool:
        """Whether the stage built ``j``-th may be the first pipeline stage (taking every
        layer left)."""
        if self.runtime.splits == "ends":
            return True
        return sst is None and j == 0 or sst is not None and (j + 1) in sst

    # ---- the episode as the search sees it ----------------------------------------------
    def _prefix(self, built: Sequence[tuple[Any, int]], free: Sequence[int],
                ) -> tuple[list[int], frozenset[int], Any, tuple[int, int] | None]:
        """(free GPUs with finished hosts at 0, going-on hosts, split state, fixed (tp, dp))."""
        going: frozenset[int] = frozenset()
        usable = list(free)
        sst: Any = None
        for j, (st, k) in enumerate(built):
            hosts = set(st.hosts)
            going = self._close_hosts(usable, going, hosts, next(iter(hosts & going), None))
            sst = self._after(sst, j, k)
        fixed = (built[0][0].tp, built[0][0].dp) if built else None
        return usable, going, sst, fixed

    def _eligible(self, cls: int, tp: int) -> tuple[int, ...]:
        return self.base._eligible.get((cls, tp), ())

    def can_add(self, built: Sequence[tuple[Any, int]], free: Sequence[int], cls: int,
                tp: int, blocks: dict[int, int], host: int) -> bool:
        """Whether the rules let the open stage (``cls`` < 0: none yet, opening with ``tp``)
        take a block of ``tp`` GPUs from ``host``, completion aside."""
        usable, going, _, fixed = self._prefix(built, free)
        return self._addable(usable, going, fixed, cls, tp, blocks, host)

    def _addable(self, usable: Sequence[int], going: frozenset[int],
                 fixed: tuple[int, int] | None, cls: int, tp: int, blocks: dict[int, int],
                 host: int) -> bool:
        hcls = self.base.classes.of_host[host]
        if hcls < 0 or usable[host] < tp or host not in self._eligible(hcls, tp):
            return False
        dp = sum(blocks.values())
        if dp >= self.mb or fixed is not None and (tp != fixed[0] or dp >= fixed[1]):
            return False
        if blocks and hcls != cls:
            return False
        if host in going and host not in blocks and any(h in going for h in blocks):
            return False  # a stage continues on one host of the stage before it at most
        return True

    # ---- public queries ---------------------------------------------------------------
    def closed(self, built: Sequence[tuple[Any, int]], free: Sequence[int], r: int) -> bool:
        """Whether ``r`` layers left can be placed from a state with no open stage."""
        usable, going, sst, fixed = self._prefix(built, free)
        return self._query_closed(usable, going, len(built), r, sst, fixed)

    def open(self, built: Sequence[tuple[Any, int]], free: Sequence[int], cls: int, tp: int,
             blocks: dict[int, int], r: int) -> bool:
        """The same with an open stage (``free`` after taking its ``blocks``)."""
        usable, going, sst, fixed = self._prefix(built, free)
        entry = next((h for h in blocks if h in going), None)
        return self._query_open(usable, going, len(built), r, sst, fixed, cls, tp,
                                dict(blocks), entry)

    def host_options(self, built: Sequence[tuple[Any, int]], free: Sequence[int], cls: int,
                     tp: int, blocks: dict[int, int], r: int, first_only: bool = False,
                     ) -> np.ndarray:
        """Hosts from which a block of ``tp`` GPUs keeps a runnable plan completable."""
        usable, going, sst, fixed = self._prefix(built, free)
        n = len(free)
        out = np.zeros(n, dtype=bool)
        seen: dict[tuple, bool] = {}
        for h in range(n):
            if not self._addable(usable, going, fixed, cls, tp, blocks, h):
                continue
            key = self._role(h, usable, going, blocks)
            if key not in seen:
                nb = dict(blocks)
                nb[h] = nb.get(h, 0) + 1
                entry = next((x for x in nb if x in going), None)
                usable[h] -= tp
                seen[key] = self._query_open(usable, going, len(built), r, sst, fixed,
                                             self.base.classes.of_host[h], tp, nb, entry)
                usable[h] += tp
            out[h] = seen[key]
            if first_only and out[h]:
                break
        return out

    def close_options(self, built: Sequence[tuple[Any, int]], free: Sequence[int], cls: int,
                      tp: int, blocks: dict[int, int], r: int, max_layers: int) -> np.ndarray:
        """Layer counts (slot k - 1) the open stage may close with."""
        out = np.zeros(max_layers, dtype=bool)
        dp = sum(blocks.values())
        usable, going, sst, fixed = self._prefix(built, free)
        if not dp or self.mb % dp or (fixed is not None and dp != fixed[1]):
            return out
        j = len(built)
        base = self.base
        if r <= base.capacity(cls, tp, dp, j, True) and self._final_ok(sst, j) and \
                r <= max_layers:
            out[r - 1] = True
        entry = next((h for h in blocks if h in going), None)
        nxt_free, nxt_going = self._closing(usable, going, blocks, entry)
        for k in self._nonfinal(sst, j, r, base.capacity(cls, tp, dp, j, False)):
            if k <= max_layers:
                out[k - 1] = self._query_closed(nxt_free, nxt_going, j + 1, r - k,
                                                self._after(sst, j, k), fixed or (tp, dp))
        return out

    def stats(self) -> dict[str, int]:
        return {"states": len(self._memo), "queries": self.queries,
                "cut_queries": self.cut_queries}

    # ---- the search ---------------------------------------------------------------------
    # A query first searches briefly (memo hits and small trees answer most), then asks
    # a greedy witness, then searches with the whole budget (resuming from what the probe
    # memoised): on large clusters the depth-first search can spend any budget in one
    # corner of the tree where a completion exists elsewhere.
    def _ask(self, search: Any, witness: Any) -> bool:
        self.queries += 1
        self._left = _PROBE
        try:
            return bool(search())
        except _OutOfBudget:
            pass
        if witness():
            return True
        self._left = self.budget
        try:
            return bool(search())
        except _OutOfBudget:
            self.cut_queries += 1
            return False

    def _query_closed(self, usable: list[int], going: frozenset[int], j: int, r: int,
                      sst: Any, fixed: tuple[int, int] | None) -> bool:
        return self._ask(lambda: self._closed(usable, going, j, r, sst, fixed),
                         lambda: self._witness(usable, going, j, r, sst, fixed))

    def _query_open(self, usable: list[int], going: frozenset[int], j: int, r: int, sst: Any,
                    fixed: tuple[int, int] | None, cls: int, tp: int, blocks: dict[int, int],
                    entry: int | None) -> bool:
        return self._ask(
            lambda: self._open(usable, going, j, r, sst, fixed, cls, tp, blocks, entry),
            lambda: self._witness(usable, going, j, r, sst, fixed, (cls, tp, blocks, entry)))

    def _tick(self) -> None:
        self._left -= 1
        if self._left < 0:
            raise _OutOfBudget

    def _role(self, h: int, usable: Sequence[int], going: frozenset[int],
              blocks: dict[int, int]) -> tuple:
        """Hosts with equal roles give equal answers: the open stage's host that continues
        the stage before (0), its other hosts (3), going-on hosts (1), fresh hosts (2)."""
        role = (0 if h in going else 3) if h in blocks else 1 if h in going else 2
        return (role, self._group[h], usable[h])

    def _fresh(self, usable: Sequence[int], going: frozenset[int],
               blocks: dict[int, int]) -> tuple[int, ...]:
        counts = [0] * self._n_groups
        for h, f in enumerate(usable):
            if f and h not in going and h not in blocks:
                counts[self._group[h]] += 1
        return tuple(counts)

    def _sig(self, hosts: Iterable[int], usable: Sequence[int]) -> tuple:
        return tuple(sorted((self._group[h], usable[h]) for h in hosts))

    def _closing(self, usable: Sequence[int], going: frozenset[int], blocks: dict[int, int],
                 entry: int | None) -> tuple[list[int], frozenset[int]]:
        """Free GPUs and going-on hosts once the open stage closes."""
        nxt = list(usable)
        return nxt, self._close_hosts(nxt, going, set(blocks), entry)

    def _fits(self, usable: Sequence[int], j: int, r: int, sst: Any,
              fixed: tuple[int, int] | None, open_dp: int = 0) -> bool:
        """A necessary condition for placing ``r`` layers from index ``j`` once the
        degrees are fixed: no more stages than the free blocks make, none holding more
        than the most any type holds (the activations in flight only grow with the
        index past the last stage), and the split rule's counts (the middle count
        once known; the stage counts still consistent for "uniform"). ``open_dp``: the
        blocks an open stage has taken (it is one of the stages)."""
        if fixed is None:
            return True
        tp, dp = fixed
        base = self.base
        blocks = 0
        cap_n = cap_f = 0
        for c in range(len(base.classes.members)):
            hosts = self._eligible(c, tp)
            if not hosts:
                continue
            for h in hosts:
                blocks += usable[h] // tp
            for jj in {j, max(j, 1)}:
                cap_n = max(cap_n, base.capacity(c, tp, dp, jj, False))
                cap_f = max(cap_f, base.capacity(c, tp, dp, jj, True))
        stages = (blocks + open_dp) // dp
        if stages < 1:
            return False
        if self.runtime.splits == "ends":
            if j >= 2:
                m = sst
                if m > cap_n:
                    return 1 <= r <= cap_f
                # q more stages of m layers, then a first stage of 1..cap_f layers.
                q_lo = max(0, -(-(r - cap_f) // m))
                q_hi = min(stages - 1, (r - 1) // m)
                return q_lo <= q_hi
            return r <= (stages - 1) * cap_n + cap_f
        cap = max(cap_n, cap_f)
        return any(p - j <= stages and max(self._rev_split(p)[j:]) <= cap
                   for p in self._candidates(sst) if p > j)

    def _closed_key(self, usable: Sequence[int], going: frozenset[int], j: int, r: int,
                    sst: Any, fixed: tuple[int, int] | None) -> tuple:
        return ("c", self._fresh(usable, going, {}), self._sig(going, usable), j, r, sst, fixed)

    def _open_key(self, usable: Sequence[int], going: frozenset[int], j: int, r: int, sst: Any,
                  fixed: tuple[int, int] | None, cls: int, tp: int, blocks: dict[int, int],
                  entry: int | None) -> tuple:
        rest = [h for h in blocks if h != entry]
        return ("o", self._fresh(usable, going, blocks),
                self._sig(going, usable) if entry is None else (),
                None if entry is None else (self._group[entry], usable[entry]),
                self._sig(rest, usable), j, r, sst, fixed, cls, tp, sum(blocks.values()))

    def _closed(self, usable: list[int], going: frozenset[int], j: int, r: int, sst: Any,
                fixed: tuple[int, int] | None) -> bool:
        key = self._closed_key(usable, going, j, r, sst, fixed)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        ok = False
        if r <= self.base.upper(usable, j) and self._fits(usable, j, r, sst, fixed):
            self._tick()
            base = self.base
            for c in range(len(base.classes.members)):
                tps = (fixed[0],) if fixed else tuple(reversed(base._tps[c]))
                for tp in tps:
                    seen: set[tuple] = set()
                    for h in self._eligible(c, tp):
                        if usable[h] < tp:
                            continue
                        role = self._role(h, usable, going, {})
                        if role in seen:
                            continue
                        seen.add(role)
                        usable[h] -= tp
                        try:
                            ok = self._open(usable, going, j, r, sst, fixed, c, tp, {h: 1},
                                            h if h in going else None)
                        finally:
                            usable[h] += tp
                        if ok:
                            break
                    if ok:
                        break
                if ok:
                    break
        self._memo[key] = ok
        return ok

    def _open(self, usable: list[int], going: frozenset[int], j: int, r: int, sst: Any,
              fixed: tuple[int, int] | None, cls: int, tp: int, blocks: dict[int, int],
              entry: int | None) -> bool:
        dp = sum(blocks.values())
        key = self._open_key(usable, going, j, r, sst, fixed, cls, tp, blocks, entry)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        base = self.base
        ok = False
        if r <= base.upper(usable, j, tp * dp * base.density(cls, j)) and \
                self._fits(usable, j, r, sst, fixed, dp):
            self._tick()
            ok = self._close_any(usable, going, j, r, sst, fixed, cls, tp, blocks, entry)
            if not ok and dp < (fixed[1] if fixed else self.mb):
                ok = self._grow(usable, going, j, r, sst, fixed, cls, tp, blocks, entry)
        self._memo[key] = ok
        return ok

    def _close_any(self, usable: list[int], going: frozenset[int], j: int, r: int, sst: Any,
                   fixed: tuple[int, int] | None, cls: int, tp: int, blocks: dict[int, int],
                   entry: int | None) -> bool:
        dp = sum(blocks.values())
        if self.mb % dp or (fixed is not None and dp != fixed[1]):
            return False
        base = self.base
        if r <= base.capacity(cls, tp, dp, j, True) and self._final_ok(sst, j):
            return True
        ks = self._nonfinal(sst, j, r, base.capacity(cls, tp, dp, j, False))
        if not ks:
            return False
        nxt, nxt_going = self._closing(usable, going, blocks, entry)
        for k in ks:
            if self._closed(nxt, nxt_going, j + 1, r - k, self._after(sst, j, k),
                            fixed or (tp, dp)):
                return True
        return False

    def _grow(self, usable: list[int], going: frozenset[int], j: int, r: int, sst: Any,
              fixed: tuple[int, int] | None, cls: int, tp: int, blocks: dict[int, int],
              entry: int | None) -> bool:
        seen: set[tuple] = set()
        # The stage's own hosts first, then a going-on host, then fresh ones: packing
        # finds a completion soonest.
        rank = {0: 0, 3: 0, 1: 1, 2: 2}
        hosts = sorted(self._eligible(cls, tp),
                       key=lambda h: (rank[self._role(h, usable, going, blocks)[0]],
                                      -usable[h]))
        for h in hosts:
            if usable[h] < tp:
                continue
            if h in going and h not in blocks and entry is not None:
                continue
            role = self._role(h, usable, going, blocks)
            if role in seen:
                continue
            seen.add(role)
            blocks[h] = blocks.get(h, 0) + 1
            usable[h] -= tp
            try:
                ok = self._open(usable, going, j, r, sst, fixed, cls, tp, blocks,
                                h if entry is None and h in going else entry)
            finally:
                usable[h] += tp
                blocks[h] -= 1
                if not blocks[h]:
                    del blocks[h]
            if ok:
                return True
        return False

    # ---- the greedy witness -------------------------------------------------------------
    def _witness(self, usable: Sequence[int], going: frozenset[int], j: int, r: int, sst: Any,
                 fixed: tuple[int, int] | None,
                 open_stage: tuple[int, int, dict[int, int], int | None] | None = None,
                 ) -> bool:
        """Look for one completion built by a fixed rule and, if found, memoise every
        state on it as completable (what keeps the masks free of dead ends). For each
        pair of degrees and each order of the GPU types, stages are cut one after another
        from the hosts of one type (a stage continues on the fullest going-on host of its
        type, then takes fresh hosts in index order), and a layer split the rule admits is
        sought over the first stages so made."""
        classes = self.base.classes
        n_types = len(classes.members)
        if open_stage is not None:
            cls, tp, blocks, entry = open_stage
            dps = [fixed[1]] if fixed else [d for d in self.base._dps
                                            if d >= sum(blocks.values())]
            degrees = [(tp, d) for d in dps]
        elif fixed is not None:
            degrees = [fixed]
        else:
            degrees = sorted({(tp, d) for c in range(n_types) for tp in self.base._tps[c]
                              for d in self.base._dps}, key=lambda x: (-x[0], -x[1]))
        # Types by usable memory, both ways (activations grow with the construction index).
        by_memory = sorted(range(n_types), key=lambda c: classes.usable_bytes[c])
        orders = [by_memory, by_memory[::-1]] if n_types > 1 else [by_memory]
        for tp, dp in degrees:
            for order in orders:
                stages = self._cut(usable, going, tp, dp, order, open_stage)
                if not stages:
                    continue
                counts = self._split_for(stages, j, r, sst, tp, dp)
                if counts is not None:
                    self._mark(usable, going, j, r, sst, fixed, tp, stages, counts, open_stage)
                    return True
        return False

    def _cut(self, usable: Sequence[int], going: frozenset[int], tp: int, dp: int,
             order: Sequence[int], open_stage: tuple[int, int, dict[int, int], int | None] | None,
             ) -> list[tuple[int, list[int]]]:
        """Stages as (type, the host of each block added, in order), greedily."""
        free = list(usable)
        out: list[tuple[int, list[int]]] = []
        if open_stage is not None:
            cls, _, blocks, entry = open_stage
            if cls >= 0 and blocks:
                need = dp - sum(blocks.values())
                added: list[int] = []
                pool = sorted(blocks, key=lambda h: -free[h]) + [
                    h for h in self._eligible(cls, tp)
                    if h not in blocks and h not in going and free[h]]
                for h in pool:  # the stage's own hosts are eligible already
                    while need and free[h] >= tp:
                        free[h] -= tp
                        added.append(h)
                        need -= 1
                if need:
                    return []
                out.append((cls, added))
                hosts = set(blocks) | set(added)
                going = self._close_hosts(free, going, hosts, entry)
        for c in order:
            eligible = self._eligible(c, tp)
            while True:
                cont = max((h for h in eligible if h in going and free[h] >= tp),
                           key=lambda h: free[h], default=None)
                pool = ([cont] if cont is not None else []) + [
                    h for h in eligible if h not in going and free[h] >= tp]
                need, added = dp, []
                for h in pool:
                    while need and free[h] >= tp:
                        free[h] -= tp
                        added.append(h)
                        need -= 1
                    if not need:
                        break
                if need:
                    for h in added:
                        free[h] += tp
                    break
                out.append((c, added))
                going = self._close_hosts(free, going, set(added),
                                          cont if cont in added else None)
        return out

    def _close_hosts(self, free: list[int], going: frozenset[int], hosts: set[int],
                     entry: int | None) -> frozenset[int]:
        """Close a stage on ``hosts`` that continued on ``entry`` (None: on no host of the
        stage before): the hosts it finishes get no free GPUs in ``free``; returns the
        going-on hosts the next stage may continue on."""
        nxt = frozenset(hosts) if len(hosts) == 1 else frozenset(hosts) - {entry}
        for h in (going - {entry}) | (frozenset(hosts) - nxt):
            free[h] = 0
        return nxt

    def _split_for(self, stages: list[tuple[int, list[int]]], j: int, r: int, sst: Any,
                   tp: int, dp: int) -> list[int] | None:
        """Layer counts for the first stages of ``stages`` (the last one takes what is
        left as the first pipeline stage) that fit and that the split rule admits."""
        cap = self.base.capacity
        n_cap = [cap(c, tp, dp, j + i, False) for i, (c, _) in enumerate(stages)]
        f_cap = [cap(c, tp, dp, j + i, True) for i, (c, _) in enumerate(stages)]
        for q in range(1, len(stages) + 1):
            last = q - 1
            if self.runtime.splits == "uniform":
                for p in self._candidates(sst):
                    if p != j + q:
                        continue
                    counts = list(self._rev_split(p)[j:j + q])
                    if sum(counts) == r and counts[last] <= f_cap[last] and \
                            all(k <= n_cap[i] for i, k in enumerate(counts[:last])):
                        return counts
                continue
            if q == 1:
                if r <= f_cap[0]:
                    return [r]
                continue
            if j >= 2 or (j == 1 and q >= 2):
                # Every stage but the final one holds the middle count m.
                ms = [sst] if j >= 2 else range(min(min(n_cap[:last]), r - 1), 0, -1)
                for m in ms:
                    f = r - m * last
                    if m <= min(n_cap[:last]) and 1 <= f <= f_cap[last]:
                        return [m] * last + [f]
                continue
            # j == 0: a free last pipeline stage, middles of m, a free first stage.
            middles = n_cap[1:last]
            for m in (range(min(middles), 0, -1) if middles else [0]):
                rem = r - m * len(middles)
                k0 = min(n_cap[0], rem - 1)
                if k0 >= 1 and 1 <= rem - k0 <= f_cap[last]:
                    return [k0] + [m] * len(middles) + [rem - k0]
        return None

    def _mark(self, usable: Sequence[int], going: frozenset[int], j: int, r: int, sst: Any,
              fixed: tuple[int, int] | None, tp: int, stages: list[tuple[int, list[int]]],
              counts: list[int],
              open_stage: tuple[int, int, dict[int, int], int | None] | None) -> None:
        """Memoise every state of the witnessed completion as completable, walking it as
        the environment would."""
        free = list(usable)
        if open_stage is None:
            self._memo[self._closed_key(free, going, j, r, sst, fixed)] = True
        for i, ((c, added), k) in enumerate(zip(stages, counts)):
            if i == 0 and open_stage is not None:
                blocks, entry = dict(open_stage[2]), open_stage[3]
                self._memo[self._open_key(free, going, j, r, sst, fixed, c, tp, blocks,
                                          entry)] = True
            else:
                blocks, entry = {}, None
            for h in added:
                free[h] -= tp
                blocks[h] = blocks.get(h, 0) + 1
                if entry is None and h in going:
                    entry = h
                self._memo[self._open_key(free, going, j, r, sst, fixed, c, tp, blocks,
                                          entry)] = True
            if i == len(counts) - 1:
                return
            free, going = self._closing(free, going, blocks, entry)
            sst = self._after(sst, j, k)
            fixed = fixed or (tp, sum(blocks.values()))
            j, r = j + 1, r - k
            self._memo[self._closed_key(free, going, j, r, sst, fixed)] = True
