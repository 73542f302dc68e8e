"""Run strategies on a scenario over seeds; write summary JSON / Markdown and a PNG timeline.

Used by ``hetpar replan`` and ``benchmarks/replan_experiment.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetpar.dynamics.oracle import ORACLE_NODES, OracleResult, failure_blind, hindsight
from hetpar.dynamics.scenario import (
    Scenario,
    Timeline,
    build_timeline,
    failure_times,
    known_at,
)
from hetpar.dynamics.simulator import RunResult, SimSettings, simulate
from hetpar.dynamics.strategies import (
    REPLAN_NODES,
    STRATEGIES,
    Planners,
    PolicyUnavailable,
    make_strategy,
)
from hetpar.dynamics.switching import SwitchRule
from hetpar.errors import ConfigError

__all__ = [
    "ScenarioRun",
    "parse_strategies",
    "robust_states",
    "run_scenario",
    "summary_doc",
    "summary_rows",
    "write_outputs",
    "MEASURED_KEYS",
]


def parse_strategies(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    for n in names:
        if n not in STRATEGIES:
            raise ConfigError("--strategies", "", f"unknown strategy {n!r} (known: "
                                                  f"{', '.join(STRATEGIES)})")
    if not names:
        raise ConfigError("--strategies", "", "names no strategy")
    return names


def robust_states(scenario: Scenario, rng: np.random.Generator, k: int) -> np.ndarray:
    """(k, base links) bandwidth states at uniformly random instants of an independent
    realisation of the scenario's processes (what a robust planner may know)."""
    tl = build_timeline(scenario, rng, topology_events=False)
    times = rng.uniform(0.0, scenario.horizon_s, size=k)
    return np.array([tl.at(float(t)).base_bandwidth for t in times])


@dataclass
class ScenarioRun:
    scenario: Scenario
    seeds: tuple[int, ...]
    settings: SimSettings
    results: dict[str, list[RunResult]] = field(default_factory=dict)
    timelines: list[Timeline] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    oracles: list[OracleResult] = field(default_factory=list)
    # The oracle that learns of each failure when it happens (the hindsight oracle itself
    # where the scenario has no failure after the start).
    blind_oracles: list[OracleResult] = field(default_factory=list)
    policy_latencies: list[float] = field(default_factory=list)
    exact_latencies: list[float] = field(default_factory=list)


def run_scenario(scenario: Scenario, strategies: Sequence[str], seeds: Sequence[int], *,
                 planners: Planners | None = None, policy_path: str | None = None,
                 trust_pickle: bool = False,
                 iterations: int | None = None, time_limit_s: float | None = None,
                 rule: SwitchRule | None = None, beam: int | None = None,
                 refine_steps: int | None = None, decision_budget_s: float | None = None,
                 node_limit: int | None = None, oracle: bool = True,
                 oracle_nodes: int = ORACLE_NODES,
                 log: Callable[[str], None] | None = None) -> ScenarioRun:
    """Every strategy on ``scenario`` for each seed, and the hindsight oracle over the
    plans they ran (``oracle``). ``decision_budget_s``: a wall-clock budget of each policy
    decision (None: none, the plans are the same on every machine); ``time_limit_s``:
    exact searches stop at this clock time instead of after ``node_limit`` steps."""
    from hetpar.workload.model import load_model
    from hetpar.workload.training import load_training

    model = load_model(scenario.model)
    training = load_training(scenario.training)
    if planners is None:
        planners = Planners(model, training, time_limit_s or scenario.exact_time_limit_s,
                            None if time_limit_s else (node_limit or REPLAN_NODES),
                            policy_path, trust_pickle, beam=beam,
                            refine_steps=refine_steps,
                            bytes_per_param=scenario.migration.bytes_per_param)
        if decision_budget_s is not None and math.isfinite(decision_budget_s):
            planners.decision_budget_s = decision_budget_s
    seq = training.seq_len or model.seq_len
    settings = SimSettings(iterations=iterations or scenario.iterations,
                           tokens_per_iteration=training.global_batch * seq,
                           migration=scenario.migration, params=float(model.total_params),
                           rule=rule or SwitchRule())
    run = ScenarioRun(scenario, tuple(seeds), settings)
    for seed in seeds:
        tl = build_timeline(scenario, np.random.default_rng(seed))
        run.timelines.append(tl)
        states = robust_states(scenario, np.random.default_rng([seed, 1]),
                               planners.robust_samples)
        for name in strategies:
            if name in run.skipped:
                continue
            try:
                strat = make_strategy(name, planners, robust_states=states,
                                      base_links=tl.link_names)
            except PolicyUnavailable as exc:
                run.skipped[name] = f"no policy available ({exc}); skipped"
                if log:
                    log(f"{scenario.name}: strategy {name}: {run.skipped[name]}")
                continue
            res = simulate(tl, strat, planners, settings)
            run.results.setdefault(name, []).append(res)
            if log:
                wall = f"{res.wall_s:.0f} s" if res.finished else \
                    f"stalled at {res.stalled_at_s:.0f} s"
                log(f"{scenario.name} seed {seed} {name}: {wall}, {res.switches} switches")
        if oracle:
            ran = [p for rs in run.results.values() if len(rs) == len(run.timelines)
                   for p in rs[-1].plan_objects]
            times = failure_times(scenario)
            blind: OracleResult | None = None
            if times:
                known = [(t, build_timeline(known_at(scenario, t), np.random.default_rng(seed)))
                         for t in (0.0, *times)]
                blind = failure_blind(tl, known, planners, settings, ran,
                                      node_limit=oracle_nodes)
                # The same plans for both, so that knowing more is never worse.
                ran = [*ran, *blind.plans]
            best = hindsight(tl, planners, settings, ran, node_limit=oracle_nodes)
            run.oracles.append(best)
            run.blind_oracles.append(blind if blind is not None else best)
            if log:
                log(f"{scenario.name} seed {seed} hindsight: {best.wall_s:.0f} s, "
                    f"{best.switches} switches, bound {best.lower_bound_s:.0f} s, "
                    f"{best.certified}/{best.states} states certified"
                    + (f"; failure-blind: {blind.wall_s:.0f} s" if blind is not None else ""))
    run.policy_latencies = list(planners.policy_latencies)
    run.exact_latencies = list(planners.exact_latencies)
    return run


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else "inf"


