"""Exact search on a ladder of instances, with 1 and 2 workers, against the baselines.

    python benchmarks/solver_ladder.py [--time-limit S] [--instances NAME,...] [--samples K]
                                       [--repeats R]

Each exact run stops at the time limit (default 60 s) and then reports its gap.

For each instance it prints the exact search's wall time with 1 and 2 workers (the
median of ``--repeats`` runs, one and two workers alternating, so that both see the
same machine; with repeats, every run and the range of the paired ratios too), whether
it proved optimality within the limit (else its gap), the speed-up (the median of the
paired runs' ratios), the share of the plan space never
evaluated, and each baseline's objective relative to the best plan exact found
(value / exact - 1). The first line says whether the bounds ran compiled (mypyc, see
hatch_build.py) or as pure Python (HETPAR_PURE_PYTHON=1 forces the latter).
"""

from __future__ import annotations

import argparse
import statistics
import time

import hetpar
from hetpar.cluster import parse_cluster
from hetpar.problem import Problem
from hetpar.solvers import bounds, solve

MIXED_32 = {
    "name": "mixed-32",
    "description": "32 GPUs of three types: 2x8 A100-80GB, 1x8 H100, 2x4 L4, leaf-spine",
    "hosts": [
        {"name": "a100", "count": 2, "gpu": "A100-SXM4-80GB", "gpus": 8, "nic_gbps": 400},
        {"name": "h100", "gpu": "H100-SXM5-80GB", "gpus": 8, "nic_gbps": 800},
        {"name": "l4", "count": 2, "gpu": "L4-24GB", "gpus": 4, "nic_gbps": 100},
    ],
    "topology": {"kind": "leaf_spine", "hosts_per_leaf": 3, "spines": 2, "uplink_gbps": 400},
}


AMP_HET_12 = {
    "name": "amp-het-12",
    "description": "amp-het-16 less one V100 host: 2x 4 V100 (10 Gb/s) + 4 T4 (50 Gb/s)",
    "hosts": [{"name": "v100", "count": 2, "gpu": "V100-SXM2-16GB", "gpus": 4, "nic_gbps": 10},
              {"name": "t4", "gpu": "T4-16GB", "gpus": 4, "nic_gbps": 50}],
    "topology": {"kind": "single_switch", "name": "tor"},
}


def instances() -> dict[str, tuple]:
    train = hetpar.load_training
    return {
        "amp-het-12/gpt2-medium": (parse_cluster(AMP_HET_12, "<amp-het-12>"),
                                   hetpar.load_model("gpt2-medium"), train()),
        "amp-het-16/gpt2-medium": (hetpar.load_cluster("amp-het-16"),
                                   hetpar.load_model("gpt2-medium"), train()),
        "amp-homo-16/gpt2-medium": (hetpar.load_cluster("amp-homo-16"),
                                    hetpar.load_model("gpt2-medium"), train()),
        # Llama-2 7B, not GPT-2 medium: with GPT-2 medium the best plan exact finds on
        # cloud-mixed is Metis's own (one data-parallel stage on the H100 hosts), while a
        # 7B model needs the A100 hosts too, and the types' mix is what the rung tests.
        "cloud-mixed/llama2-7b": (hetpar.load_cluster("cloud-mixed"),
                                  hetpar.load_model("llama2-7b"), train()),
        "mixed-32/llama2-7b": (parse_cluster(MIXED_32, "<mixed-32>"),
                               hetpar.load_model("llama2-7b"),
                               train({"global_batch": 64, "precision": "bf16",
                                      "flash_attention": True})),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0,
                    help="cap in seconds on each exact run, so every rung ends (default 60)")
    ap.add_argument("--samples", type=int, default=8, help="bandwidth samples (default 8)")
    ap.add_argument("--instances", default="", help="comma-separated subset of the ladder")
    ap.add_argument("--repeats", type=int, default=1,
                    help="paired runs of 1 and 2 workers per instance (default 1)")
    args = ap.parse_args()
    ladder = instances()
    names = [n for n in args.instances.split(",") if n] or list(ladder)
    print("bounds: " + ("compiled (mypyc)" if bounds.NATIVE is not None else "pure Python"))
    print(f"{'instance':<26} {'GPUs':>4} {'exact 1w s':>10} {'exact 2w s':>10} {'speed-up':>8} "
          f"{'status':>22} {'never evaluated':>15}  baselines vs exact")
    for name in names:
        cluster, model, training = ladder[name]
        walls: dict[int, list[float]] = {1: [], 2: []}
        runs = {}
        for _ in range(max(1, args.repeats)):
            for workers in (1, 2):
                t0 = time.perf_counter()
                runs[workers] = solve(Problem.of(cluster, model, training, samples=args.samples), method="exact", workers=workers, time_limit=args.time_limit)
                walls[workers].append(time.perf_counter() - t0)
        one, two = runs[1], runs[2]
        best = min(one.value, two.value)
        status = ("optimal" if one.certificate.optimal and two.certificate.optimal else
                  f"gap {min(one.gap, two.gap):.1%} at limit")
        rel = []
        for method in ("megatron", "metis", "random"):
            b = solve(Problem.of(cluster, model, training, samples=args.samples), method=method)
            rel.append(f"{method} {b.value / best - 1:+.1%}" if b.found else f"{method} none")
        w1, w2 = statistics.median(walls[1]), statistics.median(walls[2])
        ratio = statistics.median(a / b for a, b in zip(walls[1], walls[2]))
        if args.repeats > 1:
            pairs = [a / b for a, b in zip(walls[1], walls[2])]
            print(f"  {name}: 1 worker {', '.join(f'{w:.1f}' for w in walls[1])} s; "
                  f"2 workers {', '.join(f'{w:.1f}' for w in walls[2])} s; "
                  f"paired ratios {min(pairs):.2f}-{max(pairs):.2f}")
        print(f"{name:<26} {cluster.num_gpus:>4} {w1:>10.1f} {w2:>10.1f} {ratio:>8.2f} "
              f"{status:>22} {one.certificate.pruned_fraction:>15.6%}  {', '.join(rel)}")


if __name__ == "__main__":
    main()
