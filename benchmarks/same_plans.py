"""Golden snapshot of plans and values: does the code still plan what it planned?

    python benchmarks/same_plans.py --write tests/data/golden_plans.json [--subset full|quick]
    python benchmarks/same_plans.py --check tests/data/golden_plans.json [--subset full|quick]
    python benchmarks/same_plans.py --refresh tests/data/golden_plans.json --gpu H100-SXM5-80GB

``--write`` runs every case of the chosen subset and stores its inputs and outputs (the
objective's value ``value_s``, ``found``, ``optimal`` for exact/brute, the plan as
``Plan.to_dict()`` or null, or the class name of the error the case raised). ``--check``
re-runs the stored cases of the subset with the code importable as ``hetpar`` and prints
every mismatch with the case id and the old and new value, then one summary line
``same plans: N cases, M mismatches``; the exit status is 1 on any mismatch. ``--refresh``
re-runs only the stored cases on clusters with a GPU that reads the constants of type
``--gpu`` (that type, or an uncalibrated one whose architecture falls back to it) and
stores their new outputs, the others as they were: what a calibration of that one type
changes (the cost model, and the policy's observation through it, read a type's
constants only for the hosts that read them).

Comparison: values equal to a relative 1e-9 (``inf`` equals ``inf``), ``found`` and the
error class equal, plans equal as dicts. ``exact`` and ``brute`` are compared by value
only (a tie may pick another plan), and only where the stored run was proven optimal; a
new exact run that matches the value without proving it (time limit) passes with a note.
A plan of the same value that is the stored one with its hosts renamed one-to-one among
hosts of the same hardware passes with a note too: the policy chooses between such hosts
by logits equal to the last bits, which CPUs of other vector widths order differently.

Cases (deterministic only: node, step and evaluation budgets, never a clock):

* ``bundled/CLUSTER/MODEL/METHOD``: every cluster of ``configs/clusters`` x ``MODELS``,
  training ``default``, objective ``mean``, 8 bandwidth samples, seed 0, with metis,
  megatron, random (budget 50), ``local-search`` (``improve_structure`` from metis's plan
  with ``LOCAL_SEARCH_EVALUATIONS`` scored completions, no time limit) and the shipped
  policy as ``hetpar evaluate`` runs it: policy-raw (the rollout alone), policy-greedy
  (the sweep's rollouts, refined), policy (the same, then the structure search with
  ``DEFAULT_EVALUATIONS``) and policy-beam (the same from a beam of ``WIDE_BEAM``).
  Combinations where the model fits nowhere are cases too (their error class is stored).
* ``exact/...``: exact search, one worker, 20 s time limit, on the bundled instances of
  ``EXACT_BUNDLED`` (each proves its optimum in 0.1-7 s on one core of the machine that
  wrote the snapshot) and on the ``tiny`` suite's first 5 instances; plus exact on the
  ``TINY_DOCS`` instances below.
* ``brute/tiny-doc-K/brute``: plain enumeration on 10 very small instances (``_tiny_docs``:
  the generator of tests/test_solvers.py's ``tiny_instance``, <= 6 GPUs, <= 8 layers,
  objectives mean / p90 / cvar0.9, 4 samples). Their documents are stored in the snapshot,
  so a check does not depend on the generator. The ``tiny`` suite's instances are too large
  for brute (12-24 layers on 4-8 GPUs: 6e5 to 1.4e10 plans, minutes to days).
* ``suite/SUITE/INDEX/METHOD``: the first 20 instances of each ``configs/suites/test-*``
  suite with policy-raw, policy-greedy, policy, policy-beam, metis and megatron, at the
  shipped policy's objective and sample count (what ``hetpar evaluate`` uses by default),
  seed 0.

Determinism: the snapshot was written and then checked in a second process, full subset,
with 0 mismatches, so no method was dropped; every policy method is deterministic (the
refinement's step budget, the structure search's evaluation budget and the beam width are
counts, not clocks). Not stored: wall times, exact's plans (ties), and exact cases that did
not prove their optimum. The policy's rollout takes the argmax of float32 logits: another
BLAS or CPU may break an exact tie differently, so a snapshot is for one machine's checks
before and after a change, not across machines.

Every call into hetpar is in the section marked ``HETPAR API`` below (``run_case`` and its
helpers): after an API change only that section needs re-pointing.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FORMAT_VERSION = 1
REL_TOL = 1e-9

# Bundled instances: every cluster of configs/clusters x these models.
MODELS = ("gpt3-125m", "gpt2-medium", "gpt3-1.3b", "gpt3-6.7b", "llama2-7b", "llama3-8b",
          "llama2-13b", "llama2-70b")
BUNDLED_METHODS = ("metis", "megatron", "random", "local-search", "policy-raw",
                   "policy-greedy", "policy", "policy-beam")
SUITE_METHODS = ("policy-raw", "policy-greedy", "policy", "policy-beam", "metis", "megatron")
POLICY_METHODS = ("policy", "policy-beam", "policy-greedy", "policy-raw")
OPTIMAL_METHODS = ("exact", "brute")  # compared by value only, and only when proven optimal
SUITE_INSTANCES = 20
RANDOM_BUDGET = 50
LOCAL_SEARCH_EVALUATIONS = 20_000
EXACT_TIME_LIMIT = 20.0
EXACT_BUNDLED = ("amp-het-16/gpt3-125m", "amp-het-16/gpt2-medium", "amp-het-16/gpt3-1.3b",
                 "amp-het-16/llama2-7b", "amp-homo-16/gpt3-125m", "trace-demo/gpt3-125m",
                 "trace-demo/gpt2-medium", "trace-demo/gpt3-1.3b", "trace-demo/gpt3-6.7b",
                 "trace-demo/llama2-7b", "dgx-a100-superpod-4/gpt3-125m",
                 "dgx-a100-superpod-4/gpt2-medium", "dgx-a100-superpod-4/gpt3-1.3b")
EXACT_SUITE = ("tiny", 5)  # exact on the first 5 instances of the tiny suite
TINY_DOCS = 10

# The quick subset (tests/test_same_plans.py): about 40 cases, well under a minute.
QUICK = frozenset(
    [f"bundled/amp-het-16/gpt2-medium/{m}" for m in BUNDLED_METHODS]
    + [f"bundled/trace-demo/gpt3-1.3b/{m}" for m in BUNDLED_METHODS]
    + ["bundled/amp-het-16/llama2-70b/metis", "bundled/amp-het-16/llama2-70b/policy",
       "bundled/amp-het-16/llama3-8b/metis", "bundled/amp-het-16/llama3-8b/random",
       "bundled/amp-het-16/llama3-8b/policy-greedy",
       "exact/trace-demo/gpt3-125m/exact", "exact/amp-homo-16/gpt3-125m/exact",
       "exact/dgx-a100-superpod-4/gpt3-125m/exact", "exact/tiny/3/exact",
       "exact/tiny-doc-0/exact"]
    + [f"brute/tiny-doc-{k}/brute" for k in range(5)]
    + [f"suite/test-iid/2/{m}" for m in ("policy-raw", "policy", "policy-beam")]
    + [f"suite/test-unseen-gpus/3/{m}" for m in ("policy-greedy", "megatron")]
    + [f"suite/test-geo/3/{m}" for m in ("policy", "metis")]
    + ["suite/test-larger/7/policy-raw", "suite/test-larger/7/policy-beam"])


# ==========================================================================================
# HETPAR API: every call into hetpar is in this section (after a refactor of hetpar's API,
# re-point these functions and nothing else).
#
#   hetpar_version() -> str
#   policy_settings() -> dict: what `hetpar evaluate` uses for the shipped policy by default
#       (objective, samples) and its method constants (wide beam, evaluations, refine steps)
#   run_case(case) -> dict: runs one case, returns {"value_s": float (math.inf: no plan),
#       "found": bool, "optimal": bool | None, "plan": dict | None, "error": str | None}
#       ("error": the class name of the HetparError the case raised; other exceptions
#       propagate)
# ==========================================================================================

_POLICY: dict[str, Any] = {}  # the shipped policy, loaded once per process
_SUITES: dict[str, Any] = {}


def hetpar_version() -> str:
    import hetpar

    return hetpar.__version__


def _policy_bundle() -> Any:
    if "bundle" not in _POLICY:
        from hetpar.agents.io import load_policy

        _POLICY["bundle"] = load_policy(None)  # the shipped one (no --policy)
    return _POLICY["bundle"]


def policy_settings() -> dict[str, Any]:
    from hetpar.agents.planner import DEFAULT_REFINE_STEPS, SWEEP_MEMORY, WIDE_BEAM
    from hetpar.costmodel.objective import Objective
    from hetpar.solvers.local_search import DEFAULT_EVALUATIONS

    defaults = _policy_bundle().env_kwargs  # hetpar.agents.evaluate.evaluate's defaults
    return {"objective": Objective.parse(str(defaults.get("objective", "mean"))).name,
            "samples": int(defaults.get("samples", 16)),
            "wide_beam": int(WIDE_BEAM), "improve_evaluations": int(DEFAULT_EVALUATIONS),
            "refine_steps": int(DEFAULT_REFINE_STEPS), "sweep_memory": int(SWEEP_MEMORY)}


def _load_inputs(inputs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(cluster, model, training, instance or None) of a case's inputs."""
    if "suite" in inputs:
        from hetpar.problem.generator import load_suite

        name = inputs["suite"]
        if name not in _SUITES:
            _SUITES[name] = load_suite(name)
        inst = _SUITES[name].instance(int(inputs["index"]))
        return inst.cluster, inst.model, inst.training, inst
    if "cluster_doc" in inputs:
        from hetpar.cluster.topology import parse_cluster
        from hetpar.workload.model import parse_model
        from hetpar.workload.training import parse_training

        return (parse_cluster(inputs["cluster_doc"], "<golden cluster>"),
                parse_model(inputs["model_doc"], "<golden model>"),
                parse_training(inputs["training_doc"], "<golden training>"), None)
    import hetpar

    return (hetpar.load_cluster(inputs["cluster"]), hetpar.load_model(inputs["model"]),
            hetpar.load_training(inputs["training"]), None)


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    from hetpar.errors import HetparError

    try:
        return _run(case)
    except HetparError as exc:
        return {"value_s": math.inf, "found": False, "optimal": None, "plan": None,
                "error": type(exc).__name__}


