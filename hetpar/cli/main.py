"""The ``hetpar`` command line.

Every problem with the user's input ends as one line on stderr naming the file, the
field and the problem, with exit status 2 (argparse usage errors also exit 2).

``hetpar solve``, ``hetpar plan`` and ``hetpar evaluate`` read their inputs into one
``Problem`` (the objective parsed once), plan it with ``hetpar.agents.planning.plan`` and
print the ``Solution``'s fields: ``--json`` prints ``Solution.to_dict()`` (evaluate: one
such object per row), the tables ``render_solution``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from hetpar import __version__
from hetpar.cli.jsonout import TIMINGS_HELP
from hetpar.errors import ConfigError, HetparError, InfeasibleError

__all__ = ["main", "build_parser"]

EXAMPLES = """\
examples:
  hetpar estimate --cluster amp-het-16 --model gpt2-medium --plan configs/plans/amp-het-16-gpt2.json
  hetpar estimate --cluster my_cluster.yaml --model llama2-7b --training my_training.yaml \\
                  --plan plan.json --samples 64 --objective cvar0.9 --json
  hetpar solve --cluster amp-het-16 --model gpt2-medium --workers 2 --out plan.json
  hetpar solve --cluster cloud-mixed --model llama2-7b --training llama-bf16 \
               --method metis --objective cvar0.9
  hetpar validate            # fidelity of the cost model on the bundled reference runs
  hetpar list models         # bundled clusters, models, training specs and GPU types
"""


RUNTIME_CHOICES = ("any", "megatron", "deepspeed")
RUNTIME_PLAN_LIMIT = 10.0  # s: hetpar plan's search over a framework's plans
RUNTIME_HELP = ("the framework the plan must run on: any (every plan of hetpar's space; "
                "stages may differ), megatron (one TP and DP degree, Megatron-LM's rank "
                "order, even layers but the first and last stage) or deepspeed (the same, "
                "with DeepSpeed's uniform partition); default any")

TRUST_PICKLE_HELP = ("load a policy file of format 1 (stable-baselines3's pickled zip, as "
                     "earlier hetpar wrote them), which can run code when loaded; only for "
                     "files you trust ('hetpar policy convert' rewrites one as format 2)")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``hetpar: error: ...``, exit status 2)
    like every other refusal; ``--help`` still prints the usage."""

    def error(self, message: str) -> NoReturn:
        from hetpar.errors import one_line

        print(f"hetpar: error: {one_line(self.prog)}: {one_line(message)} (see "
              f"{one_line(self.prog)} --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="hetpar",
        description="Hybrid-parallel training plans for LLMs on heterogeneous GPU clusters "
                    "whose network bandwidth varies.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hetpar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    est = sub.add_parser(
        "estimate", help="estimate the iteration time, breakdown and memory of a plan",
        description="Score a plan with the analytic cost model: per-stage compute and "
                    "communication, the pipeline schedule, data-parallel all-reduce, memory per "
                    "GPU and the iteration-time distribution over sampled bandwidth states.")
    _add_instance_args(est)
    est.add_argument("--plan", required=True, metavar="FILE",
                     help="plan file (JSON, format in configs/README.md)")
    _add_scoring_args(est, "bandwidth states to sample (0: each link at its mean; default 32)")
    est.add_argument("--runtime", choices=RUNTIME_CHOICES, default=None,
                     help="warn when this framework cannot run the plan as it stands "
                          "(every estimate says which can)")
    opts = est.add_argument_group(
        "what if", "score the plan with one of its whole-plan options changed (the plan file "
                   "stays as it is)")
    opts.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction,
                      default=None, help="Megatron-LM's sequence parallelism on or off")
    opts.add_argument("--virtual-stages", type=int, default=None, metavar="V",
                      help="chunks per stage of the interleaved 1F1B schedule (1: plain 1F1B)")
    opts.add_argument("--context-parallel", type=int, default=None, metavar="C",
                      help="TP blocks each sequence is split over (consecutive replicas of a "
                           "stage, on one host)")
    opts.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                      help="ZeRO stage: 1 shards optimizer states (Megatron-LM's distributed "
                           "optimizer), 2 gradients too, 3 weights too (FSDP)")
    opts.add_argument("--offload", choices=("none", "optimizer"), default=None,
                      help="optimizer: optimizer states and step on the host CPU "
                           "(ZeRO-Offload, Megatron-LM's --optimizer-cpu-offload; needs "
                           "ZeRO >= 1)")
    est.set_defaults(func=_cmd_estimate)

    sol = sub.add_parser(
        "solve", help="search a plan: exact branch and bound, or a baseline",
        description="Find a plan for the cluster, model and training spec. 'exact' proves the "
                    "optimum over the plan space (with --time-limit it returns the best plan "
                    "found, a proven lower bound and the gap); 'megatron', 'metis' and 'random' "
                    "are the baselines users would otherwise pick; 'local-search' climbs from "
                    "the Metis-style plan over structures a few edits away; 'brute' "
                    "enumerates tiny instances.")
    _add_instance_args(sol)
    sol.add_argument("--method", default="exact", choices=("exact", "megatron", "metis",
                                                           "random", "local-search", "brute"),
                     help="search method (default exact)")
    _add_scoring_args(sol, "bandwidth states the objective is computed over (default 32)")
    sol.add_argument("--timings", action="store_true", help=TIMINGS_HELP)
    sol.add_argument("--workers", type=int, default=1, metavar="N",
                     help="worker processes for the exact search (default 1; above 1 a "
                          "completed search proves the same optimum, but which of equally "
                          "good plans it returns, found_by and the node counts may differ "
                          "from run to run)")
    sol.add_argument("--time-limit", type=float, default=None, metavar="S",
                     help="stop the exact search (or the local search) after S seconds "
                          "(anytime). A search the limit stops returns the best plan found "
                          "by then, which depends on the machine's speed and load: two runs "
                          "with the same seed may return different plans. A search that ends "
                          "before its limit returns the same result on every run")
    sol.add_argument("--budget", type=int, default=200,
                     help="plans the random baseline may score (default 200)")
    sol.add_argument("--out", metavar="FILE", help="write the plan (JSON) for 'hetpar estimate'")
    sol.add_argument("--start", action="append", default=[], metavar="FILE",
                     help="a plan (JSON) that seeds the exact search: its answer is never "
                          "worse than this plan, which it returns if nothing beats it "
                          "(repeatable)")
    sol.add_argument("--no-policy-start", action="store_true",
                     help="do not seed the exact search with the policy's plan (by default "
                          "the shipped policy plans first where torch is installed)")
    sol.add_argument("--runtime", choices=RUNTIME_CHOICES, default="any",
                     help=RUNTIME_HELP)
    _add_backend_args(sol, "where the exact search's workers run: local processes (default) "
                           "or Ray tasks")
    sol.set_defaults(func=_cmd_solve)

    exp = sub.add_parser(
        "export", help="write the files that launch a plan with Megatron-LM, DeepSpeed or "
                       "torchrun",
        description="Write into --out the launch files of a plan: for megatron the "
                    "Megatron-LM arguments, a host file and one torchrun line per host that "
                    "places every rank on the GPU the plan names; for deepspeed the "
                    "DeepSpeed config, pipeline partition, host file and launcher line; for "
                    "torchrun the launch lines and the rank map. Each folder has a README "
                    "saying what each file is. A plan the format cannot express is refused "
                    "with the rule it breaks.")
    _add_instance_args(exp)
    exp.add_argument("--plan", required=True, metavar="FILE", help="plan file (JSON)")
    exp.add_argument("--format", required=True, choices=("megatron", "deepspeed", "torchrun"),
                     help="the framework to launch with")
    exp.add_argument("--out", required=True, metavar="DIR",
                     help="folder for the files (created; files of the same names are "
                          "replaced)")
    exp.set_defaults(func=_cmd_export)

    prf = sub.add_parser(
        "profile", help="measure this machine's device (or your network measurements) into "
                        "a GPU catalog (or cluster bandwidth) file",
        description="Time one transformer layer of --model forward and backward on --device "
                    "for a few micro-batch sizes (torch), fit the cost model's layer time to "
                    "the measurements, and write a GPU catalog file (--gpus accepts it) whose "
                    "type reproduces them; with --network, read nccl-tests outputs "
                    "(all_reduce_perf, sendrecv_perf) or iperf3 --json files you ran between "
                    "hosts and write the hosts' uplink bandwidth models to merge into a "
                    "cluster file. Each file says when and where it was measured.")
    prf.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    prf.add_argument("--model", metavar="FILE|NAME",
                     help="the model whose layer is timed (device profiles)")
    prf.add_argument("--seq-len", type=int, default=None, metavar="S",
                     help="sequence length of the timed layer (default the model's; a CPU "
                          "takes seconds per layer at 1024)")
    prf.add_argument("--micro-batches", default="2,4,8", metavar="B,B,...",
                     help="micro-batch sizes timed (default 2,4,8)")
    prf.add_argument("--repeats", type=int, default=5,
                     help="timed runs per size, of which the fastest counts (default 5)")
    prf.add_argument("--name", default=None,
                     help="GPU type name of the entry (default profiled-DEVICE)")
    prf.add_argument("--calibration", metavar="FILE",
                     help="cost-model constants the entry is made for (default the bundled "
                          "calibration: use the same file with hetpar estimate)")
    prf.add_argument("--network", nargs="+", metavar="FILE",
                     help="nccl-tests outputs or iperf3 --json files to read instead of "
                          "timing a device")
    prf.add_argument("--out", required=True, metavar="FILE", help="YAML file to write")
    prf.set_defaults(func=_cmd_profile)

    val = sub.add_parser(
        "validate", help="report the cost model's fidelity on the bundled reference runs",
        description="Calibration error on Megatron-LM SC21 Table 1 and rank correlation, "
                    "best-plan quality and out-of-memory prediction on AMP's measured GPT-2 runs.")
    val.add_argument("--calibration", metavar="FILE", help="constants file (default: bundled)")
    val.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    val.set_defaults(func=_cmd_validate)

    cal = sub.add_parser(
        "calibrate", help="fit the cost model's constants on the calibration data",
        description="Fit efficiencies, overheads and memory constants on Megatron SC21 Table 1 "
                    "and AMP's homogeneous runs only (never the held-out het_cluster runs), "
                    "and write them as a calibration file.")
    cal.add_argument("--out", metavar="FILE",
                     help="where to write the constants (default: print them)")
    cal.set_defaults(func=_cmd_calibrate)

    lst = sub.add_parser("list", help="list bundled clusters, models, training specs or GPUs",
                         description="List the configurations shipped with hetpar.")
    lst.add_argument("kind", nargs="?", default="all",
                     choices=("all", "clusters", "models", "training", "gpus"))
    lst.set_defaults(func=_cmd_list)
    _add_suite_parser(sub)
    _add_plan_parsers(sub)
    _add_train_parser(sub)
    _add_policy_parser(sub)
    _add_replan_parser(sub)
    _add_reference_parser(sub)
    return parser


