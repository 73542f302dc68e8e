"""PlanBuilder-v0 speed and mask soundness: one command, prints its figures.

    python benchmarks/env_speed.py [--seconds 20] [--episodes 10000] [--pool 64]

1. Steps per second with uniformly random masked actions (reward computation included)
   on ``train-small`` and ``test-larger``, on one core (CPU time of this process, so a
   busy machine does not skew it), in two regimes: *cold* (every episode on a fresh
   instance, paying per-instance set-up: parsing, cost-model tables, feasibility search)
   and *warm* (a pool of ``--pool`` instances whose tables are built, as in training).
   Each line is run twice, side by side: with the masks' greedy completion witness (the
   default) and with the budgeted exhaustive search alone (``--no-witness`` rows), so the
   ratio is measured in one run.
2. Dead ends: ``--episodes`` random masked episodes spread over every bundled suite; an
   episode is a dead end if some state has no allowed action, or if it ends with a plan
   that does not fit in memory. Prints the count (the target is 0).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hetpar.envs.env import PlanBuilderEnv
from hetpar.problem.generator import list_suites


def run_episode(env: PlanBuilderEnv, rng: np.random.Generator, seed: int) -> tuple[int, bool]:
    env.reset(seed=seed)
    steps = 0
    while True:
        allowed = np.flatnonzero(env.action_masks())
        if allowed.size == 0:
            return steps, False
        _, _, term, trunc, info = env.step(int(allowed[rng.integers(allowed.size)]))
        steps += 1
        if term or trunc:
            return steps, bool(term and info.get("feasible"))


def steps_per_second(suite: str, pool: int | None, seconds: float, warm_episodes: int,
                     witness: bool = True) -> tuple[float, float, float]:
    env = PlanBuilderEnv(suite, instances=pool, mask_witness=witness)
    rng = np.random.default_rng(0)
    seed = 0
    for _ in range(warm_episodes if pool else 0):
        run_episode(env, rng, seed)
        seed += 1
    if pool is None:
        # Cold: walk through instances never seen before.
        seed = 10**6
    start = time.process_time()
    steps = episodes = 0
    while time.process_time() - start < seconds:
        if pool is None:
            env.reset(seed=seed, options={"instance": seed % env.source.count})
        n, _ = run_episode(env, rng, seed)
        steps += n
        episodes += 1
        seed += 1
    dt = time.process_time() - start
    oracles = [o for ctx in env._cache.values() for o in ctx._oracles.values()]
    queries = sum(o.queries for o in oracles)
    cut = sum(o.cut_queries for o in oracles)
    return steps / dt, episodes / dt, cut / max(queries, 1)


def dead_ends(episodes: int, pool: int) -> tuple[int, int, dict[str, int]]:
    # test-xl's clusters are planned as replica slices, never by the environment itself.
    suites = [s for s in list_suites() if s != "test-xl"]
    per = {s: 0 for s in suites}
    bad = 0
    envs = {s: PlanBuilderEnv(s, instances=pool) for s in suites}
    rng = np.random.default_rng(1)
    for k in range(episodes):
        suite = suites[k % len(suites)]
        _, ok = run_episode(envs[suite], rng, k)
        per[suite] += 1
        bad += not ok
    return bad, episodes, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--episodes", type=int, default=10_000)
    ap.add_argument("--pool", type=int, default=64)
    ap.add_argument("--warm-episodes", type=int, default=3000)
    args = ap.parse_args()

    print("suite         regime  witness  steps/s  episodes/s  feasibility queries cut by "
          "budget  (CPU time of one process)")
    for suite in ("train-small", "test-larger"):
        for pool in (None, args.pool):
            regime = "cold" if pool is None else f"warm{pool}"
            rates = []
            for witness in (True, False):
                sps, eps, cut = steps_per_second(suite, pool, args.seconds,
                                                 args.warm_episodes, witness)
                rates.append(sps)
                print(f"{suite:13s} {regime:7s} {'yes' if witness else 'no':7s}  {sps:7.0f}"
                      f"  {eps:10.1f}  {100 * cut:.2f}%")
            print(f"{'':13s} {regime:7s} ratio    {rates[0] / rates[1]:6.2f}x")
    bad, n, per = dead_ends(args.episodes, args.pool)
    spread = ", ".join(f"{s} {c}" for s, c in per.items())
    print(f"random masked episodes: {n} ({spread}); dead ends or infeasible plans: {bad}")


if __name__ == "__main__":
    main()
