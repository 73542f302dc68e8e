"""Clusters built from dicts and files: hosts, switches, links, routes and their errors."""

from __future__ import annotations

import copy

import pytest
import yaml

import hetpar
from hetpar.cluster import parse_cluster
from hetpar.errors import ConfigError


def single_switch(**overrides):
    doc = {
        "name": "tiny",
        "hosts": [
            {"name": "gpu", "count": 3, "gpu": "V100-SXM2-16GB", "gpus": 4, "nic_gbps": 25},
            {"name": "t4", "gpu": "T4-16GB", "gpus": 2, "nic_gbps": 50,
             "uplink": {"latency_us": 7}},
        ],
        "topology": {"kind": "single_switch", "name": "tor"},
    }
    doc.update(overrides)
    return doc


def leaf_spine(uplink_gbps=100):
    return {
        "name": "ls",
        "hosts": [{"name": "h", "count": 5, "gpu": "A100-SXM4-40GB", "gpus": 8,
                   "nic_gbps": 200, "uplink": {"latency_us": 3}}],
        "topology": {"kind": "leaf_spine", "hosts_per_leaf": 2, "spines": 2,
                     "uplink_gbps": uplink_gbps, "latency_us": 4},
    }


def route_nodes(cluster, src, dst):
    """The node sequence a route visits, decoded from its directed channels."""
    i, j = cluster.host_index[src], cluster.host_index[dst]
    nodes = [src]
    for ch in cluster.routes[i][j]:
        link = cluster.links[ch // 2]
        a, b = (link.a, link.b) if ch % 2 == 0 else (link.b, link.a)
        assert a == nodes[-1], f"channel {ch} starts at {a}, route is at {nodes[-1]}"
        nodes.append(b)
    return nodes


def error_of(doc, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        parse_cluster(doc, **kwargs)
    return str(info.value)


# ---- hosts ------------------------------------------------------------------------------

def test_host_count_expands_to_numbered_names():
    c = parse_cluster(single_switch())
    assert [h.name for h in c.hosts] == ["gpu-0", "gpu-1", "gpu-2", "t4"]
    assert [c.host_index[h.name] for h in c.hosts] == [0, 1, 2, 3]
    assert all(h.gpu.name == "V100-SXM2-16GB" and h.num_gpus == 4 for h in c.hosts[:3])
    assert c.host("t4").gpu.name == "T4-16GB"
    assert c.num_gpus == 3 * 4 + 2
    assert all(h.switch == "tor" for h in c.hosts)
    assert c.switches == ("tor",)


def test_each_host_gets_an_uplink_of_its_nic():
    c = parse_cluster(single_switch())
    uplinks = {link.a: link for link in c.links if link.b == "tor"}
    assert set(uplinks) == {"gpu-0", "gpu-1", "gpu-2", "t4"}
    assert uplinks["gpu-1"].capacity_gbps == 25
    assert uplinks["t4"].capacity_gbps == 50
    assert uplinks["t4"].latency_s == pytest.approx(7e-6)
    assert uplinks["gpu-0"].latency_s == pytest.approx(2e-6)  # the default
    assert c.num_channels == 2 * len(c.links)


def test_gpu_aliases_are_case_insensitive():
    doc = single_switch()
    doc["hosts"][0]["gpu"] = "v100"
    doc["hosts"][1]["gpu"] = "t4"
    c = parse_cluster(doc)
    assert c.hosts[0].gpu.name == "V100-SXM2-16GB"
    assert c.host("t4").gpu.name == "T4-16GB"


def test_intra_defaults_come_from_the_gpu():
    c = parse_cluster(single_switch())
    v100, t4 = c.host("gpu-0"), c.host("t4")
    assert (v100.intra_kind, v100.intra_GBps) == ("nvlink", 150)
    assert v100.intra_latency_s == pytest.approx(3e-6)
    assert (t4.intra_kind, t4.intra_GBps) == ("pcie", 16)
    assert t4.intra_latency_s == pytest.approx(8e-6)


# ---- routes -----------------------------------------------------------------------------

def test_routes_are_directed_channels_through_the_switch():
    c = parse_cluster(single_switch())
    n = len(c.hosts)
    assert len(c.routes) == n and all(len(row) == n for row in c.routes)
    for a in c.hosts:
        for b in c.hosts:
            i, j = c.host_index[a.name], c.host_index[b.name]
            if i == j:
                assert c.routes[i][j] == ()
                assert c.route_latency_s[i, j] == 0.0
                continue
            assert route_nodes(c, a.name, b.name) == [a.name, "tor", b.name]
            # The reverse route uses the opposite channel of each link, in reverse order.
            assert c.routes[j][i] == tuple(ch ^ 1 for ch in reversed(c.routes[i][j]))
            assert len(set(c.routes[i][j]) & set(c.routes[j][i])) == 0


def test_route_latency_sums_link_latencies():
    for doc in (single_switch(), leaf_spine()):
        c = parse_cluster(doc)
        for i in range(len(c.hosts)):
            for j in range(len(c.hosts)):
                expected = sum(c.links[ch // 2].latency_s for ch in c.routes[i][j])
                assert c.route_latency_s[i, j] == pytest.approx(expected, rel=1e-12, abs=0)
    c = parse_cluster(single_switch())
    i, j = c.host_index["gpu-0"], c.host_index["t4"]
    assert c.route_latency_s[i, j] == pytest.approx(2e-6 + 7e-6)


def test_leaf_spine_places_hosts_in_order():
    c = parse_cluster(leaf_spine())
    assert [h.switch for h in c.hosts] == ["leaf0", "leaf0", "leaf1", "leaf1", "leaf2"]
    assert set(c.switches) == {"leaf0", "leaf1", "leaf2", "spine"}
    fabric = [link for link in c.links if "spine" in (link.a, link.b)]
    assert len(fabric) == 3
    # One logical link per leaf: spines x uplink_gbps.
    assert all(link.capacity_gbps == 200 for link in fabric)
    assert all(link.latency_s == pytest.approx(4e-6) for link in fabric)


def test_leaf_spine_auto_uplink_is_non_blocking():
    c = parse_cluster(leaf_spine(uplink_gbps="auto"))
    caps = {link.a: link.capacity_gbps for link in c.links if link.b == "spine"}
    assert caps == {"leaf0": 400, "leaf1": 400, "leaf2": 200}


def test_leaf_spine_route_crosses_the_spine():
    c = parse_cluster(leaf_spine())
    assert route_nodes(c, "h-0", "h-3") == ["h-0", "leaf0", "spine", "leaf1", "h-3"]
    assert route_nodes(c, "h-4", "h-1") == ["h-4", "leaf2", "spine", "leaf0", "h-1"]
    i, j = c.host_index["h-0"], c.host_index["h-3"]
    assert c.route_latency_s[i, j] == pytest.approx(3e-6 + 4e-6 + 4e-6 + 3e-6)


def test_same_leaf_route_stays_on_the_leaf():
    c = parse_cluster(leaf_spine())
    assert route_nodes(c, "h-0", "h-1") == ["h-0", "leaf0", "h-1"]
    assert route_nodes(c, "h-3", "h-2") == ["h-3", "leaf1", "h-2"]


def test_routes_take_the_lowest_latency_path():
    # s1 - s2 directly is slow (100 us); via s3 it is 2 x 10 us.
    doc = {
        "switches": ["s1", "s2", "s3"],
        "hosts": [{"name": "a", "gpu": "T4-16GB", "gpus": 1, "nic_gbps": 10, "switch": "s1"},
                  {"name": "b", "gpu": "T4-16GB", "gpus": 1, "nic_gbps": 10, "switch": "s2"}],
        "links": [{"a": "s1", "b": "s2", "capacity_gbps": 100, "latency_us": 100},
                  {"a": "s1", "b": "s3", "capacity_gbps": 10, "latency_us": 10},
                  {"a": "s3", "b": "s2", "capacity_gbps": 10, "latency_us": 10}],
    }
    c = parse_cluster(doc)
    assert route_nodes(c, "a", "b") == ["a", "s1", "s3", "s2", "b"]
    assert c.route_latency_s[0, 1] == pytest.approx(2e-6 + 20e-6 + 2e-6)
    # With the direct link as fast, the path with fewer hops wins the tie.
    doc2 = copy.deepcopy(doc)
    doc2["links"][0]["latency_us"] = 20
    assert route_nodes(parse_cluster(doc2), "a", "b") == ["a", "s1", "s2", "b"]


# ---- errors -----------------------------------------------------------------------------

def test_unreachable_host_is_named():
    doc = {
        "switches": ["s1", "s2"],
        "hosts": [{"name": "a", "count": 2, "gpu": "T4-16GB", "gpus": 1, "nic_gbps": 10,
                   "switch": "s1"},
                  {"name": "island", "gpu": "T4-16GB", "gpus": 1, "nic_gbps": 10,
                   "switch": "s2"}],
    }
    msg = error_of(doc)
    assert "island" in msg and "unreachable" in msg
    assert "hosts[2]" in msg


def test_unknown_gpu_type_suggests_a_name():
    doc = single_switch()
    doc["hosts"][0]["gpu"] = "V100-SXM2-16G"
    msg = error_of(doc, source="my.yaml")
    assert msg.startswith("my.yaml: hosts[0].gpu:"), msg
    assert "V100-SXM2-16G" in msg
    assert "did you mean" in msg and "V100-SXM2-16GB" in msg


@pytest.mark.parametrize("nic", [0, -10])
def test_nonpositive_nic_rejected(nic):
    doc = single_switch()
    doc["hosts"][1]["nic_gbps"] = nic
    msg = error_of(doc, source="c.yaml")
    assert "c.yaml: hosts[1].nic_gbps" in msg and "positive" in msg


def test_missing_nic_rejected():
    doc = single_switch()
    del doc["hosts"][0]["nic_gbps"]
    msg = error_of(doc)
    assert "hosts[0].nic_gbps" in msg and "required" in msg


def test_zero_gpus_rejected():
    doc = single_switch()
    doc["hosts"][0]["gpus"] = 0
    assert "hosts[0].gpus" in error_of(doc)


def test_duplicate_host_names_rejected():
    doc = single_switch()
    doc["hosts"][1]["name"] = "gpu-1"  # collides with the expansion of the first group
    msg = error_of(doc)
    assert "gpu-1" in msg and "more than once" in msg
    doc = single_switch()
    doc["hosts"].append(dict(doc["hosts"][1]))
    assert "'t4'" in error_of(doc)


def test_switch_named_like_a_host_rejected():
    doc = single_switch(topology={"kind": "single_switch", "name": "t4"})
    assert "switches" in error_of(doc)


def test_link_to_unknown_node_rejected():
    doc = single_switch(links=[{"a": "tor", "b": "nowhere", "capacity_gbps": 10}])
    msg = error_of(doc)
    assert "links[0]" in msg and "nowhere" in msg


def test_two_links_between_the_same_nodes_rejected():
    doc = single_switch(switches=["other"],
                        links=[{"a": "tor", "b": "other", "capacity_gbps": 10},
                               {"a": "other", "b": "tor", "capacity_gbps": 20}])
    assert "two links" in error_of(doc)


def test_host_without_switch_rejected():
    doc = single_switch()
    del doc["topology"]
    msg = error_of(doc)
    assert "gpu-0" in msg and "switch" in msg


@pytest.mark.parametrize("where, key", [
    ("top", "hostz"), ("host", "nic"), ("topology", "spine"), ("uplink", "gbps")])
def test_unknown_config_key_rejected(where, key):
    doc = single_switch()
    expected = {"top": key, "host": f"hosts[0].{key}", "topology": f"topology.{key}",
                "uplink": f"hosts[1].uplink.{key}"}[where]
    target = {"top": doc, "host": doc["hosts"][0], "topology": doc["topology"],
              "uplink": doc["hosts"][1]["uplink"]}[where]
    target[key] = 1
    msg = error_of(doc, source="k.yaml")
    assert f"k.yaml: {expected}: unknown field" in msg, msg


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\n"
                    "hosts:\n"
                    "  - {name: a, gpu: T4-16GB, gpus: 4, nic_gbps: 10}\n"
                    "  - {name: b, gpu: T4-16GB, gpus: 4, nic_gbps: 10}\n"
                    "  - {name: c: d}\n"
                    "topology: {kind: single_switch}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        hetpar.load_cluster(path)
    msg = str(info.value)
    assert str(path) in msg and "malformed YAML" in msg
    assert "line 5" in msg, msg
    assert "\n" not in msg


def test_malformed_yaml_indentation_names_the_line(tmp_path):
    path = tmp_path / "indent.yaml"
    path.write_text("name: x\nhosts:\n  - name: a\n    gpu: T4-16GB\n   gpus: 4\n",
                    encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        hetpar.load_cluster(path)
    assert "line 5" in str(info.value)


def test_cluster_file_round_trip(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(single_switch()), encoding="utf-8")
    c = hetpar.load_cluster(path)
    assert c.name == "tiny"
    assert [h.name for h in c.hosts] == ["gpu-0", "gpu-1", "gpu-2", "t4"]


def test_errors_from_files_name_the_file(tmp_path):
    doc = single_switch()
    doc["hosts"][0]["gpus"] = "four"
    path = tmp_path / "typed.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        hetpar.load_cluster(path)
    assert str(info.value).startswith(f"{path}: hosts[0].gpus:")


def test_missing_cluster_name_lists_bundled():
    with pytest.raises(ConfigError) as info:
        hetpar.load_cluster("no-such-cluster")
    assert "amp-het-16" in str(info.value)
