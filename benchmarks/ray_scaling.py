"""The exact search and hetpar evaluate on the local backend and on Ray, side by side.

    .venv/bin/python benchmarks/ray_scaling.py [--instance amp-het-16/gpt2-medium]
        [--repeats 3] [--address auto] [--evaluate test-iid --n 20
        --methods policy,metis,megatron]

With ``--evaluate SUITE`` it times ``evaluate`` on the first N instances instead: local
(one instance after another), then Ray with 1 and 2 instances at a time, each repeat in
turn; every backend must give the same rows.

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
    ap.add_argument("--evaluate", default=None, metavar="SUITE")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--methods", default="policy,metis,megatron")
    args = ap.parse_args()
    if args.evaluate:
        evaluate_side_by_side(args)
        return
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


def evaluate_side_by_side(args: argparse.Namespace) -> None:
    from hetpar.agents.evaluate import evaluate
    from hetpar.agents.io import load_policy

    methods = tuple(args.methods.split(","))
    bundle = load_policy(None) if any(m.startswith("policy") for m in methods) else None
    connect(args.address, 2)
    print(f"hetpar evaluate {args.evaluate} --n {args.n} --methods {args.methods}")
    runs: dict[str, list[float]] = {}
    rows = None
    for r in range(args.repeats):
        for name, backend, workers in (("local", "local", 1), ("ray 1", "ray", 1),
                                       ("ray 2", "ray", 2)):
            t = time.perf_counter()
            res = evaluate(args.evaluate, args.n, methods, bundle=bundle, backend=backend,
                           workers=workers, address=args.address)
            wall = time.perf_counter() - t
            got = [(x.index, x.method, x.value_s) for x in res.rows
                   if not x.method.startswith("policy") or x.method == "policy-raw"]
            assert rows is None or got == rows, "backends disagree"
            rows = got
            runs.setdefault(name, []).append(wall)
            print(f"  repeat {r + 1}: {name:6} {wall:6.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print("medians: " + ", ".join(f"{k} {v:.1f} s" for k, v in med.items()))
    print(f"ray 1 / local {med['ray 1'] / med['local']:.2f}; ray 2 / local "
          f"{med['ray 2'] / med['local']:.2f}; ray 2 over ray 1 {med['ray 1'] / med['ray 2']:.2f}x")


if __name__ == "__main__":
    main()
