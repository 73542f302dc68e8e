"""Training-run simulator, strategies and ``hetpar replan``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hetpar.cli.main import main
from hetpar.dynamics.experiment import robust_states, run_scenario, summary_rows
from hetpar.dynamics.scenario import Migration, build_timeline, parse_scenario
from hetpar.dynamics.simulator import SimSettings, simulate
from hetpar.dynamics.strategies import EXACT_NODE_S, Planners, make_strategy
from hetpar.dynamics.switching import SwitchRule
from hetpar.errors import HetparError
from hetpar.workload.model import load_model
from hetpar.workload.training import load_training
from tests.test_dynamics import CLUSTER, scenario_doc

# Search steps of an exact search: these 6-GPU instances are proven optimal in ~200.
NODES = 3000
ORACLE = 5000


def _run(doc, strategies=("static", "exact"), seeds=(0,), **kw):
    sc = parse_scenario(doc)
    kw.setdefault("node_limit", NODES)
    kw.setdefault("oracle_nodes", ORACLE)
    return run_scenario(sc, strategies, seeds, **kw)


# Host uplinks that swing together between fast and slow: with the default training
# spec (a batch of 32) the best plan spans a-0 and a-1 while they are fast and keeps to
# one host while they are slow, so re-planners switch.
SWINGS = [{"kind": "markov", "links": ["a-0--s1", "a-1--s1", "b--s2"], "shared": True,
           "states": [{"name": "fast", "gbps": 100, "to": {"slow": 0.01}},
                      {"name": "slow", "gbps": 1, "to": {"fast": 0.01}}]},
          {"kind": "markov", "links": ["s1--s2"], "states": [
              {"name": "ok", "gbps": 40, "to": {"bad": 0.01}},
              {"name": "bad", "gbps": 5, "to": {"ok": 0.01}}]}]


def volatile_doc(**extra):
    return scenario_doc(**{"training": "default", "processes": SWINGS, **extra})


def _planners(sc, **kw):
    kw.setdefault("node_limit", NODES)
    return Planners(load_model(sc.model), load_training(sc.training), **kw)


def test_constant_network_nobody_switches_and_tokens_add_up():
    # Changes of no consequence (two levels above what any plan needs) every minute.
    doc = scenario_doc(processes=[{"kind": "markov", "links": ["a-0--s1", "a-1--s1", "b--s2"],
                                   "shared": True, "states": [
                                       {"name": "x", "gbps": 100, "to": {"y": 0.05}},
                                       {"name": "y", "gbps": 99.9, "to": {"x": 0.05}}]}],
                       iterations=3000)
    run = _run(doc, ("static", "robust", "exact", "exact-rt"))
    assert len(run.timelines[0].states) > 3
    tokens_per_iter = load_training("small-batch").global_batch * load_model("gpt3-125m").seq_len
    for name, results in run.results.items():
        r = results[0]
        assert r.finished and r.switches == 0, name
        assert r.tokens == pytest.approx(3000 * tokens_per_iter)
        assert r.iterations == pytest.approx(3000)
    # Realistic exact pays its searches as stall (a modelled time per search node), the
    # oracle does not.
    rt = run.results["exact-rt"][0]
    assert rt.planning_charged_s > 0
    assert rt.planning_charged_s / EXACT_NODE_S == pytest.approx(
        round(rt.planning_charged_s / EXACT_NODE_S))
    assert run.results["exact"][0].planning_charged_s == 0
    assert rt.wall_s > run.results["exact"][0].wall_s
    # Nothing to gain: the hindsight schedule is the plan everybody ran.
    (oracle,) = run.oracles
    assert oracle.switches == 0
    assert oracle.wall_s == pytest.approx(run.results["exact"][0].wall_s)


def test_static_switches_only_when_invalidated():
    doc = scenario_doc(iterations=3000, events=[
        {"kind": "host_down", "host": "a-0", "at_s": 120, "until_s": 600},
        {"kind": "host_down", "host": "a-1", "at_s": 120, "until_s": 600}])
    run = _run(doc, ("static", "robust", "exact"))
    for name in ("static", "robust"):
        r = run.results[name][0]
        assert r.switches == r.forced_switches
        # Every switch happens in a state where the previous plan had become invalid.
        for ev in r.events[1:]:
            assert ev["was_s"] is None and ev["topology"]
    st = run.results["static"][0]
    assert st.finished and st.forced_switches >= 1
    # Its hosts lost, static restarts from the checkpoint (the start: none written yet)
    # on the new plan: every switch is a recovery costing the reload.
    assert st.failures == st.switches == sum(ev["failure"] for ev in st.events)
    assert st.migration_s == pytest.approx(st.switches * run.settings.reload_s)
    assert st.lost_iterations > 0 and st.moved_bytes == 0
    assert [s.kind for s in st.segments].count("recover") == st.failures


def _accounting(r, settings):
    """wall = run + migrations (recoveries included) + planning charged + checkpoint
    writes + no-plan stall; the segments tile [0, wall] in order."""
    by_kind = {}
    for seg in r.segments:
        by_kind[seg.kind] = by_kind.get(seg.kind, 0.0) + seg.end_s - seg.start_s
    run_s = by_kind.get("run", 0.0)
    assert by_kind.get("migrate", 0.0) + by_kind.get("recover", 0.0) == pytest.approx(
        r.migration_s)
    assert by_kind.get("plan", 0.0) == pytest.approx(r.planning_charged_s)
    assert by_kind.get("stall", 0.0) == pytest.approx(r.stall_s)
    ckpt = by_kind.get("checkpoint", 0.0)
    assert ckpt == pytest.approx(
        settings.checkpoint_write_s * [s.kind for s in r.segments].count("checkpoint"))
    assert r.wall_s == pytest.approx(run_s + r.migration_s + r.planning_charged_s + ckpt
                                     + r.stall_s)
    t = 0.0
    for seg in r.segments:
        assert seg.start_s == pytest.approx(t, abs=1e-6) and seg.end_s >= seg.start_s
        t = seg.end_s
    assert t == pytest.approx(r.wall_s)
    iters = sum((s.end_s - s.start_s) / s.iter_time_s for s in r.segments if s.kind == "run")
    assert iters == pytest.approx(settings.iterations + r.lost_iterations)
    return by_kind


def test_switch_rule_and_time_accounting():
    sc = parse_scenario(volatile_doc(iterations=2000))
    tl = build_timeline(sc, np.random.default_rng(1))
    p = _planners(sc)
    params = float(load_model(sc.model).total_params)
    for mig, rule in ((Migration(restart_s=1e6), SwitchRule()),
                      (Migration(restart_s=0.0), SwitchRule("lookahead", 1e6))):
        settings = SimSettings(2000, 1, mig, params=params, rule=rule)
        r = simulate(tl, make_strategy("exact", p), p, settings)
        if mig.restart_s == 1e6:
            assert r.switches == 0  # no gain can pay for an enormous restart
        else:
            assert r.switches > 0 and r.moved_bytes > 0
        assert r.failures == 0 and r.lost_iterations == 0
        _accounting(r, settings)


@pytest.mark.parametrize("name", ["static", "exact", "exact-rt"])
def test_time_accounting_with_checkpoints_and_failures(name):
    """A host of the running plan lost: the work since the last checkpoint is lost, the
    job reloads the checkpoint (``reload_s``) onto a plan without the host; checkpoints
    every minute stall the run ``write_s`` each."""
    sc = parse_scenario(scenario_doc(iterations=2000, events=[
        {"kind": "host_down", "host": "b", "at_s": 100, "until_s": 150},
        {"kind": "host_down", "host": "a-0", "at_s": 170, "until_s": 400}]))
    tl = build_timeline(sc, np.random.default_rng(1))
    p = _planners(sc)
    settings = SimSettings(2000, 1, Migration(restart_s=5.0, checkpoint_interval_s=60.0),
                           params=float(load_model(sc.model).total_params))
    r = simulate(tl, make_strategy(name, p), p, settings)
    assert r.finished and r.failures == 1 and r.lost_iterations > 0
    kinds = _accounting(r, settings)
    assert kinds["checkpoint"] > 0 and kinds["recover"] == pytest.approx(settings.reload_s)
    assert (kinds.get("plan", 0.0) > 0) == (name == "exact-rt")
    # The lost work: iterations run between the last checkpoint (at 120 s) and the loss.
    (fail,) = [ev for ev in r.events if ev["failure"]]
    assert fail["t_s"] == 170.0 and fail["migration_s"] == pytest.approx(settings.reload_s)
    ran = sum((min(s.end_s, 170.0) - max(s.start_s, 120.0)) / s.iter_time_s
              for s in r.segments if s.kind == "run" and s.end_s > 120 and s.start_s < 170)
    assert r.lost_iterations == pytest.approx(ran)


def test_a_long_stall_writes_no_empty_checkpoints():
    sc = parse_scenario(scenario_doc(iterations=2000, events=[
        {"kind": "host_down", "host": "a-0", "at_s": 170, "until_s": 400}]))
    tl = build_timeline(sc, np.random.default_rng(1))
    p = _planners(sc)
    settings = SimSettings(2000, 1, Migration(restart_s=300.0, checkpoint_interval_s=60.0),
                           params=float(load_model(sc.model).total_params))
    r = simulate(tl, make_strategy("static", p), p, settings)
    assert r.failures == 1
    kinds = [s.kind for s in r.segments if s.end_s > s.start_s]
    assert ("checkpoint", "checkpoint") not in set(zip(kinds, kinds[1:]))


@pytest.mark.parametrize("name", ["exact", "exact-rt"])
def test_replanners_keep_the_robust_plan_as_a_candidate(name):
    """A re-planner starts with static's plan and holds the CVaR-robust plan among the
    candidates of every later decision; static keeps only its own."""
    sc = parse_scenario(scenario_doc(iterations=2000))
    tl = build_timeline(sc, np.random.default_rng(2))
    p = _planners(sc)
    states = robust_states(sc, np.random.default_rng(5), 8)
    # Slow a-hosts in every sample: the robust plan keeps to one host, static's spans two.
    states[:, [i for i, n in enumerate(tl.link_names) if n.startswith("a-")]] = 0.5
    kw = dict(robust_states=states, base_links=tl.link_names)
    first = tl.states[0]
    replanner, static = make_strategy(name, p, **kw), make_strategy("static", p, **kw)
    robust = make_strategy("robust", p, **kw).initial(first).candidate
    start = static.initial(first).candidate
    assert replanner.initial(first).candidate == start
    assert robust is not None and robust != start
    assert robust in replanner.library and static.library == [start]
    # A decision picks the fastest valid candidate in the new state, library included.
    later = tl.states[1]
    dec = replanner.on_change(later, start)
    best = min(p.iteration_time(q, later) for q in replanner.library)
    assert p.iteration_time(dec.candidate, later) == best


def test_no_feasible_plan_reports_stall_time():
    doc = scenario_doc(iterations=10**6, migration={"checkpoint_interval_s": 400}, events=[
        {"kind": "host_down", "host": h, "at_s": 900} for h in ("a-0", "a-1", "b")])
    # Without the oracle: it never returns on a run that stalls for good (below).
    run = _run(doc, ("static", "exact"), oracle=False)
    for (r,) in run.results.values():
        assert not r.finished and r.stalled_at_s == pytest.approx(900.0)
        assert math.isinf(r.wall_s) and 0 < r.iterations < 10**6
        # The loss took the work since the checkpoint of 800 s: what is left is the
        # checkpoint's.
        assert r.failures == 1 and r.lost_iterations > 0
        ran = sum((s.end_s - s.start_s) / s.iter_time_s for s in r.segments
                  if s.kind == "run")
        before = sum((min(s.end_s, 800) - s.start_s) / s.iter_time_s for s in r.segments
                     if s.kind == "run" and s.start_s < 800)
        assert r.iterations == pytest.approx(before)
        assert r.iterations + r.lost_iterations == pytest.approx(ran)


class _Hung(Exception):
    pass


def test_oracle_of_a_run_that_stalls_for_good_returns():
    import signal

    from hetpar.dynamics.oracle import hindsight

    doc = scenario_doc(iterations=10**6, events=[
        {"kind": "host_down", "host": h, "at_s": 900} for h in ("a-0", "a-1", "b")])
    sc = parse_scenario(doc)
    tl = build_timeline(sc, np.random.default_rng(0))
    p = _planners(sc)

    def hung(*_):
        raise _Hung

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        res = hindsight(tl, p, SimSettings(10**6, 1), node_limit=ORACLE)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, old)
    assert not res.finished and math.isinf(res.wall_s)


def test_temporary_outage_stalls_then_resumes():
    doc = scenario_doc(iterations=3000, events=[
        {"kind": "host_down", "host": h, "at_s": 60, "until_s": 360} for h in ("a-0", "a-1", "b")])
    (r,) = _run(doc, ("static",)).results["static"]
    assert r.finished and r.stall_s == pytest.approx(300.0) and r.stalled_at_s is None


def test_policy_skipped_without_policy(tmp_path):
    run = _run(scenario_doc(iterations=100), ("static", "policy"),
               policy_path=str(tmp_path / "missing.zip"))
    assert "policy" in run.skipped and "policy" not in run.results


def _write_scenario(tmp_path, **extra):
    import yaml

    p = tmp_path / "sc.yaml"
    p.write_text(yaml.safe_dump(scenario_doc(**extra)))
    return p


def test_cli_replan_writes_outputs(tmp_path, capsys):
    sc = _write_scenario(tmp_path, iterations=500)
    out = tmp_path / "out"
    rc = main(["replan", "--scenario", str(sc), "--strategies", "static,exact,exact-rt",
               "--node-limit", str(NODES), "--seeds", "0,1", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "summary.json").read_text())
    assert {r["strategy"] for r in data["summary"]} == {"static", "exact", "exact-rt"}
    assert len(data["runs"]["exact"]) == 2
    assert (out / "timeline.png").stat().st_size > 1000
    assert "| static |" in (out / "summary.md").read_text()


def test_cli_replan_trace(tmp_path):
    import yaml

    cl = tmp_path / "cl.yaml"
    cl.write_text(yaml.safe_dump(CLUSTER))
    tr = tmp_path / "tr.csv"
    tr.write_text("time_s,s1--s2\n0,40\n120,4\n240,40\n")
    rc = main(["replan", "--cluster", str(cl), "--model", "gpt3-125m", "--training",
               "small-batch", "--trace", str(tr), "--iterations", "400", "--strategies",
               "static,exact", "--node-limit", str(NODES), "--out", str(tmp_path / "o")])
    assert rc == 0 and (tmp_path / "o" / "summary.md").exists()


def test_cli_replan_time_limit_is_clock_mode(tmp_path):
    sc = _write_scenario(tmp_path, iterations=300)
    rc = main(["replan", "--scenario", str(sc), "--strategies", "static,exact",
               "--time-limit", "5", "--no-oracle", "--out", str(tmp_path / "o")])
    assert rc == 0
    data = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert data["hindsight"]["runs"] == [] and len(data["runs"]["exact"]) == 1


def test_cli_replan_bad_trace_exit_2(tmp_path, capsys):
    import yaml

    cl = tmp_path / "cl.yaml"
    cl.write_text(yaml.safe_dump(CLUSTER))
    tr = tmp_path / "bad.csv"
    tr.write_text("time_s,s1--s2\n0,40\n10,-3\n")
    rc = main(["replan", "--cluster", str(cl), "--model", "gpt3-125m", "--trace", str(tr),
               "--iterations", "10", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.csv" in err and "line 3" in err and "positive" in err
    rc = main(["replan", "--scenario", "stable-dc", "--strategies", "static,nope"])
    assert rc == 2 and "unknown strategy" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--beam", "--refine-steps"])
def test_cli_replan_search_budget_below_one_exit_2(capsys, flag):
    rc = main(["replan", "--scenario", "stable-dc", "--strategies", "static,policy",
               flag, "0"])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and len(err.strip().splitlines()) == 1


def test_replan_refine_steps_reach_the_policy_planner(monkeypatch):
    """``--refine-steps`` (``run_scenario(refine_steps=...)``) is the budget every
    refinement of the policy's plans gets."""
    import hetpar.agents.planner as planner

    seen = []
    real = planner.plan_with_policy

    def spy(*args, **kwargs):
        seen.append(kwargs["refine_steps"])
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "plan_with_policy", spy)
    run = _run(scenario_doc(iterations=30000), ("policy",), oracle=False, refine_steps=7,
               beam=1)
    assert run.results["policy"][0].finished
    assert seen and set(seen) == {7}