def _add_instance_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True, metavar="FILE|NAME",
                   help="cluster file, or the name of a bundled cluster (hetpar list clusters)")
    p.add_argument("--model", required=True, metavar="FILE|NAME",
                   help="model file, or the name of a bundled model (hetpar list models)")
    p.add_argument("--training", metavar="FILE|NAME",
                   help="training file or bundled name (default: configs/training/default.yaml)")
    p.add_argument("--gpus", action="append", default=[], metavar="FILE",
                   help="extra GPU catalog file (repeatable)")
    p.add_argument("--calibration", metavar="FILE",
                   help="cost-model constants file (default: the bundled calibration)")


def _add_backend_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help=what + " (ray: the ray extra, pip install 'hetpar[ray]')")
    p.add_argument("--address", default=None, metavar="auto|HOST:PORT",
                   help="with --backend ray: the Ray cluster to join (auto: the one found as "
                        "ray.init finds it, e.g. started by 'ray start --head' on this "
                        "machine); default: a local Ray")


def _join_backend(args: argparse.Namespace, cpus: int) -> None:
    """``--address`` only with ``--backend ray``; with it, join the cluster now, so that
    one that is not there is refused in one line before any work."""
    if args.address is not None and args.backend != "ray":
        raise ConfigError("--address", "", "is an option of --backend ray")
    if args.backend == "ray":
        from hetpar.solvers.ray_executor import connect

        connect(args.address, cpus)


def _add_scoring_args(p: argparse.ArgumentParser, samples_help: str) -> None:
    p.add_argument("--samples", type=int, default=32, metavar="K", help=samples_help)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the bandwidth sampling (and of the random baseline); default 0")
    p.add_argument("--objective", default="mean", metavar="OBJ",
                   help="mean, pNN (e.g. p90) or cvarA (e.g. cvar0.9); default mean")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _json_doc(doc: dict, args: argparse.Namespace) -> dict:
    """``doc`` as ``--json`` prints it: without wall-clock figures unless ``--timings``
    (``hetpar.cli.jsonout``)."""
    from hetpar.problem.solution import without_timings

    return doc if getattr(args, "timings", False) else without_timings(doc)


def _check_precision(cluster, training) -> None:  # noqa: ANN001 - Cluster, TrainingSpec
    """A search for a plan refuses a cluster with GPUs that lack the training precision
    (bf16 on a V100 or T4: configs/gpus.yaml, ``bf16: null``) rather than silently
    leaving them out; 'hetpar estimate' names such a GPU only if the plan uses it."""
    lacking = sorted({h.gpu.name for h in cluster.hosts
                      if training.precision == "bf16" and h.gpu.peak_bf16_tflops is None})
    if lacking:
        hosts = [h.name for h in cluster.hosts if h.gpu.name in lacking]
        raise ConfigError(cluster.source or cluster.name, "hosts",
                          f"{', '.join(lacking)} (host{'s' if len(hosts) > 1 else ''} "
                          f"{', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''}) "
                          f"cannot train in {training.precision} (training "
                          f"{training.name}: precision {training.precision}); use precision "
                          "fp16 or a cluster without them")


def _load_instance(args: argparse.Namespace) -> tuple:
    """(cluster, model, training, constants) named by the instance options."""
    from hetpar.cluster.topology import load_cluster
    from hetpar.costmodel.constants import load_constants
    from hetpar.workload.model import load_model
    from hetpar.workload.training import load_training

    return (load_cluster(args.cluster, gpu_catalogs=args.gpus), load_model(args.model),
            load_training(args.training), load_constants(args.calibration))


def _cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    from hetpar.costmodel.estimate import CostModel
    from hetpar.costmodel.objective import Objective
    from hetpar.plan import Plan

    objective = Objective.parse(args.objective)
    if args.samples < 0:
        raise ConfigError("--samples", "", f"must not be negative, got {args.samples}")
    cluster, model, training, constants = _load_instance(args)
    plan = Plan.load(args.plan)
    changes = {k: v for k, v in (("sequence_parallel", args.sequence_parallel),
                                 ("virtual_stages", args.virtual_stages),
                                 ("context_parallel", args.context_parallel),
                                 ("zero", args.zero), ("offload", args.offload))
               if v is not None}
    for key, flag in (("virtual_stages", "--virtual-stages"),
                      ("context_parallel", "--context-parallel")):
        if changes.get(key, 1) < 1:
            raise ConfigError(flag, "", f"must be at least 1, got {changes[key]}")
    plan = dataclasses.replace(plan, **changes)
    cm = CostModel(cluster, model, training, constants=constants, samples=args.samples,
                   seed=args.seed)
    est = cm.evaluate(plan, source=args.plan)
    value = est.value(objective)
    from hetpar.runtime.rules import check_plan, runnable_by

    cannot = check_plan(plan, args.runtime) if args.runtime else []
    if args.json:
        out = est.to_dict()
        out["objective"] = {"name": objective.name, "value_s": value}
        out["runtimes"] = list(runnable_by(plan))
        if args.runtime:
            out["runtime"] = {"name": args.runtime, "problems": cannot}
        out["instance"] = {"cluster": cluster.name, "model": model.name,
                           "training": training.name, "samples": args.samples, "seed": args.seed}
        _print_json(out)
        return 0
    from hetpar.cli.render import render_estimate, render_runtimes
    render_estimate(console, est, cluster, cm.model, objective.name, value)
    console.print(render_runtimes(plan), highlight=False)
    if cannot:
        from hetpar.errors import one_line
        print(f"hetpar: warning: {args.runtime} cannot run this plan: {one_line(cannot[0])}",
              file=sys.stderr)
    return 0


def _cmd_profile(args: argparse.Namespace, console: Console) -> int:
    import yaml

    from hetpar.fidelity import profile as prof_mod

    out = Path(args.out)
    if not out.parent.exists():
        raise ConfigError(str(out), "", "its folder does not exist")
    if args.network:
        links = []
        for name in args.network:
            path = Path(name)
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise ConfigError(name, "", f"cannot read: {exc.strerror}") from None
            links.append(prof_mod.parse_iperf3(text, name) if text.lstrip().startswith("{")
                         else prof_mod.parse_nccl_tests(text, name))
        doc = prof_mod.network_section(links)
        header = ("# Host uplink bandwidths measured by hetpar profile --network from "
                  f"{', '.join(args.network)}.\n# Merge each host's uplink (or nic_gbps) "
                  "into your cluster file's host of that name.\n")
        out.write_text(header + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        for link in links:
            console.print(f"{link.name}: mean {link.mean_gbps:.3g} Gb/s, CV {link.cv:.3f} "
                          f"({link.source})", highlight=False)
        console.print(f"written to {out}")
        return 0
    if not args.model:
        raise ConfigError("--model", "", "a device profile times one layer of a model: "
                                         "give --model (or --network FILE ...)")
    from hetpar.costmodel.constants import load_constants
    from hetpar.workload.model import load_model

    try:
        sizes = tuple(int(b) for b in args.micro_batches.split(","))
    except ValueError:
        raise ConfigError("--micro-batches", "", f"expected sizes like 1,2,4, got "
                                                 f"{args.micro_batches!r}") from None
    if not sizes or min(sizes) < 1 or len(sizes) > 16 or max(sizes) > 1024:
        raise ConfigError("--micro-batches", "", "1 to 16 sizes, each 1 to 1024")
    if args.repeats < 1 or args.repeats > 1000:
        raise ConfigError("--repeats", "", f"must be 1 to 1000, got {args.repeats}")
    model = load_model(args.model)
    if args.seq_len is not None and not 1 <= args.seq_len <= model.seq_len:
        raise ConfigError("--seq-len", "", f"must be 1 to the model's {model.seq_len}")
    constants = load_constants(args.calibration)
    prof = prof_mod.profile_device(model, device=args.device, seq_len=args.seq_len,
                                   micro_batches=sizes, repeats=args.repeats)
    rates = prof_mod.fit_rates(prof, constants)
    name = args.name or f"profiled-{args.device.replace(':', '')}"
    doc = prof_mod.catalog_entry(prof, rates, constants, name)
    rows = prof_mod.reproduce(prof, doc, constants)
    header = (f"# GPU catalog entry measured by hetpar profile on {prof.host} at {prof.date}.\n"
              f"# Use it with: hetpar estimate --gpus {out} ... (hosts with gpu: {name}).\n")
    out.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100), encoding="utf-8")
    console.print(f"{prof.device} ({prof.device_name}), {prof.dtype}: one {model.name} layer, "
                  f"seq {prof.seq_len}; memory copy {prof.stream_GBps:.1f} GB/s; fitted "
                  f"{rates[0] / 1e12:.3g} TFLOP/s", highlight=False)
    for b, measured, modelled in rows:
        console.print(f"  micro-batch {b}: measured {measured * 1e3:.2f} ms, the cost model "
                      f"with this entry {modelled * 1e3:.2f} ms ({modelled / measured - 1:+.1%})",
                      highlight=False)
    console.print(f"written to {out} (GPU type {name})")
    return 0


