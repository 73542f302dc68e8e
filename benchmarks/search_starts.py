"""What is the policy worth to the structure search? The same search from different starts.

    python benchmarks/search_starts.py [--suites test-iid,test-larger,...] [--n 10]
        [--starts policy,metis,megatron,random,untrained] [--evaluations N]
        [--policy FILE] [--json FILE]

For each of the first N instances of each held-out suite (objective mean, 16 bandwidth
states, seed 0: ``hetpar evaluate``'s problem), each start plan is handed to the
structure search (``hetpar.solvers.local_search.improve_structure``, the search
``hetpar plan`` runs after the policy) with the same budget of scored completions
(``--evaluations``, default ``hetpar plan``'s). The starts:

* ``policy``: the policy's single refined rollout (``hetpar plan --no-improve
  --no-micro-sweep``), the shipped policy unless ``--policy`` names another;
* ``policy-beam``: the same policy decoded with a beam of ``BEAM`` (8), its best
  structures refined (``hetpar plan --no-improve --beam 8``);
* ``policy-sweep``: the same policy rolled out once for each memory option (its 3 most
  likely before stop 51) and each micro-batch count it may then choose,
  refined (``policy-greedy``, ``hetpar plan --no-improve``: what ``hetpar plan`` hands
  the search);
* ``untrained``: the same network with freshly initialised weights (seed 0), planned
  the same way: what the planner's machinery does without learning;
* ``metis``, ``megatron``: the baselines' plans (Megatron's only where it lies in the
  searched space: a stage of one GPU type);
* ``random``: the best of 8 random plans of the space (``random`` with budget 8, seed 0).

Per instance it prints each start's value before and after the search, relative to the
reference (the instance's entry in the suite's reference file, ``configs/references/``,
where one matches, else the best final value of any start: the header says which), and
the search's seconds. Per suite and overall: each start's gap before and after the
search (median, p90, worst), the median search time, and for the policy against metis
the share of instances where the search from the policy ends at least as good, and the
median of the paired ratios of their search times. Times are wall seconds on this
machine, every start of an instance run back to back.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.policy_gaps import _pct, _q  # noqa: E402  (the benchmarks' quantile)
from hetpar.errors import HetparError, PlanError  # noqa: E402
from hetpar.plan import Plan  # noqa: E402
from hetpar.problem import Problem  # noqa: E402
from hetpar.problem.generator import load_suite  # noqa: E402
from hetpar.solvers import solve  # noqa: E402
from hetpar.solvers.local_search import DEFAULT_EVALUATIONS, improve_structure  # noqa: E402

SUITES = ("test-iid", "test-larger", "test-unseen-gpus", "test-geo", "test-hard")
STARTS = ("policy", "metis", "megatron", "random", "untrained", "policy-beam", "policy-sweep")
BEAM = 8
TIE = 1e-9


def untrained(bundle: Any, seed: int = 0) -> Any:
    """``bundle`` with its network's weights drawn afresh (torch's default initialisers)."""
    import torch

    model = copy.deepcopy(bundle.model)
    torch.manual_seed(seed)
    for module in model.policy.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
    return dataclasses.replace(bundle, model=model)


def start_plan(problem: Problem, inst: Any, start: str, bundles: dict[str, Any],
               ) -> tuple[Plan | None, float, str]:
    """(plan, seconds to make it, why there is none)."""
    from hetpar.agents import planning

    t0 = time.perf_counter()
    try:
        if start in ("policy", "untrained"):
            sol = planning.plan(problem, "policy-greedy", policy=bundles[start], instance=inst,
                                micro_sweep=False)
        elif start == "policy-beam":
            sol = planning.plan(problem, "policy-greedy", policy=bundles["policy"],
                                instance=inst, beam=BEAM)
        elif start == "policy-sweep":
            sol = planning.plan(problem, "policy-greedy", policy=bundles["policy"],
                                instance=inst)
        elif start == "random":
            sol = solve(problem, "random", budget=8, rng_seed=0)
        else:
            sol = solve(problem, start)
    except HetparError as exc:
        return None, time.perf_counter() - t0, str(exc)
    wall = time.perf_counter() - t0
    if not sol.found or sol.plan is None:
        return None, wall, "no plan"
    try:
        problem.space.decompose(sol.plan)
    except PlanError as exc:
        return None, wall, f"outside the space ({exc.problem})"
    return sol.plan, wall, ""


def reference_of(suite: Any, index: int, inst: Any) -> tuple[float, bool] | None:
    """(value, proven) of the suite's reference entry for this instance, if one matches."""
    from hetpar.agents.reference import find_reference, instance_digest, load_references

    path = find_reference(suite)
    if path is None:
        return None
    refs = load_references(path)
    if refs.mismatch(suite, "mean", 16, 0) is not None:
        return None
    e = refs.entries.get(index)
    if e is None or e.instance_digest != instance_digest(inst) or e.plan is None:
        return None
    return e.value_s, e.optimal


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--n", type=int, default=10, help="instances per suite")
    ap.add_argument("--starts", default=",".join(STARTS))
    ap.add_argument("--evaluations", type=int, default=DEFAULT_EVALUATIONS,
                    help=f"scored completions of each search (default {DEFAULT_EVALUATIONS})")
    ap.add_argument("--policy", default=None, help="policy file (default: the shipped one)")
    ap.add_argument("--json", default=None, help="write every row to this file")
    a = ap.parse_args()
    starts = [s.strip() for s in a.starts.split(",") if s.strip()]
    bad = [s for s in starts if s not in STARTS]
    if bad:
        ap.error(f"unknown start(s) {', '.join(bad)} (known: {', '.join(STARTS)})")
    bundles: dict[str, Any] = {}
    if {"policy", "untrained", "policy-beam", "policy-sweep"} & set(starts):
        from hetpar.agents.io import load_policy

        bundles["policy"] = load_policy(a.policy)
        bundles["untrained"] = untrained(bundles["policy"])
    rows: list[dict[str, Any]] = []
    print(f"structure search, {a.evaluations} scored completions from each start; gaps "
          f"to the reference file's plan where one matches (* proven optimal), else to the "
          f"best final plan of any start (~)")
    for name in a.suites.split(","):
        suite = load_suite(name)
        for i in range(a.n):
            inst = suite.instance(i)
            problem = Problem.from_instance(inst, samples=16, seed=0)
            got: dict[str, dict[str, Any]] = {}
            for start in starts:
                plan, make_s, why = start_plan(problem, inst, start, bundles)
                if plan is None:
                    got[start] = {"why": why, "start_s": make_s}
                    continue
                value0 = problem.value(plan)
                t0 = time.perf_counter()
                imp = improve_structure(problem.cost_model, problem.space, problem.objective,
                                        plan, max_evaluations=a.evaluations)
                search_s = time.perf_counter() - t0
                got[start] = {"start_value": value0, "final": min(imp.value, value0),
                              "search_s": search_s, "start_s": make_s,
                              "evaluations": imp.evaluations}
            ref = reference_of(suite, i, inst)
            finals = [g["final"] for g in got.values() if "final" in g]
            if ref is not None:
                # A search may beat the stored plan: the reference is then the better.
                ref_value, proven = min(ref[0], *finals) if finals else ref[0], ref[1]
                proven = proven and ref_value >= ref[0] * (1 - TIE)
                mark = "*" if proven else ""
                source = "reference" if ref_value >= ref[0] * (1 - TIE) else "search"
            else:
                ref_value, mark, source = (min(finals) if finals else math.inf), "~", "best"
            cells = []
            for start in starts:
                g = got[start]
                g["start"], g["suite"], g["index"] = start, name, i
                g["reference"], g["reference_source"] = ref_value, source
                if "final" in g:
                    g["start_gap"] = g["start_value"] / ref_value - 1
                    g["final_gap"] = g["final"] / ref_value - 1
                    cells.append(f"{start} {_pct(g['start_gap'])}->{_pct(g['final_gap'])} "
                                 f"{g['search_s']:.2f}s")
                else:
                    cells.append(f"{start} -")
                rows.append(g)
            print(f"{name} #{i} ({inst.num_hosts} hosts, ref {ref_value:.4g}s{mark}): "
                  + "; ".join(cells), flush=True)
    summary(rows, starts, a.suites.split(","))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 0


