"""What PPO learns from: a reward normalised per instance, and episodes grouped by instance.

The environment's reward is the plan's model-FLOPs utilisation ``T_ideal / T``. It ranks
the plans of one instance exactly, but its scale differs between instances by an order
of magnitude (a small model on many slow links reaches 5%, a large one on one host 60%),
so in one PPO batch the advantage of an action mostly says which instance the episode
drew, not whether the action was good. ``LogRatioReward`` replaces it with
``log(T_ref / T)``, ``T_ref`` the value of a reference plan of the same instance (the
Metis-style plan, scored with the environment's objective under the instance's fixed
bandwidth states: the robust mode's, or each link's mean in the sampled mode): 0 for a
plan as good as the reference, ``+0.1`` for one 10% faster, the same scale on every
instance. The references of a training pool are computed once,
in parallel, before training (``reference_table``; about 0.4 s an instance on
train-mixed) and cached in a JSON file that later runs with the same suite, objective
and bandwidth states reuse; the workers get the table, so the reference is the same
for every rollout of an instance (tested). An instance missing from the table is
solved in the worker the first time it is drawn.

``RepeatInstance`` makes ``k`` consecutive episodes of an environment draw the same
instance, so a batch holds several rollouts of each instance and their advantages
compare like with like.

Both are Gymnasium wrappers applied inside the environment workers (``hetpar train``'s
``make_vec_env(wrap=...)``); the value the environment reported stays in ``info``
(``reward``: the utilisation; ``log_ratio`` and ``reference_s`` are added).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from hetpar.errors import ConfigError

__all__ = ["REWARDS", "LogRatioReward", "RepeatInstance", "reference_table", "reference_value",
           "shaping"]

REWARDS = ("mfu", "log_metis")
# The reward of an episode that ends without a feasible plan (the masks prevent it): as
# bad as a plan e^2 (7.4x) slower than the reference.
INFEASIBLE_LOG_RATIO = -2.0


def _metis_score(problem: Any, objective: Any) -> float:
    """The Metis-style plan of ``problem`` scored with ``objective`` under the problem's
    bandwidth states (inf when Metis finds no plan)."""
    from hetpar.solvers.api import solve

    sol = solve(problem, "metis")
    if not sol.found or sol.plan is None:
        return math.inf
    times, feasible = problem.cost_model.iteration_times(sol.plan)
    return float(objective.score(times, feasible))


def reference_value(env: Any) -> float:
    """The Metis-style plan's value on the current episode's instance under the
    instance's fixed bandwidth states and the environment's objective; inf when Metis
    finds no plan."""
    return _metis_score(env.context.problem, env.objective)


def _metis_value(args: tuple[Any, str, int]) -> float:
    """``reference_value`` of one instance without an environment (for worker processes):
    the same fixed states, those ``InstanceContext.build`` draws (``samples`` 0: each
    link's mean)."""
    from hetpar.costmodel.objective import Objective
    from hetpar.envs.context import bandwidth_seed
    from hetpar.problem import Problem

    inst, objective, samples = args
    obj = Objective.parse(objective)
    problem = Problem.from_instance(inst, objective=obj, samples=samples,
                                    seed=bandwidth_seed(inst))
    return _metis_score(problem, obj)


def reference_table(suite: str, count: int, *, objective: str, samples: int,
                    cache: Path | None = None, workers: int = 1,
                    log: Callable[[str], None] | None = None) -> dict[str, float]:
    """Instance name -> the Metis-style plan's value (``reference_value``) for instances
    ``0 .. count-1`` of ``suite``, under the environment's fixed states (``samples`` 0:
    each link's mean) and ``objective``; computed in ``workers`` processes and cached in
    ``cache`` (a JSON file recording what it is for; one made for other settings is
    refused with one line)."""
    from hetpar.problem.generator import load_suite

    key = {"suite": suite, "objective": objective, "samples": samples}
    table: dict[str, float] = {}
    if cache is not None and cache.is_file():
        try:
            doc = json.loads(cache.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(str(cache), "", f"unreadable reward-reference cache ({exc})"
                              ) from None
        if not isinstance(doc, dict) or doc.get("key") != key:
            raise ConfigError(str(cache), "key", f"reward references for "
                                                 f"{doc.get('key') if isinstance(doc, dict) else doc!r}"
                                                 f", not {key}; remove the file")
        table = {str(k): (math.inf if v is None else float(v))
                 for k, v in doc.get("values", {}).items()}
    src = load_suite(suite)
    instances = src.instances(count if src.size is None else min(count, src.size), 0)
    todo = [inst for inst in instances if inst.name not in table]
    if todo:
        if log:
            log(f"reward references: {len(instances) - len(todo)} cached, computing "
                f"{len(todo)} Metis-style plans in {workers} process(es)")
        jobs = [(inst, objective, samples) for inst in todo]
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            from hetpar.procs import thread_safe_context

            # Not fork: the trainer holds torch's threads (hetpar/procs.py).
            with ProcessPoolExecutor(workers, mp_context=thread_safe_context()) as pool:
                values = list(pool.map(_metis_value, jobs, chunksize=8))
        else:
            values = [_metis_value(job) for job in jobs]
        table.update({inst.name: v for inst, v in zip(todo, values)})
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(cache.name + ".tmp")
            tmp.write_text(json.dumps({"key": key, "values": {
                k: (None if math.isinf(v) else v) for k, v in sorted(table.items())}}))
            tmp.replace(cache)
    return table


class _MaskedWrapper(gym.Wrapper):
    """A wrapper that forwards ``action_masks`` (sb3-contrib asks the outermost one)."""

    def action_masks(self) -> Any:
        return self.env.unwrapped.action_masks()  # type: ignore[attr-defined]


class LogRatioReward(_MaskedWrapper):
    """The final reward ``log(T_ref / T)`` with ``T_ref`` the instance's reference value
    (``refs``, else ``reference_value`` computed on the first episode; where Metis finds
    no plan, the first plan an episode of the instance built). Intermediate rewards
    stay 0."""

    def __init__(self, env: gym.Env, refs: dict[str, float] | None = None) -> None:
        super().__init__(env)
        self._refs: dict[str, float] = dict(refs or {})

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated and "objective_s" in info:
            base = self.env.unwrapped
            key = info["instance"]
            value = float(info["objective_s"])
            ref = self._refs.get(key)
            if ref is None:
                ref = reference_value(base)
                if not math.isfinite(ref):
                    ref = value
                self._refs[key] = ref
            good = info.get("feasible") and math.isfinite(value) and value > 0 \
                and math.isfinite(ref)
            reward = math.log(ref / value) if good else INFEASIBLE_LOG_RATIO
            info["log_ratio"], info["reference_s"] = reward, ref
        return obs, float(reward), terminated, truncated, info


class RepeatInstance(_MaskedWrapper):
    """Each drawn instance serves ``k`` consecutive episodes (a reset that names an
    instance is passed through and starts a new group)."""

    def __init__(self, env: gym.Env, k: int) -> None:
        super().__init__(env)
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.k = k
        self._left = 0
        self._index: int | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[Any, dict[str, Any]]:
        if options and "instance" in options:
            self._left = 0
            return self.env.reset(seed=seed, options=options)
        if self._left > 0 and self._index is not None and seed is None:
            self._left -= 1
            return self.env.reset(options={"instance": self._index})
        obs, info = self.env.reset(seed=seed, options=options)
        self._index = self.env.unwrapped.instance_index  # type: ignore[attr-defined]
        self._left = self.k - 1
        return obs, info


# The decisions made before any stage exists, which ``hetpar plan``'s sweep enumerates
# (the micro-batch count) or takes the few most likely of (the memory option):
# ``planner._micro_sweep``.
OPENING_PHASES = frozenset({"memory", "micro_batches"})


class RandomOpening(_MaskedWrapper):
    """With probability ``p`` an episode's opening decisions (memory option, micro-batch
    count: ``OPENING_PHASES``) are drawn uniformly among the allowed actions inside
    ``reset``, and the agent starts from the state they leave; otherwise it makes them.

    At planning time the sweep rolls the policy out from every micro-batch count its
    masks allow under its most likely memory options, so what decides its plans is how
    well it builds stages after openings it would not choose itself. Exploring starts
    train exactly that; the drawn decisions are not the agent's (no transition, no
    gradient). The draws use the environment's own generator, so a seeded run repeats."""

    def __init__(self, env: gym.Env, p: float) -> None:
        super().__init__(env)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.p = p

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        base = self.env.unwrapped
        rng = base.np_random
        if self.p <= 0.0 or rng.random() >= self.p:
            return obs, info
        drawn = 0
        while base.phase_name() in OPENING_PHASES:  # type: ignore[attr-defined]
            allowed = np.flatnonzero(base.action_masks())  # type: ignore[attr-defined]
            obs, _, terminated, truncated, _ = self.env.step(int(rng.choice(allowed)))
            drawn += 1
            if terminated or truncated:  # pragma: no cover - no stage exists yet
                raise RuntimeError("an episode ended during its opening")
        return obs, {**info, "opening_drawn": drawn}


class _Shaping:
    """A picklable ``wrap`` for ``make_vec_env``: ``RandomOpening``, ``RepeatInstance``,
    then the reward."""

    def __init__(self, reward: str, repeat: int, inner: Any = None,
                 refs: dict[str, float] | None = None, opening: float = 0.0) -> None:
        self.reward, self.repeat, self.inner, self.refs = reward, repeat, inner, refs
        self.opening = opening

    def __call__(self, env: gym.Env) -> gym.Env:
        if self.inner is not None:
            env = self.inner(env)
        if self.opening > 0.0:
            env = RandomOpening(env, self.opening)
        if self.repeat > 1:
            env = RepeatInstance(env, self.repeat)
        if self.reward == "log_metis":
            env = LogRatioReward(env, self.refs)
        return env


def shaping(reward: str, repeat: int, inner: Any = None,
            refs: dict[str, float] | None = None, opening: float = 0.0) -> Any:
    """The ``wrap`` that ``hetpar train`` gives ``make_vec_env`` for a config's reward,
    repeat and share of drawn openings (``RandomOpening``; None when none changes
    anything); ``refs``: a ``reference_table``."""
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r} (known: {', '.join(REWARDS)})")
    if reward == "mfu" and repeat <= 1 and opening <= 0.0:
        return inner
    return _Shaping(reward, repeat, inner, refs, opening)
