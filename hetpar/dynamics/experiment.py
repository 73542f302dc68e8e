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

from hetpar.dynamics.scenario import Scenario, Timeline, build_timeline
from hetpar.dynamics.simulator import RunResult, SimSettings, simulate
from hetpar.dynamics.strategies import STRATEGIES, Planners, PolicyUnavailable, make_strategy
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
    policy_latencies: list[float] = field(default_factory=list)
    exact_latencies: list[float] = field(default_factory=list)


def run_scenario(scenario: Scenario, strategies: Sequence[str], seeds: Sequence[int], *,
                 planners: Planners | None = None, policy_path: str | None = None,
                 trust_pickle: bool = False,
                 iterations: int | None = None, time_limit_s: float | None = None,
                 lookahead_s: float | None = None, beam: int | None = None,
                 refine_steps: int | None = None, decision_budget_s: float | None = None,
                 log: Callable[[str], None] | None = None) -> ScenarioRun:
    """Every strategy on ``scenario`` for each seed. ``decision_budget_s`` is the policy
    decision's wall-clock budget (None: ``REPLAN_BUDGET_S``; ``math.inf``: none)."""
    from hetpar.workload.model import load_model
    from hetpar.workload.training import load_training

    model = load_model(scenario.model)
    training = load_training(scenario.training)
    if planners is None:
        planners = Planners(model, training, time_limit_s or scenario.exact_time_limit_s,
                            policy_path, trust_pickle, beam=beam,
                            refine_steps=refine_steps)
        if decision_budget_s is not None:
            planners.decision_budget_s = (None if math.isinf(decision_budget_s)
                                          else decision_budget_s)
    seq = training.seq_len or model.seq_len
    settings = SimSettings(iterations=iterations or scenario.iterations,
                           tokens_per_iteration=training.global_batch * seq,
                           migration_s=scenario.migration.cost_s(model.total_params),
                           lookahead_s=lookahead_s or scenario.lookahead_s)
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
    run.policy_latencies = list(planners.policy_latencies)
    run.exact_latencies = list(planners.exact_latencies)
    return run


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else "inf"


def summary_rows(run: ScenarioRun) -> list[dict[str, Any]]:
    """One row per strategy: means and spreads over seeds."""
    rows = []
    static = run.results.get("static")
    for name, results in run.results.items():
        wall = np.array([r.wall_s for r in results])
        row: dict[str, Any] = {
            "scenario": run.scenario.name, "strategy": name, "seeds": len(results),
            "finished": sum(r.finished for r in results),
            "wall_s_mean": float(wall.mean()), "wall_s_std": float(wall.std()),
            "tokens_mean": float(np.mean([r.tokens for r in results])),
            "switches_mean": float(np.mean([r.switches for r in results])),
            "forced_mean": float(np.mean([r.forced_switches for r in results])),
            "migration_s_mean": float(np.mean([r.migration_s for r in results])),
            "planning_charged_s_mean": float(np.mean([r.planning_charged_s for r in results])),
            "stall_s_mean": float(np.mean([r.stall_s for r in results])),
            "stalled_at_s": [r.stalled_at_s for r in results],
        }
        if static:
            rel = np.array([r.wall_s / s.wall_s - 1.0 for r, s in zip(results, static)])
            row["vs_static_mean"] = float(rel.mean())
            row["vs_static_min"] = float(rel.min())
            row["vs_static_max"] = float(rel.max())
        if "exact" in run.results:
            rel = np.array([r.wall_s / s.wall_s - 1.0
                            for r, s in zip(results, run.results["exact"])])
            row["vs_exact_mean"] = float(rel.mean())
            row["vs_exact_max"] = float(rel.max())
        rows.append(row)
    return rows


def _markdown(run: ScenarioRun) -> str:
    s = run.settings
    lines = [f"# replan: {run.scenario.name}", "",
             run.scenario.description.strip(), "",
             (f"- iterations: {s.iterations} ({s.tokens_per_iteration} tokens each); "
              f"seeds: {', '.join(map(str, run.seeds))}"),
             (f"- migration cost: {s.migration_s:.1f} s per switch; look-ahead "
              f"{s.lookahead_s:.0f} s; network states per seed: "
              f"{', '.join(str(len(t.states)) for t in run.timelines)}"), ""]
    lines += [("| strategy | wall time (s), mean ± sd | vs static | tokens | switches "
               "| migration (s) | planning charged (s) | no-plan stall (s) |"),
              "|---|---|---|---|---|---|---|---|"]
    for row in summary_rows(run):
        vs = (f"{row['vs_static_mean'] * 100:+.2f}%" if "vs_static_mean" in row and
              math.isfinite(row["vs_static_mean"]) else "n/a")
        stalled = [t for t in row["stalled_at_s"] if t is not None]
        wall = (f"{_fmt(row['wall_s_mean'])} ± {_fmt(row['wall_s_std'])}" if not stalled else
                f"stalls at {', '.join(f'{t:.0f} s' for t in stalled)}")
        lines.append(f"| {row['strategy']} | {wall} | {vs} | {row['tokens_mean']:.3g} | "
                     f"{row['switches_mean']:.1f} | {row['migration_s_mean']:.0f} | "
                     f"{row['planning_charged_s_mean']:.2f} | {row['stall_s_mean']:.0f} |")
    for name, why in run.skipped.items():
        lines.append(f"\n`{name}`: {why}")
    if run.policy_latencies:
        lat = np.array(run.policy_latencies) * 1e3
        lines.append(f"\npolicy decision latency: median {np.median(lat):.1f} ms, max "
                     f"{lat.max():.1f} ms over {len(lat)} decisions")
    if run.exact_latencies:
        lat = np.array(run.exact_latencies)
        lines.append(f"\nexact decision latency: median {np.median(lat):.2f} s, max "
                     f"{lat.max():.2f} s over {len(lat)} solves")
    return "\n".join(lines) + "\n"


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
    return {"scenario": run.scenario.name, "seeds": list(run.seeds),
            "iterations": run.settings.iterations,
            "tokens_per_iteration": run.settings.tokens_per_iteration,
            "migration_s": run.settings.migration_s, "lookahead_s": run.settings.lookahead_s,
            "skipped": run.skipped, "summary": summary_rows(run),
            "policy_latency_s": run.policy_latencies, "exact_latency_s": run.exact_latencies,
            "runs": {k: [r.to_dict() for r in v] for k, v in run.results.items()}}