def summary(rows: list[dict[str, Any]], starts: list[str], suites: list[str]) -> None:
    print()
    print(f"{'suite':<18}{'start':<11}{'n':>3}{'start med':>10}{'final med':>10}"
          f"{'final p90':>10}{'worst':>8}{'search s med':>13}")
    for name in [*suites, "all"]:
        for start in starts:
            mine = [r for r in rows if r["start"] == start and "final" in r
                    and (name == "all" or r["suite"] == name)]
            if not mine:
                continue
            g0 = [r["start_gap"] for r in mine]
            g = [r["final_gap"] for r in mine]
            t = [r["search_s"] for r in mine]
            print(f"{name:<18}{start:<11}{len(mine):>3}{_pct(statistics.median(g0)):>10}"
                  f"{_pct(statistics.median(g)):>10}{_pct(_q(g, 0.9)):>10}{_pct(max(g)):>8}"
                  f"{statistics.median(t):>13.2f}")
    for pol in ("policy", "policy-beam", "policy-sweep"):
        if pol not in starts or "metis" not in starts:
            continue
        pairs = {}
        for r in rows:
            if "final" in r and r["start"] in (pol, "metis"):
                pairs.setdefault((r["suite"], r["index"]), {})[r["start"]] = r
        both = [p for p in pairs.values() if len(p) == 2]
        if both:
            as_good = sum(p[pol]["final"] <= p["metis"]["final"] * (1 + TIE) for p in both)
            ratios = [p["metis"]["search_s"] / p[pol]["search_s"] for p in both
                      if p[pol]["search_s"] > 0]
            # The start's own making counts too: a beam costs more than one rollout.
            whole = [(p["metis"]["search_s"] + p["metis"]["start_s"])
                     / (p[pol]["search_s"] + p[pol]["start_s"]) for p in both]
            print(f"\n{pol} vs metis start, {len(both)} instances: the search from {pol} "
                  f"ends at least as good on {as_good} ({as_good / len(both):.0%}); metis's "
                  f"search time / {pol}'s: median {statistics.median(ratios):.2f} (start "
                  f"and search together: {statistics.median(whole):.2f})")


if __name__ == "__main__":
    raise SystemExit(main())