def _regret(wall: float, best: float) -> float:
    if not math.isfinite(best):
        return math.nan
    return wall / best - 1.0 if math.isfinite(wall) else math.inf


def summary_rows(run: ScenarioRun) -> list[dict[str, Any]]:
    """One row per strategy: means and spreads over seeds; regret to the hindsight
    oracle of each seed (``wall / oracle - 1``) where it ran."""
    rows = []
    static = run.results.get("static")
    robust = run.results.get("robust")
    for name, results in run.results.items():
        wall = np.array([r.wall_s for r in results])
        row: dict[str, Any] = {
            "scenario": run.scenario.name, "strategy": name, "seeds": len(results),
            "finished": sum(r.finished for r in results),
            "wall_s_mean": float(wall.mean()), "wall_s_std": float(wall.std()),
            "tokens_mean": float(np.mean([r.tokens for r in results])),
            "tokens_per_hour_mean": float(np.mean([r.tokens_per_hour for r in results])),
            "switches_mean": float(np.mean([r.switches for r in results])),
            "forced_mean": float(np.mean([r.forced_switches for r in results])),
            "migration_s_mean": float(np.mean([r.migration_s for r in results])),
            "moved_GB_mean": float(np.mean([r.moved_bytes for r in results])) / 1e9,
            "failures_mean": float(np.mean([r.failures for r in results])),
            # Switches to a plan the strategy's planner proposed in that state (not one it
            # already held: its start plan, the robust plan, one used before).
            "proposed_switches_mean": float(np.mean([
                sum(1 for ev in r.events[1:] if ev["source"] not in ("library", "keep"))
                for r in results])),
            "lost_iterations_mean": float(np.mean([r.lost_iterations for r in results])),
            "planning_charged_s_mean": float(np.mean([r.planning_charged_s for r in results])),
            "stall_s_mean": float(np.mean([r.stall_s for r in results])),
            "stalled_at_s": [r.stalled_at_s for r in results],
        }
        for ref_name, ref in (("static", static), ("robust", robust)):
            if ref:
                rel = np.array([_regret(r.wall_s, x.wall_s) for r, x in zip(results, ref)])
                row[f"vs_{ref_name}_mean"] = float(rel.mean())
                row[f"vs_{ref_name}_min"] = float(rel.min())
                row[f"vs_{ref_name}_max"] = float(rel.max())
        if len(run.oracles) == len(results):
            reg = np.array([_regret(r.wall_s, o.wall_s) for r, o in zip(results, run.oracles)])
            row["regret_mean"] = float(reg.mean())
            row["regret_max"] = float(reg.max())
        if len(run.blind_oracles) == len(results):
            reg = np.array([_regret(r.wall_s, o.wall_s)
                            for r, o in zip(results, run.blind_oracles)])
            row["regret_blind_mean"] = float(reg.mean())
            row["regret_blind_max"] = float(reg.max())
        rows.append(row)
    return rows


