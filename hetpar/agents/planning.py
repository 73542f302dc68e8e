"""One planner contract: ``plan(problem, method, ...)`` reaches every planning method and
returns a ``Solution``.

Methods (``METHODS``):

* ``exact``, ``brute``, ``metis``, ``megatron``, ``random``: the solvers
  (``hetpar.solvers.solve``; options ``workers``, ``time_limit``, ``budget``,
  ``rng_seed``, ``progress``, ``executor``, ``certify``; ``exact`` also ``starts``,
  plans that seed its incumbent, and ``policy_start``). Where a policy is available
  (torch installed; ``policy=`` or the shipped one), ``exact`` first plans with the
  ``policy`` method and passes that plan as a start, so its answer is never worse than
  the policy's (``found_by`` ``policy`` when it stands); ``policy_start=False`` skips
  it. Under ``time_limit`` the policy plans within a quarter of the limit (loading it
  aside) and the search gets what is left of the limit;
* ``local-search``: the structure local search (``improve_structure``) from the
  Metis-style plan (options ``max_evaluations``, ``neighbour_steps``, ``time_limit``);
* ``policy``, ``policy-beam``, ``policy-greedy``, ``policy-raw``: a trained policy
  (``hetpar.agents.planner.plan_with_policy``; ``policy=`` a loaded bundle or a policy
  file, None for the shipped one). Each name presets the planner's settings
  (``policy_presets``): ``policy`` is ``hetpar plan``'s default (the sweep: the most
  likely rollout for each memory option (recompute mode, ZeRO stage) and each
  micro-batch count the masks then allow, their refinement, then the structure search
  from the best), ``policy-beam`` the same from a beam search instead of the sweep,
  ``policy-greedy`` the refined sweep without the structure search and ``policy-raw``
  the single most likely rollout alone. Options (``beam``, ``refine``, ``micro_sweep``,
  ``sweep_memory``, ``refine_steps``, ``improve_evaluations``, ``cache``, ``incumbent``,
  ``budget_s``, ...) override them; a ``beam`` given (1: the single most likely rollout) turns the sweep
  off unless ``micro_sweep`` is also given.
  On a cluster of more hosts than the policy observes (its ``max_hosts``) the policy
  plans replica slices (``hetpar.agents.sliced``; option ``slice_sizes``, the most hosts
  of each slice tried).

Every method scores its plan by the same ``Problem`` (objective parsed once, bandwidth
draws of its seed), so their values compare exactly, and every ``Solution`` names the
part of the method that found the plan (``found_by``) and the time of each part
(``timings``). This module does not import torch: the policy methods do, when called
(the ``rl`` extra is optional).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from hetpar.errors import ConfigError
from hetpar.plan import Plan
from hetpar.problem import Problem, Solution

__all__ = ["METHODS", "POLICY_METHODS", "SOLVER_METHODS", "plan", "policy_presets"]

SOLVER_METHODS = ("exact", "brute", "metis", "megatron", "random")
POLICY_METHODS = ("policy", "policy-beam", "policy-greedy", "policy-raw")
METHODS = (*SOLVER_METHODS, "local-search", *POLICY_METHODS)

# The options each kind of method takes (anything else is a caller's mistake).
_SOLVER_OPTIONS = frozenset({"workers", "time_limit", "budget", "rng_seed", "progress",
                             "executor", "certify", "runtime", "node_limit"})
_EXACT_OPTIONS = _SOLVER_OPTIONS | {"starts", "policy_start"}
# Share of exact's time limit the policy start may plan for. ``policy`` rather than the
# cheaper ``policy-greedy``: on the bundled clusters x six models the greedy plan beat
# the better baseline on 5 of 54, the full planner's on 18 (docs/solvers.md).
POLICY_START_SHARE = 0.25
_LOCAL_SEARCH_OPTIONS = frozenset({"max_evaluations", "neighbour_steps", "time_limit"})
_POLICY_OPTIONS = frozenset({"beam", "refine", "refine_steps", "refine_time",
                             "refine_candidates", "improve_evaluations", "threads", "source",
                             "cache", "incumbent", "budget_s", "speculate", "instance",
                             "slice_sizes", "runtime", "micro_sweep", "sweep_memory"})


def policy_presets() -> dict[str, dict[str, Any]]:
    """What each policy method sets (``beam``, ``refine``, ``improve_evaluations``).

    A function, not a constant: the defaults live with the policy planner and the
    local search, which this module does not import until a policy method is asked."""
    from hetpar.agents.planner import DEFAULT_BEAM, WIDE_BEAM
    from hetpar.solvers.local_search import DEFAULT_EVALUATIONS

    # The refined methods sweep the memory option and the micro-batch count
    # (``planner._micro_sweep``): on the 100 held-out instances it took the refined
    # rollout's p90 gap from 121% to 10.0% (docs/agents.md, "The sweep"). ``policy-raw``
    # stays the network's own single rollout, what the training is measured by.
    return {"policy": {"beam": DEFAULT_BEAM, "refine": True, "micro_sweep": True,
                       "improve_evaluations": DEFAULT_EVALUATIONS},
            "policy-beam": {"beam": WIDE_BEAM, "refine": True, "micro_sweep": False,
                            "improve_evaluations": DEFAULT_EVALUATIONS},
            "policy-greedy": {"beam": 1, "refine": True, "micro_sweep": True,
                              "improve_evaluations": 0},
            "policy-raw": {"beam": 1, "refine": False, "micro_sweep": False,
                           "improve_evaluations": 0}}


def plan(problem: Problem, method: str, *, policy: Any = None, **options: Any) -> Solution:
    """Plan ``problem`` with ``method`` (one of ``METHODS``); see the module docstring for
    each method's options. ``policy`` (policy methods only): a loaded ``PolicyBundle``,
    a policy file, or None for the policy shipped with hetpar.

    Raises ConfigError for an unknown method or an option the method does not take,
    InfeasibleError when no plan fits, and ConfigError naming the ``rl`` extra when a
    policy method is asked without torch installed."""
    if method not in METHODS:
        raise ConfigError("", "method", f"unknown method {method!r} "
                                        f"(known: {', '.join(METHODS)})")
    allowed = (_EXACT_OPTIONS if method == "exact" else
               _SOLVER_OPTIONS if method in SOLVER_METHODS else
               _LOCAL_SEARCH_OPTIONS if method == "local-search" else _POLICY_OPTIONS)
    extra = sorted(set(options) - allowed)
    if extra:
        raise ConfigError("", "options", f"{', '.join(extra)}: not an option of method "
                                         f"{method!r} (it takes {', '.join(sorted(allowed))})")
    if method == "exact":
        return _exact(problem, policy, **options)
    if method in SOLVER_METHODS:
        from hetpar.solvers.api import solve

        return solve(problem, method, **options)
    if method == "local-search":
        return _local_search(problem, **options)
    return _policy(problem, method, policy, options)


def _exact(problem: Problem, policy: Any, *, policy_start: bool = True, starts: Any = (),
           time_limit: float | None = None, **options: Any) -> Solution:
    """The exact search, its incumbent seeded by the policy's plan where one is available
    (the search never answers worse than any seed)."""
    from hetpar.solvers.api import solve

    start = time.perf_counter()
    starts = tuple(starts)
    seed, note = _policy_start(problem, policy, time_limit) if policy_start else (None, "")
    policy_s = time.perf_counter() - start
    if seed is not None and seed.plan is not None:
        starts += (("policy", seed.plan),)
    left = time_limit
    if time_limit is not None:
        # The limit covers the policy too; the search keeps a tenth of it at least (its
        # seeds, run whatever the limit, already make its answer no worse than theirs).
        left = max(time_limit - policy_s, 0.1 * time_limit)
    sol = solve(problem, "exact", starts=starts, time_limit=left, **options)
    if not policy_start:
        return sol
    # The policy's value is among the starts (``details["starts"]``); a skip says why.
    details = {**sol.details, **({"policy_start": note} if note else {})}
    return replace(sol, wall_s=time.perf_counter() - start, details=details,
                   timings={"policy": policy_s, **sol.timings})


def _policy_start(problem: Problem, policy: Any,
                  time_limit: float | None) -> tuple[Solution | None, str]:
    """The ``policy`` method's plan of ``problem`` as a start for the exact search, or
    None and why not: torch is not installed, the shipped policy is not, the model is
    larger than the policy handles, a cluster larger than it observes cannot be cut into
    replica slices, or it found no plan. A policy the caller names must load (its
    ConfigError stands)."""
    if not _has_torch():
        return None, "skipped: torch is not installed (the rl extra)"
    from hetpar.agents.io import check_compatible, default_policy_path
    from hetpar.errors import InfeasibleError

    if policy is None and not default_policy_path().exists():
        return None, "skipped: no policy is installed"
    bundle = _bundle(policy)
    try:
        # More hosts than the policy observes are planned as replica slices (``_policy``).
        check_compatible(bundle, None, model_layers=problem.model.layers,
                         source=problem.name or problem.cluster.name)
    except ConfigError as exc:
        return None, f"skipped: {exc.problem}"
    settings: dict[str, Any] = {}
    if time_limit is not None:
        # Planning is bounded, loading is not (once per process, seconds with torch's
        # import): a share counted from after the load plans even under short limits.
        settings["budget_s"] = POLICY_START_SHARE * time_limit
    try:
        return _policy(problem, "policy", bundle, settings), ""
    except (InfeasibleError, ConfigError) as exc:  # ConfigError: no replica slice fits
        return None, f"skipped: {exc.problem if isinstance(exc, ConfigError) else exc}"


def _local_search(problem: Problem, *, max_evaluations: int | None = None,
                  neighbour_steps: int = 150, time_limit: float | None = None) -> Solution:
    """The structure local search from the Metis-style plan (which lies in the space)."""
    from hetpar.solvers.api import solve
    from hetpar.solvers.local_search import DEFAULT_EVALUATIONS, improve_structure

    start = time.perf_counter()
    seed = solve(problem, "metis")
    if not seed.found or seed.plan is None:
        return replace(seed, method="local-search", wall_s=time.perf_counter() - start)
    budget = DEFAULT_EVALUATIONS if max_evaluations is None else max_evaluations
    imp = improve_structure(problem.cost_model, problem.space, problem.objective, seed.plan,
                            max_evaluations=budget, neighbour_steps=neighbour_steps,
                            time_limit=time_limit)
    improved = imp.value < seed.value
    plan_: Plan = imp.plan if improved else seed.plan
    value = imp.value if improved else seed.value
    details = {"start_value": seed.value, "moves": imp.moves, "neighbours": imp.neighbours,
               "steps": imp.steps, "max_evaluations": budget}
    return Solution("local-search", problem.objective.name, plan_,
                    problem.estimate(plan_) if improved else seed.estimate, value,
                    time.perf_counter() - start,
                    evaluations=seed.evaluations + imp.evaluations,
                    details=details, found_by="improve" if improved else "metis",
                    timings={"metis": seed.wall_s, "improve": imp.wall_s},
                    inputs=problem.describe())


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401  (the policy planner's dependency, optional)
    except ImportError:
        return False
    return True


def _bundle(policy: Any) -> Any:
    """A loaded policy: ``policy`` itself when it is one, else the file it names (None:
    the shipped one)."""
    if hasattr(policy, "env_kwargs"):
        return policy
    from hetpar.agents.io import load_policy

    return load_policy(policy)


def _policy(problem: Problem, method: str, policy: Any, options: dict[str, Any]) -> Solution:
    if not _has_torch():
        raise ConfigError("", "method", "the policy methods need the 'rl' extra "
                                        "(pip install 'hetpar[rl]'): torch is not installed")
    # Through the module, not a bound name: tests and tools may wrap the planner.
    from hetpar.agents import planner

    settings = {**policy_presets()[method], **options}
    if "beam" in options and "micro_sweep" not in options:
        # A beam asked for, 1 (the single most likely rollout) included, replaces the sweep.
        settings["micro_sweep"] = False
    bundle = _bundle(policy)
    sizes = settings.pop("slice_sizes", None)
    if len(problem.cluster.hosts) > bundle.max_hosts:
        # More hosts than the policy observes: it plans replica slices (agents/sliced.py).
        from hetpar.agents.sliced import SLICE_SIZES, plan_on_slices

        if "micro_sweep" not in options:
            # One rollout per slice unless asked: on test-xl the sweep took the median
            # planning time from 0.31 to 1.2 s (1.4 s on 2,025 hosts, where the target is
            # 1 s) and, the slices being ranked by their own value, its expanded plan was
            # worse than one rollout's on 3 of 20 (docs/agents.md, "Clusters larger than
            # the policy").
            settings["micro_sweep"] = False

        return plan_on_slices(bundle, problem, method=method,
                              sizes=tuple(sizes or SLICE_SIZES), **settings)
    return planner.plan_with_policy(bundle, problem, method=method, **settings)
