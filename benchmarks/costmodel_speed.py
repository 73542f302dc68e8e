"""Cost-model speed: estimates per second and how the cost grows with cluster size.

    python benchmarks/costmodel_speed.py [--repeat N]

Prints, side by side from one run on one core:
* estimates/s for one plan with K = 1 and K = 32 bandwidth samples, on amp-het-16 and on
  a 256-GPU cluster, for the search fast path (``CostModel.iteration_times``) on a pipeline
  structure already scored (its transfer terms kept, ``costmodel/frame.py``) and on a new
  one, and for the full report (``CostModel.evaluate``, with and without validation);
* per-estimate time on leaf-spine clusters of 32, 128 and 512 GPUs (4-GPU hosts) with a
  plan of the same shape (tp 4, 4 stages, data parallel over the rest), once routes are
  precomputed, and its growth relative to the host count.
"""

from __future__ import annotations

import argparse
import os
import time

import hetpar
from hetpar.cluster import parse_cluster
from hetpar.plan import Plan, Replica, Stage


def per_call_us(fn, repeat: int) -> float:
    """Best of 5 timing rounds (the least disturbed by other load), in microseconds."""
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best * 1e6


def grid_plan(cluster: hetpar.Cluster, tp: int, stages: int, layers: int, micro_batches: int,
              ) -> Plan:
    """Each host holds whole replicas; stage s takes an equal block of hosts."""
    per_host = cluster.hosts[0].num_gpus // tp
    replicas = [Replica(h.name, tuple(range(k * tp, (k + 1) * tp)))
                for h in cluster.hosts for k in range(per_host)]
    dp = len(replicas) // stages
    split = [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]
    return Plan(tuple(Stage(split[s], tp, tuple(replicas[s * dp:(s + 1) * dp]))
                      for s in range(stages)), micro_batches)


def leaf_spine(gpus: int) -> hetpar.Cluster:
    hosts = gpus // 4
    return parse_cluster({
        "name": f"bench-{gpus}",
        "hosts": [{"name": "a", "count": hosts // 2, "gpu": "A100-SXM4-40GB", "gpus": 4,
                   "nic_gbps": 200},
                  {"name": "v", "count": hosts - hosts // 2, "gpu": "V100-SXM2-32GB", "gpus": 4,
                   "nic_gbps": 100,
                   "uplink": {"bandwidth": {"kind": "lognormal", "mean_gbps": 80, "cv": 0.3}}}],
        "topology": {"kind": "leaf_spine", "hosts_per_leaf": 8, "spines": 2, "uplink_gbps": 400,
                     "bandwidth": {"kind": "lognormal", "mean_gbps": 600, "cv": 0.2}},
    }, source=f"<bench-{gpus}>")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000, help="calls per timing round")
    args = ap.parse_args()
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    except (AttributeError, OSError):
        pass

    print("== estimates per second for one plan (one core) ==")
    print(f"{'instance':<34} {'K':>3} {'fast path/s':>12} {'new struct/s':>13} {'report/s':>10} "
          f"{'validated/s':>12}")
    cases = [
        ("amp-het-16 + gpt2-medium (8 st.)", hetpar.load_cluster("amp-het-16"),
         hetpar.load_model("gpt2-medium"), hetpar.load_training(),
         Plan.load(hetpar.configio.bundled_dir() / "plans" / "amp-het-16-gpt2.json")),
    ]
    big = hetpar.load_cluster("dgx-a100-superpod-32")
    cases.append(("dgx-a100 256 GPUs + llama2-70b", big, hetpar.load_model("llama2-70b"),
                  hetpar.load_training("llama-bf16"), grid_plan(big, 8, 8, 80, 32)))
    for name, cluster, model, training, plan in cases:
        for k in (1, 32):
            cm = hetpar.CostModel(cluster, model, training, samples=k, seed=0)
            fast = per_call_us(lambda: cm.iteration_times(plan), args.repeat)
            cold = per_call_us(lambda: (cm._frames.clear(), cm.iteration_times(plan)),
                               args.repeat // 2)
            full = per_call_us(lambda: cm.evaluate(plan, validate=False), args.repeat // 2)
            checked = per_call_us(lambda: cm.evaluate(plan), args.repeat // 2)
            print(f"{name:<34} {k:>3} {1e6 / fast:>12,.0f} {1e6 / cold:>13,.0f} "
                  f"{1e6 / full:>10,.0f} {1e6 / checked:>12,.0f}")
    print("(fast path: a structure already scored, as in a layer-split search, which reuses "
          "its\n transfer terms; new struct: every call builds them, as for a plan of a new "
          "structure)")

    print("\n== per-estimate time against cluster size (K = 32, fast path) ==")
    model, training = hetpar.load_model("llama2-13b"), hetpar.load_training({"global_batch": 512})
    base = None
    print(f"{'GPUs':>5} {'hosts':>6} {'build s':>8} {'us/estimate':>12} {'x time':>7} {'x hosts':>8}")
    for gpus in (32, 128, 512):
        t0 = time.perf_counter()
        cluster = leaf_spine(gpus)
        build = time.perf_counter() - t0
        cm = hetpar.CostModel(cluster, model, training, samples=32, seed=0)
        plan = grid_plan(cluster, 4, 4, 40, 16)
        us = per_call_us(lambda: cm.iteration_times(plan), max(args.repeat // 10, 50))
        base = base or (us, len(cluster.hosts))
        print(f"{gpus:>5} {len(cluster.hosts):>6} {build:>8.2f} {us:>12.1f} "
              f"{us / base[0]:>7.2f} {len(cluster.hosts) / base[1]:>8.1f}")


if __name__ == "__main__":
    main()
