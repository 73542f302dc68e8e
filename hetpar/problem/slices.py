"""Replica slices: a cluster too large to plan host by host, planned as one slice.

Large jobs are run as many copies of one layout: Megatron's 16,384-GPU Llama 3 run is one
pipeline of 16 stages of TP 8, replicated 128 times by data parallelism. ``slice_problem``
turns a cluster of hundreds or thousands of hosts into the cluster of one such copy:

- hosts are sorted into classes (GPU type and count, scale-up fabric, NIC and *zone*: the
  part of the network joined by links at least as fast as the NICs on them, so a site
  behind a WAN link is a zone of its own and so is a whole leaf-spine fabric); where
  those classes admit no width, hosts of one GPU type and count per zone, NICs mixed;
- for a width ``g`` that divides the global batch, each class of ``n`` hosts gives
  ``n // g`` *slice hosts*, each standing for ``g`` of its hosts (the remainder stays
  idle); the width is the one that leaves the fewest hosts idle with at most
  ``max_hosts`` slice hosts;
- the slice's network is one switch per zone with the slice hosts on it, each uplink at
  its hosts' fair share of their path to the zone's core (an oversubscribed leaf's
  uplinks divided among its hosts) and each link between zones at 1/g of its capacity
  (the g copies share it); the slice trains on 1/g of the global batch.

A plan of the slice's problem becomes a plan of the whole cluster by ``Slicing.expand``:
every replica on a slice host becomes the same replica on each of the ``g`` hosts it
stands for, so every stage keeps its layers, TP degree and micro-batch size and its data
parallelism grows g-fold. Each GPU then holds and computes what it did in the slice (less
with ZeRO, whose shards spread over more replicas), so a slice plan that fits in memory
expands into one that fits. The expanded plan is scored by the whole cluster's cost model,
links and contention included; the slice's network is only what its planner sees.
The slice's own score leaves out the gradient all-reduce between its copies (a stage on
one slice host has none in the slice), so it is optimistic, most for large models: the
kept plan's score on the whole cluster is the one reported.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import networkx as nx

from hetpar.cluster.bandwidth import Constant
from hetpar.cluster.topology import Cluster, Host, Link
from hetpar.errors import ConfigError
from hetpar.plan import Plan, Replica, Stage
from hetpar.problem.problem import Problem

__all__ = ["Slicing", "slice_problem", "slice_widths", "zones"]


def zones(cluster: Cluster) -> dict[str, int]:
    """Zone of each switch: the components of the switches joined by links whose mean
    bandwidth is at least the fastest NIC on either end (a leaf's uplink to its spine
    is; a WAN link between sites is not)."""
    nic: dict[str, float] = defaultdict(float)
    for h in cluster.hosts:
        nic[h.switch] = max(nic[h.switch], h.nic_gbps)
    switches = set(cluster.switches)
    graph = nx.Graph()
    graph.add_nodes_from(cluster.switches)
    for link in cluster.links:
        if (link.a in switches and link.b in switches
                and link.bandwidth.mean() >= max(nic[link.a], nic[link.b])):
            graph.add_edge(link.a, link.b)
    comps = sorted((sorted(c) for c in nx.connected_components(graph)),
                   key=lambda c: cluster.switches.index(c[0]))
    return {s: k for k, comp in enumerate(comps) for s in comp}


def slice_widths(counts: list[int], global_batch: int, max_hosts: int) -> list[int]:
    """Widths ``g`` (hosts per slice host) that divide ``global_batch`` and give between
    one and ``max_hosts`` slice hosts from classes of ``counts`` hosts, the fewest idle
    hosts first (then the narrower)."""
    ranked = []
    for g in range(1, max(counts, default=0) + 1):
        m = sum(c // g for c in counts)
        if global_batch % g == 0 and 0 < m <= max_hosts:
            ranked.append((-g * m, g))
    return [g for _, g in sorted(ranked)]


@dataclass(frozen=True)
class Slicing:
    """One slice of ``full``: ``problem`` is the slice's (its cluster's hosts named after
    the first host each stands for), ``width`` the hosts each slice host stands for,
    ``members[name]`` those hosts' names (``name`` first) and ``idle`` the hosts left
    out."""

    full: Problem
    problem: Problem
    width: int
    members: dict[str, tuple[str, ...]]
    idle: tuple[str, ...]

    def expand(self, plan: Plan) -> Plan:
        """``plan`` (on the slice's cluster) on the whole cluster: each replica on each host
        the slice host stands for."""
        stages = []
        for stage in plan.stages:
            by_host: dict[str, list[Replica]] = defaultdict(list)
            for rep in stage.replicas:
                by_host[rep.host].append(rep)
            replicas = [Replica(member, rep.gpus) for host, reps in by_host.items()
                        for member in self.members[host] for rep in reps]
            stages.append(Stage(stage.layers, stage.tp, tuple(replicas)))
        return replace(plan, stages=tuple(stages))

    def expand_in_order(self, plan: Plan, order: Sequence[Sequence[object]]) -> Plan:
        """``expand`` for a plan whose stages lie along an order of the slice's hosts
        (``order[i]``: stage i's hosts in that order, as ``runtime.rules.host_runs`` gives
        them). Each stage takes ``width`` times its blocks on a slice host from that host's
        members one after another, continuing where the stage before stopped, so the
        expanded stages lie along an order of the cluster's hosts (a framework's rank
        order) with the same degrees: ``expand`` instead puts every stage sharing a slice
        host on all ``width`` hosts it stands for, which no rank order can lay out."""
        cluster = self.full.cluster
        used: dict[str, int] = defaultdict(int)  # GPUs taken on each member, in order
        at: dict[str, int] = defaultdict(int)  # the member each slice host is filling
        stages = []
        for stage, hosts in zip(plan.stages, order):
            blocks: dict[str, int] = defaultdict(int)
            for rep in stage.replicas:
                blocks[rep.host] += 1
            replicas: list[Replica] = []
            for host in map(str, hosts):
                need, members = blocks[host] * self.width, self.members[host]
                while need:
                    member = members[at[host]]
                    if used[member] + stage.tp > cluster.host(member).num_gpus:
                        at[host] += 1
                        continue
                    replicas.append(Replica(member, tuple(range(used[member],
                                                                used[member] + stage.tp))))
                    used[member] += stage.tp
                    need -= 1
            stages.append(Stage(stage.layers, stage.tp, tuple(replicas)))
        return replace(plan, stages=tuple(stages))

    def describe(self) -> dict[str, object]:
        return {"width": self.width, "slice_hosts": len(self.members),
                "hosts": len(self.full.cluster.hosts), "idle_hosts": len(self.idle),
                "global_batch": self.problem.training.global_batch}


def _uplinks(cluster: Cluster) -> dict[str, Link]:
    hosts = set(cluster.host_index)
    return {link.a if link.a in hosts else link.b: link for link in cluster.links
            if link.a in hosts or link.b in hosts}


def _fair_share(cluster: Cluster, zone: dict[str, int]) -> dict[str, float]:
    """Each switch's bandwidth per host toward the rest of its zone (inf for a switch
    alone in its zone): its links inside the zone, shared by the hosts on it."""
    on: dict[str, int] = defaultdict(int)
    for h in cluster.hosts:
        on[h.switch] += 1
    out: dict[str, float] = defaultdict(float)
    for link in cluster.links:
        if link.a in zone and link.b in zone and zone[link.a] == zone[link.b]:
            out[link.a] += link.bandwidth.mean()
            out[link.b] += link.bandwidth.mean()
    return {s: out[s] / on[s] if s in out and on[s] else math.inf for s in zone}


def _classes(cluster: Cluster, zone: dict[str, int], coarse: bool) -> dict[tuple, list[Host]]:
    """Hosts by zone, GPU type and count, and (unless ``coarse``) scale-up fabric and NIC,
    in the cluster's order."""
    out: dict[tuple, list[Host]] = {}
    for h in cluster.hosts:
        key = (zone[h.switch], h.gpu.name, h.num_gpus) if coarse else (
            zone[h.switch], h.gpu.name, h.num_gpus, h.intra_kind, h.intra_GBps,
            h.intra_latency_s, h.nic_gbps)
        out.setdefault(key, []).append(h)
    return out


