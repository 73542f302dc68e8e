"""Scenarios (``configs/scenarios/*.yaml``) and the timeline of network states they yield.

A scenario names a cluster (inline or a file), a model and training spec, and what
happens to the network over time: per-link bandwidth processes (Markov congestion,
diurnal cycles, a replayed trace) and events (degradation, a link or a host lost and
regained). ``build_timeline`` turns it, with a seeded generator, into piecewise-constant
*network states*: a start time, the cluster in force (a new ``Cluster`` built from a
document without the lost hosts and links, so routes are recomputed) and its per-link
bandwidth vector. Format in docs/dynamics.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from hetpar.cluster.bandwidth import Markov, parse_bandwidth_model
from hetpar.cluster.topology import Cluster, load_cluster, parse_cluster
from hetpar import limits
from hetpar.configio import Reader, bundled_dir, load_document
from hetpar.dynamics.processes import (
    Degrade,
    DiurnalProcess,
    Event,
    HostDown,
    LinkDown,
    MarkovProcess,
    Process,
    StepProcess,
    step_value,
)
from hetpar.dynamics.traces import LinkTrace, find_link, link_name, load_link_trace
from hetpar.errors import ConfigError

__all__ = [
    "LinkProcess",
    "Migration",
    "NetworkState",
    "Scenario",
    "Timeline",
    "build_timeline",
    "cluster_without",
    "failure_times",
    "known_at",
    "list_scenarios",
    "load_scenario",
    "parse_scenario",
    "scenario_from_trace",
]


@dataclass(frozen=True)
class Migration:
    """What switching plans and surviving failures cost (``hetpar.dynamics.migration``).

    A switch moves, over the network of the state it happens in, the model state that
    changes owner between the two plans (weights and optimizer state; gradients are
    rebuilt by the next iteration), then restarts the job (``restart_s``: process start,
    NCCL set-up). Checkpoints of ``bytes_per_param`` bytes per parameter (bf16 weights,
    fp32 master copy and Adam's two moments: 14) are written every
    ``checkpoint_interval_s`` seconds of the run, each stalling it ``checkpoint_s``
    (None: the checkpoint's bytes over ``storage_GBps``). A plan that loses a host loses
    the iterations since the last checkpoint and reloads it from storage."""

    storage_GBps: float = 2.0
    restart_s: float = 30.0
    bytes_per_param: float = 14.0
    checkpoint_interval_s: float = 3600.0
    checkpoint_s: float | None = None

    def checkpoint_bytes(self, params: float) -> float:
        return params * self.bytes_per_param

    def reload_s(self, params: float) -> float:
        """Reading the last checkpoint back after a failure, plus the restart."""
        return self.checkpoint_bytes(params) / (self.storage_GBps * 1e9) + self.restart_s

    def write_s(self, params: float) -> float:
        """The stall of writing one checkpoint."""
        if self.checkpoint_s is not None:
            return self.checkpoint_s
        return self.checkpoint_bytes(params) / (self.storage_GBps * 1e9)


@dataclass(frozen=True)
class LinkProcess:
    """A bandwidth process applied to ``links``; ``shared``: one path for all of them
    (e.g. one congestion state of a shared fabric), else one independent path each."""

    links: tuple[str, ...]
    process: Process
    shared: bool = False


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    source: str
    cluster: Cluster
    model: str
    training: str | None
    iterations: int
    horizon_s: float
    step_s: float
    processes: tuple[LinkProcess, ...] = ()
    events: tuple[Event, ...] = ()
    trace: LinkTrace | None = None
    migration: Migration = field(default_factory=Migration)
    lookahead_s: float = 600.0
    exact_time_limit_s: float = 5.0
    volatile: bool = True
    # Not used to tune the re-planners' settings (docs/results-dynamic.md): their results
    # are the held-out part of the suite.
    held_out: bool = False


@dataclass(frozen=True, eq=False)
class NetworkState:
    """One piecewise-constant segment of the timeline."""

    index: int
    start_s: float
    end_s: float  # math.inf for the last state
    cluster: Cluster | None  # None when no host is left
    bandwidth: np.ndarray  # Gb/s per link of ``cluster`` (its order)
    base_bandwidth: np.ndarray  # Gb/s per link of the scenario's cluster (nan: removed)
    topology: str  # "" for the full cluster, else what is missing
    lost_hosts: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, bytes]:
        """Identifies the state for caching plans (topology and bandwidth)."""
        return self.topology, np.round(self.bandwidth, 6).tobytes()


@dataclass(frozen=True, eq=False)
class Timeline:
    base: Cluster
    link_names: tuple[str, ...]
    states: tuple[NetworkState, ...]

    def at(self, t: float) -> NetworkState:
        starts = [s.start_s for s in self.states]
        return self.states[max(0, int(np.searchsorted(starts, t, side="right")) - 1)]

    @property
    def changes(self) -> int:
        return len(self.states) - 1


# ---- cluster surgery ---------------------------------------------------------------------

def cluster_without(base: Cluster, hosts: Sequence[str] = (), links: Sequence[str] = (),
                    ) -> tuple[Cluster | None, tuple[str, ...]]:
    """The cluster without ``hosts`` and ``links`` (names ``a--b``), rebuilt from a
    cluster document so that routes are recomputed. Hosts cut off from the part of the
    network holding the most GPUs are lost too. Returns (cluster or None when no host is
    left, every lost host)."""
    drop_hosts = set(hosts)
    drop_links = {i for i in (find_link(base, n) for n in links) if i is not None}
    g = nx.Graph()
    g.add_nodes_from(h.name for h in base.hosts if h.name not in drop_hosts)
    g.add_nodes_from(base.switches)
    for i, lk in enumerate(base.links):
        if i in drop_links or lk.a in drop_hosts or lk.b in drop_hosts:
            continue
        g.add_edge(lk.a, lk.b)
    alive = [h for h in base.hosts if h.name not in drop_hosts]
    if alive:
        comps = list(nx.connected_components(g))
        gpus = [sum(h.num_gpus for h in alive if h.name in c) for c in comps]
        keep = comps[int(np.argmax(gpus))]
        alive = [h for h in alive if h.name in keep]
    lost = tuple(h.name for h in base.hosts if h not in alive)
    if not alive:
        return None, lost
    names = {h.name for h in alive}
    uplink = {}
    for lk in base.links:
        for end, other in ((lk.a, lk.b), (lk.b, lk.a)):
            if end in names:
                uplink[end] = (lk, other)
    doc_hosts = []
    for h in alive:
        lk, _ = uplink[h.name]
        doc_hosts.append({"name": h.name, "gpu": h.gpu.name, "gpus": h.num_gpus,
                          "intra": {"kind": h.intra_kind, "GBps": h.intra_GBps,
                                    "latency_us": h.intra_latency_s * 1e6},
                          "nic_gbps": h.nic_gbps, "switch": h.switch,
                          "uplink": {"latency_us": lk.latency_s * 1e6}})
    host_names = {h.name for h in base.hosts}
    doc_links = []
    for i, lk in enumerate(base.links):
        if i in drop_links or lk.a in host_names or lk.b in host_names:
            continue
        doc_links.append({"a": lk.a, "b": lk.b, "capacity_gbps": lk.capacity_gbps,
                          "latency_us": lk.latency_s * 1e6})
    # Switches no longer joined to a kept host are dropped with their links.
    used = set(nx.node_connected_component(g, alive[0].name))
    doc = {"name": base.name + ("" if not lost and not drop_links else "-degraded"),
           "description": base.description,
           "switches": [s for s in base.switches if s in used],
           "hosts": doc_hosts,
           "links": [d for d in doc_links if d["a"] in used and d["b"] in used]}
    try:
        return parse_cluster(doc, base.source or "<cluster>"), lost
    except ConfigError as exc:  # pragma: no cover - a catalog missing a GPU type
        raise ConfigError(base.source, "", f"cannot rebuild the cluster without "
                                           f"{sorted(drop_hosts)} {sorted(links)}: {exc}") from None


# ---- timeline ----------------------------------------------------------------------------

def build_timeline(scenario: Scenario, rng: np.random.Generator, *,
                   topology_events: bool = True) -> Timeline:
    """Draw the scenario's network states over its horizon with ``rng``."""
    base = scenario.cluster
    names = tuple(link_name(lk) for lk in base.links)
    n = len(names)
    horizon, step = scenario.horizon_s, scenario.step_s
    ceilings: list[list[tuple[np.ndarray, np.ndarray]]] = [
        [(np.array([0.0]), np.array([lk.capacity_gbps]))] for lk in base.links]
    factors: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n)]
    points: set[float] = {0.0}

    def index(name: str) -> int:
        i = find_link(base, name)
        if i is None:  # checked at parse time
            raise ConfigError(scenario.source, "links", f"unknown link {name!r}")
        return i

    for lp in scenario.processes:
        shared = lp.process.path(rng, horizon, step) if lp.shared else None
        for name in lp.links:
            path = shared if shared is not None else lp.process.path(rng, horizon, step)
            ceilings[index(name)].append(path)
            points.update(path[0].tolist())
    if scenario.trace is not None:
        for name in scenario.trace.values:
            path = scenario.trace.step_function(name)
            ceilings[index(name)].append(path)
            points.update(path[0].tolist())
    downs: list[HostDown | LinkDown] = []
    for ev in scenario.events:
        if isinstance(ev, Degrade):
            path = ev.factor_path()
            for name in ev.links:
                factors[index(name)].append(path)
            points.update(path[0].tolist())
        elif topology_events:
            downs.append(ev)
            points.add(ev.at_s)
            if math.isfinite(ev.until_s):
                points.add(ev.until_s)
    times = np.array(sorted(p for p in points if p < horizon or p == 0.0))
    bw = np.empty((len(times), n))
    for i in range(n):
        col = np.min([step_value(t, v, times) for t, v in ceilings[i]], axis=0)
        for t, v in factors[i]:
            col = col * step_value(t, v, times)
        bw[:, i] = col
    clusters: dict[tuple, tuple[Cluster | None, tuple[str, ...]]] = {}
    states: list[NetworkState] = []
    prev: tuple | None = None
    for k, t in enumerate(times):
        hosts = tuple(sorted(e.host for e in downs if isinstance(e, HostDown)
                             and e.at_s <= t < e.until_s))
        links = tuple(sorted(e.link for e in downs if isinstance(e, LinkDown)
                             and e.at_s <= t < e.until_s))
        topo = (hosts, links)
        row = bw[k]
        if prev is not None and prev[0] == topo and np.array_equal(prev[1], row):
            continue
        prev = (topo, row)
        if topo not in clusters:
            clusters[topo] = cluster_without(base, hosts, links) if hosts or links else (base, ())
        cl, lost = clusters[topo]
        base_row = row.copy()
        if cl is None:
            vec = np.zeros(0)
            base_row[:] = np.nan
        else:
            present = {link_name(lk) for lk in cl.links}
            for i, name in enumerate(names):
                if name not in present:
                    base_row[i] = np.nan
            vec = np.array([row[names.index(link_name(lk))] for lk in cl.links])
        label = ", ".join([f"-{h}" for h in lost] + [f"-{lk}" for lk in links])
        if states:
            states[-1] = _with_end(states[-1], float(t))
        states.append(NetworkState(len(states), float(t), math.inf, cl, vec, base_row, label,
                                   lost))
    return Timeline(base, names, tuple(states))


