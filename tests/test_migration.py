"""What a switch between two plans moves (hetpar.dynamics.migration): bytes that change
owner, over which links, and how long that takes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpar.cluster.topology import parse_cluster
from hetpar.costmodel import load_constants
from hetpar.dynamics.migration import Flows, migration_flows, migration_s, unit_params
from hetpar.dynamics.scenario import Migration
from hetpar.plan import Plan, Replica, Stage, validate_plan
from hetpar.workload.model import load_model
from hetpar.workload.training import load_training
from tests.test_dynamics import CLUSTER

MODEL = load_model("gpt3-125m")
TRAINING = load_training("small-batch")
TOPO = parse_cluster(CLUSTER)
CONSTANTS = load_constants()
BPP = 14.0  # bytes per parameter: bf16 weights, fp32 master copy, Adam's two moments
W = CONSTANTS.weight_bytes
O = BPP - W  # optimizer bytes per parameter
P = float(unit_params(MODEL).sum())
LINKS = [f"{lk.a}--{lk.b}" for lk in TOPO.links]


def _rep(host, *gpus):
    return Replica(host, tuple(gpus))


def _plan(*stages, m=1, zero=0):
    plan = Plan(tuple(Stage(layers, tp, tuple(reps)) for layers, tp, reps in stages),
                micro_batches=m, zero=zero)
    validate_plan(plan, TOPO, MODEL, TRAINING)
    return plan


TP2_A0 = _plan((12, 2, [_rep("a-0", 0, 1)]))
TP2_B = _plan((12, 2, [_rep("b", 0, 1)]))
TP2_A1 = _plan((12, 2, [_rep("a-1", 0, 1)]))
TP2_A0_SWAPPED = _plan((12, 2, [_rep("a-0", 1, 0)]))
DP2_HOSTS = _plan((12, 1, [_rep("a-0", 0), _rep("a-1", 0)]))
DP2_HOSTS_Z1 = _plan((12, 1, [_rep("a-0", 0), _rep("a-1", 0)]), zero=1)
DP2_HOSTS_Z1_SWAPPED = _plan((12, 1, [_rep("a-1", 0), _rep("a-0", 0)]), zero=1)
PLANS = [
    TP2_A0, TP2_B, TP2_A1, TP2_A0_SWAPPED, DP2_HOSTS, DP2_HOSTS_Z1, DP2_HOSTS_Z1_SWAPPED,
    _plan((12, 1, [_rep("a-0", 0), _rep("a-0", 1)]), zero=1),
    _plan((6, 1, [_rep("a-0", 0)]), (6, 1, [_rep("b", 1)]), m=4),
    _plan((4, 2, [_rep("a-0", 0, 1)]), (4, 2, [_rep("a-1", 0, 1)]),
          (4, 2, [_rep("b", 0, 1)]), m=8),
    _plan((12, 1, [_rep("a-0", 0), _rep("a-0", 1), _rep("a-1", 0), _rep("b", 0)]), m=2,
          zero=1),
    _plan((12, 2, [_rep("a-1", 0, 1), _rep("b", 0, 1)]), zero=1),
    _plan((5, 1, [_rep("b", 0), _rep("b", 1)]), (7, 2, [_rep("a-1", 1, 0)]), m=2),
]


def flows(a: Plan, b: Plan) -> Flows:
    return migration_flows(a, b, TOPO, MODEL, CONSTANTS, BPP)


def needed(plan: Plan) -> float:
    """The model state the GPUs of ``plan`` hold: every replica the weights of its
    stage's layers, and the optimizer state too (ZeRO-1: one shard of it each)."""
    params = unit_params(MODEL)
    out, first = 0.0, 0
    for s in plan.stages:
        p = float(params[first:first + s.layers].sum())
        first += s.layers
        out += p * (s.dp * W + (O if plan.zero else s.dp * O))
    return out


def bandwidth(**gbps: float) -> np.ndarray:
    """Every link at 100 Gb/s but those named (``s1__s2=5`` for link s1--s2)."""
    out = np.full(len(LINKS), 100.0)
    for name, v in gbps.items():
        out[LINKS.index(name.replace("__", "--").replace("_", "-"))] = v
    return out


def test_unit_params_add_up_to_the_model():
    params = unit_params(MODEL)
    assert params.shape == (MODEL.layers,)
    # The last stage holds its own copy of the head, tied to the embedding or not.
    assert MODEL.tied_embeddings
    assert P == pytest.approx(MODEL.total_params + MODEL.head_params, rel=1e-9)
    assert params[0] > params[1] == params[-2] < params[-1]  # embedding, head + norm


@pytest.mark.parametrize("plan", PLANS, ids=range(len(PLANS)))
def test_the_same_plan_moves_nothing(plan):
    f = flows(plan, plan)
    assert f.moved_bytes == 0 and f.network_bytes == 0 and f.intra_bytes == 0
    assert not f.channel_bytes.any() and f.intra_s == 0
    assert f.local_bytes == pytest.approx(needed(plan), rel=1e-9)
    assert f.seconds(bandwidth()) == 0 and f.seconds(bandwidth(s1__s2=1e-3)) == 0
    assert migration_s(f, bandwidth(), Migration(restart_s=30.0)) == 30.0


