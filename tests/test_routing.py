"""Routes found pair by pair (hetpar.cluster.routing) against the straightforward method, a
networkx Dijkstra search from every host: the same channels and the same latencies, bit
for bit, on every bundled cluster, on meshes with tied paths and on large generated
clusters; and the cost model's array path for large stages against its loop."""

from __future__ import annotations

import importlib
import time

import networkx as nx
import numpy as np
import pytest

import hetpar
from hetpar import limits
from hetpar.cluster import parse_cluster, routing
from hetpar.cluster.routing import reference_routes
from hetpar.configio import bundled_dir
from hetpar.errors import ConfigError
from hetpar.plan import Plan, Replica, Stage

estimate_mod = importlib.import_module("hetpar.costmodel.estimate")


def leaf_spine(hosts: int, per_leaf: int = 8, gpus: int = 8, **topology) -> dict:
    return {
        "name": f"ls-{hosts}",
        "hosts": [{"name": "a", "count": hosts - hosts // 3, "gpu": "A100-SXM4-80GB",
                   "gpus": gpus, "nic_gbps": 200},
                  {"name": "v", "count": hosts // 3, "gpu": "V100-SXM2-32GB", "gpus": gpus,
                   "nic_gbps": 100, "uplink": {"latency_us": 3.7,
                                               "bandwidth": {"kind": "lognormal",
                                                             "mean_gbps": 80, "cv": 0.3}}}],
        "topology": {"kind": "leaf_spine", "hosts_per_leaf": per_leaf, "spines": 4,
                     "uplink_gbps": 400, "latency_us": 1.3, **topology},
    }


def mesh(stubs_only: bool = False) -> dict:
    """Leaves joined to two spines and to each other: loops, and paths of equal latency
    (ties broken as networkx breaks them); hosts of mixed uplink latencies, a host with two
    links and two hosts joined directly."""
    hosts = []
    for leaf in range(4):
        hosts.append({"name": f"h{leaf}", "count": 3, "gpu": "A100-SXM4-40GB", "gpus": 4,
                      "nic_gbps": 100, "switch": f"leaf{leaf}"})
        hosts.append({"name": f"s{leaf}", "gpu": "A100-SXM4-40GB", "gpus": 4,
                      "nic_gbps": 100, "switch": f"leaf{leaf}", "uplink": {"latency_us": 0.7}})
    hosts.append({"name": "dual", "gpu": "T4-16GB", "gpus": 2, "nic_gbps": 50,
                  "switch": "leaf0"})
    hosts.append({"name": "pair", "gpu": "T4-16GB", "gpus": 2, "nic_gbps": 50,
                  "switch": "leaf3"})
    links = []
    for leaf in range(4):
        for spine in ("sp0", "sp1"):
            links.append({"a": f"leaf{leaf}", "b": spine, "capacity_gbps": 400,
                          "latency_us": 1.0})
    links += [{"a": "leaf0", "b": "leaf1", "capacity_gbps": 100, "latency_us": 2.0},
              {"a": "leaf2", "b": "leaf3", "capacity_gbps": 100, "latency_us": 2.5}]
    if not stubs_only:
        links += [{"a": "dual", "b": "leaf2", "capacity_gbps": 50, "latency_us": 2.0},
                  {"a": "pair", "b": "h1-0", "capacity_gbps": 50, "latency_us": 0.5}]
    return {"name": "mesh", "hosts": hosts,
            "switches": [f"leaf{i}" for i in range(4)] + ["sp0", "sp1"], "links": links}


def assert_same_as_reference(cluster: hetpar.Cluster) -> None:
    names = [h.name for h in cluster.hosts]
    routes, latency = reference_routes(names, cluster.links, cluster.graph)
    n = len(names)
    for i in range(n):
        for j in range(n):
            assert cluster.route(i, j) == routes[i][j], (names[i], names[j])
            got = cluster.route_latency_between(i, j)
            assert got == latency[i, j] and type(got) is float, (names[i], names[j])
    # The all-pairs views are the same figures.
    assert cluster.routes == tuple(tuple(r) for r in routes)
    assert np.array_equal(cluster.route_latency_s, latency)
    assert cluster.route_latency == tuple(tuple(r) for r in latency.tolist())