def oracle_row(run: ScenarioRun) -> dict[str, Any] | None:
    """The hindsight oracle's means over seeds, and how far its schedule is from the
    lower bound on every schedule (``gap``: oracle / bound - 1)."""
    if not run.oracles:
        return None
    o = run.oracles
    blind = run.blind_oracles if len(run.blind_oracles) == len(o) else None
    wall = np.array([x.wall_s for x in o])
    return {"scenario": run.scenario.name, "strategy": "hindsight", "seeds": len(o),
            "wall_s_mean": float(wall.mean()), "wall_s_std": float(wall.std()),
            "lower_bound_s_mean": float(np.mean([x.lower_bound_s for x in o])),
            "bound_gap_max": float(max(_regret(x.wall_s, x.lower_bound_s) for x in o)),
            "switches_mean": float(np.mean([x.switches for x in o])),
            "migration_s_mean": float(np.mean([x.migration_s for x in o])),
            "states": [x.states for x in o], "certified": [x.certified for x in o],
            "front_cut": any(x.front_cut for x in o),
            # The oracle blind to failures until they happen: what no strategy avoids.
            "blind_wall_s_mean": float(np.mean([b.wall_s for b in blind]))
            if blind else None,
            "blind_regret_mean": float(np.mean([_regret(b.wall_s, x.wall_s)
                                                for b, x in zip(blind, o)]))
            if blind else None}


def pct(x: float) -> str:
    """A relative difference as a signed percentage (n/a: undefined, inf: no finish)."""
    return f"{x * 100:+.2f}%" if math.isfinite(x) else ("n/a" if math.isnan(x) else "inf")