def test_the_same_plan_on_another_host_moves_the_whole_state_over_the_network():
    f = flows(TP2_A0, TP2_B)
    assert f.network_bytes == pytest.approx(P * BPP, rel=1e-9)
    assert f.intra_bytes == 0 and f.local_bytes == 0 and f.intra_s == 0
    # Over a-0 -> s1 -> s2 -> b: the same bytes on one channel of each of the 3 links.
    assert np.count_nonzero(f.channel_bytes) == 3
    assert f.channel_bytes.max() == pytest.approx(P * BPP, rel=1e-9)
    # The slowest link of the route sets the time.
    assert f.seconds(bandwidth(s1__s2=5)) == pytest.approx(P * BPP / (5e9 / 8), rel=1e-9)
    assert f.seconds(bandwidth()) == pytest.approx(P * BPP / (100e9 / 8), rel=1e-9)
    # Within site a the WAN is not on the route: its bandwidth does not matter.
    g = flows(TP2_A0, TP2_A1)
    assert g.network_bytes == pytest.approx(P * BPP, rel=1e-9)
    assert np.count_nonzero(g.channel_bytes) == 2
    assert g.seconds(bandwidth(s1__s2=1e-3)) == g.seconds(bandwidth())
    assert g.seconds(bandwidth(a_1__s1=10)) == pytest.approx(P * BPP / (10e9 / 8), rel=1e-9)
    assert migration_s(g, bandwidth(), Migration(restart_s=7.0)) == pytest.approx(
        g.seconds(bandwidth()) + 7.0)


def test_reordered_gpus_move_over_the_scale_up_fabric():
    """The same host, the tp slices on the other GPUs: every byte moves, none over the
    network, in the busiest GPU's bytes over its per-GPU bandwidth."""
    f = flows(TP2_A0, TP2_A0_SWAPPED)
    assert f.network_bytes == 0 and not f.channel_bytes.any() and f.local_bytes == 0
    assert f.intra_bytes == pytest.approx(P * BPP, rel=1e-9)
    host = TOPO.hosts[TOPO.host_index["a-0"]]
    assert f.intra_s == pytest.approx(P * BPP / 2 / (host.intra_GBps * 1e9), rel=1e-9)
    assert f.seconds(bandwidth()) == f.intra_s == f.seconds(bandwidth(a_0__s1=1e-3))


@pytest.mark.parametrize("i", range(len(PLANS)))
@pytest.mark.parametrize("j", range(len(PLANS)))
def test_state_is_conserved(i, j):
    """Every byte the new plan holds was either in place or moved once; nothing moves
    that the new plan does not hold."""
    a, b = PLANS[i], PLANS[j]
    f = flows(a, b)
    assert f.local_bytes + f.moved_bytes == pytest.approx(needed(b), rel=1e-9)
    assert min(f.network_bytes, f.intra_bytes, f.local_bytes) >= 0
    assert (f.moved_bytes == 0) == (f.local_bytes == pytest.approx(needed(b), rel=1e-9))
    # A byte crosses at least one channel (a host's uplink) for each network move.
    assert f.channel_bytes.sum() >= f.network_bytes * (1 - 1e-9)
    assert f.channel_bytes.max() <= f.network_bytes * (1 + 1e-9)


@pytest.mark.parametrize("a,b", [(TP2_A0, TP2_B), (TP2_A0, TP2_A1), (TP2_B, TP2_A1),
                                 (TP2_A0, TP2_A0_SWAPPED),
                                 (DP2_HOSTS_Z1, DP2_HOSTS_Z1_SWAPPED)])
def test_moves_between_mirror_plans_are_symmetric(a, b):
    """Plans that only trade places move as much either way, over the same links (in
    opposite directions)."""
    ab, ba = flows(a, b), flows(b, a)
    assert ab.moved_bytes == pytest.approx(ba.moved_bytes, rel=1e-9)
    assert ab.network_bytes == pytest.approx(ba.network_bytes, rel=1e-9)
    assert ab.intra_s == pytest.approx(ba.intra_s, rel=1e-9)
    per_link = lambda f: np.sort(f.channel_bytes.reshape(-1, 2).sum(axis=1))
    assert np.allclose(per_link(ab), per_link(ba))
    for bw in (bandwidth(), bandwidth(s1__s2=3), bandwidth(a_0__s1=7, b__s2=2)):
        assert ab.seconds(bw) == pytest.approx(ba.seconds(bw), rel=1e-9)


