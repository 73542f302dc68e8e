"""Planning latency: the shipped policy against the exact search, side by side.

    python benchmarks/policy_latency.py [--time-limit 60] [--repeats 5] [--beams 1,4]
                                        [--speculate 8,1]

For bundled clusters of 16 to 128 GPUs: the policy's inference time (the masked rollout,
one CPU thread, median of ``--repeats``), the refinement of its plan (exact layer split
of the rollout's stages), its time including environment set-up, and the exact search's
wall time with a time limit (when it stops at the limit, the ratio is a lower bound:
exact would take longer to prove its optimum). The ratio is exact's time over the
policy's rollout plus refinement. Prints both objectives. Each ``--beams`` width is
timed on the same warm process, side by side (1: the single most likely rollout); the
single rollout is timed at each ``--speculate`` width too (states one batched forward
pass scores; 1: one pass per decision, the rollout before speculation), interleaved
repeat by repeat so that the machine's drifts hit every width alike. ``cpu ms`` is the
rollout's process CPU time: equal to its wall time when it runs on one core.
"""

from __future__ import annotations

import argparse
import statistics
import time

import hetpar
from hetpar.agents.io import load_policy
from hetpar.agents.planner import SPECULATE, plan_with_policy
from hetpar.solvers import solve

CASES = [
    ("amp-het-16", "gpt2-medium"),          # 16 GPUs, 4 hosts
    ("cloud-mixed", "gpt3-1.3b"),           # 48 GPUs, 8 hosts
    ("dgx-a100-superpod-4", "gpt3-2.7b"),   # 32 GPUs, 4 hosts
    ("dgx-a100-superpod-16", "gpt3-6.7b"),  # 128 GPUs, 16 hosts
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--policy", default=None, help="policy file (default: the shipped one)")
    ap.add_argument("--beams", default="1,4", help="beam widths to time (default 1,4)")
    ap.add_argument("--speculate", default=f"{SPECULATE},1",
                    help=f"speculation widths of the single rollout (default {SPECULATE},1)")
    args = ap.parse_args()
    beams = [int(b) for b in args.beams.split(",")]
    widths = [int(w) for w in args.speculate.split(",")]
    variants = [(beam, w) for beam in beams for w in (widths if beam == 1 else widths[:1])]
    bundle = load_policy(args.policy)
    print(f"policy {bundle.path}; exact with a {args.time_limit:.0f} s limit, one worker")
    print(f"{'cluster':22s} {'GPUs':>4s} {'beam':>4s} {'spec':>4s} {'infer ms':>9s} "
          f"{'fwd ms':>7s} {'refine ms':>9s} {'total ms':>9s} {'exact s':>8s} "
          f"{'ratio':>8s}  policy obj / exact obj")
    for cluster_name, model_name in CASES:
        cluster = hetpar.load_cluster(cluster_name)
        if len(cluster.hosts) > bundle.max_hosts:
            continue
        model = hetpar.load_model(model_name)
        training = hetpar.load_training(None)
        runs: dict[tuple[int, int], list[tuple[float, ...]]] = {v: [] for v in variants}
        for _ in range(args.repeats):
            for beam, width in variants:
                start = time.perf_counter()
                res = plan_with_policy(bundle, cluster, model, training, beam=beam,
                                       speculate=width)
                runs[beam, width].append((res.inference_s, time.perf_counter() - start,
                                          res.value, res.refine_s, res.forward_s))
        timed = [(beam, width, *(statistics.median(r[i] for r in rs) for i in (0, 3, 1, 4)),
                  rs[-1][2]) for (beam, width), rs in runs.items()]
        start = time.perf_counter()
        sol = solve(cluster, model, training, method="exact", time_limit=args.time_limit,
                    samples=res.samples, seed=res.seed, objective=res.objective)
        exact_s = time.perf_counter() - start
        proven = sol.certificate is not None and sol.certificate.optimal
        for beam, width, infer, refine, total, fwd, value in timed:
            ratio = exact_s / (infer + refine)
            print(f"{cluster_name:22s} {cluster.num_gpus:4d} {beam:4d} "
                  f"{width if beam == 1 else '':>4} {1e3 * infer:9.1f} "
                  f"{1e3 * fwd:7.1f} {1e3 * refine:9.1f} {1e3 * total:9.1f} {exact_s:8.1f} "
                  f"{'' if proven else '>='}{ratio:7.0f}x  "
                  f"{value:.4f} / {sol.value:.4f}{'' if proven else ' (not proven)'}")


if __name__ == "__main__":
    main()
