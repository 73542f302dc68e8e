"""Is exact ever worse than a baseline? Every bundled cluster x a few models.

    python benchmarks/exact_vs_baselines.py [--time-limit S] [--workers N] [--samples K]
                                            [--models a,b,...] [--jsonl FILE]

For each instance (training ``default``, objective ``mean``, seed 0) it runs metis,
megatron, random and the shipped policy (``policy``, where torch is installed), then exact
through ``planning.plan`` twice under the same time limit: without the policy's plan as a
start (``policy_start=False``: the solver's own seeds) and with it (what ``hetpar solve``
does). It prints one line per instance and, last, the number of instances where exact's
value is worse than a baseline's (the target is 0) and how the policy start changed
exact's value. Instances where no method finds a plan are skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import hetpar
from hetpar.agents import planning
from hetpar.configio import list_bundled
from hetpar.errors import HetparError
from hetpar.problem import Problem

MODELS = ("gpt2-medium", "gpt2-xl", "llama3-8b", "llama2-13b", "llama2-70b")
BASELINES = ("metis", "megatron", "random")


def run(problem: Problem, method: str, policy: Any, **options: Any) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        sol = planning.plan(problem, method, policy=policy, **options)
    except HetparError as exc:
        return {"error": type(exc).__name__}
    return {"value": sol.value if sol.found else math.inf, "found_by": sol.found_by,
            "wall_s": round(time.perf_counter() - start, 2),
            "stopped": sol.certificate.stopped if sol.certificate else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--jsonl", help="also write one JSON object per instance here")
    args = ap.parse_args()
    try:
        from hetpar.agents.io import load_policy
        policy = load_policy(None)  # loaded once, not once per instance
    except (ImportError, HetparError):
        policy = None
    out = open(args.jsonl, "w") if args.jsonl else None
    worse = {"exact-nopolicy": 0, "exact": 0}
    change = {"better": 0, "worse": 0, "same": 0}
    n = 0
    exact = {"workers": args.workers, "time_limit": args.time_limit}
    for cluster in list_bundled("clusters"):
        if cluster == "mixed-2048":  # replica-slice scale: benchmarks/xl_plans.py
            continue
        for model in args.models.split(","):
            problem = Problem.of(hetpar.load_cluster(cluster), hetpar.load_model(model),
                                 hetpar.load_training(None), samples=args.samples, seed=0)
            row: dict[str, Any] = {m: run(problem, m, None) for m in BASELINES}
            if policy is not None:
                row["policy"] = run(problem, "policy", policy)
            row["exact-nopolicy"] = run(problem, "exact", None, policy_start=False, **exact)
            row["exact"] = run(problem, "exact", policy, **exact)
            if out is not None:
                print(json.dumps({"cluster": cluster, "model": model, **row}), file=out,
                      flush=True)
            values = {k: r.get("value", math.inf) for k, r in row.items()}
            if all(math.isinf(v) for v in values.values()):
                continue
            n += 1
            for k in worse:
                others = BASELINES + (("policy",) if k == "exact" and "policy" in row else ())
                worse[k] += any(values[k] > values[b] * (1 + 1e-12) for b in others)
            a, b = values["exact"], values["exact-nopolicy"]
            change["better" if a < b * (1 - 1e-9) else "worse" if a > b * (1 + 1e-9)
                   else "same"] += 1
            by, wall = row["exact"].get("found_by"), row["exact"].get("wall_s")
            print(f"{cluster:22s} {model:12s} "
                  + "  ".join(f"{k} {values[k]:.4g}" for k in row)
                  + f"  (exact by {by}, {wall} s)", flush=True)
    print(f"{n} instances with a plan; exact worse than a baseline on "
          f"{worse['exact-nopolicy']} without the policy start, {worse['exact']} with it; "
          f"the policy start made exact better on {change['better']}, worse on "
          f"{change['worse']}, the same on {change['same']}")


if __name__ == "__main__":
    main()