def test_growing_a_plan_moves_only_to_the_new_replica():
    """One replica more (on a-1): it fetches the whole state; shrinking back moves
    nothing (a-0 keeps what it held)."""
    one = _plan((12, 1, [_rep("a-0", 0)]))
    grow = flows(one, DP2_HOSTS)
    assert grow.network_bytes == pytest.approx(P * BPP, rel=1e-9)
    assert grow.local_bytes == pytest.approx(P * BPP, rel=1e-9)
    shrink = flows(DP2_HOSTS, one)
    assert shrink.moved_bytes == 0 and shrink.local_bytes == pytest.approx(P * BPP, rel=1e-9)


def test_zero1_holds_optimizer_shards():
    # Zero-0 -> ZeRO-1 on the same GPUs: every shard is a part of what each GPU held.
    f = flows(DP2_HOSTS, DP2_HOSTS_Z1)
    assert f.moved_bytes == 0 and not f.channel_bytes.any()
    assert f.local_bytes == pytest.approx(2 * P * W + P * O, rel=1e-9)
    # Back to zero-0: each replica fetches the shard it lacks, half the optimizer state.
    g = flows(DP2_HOSTS_Z1, DP2_HOSTS)
    assert g.network_bytes == pytest.approx(P * O, rel=1e-9) and g.intra_bytes == 0
    assert g.local_bytes == pytest.approx(2 * P * W + P * O, rel=1e-9)
    # Replicas trading places keep the weights (both hold them) but trade their shards.
    h = flows(DP2_HOSTS_Z1, DP2_HOSTS_Z1_SWAPPED)
    assert h.network_bytes == pytest.approx(P * O, rel=1e-9)
    assert h.local_bytes == pytest.approx(2 * P * W, rel=1e-9)
    # Shards within one host move over the scale-up fabric.
    one_host = PLANS[7]
    k = flows(one_host, _plan((12, 1, [_rep("a-0", 1), _rep("a-0", 0)]), zero=1))
    assert k.network_bytes == 0 and k.intra_bytes == pytest.approx(P * O, rel=1e-9)


def test_bytes_per_param_scale_the_optimizer_state():
    light = migration_flows(TP2_A0, TP2_B, TOPO, MODEL, CONSTANTS, bytes_per_param=W)
    assert light.network_bytes == pytest.approx(P * W, rel=1e-9)  # weights only
    z = migration_flows(DP2_HOSTS_Z1, DP2_HOSTS, TOPO, MODEL, CONSTANTS, bytes_per_param=W)
    assert z.moved_bytes == 0  # no optimizer state to gather


PAIRS = st.tuples(st.sampled_from(PLANS), st.sampled_from(PLANS))
LINK_BW = st.lists(st.floats(0.01, 400.0), min_size=len(LINKS), max_size=len(LINKS))
LAWS = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@LAWS
@given(PAIRS, LINK_BW, st.lists(st.floats(0.0, 400.0), min_size=len(LINKS),
                                max_size=len(LINKS)))
def test_more_bandwidth_is_never_slower(pair, bw, extra):
    f = flows(*pair)
    slow, fast = np.array(bw), np.array(bw) + np.array(extra)
    assert f.seconds(fast) <= f.seconds(slow) * (1 + 1e-12)
    assert f.seconds(fast) >= f.intra_s and math.isfinite(f.seconds(slow))


@LAWS
@given(PAIRS, LINK_BW, st.floats(1.0, 1000.0))
def test_network_seconds_scale_inversely_with_bandwidth(pair, bw, k):
    f = flows(*pair)
    bw = np.array(bw)
    network = Flows(f.channel_bytes, 0.0, f.network_bytes, 0.0, 0.0)  # without intra
    assert f.seconds(bw) == pytest.approx(max(f.intra_s, network.seconds(bw)), rel=1e-12)
    assert network.seconds(bw * k) == pytest.approx(network.seconds(bw) / k, rel=1e-9)
    assert f.seconds(bw * k) == pytest.approx(max(f.intra_s, network.seconds(bw) / k),
                                              rel=1e-9)


def test_planners_price_switches_on_the_states_cluster():
    """``Planners.flows`` is ``migration_flows`` on the state's cluster, memoised per
    topology: every bandwidth state of it shares the bytes."""
    from hetpar.dynamics.scenario import build_timeline, parse_scenario
    from hetpar.dynamics.strategies import Planners
    from tests.test_dynamics import scenario_doc

    sc = parse_scenario(scenario_doc())
    tl = build_timeline(sc, np.random.default_rng(0))
    p = Planners(MODEL, TRAINING, node_limit=100)
    s0, s1 = tl.states[0], tl.states[1]
    f = p.flows(TP2_A0, TP2_B, s0)
    assert p.flows(TP2_A0, TP2_B, s1) is f
    ref = migration_flows(TP2_A0, TP2_B, s0.cluster, MODEL, p.cost_model(s0).constants,
                          sc.migration.bytes_per_param)
    assert f.network_bytes == ref.network_bytes and np.array_equal(f.channel_bytes,
                                                                   ref.channel_bytes)
    assert f.seconds(s0.bandwidth) != f.seconds(s1.bandwidth)  # the WAN changed