def _run(case: dict[str, Any]) -> dict[str, Any]:
    from hetpar.agents.planning import plan
    from hetpar.problem import Problem

    method, opts = case["method"], dict(case.get("options", {}))
    cluster, model, training, inst = _load_inputs(case["inputs"])
    problem = Problem.of(cluster, model, training, objective=case["objective"],
                         samples=int(case["samples"]), seed=int(case["seed"]))
    if method in POLICY_METHODS:
        # hetpar.agents.evaluate's call (the suite's Instance) for suites.
        options = {"refine": bool(opts["refine"]), "refine_steps": int(opts["refine_steps"]),
                   "beam": int(opts["beam"]),
                   "improve_evaluations": int(opts["improve_evaluations"]),
                   # Snapshots written before the sweep was the default have no key.
                   "micro_sweep": bool(opts.get("micro_sweep", False))}
        if "sweep_memory" in opts:
            options["sweep_memory"] = int(opts["sweep_memory"])
        if inst is not None:
            options["instance"] = inst
        sol = plan(problem, method, policy=_policy_bundle(), **options)
    elif method == "local-search":
        assert opts.pop("start") == "metis" and opts.pop("depth") == 2  # planning's own
        sol = plan(problem, method, max_evaluations=int(opts["max_evaluations"]),
                   neighbour_steps=int(opts["neighbour_steps"]))
    else:
        kwargs: dict[str, Any] = {}
        if "budget" in opts:
            kwargs["budget"] = int(opts["budget"])
        if method == "exact":
            kwargs["workers"] = int(opts["workers"])
            kwargs["time_limit"] = float(opts["time_limit"])
        sol = plan(problem, method, **kwargs)
    return {"value_s": float(sol.value) if sol.found else math.inf, "found": bool(sol.found),
            "optimal": sol.optimal if method in OPTIMAL_METHODS else None,
            "plan": sol.plan.to_dict() if sol.plan is not None else None, "error": None}