def _cmd_export(args: argparse.Namespace, console: Console) -> int:
    from hetpar.costmodel.estimate import CostModel
    from hetpar.plan import Plan
    from hetpar.runtime.export import export_plan

    cluster, model, training, constants = _load_instance(args)
    plan = Plan.load(args.plan)
    # Valid for this cluster, model and training (PlanError naming the rule otherwise).
    CostModel(cluster, model, training, constants=constants, samples=0).evaluate(
        plan, source=args.plan)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(str(out), "", "exists and is not a folder")
    files = export_plan(plan, args.format, out, model.with_seq_len(training.seq_len),
                        training, cluster.name)
    console.print(f"{args.format} launch files for {args.plan} written to {out}: "
                  f"{', '.join(f.name for f in files)} (README.md says what each is)",
                  highlight=False)
    return 0


def _cmd_solve(args: argparse.Namespace, console: Console) -> int:
    from hetpar.agents import planning
    from hetpar.costmodel.objective import Objective
    from hetpar.plan import Plan
    from hetpar.problem import Problem
    from hetpar.solvers.api import Progress

    objective = Objective.parse(args.objective)
    if args.workers < 1:
        raise ConfigError("--workers", "", f"must be at least 1, got {args.workers}")
    if args.time_limit is not None and args.time_limit <= 0:
        raise ConfigError("--time-limit", "", f"must be positive, got {args.time_limit:g}")
    if args.samples < 1:
        raise ConfigError("--samples", "", f"must be at least 1, got {args.samples}")
    if args.backend == "ray" and args.method != "exact":
        raise ConfigError("--backend", "", f"ray runs the exact search's workers, not "
                                           f"--method {args.method}")
    _join_backend(args, args.workers)
    cluster, model, training, constants = _load_instance(args)
    _check_precision(cluster, training)
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.exists():
        raise ConfigError(str(out), "", "its folder does not exist")
    if args.start and args.method != "exact":
        raise ConfigError("--start", "", f"start plans seed the exact search only, not "
                                         f"--method {args.method}")
    problem = Problem.of(cluster, model, training, objective=objective, samples=args.samples,
                         seed=args.seed, constants=constants)
    starts = []
    for path in args.start:
        start_plan = Plan.load(path)
        problem.cost_model.evaluate(start_plan, source=path)  # PlanError naming the file
        starts.append(start_plan)

    from rich.live import Live
    from rich.text import Text

    def line(p: Progress) -> Text:
        inc = "none yet" if p.incumbent == float("inf") else f"{p.incumbent:.4f} s"
        return Text(f"exact search: {p.tasks_done}/{p.tasks} subtrees, {p.nodes:,} nodes, "
                    f"incumbent {inc}, {p.elapsed_s:.1f} s")

    live = None
    if not args.json and args.method == "exact" and console.is_terminal:
        live = Live(Text("exact search: starting"), console=console, refresh_per_second=4,
                    transient=True)
        live.start()
    options: dict = {"time_limit": args.time_limit}
    if args.method != "local-search":
        options.update(workers=args.workers, budget=args.budget, runtime=args.runtime,
                       progress=(lambda p: live.update(line(p))) if live else None)
    elif args.runtime != "any":
        raise ConfigError("--runtime", "", "local-search searches every plan of the space; "
                                           "use --method exact for a runtime's plans")
    if args.method == "exact":
        options.update(starts=starts, policy_start=not args.no_policy_start)
        if args.backend == "ray":
            from hetpar.solvers.ray_executor import RayExecutor

            options["executor"] = RayExecutor(args.workers, args.address)
    try:
        solution = planning.plan(problem, args.method, **options)
    finally:
        if live is not None:
            live.stop()
    cert = solution.certificate
    if solution.plan is None:
        why = ("no plan that fits was found" if cert is None or not cert.stopped else
               "interrupted before any plan that fits was found"
               if cert.stopped == "interrupted" else
               "the time limit passed before any plan that fits was found")
        raise InfeasibleError(f"{args.method}: {why}")
    if out is not None:
        try:
            solution.plan.save(out)
        except OSError as exc:
            raise ConfigError(str(out), "", f"cannot write: {exc.strerror}") from None
    if args.json:
        _print_json(_json_doc(solution.to_dict(), args))
        return 0
    _render(console, problem, solution)
    if out is not None:
        console.print(f"plan written to {out} (check it with: hetpar estimate --plan {out} ...)")
    return 0


def _render(console: Console, problem, solution) -> None:  # noqa: ANN001 - Problem, Solution
    """The tables of a found plan and its summary: what plan and solve print."""
    from hetpar.cli.render import render_estimate, render_solution

    render_estimate(console, solution.estimate, problem.cluster,
                    problem.model.with_seq_len(problem.training.seq_len),
                    solution.objective, solution.value)
    render_solution(console, solution)


def _cmd_validate(args: argparse.Namespace, console: Console) -> int:
    from hetpar.costmodel.constants import load_constants
    from hetpar.fidelity.report import (
        ExperimentReport,
        calibration_report,
        fitted_fsdp_report,
        heldout_fsdp_report,
        heldout_report,
        validation_report,
    )

    constants = load_constants(args.calibration)
    cal = calibration_report(constants)
    reports = [validation_report(constants, exp) for exp in ("het_cluster", "homogeneous")]
    held = heldout_report(constants)
    fsdp = heldout_fsdp_report(constants)
    fsdp_fit = fitted_fsdp_report(constants)

    def heldout_json(rep: ExperimentReport) -> dict[str, Any]:
        return {"name": rep.name, "mape": rep.mape, "false_infeasible": rep.false_infeasible,
                "mape_by_gpu": {g: {"mape": m, "rows": n}
                                for g, (m, n) in rep.mape_by_gpu.items()},
                "uncalibrated": sorted(rep.uncalibrated),
                "rows": {r.row_id: {"published_s": r.measured_s, "predicted_s": r.predicted_s,
                                    "feasible": r.feasible} for r in rep.results}}

    if args.json:
        _print_json({
            "calibration": {"mape": cal.mape,
                            "rows": {r.row_id: {"published_s": r.measured_s,
                                                "predicted_s": r.predicted_s} for r in cal.results}},
            "heldout": heldout_json(held),
            "heldout_fsdp": heldout_json(fsdp),
            "fitted_fsdp": heldout_json(fsdp_fit),
            **{rep.name: {"spearman": rep.spearman, "kendall": rep.kendall,
                          "predicted_best": rep.predicted_best.row_id if rep.predicted_best else None,
                          "pick_slowdown": rep.pick_slowdown,
                          "failed_caught": rep.failed_caught, "failed": len(rep.failed),
                          "false_infeasible": rep.false_infeasible,
                          "failed_outside_space": rep.failed_outside_space,
                          "finished_outside_space": rep.finished_outside_space,
                          "rows": {r.row_id: {"measured_s": r.measured_s,
                                              "predicted_s": r.predicted_s,
                                              "feasible": r.feasible,
                                              "empty_stage": r.empty_stage}
                                   for r in rep.results}}
               for rep in reports}})
        return 0
    from hetpar.cli.render import render_calibration, render_heldout, render_validation
    render_calibration(console, cal)
    console.print()
    render_heldout(console, held)
    console.print()
    render_heldout(console, fsdp, "MosaicML llm-foundry MPT benchmarks, PyTorch FSDP "
                                  "(full sharding, ZeRO-3), H100 and A100")
    console.print()
    render_heldout(console, fsdp_fit, "the same benchmarks' H100 rows, the H100's matmul "
                                      "efficiency fitted on them", fitted=True)
    for rep in reports:
        console.print()
        render_validation(console, rep, fitted=rep.name == "homogeneous")
    caught = sum(r.failed_caught for r in reports)
    failed = sum(len(r.failed) for r in reports)
    wrong = sum(r.false_infeasible for r in reports)
    outside = sum(r.failed_outside_space for r in reports)
    wrong_outside = sum(r.finished_outside_space for r in reports)
    console.print(f"\nboth experiments: {caught} of {failed} failed runs predicted infeasible, "
                  f"{wrong} finished runs predicted infeasible; {caught + outside} of {failed} "
                  f"failed runs hetpar would not run ({outside} more whose plans have a stage "
                  f"without transformer layers, which its plan space excludes), "
                  f"{wrong + wrong_outside} finished runs")
    return 0


