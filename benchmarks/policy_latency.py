"""Planning latency: the shipped policy against the exact search, side by side.

    python benchmarks/policy_latency.py [--time-limit 60] [--repeats 5] [--beams 1,4]
                                        [--speculate 8,1] [--no-search]

For bundled clusters of 16 to 128 GPUs, medians of ``--repeats`` runs on one CPU thread:
the policy's inference (``infer``: the masked rollout or beam search; ``fwd``: its
forward passes), the refinement of its plan (exact layer split of its stages), the
structure search after it (``search``; ``--no-search`` skips it), the total including
environment set-up, and the exact search's wall time with a time limit. ``ratio`` is
exact's time over the rollout plus refinement, ``ratio+s`` over the whole of ``hetpar
plan``'s default, the structure search included; when exact stops at its limit both are
lower bounds (it would take longer to prove its optimum), and where the space is too
large for it ("too large") it returns its metis seed at once and no ratio is given. Each
``--beams`` width, and the single rollout at each ``--speculate`` width (states one
batched forward pass scores; 1: one pass per decision), is timed in the same warm
process, interleaved repeat by repeat so that the machine's drifts hit every variant
alike. Prints the refined, searched and exact objectives.
"""

from __future__ import annotations

import argparse
import statistics
import time

import hetpar
from hetpar.agents.io import load_policy
from hetpar.agents import planning
from hetpar.agents.planner import SPECULATE, plan_with_policy, policy_problem
from hetpar.solvers.local_search import DEFAULT_EVALUATIONS

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
    ap.add_argument("--no-search", action="store_true",
                    help="time the refined rollout only, without the structure search")
    args = ap.parse_args()
    beams = [int(b) for b in args.beams.split(",")]
    widths = [int(w) for w in args.speculate.split(",")]
    variants = [(beam, w) for beam in beams for w in (widths if beam == 1 else widths[:1])]
    bundle = load_policy(args.policy)
    budget = 0 if args.no_search else DEFAULT_EVALUATIONS
    print(f"policy {bundle.path}; exact with a {args.time_limit:.0f} s limit, one worker; "
          f"structure search {budget} completions at most")
    print(f"{'cluster':22s} {'GPUs':>4s} {'beam':>4s} {'spec':>4s} {'infer ms':>9s} "
          f"{'fwd ms':>7s} {'refine ms':>9s} {'search ms':>9s} {'total ms':>9s} "
          f"{'exact s':>8s} {'ratio':>8s} {'ratio+s':>8s}  refined / searched / exact obj")
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
                # A fresh problem per run: its scoring tables are part of what is timed.
                problem = policy_problem(bundle, cluster, model, training)
                res = plan_with_policy(bundle, problem, beam=beam, speculate=width,
                                       improve_evaluations=budget)
                refined = res.details["improved_from"] if budget else res.value
                t = res.timings
                runs[beam, width].append((t["inference"], t["forward"], t["refine"],
                                          t["improve"], time.perf_counter() - start,
                                          refined, res.value))
        start = time.perf_counter()
        # The same states as the policy's, in a fresh problem: exact builds its own tables.
        sol = planning.plan(policy_problem(bundle, cluster, model, training), "exact",
                            time_limit=args.time_limit)
        exact_s = time.perf_counter() - start
        cert = sol.certificate
        proven = cert is not None and cert.optimal
        at_least = "" if proven else ">="
        too_large = cert is not None and cert.stopped == "space too large"
        for (beam, width), rs in runs.items():
            infer, fwd, refine, search, total = (statistics.median(r[i] for r in rs)
                                                 for i in range(5))
            refined, value = rs[-1][5], rs[-1][6]
            print(f"{cluster_name:22s} {cluster.num_gpus:4d} {beam:4d} "
                  f"{width if beam == 1 else '':>4} {1e3 * infer:9.1f} "
                  f"{1e3 * fwd:7.1f} {1e3 * refine:9.1f} {1e3 * search:9.1f} "
                  f"{1e3 * total:9.1f} {exact_s:8.1f} "
                  + (f"{'too large':>17s}  " if too_large else
                     f"{at_least}{exact_s / (infer + refine):7.0f}x "
                     f"{at_least}{exact_s / (infer + refine + search):7.0f}x  ")
                  + f"{refined:.4f} / {value:.4f} / {sol.value:.4f}"
                  f"{'' if proven else ' (not proven)'}")


if __name__ == "__main__":
    main()