def failure_times(scenario: Scenario) -> tuple[float, ...]:
    """When a host or a link goes down after the start, within the horizon (sorted,
    distinct): the moments a strategy learns of a failure."""
    return tuple(sorted({ev.at_s for ev in scenario.events
                         if isinstance(ev, (HostDown, LinkDown))
                         and 0.0 < ev.at_s < scenario.horizon_s}))


def known_at(scenario: Scenario, t: float) -> Scenario:
    """The scenario as it is known at ``t``: the failures (host or link down) that start
    after ``t`` removed, the rest (bandwidth processes, traces, degradations, the failures
    already under way and when they end) kept. Built with the same seed, its timeline is
    the run's up to the next failure."""
    return replace(scenario, events=tuple(
        ev for ev in scenario.events
        if not isinstance(ev, (HostDown, LinkDown)) or ev.at_s <= t))


def _with_end(s: NetworkState, end: float) -> NetworkState:
    return NetworkState(s.index, s.start_s, end, s.cluster, s.bandwidth, s.base_bandwidth,
                        s.topology, s.lost_hosts)


# ---- parsing -----------------------------------------------------------------------------

_TOP = frozenset({"name", "description", "cluster", "model", "training", "iterations",
                  "horizon_s", "step_s", "processes", "events", "trace", "migration",
                  "lookahead_s", "exact_time_limit_s", "volatile", "held_out"})