def _cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    from hetpar.fidelity.calibrate import fit_constants

    with console.status("fitting constants on Megatron SC21 Table 1, AMP homogeneous runs "
                        "and four llm-foundry H100 runs"):
        constants, fitted = fit_constants()
    header = ("# Cost-model constants fitted by `hetpar calibrate` on Megatron SC21 Table 1 and\n"
              "# the `homogeneous` rows of the AMP GPT-2 runs (configs/reference/), then the\n"
              "# H100's matmul efficiency on four of llm-foundry's MPT FSDP runs; the AMP\n"
              "# `het_cluster` rows and the other llm-foundry rows are held out for\n"
              "# `hetpar validate`.\n")
    text = constants.to_yaml(header)
    if args.out:
        out = Path(args.out)
        try:
            tmp = out.with_suffix(out.suffix + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(out)
        except OSError as exc:
            raise ConfigError(str(out), "", f"cannot write: {exc.strerror}") from None
        for name, value in fitted.items():
            console.print(f"  {name}: {value:.4g}")
        console.print(f"wrote {out}")
    else:
        print(text, end="")
    return 0


def _cmd_list(args: argparse.Namespace, console: Console) -> int:
    from hetpar.cluster.gpu import load_gpu_catalog
    from hetpar.configio import list_bundled

    kinds = ("clusters", "models", "training", "gpus") if args.kind == "all" else (args.kind,)
    for kind in kinds:
        if kind == "gpus":
            names = [g.name for g in load_gpu_catalog()]
        else:
            names = list_bundled(kind)
        console.print(f"[bold]{kind}[/]: {', '.join(names)}")
    return 0


# ---- hetpar suite: topology suites (hetpar/problem/generator.py) --------------------------------

def _add_suite_parser(sub: argparse._SubParsersAction) -> None:
    suite = sub.add_parser(
        "suite", help="list topology suites, show or save their instances",
        description="Topology suites are seeded families of instances (cluster, bandwidth "
                    "models, model, training) for the plan-building environment; format in "
                    "configs/README.md section 8.")
    ssub = suite.add_subparsers(dest="suite_command", metavar="ACTION")
    ssub.required = True
    show = ssub.add_parser("show", help="print sampled instances of a suite",
                           description="Print instances start .. start+n-1 of a suite: hosts by "
                                       "GPU type, network shape, bandwidth figures, model, batch.")
    show.add_argument("suite", metavar="SUITE", help="bundled suite name, suite file or a saved "
                                                     "instance file")
    show.add_argument("--n", type=int, default=5, help="instances to show (default 5)")
    show.add_argument("--seed-offset", type=int, default=0, metavar="K",
                      help="index of the first instance (default 0)")
    show.add_argument("--json", action="store_true",
                      help="print one JSON object (summaries and full instance documents)")
    show.set_defaults(func=_cmd_suite_show)
    smp = ssub.add_parser("sample", help="write instances of a suite to a file (a fixed test set)",
                          description="Write instances start .. start+n-1 to a YAML (or .json) "
                                      "file that 'hetpar suite show FILE' and load_suite read.")
    smp.add_argument("suite", metavar="SUITE")
    smp.add_argument("--n", type=int, required=True, help="number of instances")
    smp.add_argument("--seed-offset", type=int, default=0, metavar="K",
                     help="index of the first instance (default 0)")
    smp.add_argument("--out", required=True, metavar="FILE", help="output file (.yaml or .json)")
    smp.set_defaults(func=_cmd_suite_sample)
    lss = ssub.add_parser("list", help="list the bundled suites")
    lss.set_defaults(func=_cmd_suite_list)


def _suite_range(args: argparse.Namespace):
    from hetpar.problem.generator import load_suite

    if args.n < 0:
        raise ConfigError("--n", "", f"must not be negative, got {args.n}")
    if args.seed_offset < 0:
        raise ConfigError("--seed-offset", "", f"must not be negative, got {args.seed_offset}")
    suite = load_suite(args.suite)
    return suite, suite.instances(args.n, start=args.seed_offset)


def _cmd_suite_show(args: argparse.Namespace, console: Console) -> int:
    from hetpar.problem.generator import describe_instance

    suite, instances = _suite_range(args)
    if args.json:
        _print_json({"suite": suite.name, "max_hosts": suite.max_hosts, "size": suite.size,
                     "instances": [{"summary": describe_instance(inst),
                                    "instance": inst.to_dict()} for inst in instances]})
        return 0

    def span(lo_hi: list, fmt: str = "{:g}") -> str:
        lo, hi = (fmt.format(v) for v in lo_hi)
        return lo if lo == hi else f"{lo}-{hi}"

    def out(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    size = f", {suite.size} instances" if suite.size is not None else ""
    out(f"[bold]{suite.name}[/] (max_hosts {suite.max_hosts}{size})")
    for inst in instances:
        d = describe_instance(inst)
        hosts = ", ".join(f"{g['count']}x {g['gpu']} ({g['gpus_per_host']} GPU"
                          f"{'s' if g['gpus_per_host'] > 1 else ''}, {g['nic_gbps']:g} Gb/s)"
                          for g in d["host_groups"])
        net = d["network"]
        shape = net["shape"]
        if "leaves" in net:
            shape += f", {net['leaves']} leaves, {net['oversubscription']:g}:1 oversubscribed"
        if "sites" in net:
            shape += f", {net['sites']} sites"
        m, t = d["model"], d["training"]
        out(f"\n[bold]{d['name']}[/] (seed {d['seed']}): {d['hosts']} hosts, {d['gpus']} GPUs")
        out(f"  hosts    {hosts}")
        out(f"  network  {shape}")
        for key, label in (("uplinks", "uplinks"), ("fabric", "fabric"), ("wan", "WAN")):
            st = d.get(key)
            if not st or not st["count"]:
                continue
            lat = st["latency_us"]
            lat_txt = (span([v / 1000 for v in lat], "{:.0f}") + " ms" if lat[0] >= 1000
                       else span(lat) + " us")
            out(f"  {label:<8} {st['count']} link{'s' if st['count'] > 1 else ''}, "
                f"{span(st['capacity_gbps'])} Gb/s, mean {span(st['mean_fraction'], '{:.0%}')} "
                f"of capacity, cv {span(st['cv'], '{:.2f}')} ({st['stochastic']} log-normal), "
                f"latency {lat_txt}")
        out(f"  model    {m['name']} ({m['params_B']:.2f}B, {m['layers']} layers, "
            f"{m['heads']} heads, s {m['seq_len']}), global batch {t['global_batch']}, "
            f"{t['precision']}")
    return 0


def _cmd_suite_sample(args: argparse.Namespace, console: Console) -> int:
    from hetpar.problem.generator import save_instances

    out = Path(args.out)
    if not out.parent.exists():
        raise ConfigError(str(out), "", "its folder does not exist")
    if args.n < 1:
        raise ConfigError("--n", "", f"must be at least 1, got {args.n}")
    suite, instances = _suite_range(args)
    save_instances(out, instances, suite=suite.name, max_hosts=suite.max_hosts)
    console.print(f"wrote {len(instances)} instances of {suite.name} to {out} "
                  f"(load them with: hetpar suite show {out})", highlight=False)
    return 0


def _cmd_suite_list(args: argparse.Namespace, console: Console) -> int:
    from hetpar.problem.generator import list_suites, load_suite

    for name in list_suites():
        suite = load_suite(name)
        spec = suite.spec
        hosts = f"{spec.hosts[0]}-{spec.hosts[1]} hosts" if spec else ""
        first = suite.description.split(":")[0].strip()
        console.print(f"[bold]{name}[/]: {hosts}, max_hosts {suite.max_hosts}"
                      + (f", {suite.size} instances" if suite.size else "") + f". {first}",
                      highlight=False, soft_wrap=True)
    return 0


# ---- hetpar plan / evaluate: plans from a trained policy (hetpar/agents/) --------------------

def _add_plan_parsers(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser(
        "plan", help="plan with a trained policy in about a second",
        description="Build a plan with a trained policy: its most likely masked rollout "
                    "in the plan-building environment for each memory option (recompute, "
                    "ZeRO) and each micro-batch count it may then choose (--beam W: a "
                    "beam search of that width over its decisions instead); the exact "
                    "layer-split search then picks "
                    "the best micro-batch count, recompute mode and layer split for the "
                    "plan's structure (stages, TP degrees, hosts), and a local search over "
                    "structures a few edits away, each completed exactly, looks for a better "
                    "one (--no-improve skips it: the plan in about half a second). Without "
                    "--policy it uses the default policy shipped with hetpar. The plan is "
                    "scored over --samples bandwidth states drawn with --seed, as 'hetpar "
                    "solve' scores its plans.")
    pl.add_argument("--policy", metavar="FILE",
                    help="policy file from 'hetpar train', or 'clone' for the bundled behaviour "
                         "clone (default: the shipped policy)")
    pl.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)
    _add_instance_args(pl)
    pl.add_argument("--objective", default=None, metavar="OBJ",
                    help="mean, pNN (e.g. p90) or cvarA (e.g. cvar0.9); default: the "
                         "policy's training objective")
    pl.add_argument("--samples", type=int, default=None, metavar="K",
                    help="bandwidth states the objective is computed over (default: the "
                         "policy's)")
    pl.add_argument("--seed", type=int, default=0, help="seed of the bandwidth sampling")
    pl.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    pl.add_argument("--timings", action="store_true", help=TIMINGS_HELP)
    pl.add_argument("--out", metavar="FILE", help="write the plan (JSON) for 'hetpar estimate'")
    pl.add_argument("--compare", choices=("exact", "metis", "megatron", "random",
                                          "local-search"),
                    help="also run this method and print the gap T_policy / T_method - 1")
    pl.add_argument("--time-limit", type=float, default=None, metavar="S",
                    help="time limit of the exact search for --compare exact (a search it "
                         "stops may return another plan on another run)")
    pl.add_argument("--beam", type=int, default=None, metavar="W",
                    help="beam width of the search over the policy's decisions instead of "
                         "the micro-batch sweep (1: the single most likely rollout; 4 finds "
                         "a better start now and then, at about 4x the inference time)")
    pl.add_argument("--micro-sweep", action=argparse.BooleanOptionalAction, default=None,
                    help="roll the policy out once for each of its --sweep-memory most likely "
                         "memory options and every micro-batch count it may then choose "
                         "(greedy elsewhere) and refine the best: both are chosen before any "
                         "stage, and a poor choice makes the policy's worst plans; 5-28 "
                         "rollouts instead of one (default: on, except with --beam or "
                         "--no-refine; --no-micro-sweep: the single most likely rollout)")
    pl.add_argument("--sweep-memory", type=int, default=None, metavar="K",
                    help="memory options (recompute, ZeRO) the sweep rolls out from, most "
                         "likely first (default: all 6; 3: half the time, a worse tail on "
                         "large clusters; 1: the policy's own only, several times faster)")
    pl.add_argument("--no-refine", action="store_true",
                    help="keep the rollout's plan as it is (no exact layer split, no "
                         "structure search)")
    pl.add_argument("--refine-steps", type=int, default=500, metavar="N",
                    help="search steps of the refinement at most (default 500, about 0.5 ms "
                         "each; a step budget gives the same plan on every machine)")
    # "--improve" without N (the default budget) is still accepted, as before stop 15.
    pl.add_argument("--improve", type=int, nargs="?", const=None, default=None, metavar="N",
                    help="scored completions of the structure search at most (default "
                         "200000, about a second on one core; a count, so the plan is the "
                         "same on every machine; 0 turns it off)")
    pl.add_argument("--no-improve", action="store_true",
                    help="skip the structure search: the policy's refined plan (the sweep "
                         "takes about half a second; --no-micro-sweep tens of milliseconds)")
    pl.add_argument("--runtime", choices=RUNTIME_CHOICES, default="any",
                    help=RUNTIME_HELP + ". For megatron or deepspeed the policy plans under "
                         "masks that allow only the plans that framework runs, the "
                         "refinement keeps to its layer splits, and the exact search over "
                         "its plans follows from the policy's plan (--time-limit, default "
                         f"{RUNTIME_PLAN_LIMIT:g} s; not with --no-improve); the gap to the "
                         "policy's plan over the whole space is printed")
    pl.set_defaults(func=_cmd_plan)

    ev = sub.add_parser(
        "evaluate", help="compare a policy with exact search and the baselines on a suite",
        description="Run every method on the first N instances of a topology suite and write "
                    "results.csv (per instance and method), summary.md (gap statistics, win "
                    "rates, latency) and gap_vs_size.png to --out. Gaps are T / T_exact - 1 "
                    "where exact proves the optimum, else T / T_best - 1 against the best plan "
                    "any method found. When the suite has a reference file (hetpar reference), "
                    "every row also has its gaps to the file's proven optimum, or to its bound "
                    "and best plan.")
    ev.add_argument("--policy", metavar="FILE",
                    help="policy file from 'hetpar train', or 'clone' for the bundled behaviour "
                         "clone (default: the shipped policy)")
    ev.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)
    ev.add_argument("--suite", required=True, metavar="SUITE",
                    help="bundled suite name, suite file or instance file (hetpar suite list)")
    ev.add_argument("--n", type=int, default=20, help="instances 0 .. N-1 (default 20)")
    ev.add_argument("--methods", default="policy,exact,metis,megatron,random",
                    help="comma-separated methods (default policy,exact,metis,megatron,random; "
                         "policy is 'hetpar plan''s default: one rollout, refinement, "
                         "structure search; also policy-beam: the same from a beam search "
                         "(--beam), policy-greedy: the refined rollout without the structure "
                         "search ('hetpar plan --no-improve'), policy-raw: the rollout alone; "
                         "and local-search, brute as in 'hetpar solve')")
    ev.add_argument("--beam", type=int, default=None, metavar="W",
                    help="beam width of the 'policy-beam' method (default 4)")
    ev.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                    help="time limit of the exact search per instance (default 60; an "
                         "instance the limit stops may get another plan on another run)")
    ev.add_argument("--workers", type=int, default=1, metavar="N",
                    help="worker processes of the exact search (default 1)")
    ev.add_argument("--objective", default=None, metavar="OBJ",
                    help="objective of every method (default: the policy's training objective)")
    ev.add_argument("--samples", type=int, default=None, metavar="K",
                    help="bandwidth states per instance (default: the policy's)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the bandwidth sampling")
    ev.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    ev.add_argument("--json", action="store_true",
                    help="print one JSON object (every row's result fields, as 'hetpar solve "
                         "--json' prints them) instead of the summary")
    ev.add_argument("--timings", action="store_true",
                    help=TIMINGS_HELP + " (results.csv keeps every row's wall_s)")
    ev.add_argument("--reference", metavar="FILE",
                    help="reference file of the suite (default: configs/references/SUITE.json "
                         "when there is one): adds each method's gap to its proven optima, "
                         "bounds and best plans")
    ev.add_argument("--no-reference", action="store_true",
                    help="ignore the suite's reference file")
    _add_backend_args(ev, "local (default): instances one after another here; ray: each "
                          "instance a Ray task, --workers at a time, its exact search on one "
                          "worker")
    ev.set_defaults(func=_cmd_evaluate)