# ==========================================================================================
# End of the HETPAR API section. Below: the case list, the snapshot file and the comparison
# (plain Python and numpy, no hetpar).
# ==========================================================================================


def _tiny_docs(seed: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    """(cluster, model, training documents, objective) of a very small instance: the
    generator of tests/test_solvers.py's ``tiny_instance`` (<= 3 hosts, <= 6 GPUs of 2
    types, <= 8 layers, random bandwidths). Its documents are stored in the snapshot."""
    import numpy as np

    gpu_types = ("V100-SXM2-16GB", "T4-16GB", "A100-SXM4-40GB", "L4-24GB")
    rng = np.random.default_rng(seed)
    types = rng.choice(gpu_types, 2, replace=False)
    n_hosts = int(rng.integers(2, 4))
    hosts = []
    for i in range(n_hosts):
        gpu = str(types[i % 2] if i < 2 else types[rng.integers(2)])
        host: dict[str, Any] = {"name": f"h{i}", "gpu": gpu,
                                "gpus": int(rng.choice([1, 2, 2, 4])),
                                "nic_gbps": float(rng.choice([10, 25, 100]))}
        if rng.random() < 0.4:
            mean = float(rng.uniform(0.3, 0.9)) * host["nic_gbps"]
            host["uplink"] = {"bandwidth": {"kind": "lognormal", "mean_gbps": mean,
                                            "cv": float(rng.uniform(0.1, 0.5))}}
        hosts.append(host)
    while sum(h["gpus"] for h in hosts) > 6:
        big = max(hosts, key=lambda h: h["gpus"])
        big["gpus"] //= 2
    cluster = {"hosts": hosts, "topology": {"kind": "single_switch"}}
    layers = (int(rng.integers(2, 6)) if sum(h["gpus"] for h in hosts) > 4
              else int(rng.integers(2, 9)))
    model = {"name": "tiny", "layers": layers, "hidden": 1024, "heads": 16, "vocab": 32000,
             "seq_len": 1024}
    modes = ["none", "selective", "full"]
    training = {"global_batch": int(rng.choice([2, 4, 8])),
                "recompute": [str(m) for m in rng.choice(modes, int(rng.integers(1, 3)),
                                                         replace=False)],
                "zero": [0, 1] if rng.random() < 0.5 else [0]}
    objective = str(rng.choice(["mean", "p90", "cvar0.9"]))
    return cluster, model, training, objective


# Bundled inputs at replica-slice scale (thousands of hosts): benchmarks/xl_plans.py
# measures them; an exact search or a brute check of them is out of reach.
AT_SCALE = frozenset({"mixed-2048", "test-xl"})


def _names(kind: str, pattern: str = "*.yaml") -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs" / kind).glob(pattern)
                  if p.stem not in AT_SCALE)


