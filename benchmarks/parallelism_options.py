"""What each parallelism option is worth: the exact search over the same instance with the
training spec allowing more of them, one at a time and all together (issue 26's ablation).

    .venv/bin/python benchmarks/parallelism_options.py [--time-limit 30] [--workers 2]
        [--instances cloud-mixed:llama2-13b,...] [--samples 8]

Specs, each the instance's training spec plus:
    base        nothing (recompute modes, ZeRO 0/1: hetpar's space before plan format v2)
    +sp         sequence parallelism wherever a stage uses tensor parallelism
    +interleave 2 or 4 chunks per stage (the interleaved 1F1B schedule)
    +zero23     ZeRO-2 and ZeRO-3
    all         the three together
Prints one row per instance and spec: the value, whether it is proven optimal (else the gap
to its bound), the search's wall time, nodes, and the options the best plan uses. Each
search starts from the metis and megatron baselines only (no policy start), so the rows do
not depend on torch. A spec with more options can only do as well or better when both are
proven; with a time limit the larger space may stop further from its optimum.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import hetpar
from hetpar.problem import Problem
from hetpar.solvers import solve

INSTANCES = "cloud-mixed:llama2-13b:llama-bf16,dgx-a100-superpod-4:llama2-70b:llama-bf16," \
            "amp-homo-16:gpt2-xl:default"

SPECS = {
    "base": {},
    "+sp": {"sequence_parallel": True},
    "+interleave": {"virtual_stages": (1, 2, 4)},
    "+zero23": {"zero_stages": (0, 1, 2, 3)},
    "all": {"sequence_parallel": True, "virtual_stages": (1, 2, 4),
            "zero_stages": (0, 1, 2, 3)},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--instances", default=INSTANCES,
                    help="comma-separated CLUSTER:MODEL:TRAINING (bundled names or files)")
    args = ap.parse_args()
    print(f"exact search, {args.time_limit:g} s limit, {args.workers} worker(s), "
          f"{args.samples} bandwidth samples, mean objective")
    print(f"{'instance':<42} {'spec':<12} {'value s':>9} {'vs base':>8} {'proof':>14} "
          f"{'wall s':>7} {'nodes':>9}  plan")
    for item in args.instances.split(","):
        cluster_name, model_name, training_name = item.split(":")
        cluster = hetpar.load_cluster(cluster_name)
        model = hetpar.load_model(model_name)
        training = hetpar.load_training(training_name)
        base_value = None
        for spec, changes in SPECS.items():
            spec_training = dataclasses.replace(training, **changes)
            problem = Problem.of(cluster, model, spec_training, samples=args.samples)
            t0 = time.perf_counter()
            sol = solve(problem, "exact", workers=args.workers, time_limit=args.time_limit)
            wall = time.perf_counter() - t0
            cert = sol.certificate
            proof = "proven" if cert.optimal else f"gap {sol.gap:.1%}"
            if base_value is None:
                base_value = sol.value
            plan = sol.plan
            used = (f"M={plan.micro_batches} {plan.recompute} zero{plan.zero}"
                    f"{' sp' if plan.sequence_parallel else ''}"
                    f"{f' v{plan.virtual_stages}' if plan.virtual_stages > 1 else ''} "
                    f"pp{plan.num_stages} tp{'/'.join(sorted({str(s.tp) for s in plan.stages}))}"
                    if plan is not None else "-")
            print(f"{cluster_name + ' / ' + model_name:<42} {spec:<12} {sol.value:9.4f} "
                  f"{sol.value / base_value - 1:+8.1%} {proof:>14} {wall:7.1f} "
                  f"{cert.nodes:9,d}  {used}", flush=True)


if __name__ == "__main__":
    main()