def _cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from hetpar.costmodel.objective import Objective

    objective = Objective.parse(args.objective) if args.objective is not None else None
    if args.samples is not None and args.samples < 1:
        raise ConfigError("--samples", "", f"must be at least 1, got {args.samples}")
    if args.time_limit is not None and args.time_limit <= 0:
        raise ConfigError("--time-limit", "", f"must be positive, got {args.time_limit:g}")
    if args.refine_steps < 1:
        raise ConfigError("--refine-steps", "", f"must be at least 1, got {args.refine_steps}")
    beam = _beam_arg(args.beam)
    if args.improve is not None and args.improve < 0:
        raise ConfigError("--improve", "", f"must be 0 (off) or more, got {args.improve}")
    if args.no_improve or args.no_refine:
        args.improve = 0
    elif args.improve is None:
        from hetpar.solvers.local_search import DEFAULT_EVALUATIONS
        args.improve = DEFAULT_EVALUATIONS
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.exists():
        raise ConfigError(str(out), "", "its folder does not exist")
    cluster, model, training, constants = _load_instance(args)
    _check_precision(cluster, training)

    from hetpar.agents import planning
    from hetpar.agents.io import load_policy
    from hetpar.agents.planner import policy_method, policy_problem

    bundle = load_policy(args.policy, trust_pickle=args.trust_pickle)
    # The problem: the policy's training objective and sample count unless given.
    problem = policy_problem(bundle, cluster, model, training, objective=objective,
                             samples=args.samples, seed=args.seed, constants=constants)
    refine = not args.no_refine
    method = policy_method(beam, refine, args.improve)
    # Unless told, the method's preset decides how to decode: the refined methods sweep the
    # memory option and the micro-batch count (except on a cluster planned in replica
    # slices), and a --beam given, 1 included, decodes that beam instead.
    on = args.micro_sweep if args.micro_sweep is not None else \
        args.beam is None and refine
    sweep: dict[str, Any] = {} if args.beam is None else {"beam": beam}
    if args.micro_sweep is not None or not on:
        sweep["micro_sweep"] = on
    if args.sweep_memory is not None:
        if args.sweep_memory < 1:
            raise ConfigError("--sweep-memory", "",
                              f"must be at least 1, got {args.sweep_memory}")
        if not on:
            raise ConfigError("--sweep-memory", "", "only with the sweep (not with --beam, "
                                                    "--no-refine or --no-micro-sweep)")
        # Asking how many memory options to sweep asks for the sweep (slices included).
        sweep.update(micro_sweep=True, sweep_memory=args.sweep_memory)
    result = planning.plan(problem, method, policy=bundle, source=args.cluster, refine=refine,
                           refine_steps=args.refine_steps,
                           improve_evaluations=args.improve, **sweep)
    unrestricted = None  # the policy's plan over the whole space, when a runtime restricts
    runtime_policy = None  # the policy's own plan under the runtime's masks
    if args.runtime != "any":
        unrestricted = result
        result = runtime_policy = planning.plan(
            problem, method, policy=bundle, source=args.cluster, refine=refine,
            refine_steps=args.refine_steps, improve_evaluations=args.improve,
            runtime=args.runtime, **sweep)
        if args.improve:
            with console.status(f"searching the plans {args.runtime} can run",
                                spinner="dots"):
                result = planning.plan(problem, "exact", runtime=args.runtime,
                                       time_limit=args.time_limit or RUNTIME_PLAN_LIMIT,
                                       starts=(("policy", runtime_policy.plan),),
                                       policy_start=False)
    other = None
    if args.compare:
        with console.status(f"running {args.compare} for comparison", spinner="dots"):
            # The same problem: the same states, the cost model's tables shared.
            other = planning.plan(problem, args.compare, time_limit=args.time_limit)
    if out is not None:
        try:
            result.plan.save(out)
        except OSError as exc:
            raise ConfigError(str(out), "", f"cannot write: {exc.strerror}") from None
    gap = (result.value / other.value - 1.0) if other is not None and other.found else None
    if args.json:
        doc = result.to_dict()
        if unrestricted is not None and runtime_policy is not None:
            doc["runtime"] = {"name": args.runtime, "any_value_s": unrestricted.value,
                              "gap_to_any": result.value / unrestricted.value - 1.0,
                              "policy_value_s": runtime_policy.value,
                              "searched": result is not runtime_policy}
        if other is not None:
            # The compared method's own result fields, and T_policy / T_method - 1 (its
            # "gap" is its own bound's, as in every result).
            doc["compare"] = {**other.to_dict(), "policy_gap": gap}
        _print_json(_json_doc(doc, args))
        return 0
    _render(console, problem, result)
    beyond = [what for what, on in (
        (f"{'/'.join(map(str, training.virtual_stages[1:]))} chunks per stage",
         len(training.virtual_stages) > 1),
        (f"ZeRO {'/'.join(str(z) for z in training.zero_stages if z > 1)}",
         any(z > 1 for z in training.zero_stages))) if on]
    if beyond:
        # The environment's actions build plain 1F1B plans with ZeRO 0 or 1 (docs/env.md).
        tried = ("the refinement after it tried them" if refine else
                 "--no-refine: nothing tried them")
        console.print(f"note: the policy does not choose {' or '.join(beyond)}, which the "
                      f"training spec allows; {tried} (hetpar solve --method exact searches "
                      f"them all)", highlight=False)
    if unrestricted is not None and runtime_policy is not None:
        how = (f"the policy's plan under {args.runtime}'s masks {runtime_policy.value:.4f} s, "
               f"then the search over its plans" if result is not runtime_policy else
               "the policy's own plan under its masks")
        console.print(f"[bold]runtime {args.runtime}[/]: {result.value:.4f} s ({how}) against "
                      f"{unrestricted.value:.4f} s for the policy's plan over every plan of "
                      f"the space (runtime any): "
                      f"{result.value / unrestricted.value - 1.0:+.1%}", highlight=False)
    if other is not None:
        if not other.found:
            console.print(f"[bold]{other.method}[/]: no plan found in {other.wall_s:.2f} s")
        else:
            cert = other.certificate
            how = ("" if cert is None else ", proven optimal" if cert.optimal else
                   f", not proven optimal ({cert.stopped}, bound gap {other.gap:.1%})")
            t = result.timings
            # Time to the plan once the environment exists (setup aside).
            latency = t["inference"] + t["refine"] + t["improve"]
            speed = other.wall_s / max(latency, 1e-9)
            what = ("rollout, refinement and structure search" if t["improve"] else
                    "rollout and refinement")
            pace = (f"{speed:,.0f}x faster" if speed >= 1.5 else
                    f"{1 / speed:,.1f}x slower" if speed < 1 / 1.5 else "as fast")
            console.print(f"[bold]{other.method}[/]: objective {other.objective} = "
                          f"{other.value:.4f} s in {other.wall_s:.2f} s{how}", highlight=False)
            console.print(f"gap T_policy / T_{other.method} - 1 = [bold]{gap:+.2%}[/]; the "
                          f"policy ({what}) was {pace}", highlight=False)
    if out is not None:
        console.print(f"plan written to {out} (check it with: hetpar estimate --plan {out} ...)")
    return 0