def _links(r: Reader, key: str, cluster: Cluster) -> tuple[str, ...]:
    raw = r.raw(key)
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise r.error(key, "expected a link name 'a--b' or a list of them")
    out = []
    for name in items:
        i = find_link(cluster, str(name)) if isinstance(name, str) else None
        if i is None:
            known = ", ".join(link_name(lk) for lk in cluster.links)
            raise r.error(key, f"{name!r} names no link of cluster {cluster.name} "
                               f"(links: {known})")
        out.append(link_name(cluster.links[i]))
    return tuple(out)


def _parse_process(r: Reader, cluster: Cluster, base_dir: Path) -> LinkProcess:
    kind = r.choice("kind", ("markov", "diurnal", "constant"))
    links = _links(r, "links", cluster)
    cap = min(cluster.links[find_link(cluster, n)].capacity_gbps  # type: ignore[index]
              for n in links)
    shared = r.bool("shared", False)
    if kind == "markov":
        r.check_keys(frozenset({"kind", "links", "shared", "states"}))
        sub = Reader.of({"kind": "markov", "states": r.raw("states")}, r.source, r.path)
        chain = parse_bandwidth_model(sub, cap, base_dir)
        assert isinstance(chain, Markov)
        return LinkProcess(links, MarkovProcess(chain), shared)
    if kind == "diurnal":
        r.check_keys(frozenset({"kind", "links", "shared", "busy_gbps", "quiet_gbps",
                                "period_s", "busiest_s", "quantum_gbps", "random_phase"}))
        busy = r.number("busy_gbps", positive=True, maximum=cap)
        quiet = r.number("quiet_gbps", positive=True, maximum=cap)
        return LinkProcess(links, DiurnalProcess(
            busy, quiet, r.number("period_s", 86400.0, positive=True),
            r.number("busiest_s", 0.0, nonnegative=True),
            r.number("quantum_gbps", 0.0, nonnegative=True), r.bool("random_phase", False)),
            shared)
    r.check_keys(frozenset({"kind", "links", "shared", "gbps"}))
    return LinkProcess(links, StepProcess((0.0,), (r.number("gbps", positive=True,
                                                            maximum=cap),)), shared)