def build_cases(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Every case of the full subset (inputs only), in a fixed order."""
    cases: list[dict[str, Any]] = []

    def add(cid: str, group: str, inputs: dict[str, Any], method: str, objective: str,
            samples: int, seed: int, options: dict[str, Any] | None = None) -> None:
        cases.append({"id": cid, "group": group, "inputs": inputs, "method": method,
                      "objective": objective, "samples": samples, "seed": seed,
                      "options": options or {}, "quick": cid in QUICK})

    def policy_options(method: str) -> dict[str, Any]:
        # hetpar.agents.evaluate's conventions for the four policy methods: policy and
        # policy-greedy decode with the sweep.
        sweep = method in ("policy", "policy-greedy")
        return {"refine": method != "policy-raw",
                "refine_steps": settings["refine_steps"],
                "beam": settings["wide_beam"] if method == "policy-beam" else 1,
                "improve_evaluations": settings["improve_evaluations"]
                if method in ("policy", "policy-beam") else 0,
                "micro_sweep": sweep,
                **({"sweep_memory": settings["sweep_memory"]} if sweep else {})}

    def options(method: str) -> dict[str, Any]:
        if method in POLICY_METHODS:
            return policy_options(method)
        if method == "random":
            return {"budget": RANDOM_BUDGET}
        if method == "local-search":
            return {"start": "metis", "max_evaluations": LOCAL_SEARCH_EVALUATIONS,
                    "neighbour_steps": 150, "depth": 2}
        if method == "exact":
            return {"workers": 1, "time_limit": EXACT_TIME_LIMIT}
        return {}

    for cluster in _names("clusters"):
        for model in MODELS:
            inputs = {"cluster": cluster, "model": model, "training": "default"}
            for m in BUNDLED_METHODS:
                add(f"bundled/{cluster}/{model}/{m}", "bundled", inputs, m, "mean", 8, 0,
                    options(m))
    for pair in EXACT_BUNDLED:
        cluster, model = pair.split("/")
        add(f"exact/{pair}/exact", "exact",
            {"cluster": cluster, "model": model, "training": "default"}, "exact", "mean", 8,
            0, options("exact"))
    suite, n = EXACT_SUITE
    for i in range(n):
        add(f"exact/{suite}/{i}/exact", "exact", {"suite": suite, "index": i}, "exact", "mean",
            8, 0, options("exact"))
    for k in range(TINY_DOCS):
        cluster_doc, model_doc, training_doc, objective = _tiny_docs(k)
        inputs = {"name": f"tiny-doc-{k}", "cluster_doc": cluster_doc, "model_doc": model_doc,
                  "training_doc": training_doc}
        add(f"brute/tiny-doc-{k}/brute", "brute", inputs, "brute", objective, 4, k)
        add(f"exact/tiny-doc-{k}/exact", "exact", inputs, "exact", objective, 4, k,
            options("exact"))
    for suite in _names("suites", "test-*.yaml"):
        for i in range(SUITE_INSTANCES):
            for m in SUITE_METHODS:
                add(f"suite/{suite}/{i}/{m}", "suite", {"suite": suite, "index": i}, m,
                    settings["objective"], settings["samples"], 0, options(m))
    ids = [c["id"] for c in cases]
    assert len(set(ids)) == len(ids), "duplicate case ids"
    missing = QUICK - set(ids)
    assert not missing, f"QUICK names unknown cases: {sorted(missing)}"
    return cases


def needs_policy(case: dict[str, Any]) -> bool:
    """Whether the case runs the shipped policy (needs torch and sb3-contrib)."""
    return case["method"] in POLICY_METHODS


def select(cases: Iterable[dict[str, Any]], subset: str) -> list[dict[str, Any]]:
    if subset not in ("quick", "full"):
        raise ValueError(f"unknown subset {subset!r} (quick or full)")
    return [c for c in cases if subset == "full" or c.get("quick")]


def _to_json_value(x: float) -> float | str:
    return "inf" if math.isinf(x) else float(x)


def _from_json_value(x: float | str) -> float:
    return math.inf if x == "inf" else float(x)


def _normalised(out: dict[str, Any]) -> dict[str, Any]:
    """run_case's output as stored: JSON types only (tuples become lists)."""
    return json.loads(json.dumps({"value_s": _to_json_value(out["value_s"]),
                                  "found": bool(out["found"]), "optimal": out.get("optimal"),
                                  "plan": out.get("plan"), "error": out.get("error")}))


def run_cases(cases: list[dict[str, Any]], *, verbose: bool = False,
              strict: bool = True) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(each case with its outputs, seconds per method). ``strict``: an exception that is
    not a HetparError propagates; otherwise it is recorded as the case's ``crash``."""
    records, seconds = [], {}
    for case in cases:
        t0 = time.perf_counter()
        try:
            out = _normalised(run_case(case))
        except Exception as exc:  # noqa: BLE001 - a check reports it as a mismatch
            if strict:
                raise
            out = {"value_s": "inf", "found": False, "optimal": None, "plan": None,
                   "error": None, "crash": f"{type(exc).__name__}: {exc}"}
        dt = time.perf_counter() - t0
        key = case["method"]
        seconds[key] = seconds.get(key, 0.0) + dt
        rec = {k: case[k] for k in ("id", "group", "inputs", "method", "objective", "samples",
                                    "seed", "options", "quick")}
        rec.update(out)
        records.append(rec)
        if verbose:
            shown = out.get("crash") or out["error"] or out["value_s"]
            print(f"  {case['id']}: {shown} ({dt:.2f} s)", flush=True)
    return records, seconds


def _close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)