def _beam_arg(beam: int | None, wide: bool = False) -> int:
    """``--beam``, checked; by default ``hetpar plan``'s width, or with ``wide`` that of
    ``hetpar evaluate``'s policy-beam."""
    if beam is None:
        from hetpar.agents.planner import DEFAULT_BEAM, WIDE_BEAM
        return WIDE_BEAM if wide else DEFAULT_BEAM
    if beam < 1:
        raise ConfigError("--beam", "", f"must be at least 1, got {beam}")
    return beam


def _cmd_evaluate(args: argparse.Namespace, console: Console) -> int:
    from hetpar.agents.evaluate import METHODS, evaluate, write_outputs
    from hetpar.costmodel.objective import Objective

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ConfigError("--methods", "", f"unknown method(s) {', '.join(bad) or '(none)'} "
                                           f"(known: {', '.join(METHODS)})")
    if len(set(methods)) != len(methods):
        raise ConfigError("--methods", "", "lists a method twice")
    if args.n < 1:
        raise ConfigError("--n", "", f"must be at least 1, got {args.n}")
    if args.time_limit <= 0:
        raise ConfigError("--time-limit", "", f"must be positive, got {args.time_limit:g}")
    if args.workers < 1:
        raise ConfigError("--workers", "", f"must be at least 1, got {args.workers}")
    if args.samples is not None and args.samples < 1:
        raise ConfigError("--samples", "", f"must be at least 1, got {args.samples}")
    if args.objective is not None:
        Objective.parse(args.objective)
    beam = _beam_arg(args.beam, wide=True)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(str(out), "", "exists and is not a folder")
    if not out.parent.exists():
        raise ConfigError(str(out), "", "its parent folder does not exist")

    from hetpar.problem.generator import load_suite

    suite = load_suite(args.suite)
    if suite.size is not None and args.n > suite.size:
        raise ConfigError("--n", "", f"the suite {suite.name} has {suite.size} instances, "
                                     f"asked for {args.n}")
    bundle = None
    if any(m.startswith("policy") for m in methods):
        from hetpar.agents.io import load_policy
        bundle = load_policy(args.policy, trust_pickle=args.trust_pickle)
    reference = _evaluate_reference(args, suite)
    _join_backend(args, args.workers)

    from rich import progress as rp

    total = args.n * len(methods)
    with rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(),
                     rp.MofNCompleteColumn(), rp.TimeElapsedColumn(), console=console,
                     transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"evaluating on {suite.name}", total=total)
        result = evaluate(
            suite, args.n, methods, bundle=bundle, objective=args.objective,
            samples=args.samples, seed=args.seed, time_limit=args.time_limit,
            workers=args.workers, beam=beam, reference=reference,
            backend=args.backend, address=args.address,
            progress=lambda i, m: bar.update(task, advance=1),
            on_start=lambda i, m: bar.update(task, description=f"{suite.name} #{i}: {m}"))
    paths = write_outputs(result, out)
    if args.json:
        _print_json(_json_doc(result.to_dict(), args))
        return 0
    console.print(result.summary_markdown(), highlight=False, markup=False, soft_wrap=True)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
    return 0


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser(
        "train", help="train a planning policy (MaskablePPO) on a topology suite",
        description="Train a size-independent policy with MaskablePPO on a topology suite. "
                    "Hyper-parameters come from a YAML config (configs/train/*.yaml, format in "
                    "docs/agents.md); runs/<run-name>/ receives the resolved config, TensorBoard "
                    "logs (tensorboard --logdir runs), checkpoints, the best policy by "
                    "evaluation against exact and the final policy. Ctrl-C or SIGTERM saves a "
                    "checkpoint that --resume continues; one run at a time owns a run folder "
                    "(runs/<run-name>/.lock).")
    tr.add_argument("--config", metavar="FILE|NAME",
                    help="training config file, or a bundled one: tiny, default (required "
                         "unless --resume)")
    tr.add_argument("--timesteps", type=int, default=None, metavar="N",
                    help="total timesteps (overrides total_timesteps)")
    tr.add_argument("--seed", type=int, default=None, help="seed (overrides seed)")
    tr.add_argument("--n-envs", type=int, default=None, metavar="N",
                    help="parallel environments, subprocesses when N > 1 (overrides n_envs)")
    tr.add_argument("--run-name", metavar="NAME",
                    help="run folder name under --runs-dir (default: config name and time)")
    tr.add_argument("--runs-dir", default="runs", metavar="DIR",
                    help="where run folders go (default runs)")
    tr.add_argument("--resume", metavar="RUN",
                    help="continue the run folder RUN from its latest checkpoint (a damaged "
                         "one is skipped for the one before)")
    tr.add_argument("--overwrite", action="store_true",
                    help="delete what an earlier run saved in the run folder and start anew "
                         "(without it, such a folder is refused)")
    tr.add_argument("--trust-pickle", action="store_true",
                    help="let finetune.init_policy be a policy file of format 1 "
                         "(stable-baselines3's pickled zip), which can run code when loaded")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_backend_args(tr, "where the environments run: local worker processes (default) or "
                          "Ray actors, one per group of environments; the learner stays in "
                          "this process")
    tr.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace, console: Console) -> int:
    try:
        from hetpar.agents.train import load_run_config, load_train_config, train
    except ImportError as exc:
        raise ConfigError("", "", f"training needs the 'rl' extra (pip install 'hetpar[rl]'): "
                                  f"{exc}") from None
    for flag, value in (("--timesteps", args.timesteps), ("--n-envs", args.n_envs)):
        if value is not None and value < 1:
            raise ConfigError(flag, "", f"must be at least 1, got {value}")
    if args.seed is not None and args.seed < 0:
        raise ConfigError("--seed", "", f"must not be negative, got {args.seed}")
    if args.resume:
        if args.run_name and args.run_name != args.resume:
            raise ConfigError("--run-name", "", "use --resume RUN alone to continue a run")
        run_dir = Path(args.runs_dir) / args.resume
        cfg = load_train_config(args.config) if args.config else load_run_config(run_dir)
        name = args.resume
    elif not args.config:
        raise ConfigError("--config", "", "required (a file or a bundled name: tiny, default)")
    else:
        cfg = load_train_config(args.config)
        name = args.run_name
    cfg = cfg.with_overrides(timesteps=args.timesteps, seed=args.seed, n_envs=args.n_envs)
    _join_backend(args, cfg.n_envs)
    result = train(cfg, run_name=name, runs_dir=args.runs_dir, resume=bool(args.resume),
                   overwrite=args.overwrite, trust_pickle=args.trust_pickle,
                   progress=not args.no_progress, log=lambda m: console.print(m, highlight=False),
                   backend=args.backend, address=args.address)
    if result.interrupted:
        return 130
    console.print(f"run folder: {result.run_dir}  (tensorboard --logdir {result.run_dir.parent})")
    return 0


