"""Link bandwidth models: seeded draws, their moments, Markov chains, traces, parse errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

import hetpar
from hetpar.cluster import Constant, LogNormal, Markov, Trace
from hetpar.errors import ConfigError


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# Two hosts on two switches joined by one explicit 10 Gb/s link whose model is under test.
def _cluster_doc(bandwidth, capacity=10.0):
    return {
        "name": "bw-test",
        "switches": ["s1", "s2"],
        "hosts": [
            {"name": "a", "gpu": "T4-16GB", "gpus": 1, "nic_gbps": 100, "switch": "s1"},
            {"name": "b", "gpu": "T4-16GB", "gpus": 1, "nic_gbps": 100, "switch": "s2"},
        ],
        "links": [{"a": "s1", "b": "s2", "capacity_gbps": capacity, "latency_us": 5,
                   "bandwidth": bandwidth}],
    }


def _write_cluster(tmp_path, bandwidth, capacity=10.0, name="bw.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(_cluster_doc(bandwidth, capacity)), encoding="utf-8")
    return path


def _wan_link(cluster):
    (link,) = [link for link in cluster.links if {link.a, link.b} == {"s1", "s2"}]
    return link


# ---- constant ---------------------------------------------------------------------------

def test_constant_draws_its_capacity():
    m = Constant(25.0)
    draws = m.sample(rng(1), 100)
    assert draws.shape == (100,)
    assert np.all(draws == 25.0)
    assert m.mean() == 25.0
    assert m.cv() == 0.0


def test_constant_is_the_default_and_equals_capacity(tmp_path):
    doc = _cluster_doc(None)
    del doc["links"][0]["bandwidth"]
    cluster = hetpar.cluster.parse_cluster(doc)
    link = _wan_link(cluster)
    assert isinstance(link.bandwidth, Constant)
    assert link.bandwidth.mean() == 10.0


# ---- log-normal -------------------------------------------------------------------------

def test_lognormal_seeded_determinism():
    m = LogNormal(40.0, 0.3, 100.0)
    a = m.sample(rng(7), 1000)
    b = m.sample(rng(7), 1000)
    c = m.sample(rng(8), 1000)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_lognormal_does_not_use_global_random_state():
    m = LogNormal(40.0, 0.3, 100.0)
    np.random.seed(0)
    a = m.sample(rng(3), 50)
    np.random.seed(12345)
    b = m.sample(rng(3), 50)
    np.testing.assert_array_equal(a, b)


def test_lognormal_unclipped_mean_and_cv():
    # A cap far above the mean: clipping is negligible, so mean and cv are as stated.
    m = LogNormal(40.0, 0.3, 1e6)
    assert m.mean() == pytest.approx(40.0, rel=1e-9)
    assert m.cv() == pytest.approx(0.3, rel=1e-6)
    draws = m.sample(rng(0), 200_000)
    assert draws.mean() == pytest.approx(40.0, rel=5e-3)
    assert draws.std() / draws.mean() == pytest.approx(0.3, rel=2e-2)


def test_lognormal_clipped_mean_matches_samples():
    # Mean 80 with cv 0.5 under a 100 Gb/s cap: a good share of draws is clipped.
    m = LogNormal(80.0, 0.5, 100.0)
    draws = m.sample(rng(11), 400_000)
    assert draws.max() <= 100.0
    assert np.mean(draws == 100.0) > 0.1  # clipping really happens
    # .mean() is the mean of the clipped draws, below the nominal mean.
    assert m.mean() < 80.0 - 1.0
    assert draws.mean() == pytest.approx(m.mean(), rel=3e-3)
    assert draws.std() / draws.mean() == pytest.approx(m.cv(), rel=2e-2)


def test_lognormal_zero_cv_is_constant_at_the_mean():
    m = LogNormal(30.0, 0.0, 100.0)
    assert m.mean() == pytest.approx(30.0)
    np.testing.assert_allclose(m.sample(rng(0), 10), 30.0)


def test_lognormal_parsed_from_cluster(tmp_path):
    cluster = hetpar.load_cluster(_write_cluster(tmp_path, {"kind": "lognormal",
                                                            "mean_gbps": 8, "cv": 0.2}))
    model = _wan_link(cluster).bandwidth
    assert isinstance(model, LogNormal)
    assert model.cap_gbps == 10.0
    assert model.mean() < 8.0  # clipped at the 10 Gb/s capacity
    assert model.mean() == pytest.approx(8.0, rel=0.05)


# ---- Markov -----------------------------------------------------------------------------

TWO_STATE = Markov(("ok", "busy"), (100.0, 20.0), ((0.0, 2.0), (1.0, 0.0)))
THREE_STATE = Markov(("a", "b", "c"), (8.0, 3.0, 1.0),
                     ((0.0, 0.4, 0.1), (2.5, 0.0, 0.1), (0.4, 0.2, 0.0)))


def _analytic_stationary(m: Markov) -> np.ndarray:
    q = np.array(m.rates, dtype=float)
    np.fill_diagonal(q, -q.sum(axis=1))
    # Null vector of Q^T by SVD, independent of the implementation's least-squares.
    _, _, vt = np.linalg.svd(q.T)
    pi = np.abs(vt[-1])
    return pi / pi.sum()


@pytest.mark.parametrize("chain", [TWO_STATE, THREE_STATE])
def test_markov_stationary_distribution(chain):
    pi = chain.stationary()
    assert pi.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(pi >= 0)
    np.testing.assert_allclose(pi, _analytic_stationary(chain), atol=1e-9)
    q = np.array(chain.rates, dtype=float)
    np.fill_diagonal(q, -q.sum(axis=1))
    np.testing.assert_allclose(pi @ q, 0.0, atol=1e-9)


def test_markov_two_state_closed_form():
    # ok -> busy at 2/s, busy -> ok at 1/s: pi = (1/3, 2/3).
    np.testing.assert_allclose(TWO_STATE.stationary(), [1 / 3, 2 / 3], atol=1e-12)
    assert TWO_STATE.mean() == pytest.approx(100 / 3 + 40 / 3)


def test_markov_seeded_determinism_and_mean():
    a = THREE_STATE.sample(rng(5), 2000)
    b = THREE_STATE.sample(rng(5), 2000)
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a)) <= {8.0, 3.0, 1.0}
    draws = THREE_STATE.sample(rng(6), 200_000)
    assert draws.mean() == pytest.approx(THREE_STATE.mean(), rel=1e-2)
    assert draws.std() / draws.mean() == pytest.approx(THREE_STATE.cv(), rel=3e-2)


def test_markov_sample_path_determinism():
    times = np.linspace(0.0, 50.0, 501)
    a = TWO_STATE.sample_path(rng(9), times)
    b = TWO_STATE.sample_path(rng(9), times)
    np.testing.assert_array_equal(a, b)
    assert a.shape == times.shape
    assert set(np.unique(a)) <= {100.0, 20.0}


@pytest.mark.parametrize("chain", [TWO_STATE, THREE_STATE])
def test_markov_sample_path_long_run_occupancy(chain):
    times = np.arange(0.0, 4000.0, 0.2)
    path = chain.sample_path(rng(21), times)
    pi = chain.stationary()
    occupancy = np.array([np.mean(path == level) for level in chain.gbps])
    np.testing.assert_allclose(occupancy, pi, atol=0.04)
    # The path really switches (it is not stuck in its first state).
    assert np.count_nonzero(np.diff(path)) > 100


def test_markov_sample_path_dwell_times():
    # Leaving 'ok' at rate 2/s: runs of 'ok' last 0.5 s on average.
    dt = 0.01
    times = np.arange(0.0, 3000.0, dt)
    path = TWO_STATE.sample_path(rng(4), times)
    ok = path == 100.0
    starts = np.flatnonzero(np.diff(ok.astype(int)) == 1)
    ends = np.flatnonzero(np.diff(ok.astype(int)) == -1)
    ends = ends[ends > starts[0]]
    n = min(len(starts), len(ends))
    runs = (ends[:n] - starts[:n]) * dt
    assert runs.mean() == pytest.approx(0.5, rel=0.1)


def test_markov_parsed_from_cluster(tmp_path):
    bw = {"kind": "markov", "states": [
        {"name": "normal", "gbps": 8, "to": {"congested": 0.3}},
        {"name": "congested", "gbps": 2, "to": {"normal": 0.6}}]}
    model = _wan_link(hetpar.load_cluster(_write_cluster(tmp_path, bw))).bandwidth
    assert isinstance(model, Markov)
    assert model.names == ("normal", "congested")
    np.testing.assert_allclose(model.stationary(), [2 / 3, 1 / 3], atol=1e-12)


# ---- trace ------------------------------------------------------------------------------

TRACE = Trace((0.0, 10.0, 20.0, 40.0), (8.0, 2.0, 6.0, 1.0), "<test>")


def test_trace_value_at_is_piecewise_constant():
    assert TRACE.value_at(0.0) == 8.0
    assert TRACE.value_at(9.999) == 8.0
    assert TRACE.value_at(10.0) == 2.0
    assert TRACE.value_at(19.0) == 2.0
    assert TRACE.value_at(20.0) == 6.0
    assert TRACE.value_at(39.9) == 6.0
    assert TRACE.value_at(40.0) == 1.0
    assert TRACE.value_at(1000.0) == 1.0  # holds the last value
    assert TRACE.value_at(-5.0) == 8.0  # and the first before the start
    np.testing.assert_array_equal(TRACE.value_at(np.array([5.0, 15.0, 25.0])), [8.0, 2.0, 6.0])


def test_trace_mean_is_time_weighted():
    # 10 s at 8, 10 s at 2, 20 s at 6; the last row only marks the end.
    assert TRACE.mean() == pytest.approx((80 + 20 + 120) / 40)
    m = TRACE.mean()
    var = (10 * (8 - m) ** 2 + 10 * (2 - m) ** 2 + 20 * (6 - m) ** 2) / 40
    assert TRACE.cv() == pytest.approx(math.sqrt(var) / m)


def test_trace_seeded_draws_and_mean():
    a = TRACE.sample(rng(2), 1000)
    b = TRACE.sample(rng(2), 1000)
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a)) <= {8.0, 2.0, 6.0, 1.0}
    draws = TRACE.sample(rng(3), 200_000)
    assert draws.mean() == pytest.approx(TRACE.mean(), rel=1e-2)
    # Fraction of draws in each segment is its share of the time span.
    assert np.mean(draws == 6.0) == pytest.approx(0.5, abs=0.01)


def test_single_row_trace():
    t = Trace((0.0,), (4.0,), "<test>")
    assert t.mean() == 4.0
    np.testing.assert_array_equal(t.sample(rng(0), 5), np.full(5, 4.0))


def test_trace_parsed_from_csv(tmp_path):
    (tmp_path / "t.csv").write_text("time_s,wan,other\n0,8,1\n10,4,1\n30,9,1\n",
                                    encoding="utf-8")
    cluster = hetpar.load_cluster(_write_cluster(tmp_path, {"kind": "trace", "file": "t.csv",
                                                            "column": "wan"}))
    model = _wan_link(cluster).bandwidth
    assert isinstance(model, Trace)
    assert model.times == (0.0, 10.0, 30.0)
    assert model.values == (8.0, 4.0, 9.0)
    assert model.mean() == pytest.approx((80 + 80) / 30)


def test_cluster_sample_link_bandwidth_is_seeded(tmp_path):
    cluster = hetpar.load_cluster("cloud-mixed")
    a = cluster.sample_link_bandwidth(rng(4), 64)
    b = cluster.sample_link_bandwidth(rng(4), 64)
    assert a.shape == (64, len(cluster.links))
    np.testing.assert_array_equal(a, b)
    caps = np.array([link.capacity_gbps for link in cluster.links])
    assert np.all(a <= caps) and np.all(a > 0)
    np.testing.assert_allclose(cluster.mean_link_bandwidth()[0],
                               [link.bandwidth.mean() for link in cluster.links])


# ---- parse errors -----------------------------------------------------------------------

def _raises(tmp_path, bandwidth, *fragments, capacity=10.0):
    path = _write_cluster(tmp_path, bandwidth, capacity)
    with pytest.raises(ConfigError) as info:
        hetpar.load_cluster(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


@pytest.mark.parametrize("value", [0, -5])
def test_lognormal_nonpositive_mean_rejected(tmp_path, value):
    _raises(tmp_path, {"kind": "lognormal", "mean_gbps": value, "cv": 0.2},
            "links[0].bandwidth.mean_gbps", "positive")


def test_lognormal_mean_above_capacity_rejected(tmp_path):
    _raises(tmp_path, {"kind": "lognormal", "mean_gbps": 12, "cv": 0.2},
            "links[0].bandwidth.mean_gbps", "capacity")


def test_lognormal_negative_cv_rejected(tmp_path):
    _raises(tmp_path, {"kind": "lognormal", "mean_gbps": 5, "cv": -0.1},
            "links[0].bandwidth.cv")


@pytest.mark.parametrize("value", [0, -1])
def test_nonpositive_link_capacity_rejected(tmp_path, value):
    _raises(tmp_path, {"kind": "constant"}, "links[0].capacity_gbps", "positive",
            capacity=value)


@pytest.mark.parametrize("value", [0, -3])
def test_markov_nonpositive_level_rejected(tmp_path, value):
    bw = {"kind": "markov", "states": [{"name": "ok", "gbps": 8, "to": {"bad": 1}},
                                       {"name": "bad", "gbps": value, "to": {"ok": 1}}]}
    _raises(tmp_path, bw, "links[0].bandwidth.states[1].gbps", "positive")


def test_markov_level_above_capacity_rejected(tmp_path):
    bw = {"kind": "markov", "states": [{"name": "ok", "gbps": 11, "to": {"bad": 1}},
                                       {"name": "bad", "gbps": 2, "to": {"ok": 1}}]}
    _raises(tmp_path, bw, "links[0].bandwidth.states[0].gbps", "capacity")


def test_markov_unknown_target_state_rejected(tmp_path):
    bw = {"kind": "markov", "states": [{"name": "ok", "gbps": 8, "to": {"busyy": 1}},
                                       {"name": "busy", "gbps": 2, "to": {"ok": 1}}]}
    _raises(tmp_path, bw, "links[0].bandwidth.states[0].to.busyy", "unknown state")


def test_markov_duplicate_state_names_rejected(tmp_path):
    bw = {"kind": "markov", "states": [{"name": "ok", "gbps": 8, "to": {}},
                                       {"name": "ok", "gbps": 2, "to": {}}]}
    _raises(tmp_path, bw, "links[0].bandwidth.states", "distinct")


def test_unknown_bandwidth_kind_rejected(tmp_path):
    _raises(tmp_path, {"kind": "gaussian"}, "links[0].bandwidth.kind")


def _trace_error(tmp_path, csv_text, column="wan"):
    csv_path = tmp_path / "trace.csv"
    csv_path.write_text(csv_text, encoding="utf-8")
    path = _write_cluster(tmp_path, {"kind": "trace", "file": "trace.csv", "column": column})
    with pytest.raises(ConfigError) as info:
        hetpar.load_cluster(path)
    msg = str(info.value)
    assert "trace.csv" in msg, msg
    return msg


def test_trace_non_numeric_value_rejected(tmp_path):
    msg = _trace_error(tmp_path, "time_s,wan\n0,8\n10,fast\n20,7\n")
    assert "line 3" in msg


def test_trace_non_numeric_time_rejected(tmp_path):
    msg = _trace_error(tmp_path, "time_s,wan\n0,8\nlater,4\n")
    assert "line 3" in msg


def test_trace_negative_value_rejected(tmp_path):
    msg = _trace_error(tmp_path, "time_s,wan\n0,8\n10,7\n20,-1\n")
    assert "line 4" in msg and "positive" in msg


def test_trace_zero_value_rejected(tmp_path):
    msg = _trace_error(tmp_path, "time_s,wan\n0,0\n")
    assert "line 2" in msg and "positive" in msg


def test_trace_time_going_backwards_rejected(tmp_path):
    msg = _trace_error(tmp_path, "time_s,wan\n0,8\n20,7\n10,6\n")
    assert "line 4" in msg and "backwards" in msg


def test_trace_missing_column_rejected(tmp_path):
    msg = _trace_error(tmp_path, "time_s,lan\n0,8\n10,7\n", column="wan")
    assert "line 1" in msg and "wan" in msg


def test_trace_missing_time_column_rejected(tmp_path):
    msg = _trace_error(tmp_path, "t,wan\n0,8\n10,7\n")
    assert "line 1" in msg and "time_s" in msg


def test_trace_short_row_rejected(tmp_path):
    msg = _trace_error(tmp_path, "time_s,wan\n0,8\n10\n")
    assert "line 3" in msg


def test_trace_above_capacity_rejected(tmp_path):
    (tmp_path / "trace.csv").write_text("time_s,wan\n0,8\n10,12\n", encoding="utf-8")
    _raises(tmp_path, {"kind": "trace", "file": "trace.csv", "column": "wan"},
            "links[0].bandwidth.file", "capacity")


def test_trace_missing_file_rejected(tmp_path):
    path = _write_cluster(tmp_path, {"kind": "trace", "file": "nope.csv", "column": "wan"})
    with pytest.raises(ConfigError) as info:
        hetpar.load_cluster(path)
    assert "nope.csv" in str(info.value)
    assert "links[0].bandwidth.file" in str(info.value)