def _dict_diff(old: Any, new: Any, path: str = "plan", limit: int = 4) -> list[str]:
    """Up to ``limit`` paths where two JSON values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            if k not in old or k not in new:
                out.append(f"{path}.{k}: {'missing' if k not in old else old[k]!r} -> "
                           f"{'missing' if k not in new else new[k]!r}")
            else:
                out += _dict_diff(old[k], new[k], f"{path}.{k}", limit - len(out))
            if len(out) >= limit:
                break
        return out[:limit]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(old)} items -> {len(new)} items"]
        out = []
        for i, (a, b) in enumerate(zip(old, new)):
            out += _dict_diff(a, b, f"{path}[{i}]", limit - len(out))
            if len(out) >= limit:
                break
        return out[:limit]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def _host_kind(host: Any) -> tuple[Any, ...]:
    return (host.gpu.name, host.num_gpus, host.intra_kind, host.intra_GBps, host.nic_gbps)


def _renamed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether the new plan is the stored one with hosts renamed one-to-one among hosts of
    the same hardware, up to GPU numbering within a host (its value already equal). The
    policy picks among such hosts by logits that tie to the last bits, which CPUs of other
    vector widths order differently; the cost model cannot tell the plans apart, so
    neither does the check.

    Such a renaming exists exactly when both plans have the same stages' layers and TP
    degrees and the same multiset of host usages, a usage being the host's hardware and
    the GPUs it gives each stage."""
    a, b = old["plan"], new["plan"]
    if a is None or b is None or len(a["stages"]) != len(b["stages"]):
        return False
    hosts = {h.name: h for h in _load_inputs(old["inputs"])[0].hosts}

    def shape(plan: dict[str, Any]) -> tuple[Any, ...] | None:
        usage: dict[str, list[int]] = {}
        for i, st in enumerate(plan["stages"]):
            for r in st["replicas"]:
                if r["host"] not in hosts:
                    return None
                usage.setdefault(r["host"], [0] * len(plan["stages"]))[i] += len(r["gpus"])
        rest = {k: v for k, v in plan.items() if k != "stages"}
        return (json.dumps(rest, sort_keys=True),
                tuple((st["layers"], st["tp"], len(st["replicas"])) for st in plan["stages"]),
                sorted((_host_kind(hosts[h]), tuple(u)) for h, u in usage.items()))

    sa = shape(a)
    return sa is not None and sa == shape(b)