def _add_policy_parser(sub: argparse._SubParsersAction) -> None:
    pol = sub.add_parser(
        "policy", help="inspect or convert policy files",
        description="A policy file (format 2) holds JSON metadata and safetensors weights: "
                    "reading it cannot run code. Format 1, stable-baselines3's zip that "
                    "earlier hetpar wrote, holds pickles, which can; 'convert' rewrites one "
                    "as format 2 once, if you trust where it came from.")
    psub = pol.add_subparsers(dest="policy_command", metavar="ACTION")
    psub.required = True
    show = psub.add_parser("show", help="print a policy file's metadata (never unpickles)")
    show.add_argument("policy", metavar="FILE",
                      help="policy file, or 'shipped' / 'clone' for a bundled one")
    show.add_argument("--json", action="store_true", help="print the whole metadata as JSON")
    show.set_defaults(func=_cmd_policy_show)
    conv = psub.add_parser("convert", help="rewrite a format-1 (pickled) policy file as "
                                           "format 2")
    conv.add_argument("policy", metavar="OLD", help="format-1 policy file")
    conv.add_argument("out", metavar="NEW", help="format-2 file to write (must not exist "
                                                 "unless --overwrite)")
    conv.add_argument("--trust-pickle", action="store_true",
                      help="required: converting unpickles OLD, which can run code")
    conv.add_argument("--overwrite", action="store_true", help="replace NEW if it exists")
    conv.set_defaults(func=_cmd_policy_convert)


def _cmd_policy_show(args: argparse.Namespace, console: Console) -> int:
    from hetpar.agents.io import policy_path, read_meta

    path = policy_path(args.policy)
    meta = read_meta(path)
    if args.json:
        print(json.dumps(meta, indent=1, sort_keys=True, default=str))
        return 0
    env = meta.get("env_kwargs") or {}
    net = meta.get("network") or {}
    lines = [f"{path}",
             f"  format {meta.get('format_version')} (hetpar {meta.get('hetpar_version', '?')})"
             + ("  [pickled: load only with --trust-pickle]"
                if meta.get("format_version") == 1 else ""),
             f"  trained {meta.get('timesteps', '?')} timesteps"
             + (f", run {meta['run_name']}" if meta.get("run_name") else "")
             + (f", saved {meta['saved_at']}" if meta.get("saved_at") else ""),
             f"  max_hosts {meta.get('max_hosts')}, objective {env.get('objective', '?')}, "
             f"bandwidth {env.get('bandwidth', '?')}, samples {env.get('samples', '?')}",
             f"  network {net.get('class', '?')} {net.get('kwargs', '')}" if net else
             "  network: a stable-baselines3 pickle"]
    console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)
    return 0


def _cmd_policy_convert(args: argparse.Namespace, console: Console) -> int:
    from hetpar.agents.io import LEGACY_FORMAT, convert_legacy_policy, read_meta

    if not args.trust_pickle:
        raise ConfigError("--trust-pickle", "", "required: converting a format-1 file "
                                                "unpickles it, which can run code")
    out = Path(args.out)
    if out.suffix != ".zip":
        out = out.with_name(out.name + ".zip")
    if out.exists() and not args.overwrite:
        raise ConfigError(str(out), "", "exists; pass --overwrite to replace it")
    if not out.parent.is_dir():
        raise ConfigError(str(out), "", "its folder does not exist")
    version = read_meta(args.policy).get("format_version")
    if version != LEGACY_FORMAT:
        raise ConfigError(args.policy, "format_version",
                          f"format {version!r}, not a format-1 file; nothing to convert")
    path = convert_legacy_policy(args.policy, out,
                                 warn=lambda m: print(m, file=sys.stderr))
    console.print(f"wrote {path} (format 2: metadata and safetensors weights)",
                  highlight=False, markup=False, soft_wrap=True)
    return 0


def _evaluate_reference(args: argparse.Namespace, suite):  # noqa: ANN202 - References
    """The reference file ``hetpar evaluate`` measures against: --reference, else the
    suite's bundled one, else none (the gaps of before, to exact or the best found)."""
    from hetpar.agents.reference import find_reference, load_references

    if args.reference and args.no_reference:
        raise ConfigError("--reference", "", "give --reference FILE or --no-reference, not both")
    if args.no_reference:
        return None
    path = Path(args.reference) if args.reference else find_reference(suite)
    return load_references(path) if path is not None else None


# ---- hetpar reference: reference optima as data (hetpar/agents/reference.py) -------------------

def _add_reference_parser(sub: argparse._SubParsersAction) -> None:
    from hetpar.agents.reference import DEFAULT_SEEDS, POLICY_SEEDS

    ref = sub.add_parser(
        "reference", help="build or check a suite's reference optima (configs/references/)",
        description="A reference file holds, per instance of a suite, the best plan known, "
                    "its value, the lower bound the exact search proved and the gap, under "
                    "one objective, sample count, seed and cost model; 'hetpar evaluate' "
                    "measures every method against it. Format in configs/README.md section 9.")
    rsub = ref.add_subparsers(dest="reference_command", metavar="ACTION")
    rsub.required = True
    b = rsub.add_parser(
        "build", help="solve the first N instances of a suite into its reference file",
        description="Solve instances 0 .. N-1: the seed methods, then exact with the time "
                    "limit in a child process killed after a grace period; keep the best "
                    "plan and exact's bound. The file is saved after every instance, so an "
                    "interrupted build keeps what it finished and a re-run skips it (with "
                    "--retry, solves the unproven ones again from their stored plan).")
    b.add_argument("suite", metavar="SUITE", help="bundled suite name or suite file")
    b.add_argument("--n", type=int, default=20, help="instances 0 .. N-1 (default 20)")
    b.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="time limit of the exact search per instance (default 60)")
    b.add_argument("--workers", type=int, default=1, metavar="W",
                   help="worker processes of the exact search (default 1)")
    b.add_argument("--out", metavar="FILE",
                   help="reference file (default configs/references/SUITE.json)")
    b.add_argument("--objective", default="mean", metavar="OBJ",
                   help="objective (default mean, the shipped policy's)")
    b.add_argument("--samples", type=int, default=None, metavar="K",
                   help="bandwidth states per instance (default 16, 'hetpar evaluate''s)")
    b.add_argument("--seed", type=int, default=0, help="seed of the bandwidth sampling")
    b.add_argument("--seeds", default=None, metavar="METHODS",
                   help=f"methods whose plans compete with exact's (default "
                        f"{','.join(DEFAULT_SEEDS + POLICY_SEEDS)}, the policy methods where "
                        f"the 'rl' extra is installed and the policy plans the instance; "
                        f"methods named here must plan every instance)")
    b.add_argument("--policy", metavar="FILE",
                   help="policy file of a policy seed method, or 'clone' for the bundled "
                        "behaviour clone (default: the shipped policy)")
    b.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)
    b.add_argument("--grace", type=float, default=None, metavar="S",
                   help="stop an exact search S seconds past its limit (default max(10, "
                        "time limit))")
    b.add_argument("--retry", action="store_true",
                   help="solve the stored entries not proven optimal again, their plan among "
                        "the starts; keep the better plan and the higher bound")
    _add_backend_args(b, "local (default): one instance after another here; ray: each "
                         "instance a Ray task of --workers CPUs, --jobs at a time, saved as "
                         "each ends")
    b.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="with --backend ray: instances solved at a time (default 1)")
    b.set_defaults(func=_cmd_reference_build)
    c = rsub.add_parser(
        "check", help="re-score every stored plan and report what is stale",
        description="Re-score every stored plan under the current cost model and say which "
                    "entries are stale (another cost model or suite in the header, an instance "
                    "the suite no longer generates, an invalid plan, a value that moved); exit "
                    "status 1 if any. The file is rewritten only with --update, which drops the "
                    "stale entries for 'hetpar reference build' to solve again.")
    c.add_argument("files", nargs="*", metavar="FILE",
                   help="reference files (default: every configs/references/*.json)")
    c.add_argument("--update", action="store_true",
                   help="drop stale entries and rewrite the header for the current cost model")
    c.set_defaults(func=_cmd_reference_check)


def _cmd_reference_build(args: argparse.Namespace, console: Console) -> int:
    from hetpar.agents.reference import build
    from hetpar.costmodel.objective import Objective
    from hetpar.problem import POLICY_SAMPLES

    Objective.parse(args.objective)
    for flag, value in (("--n", args.n), ("--workers", args.workers),
                        ("--samples", args.samples)):
        if value is not None and value < 1:
            raise ConfigError(flag, "", f"must be at least 1, got {value}")
    if args.time_limit <= 0:
        raise ConfigError("--time-limit", "", f"must be positive, got {args.time_limit:g}")
    if args.grace is not None and args.grace < 0:
        raise ConfigError("--grace", "", f"must not be negative, got {args.grace:g}")
    if args.jobs < 1:
        raise ConfigError("--jobs", "", f"must be at least 1, got {args.jobs}")
    if args.backend != "ray" and args.jobs != 1:
        raise ConfigError("--jobs", "", "is an option of --backend ray")
    _join_backend(args, args.jobs * args.workers)
    seeds = None if args.seeds is None else \
        [m.strip() for m in args.seeds.split(",") if m.strip()]
    from hetpar.problem.generator import load_suite

    suite = load_suite(args.suite)

    def log(line: str) -> None:
        console.print(f"{suite.name} {line}", highlight=False, markup=False, soft_wrap=True)

    report = build(suite, args.n, time_limit=args.time_limit, workers=args.workers,
                   out=args.out, objective=args.objective,
                   samples=args.samples if args.samples is not None else POLICY_SAMPLES,
                   seed=args.seed, seeds=seeds, policy=args.policy, grace_s=args.grace,
                   retry=args.retry, trust_pickle=args.trust_pickle, log=log,
                   backend=args.backend, address=args.address, jobs=args.jobs)
    refs = report.references
    done = [refs.entries[i] for i in range(args.n) if i in refs.entries]
    again = f" ({len(report.retried)} of them again)" if report.retried else ""
    console.print(f"{len(report.solved)} solved{again}, {len(report.skipped)} done before, in "
                  f"{report.wall_s:.1f} s; {sum(e.optimal for e in done)} of {len(done)} proven "
                  f"optimal; wrote {refs.path}", highlight=False, soft_wrap=True)
    return 0


