"""The policy on clusters of 128-2,048 hosts (test-xl), planned as replica slices, against
metis on the whole cluster, with the slicing's own worth measured apart.

    python benchmarks/xl_plans.py [--n 20] [--start 0] [--policy shipped]
        [--sizes 8,16,32] [--json FILE]

For each of the first N instances of ``test-xl`` (objective mean, 16 bandwidth states,
seed 0), on one ``Problem`` per instance:

- ``policy``: the policy alone, refined (``hetpar plan --no-improve``): its rollout and
  refinement on each replica slice (``hetpar.agents.sliced``), the best expansion kept;
- ``raw``: the rollout alone on the same slices (``--no-refine``);
- ``metis``: metis's plan of the whole cluster (``hetpar solve --method metis``);
- ``metis-slices`` (the ablation): metis's plan of each of the same slices, expanded the
  same way, the best kept: what the slicing gives without the policy.

It prints each method's value and time per instance, then how often the policy's plan is
at least as fast as metis's (the issue's target: 80%), the median and worst ratio
``T_policy / T_metis``, the same for the ablation, and the policy's median and largest
time with the time on the largest cluster. Values are deterministic; times are this
machine's (one process).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

from hetpar.agents import planning
from hetpar.agents.io import load_policy
from hetpar.agents.sliced import SLICE_SIZES, slicings
from hetpar.problem import Problem
from hetpar.problem.generator import load_suite
from hetpar.solvers import solve

TIE = 1e-9


def _metis_on_slices(problem: Problem, max_hosts: int, sizes: tuple[int, ...]) -> float:
    best = math.inf
    for sl in slicings(problem, max_hosts, sizes):
        sol = solve(sl.problem, "metis")
        if sol.found:
            best = min(best, problem.value(sl.expand(sol.plan)))
    return best


def run(n: int, start: int, policy: str, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    bundle = load_policy(None if policy == "shipped" else policy)
    suite = load_suite("test-xl")
    rows = []
    for i in range(start, start + n):
        inst = suite.instance(i)
        problem = Problem.from_instance(inst, objective="mean", samples=16, seed=0)
        row: dict[str, Any] = {"instance": i, "hosts": inst.num_hosts,
                               "gpus": problem.cluster.num_gpus, "shape": inst.meta["shape"],
                               "model": inst.meta["model"],
                               "global_batch": inst.meta["global_batch"]}
        for name, method in (("policy", "policy-greedy"), ("raw", "policy-raw")):
            t0 = time.perf_counter()
            sol = planning.plan(problem, method, policy=bundle, slice_sizes=sizes)
            row[name] = sol.value
            row[f"{name}_s"] = time.perf_counter() - t0
            if name == "policy":
                row["slice"] = {k: v for k, v in sol.details["slices"].items() if k != "tried"}
        t0 = time.perf_counter()
        row["metis"] = solve(problem, "metis").value
        row["metis_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        row["metis-slices"] = _metis_on_slices(problem, bundle.max_hosts, sizes)
        row["metis-slices_s"] = time.perf_counter() - t0
        rows.append(row)
        print(f"test-xl-{i:<3} {row['hosts']:>5} hosts {row['shape']:<10} {row['model']:<18} "
              f"B {row['global_batch']:<5} policy {row['policy']:8.3f} s "
              f"({row['policy_s']:.2f} s, slice {row['slice']['slice_hosts']} x "
              f"{row['slice']['width']}) raw {row['raw']:8.3f}  metis {row['metis']:8.3f} "
              f"({row['metis_s']:.1f} s)  metis-slices {row['metis-slices']:8.3f}", flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def ratios(name: str) -> list[float]:
        return [r[name] / r["metis"] for r in rows if math.isfinite(r["metis"])]

    out: dict[str, Any] = {"instances": len(rows)}
    for name in ("policy", "raw", "metis-slices"):
        rs = ratios(name)
        out[name] = {"at_least_metis": sum(x <= 1 + TIE for x in rs) / max(1, len(rs)),
                     "median_ratio": statistics.median(rs) if rs else math.nan,
                     "worst_ratio": max(rs) if rs else math.nan,
                     "best_ratio": min(rs) if rs else math.nan}
    times = [r["policy_s"] for r in rows]
    largest = max(rows, key=lambda r: r["hosts"])
    out["policy_time_s"] = {"median": statistics.median(times), "max": max(times),
                            "largest_cluster": {"hosts": largest["hosts"],
                                                "seconds": largest["policy_s"]}}
    out["metis_time_s"] = {"median": statistics.median(r["metis_s"] for r in rows),
                           "max": max(r["metis_s"] for r in rows)}
    out["policy_vs_metis_slices"] = sum(r["policy"] <= r["metis-slices"] * (1 + TIE)
                                        for r in rows) / len(rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--policy", default="shipped")
    ap.add_argument("--sizes", default=",".join(map(str, SLICE_SIZES)))
    ap.add_argument("--json", default=None, help="write the rows and summary here")
    args = ap.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    rows = run(args.n, args.start, args.policy, sizes)
    s = summary(rows)
    print()
    for name in ("policy", "raw", "metis-slices"):
        d = s[name]
        print(f"{name:<13} at least as fast as metis on {d['at_least_metis']:.0%} of "
              f"{s['instances']}; T/T_metis median {d['median_ratio']:.3f}, best "
              f"{d['best_ratio']:.3f}, worst {d['worst_ratio']:.3f}")
    print(f"policy vs metis-slices (the slicing without the policy): at least as fast on "
          f"{s['policy_vs_metis_slices']:.0%}")
    t = s["policy_time_s"]
    print(f"policy time: median {t['median']:.2f} s, max {t['max']:.2f} s; "
          f"{t['largest_cluster']['seconds']:.2f} s on the largest cluster "
          f"({t['largest_cluster']['hosts']} hosts); metis median "
          f"{s['metis_time_s']['median']:.1f} s, max {s['metis_time_s']['max']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": s}, f, indent=1)


if __name__ == "__main__":
    main()
