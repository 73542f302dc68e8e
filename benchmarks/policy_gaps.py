"""The policy alone, raw and refined, against the reference files: one or more policies
side by side on the held-out suites.

    python benchmarks/policy_gaps.py [--policies shipped,runs/x/final_policy.zip]
        [--suites test-iid,test-larger,test-unseen-gpus,test-geo,test-hard] [--n 20]
        [--beam W | --no-micro-sweep | --sweep-memory K] [--refine-candidates R]
        [--json FILE]

For each of the first N instances of each suite (objective mean, 16 bandwidth states,
seed 0: the reference files' problem) and each policy: the rollout alone (``policy-
raw``: the single most likely rollout) and the refined plan (``policy-greedy``, ``hetpar
plan --no-improve``: the micro-batch sweep's rollouts, refined), each as a gap ``T /
T_ref - 1`` to the suite's reference file (``configs/references/SUITE.json``: its best
known plan, proven optimal where the file says so; where the file has no entry for an
instance, the best of the policies' plans and metis's, marked ``~``), and how often the
plan is at least as good as metis's. Per suite and policy it prints the median, p90 and
worst gap of each and the median time of the refined planner. ``shipped`` names the
shipped policy. Gaps are deterministic (no time limit is involved); times are this
machine's. ``clone`` names the bundled clone that the shipped policy's PPO started from,
so ``--policies shipped,clone`` measures PPO's effect; ``untrained`` is the shipped
network with fresh weights (the ablation of what the training is worth). ``--beam W``
decodes with a beam of W over the policy's log-probabilities instead, raw and refined
alike (``hetpar plan --no-improve --beam W``: the best W structures are refined);
``--no-micro-sweep`` refines the single rollout (``hetpar plan --no-improve --no-micro-
sweep``); ``--sweep-memory K`` sweeps the policy's K most likely memory options
(``hetpar plan --no-improve --sweep-memory K``; default all 6); ``--refine-candidates R``
refines R structures besides the greedy one's (default: the planner's, 16 with the sweep,
2 with a beam). """

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

from hetpar.agents import planning
from hetpar.agents.io import load_policy
from hetpar.problem import Problem
from hetpar.problem.generator import load_suite
from hetpar.solvers import solve

SUITES = ("test-iid", "test-larger", "test-unseen-gpus", "test-geo", "test-hard")
TIE = 1e-9


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] if s else math.nan


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.1f}%"


def references(suite: Any) -> dict[int, float]:
    from hetpar.agents.reference import find_reference, instance_digest, load_references

    path = find_reference(suite)
    if path is None:
        return {}
    refs = load_references(path)
    if refs.mismatch(suite, "mean", 16, 0) is not None:
        return {}
    out = {}
    for i, e in refs.entries.items():
        if e.plan is not None and e.instance_digest == instance_digest(suite.instance(i)):
            out[i] = e.value_s
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="shipped")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--no-micro-sweep", action="store_true")
    ap.add_argument("--sweep-memory", type=int, default=None)
    ap.add_argument("--refine-candidates", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    names = [p.strip() for p in a.policies.split(",") if p.strip()]
    sweep = a.beam == 1 and not a.no_micro_sweep  # ``hetpar plan --no-improve``'s decoding
    memory = {} if a.sweep_memory is None or not sweep else {"sweep_memory": a.sweep_memory}
    if a.refine_candidates is not None:
        memory["refine_candidates"] = a.refine_candidates

    def bundle(name: str) -> Any:
        if name == "untrained":
            from search_starts import untrained

            return untrained(load_policy(None))
        return load_policy(name)

    bundles = {n: bundle(n) for n in names}
    rows: list[dict[str, Any]] = []
    for sname in a.suites.split(","):
        suite = load_suite(sname)
        refs = references(suite)
        for i in range(a.n):
            inst = suite.instance(i)
            problem = Problem.from_instance(inst, samples=16, seed=0)
            metis = solve(problem, "metis")
            got = {}
            for n, b in bundles.items():
                raw = planning.plan(problem, "policy-raw", policy=b, instance=inst,
                                    beam=a.beam)
                t0 = time.perf_counter()
                ref = planning.plan(problem, "policy-greedy", policy=b, instance=inst,
                                    beam=a.beam, micro_sweep=sweep, **memory)
                got[n] = (raw.value, ref.value, time.perf_counter() - t0)
            if i in refs:
                best, mark = min(refs[i], *(g[1] for g in got.values())), ""
            else:
                best, mark = min(metis.value, *(g[1] for g in got.values())), "~"
            for n, (raw_v, ref_v, wall) in got.items():
                rows.append({"suite": sname, "index": i, "policy": n, "reference": best,
                             "marked": mark, "raw_gap": raw_v / best - 1,
                             "refined_gap": ref_v / best - 1, "refined_s": wall,
                             "metis_gap": metis.value / best - 1,
                             "refined_as_good_as_metis": ref_v <= metis.value * (1 + TIE)})
            print(f"{sname} #{i}{mark}: " + "; ".join(
                f"{n}: raw {_pct(g[0] / best - 1)} refined {_pct(g[1] / best - 1)}"
                for n, g in got.items()) + f"; metis {_pct(metis.value / best - 1)}",
                flush=True)
    print()
    print(f"{'suite':<18}{'policy':<34}{'n':>3}{'raw med':>9}{'raw p90':>9}{'ref med':>9}"
          f"{'ref p90':>9}{'ref max':>9}{'>=metis':>8}{'ref s':>7}")
    for sname in [*a.suites.split(","), "all"]:
        for n in names:
            mine = [r for r in rows if r["policy"] == n and (sname == "all" or
                                                              r["suite"] == sname)]
            if not mine:
                continue
            raw = [r["raw_gap"] for r in mine]
            ref = [r["refined_gap"] for r in mine]
            wins = sum(r["refined_as_good_as_metis"] for r in mine)
            label = n if len(n) <= 33 else "..." + n[-30:]
            print(f"{sname:<18}{label:<34}{len(mine):>3}{_pct(statistics.median(raw)):>9}"
                  f"{_pct(_q(raw, 0.9)):>9}{_pct(statistics.median(ref)):>9}"
                  f"{_pct(_q(ref, 0.9)):>9}{_pct(max(ref)):>9}{wins / len(mine):>8.0%}"
                  f"{statistics.median(r['refined_s'] for r in mine):>7.2f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
