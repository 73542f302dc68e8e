"""``hetpar replan``: arguments and command (registered by hetpar/cli/main.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hetpar.errors import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", metavar="FILE|NAME",
                   help="cluster file, bundled name, or a scenario whose cluster to use "
                        "(required with --trace; overrides the scenario's cluster)")
    p.add_argument("--model", metavar="FILE|NAME",
                   help="model file or bundled name (required with --trace; default: the "
                        "scenario's)")
    p.add_argument("--training", metavar="FILE|NAME", help="training file or bundled name")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", metavar="FILE",
                     help="per-link bandwidth trace (CSV: time_s,<a--b>,...; docs/dynamics.md)")
    src.add_argument("--scenario", metavar="NAME|FILE",
                     help="scenario file or bundled name (configs/scenarios/)")
    p.add_argument("--iterations", type=int, metavar="N",
                   help="training iterations to run (default: the scenario's)")
    p.add_argument("--policy", metavar="FILE",
                   help="policy file for the 'policy' strategy, or 'clone' for the bundled "
                        "behaviour clone (default: the shipped policy; skipped with a note "
                        "when none is available)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="load a policy file of format 1 (stable-baselines3's pickled zip, "
                        "as earlier hetpar wrote them), which can run code when loaded; only "
                        "for files you trust ('hetpar policy convert' rewrites one as format 2)")
    p.add_argument("--beam", type=int, default=None, metavar="W",
                   help="beam width of the policy's planning instead of its default, "
                        "the micro-batch sweep over the policy's memory option (1: one "
                        "rollout, decisions about 4x faster: docs/dynamics.md)")
    p.add_argument("--refine-steps", type=int, default=None, metavar="N",
                   help="search steps of each refinement of the policy's plans (default "
                        "150)")
    p.add_argument("--decision-ms", type=float, default=None, metavar="MS",
                   help="wall-clock budget of a policy decision: its refinement stops when "
                        "it is spent (default: none, the refinement's step budget alone; "
                        "a budget makes the plans depend on the machine)")
    p.add_argument("--strategies", default="static,robust,library,policy,exact,exact-rt",
                   help="comma-separated: static, robust, library (switches between "
                        "static's and robust's plans, no planner: the re-planners' "
                        "ablation), policy, exact (re-plans with the exact search, planning "
                        "time not charged), exact-rt (charged as stall)")
    p.add_argument("--switch-rule", default="recent:600", metavar="RULE",
                   help="when every strategy switches plans: 'recent:H' (default "
                        "recent:600: the expected saving over the rest of the run, "
                        "believing the network behaves as it has lately, the past weighted "
                        "with a half-life of H seconds), 'expected' (the same with the "
                        "whole past alike), 'persist' (the new state lasts) or "
                        "'lookahead:S' (the saving over S seconds); docs/dynamics.md")
    p.add_argument("--node-limit", type=int, default=None, metavar="N",
                   help="search steps of each exact (and robust) re-planning search "
                        "(default 20000; the same plans on every machine)")
    p.add_argument("--no-oracle", action="store_true",
                   help="skip the hindsight oracle (the best schedule knowing the future) "
                        "and the regret column")
    p.add_argument("--seeds", default="0", help="comma-separated seeds of the network "
                                                "processes (default 0)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="stop each exact (and robust) re-planning search at this clock time "
                        "instead of --node-limit (the plans then depend on the machine)")
    p.add_argument("--lookahead", type=float, default=None, metavar="S",
                   help="same as --switch-rule lookahead:S")
    p.add_argument("--storage-gbps", type=float, default=None, metavar="GB/s",
                   help="checkpoint storage bandwidth in GB/s (default: the scenario's, 2)")
    p.add_argument("--restart-s", type=float, default=None, metavar="S",
                   help="restart constant of a migration (default: the scenario's, 30)")
    p.add_argument("--checkpoint-interval", type=float, default=None, metavar="S",
                   help="seconds between checkpoints; a failure loses the work since the "
                        "last (default: the scenario's, 3600)")
    p.add_argument("--out", default="runs/replan", metavar="DIR",
                   help="output folder: summary.json, summary.md, timeline.png "
                        "(default runs/replan)")
    p.add_argument("--json", action="store_true",
                   help="print summary.json's contents as one JSON object instead of the "
                        "summary, without the measured planning seconds (planning_wall_s, "
                        "policy_latency_s, exact_latency_s) unless --timings: the same bytes "
                        "on every run and every machine (searches stop after node budgets, "
                        "planning is charged a modelled time), unless --time-limit or "
                        "--decision-ms put a clock in them")
    p.add_argument("--timings", action="store_true",
                   help="with --json, also print the measured planning seconds")


def _positive(flag: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ConfigError(flag, "", f"must be positive, got {value:g}")


def _cluster(name: str) -> Any:
    """A cluster file or bundled cluster, else the cluster of a scenario (file or name)."""
    from hetpar.cluster.topology import load_cluster
    from hetpar.dynamics.scenario import list_scenarios, load_scenario

    try:
        return load_cluster(name)
    except ConfigError:
        if name in list_scenarios() or (Path(name).suffix in (".yaml", ".yml")
                                        and Path(name).exists()):
            try:
                return load_scenario(name).cluster
            except ConfigError:
                pass
        raise


def run(args: argparse.Namespace, log: Any) -> int:
    import dataclasses

    from hetpar.dynamics.experiment import parse_strategies, run_scenario, write_outputs
    from hetpar.dynamics.scenario import load_scenario, scenario_from_trace

    if getattr(args, "json", False):  # stdout holds the JSON alone; progress to stderr
        import sys

        def log(line: str) -> None:  # noqa: F811 - replaces the console's
            print(line, file=sys.stderr)

    strategies = parse_strategies(args.strategies)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ConfigError("--seeds", "", f"expected comma-separated integers, got "
                                         f"{args.seeds!r}") from None
    if not seeds:
        raise ConfigError("--seeds", "", "names no seed")
    from hetpar.limits import MAX_SEED

    bad = [s for s in seeds if not 0 <= s <= MAX_SEED]
    if bad:
        raise ConfigError("--seeds", "", f"seeds must be 0 to {MAX_SEED}, got {bad[0]}")
    if len(seeds) > 1000:
        raise ConfigError("--seeds", "", f"names {len(seeds):,} seeds, more than 1,000")
    if args.iterations is not None and args.iterations < 1:
        raise ConfigError("--iterations", "", f"must be at least 1, got {args.iterations}")
    for flag, value in (("--time-limit", args.time_limit), ("--lookahead", args.lookahead),
                        ("--storage-gbps", args.storage_gbps),
                        ("--checkpoint-interval", args.checkpoint_interval)):
        _positive(flag, value)
    from hetpar.dynamics.switching import parse_rule

    rule = parse_rule(f"lookahead:{args.lookahead:g}" if args.lookahead is not None
                      else args.switch_rule)
    if args.node_limit is not None and args.node_limit < 1:
        raise ConfigError("--node-limit", "", f"must be at least 1, got {args.node_limit}")
    for flag, count in (("--beam", args.beam), ("--refine-steps", args.refine_steps)):
        if count is not None and count < 1:
            raise ConfigError(flag, "", f"must be at least 1, got {count}")
    if args.decision_ms is not None and not args.decision_ms >= 0:
        raise ConfigError("--decision-ms", "", f"must not be negative, got {args.decision_ms:g}")
    if args.restart_s is not None and args.restart_s < 0:
        raise ConfigError("--restart-s", "", f"must not be negative, got {args.restart_s:g}")
    cluster = _cluster(args.cluster) if args.cluster else None
    if args.trace:
        if cluster is None or not args.model:
            raise ConfigError("--trace", "", "needs --cluster and --model")
        if args.iterations is None:
            raise ConfigError("--trace", "", "needs --iterations")
        scenario = scenario_from_trace(args.trace, cluster, args.model, args.training,
                                       args.iterations)
    else:
        scenario = load_scenario(args.scenario, cluster=cluster)
    changes: dict[str, Any] = {}
    if args.model:
        changes["model"] = args.model
    if args.training:
        changes["training"] = args.training
    mig = scenario.migration
    if (args.storage_gbps is not None or args.restart_s is not None
            or args.checkpoint_interval is not None):
        changes["migration"] = dataclasses.replace(
            mig, storage_GBps=args.storage_gbps or mig.storage_GBps,
            restart_s=mig.restart_s if args.restart_s is None else args.restart_s,
            checkpoint_interval_s=args.checkpoint_interval or mig.checkpoint_interval_s)
    if changes:
        scenario = dataclasses.replace(scenario, **changes)
    result = run_scenario(scenario, strategies, seeds, policy_path=args.policy,
                          trust_pickle=args.trust_pickle,
                          iterations=args.iterations, time_limit_s=args.time_limit,
                          rule=rule, beam=args.beam, refine_steps=args.refine_steps,
                          node_limit=args.node_limit, oracle=not args.no_oracle,
                          decision_budget_s=(None if not args.decision_ms else
                                             args.decision_ms / 1e3), log=log)
    paths = write_outputs(result, Path(args.out))
    if getattr(args, "json", False):
        from hetpar.dynamics.experiment import MEASURED_KEYS, summary_doc
        from hetpar.problem.solution import strict_json, without_timings

        doc = summary_doc(result)
        print(strict_json(doc if args.timings else without_timings(doc, MEASURED_KEYS)))
        return 0
    log((paths[1]).read_text())
    log("wrote " + ", ".join(str(p) for p in paths))
    return 0
