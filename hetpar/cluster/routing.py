"""Host-to-host routes of a cluster network, computed on demand.

A route is the shortest path by latency (each hop weighs its link's latency plus 1e-9 s,
so equal-latency paths prefer fewer hops) between two hosts, as the directed channels it
crosses (channel ``2*l`` is link ``l`` from ``a`` to ``b``, ``2*l+1`` the reverse), and
its latency is the sum of those links' latencies in path order.

The straightforward method, a Dijkstra search from every host (``networkx``), costs
O(hosts x nodes) time and O(hosts^2) memory before a plan is scored: 31 s and 1.35 GB at
2,000 hosts. ``Routes`` gives the same routes and latencies, bit for bit, from the
network's structure, pair by pair as they are asked for:

* when the network joining the hosts is a tree (a single switch, the generated leaf-spine,
  switches joined without loops) every pair has one simple path, found by climbing both
  ends to their lowest common ancestor: O(depth) a pair, O(nodes) to set up;
* otherwise (loops: meshes, redundant links) one Dijkstra search per *source class*:
  a host whose only link goes to a node ``s`` reaches every other node through ``s``, and
  the search from it, step for step and tie for tie, is the one from any other host on
  ``s`` whose link has the same latency (its siblings are popped but never lead anywhere),
  so the search runs once per (``s``, latency) over the network without such hosts. It
  replicates ``networkx``'s ``_dijkstra_multisource`` (heap of (distance, push counter,
  node), neighbours in insertion order, a path kept only when strictly shorter), which the
  tests check against ``nx.single_source_dijkstra_path`` on meshes.

``table()`` and ``latency_matrix()`` materialise every pair (O(hosts^2)) for the callers
that want all of them (the exact search's bounds, the environment's observations).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import networkx as nx
import numpy as np

__all__ = ["Routes", "HOP_WEIGHT_S"]

HOP_WEIGHT_S = 1e-9
"""Added to each hop's latency in the route search: equal-latency paths prefer fewer hops."""

EAGER_HOSTS = 128
"""Up to this many hosts ``views`` builds every pair at once (16,384 pairs, tens of
milliseconds), so the cost model indexes plain tuples on its hot path; above, pair by pair."""


class _Rows:
    """``rows[i][j]``: field ``k`` of ``Routes.pair(i, j)``, computed on demand."""

    __slots__ = ("_routes", "_k")

    def __init__(self, routes: Routes, k: int) -> None:
        self._routes, self._k = routes, k

    def __len__(self) -> int:
        return self._routes._n

    def __getitem__(self, i: int) -> _Row:
        return _Row(self._routes, i, self._k)


class _Row:
    __slots__ = ("_routes", "_i", "_k")

    def __init__(self, routes: Routes, i: int, k: int) -> None:
        self._routes, self._i, self._k = routes, i, k

    def __len__(self) -> int:
        return self._routes._n

    def __getitem__(self, j: int) -> Any:
        return self._routes.pair(self._i, j)[self._k]


