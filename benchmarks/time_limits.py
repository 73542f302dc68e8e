"""Does exact keep its time limit? Wall time of time-limited exact runs over the suites.

    python benchmarks/time_limits.py [--suites test-iid,test-larger] [--n 10]
                                      [--time-limit 20] [--workers 2]
                                      [--large 2000] [--large-only]

Runs ``solve(problem, "exact", time_limit=L, workers=W)`` on the first N instances of each
suite (objective mean, 16 bandwidth samples, seed 0) and prints every run's wall time
(the whole call: setup, search, the lower bound of an unfinished search), whether it was
proven, and per suite the largest wall time and how many runs took longer than the limit
plus the stated grace (``hetpar.solvers.api.answer_grace``). ``--large H`` adds
cloud-mixed / GPT-2 medium grown to H hosts (its L4 hosts repeated), every host distinct
(each uplink draws its own bandwidth): the size where building every route pair once
broke the promise.
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
          "test-unseen-gpus", "test-geo", "test-hard")


def large_cloud(hosts: int) -> Problem:
    """cloud-mixed with its L4 hosts repeated to ``hosts`` hosts in all, GPT-2 medium."""
    import yaml

    import hetpar
    from hetpar.cluster import parse_cluster
    from hetpar.configio import bundled_dir

    doc = yaml.safe_load((bundled_dir() / "clusters" / "cloud-mixed.yaml").read_text())
    others = sum(h["count"] for h in doc["hosts"] if h["name"] != "l4")
    for h in doc["hosts"]:
        if h["name"] == "l4":
            h["count"] = hosts - others
    doc["name"] = f"cloud-mixed-{hosts}"
    cluster = parse_cluster(doc)
    return Problem.of(cluster, hetpar.load_model("gpt2-medium"), hetpar.load_training(None),
                      samples=16, seed=0)


def run(label: str, i: int, problem: Problem, a: argparse.Namespace) -> float:
    start = time.perf_counter()
    try:
        sol = solve(problem, "exact", workers=a.workers, time_limit=a.time_limit)
        status = ("optimal" if sol.optimal else
                  f"{sol.certificate.stopped}, gap {sol.gap:.1%}"
                  if sol.certificate is not None else "no certificate")
    except HetparError as exc:
        status = f"error: {exc}"
    wall = time.perf_counter() - start
    cluster = problem.cluster
    print(f"{label:<18}{i:>3}{len(cluster.hosts):>6}{cluster.num_gpus:>6}"
          f"{wall:>8.1f}  {status}", flush=True)
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--n", type=int, default=10, help="instances per suite")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--large", type=int, default=0, metavar="H",
                    help="also cloud-mixed grown to H distinct hosts (e.g. 2000)")
    ap.add_argument("--large-only", action="store_true", help="skip the suites")
    a = ap.parse_args()
    promise = a.time_limit + answer_grace(a.time_limit)
    print(f"exact, time limit {a.time_limit:g} s, {a.workers} workers; promise: within "
          f"{promise:.1f} s (the limit plus answer_grace: the lower bound, closing the pool)")
    print(f"{'suite':<18}{'#':>3}{'hosts':>6}{'GPUs':>6}{'wall s':>8}  status")
    worst_all, over_all, runs = 0.0, 0, 0
    groups: list[tuple[str, list]] = []
    if not a.large_only:
        for name in a.suites.split(","):
            suite = load_suite(name)
            groups.append((name, [lambda i=i, s=suite: Problem.from_instance(
                s.instance(i), samples=16, seed=0) for i in range(a.n)]))
    if a.large:
        groups.append((f"cloud-mixed-{a.large}", [lambda: large_cloud(a.large)]))
    for name, makers in groups:
        worst, over = 0.0, 0
        for i, make in enumerate(makers):
            wall = run(name, i, make(), a)
            worst, over = max(worst, wall), over + (wall > promise)
        print(f"{name:<18} largest wall {worst:.1f} s; over the promise: {over} of "
              f"{len(makers)}")
        worst_all, over_all, runs = max(worst_all, worst), over_all + over, runs + len(makers)
    print(f"all: largest wall {worst_all:.1f} s; over the promise: {over_all} of {runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