@pytest.mark.parametrize("beam", [None, 1, 2])
def test_the_replanner_decodes_with_the_sweep_unless_a_beam_is_asked_for(monkeypatch, beam):
    """By default a decision sweeps the micro-batch counts under the policy's own memory
    option (``REPLAN_SWEEP_MEMORY``); ``--beam W`` (1: one rollout) replaces the sweep."""
    import hetpar.agents.planner as planner
    from hetpar.dynamics.strategies import REPLAN_SWEEP_MEMORY

    seen = []
    real = planner.plan_with_policy

    def spy(*args, **kwargs):
        seen.append((kwargs["micro_sweep"], kwargs.get("sweep_memory"), kwargs["beam"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "plan_with_policy", spy)
    run = _run(scenario_doc(iterations=30000), ("policy",), oracle=False, beam=beam)
    assert run.results["policy"][0].finished and seen
    if beam is None:
        assert {(sweep, memory) for sweep, memory, _ in seen} == {(True, REPLAN_SWEEP_MEMORY)}
    else:
        assert {(sweep, width) for sweep, _, width in seen} == {(False, beam)}


def test_warming_the_policy_planner_is_neither_timed_nor_kept():
    """The re-planner plans once for the start state before the job (like static's plan)
    so that its planning environment exists at the first change; that call is not a
    decision: no latency recorded, no plan memoised."""
    sc = parse_scenario(scenario_doc(iterations=30000))
    planners = _planners(sc, beam=1)
    state = build_timeline(sc, np.random.default_rng(0)).states[0]
    planners.warm_policy(state)
    assert planners.policy_latencies == []
    assert not any(key[0] == "policy" for key in planners._plans)
    assert len(planners._plan_cache) == 1
    res = planners.policy(state)
    assert planners.policy_latencies == [res.wall_s] and res.plan is not None
    assert len(planners._plan_cache) == 1  # the same topology: the kept environment


def test_cli_replan_negative_decision_budget_exit_2(capsys):
    rc = main(["replan", "--scenario", "stable-dc", "--decision-ms", "-1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--decision-ms" in err and len(err.strip().splitlines()) == 1


def test_replan_decision_budget_reaches_the_policy_planner(monkeypatch):
    import hetpar.agents.planner as planner

    seen = []
    real = planner.plan_with_policy

    def spy(*args, **kwargs):
        seen.append(kwargs["budget_s"])
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "plan_with_policy", spy)
    _run(scenario_doc(iterations=30000), ("policy",), oracle=False, beam=1,
         decision_budget_s=0.2)
    assert seen and set(seen) == {0.2}
    seen.clear()
    _run(scenario_doc(iterations=30000), ("policy",), oracle=False, beam=1,
         decision_budget_s=math.inf)
    assert seen and set(seen) == {None}


@pytest.mark.parametrize("enabled", [True, False])
def test_a_policy_decision_runs_without_the_cyclic_collector(monkeypatch, enabled):
    """The collector is off during a decision (so that it never walks the run's heap
    inside one) and back as it was afterwards, also when the planner fails."""
    import gc

    import hetpar.agents.planner as planner

    during = []
    real = planner.plan_with_policy

    def spy(*args, **kwargs):
        during.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "plan_with_policy", spy)
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        _run(scenario_doc(iterations=30000), ("policy",), oracle=False, beam=1)
        assert during and not any(during)
        assert gc.isenabled() is enabled

        def broken(*args, **kwargs):
            raise HetparError("no plan")

        monkeypatch.setattr(planner, "plan_with_policy", broken)
        _run(scenario_doc(iterations=30000), ("policy",), oracle=False, beam=1)
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_planners_answer_with_solutions_of_the_states_problems():
    """Every re-planning planner returns a ``Solution`` of the state's ``Problem``; the
    exact one is the solvers' search under a node budget (``certify=False``), which
    finds the optimum of a search that ends within it; states of one topology share the
    cost model's bandwidth-free tables."""
    from hetpar.problem import Solution
    from hetpar.solvers import solve

    sc = parse_scenario(scenario_doc(iterations=3000))
    planners = _planners(sc)
    tl = build_timeline(sc, np.random.default_rng(0))
    state = tl.states[0]
    res = planners.exact(state)
    assert isinstance(res, Solution) and res.method == "exact" and res.optimal
    assert 0 < res.certificate.nodes <= NODES and res.certificate.stopped == ""
    problem = planners.problem(state)
    assert res.value == problem.value(res.plan)
    assert res.value == pytest.approx(planners.iteration_time(res.plan, state), rel=1e-12)
    assert res.value == pytest.approx(solve(problem, "exact").value, rel=1e-12)
    other = planners.problem(tl.states[1])
    assert other.cost_model._work_cache is problem.cost_model._work_cache
    robust = planners.robust(state, np.stack([state.bandwidth, state.bandwidth * 0.5]))
    assert isinstance(robust, Solution) and robust.objective == "cvar0.9"
    assert planners.exact(state) is res  # memoised: a state is planned once


def test_node_limit_cuts_exact_searches_deterministically():
    """A node budget too small to finish: the search stops after it (the certificate
    says so) with a valid plan and a lower bound, the same plan on every run; without a
    budget (``node_limit=None``) the clock limit applies."""
    sc = parse_scenario(scenario_doc(iterations=3000))
    state = build_timeline(sc, np.random.default_rng(0)).states[0]
    cut = [_planners(sc, node_limit=5).exact(state) for _ in range(2)]
    full = _planners(sc).exact(state)
    for res in cut:
        cert = res.certificate
        assert cert.stopped == "node limit" and not cert.optimal and not res.optimal
        assert res.plan is not None and cert.lower_bound <= full.value + 1e-12
        assert res.value >= full.value - 1e-12
    assert cut[0].plan == cut[1].plan and cut[0].value == cut[1].value
    clock = _planners(sc, node_limit=None, time_limit_s=30.0).exact(state)
    assert clock.optimal and clock.value == pytest.approx(full.value, rel=1e-12)


def test_node_limit_of_solve():
    from hetpar.errors import ConfigError
    from hetpar.solvers import solve

    sc = parse_scenario(scenario_doc())
    p = _planners(sc)
    problem = p.problem(build_timeline(sc, np.random.default_rng(0)).states[0])
    res = solve(problem, "exact", certify=False, node_limit=5)
    assert res.certificate.stopped == "node limit"
    assert solve(problem, "exact", certify=False, node_limit=10**6).certificate.optimal
    with pytest.raises(ConfigError, match="node_limit"):
        solve(problem, "exact", node_limit=5)  # an option of certify=False
    with pytest.raises(ConfigError, match="at least 1"):
        solve(problem, "exact", certify=False, node_limit=0)


def test_a_node_budget_bounds_the_children_passed_over(monkeypatch):
    """On 64 interchangeable hosts nearly every first stage is a symmetric copy of one
    already searched. Each child passed over counts as a step of the budget: before it
    did, 50 steps examined 58,941 first stages (4,096 per step) and a re-planner's
    20,000-step budget ran for hours."""
    import hetpar
    from hetpar.cluster import parse_cluster
    from hetpar.problem import Problem
    from hetpar.problem import space as space_mod
    from hetpar.solvers import solve

    doc = {"name": "two-leaf-64", "switches": ["leaf0", "leaf1", "spine"],
           "hosts": [{"name": "a80", "count": 32, "gpu": "A100-SXM4-80GB", "gpus": 8,
                      "nic_gbps": 200, "switch": "leaf0"},
                     {"name": "a40", "count": 32, "gpu": "A100-SXM4-40GB", "gpus": 8,
                      "nic_gbps": 200, "switch": "leaf1"}],
           "links": [{"a": "leaf0", "b": "spine", "capacity_gbps": 1600},
                     {"a": "leaf1", "b": "spine", "capacity_gbps": 1600}]}
    examined = [0]
    extend = space_mod.SymmetryCheck.extend

    def counted(self, stage):
        examined[0] += 1
        return extend(self, stage)

    monkeypatch.setattr(space_mod.SymmetryCheck, "extend", counted)
    problem = Problem.of(parse_cluster(doc, "<two-leaf-64>"), hetpar.load_model("llama2-7b"),
                         hetpar.load_training("llama-bf16"), samples=1)
    res = solve(problem, "exact", certify=False, node_limit=50)
    assert res.certificate.stopped == "node limit" and res.plan is not None
    assert examined[0] <= 10 * 50


def test_cli_replan_bad_node_limit_exit_2(capsys):
    rc = main(["replan", "--scenario", "stable-dc", "--node-limit", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--node-limit" in err and len(err.strip().splitlines()) == 1


def test_library_ablation_switches_only_between_plans_made_before_the_job():
    """``library`` offers static's and robust's plans at every change (no planner) and
    re-plans only when neither can run."""
    run = _run(volatile_doc(iterations=4000), ("static", "robust", "library", "exact"),
               seeds=(0, 1))
    for seed, r in enumerate(run.results["library"]):
        start = run.results["static"][seed].plan_objects[0]
        robust = run.results["robust"][seed].plan_objects[0]
        assert r.plan_objects[0] == start
        assert set(r.plan_objects) <= {start, robust}
        assert all(ev["source"] == "library" for ev in r.events[1:])
        assert r.finished
    rows = {row["strategy"]: row for row in summary_rows(run)}
    assert rows["library"]["proposed_switches_mean"] == 0.0
    assert rows["library"]["regret_mean"] >= 0.0


def test_library_replans_when_no_held_plan_can_run():
    doc = scenario_doc(iterations=3000, events=[
        {"kind": "host_down", "host": "a-0", "at_s": 120, "until_s": 600},
        {"kind": "host_down", "host": "a-1", "at_s": 120, "until_s": 600}])
    (r,) = _run(doc, ("library",)).results["library"]
    assert r.finished and r.forced_switches >= 1
    assert any(ev["source"] == "exact" for ev in r.events[1:])


def _decision_latency_module():
    from bench_helpers import load_benchmark

    return load_benchmark("decision_latency", "hetpar_decision_latency")


def test_decision_latency_benchmark_prints_its_figures_and_the_plans_checksum(capsys,
                                                                            monkeypatch):
    """A short real run of benchmarks/decision_latency.py; its checksum is the sum of the
    policy planner's plan values over the scenario's state changes, and the shared stage
    bounds of a decision leave those plans what the planner makes without them."""
    import sys

    bench = _decision_latency_module()
    monkeypatch.setattr(sys, "argv", ["decision_latency.py", "--scenarios", "host-loss",
                                      "--repeats", "1"])
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "host-loss" in out and "within 50 ms" in out and "parts, median ms" in out
    checksum = float(out.rsplit(":", 1)[1])

    # The same decisions with every refinement building its own bounds, as before.
    import hetpar.solvers.refine as refine
    from hetpar.dynamics.scenario import load_scenario

    original = refine.refine_plan
    monkeypatch.setattr(refine, "refine_plan",
                        lambda *a, **k: original(*a, **{**k, "bounds": None}))
    scenario = load_scenario("host-loss")
    planners = Planners(load_model(scenario.model), load_training(scenario.training))
    timeline = build_timeline(scenario, np.random.default_rng(0))
    planners.warm_policy(timeline.states[0])
    values = [planners.policy(s).value for s in timeline.states[1:]]
    assert math.isclose(sum(v for v in values if math.isfinite(v)), checksum,
                        rel_tol=1e-8)
