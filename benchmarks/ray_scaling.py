"""The exact search on the local backend and on Ray, side by side in one run.

    .venv/bin/python benchmarks/ray_scaling.py [--instance amp-het-16/gpt2-medium]
        [--repeats 3] [--address auto]

For each repeat, in turn: local with 1 and 2 worker processes, then Ray with 1 and 2
workers (a local Ray of 2 CPUs started once, or the cluster at ``--address``). Prints each
run's wall time and the medians' ratios (Ray over local, 2 workers over 1). Every run
must prove the same optimum.
"""

from __future__ import annotations

import argparse
import statistics
import time

import hetpar
from hetpar.problem import Problem
from hetpar.solvers import solve
from hetpar.solvers.ray_executor import RayExecutor, connect


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instance", default="amp-het-16/gpt2-medium")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--address", default=None)
    args = ap.parse_args()
    cluster, model = args.instance.split("/")
    problem = Problem.of(hetpar.load_cluster(cluster), hetpar.load_model(model),
                         hetpar.load_training(), samples=args.samples)
    t0 = time.perf_counter()
    connect(args.address, 2)
    print(f"{args.instance}, {args.samples} samples; Ray "
          f"{'started locally' if args.address is None else 'joined at ' + args.address} in "
          f"{time.perf_counter() - t0:.1f} s (not counted below)")
    runs: dict[str, list[float]] = {}
    value = None
    for r in range(args.repeats):
        for name, workers, executor in (("local 1", 1, None), ("local 2", 2, None),
                                        ("ray 1", 1, RayExecutor(1, args.address)),
                                        ("ray 2", 2, RayExecutor(2, args.address))):
            t = time.perf_counter()
            sol = solve(problem, "exact", workers=workers, executor=executor)
            wall = time.perf_counter() - t
            assert sol.certificate.optimal
            assert value is None or abs(sol.value / value - 1) < 1e-12
            value = sol.value
            runs.setdefault(name, []).append(wall)
            print(f"  repeat {r + 1}: {name:8} {wall:6.2f} s ({sol.certificate.nodes:,} nodes)",
                  flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print("medians: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))
    print(f"ray / local: 1 worker {med['ray 1'] / med['local 1']:.2f}, 2 workers "
          f"{med['ray 2'] / med['local 2']:.2f}; 2 workers over 1: local "
          f"{med['local 1'] / med['local 2']:.2f}x, ray {med['ray 1'] / med['ray 2']:.2f}x")


if __name__ == "__main__":
    main()