class Routes:
    """Routes between the hosts ``names`` (indices into that list) over ``graph``, whose
    edges carry ``index`` (into ``links``) and ``weight`` (latency + ``HOP_WEIGHT_S``)."""

    def __init__(self, names: Sequence[str], links: Sequence, graph: nx.Graph) -> None:
        self._names = tuple(names)
        self._n = len(self._names)
        self._graph = graph
        self._link_a = [lk.a for lk in links]
        self._link_lat = [float(lk.latency_s) for lk in links]
        self._pairs: dict[tuple[int, int], tuple[tuple[int, ...], float]] = {}
        self._table: tuple[tuple[tuple[int, ...], ...], ...] | None = None
        self._lat_rows: tuple[tuple[float, ...], ...] | None = None
        self._lat_matrix: np.ndarray | None = None
        # The hosts' connected component: is it a tree?
        component = nx.node_connected_component(graph, self._names[0]) if self._n else set()
        edges = sum(len(graph._adj[v]) for v in component) // 2
        self._tree = edges == len(component) - 1
        adj = graph._adj
        host_set = set(self._names)
        # A stub: a host with one link, to a node that is not itself a one-link host.
        self._stub_of: dict[str, str] = {}
        for h in self._names:
            nbrs = adj[h]
            if len(nbrs) == 1:
                (s,) = nbrs
                if not (s in host_set and len(adj[s]) == 1):
                    self._stub_of[h] = s
        if self._tree:
            self._setup_tree()
        else:
            self._searches: dict[tuple, dict] = {}
        self._bulk: tuple | None = None
        self._core: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        # Pairs asked for one by one are kept, up to a bound (a large cluster's all-to-all
        # would otherwise keep one entry per pair it ever saw).
        self._pair_cap = 1 << 20

    # ---- trees: one simple path a pair ---------------------------------------------------

    def _setup_tree(self) -> None:
        root = self._names[0]
        adj = self._graph._adj
        parent: dict = {root: None}
        depth: dict = {root: 0}
        frontier = [root]
        while frontier:
            nxt = []
            for v in frontier:
                for u in adj[v]:
                    if u not in parent:
                        parent[u] = v
                        depth[u] = depth[v] + 1
                        nxt.append(u)
            frontier = nxt
        self._parent, self._depth = parent, depth

    def _tree_path(self, src: str, dst: str) -> list[str]:
        parent, depth = self._parent, self._depth
        a, b = src, dst
        head: list = [a]
        tail: list = [b]
        while depth[a] > depth[b]:
            a = parent[a]
            head.append(a)
        while depth[b] > depth[a]:
            b = parent[b]
            tail.append(b)
        while a != b:
            a, b = parent[a], parent[b]
            head.append(a)
            tail.append(b)
        tail.pop()  # the common ancestor, already ending head
        head.extend(reversed(tail))
        return head

    # ---- general networks: one Dijkstra search per source class --------------------------

    def _search(self, src: str) -> dict:
        """Predecessors (node -> previous node) of the shortest paths from host ``src`` to
        every node that is not a stub host, as ``networkx``'s Dijkstra finds them."""
        adj = self._graph._adj
        stub_of = self._stub_of
        s = stub_of.get(src)
        key = (s, adj[src][s]["weight"]) if s is not None else (src,)
        hit = self._searches.get(key)
        if hit is not None:
            return hit
        # networkx.algorithms.shortest_paths.weighted._dijkstra_multisource, with the
        # pushes and pops of stub hosts (which relax nothing new) left out.
        dist: dict = {}
        seen: dict = {src: 0}
        pred: dict = {src: None}
        c = itertools.count()
        fringe: list = [(0, next(c), src)]
        while fringe:
            d, _, v = heapq.heappop(fringe)
            if v in dist:
                continue
            dist[v] = d
            for u, e in adj[v].items():
                if u in stub_of and u != src:
                    continue
                vu = d + e["weight"]
                if u in dist:
                    continue
                if u not in seen or vu < seen[u]:
                    seen[u] = vu
                    heapq.heappush(fringe, (vu, next(c), u))
                    pred[u] = v
        self._searches[key] = pred
        return pred

    def _general_path(self, src: str, dst: str) -> list[str]:
        pred = self._search(src)
        attach = self._stub_of.get(src)
        # A stub's search may have started from a sibling of the same class: walk back to
        # the node it hangs off, then step to the host itself.
        stop = src if attach is None else attach
        path = []
        node = dst
        last = self._stub_of.get(dst)
        if last is not None:
            path.append(dst)
            node = last
        while node != stop:
            path.append(node)
            node = pred[node]
        path.append(stop)
        if attach is not None:
            path.append(src)
        path.reverse()
        return path

    # ---- queries --------------------------------------------------------------------------

    def pair(self, i: int, j: int) -> tuple[tuple[int, ...], float]:
        """(channels, latency in s) of the route from host ``i`` to host ``j``."""
        hit = self._pairs.get((i, j))
        if hit is not None:
            return hit
        if i == j:
            out: tuple[tuple[int, ...], float] = ((), 0.0)
        else:
            src, dst = self._names[i], self._names[j]
            path = self._tree_path(src, dst) if self._tree else self._general_path(src, dst)
            chans, lats = self._path_links(path)
            lat = 0.0
            for x in lats:
                lat += x
            out = (tuple(chans), lat)
        if len(self._pairs) >= self._pair_cap:
            self._pairs.clear()
        self._pairs[(i, j)] = out
        return out

    def _path_links(self, path: list[str]) -> tuple[list[int], list[float]]:
        """(channels, link latencies) along a node path."""
        adj, link_a, link_lat = self._graph._adj, self._link_a, self._link_lat
        chans, lats = [], []
        for u, v in zip(path, path[1:]):
            e = adj[u][v]["index"]
            chans.append(2 * e if link_a[e] == u else 2 * e + 1)
            lats.append(link_lat[e])
        return chans, lats

    def _stub_tables(self) -> tuple | None:
        """(nodes hosts hang off, a host and its node per source class, each host's up
        channel, its latency, its node, its class), built once; None unless every host
        hangs off one link."""
        if len(self._stub_of) != self._n:
            return None
        if self._bulk is not None:
            return self._bulk
        nodes = sorted(set(self._stub_of.values()))
        node_id = {v: k for k, v in enumerate(nodes)}
        classes: dict[tuple, int] = {}
        reps: list[tuple[str, str]] = []  # (a host of the class, the node it hangs off)
        up_ch = np.empty(self._n, dtype=np.int64)
        up_lat = np.empty(self._n)
        attach = np.empty(self._n, dtype=np.int64)
        cls = np.empty(self._n, dtype=np.int64)
        adj = self._graph._adj
        for i, h in enumerate(self._names):
            s = self._stub_of[h]
            (ch,), (lat,) = self._path_links([h, s])
            up_ch[i], up_lat[i], attach[i] = ch, lat, node_id[s]
            key = (s,) if self._tree else (s, adj[h][s]["weight"])
            if key not in classes:
                classes[key] = len(reps)
                reps.append((h, s))
            cls[i] = classes[key]
        self._bulk = (nodes, reps, up_ch, up_lat, attach, cls)
        return self._bulk

    def bulk(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The routes from hosts ``src[p]`` to hosts ``dst[p]`` (``src[p] != dst[p]``) at
        once: ((pairs, hops) channels, in route order, with any padding (-1) before the
        last hop; (pairs,) latencies, summed in route order as ``pair`` sums them), or
        None unless every host hangs off one link (then ask ``pair`` by pair).

        A route is the host's link, the path between the nodes the two hosts hang off
        (the same for every host of one source class and one destination node, found
        once), and the other host's link."""
        tables = self._stub_tables()
        if tables is None:
            return None
        nodes, reps, up_ch, up_lat, attach, cls = tables
        # A stub's down channel is its up channel reversed (ch ^ 1), at the same latency.
        t_count = len(nodes)
        combo = cls[src] * t_count + attach[dst]
        space = len(reps) * t_count
        if space <= 1 << 24:  # a dense table of (class, node) pairs: no sort
            needed = np.zeros(space, dtype=bool)
            needed[combo] = True
            uniq = np.flatnonzero(needed)
            slot = np.zeros(space, dtype=np.int64)
            slot[uniq] = np.arange(len(uniq))
            inverse = slot[combo]
        else:
            uniq, inverse = np.unique(combo, return_inverse=True)
        cores = []
        for combo_id in uniq.tolist():
            rep, s = reps[combo_id // t_count]
            t = nodes[combo_id % t_count]
            hit = self._core.get((rep, t))
            if hit is None:
                hit = self._core[(rep, t)] = self._core_links(rep, s, t)
            cores.append(hit)
        width = max(len(c[0]) for c in cores)
        core_ch = np.full((len(cores), width), -1, dtype=np.int64)
        core_lat = np.zeros((len(cores), width))
        for k, (chans, lats) in enumerate(cores):
            core_ch[k, :len(chans)] = chans
            core_lat[k, :len(lats)] = lats
        out = np.empty((len(src), width + 2), dtype=np.int64)
        out[:, 0] = up_ch[src]
        out[:, 1:-1] = core_ch[inverse]
        out[:, -1] = up_ch[dst] ^ 1
        lat = up_lat[src].copy()  # 0.0 + x is x: the sum starts as ``pair``'s does
        for k in range(width):
            lat += core_lat[inverse, k]  # + 0.0 past a route's end leaves it unchanged
        lat += up_lat[dst]
        return out, lat

    def _core_links(self, rep: str, s: str, t: str) -> tuple[list[int], list[float]]:
        """(channels, latencies) from node ``s`` to node ``t`` on the routes from host
        ``rep`` (which hangs off ``s``) to the hosts hanging off ``t``."""
        if s == t:
            return [], []
        if self._tree:
            return self._path_links(self._tree_path(s, t))
        pred = self._search(rep)
        path = [t]
        while path[-1] != s:
            path.append(pred[path[-1]])
        path.reverse()
        return self._path_links(path)

    def _outside(self, inside: Sequence[int]) -> np.ndarray:
        mask = np.ones(self._n, dtype=bool)
        mask[list(inside)] = False
        return np.flatnonzero(mask)

    def end_hops(self, i: int, inside: Sequence[int]) -> tuple[set[int], set[int]]:
        """(first channels of the routes from host ``i`` to every host not in ``inside``,
        last channels of the routes from those hosts into ``i``); ``inside`` holds ``i``.

        Where every host hangs off one link, every route leaves ``i`` on that link and
        enters it on the reverse channel, so this is O(1) a host, not O(hosts)."""
        if self._n - len(set(inside) | {i}) <= 0:
            return set(), set()
        tables = self._stub_tables()
        if tables is not None:
            up = int(tables[2][i])
            return {up}, {up ^ 1}
        first: set[int] = set()
        last: set[int] = set()
        skip = set(inside) | {i}
        for x in range(self._n):
            if x in skip:
                continue
            there, back = self.route(i, x), self.route(x, i)
            if there:
                first.add(there[0])
            if back:
                last.add(back[-1])
        return first, last

    def around(self, i: int, inside: Sequence[int]) -> tuple[np.ndarray, np.ndarray,
                                                           np.ndarray, np.ndarray]:
        """The routes between host ``i`` and every host not in ``inside`` (which holds
        ``i``), both ways: (out channels, out latencies, in channels, in latencies), the
        channels as (hosts, hops) arrays padded with -1, the latencies as ``pair`` sums
        them. Vectorised (``bulk``) where every host hangs off one link."""
        others = self._outside(set(inside) | {i})
        if len(others) == 0:
            empty = np.zeros((0, 1), dtype=np.int64)
            return empty, np.zeros(0), empty, np.zeros(0)
        if self._stub_tables() is not None:
            src = np.full(len(others), i, dtype=np.int64)
            out_ch, out_lat = self.bulk(src, others)  # type: ignore[misc]
            in_ch, in_lat = self.bulk(others, src)  # type: ignore[misc]
            return out_ch, out_lat, in_ch, in_lat
        parts = []
        for pairs in ([self.pair(i, int(x)) for x in others],
                      [self.pair(int(x), i) for x in others]):
            width = max(1, max(len(p[0]) for p in pairs))
            ch = np.full((len(pairs), width), -1, dtype=np.int64)
            for k, p in enumerate(pairs):
                ch[k, :len(p[0])] = p[0]
            parts.append((ch, np.array([p[1] for p in pairs])))
        (oc, ol), (ic, il) = parts
        return oc, ol, ic, il

    def route(self, i: int, j: int) -> tuple[int, ...]:
        if self._table is not None:
            return self._table[i][j]
        return self.pair(i, j)[0]

    def latency(self, i: int, j: int) -> float:
        if self._lat_rows is not None:
            return self._lat_rows[i][j]
        return self.pair(i, j)[1]

    def views(self) -> tuple[Any, Any]:
        """(routes, latencies), each indexed ``[i][j]``: the all-pairs tuples up to
        ``EAGER_HOSTS`` hosts (or once built), else views that find each pair on demand."""
        if self._table is not None or self._n <= EAGER_HOSTS:
            return self.table(), self.latency_rows()
        return _Rows(self, 0), _Rows(self, 1)

    def _materialise(self) -> None:
        n = self._n
        rows, lats = [], []
        for i in range(n):
            pairs = [self.pair(i, j) for j in range(n)]
            rows.append(tuple(p[0] for p in pairs))
            lats.append(tuple(p[1] for p in pairs))
        self._table, self._lat_rows = tuple(rows), tuple(lats)
        self._pairs.clear()

    def table(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Every route: ``table()[i][j]`` (O(hosts^2), computed once)."""
        if self._table is None:
            self._materialise()
        assert self._table is not None
        return self._table

    def latency_rows(self) -> tuple[tuple[float, ...], ...]:
        """Every route's latency as nested tuples (computed once)."""
        if self._lat_rows is None:
            self._materialise()
        assert self._lat_rows is not None
        return self._lat_rows

    def latency_matrix(self) -> np.ndarray:
        """Every route's latency as a (hosts, hosts) array (computed once)."""
        if self._lat_matrix is None:
            self._lat_matrix = np.array(self.latency_rows(), dtype=float).reshape(self._n, self._n)
        return self._lat_matrix


def reference_routes(names: Sequence[str], links: Sequence, graph: nx.Graph,
                     ) -> tuple[list[list[tuple[int, ...]]], np.ndarray]:
    """The straightforward method, for tests: a ``networkx`` Dijkstra search from every
    host; (routes[i][j], latency[i, j])."""
    n = len(names)
    routes: list[list[tuple[int, ...]]] = [[()] * n for _ in range(n)]
    latency = np.zeros((n, n))
    for i, src in enumerate(names):
        paths = nx.single_source_dijkstra_path(graph, src, weight="weight")
        for j, dst in enumerate(names):
            if i == j:
                continue
            path = paths[dst]
            chans = []
            for u, v in zip(path, path[1:]):
                e = graph.edges[u, v]["index"]
                chans.append(2 * e if links[e].a == u else 2 * e + 1)
                latency[i, j] += links[e].latency_s
            routes[i][j] = tuple(chans)
    return routes, latency
