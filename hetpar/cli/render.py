"""Human-readable output (rich tables) for the CLI."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from hetpar.cluster.topology import Cluster
from hetpar.costmodel.estimate import GIB, Estimate
from hetpar.fidelity.report import ExperimentReport
from hetpar.problem.solution import Solution
from hetpar.workload.model import ModelSpec

__all__ = ["render_estimate", "render_solution", "render_calibration", "render_validation"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


# Rows of the memory table beyond which hosts alike in all but their name share a row.
_MANY_ROWS = 32


def host_list(names: Sequence[str], spell_out: int = 8) -> str:
    """Host names comma-separated; past ``spell_out`` of them, runs of one prefix with
    consecutive numbers as ``first..last`` and the count (``h100-0..h100-767 (768
    hosts)``), as thousands of hosts in a stage would otherwise fill the screen."""
    if len(names) <= spell_out:
        return ",".join(names)
    runs: list[list[str]] = []
    last: tuple[str, int] | None = None
    for name in names:
        stem, _, num = name.rpartition("-")
        here = (stem, int(num)) if stem and num.isdigit() else None
        if here is not None and last is not None and here == (last[0], last[1] + 1) and runs:
            runs[-1].append(name)
        else:
            runs.append([name])
        last = here
    text = ",".join(r[0] if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs)
    return f"{text} ({len(names):,} hosts)"


def uncalibrated_note(est: Estimate) -> str:
    """Which GPU types of the plan have no fitted efficiencies of their own, and whose they
    read instead (their architecture's calibrated type, or the default)."""
    by_entry: dict[str, list[str]] = defaultdict(list)
    for name, entry in zip(est.uncalibrated, est.uncalibrated_reads):
        by_entry[entry].append(name)
    parts = []
    for entry, names in by_entry.items():
        whose = ("the default's (fitted on A100 runs)" if entry == "default" else
                 f"the {entry}'s (the same architecture)")
        parts.append(f"{', '.join(names)}: no fitted efficiency of their own, so {whose} "
                     f"with their datasheet peak and bandwidth")
    return "; ".join(parts) + "; `hetpar profile` fits one on your hardware"


def render_estimate(console: Console, est: Estimate, cluster: Cluster, model: ModelSpec,
                    objective_name: str, objective_value: float) -> None:
    plan = est.plan
    console.print(f"[bold]cluster[/]  {cluster.summary()}")
    console.print(f"[bold]model[/]    {model.summary()}")
    console.print(f"[bold]plan[/]     {plan.num_stages} stages, {plan.num_gpus} GPUs, "
                  f"{plan.micro_batches} micro-batches, recompute {plan.recompute}, "
                  f"ZeRO-{plan.zero}{''.join(', ' + w for w in plan.option_words())}")
    if est.uncalibrated:
        console.print(f"[yellow]uncalibrated[/] {uncalibrated_note(est)}")

    layout = Table(title="Plan", title_justify="left")
    for col in ("stage", "layers", "tp", "dp", "GPU type", "hosts"):
        layout.add_column(col, justify="right" if col in ("stage", "layers", "tp", "dp") else "left")
    for s in est.stages:
        layout.add_row(str(s.index), str(s.layers), str(s.tp), str(s.dp), "/".join(s.gpu_types),
                       host_list(s.hosts))
    console.print(layout)

    t = Table(title="Per stage and micro-batch, slowest replica (ms)", title_justify="left")
    for col in ("stage", "fwd", "bwd", "recomp", "tp comm", "overhead", "p2p out", "dp intra"):
        t.add_column(col, justify="right")
    for s in est.stages:
        t.add_row(str(s.index), _ms(s.work.fwd), _ms(s.work.bwd), _ms(s.work.recompute),
                  _ms(s.work.tp_comm), _ms(s.work.overhead), _ms(s.p2p_out_s), _ms(s.dp_intra_s))
    console.print(t)

    mean = est.iter_time_mean
    b = Table(title="Iteration time breakdown (mean over bandwidth samples)",
              title_justify="left")
    b.add_column("term")
    b.add_column("seconds", justify="right")
    b.add_column("share", justify="right")
    labels = {"pipeline_fill": "pipeline fill (first micro-batch, all stages)",
              "pipeline_steady": "pipeline steady state ((M-1) x slowest cycle)",
              "dp_allreduce": "data-parallel gradient all-reduce",
              "optimizer": ("optimizer step (host CPU and PCIe copies)"
                            if plan.offload != "none" else "optimizer step"),
              "fixed_overhead": "fixed per-iteration overhead"}
    for key, value in est.breakdown.items():
        b.add_row(labels.get(key, key), f"{value:.4f}", f"{value / mean:.1%}")
    b.add_row("[bold]total[/]", f"[bold]{mean:.4f}[/]", "100.0%")
    console.print(b)

    m = Table(title="Memory per GPU (GiB)", title_justify="left")
    for col in ("stage", "host", "GPUs", "type", "used", "usable", "headroom"):
        m.add_column(col, justify="right" if col in ("used", "usable", "headroom") else "left")
    grouped: dict[tuple, list] = defaultdict(list)
    for r in est.memory:
        grouped[(r.stage, r.host, r.gpu_type, round(r.used_bytes), round(r.usable_bytes))].append(r)
    rows: dict[tuple, list] = defaultdict(list)  # hosts alike in all but name, when many
    for (stage, host, gtype, used, usable), reps in grouped.items():
        gpus = ",".join(map(str, sorted(g for r in reps for g in r.gpus)))
        alike: tuple = ((stage, gtype, used, usable, gpus) if len(grouped) > _MANY_ROWS
                        else (stage, host, gtype, used, usable, gpus))
        rows[alike].append((host, reps[0]))
    for alike, held in rows.items():
        r0 = held[0][1]
        head = r0.headroom_bytes / GIB
        m.add_row(str(alike[0]), host_list([h for h, _ in held]), alike[-1], r0.gpu_type,
                  f"{r0.used_bytes / GIB:.2f}", f"{r0.usable_bytes / GIB:.2f}",
                  f"[red]{head:.2f}[/]" if head < 0 else f"{head:.2f}")
    console.print(m)

    d = Table(title=f"Iteration time over {est.iter_time.size} bandwidth samples (s); "
                    f"objective {objective_name}", title_justify="left")
    for col in ("mean", "p50", "p90", "CVaR 0.9", "min", "max", "objective"):
        d.add_column(col, justify="right")
    d.add_row(f"{mean:.4f}", f"{est.iter_time_p50:.4f}", f"{est.iter_time_p90:.4f}",
              f"{est.iter_time_cvar90:.4f}", f"{est.iter_time.min():.4f}",
              f"{est.iter_time.max():.4f}",
              "inf" if math.isinf(objective_value) else f"{objective_value:.4f}")
    console.print(d)
    console.print(f"throughput {est.tokens_per_s:,.0f} tokens/s, MFU {est.mfu:.1%}")
    if est.feasible:
        console.print(f"[green]feasible[/]: smallest memory headroom "
                      f"{est.min_headroom_bytes / GIB:.2f} GiB")
    else:
        console.print(f"[red]infeasible[/]: {len(est.overflow)} replica(s) out of memory")
        for line in dict.fromkeys(est.overflow):
            console.print(f"  [red]{line}[/]")


def render_calibration(console: Console, rep: ExperimentReport) -> None:
    t = Table(title="Calibration: Megatron-LM SC21 Table 1 (A100)", title_justify="left")
    for col in ("row", "published s", "predicted s", "error", "micro-batches"):
        t.add_column(col, justify="right" if col != "row" else "left")
    for r in rep.results:
        t.add_row(r.row_id, f"{r.measured_s:.2f}", f"{r.predicted_s:.2f}", f"{r.error:+.1%}",
                  str(r.estimate.plan.micro_batches))
    console.print(t)
    console.print(f"mean absolute percentage error: [bold]{rep.mape:.1%}[/] (target <= 10%)")


def render_heldout(console: Console, rep: ExperimentReport,
                   title: str = "Korthikanti et al. 2022 Table 5 (A100)",
                   fitted: bool = False) -> None:
    role = "Used for fitting" if fitted else "Held out, never fitted"
    t = Table(title=f"{role}: {title}", title_justify="left")
    for col in ("row", "published s", "predicted s", "error", "predicted fits", "peak GiB"):
        t.add_column(col, justify="right" if col != "row" else "left")
    for r in rep.results:
        fits = "yes" if r.feasible else "[red]no[/]"
        peak = max(m.used_bytes for m in r.estimate.memory) / 2**30
        t.add_row(r.row_id, f"{r.measured_s:.2f}", f"{r.predicted_s:.2f}", f"{r.error:+.1%}",
                  fits, f"{peak:.1f}")
    console.print(t)
    target = "" if fitted else " (target <= 8%)"
    console.print(f"mean absolute percentage error: [bold]{rep.mape:.1%}[/]{target}; "
                  f"predicted to fit: [bold]{len(rep.results) - rep.false_infeasible}[/] of "
                  f"{len(rep.results)}")
    by_gpu = rep.mape_by_gpu
    if len(by_gpu) > 1:
        console.print("per GPU type: " + "; ".join(
            f"{gpu} {mape:.1%} ({n} rows{', uncalibrated' if gpu in rep.uncalibrated else ''})"
            for gpu, (mape, n) in by_gpu.items()))


def render_validation(console: Console, rep: ExperimentReport, fitted: bool) -> None:
    role = "used for fitting" if fitted else "held out, never fitted"
    t = Table(title=f"Validation: AMP GPT-2 {rep.name} ({role})", title_justify="left")
    for col in ("row", "measured s", "predicted s", "predicted fits"):
        t.add_column(col, justify="right" if col != "row" else "left")
    for r in sorted(rep.results, key=lambda r: r.measured_s):
        fits = ("yes" if not r.empty_stage else "yes (empty stage)") if r.feasible \
            else "[red]no[/]"
        t.add_row(r.row_id, f"{r.measured_s:.2f}", f"{r.predicted_s:.3f}", fits)
    console.print(t)
    pick = rep.predicted_best
    best = rep.measured_best
    console.print(f"Spearman [bold]{rep.spearman:.3f}[/], Kendall [bold]{rep.kendall:.3f}[/] "
                  f"over {len(rep.finite)} finished runs")
    if pick is not None:
        console.print(f"plan predicted best: {pick.row_id}, measured {pick.measured_s:.2f} s; "
                      f"measured best {best.row_id} {best.measured_s:.2f} s "
                      f"([bold]{rep.pick_slowdown:+.1%}[/])")
    console.print(f"failed runs predicted infeasible: [bold]{rep.failed_caught}[/] of "
                  f"{len(rep.failed)}; finished runs predicted infeasible: "
                  f"[bold]{rep.false_infeasible}[/]")
    console.print(f"failed runs that fit but have a stage without transformer layers (outside "
                  f"hetpar's plan space): [bold]{rep.failed_outside_space}[/]; finished runs "
                  f"with such a stage: [bold]{rep.finished_outside_space}[/]")


# Which part of a method found its plan (``Solution.found_by``), in words; a method that
# has a single part (the baselines, brute) says nothing more.
_FOUND_BY = {"metis": "the Metis-style seed", "megatron": "the Megatron-style seed",
             "start": "a start plan (--start)", "policy": "the policy (its plan a seed)",
             "dive": "the dive", "search": "the exhaustive search",
             "rollout": "the policy's rollout",
             "refine": "the refinement", "improve": "the structure search"}


def _dur(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def render_runtimes(plan) -> str:  # noqa: ANN001 - Plan
    """Which frameworks can run ``plan`` as it stands, and why the others cannot."""
    from hetpar.runtime.rules import RUNTIMES, check_plan

    ok = [n for n in RUNTIMES if not check_plan(plan, n)]
    out = f"runs on: {', '.join(ok)}"
    no = [(n, check_plan(plan, n)[0]) for n in RUNTIMES if n not in ok]
    if no:
        out += "; not on " + "; ".join(f"{n} ({why})" for n, why in no)
    return out


def render_solution(console: Console, sol: Solution) -> None:
    """The summary of any planner's ``Solution`` (``hetpar solve``, ``hetpar plan``): its
    value and inputs, who found the plan, the time of each part, the exact search's
    certificate and the policy's search figures, from the fields ``--json`` prints."""
    inputs = sol.inputs
    over = (f" over {inputs['samples']} bandwidth samples (seed {inputs['seed']})"
            if "samples" in inputs else "")
    # A method whose plan its single part found (metis by metis) says nothing more.
    found = _FOUND_BY.get(sol.found_by) if sol.found_by != sol.method else None
    console.print(f"[bold]{sol.method}[/]: objective {sol.objective} = {sol.value:.4f} s"
                  f"{over}, {sol.evaluations:,} plans scored in {sol.wall_s:.2f} s"
                  + (f"; best plan found by {found}" if found else ""), highlight=False)
    if sol.plan is not None:
        console.print(render_runtimes(sol.plan), highlight=False)
    parts = {k: v for k, v in sol.timings.items() if k != "forward"}
    if len(parts) > 1:
        console.print("time: " + ", ".join(f"{k} {_dur(v)}" for k, v in parts.items()),
                      highlight=False)
    _render_policy(console, sol)
    cert = sol.certificate
    if cert is None:
        return
    status = ("[green]proven optimal[/]" if cert.optimal else
              f"[yellow]stopped ({cert.stopped})[/]: proven lower bound "
              f"{cert.lower_bound:.4f} s, gap {sol.gap:.1%}")
    size = f"{cert.space_size:.3g}" + ("" if cert.space_size_exact else " (estimated)")
    console.print(f"{status}; {cert.nodes:,} nodes, {cert.leaves:,} full evaluations; pruned "
                  f"{cert.pruned_bound:,} by bound, {cert.pruned_memory:,} by memory, "
                  f"{cert.pruned_symmetry:,} by symmetry; space {size} plans, "
                  f"{cert.pruned_fraction:.6%} never evaluated; {cert.workers} worker(s)")


def _render_policy(console: Console, sol: Solution) -> None:
    """The policy planner's figures (``details`` of ``plan_with_policy``), if any."""
    d, t = sol.details, sol.timings
    if "policy" not in d:
        return
    searched = ""
    if d.get("micro_sweep"):
        searched = (f"; sweep of {d['sweep_memory']} memory options x micro-batch counts: "
                    f"{d['candidates']} rollouts compared")
    elif d["beam"] > 1:
        searched = f"; beam {d['beam']}, {d['candidates']} plans compared"
    console.print(f"[bold]rollout[/]: {d['steps']} steps ({d['forced']} forced{searched}) in "
                  f"[bold]{t['inference'] * 1e3:.1f} ms[/] of inference "
                  f"({t['forward'] * 1e3:.1f} ms forward passes), "
                  f"{t['setup'] * 1e3:.1f} ms setup; {d['policy']}", highlight=False)
    sl = d.get("slices")
    if sl:
        tried = ", ".join(f"{t['slice_hosts']} x {t['width']} hosts: {t['value_s']:.4f} s"
                          for t in sl["tried"])
        console.print(f"[bold]replica slices[/]: {sl['hosts']:,} hosts are more than the policy "
                      f"observes; it planned a slice of {sl['slice_hosts']} hosts, each standing "
                      f"for {sl['width']} alike hosts (global batch {sl['global_batch']} per "
                      f"slice), and the plan runs it {sl['width']} times over by data "
                      f"parallelism: {sl['slice_value_s']:.4f} s on the slice, "
                      f"{sol.value:.4f} s on the cluster; {sl['idle_hosts']:,} hosts in no slice "
                      f"(slices tried: {tried}; figures below are the kept slice's)",
                      highlight=False)
    if sol.method == "policy-raw":
        return
    raw = d["raw_value"]
    # On replica slices the rollout's, refinement's and search's figures are the slice's.
    final = sl["slice_value_s"] if sl else sol.value
    refined = d["improved_from"] if d["improved_from"] is not None else final
    change = (f"{raw:.4f} s -> {refined:.4f} s ({refined / raw - 1:+.1%})"
              if refined < raw else "no better split found")
    of = "the best structures'" if d["beam"] > 1 else "the rollout's"
    console.print(f"[bold]refinement[/] (micro-batches, recompute, layer split of {of} "
                  f"stages): {change} in {t['refine'] * 1e3:.1f} ms"
                  f"{'' if d['refine_complete'] else ' (step budget reached)'}",
                  highlight=False)
    if d["improve_evaluations"]:
        start = d["improved_from"]
        change = (f"{start:.4f} s -> {final:.4f} s ({final / start - 1:+.1%}, "
                  f"{d['improve_moves']} edits)" if d["improve_moves"]
                  else "no better structure found")
        console.print(f"[bold]structure search[/] ({d['improve_evaluations']} completions "
                      f"at most): {change} in {t['improve'] * 1e3:.1f} ms", highlight=False)