def _markdown(run: ScenarioRun) -> str:
    s = run.settings
    mig = s.migration
    lines = [f"# replan: {run.scenario.name}", "",
             run.scenario.description.strip(), "",
             (f"- iterations: {s.iterations} ({s.tokens_per_iteration} tokens each); "
              f"seeds: {', '.join(map(str, run.seeds))}; switch rule: {s.rule.name}"),
             (f"- migrations: the state that changes owner over the state's links, plus a "
              f"{mig.restart_s:g} s restart; checkpoints every "
              f"{mig.checkpoint_interval_s:g} s ({s.checkpoint_write_s:.1f} s each; a "
              f"failure reloads one in {s.reload_s:.1f} s); network states per seed: "
              f"{', '.join(str(len(t.states)) for t in run.timelines)}"), ""]
    lines += [("| strategy | wall time (s), mean ± sd | regret to hindsight, mean [max] "
               "| regret to failure-blind | vs static | tokens/h | switches | migration (s) "
               "| moved (GB) | lost iterations | planning charged (s) | no-plan stall (s) |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in summary_rows(run):
        stalled = [t for t in row["stalled_at_s"] if t is not None]
        wall = (f"{_fmt(row['wall_s_mean'])} ± {_fmt(row['wall_s_std'])}" if not stalled else
                f"stalls at {', '.join(f'{t:.0f} s' for t in stalled)}")
        regret = (f"{pct(row['regret_mean'])} [{pct(row['regret_max'])}]"
                  if "regret_mean" in row else "n/a")
        blind = pct(row.get("regret_blind_mean", math.nan))
        lines.append(f"| {row['strategy']} | {wall} | {regret} | {blind} | "
                     f"{pct(row.get('vs_static_mean', math.nan))} | "
                     f"{row['tokens_per_hour_mean']:.3g} | {row['switches_mean']:.1f} | "
                     f"{row['migration_s_mean']:.0f} | {row['moved_GB_mean']:.0f} | "
                     f"{row['lost_iterations_mean']:.0f} | "
                     f"{row['planning_charged_s_mean']:.2f} | {row['stall_s_mean']:.0f} |")
    orow = oracle_row(run)
    if orow is not None:
        lines.append(f"| hindsight | {_fmt(orow['wall_s_mean'])} ± {_fmt(orow['wall_s_std'])} "
                     f"| +0.00% | | | | {orow['switches_mean']:.1f} | "
                     f"{orow['migration_s_mean']:.0f} | | | | |")
        lines.append(
            f"\nhindsight oracle: lower bound on any schedule {_fmt(orow['lower_bound_s_mean'])} s "
            f"(oracle within {pct(orow['bound_gap_max'])} of it); distinct network states "
            f"per seed {orow['states']}, of which proven optimal {orow['certified']}; "
            f"the failure-blind oracle (learns of each failure when it happens) "
            f"{pct(orow['blind_regret_mean'] if orow['blind_regret_mean'] is not None else math.nan)}"
            f" above it"
            + ("; a Pareto front was cut (schedule not proven best)"
               if orow["front_cut"] else ""))
    for name, why in run.skipped.items():
        lines.append(f"\n`{name}`: {why}")
    lines.append("\n" + latency_line(run))
    return "\n".join(lines) + "\n"


def latency_line(run: ScenarioRun) -> str:
    """Measured decision latencies (they differ from run to run; not in the tables)."""
    out = []
    if run.policy_latencies:
        lat = np.array(run.policy_latencies) * 1e3
        out.append(f"policy decision latency (measured): median {np.median(lat):.1f} ms, "
                   f"max {lat.max():.1f} ms over {len(lat)} decisions")
    if run.exact_latencies:
        lat = np.array(run.exact_latencies)
        out.append(f"exact decision latency (measured): median {np.median(lat):.2f} s, max "
                   f"{lat.max():.2f} s over {len(lat)} searches")
    return "; ".join(out)


def plot_timeline(run: ScenarioRun, path: Path, seed_index: int = 0) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = run.timelines[seed_index]
    ends = [rs[seed_index].wall_s if rs[seed_index].finished else
            (rs[seed_index].stalled_at_s or 0.0) * 1.1 + 60
            for rs in run.results.values() if len(rs) > seed_index]
    t_end = max([e for e in ends if math.isfinite(e)] or [run.scenario.horizon_s])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    starts = np.array([s.start_s for s in tl.states] + [t_end]) / 60.0
    bw = np.array([s.base_bandwidth for s in tl.states])
    varying = [i for i in range(bw.shape[1])
               if np.nanmax(bw[:, i]) != np.nanmin(bw[:, i]) or np.isnan(bw[:, i]).any()]
    for i in varying[:8]:
        ax1.step(starts, np.append(bw[:, i], bw[-1, i]), where="post", label=tl.link_names[i])
    for s in tl.states:
        if s.topology:
            ax1.axvspan(s.start_s / 60, min(s.end_s, t_end) / 60, color="red", alpha=0.1)
    ax1.set_ylabel("link bandwidth (Gb/s)")
    ax1.set_yscale("log")
    if varying:
        ax1.legend(fontsize=7, loc="best")
    ax1.set_title(f"{run.scenario.name} (seed {run.seeds[seed_index]}); red: hosts/links lost")
    for j, (name, rs) in enumerate(run.results.items()):
        if len(rs) <= seed_index:
            continue
        r = rs[seed_index]
        xs, ys = [], []
        for seg in r.segments:
            xs += [seg.start_s / 60, seg.end_s / 60]
            ys += [seg.iter_time_s, seg.iter_time_s]
        line, = ax2.plot(xs, ys, label=f"{name} ({r.switches} sw)", lw=1.5,
                         alpha=0.85, zorder=3 + j)
        for t in r.switch_times:
            ax2.axvline(t / 60, color=line.get_color(), ls=":", lw=1)
        if r.finished:
            ax2.plot([r.wall_s / 60], [ys[-1] if ys else np.nan], marker="|", ms=14,
                     color=line.get_color())
    ax2.set_xlabel("time (min)")
    ax2.set_ylabel("iteration time (s)")
    ax2.legend(fontsize=7, loc="best")
    ax2.set_xlim(0, t_end / 60)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


#: Keys of ``summary_doc`` that hold measured wall-clock seconds (planning times): they
#: differ from run to run, and ``hetpar replan --json`` leaves them out unless ``--timings``.
MEASURED_KEYS = frozenset({"planning_wall_s", "policy_latency_s", "exact_latency_s"})


def write_outputs(run: ScenarioRun, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = summary_doc(run)
    paths = [out / "summary.json", out / "summary.md", out / "timeline.png"]
    paths[0].write_text(json.dumps(data, indent=1, default=float))
    paths[1].write_text(_markdown(run))
    plot_timeline(run, paths[2])
    return paths


def summary_doc(run: ScenarioRun) -> dict[str, Any]:
    """What summary.json holds (and ``hetpar replan --json`` prints)."""
    st = run.settings
    return {"scenario": run.scenario.name, "seeds": list(run.seeds),
            "iterations": st.iterations,
            "tokens_per_iteration": st.tokens_per_iteration,
            "switch_rule": st.rule.name,
            "migration": {"restart_s": st.migration.restart_s,
                          "storage_GBps": st.migration.storage_GBps,
                          "checkpoint_interval_s": st.migration.checkpoint_interval_s,
                          "checkpoint_write_s": st.checkpoint_write_s,
                          "reload_s": st.reload_s},
            "skipped": run.skipped, "summary": summary_rows(run),
            "hindsight": {"summary": oracle_row(run),
                          "runs": [o.to_dict() for o in run.oracles],
                          "failure_blind_runs": [o.to_dict() for o in run.blind_oracles]},
            "policy_latency_s": run.policy_latencies, "exact_latency_s": run.exact_latencies,
            "runs": {k: [r.to_dict() for r in v] for k, v in run.results.items()}}