def _cmd_reference_check(args: argparse.Namespace, console: Console) -> int:
    from hetpar.agents.reference import check, default_path, drop_stale, load_references

    files = [Path(f) for f in args.files] or sorted(default_path("x").parent.glob("*.json"))
    if not files:
        raise ConfigError(str(default_path("x").parent), "", "holds no reference files")
    stale_files = 0
    for path in files:
        refs = load_references(path)
        stale = check(refs)
        if not stale:
            console.print(f"{path}: {len(refs.entries)} entries, {refs.proven} proven optimal, "
                          "all current", highlight=False, soft_wrap=True)
            if args.update and not refs.per_entry_constants:
                # A file written before entries recorded their constants: record them, so
                # that a later refit stales only the entries it concerns.
                drop_stale(refs, stale).save(path)
                console.print("  updated: recorded each entry's constants digest",
                              highlight=False, soft_wrap=True)
            continue
        stale_files += 1
        console.print(f"{path}: {len(stale)} stale of {len(refs.entries)} entries",
                      highlight=False, soft_wrap=True)
        for s in stale:
            where = "header" if s.index is None else f"#{s.index} {s.name}"
            console.print(f"  {where}: {s.why}", highlight=False, markup=False, soft_wrap=True)
        if args.update:
            kept = drop_stale(refs, stale)
            kept.save(path)
            console.print(f"  updated: kept {len(kept.entries)} entries; "
                          f"'hetpar reference build {refs.suite['name']} --out {path}' solves "
                          "the rest again", highlight=False, markup=False, soft_wrap=True)
    return 1 if stale_files and not args.update else 0


# ---- hetpar replan: re-planning over a training run on a changing network (hetpar/dynamics/)

def _add_replan_parser(sub: argparse._SubParsersAction) -> None:
    from hetpar.dynamics import cli as replan_cli

    rp = sub.add_parser(
        "replan", help="simulate a training run on a changing network under re-planning strategies",
        description="Advance a training job through a scenario (or a replayed per-link trace): "
                    "at every change in bandwidth or topology each strategy may switch plans, "
                    "paying a checkpoint migration; writes summary.json, summary.md and "
                    "timeline.png to --out. Formats in docs/dynamics.md.")
    replan_cli.add_arguments(rp)
    rp.set_defaults(func=lambda args, console: replan_cli.run(
        args, lambda m: console.print(m, highlight=False, markup=False, soft_wrap=True)))


def _print_json(doc: Any) -> None:  # noqa: ANN401 - JSON-ready data
    """Print one strict JSON object on stdout (``solution.strict_json``)."""
    from hetpar.problem.solution import strict_json

    print(strict_json(doc))


# Integer flags with stated limits (hetpar.limits): flag attribute -> (least, most, why).
def _int_flag_limits() -> dict[str, tuple[int, int, str]]:
    from hetpar import limits as lim

    return {
        "seed": (0, lim.MAX_SEED, "seeds are non-negative integers"),
        "samples": (0, lim.MAX_SAMPLES, "hetpar.limits.MAX_SAMPLES"),
        "workers": (1, lim.MAX_WORKERS, "hetpar.limits.MAX_WORKERS"),
        "budget": (1, lim.MAX_BUDGET, "hetpar.limits.MAX_BUDGET"),
        "n": (0, lim.MAX_INSTANCES, "hetpar.limits.MAX_INSTANCES"),
        "seed_offset": (0, 2**31 - 1, "suite indices run to 2**31 - 1"),
        "refine_steps": (1, lim.MAX_STEPS, "hetpar.limits.MAX_STEPS"),
        "beam": (1, lim.MAX_BEAM, "hetpar.limits.MAX_BEAM"),
        "improve": (0, lim.MAX_BUDGET, "hetpar.limits.MAX_BUDGET"),
        "iterations": (1, lim.MAX_ITERATIONS, "hetpar.limits.MAX_ITERATIONS"),
        "timesteps": (1, lim.MAX_ITERATIONS, "hetpar.limits.MAX_ITERATIONS"),
        "n_envs": (1, lim.MAX_WORKERS, "hetpar.limits.MAX_WORKERS"),
    }


# Commands whose --out names a file, and those whose --out names a folder.
_OUT_FILE = {"solve", "plan", "calibrate", "suite", "reference"}
_OUT_DIR = {"evaluate", "replan"}


def _check_flags(args: argparse.Namespace) -> None:
    """Every flag within its type's and ``hetpar.limits``' range before any work starts:
    integers within their stated limits, every number finite (``--time-limit`` finite,
    positive and at most MAX_TIME_LIMIT_S), ``--out`` a place that can be written."""
    from hetpar import limits as lim

    bounds = _int_flag_limits()
    for key, value in vars(args).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            lo, hi, why = bounds.get(key, (-lim.MAX_INT, lim.MAX_INT, "int64"))
            if not lo <= value <= hi:
                what = f"at least {lo:,}" if value < lo else f"at most {hi:,} ({why})"
                raise ConfigError(flag, "", f"must be {what}, got {value:,}"
                                  if value.bit_length() < 200 else
                                  f"must be {what}, got an integer of {value.bit_length()} bits")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ConfigError(flag, "", f"must be a finite number, got {value}")
            if key == "time_limit" and not 0 < value <= lim.MAX_TIME_LIMIT_S:
                raise ConfigError(flag, "", f"must be positive and at most "
                                            f"{lim.MAX_TIME_LIMIT_S:g} s, got {value:g}")
            if abs(value) > lim.MAX_NUMBER:
                raise ConfigError(flag, "", f"must be at most {lim.MAX_NUMBER:g} in magnitude, "
                                            f"got {value:g}")
    out = getattr(args, "out", None)
    if isinstance(out, str):
        if args.command in _OUT_DIR:
            _check_out_dir(out)
        elif args.command in _OUT_FILE:
            _check_out_file(out)
    runs_dir = getattr(args, "runs_dir", None)
    if isinstance(runs_dir, str):
        _check_out_dir(runs_dir, "--runs-dir")
    objective = getattr(args, "objective", None)
    if isinstance(objective, str):  # named as the flag the user typed
        from hetpar.costmodel.objective import Objective

        try:
            Objective.parse(objective)
        except ConfigError as exc:
            raise ConfigError("--objective", "", exc.problem) from None


def _check_out_file(out: str, flag: str = "--out") -> None:
    """``out`` can be written as a file: not a folder, its folder exists and is writable."""
    path = Path(out)
    if not out or path.name in ("", ".", "..") or path.is_dir():
        raise ConfigError(out or "''", flag, "is a folder; name a file")
    if path.exists() and not path.is_file():
        raise ConfigError(out, flag, "exists and is not a regular file")
    folder = path.parent
    if not folder.exists():
        raise ConfigError(out, flag, "cannot write: its folder does not exist")
    if not folder.is_dir():
        raise ConfigError(out, flag, f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(out, flag, f"cannot write in {folder} (no permission)")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(out, flag, "exists and cannot be overwritten (no permission)")


def _check_out_dir(out: str, flag: str = "--out") -> None:
    """``out`` is a folder, or one can be made: nothing in its way is a file, and the
    nearest folder that exists is writable."""
    path = Path(out)
    if not out:
        raise ConfigError("''", flag, "names no folder")
    if path.exists():
        if not path.is_dir():
            raise ConfigError(out, flag, "exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(out, flag, "cannot write in it (no permission)")
        return
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(out, flag, f"cannot create it: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(out, flag, f"cannot create it in {ancestor} (no permission)")
    missing = [path, *[p for p in path.parents if not p.exists()]]
    try:  # the one sure test (as root, os.access says yes to /proc)
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(out, flag, f"cannot create it: {exc.strerror or exc}") from None
    finally:  # a refused command leaves no empty folder behind; the command makes it
        for made in missing:
            try:
                made.rmdir()
            except OSError:
                break


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    previous = _sigterm_interrupts()
    try:
        _check_flags(args)
        return int(args.func(args, console))
    except HetparError as exc:
        from hetpar.errors import one_line

        print(f"hetpar: error: {one_line(exc, 1000)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"hetpar: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except BrokenPipeError:
        # The reader went away (``hetpar solve --json | head``): what it read stands, and
        # the interpreter must not fail again flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a process killed by it
    except OSError as exc:
        if exc.filename is None:
            raise
        # A file-system refusal no check foresaw (a path too long, a folder that cannot
        # be made): the path and the reason, on one line.
        from hetpar.errors import one_line

        print(f"hetpar: error: {one_line(exc.filename, 300)}: "
              f"{one_line(exc.strerror or exc, 300)}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's ``KeyboardInterrupt`` would be: every command's
    clean-up (search workers stopped, a training checkpoint saved) runs for both."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def _sigterm_interrupts() -> Any:
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
