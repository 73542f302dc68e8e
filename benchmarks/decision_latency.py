"""Re-planning decision latency: the policy planner of ``hetpar replan`` on every network
change of the bundled scenarios, timed alone.

    python benchmarks/decision_latency.py [--scenarios a,b] [--seed 0] [--repeats 3]
                                          [--policy FILE] [--beam W]

For each scenario, the timeline of seed ``--seed`` (the one ``benchmarks/replan_experiment.py``
runs first) is built and the ``policy`` strategy's planner (``Planners.policy``, as the
simulator calls it: one thread, the garbage collector paused, the planner's environment
kept per topology) is asked for a plan at every state after the first, ``--repeats``
times over in fresh planners (the first state warms each up, as the simulator's
``warm_policy`` does before the job starts). Prints per scenario the median and p90 of
the decisions' wall times, and over all of them the median, p90, worst and the share
within the 50 ms target of issue 29; then the median of the planner's parts (set-up,
the rollouts, their forward passes, the refinement) and a checksum of the plans' values,
which must not change when only speed does (the decisions use step budgets, never the
clock). The replan suite takes 25 minutes and measures these latencies beside
everything else; this takes one to two.

Side by side with another revision (the script path absolute, so that the base tree runs
this file against its own ``hetpar``):

    python benchmarks/side_by_side.py --base HEAD --rounds 2 \\
        $PWD/benchmarks/decision_latency.py
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetpar.dynamics.scenario import (  # noqa: E402
    build_timeline,
    list_scenarios,
    load_scenario,
)
from hetpar.dynamics.strategies import Planners  # noqa: E402
from hetpar.workload.model import load_model  # noqa: E402
from hetpar.workload.training import load_training  # noqa: E402

from benchmarks.policy_gaps import _q  # noqa: E402  (the benchmarks' quantile)

TARGET_MS = 50.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=None, help="comma-separated (default: all bundled)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", default=None, help="policy file (default: the shipped one)")
    ap.add_argument("--beam", type=int, default=None,
                    help="decode with a beam of W instead of the sweep (1: one rollout)")
    a = ap.parse_args()
    names = a.scenarios.split(",") if a.scenarios else list_scenarios()
    every: list[float] = []
    parts: dict[str, list[float]] = {}
    checksum = 0.0
    print(f"{'scenario':<22}{'decisions':>10}{'median ms':>11}{'p90 ms':>9}")
    for name in names:
        scenario = load_scenario(name)
        model, training = load_model(scenario.model), load_training(scenario.training)
        timeline = build_timeline(scenario, np.random.default_rng(a.seed))
        mine: list[float] = []
        for r in range(a.repeats):
            planners = Planners(model, training, policy_path=a.policy, beam=a.beam)
            planners.warm_policy(timeline.states[0])
            for state in timeline.states[1:]:
                sol = planners.policy(state)
                if r == 0 and math.isfinite(sol.value):
                    checksum += sol.value
                for key, value in (sol.timings or {}).items():
                    parts.setdefault(key, []).append(value * 1e3)
            mine += [s * 1e3 for s in planners.policy_latencies]
        every += mine
        print(f"{name:<22}{len(mine) // max(1, a.repeats):>10}"
              f"{statistics.median(mine) if mine else math.nan:>11.1f}"
              f"{_q(mine, 0.9):>9.1f}", flush=True)
    within = sum(x <= TARGET_MS for x in every) / max(1, len(every))
    print(f"all: {len(every)} decisions, median {statistics.median(every):.1f} ms, "
          f"p90 {_q(every, 0.9):.1f} ms, worst {max(every):.1f} ms; "
          f"{within:.0%} within {TARGET_MS:.0f} ms")
    print("parts, median ms: " + ", ".join(
        f"{k} {statistics.median(v):.1f}" for k, v in parts.items() if any(v)))
    print(f"plans' values, summed over the first repeat (unchanged by speed-ups): "
          f"{checksum:.9g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
