"""``hetpar.solvers.solve``: one entry point for every search method."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.errors import ConfigError, InfeasibleError
from hetpar.plan import Plan
from hetpar.solvers.bounds import Bounds
from hetpar.solvers.exact import (
    LIST_STAGES,
    SEEDS,
    Counters,
    InlineExecutor,
    LocalIncumbent,
    SearchProblem,
    Searcher,
    SearchExecutor,
    Task,
    TaskResult,
    dive,
    estimate_space_size,
    few_collections,
    first_stage_tasks,
    make_bounds,
    prefix_lower_bound,
    root_lower_bound,
    root_tasks,
    search_subtree,
    split_task,
)
from hetpar.problem import Certificate, Problem, Solution
from hetpar.problem.space import PlanSpace, StageChoice
from hetpar.runtime.rules import check_plan, get_runtime

__all__ = ["solve", "METHODS", "Progress", "Start"]

METHODS = ("exact", "brute", "megatron", "metis", "random")

# A start plan for the exact search: a plan (credited to "start" when it stands), or a
# (part, plan) pair naming the part that made it (e.g. ("policy", plan)).
Start = Plan | tuple[str, Plan]

# A plan known before the search, as the search holds it: (value, plan, found_by).
_Seed = tuple[float, Plan | None, str]
_NO_SEED: _Seed = (math.inf, None, "")
# The baselines exact runs as seeds. Of plans of equal value, theirs keep the credit: a
# start is named only when it beats what the cheap heuristics found.
_BASELINES = ("metis", "megatron")


@dataclass(frozen=True)
class Progress:
    """A snapshot of a running exact search, for live displays."""

    tasks_done: int
    tasks: int
    nodes: int
    incumbent: float
    elapsed_s: float


def solve(problem: Problem, method: str = "exact", *, workers: int = 1,
          time_limit: float | None = None, budget: int = 200, rng_seed: int | None = None,
          progress: Callable[[Progress], None] | None = None,
          executor: SearchExecutor | None = None, certify: bool = True,
          starts: Iterable[Start] = (), runtime: str = "any",
          node_limit: int | None = None) -> Solution:
    """Find a plan of ``problem`` with ``method``.

    ``exact`` proves optimality over the plan space (``time_limit`` makes it anytime);
    ``brute`` enumerates the space (tiny instances only); ``megatron``, ``metis`` and
    ``random`` (``budget`` plans drawn with ``rng_seed``, the problem's seed by default)
    are the baselines. Raises InfeasibleError when no plan of the space fits.

    ``exact`` never answers worse than a baseline it could run: the Metis-style and the
    Megatron-style plans seed its incumbent, and so do ``starts`` (exact only): plans
    valid for the problem's cluster, model and training spec (PlanError otherwise), in
    the plan space or not. A plan outside the space prunes like any other, since the
    answer is the best of the seeds and the search: ``found_by`` then names the seed
    (``metis``, ``megatron``, ``start`` or the pair's part, e.g. ``policy``), else
    ``dive`` or ``search``. Of plans of equal value the first in this order keeps the
    credit: metis, megatron, the starts in their order, the dive, the search.

    ``certify=False`` (exact only) makes ``time_limit`` a hard deadline for a caller that
    must decide in time (the re-planner): the same branch and bound with the same seeds
    (metis, megatron, the starts), in this process, its subtrees in their natural order
    (no dive, no ranking) and, when stopped, no lower-bound bisection (the certificate's
    bound is then the compute floor). Those steps can run minutes past the limit on
    16-GPU clusters. ``node_limit`` (with ``certify=False``) also stops it after that
    many search steps (one per node): a budget that, unlike a time limit, gives the same
    answer on every machine (the re-planning simulator's searches).

    ``runtime`` (``hetpar.runtime.rules``): the framework the plan must run on. ``exact``
    then searches only the plans it can run (its seeds and starts included: one it cannot
    run is dropped), and its bound, which holds over the whole space, holds over them;
    another method's plan that the runtime cannot run is refused (InfeasibleError naming
    the rule it breaks).
    """
    starts = tuple(starts)
    if method not in METHODS:
        raise ConfigError("", "method", f"unknown method {method!r} (known: {', '.join(METHODS)})")
    if workers < 1:
        raise ConfigError("", "workers", f"must be at least 1, got {workers}")
    if not certify and (method != "exact" or workers != 1 or executor is not None):
        raise ConfigError("", "certify", "certify=False is an option of the exact search "
                                         "in this process (method exact, one worker)")
    if node_limit is not None and certify:
        raise ConfigError("", "node_limit", "node_limit is an option of certify=False")
    if node_limit is not None and node_limit < 1:
        raise ConfigError("", "node_limit", f"must be at least 1, got {node_limit}")
    if starts and method != "exact":
        raise ConfigError("", "starts", f"start plans seed the exact search only, not "
                                        f"method {method!r}")
    rt = get_runtime(runtime)
    start = time.perf_counter()
    problem.check_fits_somewhere()
    cm, space, obj = problem.cost_model, problem.space, problem.objective
    if method == "brute":
        from hetpar.limits import MAX_BRUTE_SPACE
        from hetpar.solvers.brute import brute, count_plans
        if count_plans(space, MAX_BRUTE_SPACE) is None:
            raise ConfigError("", "method", f"brute: the plan space holds more than "
                                            f"{MAX_BRUTE_SPACE:,} plans, the most brute force "
                                            f"may enumerate (hetpar.limits.MAX_BRUTE_SPACE); "
                                            f"use exact")
        sol = brute(cm, space, obj)
    elif method in ("megatron", "metis", "random"):
        from hetpar.solvers import baselines
        fn = getattr(baselines, method)
        kwargs: dict[str, Any] = {"seed": problem.seed if rng_seed is None else rng_seed}
        if method == "random":
            kwargs["budget"] = budget
        if method == "megatron":
            kwargs["runtime"] = rt.name  # the layouts the framework runs
        sol = fn(cm, space, obj, **kwargs)
    else:
        t0 = time.perf_counter()
        seeds = [sd for sd in _score_starts(problem, starts)
                 if rt.unrestricted or (sd[1] is not None and not check_plan(sd[1], rt))]
        sol = _exact(cm, space, obj, workers, time_limit, progress, executor, certify, seeds,
                     time.perf_counter() - t0, rt.name, node_limit)
    if sol.plan is not None and sol.found and not rt.unrestricted:
        why = check_plan(sol.plan, rt)
        if why:
            raise InfeasibleError(f"{method}: its plan cannot run on {rt.name}: {why[0]} "
                                  f"(method exact searches the plans {rt.name} can run)")
    # wall_s counts the problem's setup (cost model, space, the fit check) too.
    return replace(sol, found_by=sol.found_by or (method if sol.found else ""),
                   # A framework's runtime is part of what was asked (any is the default).
                   inputs={**problem.describe(),
                           **({} if rt.unrestricted else {"runtime": rt.name})},
                   wall_s=time.perf_counter() - start,
                   timings=sol.timings or {"search": sol.wall_s})


# Halvings of each first stage's bound when ranking the subtrees: the order only needs
# it roughly, and every target tried builds bound tables the search never asks for
# (docs/history/solvers-rounds.md has the measurements behind these choices).
RANK_STEPS = 3


def _taken(task: Task) -> int:
    """GPUs the task's prefix takes: the fewer, the more left free below it (the same
    order as the free GPUs' sum, without building each task's free tuple: hundreds of
    thousands of first stages on a large cluster)."""
    return sum(st.gpus for st in task.prefix)


def report_grace(time_limit: float | None) -> float:
    """How far past its time limit a stopped exact search may run to bound the optimum
    from below (a tenth of the limit, 2 to 5 s): the limit's promise is the limit plus
    this grace."""
    return min(max(0.1 * time_limit, 2.0), 5.0) if time_limit else math.inf


def answer_grace(time_limit: float | None) -> float:
    """How far past ``time_limit`` an exact search may answer: the lower bound's grace
    (``report_grace``) and one second for the rest (closing the worker pool, the final
    report). ``benchmarks/time_limits.py`` measures the promise."""
    return report_grace(time_limit) + 1.0


# With a lazy first level (``LIST_STAGES``), one worker ranks its stages by bound in
# windows of this many, best first within each.
RANK_WINDOW = 4096


def _compute_floor(cm: CostModel) -> float:
    """A bound no plan beats: the model's FLOPs at every GPU's matmul rate at once (each
    GPU computes its share no faster, whatever the network), for when the search's own
    bounds ran out of time."""
    rate = sum(h.num_gpus * perf.flops for i, h in enumerate(cm.cluster.hosts)
               if (perf := cm.host_perf(i)) is not None)
    return cm.model_flops_per_iter / rate if rate > 0 else 0.0


def _score_starts(problem: Problem, starts: tuple[Start, ...]) -> list[_Seed]:
    """The start plans as seeds, each checked against the problem's cluster, model and
    training spec (PlanError naming it) and scored by the problem."""
    seeds: list[_Seed] = []
    for i, item in enumerate(starts):
        by, plan = item if isinstance(item, tuple) else ("start", item)
        if not isinstance(plan, Plan):
            raise ConfigError("", f"starts[{i}]", f"not a plan: {type(plan).__name__}")
        # The report validates the plan; its value is the problem's (one evaluation).
        est = problem.estimate(plan, source=f"start plan {i + 1} ({by})")
        seeds.append((est.value(problem.objective), plan, by))
    return seeds


def _best_seed(seeds: Iterable[_Seed]) -> _Seed:
    """The least value; of equal ones the first (it keeps the credit)."""
    best = _NO_SEED
    for seed in seeds:
        if seed[1] is not None and seed[0] < best[0]:
            best = seed
    return best


def _baseline_seeds(cm: CostModel, space: PlanSpace, obj: Objective,
                    timings: dict[str, float], runtime: str = "any",
                    deadline: float = math.inf) -> list[_Seed]:
    """The Metis-style and Megatron-style plans as seeds, each part's seconds in
    ``timings``, each stopped at ``deadline`` with its best plan so far. Megatron's may
    lie outside the space: a stage may mix GPU types."""
    from hetpar.solvers import baselines

    out: list[_Seed] = []
    for name in _BASELINES:
        t0 = time.perf_counter()
        sol = getattr(baselines, name)(cm, space, obj, deadline=deadline,
                                       **({"runtime": runtime} if name == "megatron" else {}))
        timings[name] = time.perf_counter() - t0
        usable = sol.found and (runtime == "any" or not check_plan(sol.plan, runtime))
        out.append((sol.value, sol.plan, name) if usable else _NO_SEED)
    return out


def _exact(cm: CostModel, space: PlanSpace, obj: Objective, workers: int,
           time_limit: float | None, progress: Callable[[Progress], None] | None,
           executor: SearchExecutor | None, certify: bool = True,
           starts: list[_Seed] | None = None, starts_s: float = 0.0,
           runtime: str = "any", node_limit: int | None = None) -> Solution:
    timings = {"starts": starts_s} if starts else {}
    with few_collections():
        return _exact_search(cm, space, obj, workers, time_limit, progress, executor,
                             certify, starts or [], timings, runtime, node_limit)


def _exact_search(cm: CostModel, space: PlanSpace, obj: Objective, workers: int,
                  time_limit: float | None, progress: Callable[[Progress], None] | None,
                  executor: SearchExecutor | None, certify: bool, starts: list[_Seed],
                  timings: dict[str, float], runtime: str = "any",
                  node_limit: int | None = None) -> Solution:
    start = time.perf_counter()
    if not certify:
        return _deadline_search(cm, space, obj, time_limit, starts, timings, runtime,
                                node_limit)
    deadline = time.time() + time_limit if time_limit else math.inf
    # The baselines' seeds get the limit, or the bound's grace where that is longer (a
    # limit of a fraction of a second still answers no worse than them on small clusters).
    seeds_until = (max(deadline, time.time() + report_grace(time_limit)) if time_limit
                   else math.inf)
    # The first level is listed, ranked and sorted where it is small enough; else its
    # stages are taken lazily, in order of their GPU count (``LIST_STAGES``).
    first_level = space.count_stage_choices(space.capacity)
    lazy = first_level > LIST_STAGES
    cut: list[bool] = []  # set when a lazy first level stops at the deadline
    # A good first incumbent prunes from the first node on: the start plans', the
    # Metis-style heuristic's (which lies in the space) and the Megatron-style one's,
    # whichever is best (the answer is never worse than any of them).
    # A dive over a few deep-pipeline structures with a local search over them: an
    # incumbent near the optimum before the exhaustive search prunes far more than the
    # heuristic's plan; a tenth of the time limit at most, from its start.
    dive_budget = 0.1 * time_limit if time_limit else 30.0
    seed_value, seed_plan, seed_source = _best_seed(starts)
    if workers == 1:
        seed_value, seed_plan, seed_source = _best_seed(
            [*_baseline_seeds(cm, space, obj, timings, runtime, seeds_until),
             (seed_value, seed_plan, seed_source)])
        t0 = time.perf_counter()
        dive_value, dive_plan = dive(SearchProblem(cm, space, obj, deadline, seed_value,
                                                   runtime),
                                     time.time() + dive_budget, seed_value)
        timings["dive"] = time.perf_counter() - t0
        if dive_plan is not None and dive_value < seed_value:
            seed_value, seed_plan, seed_source = dive_value, dive_plan, "dive"
    problem = SearchProblem(cm, space, obj, deadline, seed_value, runtime, seeds_until)
    # One task per first stage, also with several workers: each worker builds its own
    # bound tables, and subtrees below one first stage share most of them (tasks below
    # the first two stages made two workers build the same tables twice over).
    # root_tasks(depth=2) stays available.
    order_bounds: Bounds | None = None  # with one worker, the ranking's tables serve the search
    rank: dict[StageChoice, float] = {}
    listed: list[Task] = []  # the subtree tasks, where the first level is listed
    subtrees: Iterable[Task]
    seed_tasks: list[Task] = []
    if workers == 1:
        order_bounds = make_bounds(problem)
        # Most promising subtrees first (least bound of their first stage): good plans
        # found early prune the rest. Ties (the bounds are coarse) go to the larger
        # subtree, where the best plans tend to lie: on amp-het-16 the optimum starts
        # with one V100 alone.
        ranker = Searcher(problem, LocalIncumbent(seed_value), order_bounds)
        # Ranking must not eat the time limit: past a quarter of it, the rest keep their
        # order.
        rank_until = start + 0.25 * time_limit if time_limit else math.inf

        def ranked(chunk: list[Task]) -> list[Task]:
            for t in chunk:
                if time.perf_counter() < rank_until:
                    rank[t.prefix[0]] = prefix_lower_bound(
                        order_bounds, ranker.combos, t.prefix[:1],
                        space.take(space.capacity, t.prefix[0]), seed_value,
                        steps=RANK_STEPS, until=rank_until)
            return sorted(chunk, key=lambda t: (rank.get(t.prefix[0], math.inf), _taken(t)))

        if lazy:
            # Best bound first within windows of RANK_WINDOW stages, largest first.
            stream = first_stage_tasks(space, until=deadline, cut=cut)
            subtrees = (t for chunk in iter(lambda: list(itertools.islice(stream, RANK_WINDOW)), [])
                        for t in ranked(chunk))
        else:
            subtrees = listed = ranked(root_tasks(problem, depth=1))
    else:
        # Several workers finish together only if the largest subtrees start first: the
        # first stages that leave the most GPUs free root the largest ones (started late,
        # one such subtree ends long after every other). Ranking them would cost the
        # workers' time in this one process; a subtree a bound prunes at its root costs a
        # worker as little. The largest is split one stage deeper into one part per
        # worker, each part the subtrees of every n-th GPU count of the next stage: a
        # worker's subtrees then share its bound tables (one task per subtree spread
        # siblings over the workers, and each rebuilt the tables the other had built).
        firsts = first_stage_tasks(space, largest_first=False, until=deadline,
                                   cut=cut) if lazy else iter(
            sorted(root_tasks(problem, depth=1), key=_taken))
        head = next(firsts, None)
        subtrees = itertools.chain(
            split_task(problem, head, parts=workers) if head is not None else [], firsts)
        if not lazy:
            subtrees = listed = list(subtrees)
        # The seeds run on the workers too, first: a worker starts on the subtrees once
        # its seed is done (the incumbent it leaves prunes them), and the dive offers each
        # plan it finds at once (run before the pool, they kept every worker idle).
        seed_tasks = [Task((), seed="metis"), Task((), seed="megatron"),
                      Task((), seed="dive", until=time.time() + dive_budget)]
    # Every task the executor takes, in its order (on_result's index).
    tasks: list[Task] = []
    exhausted = False

    def taken() -> Iterator[Task]:
        nonlocal exhausted
        for t in itertools.chain(seed_tasks, subtrees):
            tasks.append(t)
            yield t
        exhausted = not cut  # a lazy first level cut at the deadline was not exhausted

    if executor is None:
        if workers > 1:
            from hetpar.solvers.parallel import ProcessExecutor
            executor = ProcessExecutor(workers)
        else:
            executor = InlineExecutor()
    results: dict[int, TaskResult] = {}
    counters = Counters()
    # Which part found the best plan: a start, a seed ("metis", "megatron", "dive") or
    # the exhaustive search.
    best = (seed_value, seed_plan, seed_source)
    # Whether ``best`` is a start plan that a baseline's seed task may tie and take the
    # credit from (on one worker the baselines ran already).
    start_held = workers > 1 and seed_plan is not None
    # The parts run here before the search (the starts were scored before ``start``).
    caller_s = sum(v for k, v in timings.items() if k != "starts")
    # The progress counts subtrees, not seeds; a lazy first level counts its stages, of
    # which the search visits only the canonical ones.
    subtree_count = len(listed) if not lazy else first_level
    subtrees_done = 0

    def on_result(i: int, res: TaskResult) -> None:
        nonlocal best, subtrees_done, start_held
        results[i] = res
        subtrees_done += not tasks[i].seed
        counters.add(res.counters)
        if tasks[i].seed:
            timings[tasks[i].seed] = res.wall_s
        if res.plan is not None and (res.value < best[0] or (
                res.value == best[0] and start_held and tasks[i].seed in _BASELINES)):
            best = (res.value, res.plan, tasks[i].seed or "search")
            start_held = False
        if progress is not None:
            progress(Progress(subtrees_done, subtree_count, counters.nodes,
                              min(best[0], executor.incumbent()),
                              time.perf_counter() - start))

    stopped = ""
    try:
        executor.run(problem, taken(), on_result, order_bounds)
    except KeyboardInterrupt:
        stopped = "interrupted"
    if not stopped:
        # The baselines' plans are part of the answer whatever the executor did with their
        # tasks (e.g. cancelled at the deadline before a worker took them).
        ran = {tasks[i].seed for i in results}
        # Run now, past the deadline, they stop where the workers' would have.
        late = dataclasses.replace(problem, seeds_until=max(
            problem.seeds_until, time.time() + 0.5 * report_grace(time_limit)))
        for task in seed_tasks:
            if task.seed in _BASELINES and task.seed not in ran:
                tasks.append(task)
                on_result(len(tasks) - 1, search_subtree(late, task, LocalIncumbent()))
    # Subtrees never taken: the rest of a listed first level, or of a lazy one (then
    # unknown, and bounded by the root bound alone).
    untaken = listed[sum(1 for t in tasks if not t.seed):] if not lazy else []
    if not stopped and (not exhausted or untaken or len(results) < len(tasks)
                        or not all(r.finished for r in results.values())):
        stopped = "time limit"
    value, plan, found_by = best
    wall = time.perf_counter() - start
    if stopped:
        # Unfinished subtrees bound the optimum from below; finished ones are resolved.
        bounds = make_bounds(problem)
        probe = Searcher(problem, LocalIncumbent(value), bounds)
        # The bound of a first stage covers every task below it: one bisection per first
        # stage with unfinished work instead of one per task.
        firsts = {task.prefix[:1] for i, task in enumerate(tasks)
                  if task.prefix and (i not in results or not results[i].finished)}
        firsts |= {task.prefix[:1] for task in untaken}
        # The report may overrun the limit by a little only: subtrees left unbounded
        # when that grace is spent keep the root bound.
        grace_until = time.perf_counter() + report_grace(time_limit)
        floor = _compute_floor(cm)
        # One bound covers every plan: it is the floor under every subtree's (first, with
        # half of the grace; all of it where a lazy first level was not taken to its end,
        # since the stages never taken have no other bound). Both bisections start from
        # the bound known below them.
        whole = lazy and not exhausted
        root_until = grace_until if whole else (
            time.perf_counter() + 0.5 * (grace_until - time.perf_counter()))
        root = root_lower_bound(bounds, probe.combos, value, steps=10, until=root_until,
                                lower=floor)
        lb = value
        for first in sorted(firsts, key=lambda f: rank.get(f[0], math.inf)):
            # The ranking's bound holds already; a bisection may tighten it (10 halvings:
            # within 0.1% of the gap) while the grace lasts.
            known = max(rank.get(first[0], 0.0), root)
            if not whole and time.perf_counter() < grace_until:
                known = prefix_lower_bound(bounds, probe.combos, first,
                                           space.take(space.capacity, first[0]), value,
                                           steps=10, until=grace_until, lower=known)
            lb = min(lb, known)
        if whole:
            lb = min(lb, root)  # the first stages never taken: the root bound covers them
        # Capped at the answer: a start outside the space may beat every plan in it.
        lb = min(max(lb, root, floor), value)
    else:
        lb = value
    timings["search"] = max(0.0, time.perf_counter() - start - caller_s)
    # Each probe lists stage counts over every host: fewer probes on thousands of hosts
    # (4 at 2,000), and a stopped search's answer, already due, waits a second at most.
    probes = max(4, min(64, 8192 // max(1, len(space.capacity))))
    size_until = time.perf_counter() + 1.0 if stopped else math.inf
    size, exact_size = estimate_space_size(space, probes=probes, until=size_until)
    cert = Certificate(optimal=not stopped and math.isfinite(value), lower_bound=lb,
                       nodes=counters.nodes, leaves=counters.leaves,
                       pruned_bound=counters.pruned_bound, pruned_memory=counters.pruned_memory,
                       pruned_symmetry=counters.pruned_symmetry, space_size=size,
                       space_size_exact=exact_size, wall_s=wall, workers=executor.workers,
                       stopped=stopped)
    if plan is None and not stopped:
        raise InfeasibleError("no feasible plan: no plan of the space fits in memory")
    # Seed tasks report in the order they end: the parts are listed in one order.
    timings = {k: timings[k] for k in ("starts", *SEEDS, "search") if k in timings}
    return Solution("exact", obj.name, plan, _estimate(cm, plan), value, wall,
                    evaluations=counters.leaves, certificate=cert,
                    found_by=found_by if plan is not None else "", timings=timings,
                    details=_details(starts))


def _estimate(cm: CostModel, plan: Plan | None) -> Any:
    return cm.evaluate(plan) if plan is not None else None


def _details(starts: list[_Seed]) -> dict[str, Any]:
    """The start plans' values, by the part that made each (for the report)."""
    return {"starts": [{"found_by": by, "value_s": v} for v, _, by in starts]} if starts else {}


def _deadline_search(cm: CostModel, space: PlanSpace, obj: Objective,
                     time_limit: float | None, starts: list[_Seed],
                     timings: dict[str, float], runtime: str = "any",
                     node_limit: int | None = None) -> Solution:
    """``solve(certify=False)``: the exact search under a hard deadline (see ``solve``).

    The re-planner's plans must not change with this driver's other modes, so this is
    the search it has always run: the seeds (the start plans, the Metis-style and the
    Megatron-style plans), then the first-stage subtrees in ``root_tasks`` order, none
    started once the deadline has passed."""
    start = time.perf_counter()
    best_v, best_p, found_by = _best_seed([*_baseline_seeds(cm, space, obj, timings, runtime),
                                           *starts])
    caller_s = sum(v for k, v in timings.items() if k != "starts")
    # The deadline counts from after the seeds, as it always has for the re-planner.
    deadline = time.time() + time_limit if time_limit else math.inf
    problem = SearchProblem(cm, space, obj, deadline, best_v, runtime)
    incumbent = LocalIncumbent(best_v)
    bounds = make_bounds(problem)
    counters = Counters()
    finished = True
    # Lazily (as root_tasks(depth=1) orders them): a 16-host cluster has hundreds of
    # millions of first stages.
    cut: list[bool] = []
    left = node_limit
    for task in first_stage_tasks(space, until=problem.deadline, cut=cut):
        if time.time() > problem.deadline or (left is not None and left <= 0):
            finished = False
            break
        res = search_subtree(problem, task, incumbent, bounds, max_steps=left)
        if left is not None:
            left -= max(res.steps, 1)
        counters.add(res.counters)
        finished = finished and res.finished
        if res.plan is not None and res.value < best_v:
            best_v, best_p, found_by = res.value, res.plan, "search"
    finished = finished and not cut
    wall = time.perf_counter() - start
    timings["search"] = max(0.0, wall - caller_s)
    if best_p is None and finished:
        raise InfeasibleError("no feasible plan: no plan of the space fits in memory")
    # Without the bisection the only bound of an unfinished search is the compute floor;
    # under a node budget (no clock to keep) the root bound's bisection, to its end.
    lb = best_v if finished else min(_compute_floor(cm), best_v)
    if not finished and node_limit is not None and math.isfinite(best_v):
        probe = Searcher(problem, LocalIncumbent(best_v), bounds)
        lb = min(root_lower_bound(bounds, probe.combos, best_v, steps=10, lower=lb), best_v)
    cert = Certificate(optimal=finished and math.isfinite(best_v), lower_bound=lb,
                       nodes=counters.nodes, leaves=counters.leaves,
                       pruned_bound=counters.pruned_bound, pruned_memory=counters.pruned_memory,
                       pruned_symmetry=counters.pruned_symmetry, wall_s=wall, workers=1,
                       stopped="" if finished else
                       ("node limit" if left is not None and left <= 0 else "time limit"))
    return Solution("exact", obj.name, best_p, _estimate(cm, best_p), best_v, wall,
                    evaluations=counters.leaves, certificate=cert,
                    found_by=found_by if best_p is not None else "", timings=timings,
                    details=_details(starts))