def _parse_event(r: Reader, cluster: Cluster) -> Event:
    kind = r.choice("kind", ("degrade", "link_down", "host_down"))
    at = r.number("at_s", nonnegative=True)
    until = r.number("until_s", math.inf, positive=True)
    if until <= at:
        raise r.error("until_s", f"must be after at_s ({at:g}), got {until:g}")
    if kind == "degrade":
        r.check_keys(frozenset({"kind", "links", "at_s", "until_s", "factor", "ramp_s",
                                "ramp_steps"}))
        return Degrade(_links(r, "links", cluster), at,
                       r.number("factor", positive=True, maximum=1.0), until,
                       r.number("ramp_s", 0.0, nonnegative=True),
                       r.int("ramp_steps", 1, minimum=1, maximum=limits.MAX_TIMELINE_STEPS))
    if kind == "link_down":
        r.check_keys(frozenset({"kind", "link", "at_s", "until_s"}))
        return LinkDown(_links(r, "link", cluster)[0], at, until)
    r.check_keys(frozenset({"kind", "host", "at_s", "until_s"}))
    host = r.str("host")
    if host not in cluster.host_index:
        raise r.error("host", f"unknown host {host!r} (hosts: "
                              f"{', '.join(h.name for h in cluster.hosts)})")
    return HostDown(host, at, until)


