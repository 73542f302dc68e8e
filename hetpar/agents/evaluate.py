"""``hetpar evaluate``: a policy against exact search and the baselines on a suite.

Every method plans each of the first ``n`` instances of a suite (``Suite.instance(i)``)
through ``hetpar.agents.planning.plan``, on one ``Problem`` per instance: every plan is
scored the same way, its ``objective`` over ``samples`` bandwidth states drawn with
``seed``, so values of one instance compare exactly. Each row keeps the method's
``Solution`` (``Row.to_dict``: the result fields ``hetpar plan --json`` and ``hetpar
solve --json`` print, and the row's place in the evaluation).

Gaps (docs/results.md): ``T / T_exact - 1`` where ``exact`` proved the optimum
within its time limit, otherwise ``T / T_best - 1`` with ``T_best`` the best plan any
method found (exact's incumbent included); the ``reference`` column says which.

With a reference file (``hetpar.agents.reference``, ``configs/references/SUITE.json``),
every row also has its gaps to the file's entry for the instance (``REFERENCE_COLUMNS``):
to the proven optimum where the file has one (``gap_to_optimum``), else to the proven
bound (``gap_to_bound``, an upper bound on the true gap) and to the file's best plan
(``gap_to_ref_best``). The file must match the suite, the cost model, the objective,
samples and seed, and its plans must score as stored (ConfigError otherwise).

Outputs (``write_outputs``): ``results.csv`` (one row per instance and method),
``results.json`` (the same rows with every result field, plans included),
``summary.md`` (per method: median, p90 and worst gap, win rates against every other
method, median latency) and ``gap_vs_size.png`` (gap against the cluster's GPU count).
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hetpar.agents import planning
from hetpar.costmodel.objective import Objective
from hetpar.errors import ConfigError, HetparError
from hetpar.problem import POLICY_SAMPLES, Problem, Solution
from hetpar.solvers.isolated import run_exact_isolated

__all__ = [
    "CSV_COLUMNS",
    "METHODS",
    "REFERENCE_COLUMNS",
    "Evaluation",
    "Row",
    "evaluate",
    "plot_gaps",
    "write_outputs",
]

# Every method of ``planning.plan``, the policy's first.
METHODS = ("policy", "policy-beam", "policy-greedy", "policy-raw", "exact", "metis",
           "megatron", "random", "local-search", "brute")
# policy: ``hetpar plan``'s default (the single most likely rollout, refinement of its
# structure's inner choices, then the local search over structures); policy-beam: the
# same from a beam search (``beam``, default WIDE_BEAM); policy-greedy: the refined
# rollout without the structure search (``hetpar plan --no-improve``); policy-raw: that
# rollout's plan alone, to show what the network itself decides.
POLICY_METHODS = planning.POLICY_METHODS
assert set(METHODS) == set(planning.METHODS)
CSV_COLUMNS = ("suite", "index", "instance", "hosts", "gpus", "model", "method", "objective",
               "value_s", "wall_s", "inference_s", "optimal", "gap", "reference", "error")
# Appended to results.csv when the evaluation has a reference file. ref_status: optimal
# (the file proves the optimum), bounded (a bound, not met), unbounded (a plan, no bound),
# none (no entry for the instance).
REFERENCE_COLUMNS = ("ref_status", "ref_value_s", "ref_bound_s", "gap_to_optimum",
                     "gap_to_bound", "gap_to_ref_best")
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
    solution: Solution | None = None  # the method's answer (None: no answer, or isolated)
    inputs: dict[str, Any] = field(default_factory=dict)  # the problem's (Problem.describe)
    # Against the reference file (REFERENCE_COLUMNS); ref_status "" when there is none.
    ref_status: str = ""
    ref_value_s: float = math.nan
    ref_bound_s: float = math.nan
    gap_to_optimum: float = math.nan
    gap_to_bound: float = math.nan
    gap_to_ref_best: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """The result fields every command prints (``Solution.to_dict``) and the row's
        place in the evaluation: suite, index, instance, hosts, gpus, the gap to the
        instance's reference (``reference_gap``; ``gap`` is the method's own bound gap)
        and the error."""
        sol = self.solution
        if sol is None:
            # No Solution came back (an error, or the isolated exact search, which
            # answers with its value alone): the same fields, from what the row knows.
            sol = Solution(self.method, self.objective, None, None, self.value_s,
                           self.wall_s, inputs=self.inputs)
            out = sol.to_dict()
            out.update(found=math.isfinite(self.value_s), optimal=self.optimal)
        else:
            out = sol.to_dict()
        # The row's wall time, as in results.csv (for the isolated search, without the
        # process start).
        out["wall_s"] = self.wall_s
        out.update(suite=self.suite, index=self.index, instance=self.instance,
                   hosts=self.hosts, gpus=self.gpus, reference=self.reference,
                   reference_gap=self.gap, error=self.error)
        if self.ref_status:
            out.update({k: _json_num(getattr(self, k)) if k != "ref_status" else self.ref_status
                        for k in REFERENCE_COLUMNS})
        return out

    def as_csv(self, reference: bool = False) -> dict[str, Any]:
        """One results.csv row; with ``reference``, the REFERENCE_COLUMNS too."""
        def num(x: float) -> str:
            return "" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.6g}"

        extra: dict[str, Any] = {}
        if reference:
            extra = {k: self.ref_status if k == "ref_status" else num(getattr(self, k))
                     for k in REFERENCE_COLUMNS}
        return {**self._csv(num), **extra}

    def _csv(self, num: Callable[[float], str]) -> dict[str, Any]:
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
    reference: str = ""  # the reference file's path ("" : none)

    def of(self, method: str) -> list[Row]:
        return [r for r in self.rows if r.method == method]

    def to_dict(self) -> dict[str, Any]:
        """The evaluation's settings and every row's result fields (``Row.to_dict``)."""
        return {"suite": self.suite, "n": self.n, "methods": list(self.methods),
                "objective": self.objective, "samples": self.samples, "seed": self.seed,
                "time_limit_s": self.time_limit, "policy": self.policy,
                **({"reference_file": self.reference} if self.reference else {}),
                "rows": [r.to_dict() for r in self.rows]}

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
        if self.reference:
            lines += ["", *self._reference_markdown()]
        return "\n".join(lines) + "\n"

    def _reference_markdown(self) -> list[str]:
        """Per method: gaps to the reference file's optima, bounds and best plans."""
        first = self.of(self.methods[0])
        status = [r.ref_status for r in first]
        proven, bounded = status.count("optimal"), status.count("bounded")
        unbounded, missing = status.count("unbounded"), status.count("none")
        lines = [f"### Gaps to the reference file `{self.reference}`", "",
                 f"Of {len(status)} instances the file proves the optimum of {proven}, bounds "
                 f"{bounded} without proof and has a plan without a bound for {unbounded}"
                 + (f"; it has no entry for {missing}" if missing else "") + ". Gap to "
                 "optimum: T / T_opt - 1 on the proven instances. On the others, gap to "
                 "bound: T / bound - 1, an upper bound on the true gap, and gap to ref best: "
                 "T / T_ref - 1, to the best plan the reference build found.", "",
                 "| method | gap to optimum (median / worst) | gap to bound (median / worst) "
                 "| gap to ref best (median / worst) |", "|---|--:|--:|--:|"]
        for m in self.methods:
            rows = self.of(m)
            cells = [m]
            for key in ("gap_to_optimum", "gap_to_bound", "gap_to_ref_best"):
                gaps = [getattr(r, key) for r in rows if not math.isnan(getattr(r, key))]
                cells.append(f"{_pct(_quantile(gaps, 0.5))} / "
                             f"{_pct(max(gaps) if gaps else math.nan)} ({len(gaps)})")
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "In brackets: instances counted."]
        beaten = self.beaten_references()
        if beaten:
            names = ", ".join(f"{r.instance} by {r.method} ({_pct(r.gap_to_ref_best)})"
                              for r in beaten)
            from hetpar.agents.reference import DEFAULT_SEEDS, SEED_METHODS

            methods = sorted({r.method for r in beaten})
            # exact is not a seed method: a retry runs it anyway, with its stored plan.
            seeds = list(DEFAULT_SEEDS) + [m for m in methods
                                           if m in SEED_METHODS and m not in DEFAULT_SEEDS]
            lines += ["", f"**The reference file is stale against {','.join(methods)}**: "
                          f"on {len({r.index for r in beaten})} instance(s) a plan of this "
                          f"run beats its best plan ({names}), so gaps to it understate "
                          f"those methods' worth. Solve the file's unproven entries again "
                          f"with them among the seeds: `hetpar reference build {self.suite} "
                          f"--n {self.n} --retry --seeds {','.join(seeds)}`."]
        return lines

    def beaten_references(self) -> list[Row]:
        """Rows whose plan beats the reference file's best plan of an instance it does not
        prove optimal (a stale reference: a method of this run found a better plan than
        the build's seeds and exact search did)."""
        from hetpar.agents.reference import TIE

        return [r for r in self.rows
                if r.ref_status in ("bounded", "unbounded") and r.gap_to_ref_best < -TIE]


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


