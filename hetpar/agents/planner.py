"""Plan with a trained policy: one deterministic masked rollout in ``PlanBuilderEnv``.

``plan_with_policy`` builds a plan-building environment for exactly one instance with the
keyword arguments the policy was trained with (``bundle.meta["env_kwargs"]``), in the
``robust`` bandwidth mode (the policy sees each link's distribution, not one draw), and
lets the policy pick the most likely allowed action at every step. The masks guarantee a
plan that fits in memory.

The plan is then scored like the solvers score theirs: by the ``Problem`` it is given
(its objective over its ``samples`` bandwidth states drawn with its ``seed``, the same
states as ``solve(problem, ...)``), so values are directly comparable with ``exact`` and
the baselines. ``policy_problem`` makes that problem with the policy's training objective
and sample count where the caller does not choose them.

**Refinement** (on by default, ``refine_steps`` search steps at most): the rollout's structure
(stages in order, each stage's GPU type, TP degree and hosts) is kept and the exact
search's layer-split subroutine picks the best micro-batch count, recompute mode and layer
split for it (``hetpar.solvers.refine``). Those inner choices are where a policy's small
slips cost most (a layer too many on a slow stage), and the exact subroutine settles them
in milliseconds; the result is never worse than the rollout's plan (``details["raw_value"]``).

``plan_with_policy`` returns a ``Solution`` like every planner (``hetpar.agents.planning``).
Its ``found_by`` is the step that produced the plan (``rollout``, ``refine`` or
``improve``); its ``timings``: ``setup`` the environment construction (feasibility tables
of the instance), ``inference`` the rollout (policy forward passes plus the masks of the
visited states), ``forward`` the forward passes alone (a part of ``inference``),
``refine`` the refinement, ``improve`` the structure search.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hetpar.cluster.topology import Cluster
from hetpar.costmodel.constants import CostConstants
from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.envs.actions import RECOMPUTE_MODES, ZERO_STAGES
from hetpar.envs.search import SearchEnv
from hetpar.errors import ConfigError, HetparError, InfeasibleError
from hetpar.plan import Plan
from hetpar.problem import POLICY_SAMPLES, Problem, Solution
from hetpar.problem.instance import Instance
from hetpar.workload.model import ModelSpec
from hetpar.workload.training import TrainingSpec

__all__ = ["DEFAULT_BEAM", "DEFAULT_REFINE_STEPS", "REFINE_CANDIDATES", "WIDE_BEAM",
           "PlanCache", "check_hosts", "forward_for", "instance_of", "plan_with_policy",
           "policy_method", "policy_problem"]

# Search steps of the refinement (a node budget, not a clock, so that a plan is the same on
# every machine); structures of 1-4 stages take 1-130 steps at about 0.5 ms each.
DEFAULT_REFINE_STEPS = 500
_MAX_STEPS = 100_000  # a rollout longer than this is a broken policy/environment pair
# With a beam: besides the greedy rollout's structure, how many of the best distinct
# structures are refined.
REFINE_CANDIDATES = 2
# The sweep (``_micro_sweep``): how many of the policy's most likely memory options it
# rolls out from (each with every micro-batch count), and how many of its best distinct
# structures it refines besides the policy's own. Every memory option (recompute mode x
# ZeRO stage), so that the openings are enumerated and the policy builds the stages: on
# the first 20 instances of test-hard, against the reference files, the 3 most likely
# with 8 structures refined gave a median gap of 4.1% and a p90 of 21.0% (0.67 s), all 6
# with 16 gave 1.9% and 10.4% (1.41 s); with all 6, refining 8 left test-larger's median
# at 3.4% against 2.6% (docs/agents.md, "The sweep").
SWEEP_MEMORY = len(RECOMPUTE_MODES) * len(ZERO_STAGES)
SWEEP_REFINE_CANDIDATES = 16
# Beam width of `hetpar plan` (1: the single most likely rollout). With the structure
# search after it a wider beam rarely pays for its several-fold longer inference
# (docs/agents.md has the measurement). Re-planning decodes its own way (REPLAN_SWEEP_MEMORY).
DEFAULT_BEAM = 1
# Width of `hetpar evaluate`'s policy-beam method and the width to suggest for more search.
WIDE_BEAM = 4
# Of a call's wall-clock budget, the part the refinement leaves unused: one search step
# (a root bound, a block of enumerated splits) overruns the clock by up to ~4 ms on a busy
# core, and the final evaluation takes ~1 ms, so the refinement stops this much early for
# the call to end within its budget.
BUDGET_MARGIN_S = 0.005
# Of a call's budget, the part after which the sweep starts no further rollout (the
# policy's own rollout always runs): the rest is for refining what it has. Without a
# budget the sweep rolls out every candidate, the same plan on every machine.
SWEEP_BUDGET_SHARE = 0.5
# States one batched forward pass of the greedy rollout scores: the current one and up to
# this many - 1 guessed successors (``_greedy``); 1 turns speculation off.
SPECULATE = 8


class PolicyLike(Protocol):
    """What ``hetpar.agents.io.load_policy`` returns (``PolicyBundle``)."""

    model: Any
    meta: dict[str, Any]
    path: Any

    @property
    def max_hosts(self) -> int: ...

    @property
    def env_kwargs(self) -> dict[str, Any]: ...


class PlanCache:
    """What ``plan_with_policy`` keeps between calls on clusters of one topology (the
    successive network states of a re-planned training run): per topology, model,
    training and policy settings, the planning environment (memory-feasibility tables
    and action masks, which no bandwidth change alters) and the scoring cost model
    (bandwidth-free work, memory and flow tables). The oldest of ``size`` entries is
    dropped first."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._entries: dict[tuple, tuple[Any, CostModel]] = {}
        self._forwards: dict[int, tuple[Any, Forward]] = {}  # id -> (policy, its forward)
        self._blas: Any = None

    def blas(self) -> Any:
        """A threadpoolctl controller of the loaded BLAS libraries, found once (listing
        them costs ~1 ms, limiting through it ~0.05 ms)."""
        if self._blas is None:
            self._blas = _blas_controller()
        return self._blas

    def forward(self, policy: Any) -> Forward:
        """``forward_for(policy)``, built once (it copies the network's weights)."""
        hit = self._forwards.get(id(policy))
        if hit is None or hit[0] is not policy:
            hit = self._forwards[id(policy)] = (policy, forward_for(policy))
        return hit[1]

    def get(self, key: tuple) -> tuple[SearchEnv, CostModel] | None:
        return self._entries.get(key)

    def put(self, key: tuple, env: SearchEnv, cm: CostModel) -> None:
        if len(self._entries) >= self.size:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (env, cm)

    def __len__(self) -> int:
        return len(self._entries)