def compare(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, list[str]]:
    """("ok" | "skipped" | "mismatch", messages) for one case's stored and new outputs."""
    cid = old["id"]
    if new.get("crash"):
        return "mismatch", [f"{cid}: crashed: {new['crash']}"]
    if old["error"] or new["error"]:
        if old["error"] == new["error"]:
            return "ok", []
        return "mismatch", [f"{cid}: old={old['error'] or old['value_s']} "
                            f"new={new['error'] or new['value_s']}"]
    ov, nv = _from_json_value(old["value_s"]), _from_json_value(new["value_s"])
    if old["method"] in OPTIMAL_METHODS:
        if not old.get("optimal"):
            return "skipped", []
        if not _close(ov, nv):
            why = "" if new.get("optimal") else " (the new run did not prove optimality)"
            return "mismatch", [f"{cid}: value_s old={ov!r} new={nv!r}{why}"]
        if not new.get("optimal"):
            return "ok", [f"{cid}: note: same value, not proven optimal this time"]
        return "ok", []
    msgs = []
    if not _close(ov, nv) or old["found"] != new["found"]:
        msgs.append(f"{cid}: value_s old={ov!r} new={nv!r}"
                    + (f" (found {old['found']} -> {new['found']})"
                       if old["found"] != new["found"] else ""))
    if not msgs and old["plan"] != new["plan"] and _renamed(old, new):
        return "ok", [f"{cid}: note: same value, the same plan on interchangeable hosts"]
    if old["plan"] != new["plan"]:
        diff = _dict_diff(old["plan"], new["plan"])
        if not msgs:
            msgs.append(f"{cid}: same value_s {ov!r}, another plan")
        msgs += [f"    {d}" for d in diff]
    return ("mismatch" if msgs else "ok"), msgs


def check_records(stored: list[dict[str, Any]], *, verbose: bool = False,
                  report: Callable[[str], None] = print) -> tuple[int, list[str], int]:
    """Re-run the stored cases and compare: (cases, mismatch messages, skipped). Each
    mismatch's lines are passed to ``report`` as they are found."""
    new, _ = run_cases(stored, verbose=verbose, strict=False)
    mismatches: list[str] = []
    skipped = 0
    for old, rec in zip(stored, new):
        status, msgs = compare(old, rec)
        if status == "mismatch":
            mismatches.append("\n".join(msgs))
        skipped += status == "skipped"
        for m in msgs:
            report(("MISMATCH " if status == "mismatch" and not m.startswith("    ") else "")
                   + m)
    return len(stored), mismatches, skipped