def _json_num(x: float) -> float | None:
    return None if math.isnan(x) else x


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
             on_start: Callable[[int, str], None] | None = None,
             reference: Any = None, backend: str = "local",
             address: str | None = None) -> Evaluation:
    """Run ``methods`` on instances ``0 .. n-1`` of ``suite`` (a ``Suite`` or its name).

    ``bundle`` (a loaded policy) is needed when ``policy`` is among the methods; the
    objective and sample count default to the policy's training settings (else ``mean``
    and ``POLICY_SAMPLES``). Every method plans one ``Problem`` per instance through
    ``planning.plan``. ``progress(index, method)`` is called after every method on every
    instance.

    ``isolate`` runs ``exact`` in a child process (``run_exact_isolated``) that is stopped
    ``grace_s`` seconds after its time limit (default: max(30 s, the time limit)) and may
    use at most ``memory_gib`` of address space, so one instance on which the search
    does not honour its limit cannot stall or exhaust the machine; such a run counts as
    "no plan" and the instance's gaps are taken against the best plan found.

    ``backend="ray"`` runs each instance (all its methods) as a Ray task of one CPU,
    ``workers`` instances at a time, each exact search in it on one worker (the cluster at
    ``address``, or a local Ray of ``workers`` CPUs); the rows are the same as the local
    backend's where the methods are deterministic, in instance order. ``progress`` is
    then called per method once its instance is done.

    ``reference`` (a loaded ``hetpar.agents.reference.References``) adds each row's gaps
    to the file's entries. It is checked before any method runs: a file for another
    suite, cost model, objective, samples or seed, an entry for another instance or a
    plan that no longer scores as stored is a ConfigError naming the mismatch.
    """
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
    k = int(samples if samples is not None else defaults.get("samples", POLICY_SAMPLES))
    instances = suite.instances(n)
    if any(m in POLICY_METHODS for m in methods):
        from hetpar.agents.io import check_compatible
        for inst in instances:  # refuse before hours of exact search, not after
            # More hosts than the policy observes are planned as replica slices: only a
            # model of more layers than it handles is refused.
            check_compatible(bundle, None, source=f"{suite.name} instance {inst.name}",
                             model_layers=inst.model.layers)

    result = Evaluation(suite.name, n, methods, obj.name, k, seed, time_limit,
                        policy=str(bundle.path) if bundle is not None else "",
                        reference=reference.source if reference is not None else "")
    entries = (_reference_entries(reference, suite, instances, obj, k, seed)
               if reference is not None else None)
    settings = _Settings(suite.name, methods, obj, k, seed, time_limit, workers, budget,
                         width, isolate, grace_s, memory_gib)
    per_instance: Iterable[list[Row]]
    if backend == "ray":
        per_instance = _on_ray(settings, instances, bundle, address, progress)
    elif backend == "local":
        per_instance = (_instance_rows(settings, i, inst, bundle, progress, on_start)
                        for i, inst in enumerate(instances))
    else:
        raise ConfigError("", "backend", f"unknown backend {backend!r} (local, ray)")
    for i, rows in enumerate(per_instance):
        _fill_gaps(rows)
        if entries is not None:
            _fill_reference_gaps(rows, entries.get(i))
        result.rows.extend(rows)
    return result


