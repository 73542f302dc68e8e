"""PPO training throughput of ``hetpar train``: one command, prints its figures.

    python benchmarks/train_speed.py [--config default] [--timesteps 8192] [--warmup 2048]
                                     [--n-envs N] [--torch-threads T] [--seed S]
                                     [--set ppo.n_steps=64 ...] [--profile 30]

Runs ``hetpar.agents.train.train`` itself, the function behind ``hetpar train``, on the
training config ``--config`` (default ``default``: the shipped policy's PPO, on the ``train-mixed``
suite, 16 environments in one worker process per core) for ``--warmup`` timesteps and then
``--timesteps`` more, and times the second part only. Three things differ from the
config, none of them PPO: an ``imitation:`` section is dropped (such a config's PPO then
starts from a fresh network; cloning is not what is timed), the evaluation set is emptied (its exact
references take minutes and are computed once per run folder) and the progress bar is
off. The run folder is a temporary one. ``--n-envs``, ``--timesteps`` and ``--seed``
override the config as ``hetpar train``'s options do; ``--torch-threads`` and ``--set
KEY=VALUE`` (a dotted key of the config, the value read as YAML) change the config
itself, and the first line of the output says what was run. With ``default`` PPO starts
from the bundled clone's weights with the anchored update (``hetpar/agents/anchored.py``);
its ``log_metis`` reward needs the pool's references, which are copied from
``--reward-cache`` (default ``runs/reward-cache``, where ``hetpar train`` keeps them)
into the temporary run folder, or else computed there first (about 3 minutes on 2 cores,
not timed); ``--set finetune.reward=mfu`` times the run without them.

Prints the **timesteps per second** of the timed part (environment steps that PPO
trained on, per second of wall time, rollouts and updates included), and where the main
process's wall time went:

* ``env step``: ``VecEnv.step`` (the workers' steps, their observations, resets at
  episode ends, and the inter-process traffic), or with the overlapped collection
  (``hetpar.agents.rollouts``, the default with worker processes) the waits for one group's
  step while the trainer has nothing else to do;
* ``env masks``: sb3-contrib's ``get_action_masks`` (one more round trip to the workers
  per step, plus whatever masks they build on request);
* ``policy forward``: the policy's forward passes while collecting rollouts (the network,
  the masked distribution, sampling);
* ``rollout rest``: the rest of ``collect_rollouts`` (observations to tensors, the
  rollout buffer, callbacks, advantages);
* ``ppo update``: ``MaskablePPO.train``, the gradient steps;
* ``other``: the rest (TensorBoard logging, checkpoints).

Inside the environment workers (CPU time of their processes, per timestep, summed over
workers): ``action masks`` (``PlanBuilderEnv.action_masks`` wherever it is called),
``observation`` (``_observation``, its masks excluded), ``reset`` and the rest of
``step`` (state update, the finished plan's cost-model score, the wrappers). The number of
training instances whose tables were built during the timed part says how cold it was:
the pool's per-instance tables (cost model, masks) are built on first use.

``--profile N`` runs the main process under cProfile and prints its N functions of
highest own time; with ``--n-envs 1`` (DummyVecEnv) the environment runs in that process
and shows up in the profile too.

Before and after a change, side by side (the script path is absolute, so the base tree
runs this file against its own ``hetpar``):

    python benchmarks/side_by_side.py --base HEAD --rounds 2 \\
        $PWD/benchmarks/train_speed.py --timesteps 8192
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml

_WORKER_KEYS = ("masks", "observation", "reset", "step")


class _TimedEnv(gym.Wrapper):
    """Outermost wrapper of a training environment, in its worker: CPU time of its masks,
    observations, resets and steps, each exclusive of the others it calls."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.cpu = dict.fromkeys(_WORKER_KEYS, 0.0)
        self.steps = 0
        self._stack: list[list[Any]] = []  # [key, start, time of nested timers]
        bare = env.unwrapped
        bare.action_masks = self._timed("masks", bare.action_masks)  # type: ignore[attr-defined]
        bare._observation = self._timed("observation", bare._observation)  # type: ignore

    def _timed(self, key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            frame = [key, time.process_time(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                spent = time.process_time() - frame[1]
                self.cpu[key] += spent - frame[2]
                if self._stack:
                    self._stack[-1][2] += spent

        return call

    def step(self, action: Any) -> Any:
        self.steps += 1
        return self._timed("step", self.env.step)(action)

    def reset(self, **kwargs: Any) -> Any:
        return self._timed("reset", self.env.reset)(**kwargs)

    def action_masks(self) -> Any:
        return self.env.unwrapped.action_masks()  # type: ignore[attr-defined]

    def bench_timing(self) -> dict[str, Any]:
        cache = self.env.unwrapped._cache  # type: ignore[attr-defined]
        # Environments of one worker may share one cache: count each cache once.
        return {"cpu": dict(self.cpu), "steps": self.steps, "instances": len(cache),
                "cache": (os.getpid(), id(cache))}


def _timed_env_fn(make: Callable[[], gym.Env]) -> Callable[[], gym.Env]:
    def timed_make() -> gym.Env:
        return _TimedEnv(make())

    return timed_make


@dataclass
class _Clock:
    """Wall time of the main process's phases, counted from the first rollout that starts
    at ``warmup`` timesteps or later."""

    warmup: int
    on: bool = False
    t_start: float = 0.0
    t_end: float = 0.0
    steps_start: int = 0
    steps_end: int = 0
    wall: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("env step", "env masks", "policy forward", "rollout", "ppo update", "probe"), 0.0))
    vec_env: str = ""
    workers_start: list[dict[str, Any]] = field(default_factory=list)
    workers_end: list[dict[str, Any]] = field(default_factory=list)

    def timed(self, key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[key] += time.perf_counter() - t0

        return call


def _workers(model: Any) -> list[dict[str, Any]]:
    return list(model.env.env_method("bench_timing"))


def _instrument(clock: _Clock) -> None:
    """Timers around the phases of sb3-contrib's MaskablePPO, and the timing wrapper
    around every environment ``hetpar.agents.train`` makes."""
    from sb3_contrib import MaskablePPO
    from sb3_contrib.ppo_mask import ppo_mask
    from stable_baselines3.common.vec_env import VecEnv

    import hetpar.agents.train as train_module

    make_env_fn = train_module._make_env_fn
    train_module._make_env_fn = (  # type: ignore[assignment]
        lambda *a, **k: _timed_env_fn(make_env_fn(*a, **k)))
    ppo_mask.get_action_masks = clock.timed("env masks", ppo_mask.get_action_masks)
    step = VecEnv.step
    VecEnv.step = clock.timed("env step", step)  # type: ignore[method-assign]

    setup = MaskablePPO._setup_model

    def setup_model(self: Any) -> None:
        setup(self)
        self.policy.forward = clock.timed("policy forward", self.policy.forward)

    MaskablePPO._setup_model = setup_model  # type: ignore[method-assign]
    from hetpar.agents.anchored import AnchoredMaskablePPO
    from hetpar.agents.vecenv import GroupedVecEnv

    # The overlapped collection (hetpar.agents.rollouts) waits on one group at a time:
    # that wait is its "env step".
    if hasattr(GroupedVecEnv, "step_group_wait"):  # a tree before it (side_by_side.py)
        GroupedVecEnv.step_group_wait = clock.timed(  # type: ignore[method-assign]
            "env step", GroupedVecEnv.step_group_wait)
    # Both collections: AnchoredMaskablePPO's (which may call sb3-contrib's), timed once.
    depth = [0]
    for cls in (MaskablePPO, AnchoredMaskablePPO):
        if "collect_rollouts" not in vars(cls):
            continue
        def collect_rollouts(self: Any, *args: Any, __collect: Any = cls.collect_rollouts,
                             **kwargs: Any) -> Any:
            if depth[0]:
                return __collect(self, *args, **kwargs)
            if not clock.on and self.num_timesteps >= clock.warmup:
                clock.on, clock.t_start = True, time.perf_counter()
                clock.steps_start = self.num_timesteps
            depth[0] += 1
            try:
                return clock.timed("rollout", __collect)(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        cls.collect_rollouts = collect_rollouts  # type: ignore[method-assign]

    # Both update classes ``hetpar train`` may use (the anchored one for runs that start
    # from a policy), each timed around its own ``train``.
    for cls in (MaskablePPO, AnchoredMaskablePPO):
        cls.train = _timed_update(clock, cls.train)  # type: ignore[method-assign]


def _timed_update(clock: _Clock, update: Callable[[Any], None]) -> Callable[[Any], None]:
    def train(self: Any) -> None:
        clock.timed("ppo update", update)(self)
        if clock.on:
            # The probe's round trip to the workers is left out of the timed part.
            t0 = time.perf_counter()
            clock.workers_end = _workers(self)
            clock.t_end, clock.steps_end = time.perf_counter(), self.num_timesteps
            clock.wall["probe"] += clock.t_end - t0
        else:
            clock.workers_start = _workers(self)
            processes = getattr(self.env, "workers", None)
            if processes is None:  # SubprocVecEnv: a process per environment
                processes = len(getattr(self.env, "processes", ())) or "no"
            clock.vec_env = (f"{type(self.env).__name__}, {self.env.num_envs} environments "
                             f"in {processes} worker processes")

    return train


def _start(cfg: Any) -> str:
    ft = cfg.finetune
    where = ("a fresh network" if ft["init_policy"] is None else
             f"the weights of {ft['init_policy']}")
    extra = [f"reward {ft['reward']}"] + ([f"anchor {ft['anchor_coef']:g}"]
                                          if ft["anchor_coef"] else [])
    return f"{where} ({', '.join(extra)})"


def _config(args: argparse.Namespace) -> Any:
    from hetpar.agents.train import load_train_config, parse_train_config

    cfg = load_train_config(args.config)
    data = cfg.as_dict()
    data.pop("imitation", None)
    data["eval"]["n"] = 0
    data["total_timesteps"] = args.warmup + args.timesteps
    if args.torch_threads is not None:
        data["torch_threads"] = args.torch_threads
    for item in args.set:
        key, _, value = item.partition("=")
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    cfg = parse_train_config(data, cfg.source, name=cfg.name)
    return cfg.with_overrides(timesteps=args.warmup + args.timesteps, seed=args.seed,
                              n_envs=args.n_envs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default", help="training config: file or bundled name")
    ap.add_argument("--timesteps", type=int, default=8192, help="timed PPO timesteps")
    ap.add_argument("--warmup", type=int, default=2048, help="PPO timesteps before timing")
    ap.add_argument("--n-envs", type=int, default=None, help="override the config's n_envs")
    ap.add_argument("--torch-threads", type=int, default=None)
    ap.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="where the environments run (hetpar train --backend)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="change the config, e.g. ppo.n_steps=64 (repeatable)")
    ap.add_argument("--reward-cache", default="runs/reward-cache", metavar="DIR",
                    help="reward references to reuse (hetpar train's cache folder)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile the main process; print its N top functions by own time")
    args = ap.parse_args()

    from hetpar.agents.train import train

    cfg = _config(args)
    clock = _Clock(args.warmup)
    _instrument(clock)
    ppo = cfg.ppo
    print(f"config {cfg.name} (suite {cfg.suite}, pool {cfg.env['instances']} instances), "
          f"PPO from {_start(cfg)}: n_envs {cfg.n_envs}, torch threads {cfg.torch_threads}, "
          f"n_steps {ppo['n_steps']}, batch {ppo['batch_size']}, epochs {ppo['n_epochs']}; "
          f"{args.warmup} warm-up timesteps, then {args.timesteps} timed")
    profiler = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory(prefix="hetpar-train-speed-") as runs:
        if Path(args.reward_cache).is_dir():
            shutil.copytree(args.reward_cache, Path(runs) / "reward-cache")
        if profiler:
            profiler.enable()
        result = train(cfg, run_name="bench", runs_dir=runs, progress=False,
                       backend=args.backend)
        if profiler:
            profiler.disable()
    if result.interrupted or not clock.on:
        raise SystemExit("train_speed: the run ended before the timed part")

    print(f"vector env: {clock.vec_env}")
    steps = clock.steps_end - clock.steps_start
    wall = clock.t_end - clock.t_start - clock.wall["probe"]
    print(f"timesteps/s: {steps / wall:,.0f}  ({steps} timesteps in {wall:.1f} s)")
    w = clock.wall
    parts = {
        "env step (VecEnv.step: workers' steps, observations, IPC)": w["env step"],
        "env masks (get_action_masks round trip)": w["env masks"],
        "policy forward in rollouts": w["policy forward"],
        "rollout rest (tensors, buffer, callbacks, advantages)":
            w["rollout"] - w["env step"] - w["env masks"] - w["policy forward"],
        "ppo update (gradient steps)": w["ppo update"],
        "other (logging, checkpoints)": wall - w["rollout"] - w["ppo update"],
    }
    print("main process wall time, ms per 1000 timesteps:")
    for name, seconds in parts.items():
        print(f"  {name:58s} {1e6 * seconds / steps:8.1f}  {100 * seconds / wall:5.1f}%")
    if clock.workers_start and clock.workers_end:
        cpu = dict.fromkeys(_WORKER_KEYS, 0.0)
        built: dict[Any, int] = {}
        for a, b in zip(clock.workers_start, clock.workers_end):
            for key in _WORKER_KEYS:
                cpu[key] += b["cpu"][key] - a["cpu"][key]
            cache = tuple(b["cache"]) if "cache" in b else id(b)
            built[cache] = b["instances"] - a["instances"]
        total = sum(cpu.values())
        print(f"environments' CPU time in their worker processes, ms per 1000 timesteps "
              f"(summed over {len(clock.workers_end)} environments):")
        names = {"masks": "action masks", "observation": "observation (masks excluded)",
                 "reset": "reset", "step": "step rest (state, reward scoring, wrappers)"}
        for key in _WORKER_KEYS:
            print(f"  {names[key]:58s} {1e6 * cpu[key] / steps:8.1f}  "
                  f"{100 * cpu[key] / max(total, 1e-12):5.1f}%")
        print(f"  {'total':58s} {1e6 * total / steps:8.1f}")
        print(f"training instances built during the timed part: {sum(built.values())} "
              f"(per-instance tables, summed over {len(built)} caches)")
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
        print(out.getvalue())


if __name__ == "__main__":
    main()
