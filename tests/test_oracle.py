"""The hindsight oracle (hetpar.dynamics.oracle), the switch rules
(hetpar.dynamics.switching) and the determinism of ``hetpar replan``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hetpar.cli.main import main
from hetpar.dynamics.experiment import (
    MEASURED_KEYS,
    oracle_row,
    run_scenario,
    summary_doc,
    summary_rows,
)
from hetpar.dynamics.oracle import failure_blind, hindsight
from hetpar.dynamics.scenario import build_timeline, failure_times, known_at, parse_scenario
from hetpar.dynamics.simulator import SimSettings, plan_hosts, simulate
from hetpar.dynamics.strategies import Planners, make_strategy
from hetpar.dynamics.switching import Belief, SwitchRule, parse_rule
from hetpar.errors import ConfigError
from hetpar.plan import Plan, Replica, Stage
from hetpar.problem.solution import strict_json, without_timings
from hetpar.workload.model import load_model
from hetpar.workload.training import load_training
from tests.test_dynamics import scenario_doc
from tests.test_replan import volatile_doc

NODES = 3000
ORACLE = 5000
ALL = ("static", "robust", "exact", "exact-rt")
EPS = 1e-9


def _run(doc, strategies=ALL, seeds=(0, 1), **kw):
    return run_scenario(parse_scenario(doc), strategies, seeds, node_limit=NODES,
                        oracle_nodes=ORACLE, **kw)


def _settings(sc, **kw):
    model, training = load_model(sc.model), load_training(sc.training)
    kw.setdefault("migration", sc.migration)
    return SimSettings(sc.iterations, training.global_batch * (training.seq_len or
                                                                model.seq_len),
                       params=float(model.total_params), **kw)


# ---- the oracle against the strategies ---------------------------------------------------

SCENARIOS = {
    # A plan's hosts lost and regained, checkpoints every two minutes.
    "host-loss": volatile_doc(iterations=3000, migration={"checkpoint_interval_s": 120},
                              events=[{"kind": "host_down", "host": "a-1", "at_s": 200,
                                       "until_s": 500},
                                      {"kind": "host_down", "host": "a-0", "at_s": 600,
                                       "until_s": 700}]),
    # Host uplinks and the WAN swinging between fast and slow.
    "bandwidth": volatile_doc(iterations=3000),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_no_strategy_beats_the_oracle(name):
    run = _run(SCENARIOS[name])
    assert len(run.oracles) == len(run.seeds)
    for i, oracle in enumerate(run.oracles):
        assert oracle.finished and not oracle.front_cut
        assert oracle.certified == oracle.states  # every state's plan proven optimal
        assert 0 < oracle.lower_bound_s <= oracle.wall_s
        for strategy, results in run.results.items():
            assert oracle.wall_s <= results[i].wall_s * (1 + EPS), (strategy, i)
        # Every plan a strategy ran is in the oracle's space.
        ran = {p for rs in run.results.values() for p in rs[i].plan_objects}
        assert ran <= set(oracle.plans)
        # The schedule: a start at 0, then one entry per switch, at state changes.
        starts = {s.start_s for s in run.timelines[i].states}
        assert oracle.schedule[0][0] == 0.0 and len(oracle.schedule) == oracle.switches + 1
        assert all(t in starts and 0 <= p < len(oracle.plans) for t, p in oracle.schedule)
        assert [t for t, _ in oracle.schedule] == sorted(t for t, _ in oracle.schedule)
    for row in summary_rows(run):
        assert row["regret_mean"] >= -EPS and row["regret_max"] >= row["regret_mean"] - EPS
    orow = oracle_row(run)
    assert orow["wall_s_mean"] <= min(r["wall_s_mean"] for r in summary_rows(run)) * (1 + EPS)
    assert orow["bound_gap_max"] >= 0


def test_a_bandwidth_run_where_switching_pays():
    """Seed 0 of the swinging uplinks: the oracle switches once, to a plan for the fast
    uplinks, and beats every strategy that kept its plan; its moves are priced like the
    strategies' (a restart and the bytes that change owner)."""
    run = _run(SCENARIOS["bandwidth"], seeds=(0,))
    (oracle,) = run.oracles
    assert oracle.switches >= 1 and oracle.migration_s > 30.0 * oracle.switches
    for name in ("static", "robust"):
        assert run.results[name][0].switches == 0
        assert oracle.wall_s < run.results[name][0].wall_s