@dataclass(frozen=True)
class _Settings:
    """What every instance's run needs (picklable: it travels to Ray workers)."""

    suite: str
    methods: tuple[str, ...]
    objective: Objective
    samples: int
    seed: int
    time_limit: float
    workers: int
    budget: int
    beam: int
    isolate: bool
    grace_s: float | None
    memory_gib: float


def _instance_rows(st: _Settings, i: int, inst: Any, bundle: Any,
                   progress: Callable[[int, str], None] | None = None,
                   on_start: Callable[[int, str], None] | None = None) -> list[Row]:
    """Every method on one instance (gaps not filled yet)."""
    # One problem per instance: every method is scored by its states (and shares its
    # cost model's tables).
    problem = Problem.from_instance(inst, objective=st.objective, samples=st.samples,
                                    seed=st.seed)
    rows: list[Row] = []
    for m in st.methods:
        if on_start is not None:
            on_start(i, m)
        res: dict[str, Any] = {}
        row = Row(st.suite, i, inst.name, inst.num_hosts, inst.cluster.num_gpus,
                  inst.model.name, m, st.objective.name, math.inf, 0.0,
                  inputs=problem.describe())
        start = time.perf_counter()
        try:
            if m == "exact" and st.isolate:
                res = run_exact_isolated(inst, st.objective.name, st.samples, st.seed,
                                         st.time_limit, st.workers, grace_s=st.grace_s,
                                         memory_gib=st.memory_gib)
                row.value_s, row.optimal = res["value_s"], res["optimal"]
                row.error = res["error"]
            else:
                sol = planning.plan(problem, m, policy=bundle,
                                    **_options(m, inst, st.beam, st.workers, st.budget,
                                               st.time_limit))
                row.solution = sol
                row.value_s = sol.value if sol.found else math.inf
                row.optimal = sol.optimal
                if m in POLICY_METHODS:
                    # The policy's own part (the latency target's "policy inference");
                    # wall_s holds the whole.
                    row.inference_s = sol.timings["inference"]
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
    return rows


