"""Does exact keep its time limit? Wall time of time-limited exact runs over the suites.

    python benchmarks/time_limits.py [--suites test-iid,test-larger] [--n 10]
                                      [--time-limit 20] [--workers 2]

Runs ``solve(problem, "exact", time_limit=L, workers=W)`` on the first N instances of each
suite (objective mean, 16 bandwidth samples, seed 0) and prints every run's wall time
(the whole call: setup, search, the lower bound of an unfinished search), whether it was
proven, and per suite the largest wall time and how many runs took longer than the limit
plus the stated grace (``hetpar.solvers.api.answer_grace``).
"""

from __future__ import annotations

import argparse
import time

from hetpar.errors import HetparError
from hetpar.problem import Problem
from hetpar.problem.generator import load_suite
from hetpar.solvers import solve
from hetpar.solvers.api import answer_grace

SUITES = ("tiny", "train-small", "train-mixed", "test-iid", "test-larger",
          "test-unseen-gpus", "test-geo")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--n", type=int, default=10, help="instances per suite")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    promise = a.time_limit + answer_grace(a.time_limit)
    print(f"exact, time limit {a.time_limit:g} s, {a.workers} workers; promise: within "
          f"{promise:.1f} s (the limit plus answer_grace: the lower bound, closing the pool)")
    print(f"{'suite':<18}{'#':>3}{'hosts':>6}{'GPUs':>6}{'wall s':>8}  status")
    worst_all, over_all, runs = 0.0, 0, 0
    for name in a.suites.split(","):
        suite = load_suite(name)
        worst, over = 0.0, 0
        for i in range(a.n):
            inst = suite.instance(i)
            problem = Problem.from_instance(inst, samples=16, seed=0)
            start = time.perf_counter()
            try:
                sol = solve(problem, "exact", workers=a.workers, time_limit=a.time_limit)
                status = ("optimal" if sol.optimal else
                          f"{sol.certificate.stopped}, gap {sol.gap:.1%}"
                          if sol.certificate is not None else "no certificate")
            except HetparError as exc:
                status = f"error: {exc}"
            wall = time.perf_counter() - start
            worst, over = max(worst, wall), over + (wall > promise)
            print(f"{name:<18}{i:>3}{inst.num_hosts:>6}{inst.cluster.num_gpus:>6}"
                  f"{wall:>8.1f}  {status}", flush=True)
        print(f"{name:<18} largest wall {worst:.1f} s; over the promise: {over} of {a.n}")
        worst_all, over_all, runs = max(worst_all, worst), over_all + over, runs + a.n
    print(f"all: largest wall {worst_all:.1f} s; over the promise: {over_all} of {runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