# mixed-2048's 4M pairs would take minutes; leaf-spine-96 below covers its generated fabric.
@pytest.mark.parametrize("name", sorted(p.stem for p in (bundled_dir() / "clusters").glob("*.yaml")
                                        if p.stem != "mixed-2048"))
def test_bundled_clusters_route_as_dijkstra_from_every_host(name):
    assert_same_as_reference(hetpar.load_cluster(name))


@pytest.mark.parametrize("doc", [leaf_spine(96), leaf_spine(40, per_leaf=3, uplink_gbps="auto"),
                                 mesh(), mesh(stubs_only=True)],
                         ids=["leaf-spine-96", "leaf-spine-40", "mesh", "mesh-stubs"])
def test_generated_and_meshed_clusters_route_as_dijkstra_from_every_host(doc):
    cluster = parse_cluster(doc)
    assert_same_as_reference(cluster)


def test_mesh_is_routed_by_the_search_and_tree_by_climbing():
    assert not parse_cluster(mesh()).router._tree
    assert parse_cluster(leaf_spine(40)).router._tree


def test_large_generated_cluster_routes_as_dijkstra():
    """2,048 hosts (16,384 GPUs): loads in well under a second, and the routes from a few
    hosts (each end of each host group, the middle) are networkx's, bit for bit."""
    t0 = time.perf_counter()
    cluster = parse_cluster(leaf_spine(2048, per_leaf=16))
    assert time.perf_counter() - t0 < 2.0
    assert cluster.num_gpus == 16384
    graph, links = cluster.graph, cluster.links
    names = [h.name for h in cluster.hosts]
    for i in (0, 1, 1023, 1365, 2047):
        paths = nx.single_source_dijkstra_path(graph, names[i], weight="weight")
        for j in range(0, 2048, 7):
            if j == i:
                continue
            path = paths[names[j]]
            chans, lat = [], 0.0
            for u, v in zip(path, path[1:]):
                e = graph.edges[u, v]["index"]
                chans.append(2 * e if links[e].a == u else 2 * e + 1)
                lat += links[e].latency_s
            assert cluster.route(i, j) == tuple(chans)
            assert cluster.route_latency_between(i, j) == lat


@pytest.mark.parametrize("doc", [leaf_spine(96), mesh(stubs_only=True)], ids=["tree", "mesh"])
def test_bulk_routes_match_pair_by_pair(doc):
    cluster = parse_cluster(doc)
    n = len(cluster.hosts)
    rng = np.random.default_rng(0)
    src = rng.integers(0, n, 500)
    dst = (src + rng.integers(1, n, 500)) % n
    chans, lat = cluster.route_bulk(src, dst)
    for p, (i, j) in enumerate(zip(src.tolist(), dst.tolist())):
        row = chans[p]
        assert tuple(int(c) for c in row if c >= 0) == cluster.route(i, j)
        assert lat[p] == cluster.route_latency_between(i, j)
    assert parse_cluster(mesh()).route_bulk(src[:3] % 10, dst[:3] % 10) is None  # 2-link hosts


@pytest.mark.parametrize("doc", [leaf_spine(40, per_leaf=3), mesh(stubs_only=True), mesh()],
                         ids=["tree", "mesh-stubs", "mesh"])
