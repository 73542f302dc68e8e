"""What a framework's rules cost: the exact search over every plan (runtime any) against
the search over the plans Megatron-LM and DeepSpeed can run, on every bundled cluster.

    .venv/bin/python benchmarks/runtime_gaps.py [--time-limit 20] [--workers 1]
        [--clusters amp-het-16,...] [--samples 8] [--policy [FILE]]

Prints one row per cluster and runtime: the value, whether it is proven optimal (else the
gap to its bound), the search's wall time, the process grid (tp x dp x pp) and the gap to
runtime any's answer. Each search starts from the metis and megatron baselines only (no
policy start), so those columns do not depend on torch.

With ``--policy`` (the shipped policy, or the file named) each row also gives the policy
alone under that runtime (``hetpar plan --runtime R --no-improve``: the rollout under the
runtime's masks and the refinement over its layer splits, no search after it), scored by
the same problem: its value, its gap to the exact search's answer and its time.
"""

from __future__ import annotations

import argparse
import time

import hetpar
from hetpar.problem import Problem
from hetpar.runtime.launch import check_layout, launch_layout
from hetpar.runtime.rules import check_plan
from hetpar.solvers import solve

# The model each bundled cluster is planned for (its README's example).
MODELS = {"amp-het-16": "gpt2-medium", "amp-homo-16": "gpt2-medium",
          "cloud-mixed": "llama2-7b", "consumer-16": "gpt2-xl",
          "dgx-a100-superpod-4": "gpt3-2.7b", "dgx-a100-superpod-16": "gpt3-2.7b",
          "dgx-a100-superpod-32": "gpt3-2.7b", "trace-demo": "gpt2-medium",
          "wan-two-region": "gpt2-medium"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--clusters", default=",".join(MODELS))
    ap.add_argument("--policy", nargs="?", const="shipped", default=None,
                    help="add the policy alone under each runtime (default file: shipped)")
    args = ap.parse_args()
    bundle = None
    if args.policy is not None:
        from hetpar.agents.io import load_policy

        bundle = load_policy(None if args.policy == "shipped" else args.policy)
    print(f"exact search, {args.time_limit:g} s limit, {args.workers} worker(s), "
          f"{args.samples} bandwidth samples, mean objective")
    print(f"{'cluster / model':34} {'runtime':9} {'value s':>9} {'status':>12} {'wall s':>7} "
          f"{'tp x dp x pp':>13} {'vs any':>8}"
          + (f" {'policy s':>9} {'vs exact':>8} {'policy ms':>9}" if bundle else ""))
    for name in args.clusters.split(","):
        model = MODELS.get(name, "gpt2-medium")
        problem = Problem.of(hetpar.load_cluster(name), hetpar.load_model(model),
                             hetpar.load_training(), samples=args.samples)
        base = None
        for runtime in ("any", "megatron", "deepspeed"):
            t0 = time.perf_counter()
            sol = solve(problem, "exact", workers=args.workers, time_limit=args.time_limit,
                        runtime=runtime)
            wall = time.perf_counter() - t0
            plan = sol.plan
            if runtime != "any":
                # What the export relies on: the plan runs, and its groups are its stages.
                assert not check_plan(plan, runtime)
                assert not check_layout(plan, launch_layout(plan, runtime))
            base = sol.value if base is None else base
            grid = (f"{plan.stages[0].tp} x {plan.stages[0].dp} x {plan.num_stages}"
                    if runtime != "any" else f"{plan.num_stages} stages")
            status = "optimal" if sol.optimal else f"gap {sol.gap:.1%}"
            extra = ""
            if bundle is not None:
                from hetpar.agents import planning

                pol = planning.plan(problem, "policy-greedy", policy=bundle, runtime=runtime)
                assert not check_plan(pol.plan, runtime)
                extra = (f" {pol.value:9.4f} {pol.value / sol.value - 1:+8.1%} "
                         f"{1000 * pol.wall_s:9.0f}")
            print(f"{name + ' / ' + model:34} {runtime:9} {sol.value:9.4f} {status:>12} "
                  f"{wall:7.1f} {grid:>13} {sol.value / base - 1:+8.1%}{extra}", flush=True)


if __name__ == "__main__":
    main()