def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def _intra_op_threads(threads: int | None, cache: PlanCache | None) -> Iterator[None]:
    """torch's and numpy's BLAS intra-op threads limited to ``threads`` (None: left
    alone), restored on exit. numpy's BLAS keeps threads of its own: at the rollout's
    sizes a second one only spins (measured: CPU time twice the wall time, no faster), and
    the latency target is one core."""
    if threads is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    blas = cache.blas() if cache is not None else _blas_controller()
    try:
        with blas.limit(limits=threads, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(old)


def instance_of(cluster: Cluster | Instance, model: ModelSpec | None = None,
                training: TrainingSpec | None = None, *, name: str | None = None) -> Instance:
    """An ``Instance`` for already-loaded cluster, model and training objects.

    The environment only reads the parsed objects of an instance, so they are attached
    directly instead of being re-serialised into documents."""
    if isinstance(cluster, Instance):
        return cluster
    if model is None or training is None:
        raise TypeError("instance_of needs a model and a training spec with a cluster")
    inst = Instance(name=name or f"{cluster.name}/{model.name}", cluster_doc={}, model_doc={},
                    training_doc={}, seed=-1)
    # Instance's cluster/model/training are cached properties: pre-fill their cache.
    inst.__dict__.update(cluster=cluster, model=model, training=training)
    return inst


def _policy_name(bundle: PolicyLike) -> str:
    path = getattr(bundle, "path", None)
    return str(path) if path is not None else "<policy>"


def check_hosts(bundle: PolicyLike, inst: Instance, source: str = "") -> None:
    """ConfigError naming the policy file when the instance has more hosts (or layers) than
    the policy handles."""
    from hetpar.agents.io import check_compatible

    check_compatible(bundle, inst.num_hosts, source=source or inst.cluster.name,
                     model_layers=inst.model.layers)


def policy_problem(bundle: PolicyLike, cluster: Cluster | Instance,
                   model: ModelSpec | None = None, training: TrainingSpec | None = None, *,
                   objective: str | Objective | None = None, samples: int | None = None,
                   seed: int = 0, constants: CostConstants | None = None) -> Problem:
    """The ``Problem`` a policy plans by default: ``objective`` defaults to the one the
    policy was trained for and ``samples`` to its robust-mode sample count (else
    ``POLICY_SAMPLES``); ``seed`` is the seed of the bandwidth draws. ``cluster`` is a
    ``Cluster`` (with ``model`` and ``training``) or an ``Instance``."""
    inst = instance_of(cluster, model, training)
    trained = bundle.env_kwargs
    obj = objective if objective is not None else str(trained.get("objective", "mean"))
    k = int(samples if samples is not None else trained.get("samples") or POLICY_SAMPLES)
    if k < 1:
        raise ConfigError("", "samples", f"must be at least 1, got {k}")
    return Problem.from_instance(inst, objective=obj, samples=k, seed=seed,
                                 constants=constants)


def policy_method(beam: int = 1, refine: bool = True, improve_evaluations: int = 0) -> str:
    """The name of a policy planner's settings, as ``hetpar evaluate`` names its methods:
    ``policy-raw`` (the rollout alone), ``policy-beam`` (from a beam search), ``policy``
    (the rollout refined, then the structure search) or ``policy-greedy`` (refined only)."""
    if not refine:
        return "policy-raw"
    if beam > 1:
        return "policy-beam"
    return "policy" if improve_evaluations > 0 else "policy-greedy"


def plan_with_policy(bundle: PolicyLike, problem: Problem, *, method: str | None = None,
                     instance: Instance | None = None,
                     threads: int | None = 1, source: str = "", refine: bool = True,
                     refine_steps: int | None = DEFAULT_REFINE_STEPS,
                     refine_time: float | None = None, beam: int = 1,
                     refine_candidates: int | None = None,
                     cache: PlanCache | None = None,
                     incumbent: float = math.inf,
                     budget_s: float | None = None,
                     improve_evaluations: int = 0,
                     speculate: int = SPECULATE, runtime: str = "any",
                     micro_sweep: bool = False, sweep_memory: int = SWEEP_MEMORY) -> Solution:
    """One deterministic masked rollout of ``bundle``'s policy on ``problem``.

    The plan is scored by ``problem`` (its objective over its bandwidth states; make one
    with the policy's defaults with ``policy_problem``). ``method`` names the result
    (default: ``policy_method`` of the settings). ``instance``: the suite instance the
    problem was made from, if any; the environment then scores its episode as it did in
    training (with the instance's own draws: ``details["env_value"]``). ``threads``
    sets torch's intra-op threads for the rollout (restored afterwards; None leaves it
    alone). ``refine`` polishes the rollout's plan within
    ``refine_steps`` search steps and ``refine_time`` seconds (None: no limit; see the
    module docstring). ``beam`` > 1 runs a beam search of that width over the policy's
    log-probabilities instead of the single most-likely rollout (see the module
    docstring); besides the greedy rollout's structure, the ``refine_candidates`` best
    other structures it finished are refined (None: ``REFINE_CANDIDATES``, with the sweep
    ``SWEEP_REFINE_CANDIDATES``). ``improve_evaluations`` > 0 then runs the
    structure search (``hetpar.solvers.local_search.improve_structure``) with that many
    scored completions at most. ``cache`` (a ``PlanCache``) keeps the
    environment and cost model between calls for clusters of one topology under changing
    bandwidth, as a re-planner makes them: only bandwidth terms are rebuilt, and the plan
    is the one a call without the cache gives. ``incumbent`` is the value of a plan the
    caller already holds (a re-planner's current plan in the new state): refinement then
    only seeks plans better than it, which prunes more, and the policy's own best plan
    is returned when none is found. ``budget_s`` bounds the wall time of the whole call
    for a caller with a deadline: the refinement and the structure search, both anytime,
    stop ``BUDGET_MARGIN_S`` before the budget is spent and keep the best plan found so
    far, and the sweep starts no rollout past ``SWEEP_BUDGET_SHARE`` of it (a rollout is
    not cut; the plan then depends on the machine's speed). ``speculate``
    is how many states one forward pass of the single rollout scores (``_greedy``; 1: one
    state per pass, the same plan more slowly). ``runtime`` (``hetpar.runtime.rules``): the
    environment's masks allow only plans that framework runs, and the refinement keeps to
    its layer splits; the structure search, which moves outside such plans, is not run
    (``details["improve_skipped"]`` says so). ``micro_sweep`` rolls the policy out once for
    each of its ``sweep_memory`` most likely memory options and every micro-batch count the
    masks then allow (``_micro_sweep``), greedily everywhere else, instead of once: the
    rollouts' plans are the candidates, ranked and refined as a beam's are; it excludes
    ``beam`` > 1. Raises ConfigError
    when the cluster has more hosts than the policy's ``max_hosts`` (``source``, e.g. the
    cluster file, names it).
    """
    import torch

    from hetpar.envs.env import PlanBuilderEnv

    inst = instance if instance is not None else instance_of(
        problem.cluster, problem.model, problem.training, name=problem.name or None)
    check_hosts(bundle, inst, source)
    kwargs = dict(bundle.env_kwargs)
    kwargs.pop("max_hosts", None)
    kwargs.pop("objective", None)
    obj, k, seed, constants = problem.objective, problem.samples, problem.seed, \
        problem.constants
    if k < 1:
        raise ConfigError("", "samples", f"must be at least 1, got {k}")
    if improve_evaluations < 0:
        raise ConfigError("", "improve_evaluations",
                          f"must be at least 0, got {improve_evaluations}")
    if beam < 1:
        raise ConfigError("", "beam", f"must be at least 1, got {beam}")
    if speculate < 1:
        raise ConfigError("", "speculate", f"must be at least 1, got {speculate}")
    if micro_sweep and beam > 1:
        raise ConfigError("", "beam", "a micro-batch sweep rolls out greedily: give a beam "
                                      "or the sweep, not both")
    if sweep_memory < 1:
        raise ConfigError("", "sweep_memory", f"must be at least 1, got {sweep_memory}")
    if refine_candidates is None:
        refine_candidates = SWEEP_REFINE_CANDIDATES if micro_sweep else REFINE_CANDIDATES
    if refine_candidates < 0:
        raise ConfigError("", "refine_candidates",
                          f"must be at least 0, got {refine_candidates}")
    from hetpar.runtime.rules import get_runtime

    restricted = not get_runtime(runtime).unrestricted
    kwargs.pop("bandwidth", None)
    # The environment sees as many states as the problem scores: its robust objective
    # is the problem's.
    kwargs["samples"] = k

    start = called = time.perf_counter()
    key = (inst.cluster.topology_key, id(inst.model), id(inst.training), id(constants),
           bundle.max_hosts, obj, tuple(sorted(kwargs.items())), runtime)
    kept = cache.get(key) if cache is not None else None
    if kept is None:
        env = PlanBuilderEnv([inst], max_hosts=bundle.max_hosts, objective=obj.name,
                             bandwidth="robust", constants=constants, runtime=runtime,
                             **kwargs)
        cm = problem.cost_model
        if cache is not None:
            cache.put(key, env, cm)
    else:
        env = kept[0].retarget(inst)
        # The problem's states on the kept bandwidth-free tables (building the problem's
        # own cost model would rebuild them).
        cm = kept[1].with_bandwidth(problem.bandwidth if problem.bandwidth is not None
                                    else problem.cluster.bandwidth_states(k, seed))
    # The environment's episode seed is the problem's seed, as it has always been; in
    # the robust mode the rollout does not depend on it.
    obs, _ = env.reset(seed=seed, options={"instance": 0})
    policy = bundle.model.policy
    with _intra_op_threads(threads, cache):
        if policy.training:  # the call walks every submodule: ~1 ms a decision otherwise
            policy.set_training_mode(False)
        with torch.inference_mode():
            # torch initialises its kernels on the first forward pass of a process: a
            # one-time cost like Python's start-up, counted in setup_s, not inference_s.
            forward = cache.forward(policy) if cache is not None else forward_for(policy)
            forward([obs])
        setup_s = time.perf_counter() - start
        start = time.perf_counter()
        with torch.inference_mode():
            if micro_sweep:
                candidates, info, stats = _micro_sweep(
                    env, forward, obs, bundle, speculate, sweep_memory,
                    None if budget_s is None else called + SWEEP_BUDGET_SHARE * budget_s)
            elif beam <= 1:
                plan, info, stats = _greedy(env, forward, obs, bundle, speculate)
                candidates = [plan]
            else:
                candidates, info, stats = _beam_search(env, forward, bundle, beam)
        inference_s = time.perf_counter() - start
    steps, forced, forward_s = stats

    # The candidates (one, or the beam's finished plans, the greedy one first) are ranked by
    # the scoring model.
    values = [_value(cm, obj, p) for p in candidates]
    order = sorted(range(len(candidates)), key=lambda n: (values[n], n))
    plan, value = candidates[order[0]], values[order[0]]
    raw_value, found_by = value, "rollout"
    evaluations = len(candidates)  # plans the cost model scored, the search's included
    if not math.isfinite(value):  # pragma: no cover - the masks guarantee a fitting plan
        raise InfeasibleError(f"the policy's plan does not fit in memory: "
                              f"{'; '.join(cm.evaluate(plan).overflow)}")
    from hetpar.problem.space import PlanSpace

    refine_s, complete = 0.0, False
    space: PlanSpace | None = None  # built once for the refinement and the local search
    if refine:
        from hetpar.solvers.exact import bounds_of
        from hetpar.solvers.refine import refine_plan

        t0 = time.perf_counter()
        space = PlanSpace(inst.cluster, cm.model, inst.training)
        # One set of bounds for every structure refined: the rollouts share most of their
        # stages, and a stage's profile (its affine costs at a micro-batch count) costs
        # more to build than most completions do to score.
        bounds = bounds_of(cm, space, obj)
        # Refinement re-chooses what the candidates differ in most (micro-batches, recompute,
        # layer split), so a structure that ranks second raw may win once refined: the
        # greedy rollout's structure and the best few distinct ones are refined.
        picks, structures = [], set()
        for n in [0] + order:
            key = tuple(space.decompose(candidates[n])[0])
            if key not in structures:
                structures.add(key)
                picks.append(n)
            if len(picks) > refine_candidates:
                break
        best = value  # never worse than the best candidate as it came out of the search
        # The best raw structure first: its refined value then prunes the others' search.
        for n in sorted(picks, key=lambda n: (values[n], n)):
            limit = refine_time
            if budget_s is not None:
                left = budget_s - BUDGET_MARGIN_S - (time.perf_counter() - called)
                if left <= 0.0:
                    break  # spent (the rollout alone may take it all): keep what is held
                limit = left if limit is None else min(limit, left)
            ref = refine_plan(cm, space, obj, candidates[n], max_steps=refine_steps,
                              time_limit=limit, beat=min(best, incumbent), bounds=bounds,
                              runtime=runtime)
            evaluations += ref.evaluations
            if ref.value < best or (ref.value == best and ref.complete and not complete):
                best, plan, value, complete = ref.value, ref.plan, ref.value, ref.complete
        refine_s = time.perf_counter() - t0
        if value < raw_value:
            found_by = "refine"
    improve_s, moves = 0.0, 0
    improved_from: float | None = None  # the refined value the structure search started at
    # Under ``budget_s`` the structure search gets what the budget has left (it stops
    # with the best plan so far), so the budget bounds the whole call as documented.
    improve_limit = (None if budget_s is None else
                     budget_s - BUDGET_MARGIN_S - (time.perf_counter() - called))
    improve_skipped = restricted and improve_evaluations > 0
    if improve_evaluations > 0 and not restricted and \
            (improve_limit is None or improve_limit > 0.0):
        from hetpar.solvers.local_search import improve_structure

        t0 = time.perf_counter()
        if space is None:
            space = PlanSpace(inst.cluster, cm.model, inst.training)
        imp = improve_structure(cm, space, obj, plan, max_evaluations=improve_evaluations,
                                beat=min(value, incumbent), time_limit=improve_limit)
        improved_from = value
        evaluations += imp.evaluations
        if imp.value < value:
            plan, value, complete, moves = imp.plan, imp.value, False, imp.moves
            found_by = "improve"
        improve_s = time.perf_counter() - t0
    est = cm.evaluate(plan)
    env_value = float(info.get("objective_s", math.nan))
    details: dict[str, Any] = {
        "policy": _policy_name(bundle), "steps": steps, "forced": forced, "beam": beam,
        "micro_sweep": micro_sweep, "sweep_memory": sweep_memory if micro_sweep else None,
        "candidates": len(candidates), "raw_value": raw_value,
        "env_value": env_value if math.isfinite(env_value) else None,
        "refine_complete": complete, "improve_evaluations": improve_evaluations,
        "improve_moves": moves, "improved_from": improved_from}
    if restricted:
        details["runtime"] = runtime
    if improve_skipped:
        details["improve_skipped"] = (f"the structure search moves outside the plans "
                                      f"{runtime} runs")
    # ``forward`` is a part of ``inference``; the others add up to the planner's time
    # (scoring the candidates and the final estimate aside).
    timings = {"setup": setup_s, "inference": inference_s, "forward": forward_s,
               "refine": refine_s, "improve": improve_s}
    return Solution(method or policy_method(beam, refine, improve_evaluations), obj.name,
                    plan, est, value, time.perf_counter() - called,
                    evaluations=evaluations, found_by=found_by,
                    timings=timings, details=details, inputs=problem.describe())


class Forward(Protocol):
    """Unmasked logits (B, n_actions) of a batch of observations; given their action masks,
    entries that every mask forbids may be left unset (0)."""

    def __call__(self, observations: list[dict[str, np.ndarray]],
                 masks: list[np.ndarray] | None = None) -> np.ndarray: ...


def forward_for(policy: Any) -> Forward:
    """Unmasked action logits of a batch of observations, for planning: the numpy copy of
    the host-attention network (``hetpar.agents.inference``), or for another policy class
    its features extractor through torch (the actor head is the identity in both)."""
    from hetpar.agents.inference import NumpyLogits
    from hetpar.agents.policy import HostAttentionExtractor

    ex = policy.features_extractor
    if isinstance(ex, HostAttentionExtractor):
        numpy_logits = NumpyLogits(ex)

        def logits(observations: list[dict[str, np.ndarray]],
                   masks: list[np.ndarray] | None = None) -> np.ndarray:
            # Only the heads of the decision kinds some mask allows are computed.
            need = None if masks is None else np.stack(masks)
            return numpy_logits(_stack(observations), need)

        return logits

    def torch_logits(observations: list[dict[str, np.ndarray]],
                     masks: list[np.ndarray] | None = None) -> np.ndarray:
        import torch

        batch = {key: torch.from_numpy(v) for key, v in _stack(observations).items()}
        with torch.inference_mode():
            return policy.action_net(policy.mlp_extractor.forward_actor(
                policy.extract_features(batch))).numpy()

    return torch_logits


def _stack(observations: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(observations) == 1:
        return {key: v[None] for key, v in observations[0].items()}
    return {key: np.stack([o[key] for o in observations]) for key in observations[0]}


def _value(cm: CostModel, obj: Objective, plan: Plan) -> float:
    times, feasible = cm.iteration_times(plan)
    return obj.score(times, feasible)


def _broken(bundle: PolicyLike, steps: int) -> HetparError:
    return HetparError(f"{_policy_name(bundle)}: the policy chose an action the environment "
                       f"forbids (step {steps}); its action space does not match this hetpar "
                       f"version's environment")


def _greedy(env: SearchEnv, forward: Forward, obs: dict[str, Any], bundle: PolicyLike,
            lookahead: int = SPECULATE,
            ) -> tuple[Plan, dict[str, Any], tuple[int, int, float]]:
    """The most likely allowed action at every step; (plan, last info, (steps, forced
    steps, forward seconds)).

    Speculative, like speculative decoding of language models: from the current state a
    cheap guesser (``_StageGuess``) proposes up to ``lookahead`` - 1 next actions, the
    environment steps through them, and one batched forward pass scores the current state
    and every guessed one. The policy's action at the current state is always taken; a
    further state's action is taken as long as every guess before it was the policy's own
    action, and at the first wrong guess the rollout goes back to the snapshot of that
    state. Every action taken is therefore the policy's masked argmax in the state it is
    taken in, as in a rollout of one forward pass per step (up to exact ties, which
    batched sums may break differently). One batched forward pass of six states costs
    about two single ones (numpy's per-call overhead dominates at these sizes), and a
    deep pipeline's stages repeat each other, so most guesses are right.

    Masks are asked lazily where the observation does not need them (the memory,
    micro-batch and TP phases): a guess is checked alone (``env.allows``), and a state
    whose most likely action is its guess needs nothing more; otherwise the rollout goes
    back to that state and asks its actions from the most likely down
    (``env.masked_argmax``), then continues from there."""
    forward_s = 0.0
    rollout = _greedy_steps(env, obs, bundle, lookahead)
    try:
        request = next(rollout)
        while True:
            t0 = time.perf_counter()
            out = forward(*request)
            forward_s += time.perf_counter() - t0
            request = rollout.send(out)
    except StopIteration as done:
        plan, info, (steps, forced) = done.value
    return plan, info, (steps, forced, forward_s)


_Request = tuple[list[dict[str, Any]], list[np.ndarray]]  # observations, their need masks


def _greedy_steps(env: SearchEnv, obs: dict[str, Any], bundle: PolicyLike, lookahead: int,
                  ) -> Generator[_Request, np.ndarray, tuple[Plan, dict[str, Any],
                                                            tuple[int, int]]]:
    """``_greedy`` as a generator: it yields each batch of states it needs scored (their
    observations and the actions each needs) and is sent back their logits, so a caller
    can score several rollouts' batches in one forward pass (``_lockstep``). Returns
    (plan, last info, (steps, forced steps)). It uses ``env`` between a send and its next
    yield only: a caller interleaving rollouts on one environment restores each one's
    snapshot before sending."""
    width = max(1, int(lookahead))
    guess = _StageGuess(env.layout)
    steps, forced = 0, 0
    while True:
        # The chain: state 0 is the true current state, state i + 1 follows guess i.
        # masks[i] is state i's mask when known (None: asked lazily), need[i] a superset.
        chain_obs, snaps, guesses = [obs], [], []
        masks = [env.known_masks()]
        need = [masks[0] if masks[0] is not None else env.phase_actions()]
        trial = guess.copy()
        end: tuple[dict[str, Any], dict[str, Any]] | None = None
        while len(chain_obs) < width:
            g = trial.propose()
            if g is None or not (masks[-1][g] if masks[-1] is not None else env.allows(g)):
                break
            snaps.append(env.snapshot())
            o, _, terminated, truncated, info = env.step(g)
            guesses.append(g)
            trial.record(g)
            if terminated or truncated or info.get("invalid_action"):
                end = (o, info)
                break
            chain_obs.append(o)
            masks.append(env.known_masks())
            need.append(masks[-1] if masks[-1] is not None else env.phase_actions())
        single = [m is not None and int(np.count_nonzero(m)) == 1 for m in masks]
        ask = [i for i, one in enumerate(single) if not one]
        rows: dict[int, np.ndarray] = {}
        if ask:
            out = yield [chain_obs[i] for i in ask], [need[i] for i in ask]
            rows = dict(zip(ask, out))
        taken: list[int] = []
        restored = False
        for i, m in enumerate(masks):
            if single[i]:
                action = int(np.flatnonzero(m)[0])
            elif m is not None:
                action = int(np.argmax(np.where(m, rows[i], -np.inf)))
            else:
                top = int(np.argmax(np.where(need[i], rows[i], -np.inf)))
                if i < len(guesses) and top == guesses[i]:
                    action = top  # the most likely of the phase's actions, and allowed
                else:
                    if i < len(guesses):
                        env.restore(snaps[i], observe=False)
                        restored = True
                    action = env.masked_argmax(rows[i])
            taken.append(action)
            if restored or i == len(guesses) or action != guesses[i]:
                break
        steps += len(taken)
        forced += sum(single[:len(taken)])
        for a in taken:
            guess.record(a)
        ended_by_guess = end is not None and taken == guesses
        if end is not None and ended_by_guess:
            obs, info = end  # every guess was right, and the last one ended the episode
        else:
            j = len(taken) - 1
            if j < len(guesses) and not restored:
                env.restore(snaps[j], observe=False)
            obs, _, _, _, info = env.step(taken[-1])
        if "plan" in info:
            return info["plan"], info, (steps, forced)
        # A guess that ended the episode without a plan (truncated) is as broken as a step.
        if info.get("invalid_action") or steps >= _MAX_STEPS or ended_by_guess:
            raise _broken(bundle, steps)


def _micro_sweep(env: SearchEnv, forward: Forward, obs: dict[str, Any], bundle: PolicyLike,
                 lookahead: int = SPECULATE, memory: int = SWEEP_MEMORY,
                 deadline: float | None = None,
                 ) -> tuple[list[Plan], dict[str, Any], tuple[int, int, float]]:
    """One greedy rollout (``_greedy``) for each of the policy's ``memory`` most likely
    memory options and every micro-batch count the masks then allow, the policy's own
    choices elsewhere; the plans, the policy's own (most likely option and count) first.

    Both are decided before any stage exists. The count fixes how much of a stage's memory
    activations take, and the memory option (recompute, ZeRO) which stage shapes fit: a
    choice that makes the fast hosts' stages too small forces the rest of the model onto
    slower hosts or across slow routes, which is where the policy's worst plans come from
    (docs/agents.md, "Where it fails"). The refinement re-chooses both for each plan's
    structure, so what the sweep varies is the structures the policy builds. Without a
    ``deadline`` the rollouts run in lockstep (``_lockstep``); with one they run one after
    another, and none is started past it (``time.perf_counter()``): the policy's own
    first, then the counts of its own memory option, most likely first."""
    counters = [0, 0, 0.0]  # steps, forced steps, forward seconds

    def ranked(o: dict[str, Any]) -> np.ndarray:
        """The current state's allowed actions, most likely first."""
        mask = env.action_masks().copy()
        allowed = np.flatnonzero(mask)
        if len(allowed) > 1:
            t0 = time.perf_counter()
            logits = forward([o], [mask])[0]
            counters[2] += time.perf_counter() - t0
            allowed = allowed[np.argsort(-logits[allowed], kind="stable")]
        else:
            counters[1] += 1
        return allowed

    def step(action: int) -> dict[str, Any]:
        counters[0] += 1
        child, _, _, _, _ = env.step(action)
        return child

    starts: list[tuple[Any, dict[str, Any]]] = []  # (state, observation) at the count
    if env.phase_name() == "memory":
        root = env.snapshot()
        for action in ranked(obs)[:memory]:
            env.restore(root, observe=False)
            o = step(int(action))
            while env.phase_name() != "micro_batches":
                o = step(int(ranked(o)[0]))
            starts.append((env.snapshot(), o))
    else:
        while env.phase_name() != "micro_batches":
            obs = step(int(ranked(obs)[0]))
        starts.append((env.snapshot(), obs))
    firsts: list[tuple[Any, int]] = []  # (state, count) of every rollout, in order
    for state, o in starts:
        env.restore(state, observe=False)
        firsts += [(state, int(action)) for action in ranked(o)]
    if deadline is None:
        # Every rollout runs: in lockstep, one forward pass for all their states.
        results = _lockstep(env, forward, firsts, bundle, lookahead, counters)
    else:
        results = []
        for first in firsts:
            if results and time.perf_counter() > deadline:
                break
            results += _lockstep(env, forward, [first], bundle, lookahead, counters)
    return [r[0] for r in results], results[0][1], \
        (int(counters[0]), int(counters[1]), float(counters[2]))


def _lockstep(env: SearchEnv, forward: Forward, firsts: list[tuple[Any, int]],
              bundle: PolicyLike, lookahead: int, counters: list[Any],
              ) -> list[tuple[Plan, dict[str, Any]]]:
    """The greedy rollouts (``_greedy_steps``) that start by taking each ``(snapshot,
    action)`` of ``firsts``, run side by side on one environment: each round scores every
    live rollout's batch of states in one forward pass (a pass of 30 states costs about
    what six passes of one do), each rollout's snapshot restored before it goes on. The
    same plans as one rollout after another, up to exact ties that batched sums may break
    differently. (plan, last info) per start, in order; ``counters`` (steps, forced steps,
    forward seconds) are added to."""
    results: list[tuple[Plan, dict[str, Any]] | None] = [None] * len(firsts)
    live: dict[int, tuple[Any, Any, _Request]] = {}  # rollout -> (generator, state, request)

    def advance(n: int, rollout: Any, send: np.ndarray | None) -> None:
        try:
            request = next(rollout) if send is None else rollout.send(send)
        except StopIteration as done:
            plan, info, (steps, forced) = done.value
            counters[0] += steps
            counters[1] += forced
            results[n] = (plan, info)
            live.pop(n, None)
            return
        live[n] = (rollout, env.snapshot(), request)

    for n, (state, action) in enumerate(firsts):
        env.restore(state, observe=False)
        child, _, _, _, _ = env.step(action)
        counters[0] += 1
        advance(n, _greedy_steps(env, child, bundle, lookahead), None)
    # The rollout whose state the environment holds (the last one advanced): it goes on
    # without a restore, as a lone rollout always does.
    holder = len(firsts) - 1
    while live:
        order = sorted(live)
        observations = [o for n in order for o in live[n][2][0]]
        needs = [m for n in order for m in live[n][2][1]]
        t0 = time.perf_counter()
        out = forward(observations, needs)
        counters[2] += time.perf_counter() - t0
        at = 0
        for n in order:
            rollout, state, request = live[n]
            rows = out[at:at + len(request[0])]
            at += len(request[0])
            if n != holder:
                env.restore(state, observe=False)
            holder = n
            advance(n, rollout, rows)
    return [r for r in results if r is not None]


class _StageGuess:
    """Guesses the policy's next action from the ones it took, for ``_greedy``'s
    speculation: a new stage repeats the last closed one (its TP degree, its number of
    blocks, its layer count), or the one before it when the stages alternate (A, B, A:
    then B), and a block comes from the host the last block came from. Where that host is
    full the guess is not allowed and the chain ends: which host comes next depends on
    the state (measured: stale host logits guess it right less than half the time), so
    the batch scores that state for real. A wrong guess costs a few environment steps and
    batch rows, never a different plan."""

    def __init__(self, layout: Any) -> None:
        self.layout = layout
        # The last closed stages, latest last: (tp action, blocks, layers action).
        self.stages: tuple[tuple[int, int, int], ...] = ()
        self.current: list[int] = []  # the open stage's actions so far (tp, hosts)
        self.last_host = -1

    def copy(self) -> _StageGuess:
        twin = _StageGuess(self.layout)
        twin.stages, twin.current, twin.last_host = self.stages, list(self.current), \
            self.last_host
        return twin

    def record(self, action: int) -> None:
        kind, _ = self.layout.decode(action)
        if kind == "tp":
            self.current = [action]
        elif kind == "host":
            self.current.append(action)
            self.last_host = action
        elif kind == "layers" and self.current:
            stage = (self.current[0], len(self.current) - 1, action)
            self.stages, self.current = (*self.stages[-2:], stage), []

    def _template(self) -> tuple[int, int, int]:
        s = self.stages
        if len(s) == 3 and s[2] == s[0] != s[1]:
            return s[1]
        return s[-1]

    def propose(self) -> int | None:
        """The guessed next action (the caller checks that it is allowed)."""
        if not self.stages:
            return None  # nothing to repeat before the first stage is closed
        tp, blocks, layers = self._template()
        if not self.current:
            return tp
        if len(self.current) - 1 >= blocks:
            return layers
        return self.last_host


@dataclass
class _Beam:
    logp: float  # log-probability of the actions so far under the policy
    state: Any  # the environment's snapshot
    greedy: bool  # every action so far was the most likely one
    obs: dict[str, np.ndarray]  # its observation and action masks, kept from the step
    masks: np.ndarray           # that reached it (restoring does not rebuild them)
    first: int = -1  # the action taken at the root on the way here (-1 at the root)


def _beam_search(env: SearchEnv, forward: Forward, bundle: PolicyLike, width: int,
                 firsts: list[int] | None = None,
                 ) -> tuple[list[Plan], dict[str, Any], tuple[int, int, float]]:
    """Beam search over action sequences by the policy's log-probability: at each depth
    every live beam proposes its ``width`` most likely allowed actions, and the ``width``
    most likely children survive, plus the greedy rollout's child, which is always kept (so
    the result is never worse than ``beam=1``). Children that reach a state already in the
    beam (blocks added in another order) are dropped, and so are actions whose logits tie
    exactly with a kept one (interchangeable hosts, alike for an equivariant policy). One
    batched forward pass per depth. Returns every finished plan, the greedy one first;
    ``firsts``, where given, receives the action each of them took at the root, in the
    same order (the labels of ``hetpar.agents.dagger``)."""
    root = env.snapshot()
    beams = [_Beam(0.0, root, True, env.restore(root), env.action_masks().copy())]
    finished: list[Plan] = []
    first_of: list[int] = []
    greedy_plan: Plan | None = None
    greedy_first = -1
    steps = forced = 0
    forward_s = 0.0
    info: dict[str, Any] = {}
    seen: dict[Any, _Beam] = {}
    while beams:
        observations = [b.obs for b in beams]
        masks = [b.masks for b in beams]
        ask = [i for i, m in enumerate(masks) if np.count_nonzero(m) > 1]
        logits: dict[int, np.ndarray] = {}
        if ask:
            t0 = time.perf_counter()
            out = forward([observations[i] for i in ask], [masks[i] for i in ask])
            forward_s += time.perf_counter() - t0
            logits = dict(zip(ask, out))
        children: list[tuple[float, int, int, bool]] = []
        for i, (b, m) in enumerate(zip(beams, masks)):
            allowed = np.flatnonzero(m)
            if i not in logits:
                forced += 1
                children.append((b.logp, i, int(allowed[0]), b.greedy))
                continue
            lg = logits[i][allowed].astype(np.float64)
            lp = lg - (lg.max() + math.log(np.exp(lg - lg.max()).sum()))
            order = np.argsort(-lp, kind="stable")
            kept: list[float] = []
            for rank in order:
                if len(kept) >= width:
                    break
                if any(abs(lg[rank] - x) < 1e-6 for x in kept):
                    continue
                kept.append(float(lg[rank]))
                children.append((b.logp + float(lp[rank]), i, int(allowed[rank]),
                                 b.greedy and not kept[:-1]))
        children.sort(key=lambda c: -c[0])
        parents, beams = beams, []
        for logp, i, action, greedy in children:
            if len(beams) >= width and not greedy:
                continue
            env.restore(parents[i].state, observe=False)
            obs, _, terminated, truncated, step_info = env.step(action)
            steps += 1
            first = parents[i].first if parents[i].first >= 0 else action
            if terminated:
                finished.append(step_info["plan"])
                first_of.append(first)
                if greedy:
                    greedy_plan, info, greedy_first = step_info["plan"], step_info, first
                continue
            if truncated or step_info.get("invalid_action") or steps >= _MAX_STEPS:
                raise _broken(bundle, steps)
            key = env.state_key()
            if key in seen:
                # The same future: the greedy rollout continues in the beam already there,
                # reached as well through the greedy action at the root.
                if greedy:
                    seen[key].greedy, seen[key].first = True, first
                continue
            seen[key] = child = _Beam(logp, env.snapshot(), greedy, obs,
                                      env.action_masks().copy(), first)
            beams.append(child)
    assert greedy_plan is not None  # the greedy child is always kept
    if firsts is not None:
        firsts[:] = [greedy_first] + [f for p, f in zip(finished, first_of)
                                      if p is not greedy_plan]
    return [greedy_plan] + [p for p in finished if p is not greedy_plan], info, \
        (steps, forced, forward_s)