def test_per_host_route_summaries_match_every_pair(doc):
    """``end_hops`` and ``routes_around`` (what the exact search's bounds ask of a large
    cluster, without all pairs) agree with the routes pair by pair, bit for bit."""
    cluster = parse_cluster(doc)
    n = len(cluster.hosts)
    routes, lat = cluster.routes, cluster.route_latency
    rng = np.random.default_rng(1)
    for i in range(n):
        inside = {i} | set(rng.choice(n, size=int(rng.integers(0, 4)), replace=False).tolist())
        outside = [x for x in range(n) if x not in inside]
        first, last = cluster.end_hops(i, sorted(inside))
        assert first == {routes[i][x][0] for x in outside}
        assert last == {routes[x][i][-1] for x in outside}
        out_ch, out_lat, in_ch, in_lat = cluster.routes_around(i, sorted(inside))
        assert [tuple(int(c) for c in row if c >= 0) for row in out_ch] == \
            [routes[i][x] for x in outside]
        assert [tuple(int(c) for c in row if c >= 0) for row in in_ch] == \
            [routes[x][i] for x in outside]
        assert out_lat.tolist() == [lat[i][x] for x in outside]
        assert in_lat.tolist() == [lat[x][i] for x in outside]
    everyone = list(range(n))
    assert cluster.end_hops(0, everyone) == (set(), set())
    assert len(cluster.routes_around(0, everyone)[1]) == 0


def block_plan(cluster: hetpar.Cluster, stages: int, layers: int, micro: int) -> Plan:
    """One tp-8 replica per host, each stage on its own block of hosts."""
    per = len(cluster.hosts) // stages
    split = [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]
    return Plan(tuple(Stage(split[s], 8, tuple(Replica(h.name, tuple(range(8)))
                                               for h in cluster.hosts[s * per:(s + 1) * per]))
                      for s in range(stages)), micro)


@pytest.mark.parametrize("model", ["llama2-7b", "gpt3-1.3b"])  # gpt3: tied embeddings
def test_cost_model_array_path_matches_its_loop(monkeypatch, model):
    """Stages of 48 hosts each cross 2,304 host pairs: with BULK_PAIRS at 1 the cost
    model takes them as arrays, at 10**9 flow by flow; every figure is the same."""
    cluster = parse_cluster(leaf_spine(96))
    spec = hetpar.load_model(model)
    training = hetpar.load_training({"global_batch": 48 * 8})
    plan = block_plan(cluster, 2, spec.layers, 8)
    out = {}
    # 100: in blocks; eager 0: the loop reads routes pair by pair, not from the full table.
    for threshold, block, eager in ((1, 1 << 20, 128), (1, 100, 128), (10**9, 1 << 20, 0),
                                    (10**9, 1 << 20, 128)):
        monkeypatch.setattr(estimate_mod, "BULK_PAIRS", threshold)
        monkeypatch.setattr(estimate_mod, "BULK_BLOCK", block)
        monkeypatch.setattr(routing, "EAGER_HOSTS", eager)
        cluster = parse_cluster(leaf_spine(96))
        cm = hetpar.CostModel(cluster, spec, training, samples=8, seed=3)
        out[threshold, block, eager] = (
            cm.evaluate(plan, validate=False).to_dict(),
            cm._crossings(tuple(range(48)), tuple(range(48, 96)), 6, 1))
        assert (cluster.router._table is None) == (eager == 0)
    loop = out[10**9, 1 << 20, 128]
    for key in ((1, 1 << 20, 128), (1, 100, 128), (10**9, 1 << 20, 0)):
        assert out[key] == loop
        assert list(out[key][1][0]) == list(loop[1][0])  # channels in the same order too
    assert len(loop[1][0]) > 20


def test_host_limit_refused_up_front():
    doc = leaf_spine(10)
    doc["hosts"][0]["count"] = 2**62
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        parse_cluster(doc, source="big.yaml")
    assert time.perf_counter() - t0 < 1.0
    msg = str(info.value)
    assert "\n" not in msg and "big.yaml" in msg and "hosts[0].count" in msg
    assert f"{limits.MAX_HOSTS:,}" in msg
    doc["hosts"][0]["count"] = limits.MAX_HOSTS  # with the other group: one over
    with pytest.raises(ConfigError, match="exceed the limit"):
        parse_cluster(doc)