def test_oracle_of_one_plan_and_a_constant_network_is_that_plans_run():
    doc = scenario_doc(iterations=3000, processes=[],
                       migration={"checkpoint_interval_s": 60})
    sc = parse_scenario(doc)
    tl = build_timeline(sc, np.random.default_rng(0))
    assert len(tl.states) == 1
    p = Planners(load_model(sc.model), load_training(sc.training), node_limit=NODES)
    settings = _settings(sc)
    static = simulate(tl, make_strategy("static", p), p, settings)
    (plan,) = static.plan_objects
    res = hindsight(tl, p, settings, [plan], node_limit=ORACLE)
    assert res.plans == (plan,) and res.switches == 0 and res.failures == 0
    assert res.schedule == ((0.0, 0),) and res.migration_s == 0
    assert res.wall_s == pytest.approx(static.wall_s, rel=1e-12)
    # That time: the iterations, and a checkpoint written every minute.
    it = p.iteration_time(plan, tl.states[0])
    writes = [s for s in static.segments if s.kind == "checkpoint"]
    assert len(writes) == int(static.wall_s // 60)
    assert static.wall_s == pytest.approx(3000 * it + len(writes) * settings.checkpoint_write_s)
    # Proven optimal, so the bound is the schedule itself.
    assert res.certified == res.states == 1
    assert res.lower_bound_s == pytest.approx(res.wall_s, rel=1e-12)
    # A slower plan beside it changes nothing.
    slower = Plan((Stage(12, 2, (Replica("b", (0, 1)),)),), micro_batches=8)
    assert p.iteration_time(slower, tl.states[0]) > it
    again = hindsight(tl, p, settings, [plan, slower], node_limit=ORACLE)
    assert again.wall_s == res.wall_s and again.schedule == ((0.0, 0),)


def test_the_oracle_avoids_a_failure_loss():
    """A host of the best plan is lost for a while: every strategy runs it and loses the
    work since the start (no checkpoint yet) and reloads; the oracle knows and runs a
    plan without that host from the start."""
    sc0 = parse_scenario(scenario_doc(processes=[]))
    p = Planners(load_model(sc0.model), load_training(sc0.training), node_limit=NODES)
    state = build_timeline(sc0, np.random.default_rng(0)).states[0]
    host = sorted(plan_hosts(p.exact(state).plan))[-1]
    run = _run(scenario_doc(iterations=3000, events=[
        {"kind": "host_down", "host": host, "at_s": 100, "until_s": 200}]), seeds=(0,))
    (oracle,) = run.oracles
    for name, (r,) in run.results.items():
        assert r.failures == 1 and r.lost_iterations > 0, name
        assert oracle.wall_s < r.wall_s
    assert oracle.failures == 0
    running = [oracle.plans[i] for t, i in oracle.schedule if t <= 100.0][-1]
    assert host not in plan_hosts(running)
    for row in summary_rows(run):
        assert row["regret_mean"] > 0 and row["failures_mean"] == 1
        assert row["lost_iterations_mean"] > 0


def _failure_run():
    """The scenario of ``test_the_oracle_avoids_a_failure_loss``: a host of the best plan
    lost from 100 s to 200 s, no checkpoint before it."""
    sc0 = parse_scenario(scenario_doc(processes=[]))
    p = Planners(load_model(sc0.model), load_training(sc0.training), node_limit=NODES)
    state = build_timeline(sc0, np.random.default_rng(0)).states[0]
    host = sorted(plan_hosts(p.exact(state).plan))[-1]
    doc = scenario_doc(iterations=3000, events=[
        {"kind": "host_down", "host": host, "at_s": 100, "until_s": 200}])
    return _run(doc, seeds=(0,)), host, parse_scenario(doc)


def test_the_failure_blind_oracle_meets_the_failure_like_the_strategies():
    """Not knowing of the failure, the failure-blind oracle runs the best plan, loses the
    work since the start like every strategy and reloads; the hindsight oracle, which
    knew, is faster. Every strategy's regret to it is below its regret to hindsight."""
    run, host, sc = _failure_run()
    (oracle,), (blind,) = run.oracles, run.blind_oracles
    assert blind is not oracle and blind.finished
    assert blind.failures == 1 and oracle.failures == 0
    running = [blind.plans[i] for t, i in blind.schedule if t < 100.0][-1]
    assert host in plan_hosts(running)
    assert oracle.wall_s < blind.wall_s
    # Both oracles draw on the same plans, so knowing more is never worse.
    assert set(blind.plans) <= set(oracle.plans)
    for row in summary_rows(run):
        assert row["regret_blind_mean"] < row["regret_mean"]
    # Static runs the same plan through the same failure: the blind oracle is no slower.
    (static,) = run.results["static"]
    assert blind.wall_s <= static.wall_s * (1 + EPS)
    orow = oracle_row(run)
    assert orow["blind_regret_mean"] == pytest.approx(blind.wall_s / oracle.wall_s - 1)
    # The timeline known at 0 is the run's up to the failure.
    known = build_timeline(known_at(sc, 0.0), np.random.default_rng(0))
    assert failure_times(sc) == (100.0,)
    assert all(not st.lost_hosts for st in known.states)
    assert [st.key for st in known.states if st.start_s < 100.0] == \
        [st.key for st in run.timelines[0].states if st.start_s < 100.0]


def test_without_failures_the_blind_oracle_is_the_hindsight_oracle():
    run = _run(SCENARIOS["bandwidth"], ("static",), seeds=(0,))
    assert run.blind_oracles == run.oracles
    (row,) = summary_rows(run)
    assert row["regret_blind_mean"] == row["regret_mean"]


def test_a_failure_after_the_job_ends_changes_nothing():
    """A host lost long after every schedule has finished: the failure-blind oracle's
    first plan already finishes, so it is the hindsight oracle's schedule."""
    sc0 = parse_scenario(scenario_doc(processes=[]))
    p = Planners(load_model(sc0.model), load_training(sc0.training), node_limit=NODES)
    state = build_timeline(sc0, np.random.default_rng(0)).states[0]
    host = sorted(plan_hosts(p.exact(state).plan))[-1]
    doc = scenario_doc(iterations=300, horizon_s=7200, events=[
        {"kind": "host_down", "host": host, "at_s": 7000, "until_s": 7100}])
    run = _run(doc, ("static",), seeds=(0,))
    (oracle,), (blind,) = run.oracles, run.blind_oracles
    assert failure_times(parse_scenario(doc)) == (7000.0,)
    assert oracle.wall_s < 7000.0 and blind is not oracle
    assert blind.wall_s == oracle.wall_s and blind.schedule == oracle.schedule
    assert blind.failures == 0


def test_failure_blind_by_hand_on_the_host_loss_scenario():
    """Two failures: the blind oracle re-plans at each, is never faster than the
    hindsight oracle, and from the timelines known at each failure it reproduces what
    ``run_scenario`` reports."""
    doc = SCENARIOS["host-loss"]
    sc = parse_scenario(doc)
    run = _run(doc, seeds=(0,))
    (oracle,), (blind,) = run.oracles, run.blind_oracles
    assert failure_times(sc) == (200.0, 600.0)
    assert oracle.wall_s <= blind.wall_s * (1 + EPS)
    p = Planners(load_model(sc.model), load_training(sc.training), node_limit=NODES)
    ran = [q for (r,) in run.results.values() for q in r.plan_objects]
    known = [(t, build_timeline(known_at(sc, t), np.random.default_rng(0)))
             for t in (0.0, 200.0, 600.0)]
    again = failure_blind(run.timelines[0], known, p, run.settings, ran, node_limit=ORACLE)
    assert again.wall_s == blind.wall_s and again.schedule == blind.schedule
    with pytest.raises(ValueError):
        failure_blind(run.timelines[0], known[1:], p, run.settings, ran, node_limit=ORACLE)


def test_an_oracle_of_cut_searches_still_bounds_every_schedule():
    """State searches stopped after 5 nodes: no state is proven, the bound comes from
    their lower bounds (below the schedule's time), and the schedule, over the
    strategies' plans too, is still no worse than theirs."""
    doc = SCENARIOS["host-loss"]
    run = _run(doc, seeds=(0,))
    sc = parse_scenario(doc)
    p = Planners(load_model(sc.model), load_training(sc.training), node_limit=NODES)
    ran = [q for (r,) in run.results.values() for q in r.plan_objects]
    cut = hindsight(run.timelines[0], p, run.settings, ran, node_limit=5)
    assert cut.certified == 0 < cut.states
    assert 0 < cut.lower_bound_s < cut.wall_s
    assert cut.lower_bound_s <= run.oracles[0].lower_bound_s
    assert run.oracles[0].wall_s <= cut.wall_s <= min(r.wall_s for (r,) in
                                                      run.results.values()) * (1 + EPS)


def test_no_oracle_no_regret():
    run = _run(SCENARIOS["bandwidth"], ("static",), seeds=(0,), oracle=False)
    assert run.oracles == [] and oracle_row(run) is None
    (row,) = summary_rows(run)
    assert "regret_mean" not in row
    assert summary_doc(run)["hindsight"] == {"summary": None, "runs": [],
                                             "failure_blind_runs": []}


# ---- determinism -------------------------------------------------------------------------

def _table(run):
    return strict_json(without_timings(summary_doc(run), MEASURED_KEYS))


def test_two_runs_give_identical_tables():
    doc = SCENARIOS["host-loss"]
    a, b = _run(doc), _run(doc)
    assert summary_rows(a) == summary_rows(b)
    assert oracle_row(a) == oracle_row(b)
    assert _table(a) == _table(b)


def _write_scenario(tmp_path, doc):
    import yaml

    p = tmp_path / "sc.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_cli_replan_json_twice_is_identical(tmp_path, capsys):
    sc = _write_scenario(tmp_path, SCENARIOS["host-loss"])
    args = ["replan", "--scenario", str(sc), "--strategies", ",".join(ALL), "--seeds", "0",
            "--node-limit", str(NODES), "--out", str(tmp_path / "o"), "--json"]
    outs = []
    for _ in range(2):
        assert main(args) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    data = json.loads(outs[0])
    assert data["switch_rule"] == "recent:600"
    assert data["hindsight"]["summary"]["strategy"] == "hindsight"
    assert {r["strategy"] for r in data["summary"]} == set(ALL)
    assert all(r["regret_mean"] >= -EPS for r in data["summary"])
    assert not MEASURED_KEYS & set(data)


def test_cli_replan_rule_and_checkpoint_flags(tmp_path, capsys):
    sc = _write_scenario(tmp_path, scenario_doc(iterations=300))
    base = ["replan", "--scenario", str(sc), "--strategies", "static", "--node-limit",
            str(NODES), "--out", str(tmp_path / "o"), "--json"]
    for flags, rule in ((["--switch-rule", "persist"], "persist"),
                        (["--lookahead", "300"], "lookahead:300"),
                        (["--switch-rule", "lookahead:90"], "lookahead:90")):
        assert main(base + flags + ["--no-oracle", "--checkpoint-interval", "45"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["switch_rule"] == rule
        assert data["migration"]["checkpoint_interval_s"] == 45
        assert data["hindsight"]["runs"] == []


@pytest.mark.parametrize("flags,names", [
    (["--switch-rule", "eager"], "--switch-rule"),
    (["--switch-rule", "lookahead:0"], "--switch-rule"),
    (["--switch-rule", "lookahead:soon"], "--switch-rule"),
    (["--switch-rule", "recent:0"], "--switch-rule"),
    (["--lookahead", "0"], "--lookahead"),
    (["--checkpoint-interval", "-5"], "--checkpoint-interval"),
])
def test_cli_replan_bad_rule_exit_2(capsys, flags, names):
    rc = main(["replan", "--scenario", "stable-dc", "--strategies", "static", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and names in err and len(err.strip().splitlines()) == 1


# ---- switch rules ------------------------------------------------------------------------

A = Plan((Stage(12, 2, (Replica("a-0", (0, 1)),)),), micro_batches=1)
B = Plan((Stage(12, 2, (Replica("b", (0, 1)),)),), micro_batches=1)
# Iterations per second of each plan in states 0, 1, 2 (0: it could not run).
RATES = {A: (1.0, 0.0, 0.5), B: (0.5, 0.5, 1.0)}


def _belief(*durations):
    belief = Belief(lambda plan, k: RATES[plan][k])
    for d in durations:
        belief.observe(d)
    return belief


def test_persist_saves_the_whole_rest_at_the_new_speeds():
    rule = SwitchRule("persist")
    assert rule.saving_s(A, 2.0, B, 1.0, 1000, _belief(100, 300), 2) == pytest.approx(1000)
    assert rule.remaining_s(A, 2.0, 1000, _belief(100, 300), 2) == pytest.approx(2000)
    assert rule.saving_s(B, 1.0, A, 2.0, 1000, _belief(), 0) == pytest.approx(-1000)
    assert rule.remaining_s(A, math.inf, 10, _belief(), 0) == math.inf


def test_lookahead_saves_over_its_window():
    rule = SwitchRule("lookahead", 600.0)
    assert rule.name == "lookahead:600"
    # 600 s at half the time per iteration.
    assert rule.saving_s(A, 2.0, B, 1.0, 1000, _belief(100, 300), 2) == pytest.approx(300)
    # The rest of the run (100 iterations: 200 s) is shorter than the window.
    assert rule.saving_s(A, 2.0, B, 1.0, 100, _belief(), 2) == pytest.approx(100)
    assert rule.saving_s(A, 1.0, B, 2.0, 1000, _belief(), 2) == pytest.approx(-600)
    assert rule.saving_s(A, math.inf, B, 1.0, 10, _belief(), 2) == math.inf


def test_expected_believes_the_past():
    """States 0 and 1 lasted 100 s and 300 s: the state just entered (2) is expected to
    last their mean, 200 s, then each plan to run at its time-weighted mean throughput
    over the states seen (state 2 counted for 200 s)."""
    rule = SwitchRule("expected")
    assert rule.kind == "expected" and rule.name == "expected"
    assert SwitchRule().name == "recent:600"  # the default
    belief = _belief(100, 300)
    assert belief.holding_s() == pytest.approx(200)
    assert belief.mean_rate(A, 2) == pytest.approx((100 * 1 + 300 * 0 + 200 * 0.5) / 600)
    assert belief.mean_rate(B, 2) == pytest.approx((100 * .5 + 300 * .5 + 200 * 1) / 600)
    # Finishing 1000 iterations from now (the forced choice's yardstick). A: 200 s at
    # 0.5/s (100 iterations), the other 900 at 1/3 per second.
    assert rule.remaining_s(A, 2.0, 1000, belief, 2) == pytest.approx(200 + 900 * 3)
    # B: 200 s at 1/s, the other 800 at 2/3 per second.
    assert rule.remaining_s(B, 1.0, 1000, belief, 2) == pytest.approx(200 + 800 * 1.5)
    # The saving of B over A: the 100 iterations A would run while the state lasts take
    # 1 s less each, the other 900 run at the mean throughputs (3 s against 1.5 s each).
    assert rule.saving_s(A, 2.0, B, 1.0, 1000, belief, 2) == pytest.approx(
        100 * 1.0 + 900 * (3 - 1.5))
    # Work done within the expected holding time: as persist.
    assert rule.saving_s(A, 2.0, B, 1.0, 50, belief, 2) == pytest.approx(50)
    # Before any state has ended the new one is believed to last: as persist.
    fresh = _belief()
    assert fresh.holding_s() == math.inf
    for work in (10, 1000):
        assert rule.saving_s(A, 2.0, B, 1.0, work, fresh, 0) == pytest.approx(
            SwitchRule("persist").saving_s(A, 2.0, B, 1.0, work, fresh, 0))
    assert rule.remaining_s(A, 2.0, 1000, fresh, 0) == pytest.approx(2000)
    # The sums are kept per plan: asking again, or after another state, agrees with a
    # belief built from scratch.
    assert belief.mean_rate(A, 2) == pytest.approx(_belief(100, 300).mean_rate(A, 2))
    belief.observe(200)
    assert belief.mean_rate(B, 2) == pytest.approx(_belief(100, 300, 200).mean_rate(B, 2))


def test_expected_counts_the_way_back_for_a_plan_better_only_now():
    """B is faster in the state just entered but much slower on average: its saving is
    what it gains while the state lasts, less the switch back at its end (``back_s``),
    not the loss of running it for the rest of the run."""
    rates = {A: (1.0, 1.0, 0.5), B: (0.1, 0.1, 1.0)}
    belief = Belief(lambda plan, k: rates[plan][k])
    belief.observe(100)
    belief.observe(300)
    assert belief.mean_rate(A, 2) == pytest.approx(500 / 600)
    assert belief.mean_rate(B, 2) == pytest.approx(240 / 600)
    rule = SwitchRule("expected")
    # While the state lasts (200 s): the 100 iterations A would run, 1 s faster each.
    assert rule.saving_s(A, 2.0, B, 1.0, 1000, belief, 2, 30.0) == pytest.approx(100 - 30)
    assert rule.saving_s(A, 2.0, B, 1.0, 1000, belief, 2, 1e6) == pytest.approx(
        100 + 900 / (5 / 6) - 900 / 0.4)
    # The other way (B running, A offered) A is worse now, better later.
    assert rule.saving_s(B, 1.0, A, 2.0, 1000, belief, 2, 30.0) == pytest.approx(
        200 * (1.0 - 2.0) + 800 / 0.4 - 800 / (5 / 6))


def test_rules_on_a_current_plan_that_cannot_run():
    for rule in (SwitchRule(), SwitchRule("expected"), SwitchRule("persist"),
                 SwitchRule("lookahead", 60.0)):
        assert rule.saving_s(A, math.inf, B, 1.0, 10, _belief(100, 300), 2) == math.inf
        assert rule.remaining_s(A, math.inf, 10, _belief(100, 300), 2) == math.inf
    # A plan that ran nowhere before finishes at its mean throughput, now included.
    never = Plan((Stage(12, 2, (Replica("a-1", (0, 1)),)),), micro_batches=1)
    rates = {**RATES, never: (0.0, 0.0, 0.5)}
    belief = Belief(lambda plan, k: rates[plan][k])
    belief.observe(100)
    belief.observe(100)
    assert SwitchRule("expected").remaining_s(never, 2.0, 1000, belief, 2) == pytest.approx(
        100 + (1000 - 50) / (0.5 * 100 / 300))


def test_recent_weights_the_past_by_its_recency():
    """``recent:H``: each past second counts ``2 ** (-age / H)``; states 0 (100 s, 300 s
    ago at its end) and 1 (300 s, just ended), then the state just entered (2) for the
    mean duration. A long half-life is ``expected``; a short one believes the latest."""
    ln2 = math.log(2.0)

    def weight(h, start, end, now=400.0):
        return h / ln2 * (2 ** (-(now - end) / h) - 2 ** (-(now - start) / h))

    h = 150.0
    recent = Belief(lambda plan, k: RATES[plan][k], half_life_s=h)
    for d in (100, 300):
        recent.observe(d)
    w0, w1 = weight(h, 0, 100), weight(h, 100, 400)
    assert recent.mean_rate(A, 2) == pytest.approx(
        (w0 * 1.0 + w1 * 0.0 + 200 * 0.5) / (w0 + w1 + 200))
    # The memo decays what it summed: a belief updated state by state agrees with one
    # built at once.
    step = Belief(lambda plan, k: RATES[plan][k], half_life_s=h)
    step.observe(100)
    step.mean_rate(A, 1)
    step.observe(300)
    assert step.mean_rate(A, 2) == pytest.approx(recent.mean_rate(A, 2), rel=1e-12)
    # State 0, where A ran fastest, is long past: A is believed slower than by expected.
    assert recent.mean_rate(A, 2) < _belief(100, 300).mean_rate(A, 2)
    slow = Belief(lambda plan, k: RATES[plan][k], half_life_s=1e9)
    for d in (100, 300):
        slow.observe(d)
    assert slow.mean_rate(A, 2) == pytest.approx(_belief(100, 300).mean_rate(A, 2), rel=1e-6)
    rule = parse_rule("recent:150")
    assert rule == SwitchRule("recent", 150.0) and rule.name == "recent:150"
    assert rule.belief(lambda plan, k: 1.0).half_life_s == 150.0
    assert SwitchRule("expected").belief(lambda plan, k: 1.0).half_life_s is None


@pytest.mark.parametrize("text,rule", [
    ("expected", SwitchRule("expected")),
    ("recent:600", SwitchRule("recent", 600.0)),
    (" persist ", SwitchRule("persist")),
    ("lookahead", SwitchRule("lookahead", 600.0)),
    ("lookahead:600", SwitchRule("lookahead", 600.0)),
    ("lookahead:1e3", SwitchRule("lookahead", 1000.0)),
    ("lookahead:0.5", SwitchRule("lookahead", 0.5)),
])
def test_parse_rule(text, rule):
    assert parse_rule(text) == rule
    assert parse_rule(rule.name) == rule


@pytest.mark.parametrize("text", ["", "eager", "Expected", "persist:5", "lookahead:0",
                                  "lookahead:-5", "lookahead:soon", "lookahead:inf",
                                  "lookahead:nan", "recent", "recent:", "recent:0",
                                  "recent:-60", "recent:soon", "recent:inf"])
def test_parse_rule_errors(text):
    with pytest.raises(ConfigError, match="--switch-rule"):
        parse_rule(text)


@pytest.mark.parametrize("text", ["lookahead1200", "lookaheads"])
def test_parse_rule_rejects_lookahead_without_a_colon(text):
    with pytest.raises(ConfigError):
        parse_rule(text)
