"""Bandwidth processes, traces, topology events and migration cost (hetpar.dynamics)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from hetpar.cluster.topology import parse_cluster
from hetpar.dynamics.processes import Degrade, DiurnalProcess
from hetpar.dynamics.scenario import (
    Migration,
    build_timeline,
    cluster_without,
    list_scenarios,
    load_scenario,
    parse_scenario,
)
from hetpar.dynamics.traces import load_link_trace, write_link_trace
from hetpar.errors import ConfigError

CLUSTER = {"name": "tiny-geo", "switches": ["s1", "s2"],
           "hosts": [{"name": "a", "count": 2, "gpu": "A100-SXM4-80GB", "gpus": 2,
                      "nic_gbps": 100, "switch": "s1"},
                     {"name": "b", "gpu": "A100-SXM4-80GB", "gpus": 2, "nic_gbps": 100,
                      "switch": "s2"}],
           "links": [{"a": "s1", "b": "s2", "capacity_gbps": 50, "latency_us": 1000}]}


def scenario_doc(**extra):
    doc = {"name": "t", "cluster": CLUSTER, "model": "gpt3-125m", "training": "small-batch",
           "iterations": 100, "horizon_s": 3600, "step_s": 60,
           "processes": [{"kind": "markov", "links": ["s1--s2"], "states": [
               {"name": "ok", "gbps": 40, "to": {"bad": 0.01}},
               {"name": "bad", "gbps": 5, "to": {"ok": 0.01}}]}]}
    doc.update(extra)
    return doc


def test_timeline_deterministic_by_seed():
    sc = parse_scenario(scenario_doc())
    a = build_timeline(sc, np.random.default_rng(3))
    b = build_timeline(sc, np.random.default_rng(3))
    c = build_timeline(sc, np.random.default_rng(4))
    key = lambda tl: [(s.start_s, tuple(s.base_bandwidth)) for s in tl.states]
    assert key(a) == key(b)
    assert key(a) != key(c)
    assert a.states[0].start_s == 0.0 and math.isinf(a.states[-1].end_s)
    wan = a.link_names.index("s1--s2")
    assert set(np.unique([s.base_bandwidth[wan] for s in a.states])) <= {40.0, 5.0}
    # Consecutive states always differ (merged otherwise).
    for s, t in zip(a.states, a.states[1:]):
        assert s.end_s == t.start_s
        assert not np.array_equal(s.base_bandwidth, t.base_bandwidth) or s.topology != t.topology


def test_diurnal_and_degrade():
    d = DiurnalProcess(busy_gbps=10, quiet_gbps=50, period_s=3600, busiest_s=0,
                       quantum_gbps=10)
    _, v = d.path(np.random.default_rng(0), 3600, 300)
    assert v.min() >= 10 and v.max() <= 50 and set(v) <= {10, 20, 30, 40, 50}
    assert v[0] < v[len(v) // 2]  # busy at t=0, quiet half a period later
    f_t, f_v = Degrade(("x",), at_s=100, factor=0.1, ramp_s=300, ramp_steps=3,
                       until_s=1000).factor_path()
    assert list(f_t) == [0, 100, 200, 300, 1000]
    assert np.allclose(f_v, [1, 0.7, 0.4, 0.1, 1])


def test_bundled_scenarios_load_and_build():
    names = list_scenarios()
    assert {"stable-dc", "cloud-congested", "geo-degrading", "host-loss"} <= set(names)
    for name in names:
        sc = load_scenario(name)
        tl = build_timeline(sc, np.random.default_rng(0))
        assert len(tl.states) >= 2 and len(sc.cluster.hosts) <= 8


def test_host_failure_rebuilds_cluster_and_invalidates_plans():
    from hetpar.dynamics.strategies import Planners
    from hetpar.plan import Plan, Replica, Stage
    from hetpar.workload.model import load_model
    from hetpar.workload.training import load_training

    sc = parse_scenario(scenario_doc(events=[{"kind": "host_down", "host": "a-1",
                                              "at_s": 600, "until_s": 1200}]))
    tl = build_timeline(sc, np.random.default_rng(0))
    down = tl.at(700)
    assert down.lost_hosts == ("a-1",) and "a-1" not in down.cluster.host_index
    assert len(down.cluster.hosts) == 2 and len(down.bandwidth) == len(down.cluster.links)
    # Routes recomputed: a-0 still reaches b over the WAN.
    i, j = down.cluster.host_index["a-0"], down.cluster.host_index["b"]
    assert len(down.cluster.routes[i][j]) == 3
    assert tl.at(1300).topology == "" and len(tl.at(1300).cluster.hosts) == 3
    p = Planners(load_model("gpt3-125m"), load_training("small-batch"))
    uses = Plan((Stage(12, 2, (Replica("a-1", (0, 1)),)),), micro_batches=8)
    other = Plan((Stage(12, 2, (Replica("b", (0, 1)),)),), micro_batches=8)
    assert p.valid(uses, tl.at(0)) and not p.valid(uses, down)
    assert p.valid(other, down) and math.isfinite(p.iteration_time(other, down))
    assert math.isinf(p.iteration_time(uses, down))


def test_link_down_cuts_off_hosts():
    base = parse_cluster(CLUSTER)
    cl, lost = cluster_without(base, links=["s2--s1"])
    assert lost == ("b",) and [h.name for h in cl.hosts] == ["a-0", "a-1"]
    none, lost = cluster_without(base, hosts=["a-0", "a-1", "b"])
    assert none is None and len(lost) == 3


def test_migration_checkpoint_arithmetic():
    m = Migration()
    assert (m.storage_GBps, m.restart_s, m.bytes_per_param) == (2.0, 30.0, 14.0)
    assert m.checkpoint_interval_s == 3600.0 and m.checkpoint_s is None
    assert m.checkpoint_bytes(1e9) == 14e9
    assert m.write_s(1e9) == pytest.approx(14e9 / 2e9)  # the bytes over storage
    assert m.reload_s(1e9) == pytest.approx(14e9 / 2e9 + 30)  # read back, then restart
    m = Migration(4.0, 0.0, 8.0, checkpoint_s=1.5)
    assert m.write_s(1e9) == 1.5  # a fixed stall replaces the bytes' time
    assert m.reload_s(1e9) == pytest.approx(2.0)  # reading back is still bytes / storage
    assert m.write_s(0.0) == 1.5 and Migration().write_s(0.0) == 0.0
    from hetpar.dynamics.simulator import SimSettings

    st = SimSettings(10, 1, Migration(storage_GBps=1.0, restart_s=5.0), params=2e9)
    assert st.checkpoint_write_s == pytest.approx(28.0)
    assert st.reload_s == pytest.approx(33.0)


def test_scenario_migration_settings():
    sc = parse_scenario(scenario_doc(migration={"storage_GBps": 4, "restart_s": 10,
                                                "bytes_per_param": 16,
                                                "checkpoint_interval_s": 600,
                                                "checkpoint_s": 3}))
    assert sc.migration == Migration(4.0, 10.0, 16.0, 600.0, 3.0)
    assert parse_scenario(scenario_doc()).migration == Migration()
    with pytest.raises(ConfigError, match="cost_s"):
        parse_scenario(scenario_doc(migration={"cost_s": 3}))
    with pytest.raises(ConfigError, match="checkpoint_interval_s"):
        parse_scenario(scenario_doc(migration={"checkpoint_interval_s": 0}))


# ---- traces --------------------------------------------------------------------------------

def _trace(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(text)
    return p


def test_trace_roundtrip(tmp_path):
    cl = parse_cluster(CLUSTER)
    p = write_link_trace(tmp_path / "x.csv", [0, 10, 20, 30],
                         {"s1--s2": [40, 40, 5, 40], "a-0--s1": [100, 100, 100, 90]})
    tr = load_link_trace(p, cl)
    assert tr.times == (0.0, 20.0, 30.0)  # identical rows merged
    assert tr.values["s1--s2"] == (40.0, 5.0, 40.0)
    # Column names in either order.
    tr2 = load_link_trace(_trace(tmp_path, "time_s,s2--s1\n0,3\n"), cl)
    assert tr2.values == {"s1--s2": (3.0,)}


@pytest.mark.parametrize("text,line,problem", [
    ("time_s,s1--s2,a-0--s1\n0,10,50\n5,10\n", "line 3", "missing value for a-0--s1"),
    ("time_s,s1--s2\n0,10\n5,\n", "line 3", "missing value for link"),
    ("time_s,s1--s2\n0,10\n5,-1\n", "line 3", "must be positive"),
    ("time_s,s1--s2\n0,10\n5,fast\n", "line 3", "not a number"),
    ("time_s,s1--s2\n0,10\n5,10\n4,10\n", "line 4", "time goes backwards"),
    ("time_s,s1--s2\n0,10\nsoon,10\n", "line 3", "time_s: not a number"),
    ("time_s,s1--s2\n0,70\n", "line 2", "exceeds its capacity"),
    ("time_s,s1--s3\n0,10\n", "line 1", "names no link"),
    ("when,s1--s2\n0,10\n", "line 1", "first column must be 'time_s'"),
    ("time_s,s1--s2\n", "line 2", "holds no rows"),
])
def test_trace_errors_name_file_and_line(tmp_path, text, line, problem):
    p = _trace(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_link_trace(p, parse_cluster(CLUSTER))
    msg = str(err.value)
    assert str(p) in msg and line in msg and problem in msg


def test_scenario_errors():
    with pytest.raises(ConfigError, match="names no link"):
        parse_scenario(scenario_doc(processes=[{"kind": "markov", "links": ["x--y"],
                                                "states": [{"name": "a", "gbps": 1}]}]))
    with pytest.raises(ConfigError, match="unknown host"):
        parse_scenario(scenario_doc(events=[{"kind": "host_down", "host": "zz", "at_s": 1}]))
    with pytest.raises(ConfigError, match="must be after"):
        parse_scenario(scenario_doc(events=[{"kind": "host_down", "host": "b", "at_s": 5,
                                             "until_s": 2}]))
    with pytest.raises(ConfigError, match="no such scenario"):
        load_scenario("no-such-scenario")