def slice_problem(problem: Problem, max_hosts: int, width: int | None = None) -> Slicing:
    """The slice of ``problem`` with at most ``max_hosts`` slice hosts (see the module
    docstring), at ``width`` hosts per slice host if given, else the width that leaves the
    fewest hosts idle. ConfigError in one line when no width allows it."""
    cluster, batch = problem.cluster, problem.training.global_batch
    zone = zones(cluster)
    share = _fair_share(cluster, zone)
    uplink = _uplinks(cluster)
    # Alike hosts first; where those classes are too many or too small (hosts of one GPU
    # type with assorted NICs), hosts of one GPU type and count per zone.
    for coarse in (False, True):
        classes = _classes(cluster, zone, coarse)
        counts = [len(v) for v in classes.values()]
        widths = slice_widths(counts, batch, max_hosts)
        if width is not None:
            if width in widths:
                break
        elif widths:
            width = widths[0]
            break
    else:
        if width is not None:
            raise ConfigError(cluster.source or cluster.name, "width",
                              f"{width} hosts per slice host gives no slice of 1 to {max_hosts} "
                              f"hosts whose batch divides {batch}")
        need = next((g for g in range(1, max(counts) + 1)
                     if 0 < sum(c // g for c in counts) <= max_hosts), None)
        why = (f"each slice host must stand for {need} or more alike hosts, and no such "
               f"number divides the global batch {batch} (give a larger batch)"
               if need is not None else f"its {len(counts)} kinds of host are too many")
        raise ConfigError(cluster.source or cluster.name, "hosts",
                          f"{len(cluster.hosts):,} hosts cannot be cut into replica slices of "
                          f"at most {max_hosts} hosts: {why}")
    heads = [s for s in cluster.switches if s in zone]
    core = {k: next(s for s in heads if zone[s] == k) for k in set(zone.values())}
    hosts: list[Host] = []
    links: list[Link] = []
    members: dict[str, tuple[str, ...]] = {}
    idle: list[str] = []
    for (z, *_), group in classes.items():
        whole = len(group) // width * width
        idle += [h.name for h in group[whole:]]
        for start in range(0, whole, width):
            chunk = group[start:start + width]
            head = chunk[0]
            gbps = sum(min(uplink[h.name].bandwidth.mean(), share[h.switch])
                       for h in chunk) / width
            hosts.append(replace(head, switch=core[z]))
            links.append(Link(head.name, core[z], head.nic_gbps,
                              uplink[head.name].latency_s, Constant(gbps)))
            members[head.name] = tuple(h.name for h in chunk)
    between: dict[tuple[str, str], tuple[float, float]] = {}
    for link in cluster.links:
        if link.a in zone and link.b in zone and zone[link.a] != zone[link.b]:
            a, b = sorted((core[zone[link.a]], core[zone[link.b]]))
            gbps, lat = between.get((a, b), (0.0, math.inf))
            between[a, b] = (gbps + link.bandwidth.mean(), min(lat, link.latency_s))
    for (a, b), (gbps, lat) in between.items():
        links.append(Link(a, b, gbps / width, lat, Constant(gbps / width)))
    sliced = Cluster.of(f"{cluster.name}/slice{width}", hosts, sorted(core.values(),
                        key=cluster.switches.index), links, source=cluster.source,
                        description=f"one of {width} slices of {cluster.name}")
    training = replace(problem.training, global_batch=batch // width)
    sub = Problem.of(sliced, problem.model, training, objective=problem.objective,
                     samples=problem.samples, seed=problem.seed,
                     constants=problem.constants, name=f"{problem.name or cluster.name}/slice")
    return Slicing(problem, sub, width, members, tuple(idle))