def dump_golden(doc: dict[str, Any]) -> str:
    """The snapshot as JSON text with one case a line (diffs show which cases changed)."""
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)
    cases = ",\n".join(json.dumps(c, separators=(",", ":")) for c in doc["cases"])
    return head[:-2] + ',\n "cases": [\n' + cases + "\n ]\n}\n"


def load_golden(path: str | Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if doc.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {doc.get('format_version')!r}, "
                         f"expected {FORMAT_VERSION}")
    return doc


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _timings(seconds: dict[str, float]) -> str:
    return ", ".join(f"{m} {s:.1f} s" for m, s in sorted(seconds.items(), key=lambda x: -x[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE", help="run the cases and write the snapshot")
    mode.add_argument("--check", metavar="FILE", help="re-run the snapshot's cases and compare")
    mode.add_argument("--refresh", metavar="FILE",
                      help="re-run the snapshot's cases on clusters with a GPU of type --gpu "
                           "and store their new outputs, the others kept (after that type's "
                           "calibration changed)")
    ap.add_argument("--subset", choices=("quick", "full"), default="full")
    ap.add_argument("--only", metavar="TEXT", default="",
                    help="only the cases whose id contains TEXT")
    ap.add_argument("--gpu", metavar="TYPE", default="",
                    help="with --refresh: the GPU type whose calibration changed")
    ap.add_argument("--verbose", "-v", action="store_true", help="one line per case")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    if args.refresh:
        if not args.gpu:
            ap.error("--refresh needs --gpu TYPE")
        doc = load_golden(args.refresh)
        from hetpar.costmodel.constants import load_constants

        # The hosts that read that type's constants: its own, and those of uncalibrated
        # types whose architecture falls back to it (CostConstants.gpu_key).
        constants = load_constants()
        picked = [i for i, c in enumerate(doc["cases"]) if args.only in c["id"]
                  and any(args.gpu in (h.gpu.name, constants.gpu_key(h.gpu.name,
                                                                     h.gpu.architecture))
                          for h in _load_inputs(c["inputs"])[0].hosts)]
        print(f"refreshing {len(picked)} of {len(doc['cases'])} cases (clusters with "
              f"{args.gpu}) with hetpar {hetpar_version()}", flush=True)
        records, seconds = run_cases([doc["cases"][i] for i in picked], verbose=args.verbose)
        changed = 0
        for i, rec in zip(picked, records):
            changed += compare(doc["cases"][i], rec)[0] == "mismatch"
            doc["cases"][i] = rec
        doc["note"] = (f"{doc.get('note', '')}; the {len(picked)} cases on clusters with "
                       f"{args.gpu} re-run at {_git_commit()[:12]} (--refresh)")
        Path(args.refresh).write_text(dump_golden(doc), encoding="utf-8")
        print(f"wrote {args.refresh}: {len(picked)} cases re-run, {changed} changed, in "
              f"{time.perf_counter() - start:.1f} s ({_timings(seconds)})")
        return 0
    if args.write:
        cases = select(build_cases(policy_settings()), args.subset)
        cases = [c for c in cases if args.only in c["id"]]
        print(f"writing {len(cases)} cases ({args.subset}) with hetpar {hetpar_version()}",
              flush=True)
        records, seconds = run_cases(cases, verbose=args.verbose)
        doc = {"format_version": FORMAT_VERSION, "hetpar_version": hetpar_version(),
               "commit": _git_commit(), "subset": args.subset,
               "note": "written by benchmarks/same_plans.py --write; see its docstring",
               "cases": records}
        Path(args.write).parent.mkdir(parents=True, exist_ok=True)
        Path(args.write).write_text(dump_golden(doc), encoding="utf-8")
        print(f"wrote {args.write}: {len(records)} cases in {time.perf_counter() - start:.1f} s "
              f"({_timings(seconds)})")
        return 0
    doc = load_golden(args.check)
    stored = [c for c in select(doc["cases"], args.subset) if args.only in c["id"]]
    n, mismatches, skipped = check_records(stored, verbose=args.verbose)
    extra = f", {skipped} skipped (exact/brute not proven optimal when written)" if skipped else ""
    print(f"same plans: {n} cases, {len(mismatches)} mismatches{extra} "
          f"({time.perf_counter() - start:.1f} s)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
