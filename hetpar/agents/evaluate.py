"""``hetpar evaluate``: a policy against exact search and the baselines on a suite.

Every method plans each of the first ``n`` instances of a suite (``Suite.instance(i)``),
and every plan is scored the same way: its ``objective`` over ``samples`` bandwidth states
drawn with ``seed`` (``solve(..., samples=K, seed=seed)``; the policy's plan by
``plan_with_policy`` with the same K and seed), so values of one instance compare exactly.

Gaps follow DESIGN.md section 7: ``T / T_exact - 1`` where ``exact`` proved the optimum
within its time limit, otherwise ``T / T_best - 1`` with ``T_best`` the best plan any
method found (exact's incumbent included); the ``reference`` column says which.

Outputs (``write_outputs``): ``results.csv`` (one row per instance and method),
``summary.md`` (per method: median, p90 and worst gap, win rates against every other
method, median latency) and ``gap_vs_size.png`` (gap against the cluster's GPU count).
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetpar.costmodel.objective import Objective
from hetpar.errors import ConfigError, HetparError
from hetpar.solvers.local_search import DEFAULT_EVALUATIONS

__all__ = [
    "CSV_COLUMNS",
    "METHODS",
    "Evaluation",
    "Row",
    "evaluate",
    "plot_gaps",
    "write_outputs",
]

METHODS = ("policy", "policy-beam", "policy-greedy", "policy-raw", "exact", "metis",
           "megatron", "random")
# policy: ``hetpar plan``'s default (the single most likely rollout, refinement of its
# structure's inner choices, then the local search over structures); policy-beam: the
# same from a beam search (``beam``, default WIDE_BEAM); policy-greedy: the refined
# rollout without the structure search (``hetpar plan --no-improve``); policy-raw: that
# rollout's plan alone, to show what the network itself decides.
POLICY_METHODS = ("policy", "policy-beam", "policy-greedy", "policy-raw")
CSV_COLUMNS = ("suite", "index", "instance", "hosts", "gpus", "model", "method", "objective",
               "value_s", "wall_s", "inference_s", "optimal", "gap", "reference", "error")
_TIE = 1e-9  # relative difference below which two values are a tie


@dataclass
class Row:
    """One method on one instance."""

    suite: str
    index: int
    instance: str
    hosts: int
    gpus: int
    model: str
    method: str
    objective: str
    value_s: float  # inf: no plan
    wall_s: float  # time to produce the plan (policy: setup, rollout, refinement, search)
    inference_s: float = math.nan  # policy only: the rollout or beam search alone
    optimal: bool = False  # exact only: the search proved the optimum
    gap: float = math.nan
    reference: str = ""
    error: str = ""

    def as_csv(self) -> dict[str, Any]:
        def num(x: float) -> str:
            return "" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.6g}"

        return {"suite": self.suite, "index": self.index, "instance": self.instance,
                "hosts": self.hosts, "gpus": self.gpus, "model": self.model,
                "method": self.method, "objective": self.objective,
                "value_s": num(self.value_s), "wall_s": f"{self.wall_s:.6f}",
                "inference_s": "" if math.isnan(self.inference_s) else f"{self.inference_s:.6f}",
                "optimal": str(self.optimal).lower(), "gap": num(self.gap),
                "reference": self.reference, "error": self.error}


@dataclass
class Evaluation:
    """All rows of one evaluation and how it was run."""

    suite: str
    n: int
    methods: tuple[str, ...]
    objective: str
    samples: int
    seed: int
    time_limit: float
    policy: str = ""
    rows: list[Row] = field(default_factory=list)

    def of(self, method: str) -> list[Row]:
        return [r for r in self.rows if r.method == method]

    def value(self, index: int, method: str) -> float:
        for r in self.rows:
            if r.index == index and r.method == method:
                return r.value_s
        return math.inf

    @property
    def exact_optimal(self) -> int:
        """Instances on which exact proved the optimum."""
        return sum(r.optimal for r in self.of("exact"))

    def win_rate(self, method: str, other: str) -> tuple[float, float]:
        """(share of instances where ``method`` is at least as good as ``other``, share
        where it is strictly better); a method without a plan loses to one with a plan."""
        idx = sorted({r.index for r in self.rows})
        ok = strict = 0
        for i in idx:
            a, b = self.value(i, method), self.value(i, other)
            if math.isinf(a) and math.isinf(b):
                continue  # neither found a plan: neither wins
            if a <= b * (1 + _TIE):
                ok += 1
            if a < b * (1 - _TIE):
                strict += 1
        return (ok / len(idx), strict / len(idx)) if idx else (math.nan, math.nan)

    def stats(self, method: str) -> dict[str, float]:
        rows = self.of(method)
        gaps = [r.gap for r in rows if not math.isnan(r.gap)]
        walls = [r.wall_s for r in rows]
        infer = [r.inference_s for r in rows if not math.isnan(r.inference_s)]
        return {"plans": float(sum(math.isfinite(r.value_s) for r in rows)),
                "instances": float(len(rows)),
                "median_gap": _quantile(gaps, 0.5), "p90_gap": _quantile(gaps, 0.9),
                "worst_gap": max(gaps) if gaps else math.nan,
                "mean_gap": float(np.mean(gaps)) if gaps and all(map(math.isfinite, gaps))
                else (math.inf if gaps else math.nan),
                "median_wall_s": _quantile(walls, 0.5),
                "median_inference_s": _quantile(infer, 0.5)}

    def summary_markdown(self) -> str:
        others = list(self.methods)
        head = ["method", "plans", "median gap", "p90 gap", "worst gap"]
        head += [f"wins vs {m}" for m in others]
        head += ["median latency"]
        lines = [f"## `{self.suite}`: instances 0-{self.n - 1}", ""]
        ref = (f"exact proved the optimum on {self.exact_optimal} of {self.n} instances "
               f"(time limit {self.time_limit:g} s each)" if "exact" in self.methods else
               "exact was not run")
        lines.append(f"Objective `{self.objective}` over {self.samples} bandwidth samples "
                     f"(seed {self.seed}); {ref}.")
        if "exact" not in self.methods or self.exact_optimal < self.n:
            lines.append("Where exact did not prove the optimum, gaps are relative to the "
                         "best plan any method found (column `reference` of results.csv).")
        if self.policy:
            lines.append(f"Policy: `{self.policy}`.")
        lines += ["", "| " + " | ".join(head) + " |",
                  "|" + "|".join(["---"] + ["--:"] * (len(head) - 1)) + "|"]
        for m in self.methods:
            st = self.stats(m)
            cells = [m, f"{int(st['plans'])}/{int(st['instances'])}", _pct(st["median_gap"]),
                     _pct(st["p90_gap"]), _pct(st["worst_gap"])]
            for o in others:
                if o == m:
                    cells.append("-")
                else:
                    ok, strict = self.win_rate(m, o)
                    cells.append(f"{ok:.0%} ({strict:.0%})")
            lat = _dur(st["median_wall_s"])
            if not math.isnan(st["median_inference_s"]):
                lat += f" (inference {_dur(st['median_inference_s'])})"
            cells.append(lat)
            lines.append("| " + " | ".join(cells) + " |")
        note = ("Gap: T / T_ref - 1 of the objective. Wins: share of instances where the row's "
                "method is at least as good as the column's (ties count); in brackets strictly "
                "better. Latency: wall time to produce the plan (the policy's includes building "
                "the environment, refinement, structure search and scoring; its inference is "
                "the masked rollout or beam search alone).")
        lines += ["", note]
        return "\n".join(lines) + "\n"


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile that tolerates infinite values (no plan)."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi or v[lo] == v[hi]:
        return float(v[lo])
    if math.isinf(v[hi]):
        return math.inf
    return float(v[lo] + (pos - lo) * (v[hi] - v[lo]))


def _pct(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "no plan"
    return f"{x:.1%}"


def _dur(s: float) -> str:
    if math.isnan(s):
        return "n/a"
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.1f} s"


def evaluate(suite: Any, n: int, methods: Sequence[str] = METHODS, *, bundle: Any = None,
             objective: str | None = None, samples: int | None = None, seed: int = 0,
             time_limit: float = 60.0, workers: int = 1, budget: int = 200,
             beam: int | None = None,
             isolate: bool = True, grace_s: float | None = None, memory_gib: float = 8.0,
             progress: Callable[[int, str], None] | None = None,
             on_start: Callable[[int, str], None] | None = None) -> Evaluation:
    """Run ``methods`` on instances ``0 .. n-1`` of ``suite`` (a ``Suite`` or its name).

    ``bundle`` (a loaded policy) is needed when ``policy`` is among the methods; the
    objective and sample count default to the policy's training settings (else ``mean``
    and 16). ``progress(index, method)`` is called after every method on every instance.

    ``isolate`` runs ``exact`` in a child process (``run_exact_isolated``) that is stopped
    ``grace_s`` seconds after its time limit (default: max(30 s, the time limit)) and may
    use at most ``memory_gib`` of address space, so one instance on which the search
    does not honour its limit cannot stall or exhaust the machine; such a run counts as
    "no plan" and the instance's gaps are taken against the best plan found.
    """
    from hetpar.problem import Problem
    from hetpar.solvers.api import solve

    if isinstance(suite, (str, Path)):
        from hetpar.problem.generator import load_suite
        suite = load_suite(suite)
    methods = tuple(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError("", "methods", f"unknown method(s) {', '.join(unknown)} "
                                         f"(known: {', '.join(METHODS)})")
    if any(m in POLICY_METHODS for m in methods) and bundle is None:
        raise ConfigError("", "policy", "the policy methods need a policy")
    from hetpar.agents.planner import WIDE_BEAM
    width = WIDE_BEAM if beam is None else beam
    defaults = bundle.env_kwargs if bundle is not None else {}
    obj = Objective.parse(objective if objective is not None else
                          str(defaults.get("objective", "mean")))
    k = int(samples if samples is not None else defaults.get("samples", 16))
    instances = suite.instances(n)
    if any(m in POLICY_METHODS for m in methods):
        from hetpar.agents.planner import check_hosts
        for inst in instances:  # refuse before hours of exact search, not after
            check_hosts(bundle, inst, f"{suite.name} instance {inst.name}")

    result = Evaluation(suite.name, n, methods, obj.name, k, seed, time_limit,
                        policy=str(bundle.path) if bundle is not None else "")
    for i, inst in enumerate(instances):
        cluster, model, training = inst.cluster, inst.model, inst.training
        rows: list[Row] = []
        for m in methods:
            if on_start is not None:
                on_start(i, m)
            res: dict[str, Any] = {}
            row = Row(suite.name, i, inst.name, inst.num_hosts, cluster.num_gpus, model.name,
                      m, obj.name, math.inf, 0.0)
            start = time.perf_counter()
            try:
                if m in POLICY_METHODS:
                    from hetpar.agents.planner import plan_with_policy
                    pp = plan_with_policy(bundle, inst, objective=obj, seed=seed, samples=k,
                                          refine=m != "policy-raw",
                                          beam=width if m == "policy-beam" else 1,
                                          improve_evaluations=DEFAULT_EVALUATIONS
                                          if m in ("policy", "policy-beam") else 0)
                    # The policy's own part (the latency target's "policy inference");
                    # wall_s holds the whole.
                    row.value_s, row.inference_s = pp.value, pp.inference_s
                elif m == "exact" and isolate:
                    res = run_exact_isolated(inst, obj.name, k, seed, time_limit, workers,
                                             grace_s=grace_s, memory_gib=memory_gib)
                    row.value_s, row.optimal = res["value_s"], res["optimal"]
                    row.error = res["error"]
                else:
                    sol = solve(Problem.of(cluster, model, training, objective=obj, samples=k, seed=seed), method=m, workers=workers, budget=budget, time_limit=time_limit if m == "exact" else None)
                    row.value_s = sol.value if sol.found else math.inf
                    row.optimal = bool(sol.certificate is not None and sol.certificate.optimal)
                    if not sol.found:
                        row.error = "no plan found"
            except HetparError as exc:
                row.error = " ".join(str(exc).split())
            row.wall_s = time.perf_counter() - start
            if "wall_s" in res:
                row.wall_s = res["wall_s"]  # the search itself, without the process start
            rows.append(row)
            if progress is not None:
                progress(i, m)
        _fill_gaps(rows)
        result.rows.extend(rows)
    return result


def _exact_child(conn: Any, inst_doc: dict[str, Any], objective: str, samples: int, seed: int,
                 time_limit: float, workers: int, memory_bytes: int) -> None:
    """Body of the child process of ``run_exact_isolated``."""
    import os
    import resource

    os.setsid()  # its own process group: the parent stops it together with its workers
    if memory_bytes > 0:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        except (ValueError, OSError):  # pragma: no cover - a hard limit below ours
            pass
    out: dict[str, Any] = {"value_s": math.inf, "optimal": False, "error": ""}
    try:
        from hetpar.problem.instance import Instance
        from hetpar.solvers.api import solve

        inst = Instance.from_dict(inst_doc)
        start = time.perf_counter()
        sol = solve(Problem.of(inst.cluster, inst.model, inst.training, objective=objective, samples=samples, seed=seed), method="exact", workers=workers, time_limit=time_limit)
        out["wall_s"] = time.perf_counter() - start
        if sol.found:
            out["value_s"] = sol.value
            out["optimal"] = bool(sol.certificate is not None and sol.certificate.optimal)
        else:
            out["error"] = "no plan found"
    except HetparError as exc:
        out["error"] = " ".join(str(exc).split())
    except MemoryError:
        out["error"] = f"out of memory (limit {memory_bytes / 2**30:.0f} GiB)"
    try:
        conn.send(out)
        conn.close()
    except (BrokenPipeError, OSError):  # the parent stopped waiting
        pass


def run_exact_isolated(inst: Any, objective: str, samples: int, seed: int, time_limit: float,
                       workers: int = 1, *, grace_s: float | None = None,
                       memory_gib: float = 8.0) -> dict[str, Any]:
    """``solve(method="exact")`` on ``inst`` in a child process with a hard stop.

    Returns ``value_s`` (inf without a plan), ``optimal``, ``error`` ("" when fine) and,
    when the search answered, ``wall_s``. The child (and its search workers) is killed
    ``grace_s`` after ``time_limit`` (default max(30, time_limit) seconds)."""
    import multiprocessing as mp
    import os
    import signal

    grace = max(30.0, time_limit) if grace_s is None else grace_s
    hard = time_limit + grace
    ctx = mp.get_context("forkserver")
    # Children fork from a server that has the solver imported (once per process).
    ctx.set_forkserver_preload(["hetpar.solvers.api", "hetpar.problem.instance"])
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_exact_child, daemon=False,
                       args=(send, inst.to_dict(), objective, samples, seed, time_limit,
                             workers, int(memory_gib * 2**30)))
    proc.start()
    send.close()
    try:
        if recv.poll(hard):
            try:
                return dict(recv.recv())
            except EOFError:
                pass
        else:
            return {"value_s": math.inf, "optimal": False,
                    "error": f"exact did not return within {hard:.0f} s (time limit "
                             f"{time_limit:g} s + {grace:.0f} s grace); stopped"}
        proc.join(5)
        return {"value_s": math.inf, "optimal": False,
                "error": f"exact search process died (exit code {proc.exitcode}; out of "
                         f"memory?)"}
    finally:
        if proc.pid is not None:
            try:  # the child and the search workers it started (its process group)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if proc.is_alive():  # stopped before it made its own group
                proc.kill()
        proc.join(5)
        recv.close()


def _fill_gaps(rows: list[Row]) -> None:
    """Gaps of one instance's rows: to a proven-optimal exact, else to the best plan."""
    exact = next((r for r in rows if r.method == "exact" and r.optimal), None)
    if exact is not None:
        ref, label = exact.value_s, "exact (optimal)"
    else:
        found = [r for r in rows if math.isfinite(r.value_s)]
        if not found:
            for r in rows:
                r.reference = "none (no method found a plan)"
            return
        best = min(found, key=lambda r: r.value_s)
        ref, label = best.value_s, f"best found ({best.method})"
    for r in rows:
        r.reference = label
        if math.isinf(r.value_s):
            r.gap = math.inf
        else:
            gap = r.value_s / ref - 1.0
            r.gap = 0.0 if abs(gap) < 1e-12 else gap