def _on_ray(st: _Settings, instances: Sequence[Any], bundle: Any, address: str | None,
            progress: Callable[[int, str], None] | None) -> list[list[Row]]:
    """``_instance_rows`` of every instance as Ray tasks, ``st.workers`` in flight. A task
    whose worker dies is retried by Ray."""
    from hetpar.solvers.ray_executor import _ray, connect, ray_map

    in_flight = st.workers
    st = replace(st, workers=1)  # one CPU per instance task, its exact search included
    connect(address, in_flight)
    shared = _ray().put(bundle)  # the policy travels once, not with every instance
    out: dict[int, list[Row]] = {}

    def done(i: int, rows: list[Row]) -> None:
        out[i] = rows
        if progress is not None:
            for m in st.methods:
                progress(i, m)

    ray_map(_instance_rows, [(st, i, inst, shared) for i, inst in enumerate(instances)],
            in_flight, done, address=address)
    return [out[i] for i in range(len(instances))]


def _reference_entries(reference: Any, suite: Any, instances: Sequence[Any],
                       objective: Objective, samples: int, seed: int) -> dict[int, Any]:
    """The reference file's entries of these instances, checked before any method runs:
    the header matches, each entry is for the instance and its plan scores as stored
    (else a ConfigError)."""
    from hetpar.agents.reference import TIE, entry_constants_digest, instance_digest
    from hetpar.plan import Plan

    hint = "build a matching one with 'hetpar reference build', or pass --no-reference"
    reference.require_match(suite, objective.name, samples, seed, hint)
    out = {}
    for i, inst in enumerate(instances):
        entry = reference.entries.get(i)
        if entry is None:
            continue
        where = f"instances[{i}]"
        if entry.instance_digest != instance_digest(inst):
            raise ConfigError(reference.source, where, f"{entry.name} is not this suite's "
                              f"instance {i} ({inst.name}); run 'hetpar reference check'")
        if entry.constants_digest and entry.constants_digest != entry_constants_digest(inst):
            raise ConfigError(reference.source, where,
                              "stale: solved under other calibrated constants of its GPU "
                              "types or framework; run 'hetpar reference check'")
        if entry.plan is not None:
            # A problem of its own, dropped at once: the evaluation's are made one at a
            # time, so that their cost models never all live together.
            problem = Problem.from_instance(inst, objective=objective, samples=samples,
                                            seed=seed)
            plan = Plan.from_dict(entry.plan, f"{reference.source}: {where}.plan")
            problem.estimate(plan, source=f"{reference.source}: {where}.plan")  # validates
            value = problem.value(plan)
            if not abs(value - entry.value_s) <= TIE * max(abs(value), abs(entry.value_s)):
                raise ConfigError(reference.source, where,
                                  f"stale: its plan scores {value:.9g} s, the file says "
                                  f"{entry.value_s:.9g} s; run 'hetpar reference check'")
        out[i] = entry
    return out