def parse_scenario(data: Any, source: str = "<dict>", base_dir: Path | None = None, *,
                   cluster: Cluster | None = None) -> Scenario:
    """Build a scenario from its document; ``cluster`` overrides the one it names."""
    base_dir = base_dir or Path(".")
    r = Reader.of(data, source)
    r.check_keys(_TOP)
    if cluster is None:
        raw = r.raw("cluster")
        if isinstance(raw, dict):
            cluster = parse_cluster(raw, f"{source}: cluster", base_dir)
        elif isinstance(raw, str):
            path = base_dir / raw
            cluster = load_cluster(path if path.exists() else raw)
        else:
            raise r.error("cluster", "expected a cluster mapping, a file or a bundled name")
    trace = None
    if r.has("trace"):
        trace = load_link_trace(base_dir / r.str("trace"), cluster)
    mig = r.sub("migration", {})
    mig.check_keys(frozenset({"storage_GBps", "restart_s", "bytes_per_param",
                              "checkpoint_interval_s", "checkpoint_s"}))
    horizon = r.number("horizon_s", 86400.0, positive=True)
    step = r.number("step_s", 60.0, positive=True)
    if horizon / step > limits.MAX_TIMELINE_STEPS:
        raise r.error("step_s", f"horizon_s / step_s = {horizon / step:,.0f} steps, more than "
                                f"the {limits.MAX_TIMELINE_STEPS:,} a timeline may have")
    processes = tuple(_parse_process(p, cluster, base_dir) for p in r.sub_list("processes", []))
    for i, lp in enumerate(processes):
        if isinstance(lp.process, MarkovProcess):
            out_rate = max(sum(row) for row in lp.process.chain.rates)
            if out_rate * horizon > limits.MAX_MARKOV_EVENTS:
                raise ConfigError(source, f"processes[{i}].states",
                                  f"rates up to {out_rate:g}/s over horizon_s {horizon:g} make "
                                  f"~{out_rate * horizon:,.0f} state changes, more than the "
                                  f"{limits.MAX_MARKOV_EVENTS:,} a path may have")
    return Scenario(
        name=r.str("name", Path(source).stem), description=r.str("description", ""),
        source=source, cluster=cluster, model=r.str("model"),
        training=r.str("training", None),
        iterations=r.int("iterations", 1000, minimum=1, maximum=limits.MAX_ITERATIONS),
        horizon_s=horizon,
        step_s=step,
        processes=processes,
        events=tuple(_parse_event(e, cluster) for e in r.sub_list("events", [])),
        trace=trace,
        migration=Migration(mig.number("storage_GBps", 2.0, positive=True),
                            mig.number("restart_s", 30.0, nonnegative=True),
                            mig.number("bytes_per_param", 14.0, positive=True),
                            mig.number("checkpoint_interval_s", 3600.0, positive=True),
                            mig.number("checkpoint_s", None, nonnegative=True)),
        lookahead_s=r.number("lookahead_s", 600.0, positive=True),
        exact_time_limit_s=r.number("exact_time_limit_s", 5.0, positive=True,
                                    maximum=limits.MAX_TIME_LIMIT_S),
        volatile=r.bool("volatile", True), held_out=r.bool("held_out", False))


def list_scenarios() -> list[str]:
    return sorted(p.stem for p in (bundled_dir() / "scenarios").glob("*.yaml"))


def load_scenario(path_or_name: str | Path, *, cluster: Cluster | None = None) -> Scenario:
    """A scenario file, or a bundled scenario by name (``hetpar replan --scenario NAME``)."""
    path = Path(path_or_name)
    if not path.exists():
        cand = bundled_dir() / "scenarios" / f"{path_or_name}.yaml"
        if not cand.exists():
            raise ConfigError(str(path_or_name), "", f"no such scenario file or bundled "
                                                     f"scenario (bundled: "
                                                     f"{', '.join(list_scenarios())})")
        path = cand
    return parse_scenario(load_document(path), str(path), path.parent, cluster=cluster)


def scenario_from_trace(trace_path: str | Path, cluster: Cluster, model: str,
                        training: str | None, iterations: int, **settings: Any) -> Scenario:
    """A scenario that replays a per-link trace on ``cluster`` (``hetpar replan --trace``)."""
    trace = load_link_trace(trace_path, cluster)
    last = trace.times[-1]
    return Scenario(name=Path(trace_path).stem, description=f"replay of {trace_path}",
                    source=str(trace_path), cluster=cluster, model=model, training=training,
                    iterations=iterations, horizon_s=max(last + 1.0, 1.0), step_s=60.0,
                    trace=trace, **settings)
