"""Plans that cross slow routes: the policy's worst failure mode, measured.

    python benchmarks/slow_routes.py [--policy shipped] [--suite train-mixed]
        [--start 0] [--n 300] [--slow-gbps 2] [--worse 2] [--no-micro-sweep]

For each instance of the suite's range: the policy's refined plan (``hetpar plan
--no-improve``: the micro-batch sweep, refined) and metis's plan, on the reference files'
problem (objective mean, 16 bandwidth states, seed 0; ``--no-micro-sweep``: the single
refined rollout, ``hetpar plan --no-improve --no-micro-sweep``).
The instances are split by whether the cluster has a route whose
bottleneck mean bandwidth is below ``--slow-gbps``; for each group the script prints the
median and p90 of T_policy / T_metis and how many plans are more than ``--worse`` times
metis's, and for each of those the slowest route each plan crosses: a data-parallel ring
(two hosts of one stage) or a pipeline transfer (a host of a stage and one of the next).

On the training pool (train-mixed 0-299, 6 December 2026) the shipped policy's single
refined rollout was more than twice metis's on 4 of the 35 instances with a route below
2 Gb/s and on 1 of the other 265: the failures are a learning failure on slow routes,
not only a matter of clusters the policy never saw (docs/history/agents-history.md,
"DAgger"). With the sweep of 3 memory options (the default since 7 December): on none of
either (docs/agents.md, "Where it fails").
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np

from hetpar.agents import planning
from hetpar.agents.io import load_policy
from hetpar.problem import Problem
from hetpar.problem.generator import load_suite
from hetpar.solvers import solve


def route_bottlenecks(cluster: Any) -> np.ndarray:
    """(hosts, hosts) mean bandwidth in Gb/s of each route's slowest link (inf on the
    diagonal: a host's own GPUs cross no route)."""
    means = np.append(cluster.mean_link_bandwidth()[0], np.inf)
    out = means[cluster.route_link_indices()].min(axis=2)
    np.fill_diagonal(out, np.inf)
    return out


def slowest_crossing(plan: Any, cluster: Any, bottleneck: np.ndarray) -> float:
    """The slowest route ``plan`` sends data over: between two hosts of one stage (its
    gradient ring) or a host of a stage and one of the next (activations); inf for none."""
    index = {h.name: i for i, h in enumerate(cluster.hosts)}
    worst, previous = np.inf, None
    for stage in plan.stages:
        hosts = sorted({index[r.host] for r in stage.replicas})
        worst = min(worst, bottleneck[np.ix_(hosts, hosts)].min())
        if previous is not None:
            worst = min(worst, bottleneck[np.ix_(previous, hosts)].min())
        previous = hosts
    return float(worst)


def _gbps(x: float) -> str:
    return "none" if not np.isfinite(x) else f"{x:.3g} Gb/s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="shipped")
    ap.add_argument("--suite", default="train-mixed")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--slow-gbps", type=float, default=2.0)
    ap.add_argument("--worse", type=float, default=2.0)
    ap.add_argument("--micro-sweep", action=argparse.BooleanOptionalAction, default=True)
    a = ap.parse_args()
    bundle = load_policy(None if a.policy == "shipped" else a.policy)
    suite = load_suite(a.suite)
    groups: dict[bool, list[float]] = {True: [], False: []}
    for i in range(a.start, a.start + a.n):
        inst = suite.instance(i)
        bottleneck = route_bottlenecks(inst.cluster)
        slow = bool(bottleneck.min() < a.slow_gbps)
        problem = Problem.from_instance(inst, samples=16, seed=0)
        pol = planning.plan(problem, "policy-greedy", policy=bundle, instance=inst,
                            micro_sweep=a.micro_sweep)
        met = solve(problem, "metis")
        ratio = pol.value / met.value
        groups[slow].append(ratio)
        if ratio > a.worse:
            print(f"{a.suite} #{i}: policy {ratio:.1f}x metis; slowest route crossed: policy "
                  f"{_gbps(slowest_crossing(pol.plan, inst.cluster, bottleneck))}, metis "
                  f"{_gbps(slowest_crossing(met.plan, inst.cluster, bottleneck))}", flush=True)
    print()
    print(f"{'instances':<34}{'n':>5}{'median':>9}{'p90':>9}{'> ' + str(a.worse) + 'x':>7}")
    for slow, label in ((True, f"with a route < {a.slow_gbps:g} Gb/s"), (False, "the others")):
        r = sorted(groups[slow])
        if not r:
            continue
        p90 = r[min(len(r) - 1, int(np.ceil(0.9 * len(r))) - 1)]
        print(f"{label:<34}{len(r):>5}{statistics.median(r):>9.3f}{p90:>9.3f}"
              f"{sum(x > a.worse for x in r):>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