def write_outputs(result: Evaluation, out_dir: str | Path) -> list[Path]:
    """Write results.csv, summary.md and gap_vs_size.png into ``out_dir`` (created)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        csv_path = out / "results.csv"
        with csv_path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            for r in result.rows:
                writer.writerow(r.as_csv())
        md_path = out / "summary.md"
        md_path.write_text(result.summary_markdown(), encoding="utf-8")
        png_path = plot_gaps(result, out / "gap_vs_size.png")
    except OSError as exc:
        raise ConfigError(str(out), "", f"cannot write: {exc.strerror}") from None
    return [csv_path, md_path, png_path]


def plot_gaps(result: Evaluation, path: str | Path) -> Path:
    """Scatter of the gap (%) against the cluster's GPU count, one series per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    markers = {"policy": "o", "policy-beam": "*", "policy-greedy": "P", "policy-raw": "D",
               "exact": "s", "metis": "^", "megatron": "v", "random": "x"}
    worst = 0.0
    for j, m in enumerate(result.methods):
        pts = [(r.gpus, r.gap * 100) for r in result.of(m) if math.isfinite(r.gap)]
        if not pts:
            continue
        x = np.array([p[0] for p in pts], dtype=float)
        # A small horizontal offset per method keeps coincident points visible.
        x = x * (1 + 0.015 * (j - (len(result.methods) - 1) / 2))
        y = np.array([p[1] for p in pts])
        worst = max(worst, float(y.max()))
        ax.scatter(x, y, label=m, marker=markers.get(m, "o"), s=28, alpha=0.8)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    if worst > 50:
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(-1.0, worst * 1.6)
    else:
        ax.set_ylim(-0.05 * max(worst, 1.0), max(worst, 1.0) * 1.1)
    ax.set_xlabel("cluster size (GPUs)")
    ax.set_ylabel("gap to reference (%)")
    ax.set_title(f"{result.suite}: objective {result.objective}, {result.n} instances "
                 f"(reference: exact optimum, else best plan found)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
