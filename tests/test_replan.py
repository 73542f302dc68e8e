"""Training-run simulator, strategies and ``hetpar replan``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hetpar.cli.main import main
from hetpar.dynamics.experiment import robust_states, run_scenario
from hetpar.dynamics.scenario import build_timeline, parse_scenario
from hetpar.dynamics.simulator import SimSettings, simulate
from hetpar.dynamics.strategies import Planners, make_strategy
from hetpar.errors import HetparError
from hetpar.workload.model import load_model
from hetpar.workload.training import load_training
from tests.test_dynamics import CLUSTER, scenario_doc

FAST = 0.3  # seconds per exact search: enough for these 6-GPU instances


def _run(doc, strategies=("static", "exact"), seeds=(0,), **kw):
    sc = parse_scenario(doc)
    return run_scenario(sc, strategies, seeds, time_limit_s=FAST, **kw)


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
    # Realistic exact pays its searches as stall, the oracle does not.
    assert run.results["exact-rt"][0].planning_charged_s > 0
    assert run.results["exact"][0].planning_charged_s == 0
    assert run.results["exact-rt"][0].wall_s > run.results["exact"][0].wall_s


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
    assert st.migration_s == pytest.approx(st.switches * run.settings.migration_s)


def test_switch_rule_and_time_accounting():
    sc = parse_scenario(scenario_doc(iterations=2000))
    tl = build_timeline(sc, np.random.default_rng(1))
    p = Planners(load_model(sc.model), load_training(sc.training), FAST)
    for cost, lookahead in ((1e9, 600.0), (0.0, 1e6)):
        settings = SimSettings(2000, 1, cost, lookahead)
        r = simulate(tl, make_strategy("exact", p), p, settings)
        if cost == 1e9:
            assert r.switches == 0  # no gain can pay for an enormous migration
        run_s = sum(s.end_s - s.start_s for s in r.segments if s.kind == "run")
        iters = sum((s.end_s - s.start_s) / s.iter_time_s for s in r.segments if s.kind == "run")
        assert iters == pytest.approx(2000)
        assert r.wall_s == pytest.approx(run_s + r.migration_s + r.planning_charged_s)


@pytest.mark.parametrize("name", ["exact", "exact-rt"])
def test_replanners_keep_the_robust_plan_as_a_candidate(name):
    """A re-planner starts with static's plan and holds the CVaR-robust plan among the
    candidates of every later decision; static keeps only its own."""
    sc = parse_scenario(scenario_doc(iterations=2000))
    tl = build_timeline(sc, np.random.default_rng(2))
    p = Planners(load_model(sc.model), load_training(sc.training), FAST)
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
    doc = scenario_doc(iterations=10**6, events=[
        {"kind": "host_down", "host": h, "at_s": 900} for h in ("a-0", "a-1", "b")])
    run = _run(doc, ("static", "exact"))
    for (r,) in run.results.values():
        assert not r.finished and r.stalled_at_s == pytest.approx(900.0)
        assert math.isinf(r.wall_s) and 0 < r.iterations < 10**6


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
               "--time-limit", str(FAST), "--seeds", "0,1", "--out", str(out)])
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
               "static,exact", "--time-limit", str(FAST), "--out", str(tmp_path / "o")])
    assert rc == 0 and (tmp_path / "o" / "summary.md").exists()


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
    run = _run(scenario_doc(iterations=30000), ("policy",), refine_steps=7, beam=1)
    assert run.results["policy"][0].finished
    assert seen and set(seen) == {7}


def test_warming_the_policy_planner_is_neither_timed_nor_kept():
    """The re-planner plans once for the start state before the job (like static's plan)
    so that its planning environment exists at the first change; that call is not a
    decision: no latency recorded, no plan memoised."""
    sc = parse_scenario(scenario_doc(iterations=30000))
    planners = Planners(load_model(sc.model), load_training(sc.training), FAST, None, beam=1)
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
    _run(scenario_doc(iterations=30000), ("policy",), beam=1, decision_budget_s=0.2)
    assert seen and set(seen) == {0.2}
    seen.clear()
    _run(scenario_doc(iterations=30000), ("policy",), beam=1, decision_budget_s=math.inf)
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
        _run(scenario_doc(iterations=30000), ("policy",), beam=1)
        assert during and not any(during)
        assert gc.isenabled() is enabled

        def broken(*args, **kwargs):
            raise HetparError("no plan")

        monkeypatch.setattr(planner, "plan_with_policy", broken)
        _run(scenario_doc(iterations=30000), ("policy",), beam=1)
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_planners_answer_with_solutions_of_the_states_problems():
    """Every re-planning planner returns a ``Solution`` of the state's ``Problem``; the
    exact one is the solvers' search under a hard deadline (``certify=False``), which
    finds the optimum of a search that ends in time; states of one topology share the
    cost model's bandwidth-free tables."""
    from hetpar.problem import Solution
    from hetpar.solvers import solve

    sc = parse_scenario(scenario_doc(iterations=3000))
    planners = Planners(load_model(sc.model), load_training(sc.training), 30.0)
    tl = build_timeline(sc, np.random.default_rng(0))
    state = tl.states[0]
    res = planners.exact(state)
    assert isinstance(res, Solution) and res.method == "exact" and res.optimal
    problem = planners.problem(state)
    assert res.value == problem.value(res.plan)
    assert res.value == pytest.approx(planners.iteration_time(res.plan, state), rel=1e-12)
    assert res.value == pytest.approx(solve(problem, "exact").value, rel=1e-12)
    other = planners.problem(tl.states[1])
    assert other.cost_model._work_cache is problem.cost_model._work_cache
    robust = planners.robust(state, np.stack([state.bandwidth, state.bandwidth * 0.5]))
    assert isinstance(robust, Solution) and robust.objective == "cvar0.9"
    assert planners.exact(state) is res  # memoised: a state is planned once
