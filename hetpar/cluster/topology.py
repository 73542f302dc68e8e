"""Clusters: hosts of GPUs on a network graph of switches and links with fixed routes.

A cluster file (YAML) lists hosts and the network joining them. Each physical link is
full duplex: it becomes two directed *channels* whose loads are counted apart (a ring
all-reduce sends one way round), and both directions take the same bandwidth draw.
Routes between hosts are shortest paths by latency (``hetpar.cluster.routing``), found
pair by pair as they are first asked for and kept, so loading a cluster of thousands of
hosts costs time and memory linear in its size, and estimating a plan touches only the
pairs it uses.

A cluster holds at most ``hetpar.limits.MAX_HOSTS`` hosts, refused up front with one line
before any host is built: load time and memory grow linearly in hosts (0.2 s at 10,000,
``benchmarks/costmodel_speed.py --hosts``), and the cap keeps a mistyped count
(``count: 2**63``) from running for hours.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from hetpar import limits
from hetpar.cluster.bandwidth import BandwidthModel, parse_bandwidth_model
from hetpar.cluster.gpu import SCALEUP_KINDS, GpuCatalog, GpuType, load_gpu_catalog
from hetpar.cluster.routing import HOP_WEIGHT_S, Routes
from hetpar.configio import Reader, load_document, resolve_config
from hetpar.limits import MAX_GPUS_PER_HOST, MAX_STATE_VALUES
from hetpar.errors import ConfigError

__all__ = ["Host", "Link", "Cluster", "load_cluster", "parse_cluster"]


@dataclass(frozen=True)
class Host:
    """One server: ``num_gpus`` GPUs of one type, its scale-up fabric and its NIC."""

    name: str
    gpu: GpuType
    num_gpus: int
    intra_kind: str
    intra_GBps: float  # per GPU, per direction
    intra_latency_s: float
    nic_gbps: float
    switch: str


@dataclass(frozen=True)
class Link:
    """A full-duplex network link between two nodes (hosts or switches)."""

    a: str
    b: str
    capacity_gbps: float
    latency_s: float
    bandwidth: BandwidthModel


@dataclass(frozen=True, eq=False)
class Cluster:
    """Hosts and network with their routes.

    ``route(i, j)`` holds the directed channel indices on the path from host ``i`` to
    host ``j`` (channel ``2*l`` is link ``l`` from ``a`` to ``b``, ``2*l+1`` the reverse);
    ``route_latency_between(i, j)`` is that path's latency. Both are found on first use
    (``hetpar.cluster.routing``). ``routes[i][j]``, ``route_latency[i][j]`` and
    ``route_latency_s[i, j]`` give every pair at once, built on first use: O(hosts^2) time
    and memory, for callers that scan all pairs of a cluster of tens of hosts.
    """

    name: str
    hosts: tuple[Host, ...]
    switches: tuple[str, ...]
    links: tuple[Link, ...]
    source: str = ""
    description: str = ""
    host_index: Mapping[str, int] = field(default_factory=dict, repr=False)
    graph: nx.Graph = field(default_factory=nx.Graph, repr=False)
    router: Routes | None = field(default=None, repr=False)

    @classmethod
    def of(cls, name: str, hosts: Sequence[Host], switches: Sequence[str],
           links: Sequence[Link], *, source: str = "", description: str = "") -> Cluster:
        """A cluster of these hosts, switches and links (hosts' uplinks among them), with
        its graph and routes. ConfigError naming ``source`` when two links join the same
        nodes or a host is unreachable."""
        names = [h.name for h in hosts]
        all_links = tuple(links)
        graph = nx.Graph()
        graph.add_nodes_from(names, kind="host")
        graph.add_nodes_from(switches, kind="switch")
        for idx, link in enumerate(all_links):
            if graph.has_edge(link.a, link.b):
                raise ConfigError(source, "links", f"two links join {link.a!r} and {link.b!r}")
            # A small per-hop term makes equal-latency paths prefer fewer hops.
            graph.add_edge(link.a, link.b, index=idx, weight=link.latency_s + HOP_WEIGHT_S)
        component = nx.node_connected_component(graph, names[0])
        for i, h in enumerate(hosts):
            if h.name not in component:
                raise ConfigError(source, f"hosts[{i}]",
                                  f"host {h.name!r} is unreachable from host {names[0]!r}")
        return cls(name=name, hosts=tuple(hosts), switches=tuple(switches), links=all_links,
                   source=source, description=description,
                   host_index={n: i for i, n in enumerate(names)}, graph=graph,
                   router=Routes(names, all_links, graph))

    def _routes(self) -> Routes:
        if self.router is None:  # a Cluster built by hand, without parse_cluster
            object.__setattr__(self, "router", Routes([h.name for h in self.hosts],
                                                      self.links, self.graph))
        assert self.router is not None
        return self.router

    def route(self, i: int, j: int) -> tuple[int, ...]:
        """Directed channels of the route from host ``i`` to host ``j`` (``()`` if equal)."""
        return self._routes().route(i, j)

    def route_latency_between(self, i: int, j: int) -> float:
        """Latency (s) of the route from host ``i`` to host ``j``: its links' sum."""
        return self._routes().latency(i, j)

    def route_views(self) -> tuple[Any, Any]:
        """(routes, latencies) indexed ``[i][j]`` as ``routes`` and ``route_latency`` are,
        without building every pair of a large cluster (``Routes.views``)."""
        return self._routes().views()

    def route_bulk(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Routes ``src[p] -> dst[p]`` as arrays (``Routes.bulk``), or None where the
        network's structure does not allow it (ask ``route`` pair by pair)."""
        return self._routes().bulk(src, dst)

    def end_hops(self, i: int, inside: Sequence[int]) -> tuple[set[int], set[int]]:
        """(first channels out of host ``i``, last channels into it) over the routes
        between ``i`` and the hosts not in ``inside`` (``Routes.end_hops``)."""
        return self._routes().end_hops(i, inside)

    def routes_around(self, i: int, inside: Sequence[int],
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The routes between host ``i`` and the hosts not in ``inside``, both ways, as
        padded arrays (``Routes.around``)."""
        return self._routes().around(i, inside)

    @property
    def routes(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Every route, ``routes[i][j] == route(i, j)`` (all pairs: built once, O(hosts^2))."""
        return self._routes().table()

    @property
    def route_latency(self) -> tuple[tuple[float, ...], ...]:
        """Every route's latency as nested tuples (all pairs: built once, O(hosts^2))."""
        return self._routes().latency_rows()

    @property
    def route_latency_s(self) -> np.ndarray:
        """Every route's latency as a (hosts, hosts) array (all pairs: built once)."""
        return self._routes().latency_matrix()

    @property
    def num_gpus(self) -> int:
        return sum(h.num_gpus for h in self.hosts)

    @property
    def num_channels(self) -> int:
        return 2 * len(self.links)

    @property
    def gpu_types(self) -> tuple[GpuType, ...]:
        seen: dict[str, GpuType] = {}
        for h in self.hosts:
            seen.setdefault(h.gpu.name, h.gpu)
        return tuple(seen.values())

    def host(self, name: str) -> Host:
        return self.hosts[self.host_index[name]]

    def sample_link_bandwidth(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """``k`` bandwidth states: a (k, links) array in Gb/s."""
        out = np.empty((k, len(self.links)))
        for i, link in enumerate(self.links):
            out[:, i] = link.bandwidth.sample(rng, k)
        return out

    def bandwidth_states(self, samples: int, seed: int) -> np.ndarray:
        """The bandwidth states a plan is scored under: ``samples`` draws of every link
        from ``numpy.random.default_rng(seed)``, or each link's mean (one row) when
        ``samples`` is 0. The one recipe: every score of a plan with the same
        ``(samples, seed)`` sees the same states."""
        if samples < 0:
            raise ConfigError("", "samples", f"must not be negative, got {samples}")
        if samples * max(len(self.links), 1) > MAX_STATE_VALUES:
            raise ConfigError("", "samples", f"{samples:,} bandwidth states of {len(self.links):,} "
                                             f"links exceed the {MAX_STATE_VALUES:,} values a "
                                             "scoring may hold (hetpar.limits.MAX_STATE_VALUES)")
        if samples == 0:
            return self.mean_link_bandwidth()
        return self.sample_link_bandwidth(np.random.default_rng(seed), samples)

    def route_link_indices(self) -> np.ndarray:
        """(hosts, hosts, longest route) link indices of each host-to-host route, padded
        with ``len(links)`` (index a link table with a sentinel appended, e.g. infinite
        bandwidth), for vectorised minima over routes."""
        n, pad = len(self.hosts), len(self.links)
        longest = max((len(self.routes[i][j]) for i in range(n) for j in range(n)), default=1)
        out = np.full((n, n, max(longest, 1)), pad, dtype=np.intp)
        for i in range(n):
            for j in range(n):
                route = self.routes[i][j]
                out[i, j, :len(route)] = [ch // 2 for ch in route]
        return out

    def mean_link_bandwidth(self) -> np.ndarray:
        """Expected bandwidth of each link in Gb/s (one row: the 'typical' state)."""
        return np.array([[link.bandwidth.mean() for link in self.links]])

    def channel_bytes_per_s(self, link_gbps: np.ndarray) -> np.ndarray:
        """(k, links) Gb/s -> (k, channels) bytes/s; both directions share a draw."""
        return np.repeat(link_gbps, 2, axis=1) * (1e9 / 8)

    @property
    def topology_key(self) -> tuple:
        """Hosts, switches and links without the links' bandwidth processes: equal keys
        mean the same routes, GPUs and memory, so everything that does not depend on
        bandwidth (memory feasibility, flows' routes) holds for both clusters."""
        return (self.hosts, self.switches,
                tuple((lk.a, lk.b, lk.capacity_gbps, lk.latency_s) for lk in self.links))

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for h in self.hosts:
            kinds[h.gpu.name] = kinds.get(h.gpu.name, 0) + h.num_gpus
        mix = ", ".join(f"{n}x {k}" for k, n in kinds.items())
        return f"{self.name}: {len(self.hosts)} hosts, {self.num_gpus} GPUs ({mix})"


_HOST_KEYS = frozenset({"name", "count", "gpu", "gpus", "intra", "nic_gbps", "switch", "uplink"})
_LINK_KEYS = frozenset({"a", "b", "capacity_gbps", "latency_us", "bandwidth"})
_TOP_KEYS = frozenset({"name", "description", "gpu_catalogs", "hosts", "switches", "links",
                       "topology"})

# Default per-GPU latency of one scale-up hop: NVLink/xGMI vs a PCIe round trip.
_INTRA_LATENCY_US = {"nvswitch": 3.0, "nvlink": 3.0, "xgmi": 3.0, "pcie": 8.0}


def _parse_link(r: Reader, base_dir: Path) -> Link:
    r.check_keys(_LINK_KEYS)
    capacity = r.number("capacity_gbps", positive=True)
    latency = r.number("latency_us", 1.0, nonnegative=True) * 1e-6
    model = parse_bandwidth_model(r.sub("bandwidth", {}), capacity, base_dir)
    a, b = r.str("a"), r.str("b")
    if a == b:
        raise r.error("b", f"a link joins two different nodes, got {a!r} to itself")
    return Link(a, b, capacity, latency, model)


def _expand_hosts(root: Reader, catalog: GpuCatalog, base_dir: Path) -> tuple[list[Host], list[Link]]:
    hosts: list[Host] = []
    uplinks: list[Link] = []
    for r in root.sub_list("hosts"):
        r.check_keys(_HOST_KEYS)
        count = r.int("count", 1, minimum=1)
        if len(hosts) + count > limits.MAX_HOSTS:
            raise r.error("count", f"{len(hosts) + count:,} hosts in all exceed the limit of "
                                   f"{limits.MAX_HOSTS:,} hosts a cluster may hold")
        base = r.str("name")
        gpu = catalog.get(r.str("gpu"), source=r.source, where=r.field("gpu"))
        gpus = r.int("gpus", minimum=1, maximum=MAX_GPUS_PER_HOST, why=" GPUs per host")
        intra = r.sub("intra", {})
        intra.check_keys(frozenset({"kind", "GBps", "latency_us"}))
        kind = intra.choice("kind", SCALEUP_KINDS, gpu.scaleup_kind)
        # Overriding the fabric kind without a bandwidth: PCIe falls back to the GPU's PCIe.
        default_bw = gpu.scaleup_GBps if kind == gpu.scaleup_kind or kind != "pcie" else gpu.pcie_GBps
        intra_bw = intra.number("GBps", default_bw, positive=True)
        intra_lat = intra.number("latency_us", _INTRA_LATENCY_US[kind], nonnegative=True) * 1e-6
        nic = r.number("nic_gbps", positive=True)
        switch = r.str("switch", "")
        up = r.sub("uplink", {})
        up.check_keys(frozenset({"latency_us", "bandwidth"}))
        up_lat = up.number("latency_us", 2.0, nonnegative=True) * 1e-6
        for i in range(count):
            name = base if count == 1 else f"{base}-{i}"
            hosts.append(Host(name, gpu, gpus, kind, intra_bw, intra_lat, nic, switch))
            model = parse_bandwidth_model(up.sub("bandwidth", {}), nic, base_dir)
            uplinks.append(Link(name, switch, nic, up_lat, model))
    return hosts, uplinks


def _generate_fabric(r: Reader, hosts: list[Host], uplinks: list[Link], base_dir: Path,
                     ) -> tuple[list[str], list[Link]]:
    """Switches and switch links of a generated topology; fills in host switches."""
    kind = r.choice("kind", ("single_switch", "leaf_spine"))
    if kind == "single_switch":
        r.check_keys(frozenset({"kind", "name"}))
        sw = r.str("name", "switch")
        for i, h in enumerate(hosts):
            if not h.switch:
                hosts[i] = _with_switch(h, sw)
                uplinks[i] = _relink(uplinks[i], sw)
        return [sw], []
    r.check_keys(frozenset({"kind", "hosts_per_leaf", "spines", "uplink_gbps", "latency_us",
                            "bandwidth"}))
    per_leaf = r.int("hosts_per_leaf", minimum=1)
    spines = r.int("spines", minimum=1)
    latency = r.number("latency_us", 1.0, nonnegative=True) * 1e-6
    unplaced = [i for i, h in enumerate(hosts) if not h.switch]
    n_leaves = -(-len(unplaced) // per_leaf)
    leaves = [f"leaf{i}" for i in range(n_leaves)]
    for n, i in enumerate(unplaced):
        hosts[i] = _with_switch(hosts[i], leaves[n // per_leaf])
        uplinks[i] = _relink(uplinks[i], leaves[n // per_leaf])
    # ECMP spreads a leaf's many flows evenly over the spines, so the spine layer is one
    # logical switch and each leaf's uplinks one logical link of their summed capacity.
    links = []
    nic_sum: dict[str, float] = {}
    for h in hosts:
        nic_sum[h.switch] = nic_sum.get(h.switch, 0.0) + h.nic_gbps
    for leaf in leaves:
        if r.raw("uplink_gbps", "auto") == "auto":
            cap = max(nic_sum.get(leaf, 0.0), 1.0)  # non-blocking fat tree
        else:
            cap = spines * r.number("uplink_gbps", positive=True)
        model = parse_bandwidth_model(r.sub("bandwidth", {}), cap, base_dir)
        links.append(Link(leaf, "spine", cap, latency, model))
    return leaves + ["spine"], links


def _with_switch(h: Host, sw: str) -> Host:
    return Host(h.name, h.gpu, h.num_gpus, h.intra_kind, h.intra_GBps, h.intra_latency_s,
                h.nic_gbps, sw)


def _relink(link: Link, sw: str) -> Link:
    return Link(link.a, sw, link.capacity_gbps, link.latency_s, link.bandwidth)


def parse_cluster(data: Any, source: str = "<dict>", base_dir: Path | None = None,
                  gpu_catalogs: Iterable[str | Path] = ()) -> Cluster:
    """Build and validate a cluster from a parsed cluster document."""
    base_dir = base_dir or Path(".")
    root = Reader.of(data, source)
    root.check_keys(_TOP_KEYS)
    extra = [base_dir / str(p) for _, p, _ in root.items("gpu_catalogs", [])]
    catalog = load_gpu_catalog([*gpu_catalogs, *extra])
    hosts, uplinks = _expand_hosts(root, catalog, base_dir)
    if not hosts:
        raise root.error("hosts", "lists no hosts")
    switches: list[str] = []
    links: list[Link] = []
    if root.has("topology"):
        switches, links = _generate_fabric(root.sub("topology"), hosts, uplinks, base_dir)
    for _, item, where in root.items("switches", []):
        name = item.get("name") if isinstance(item, dict) else item
        if not isinstance(name, str) or not name:
            raise ConfigError(source, where, f"expected a switch name, got {item!r}")
        switches.append(name)
    for r in root.sub_list("links", []):
        links.append(_parse_link(r, base_dir))

    names = [h.name for h in hosts]
    uses = Counter(names)
    for i, h in enumerate(hosts):
        if uses[h.name] > 1:
            raise ConfigError(source, "hosts", f"host name {h.name!r} is used more than once")
        if not h.switch:
            raise ConfigError(source, "hosts", f"host {h.name!r} names no switch (give it "
                                               "'switch:' or add a 'topology:' section)")
    if len(set(switches)) != len(switches) or set(switches) & set(names):
        raise ConfigError(source, "switches", "switch names must be distinct from each other "
                                              "and from host names")
    nodes = set(names) | set(switches)
    for i, link in enumerate(links):
        for end in (link.a, link.b):
            if end not in nodes:
                raise ConfigError(source, f"links[{i}]", f"unknown node {end!r}")
    for h in hosts:
        if h.switch not in nodes:
            raise ConfigError(source, f"host {h.name}", f"switch {h.switch!r} is not declared")

    return Cluster.of(root.str("name", Path(source).stem), hosts, switches, uplinks + links,
                      source=source, description=root.str("description", ""))


def load_cluster(path_or_name: str | Path, gpu_catalogs: Iterable[str | Path] = ()) -> Cluster:
    """Load a cluster file, or a bundled cluster by name (``amp-het-16``)."""
    path = resolve_config(path_or_name, "clusters")
    return parse_cluster(load_document(path), str(path), path.parent, gpu_catalogs)