def _fill_reference_gaps(rows: list[Row], entry: Any) -> None:
    """Each row's gaps to the reference entry of its instance (None: no entry)."""
    def gap(value: float, ref: float) -> float:
        if math.isinf(value):
            return math.inf
        g = value / ref - 1.0
        return 0.0 if abs(g) < 1e-12 else g

    for r in rows:
        if entry is None or entry.plan is None:
            r.ref_status = "none"
            continue
        r.ref_value_s = entry.value_s
        lb = entry.lower_bound_s
        r.ref_bound_s = lb if lb is not None else math.nan
        if entry.optimal:
            r.ref_status = "optimal"
            r.gap_to_optimum = gap(r.value_s, entry.value_s)
            continue
        r.ref_status = "bounded" if lb is not None and lb > 0 else "unbounded"
        if r.ref_status == "bounded":
            r.gap_to_bound = gap(r.value_s, lb)
        r.gap_to_ref_best = gap(r.value_s, entry.value_s)


def _options(method: str, inst: Any, beam: int, workers: int, budget: int,
             time_limit: float) -> dict[str, Any]:
    """``planning.plan``'s options of ``method`` in an evaluation."""
    if method in POLICY_METHODS:
        # The suite instance itself: the environment scores its episode with the
        # instance's own draws, as in training.
        return {"instance": inst, **({"beam": beam} if method == "policy-beam" else {})}
    if method == "local-search":
        return {}
    return {"workers": workers, "budget": budget,
            "time_limit": time_limit if method == "exact" else None}


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
    """Write results.csv, results.json, summary.md and gap_vs_size.png into ``out_dir``
    (created)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        csv_path = out / "results.csv"
        with csv_path.open("w", newline="", encoding="utf-8") as fh:
            ref = bool(result.reference)
            writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS + (REFERENCE_COLUMNS if ref
                                                                  else ()))
            writer.writeheader()
            for r in result.rows:
                writer.writerow(r.as_csv(reference=ref))
        json_path = out / "results.json"
        json_path.write_text(json.dumps(result.to_dict(), allow_nan=True) + "\n",
                             encoding="utf-8")
        md_path = out / "summary.md"
        md_path.write_text(result.summary_markdown(), encoding="utf-8")
        png_path = plot_gaps(result, out / "gap_vs_size.png")
    except OSError as exc:
        raise ConfigError(str(out), "", f"cannot write: {exc.strerror}") from None
    return [csv_path, json_path, md_path, png_path]


def plot_gaps(result: Evaluation, path: str | Path) -> Path:
    """Scatter of the gap (%) against the cluster's GPU count, one series per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    markers = {"policy": "o", "policy-beam": "*", "policy-greedy": "P", "policy-raw": "D",
               "exact": "s", "metis": "^", "megatron": "v", "random": "x",
               "local-search": "<", "brute": ">"}
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
