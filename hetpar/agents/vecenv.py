"""``GroupedVecEnv``: training environments, several per worker process, masks sent with
each step.

SB3's ``SubprocVecEnv`` runs one environment per process and MaskablePPO asks every
process for its action masks in a second round trip after each step. With more
environments than cores (what makes the policy's batched forward pass cheap per
timestep) that is a process per environment, each woken twice per step. Here ``workers``
processes (by default one per core) each step their share of the environments in turn,
compute the action masks of the states the steps lead to, and answer with one message
of stacked arrays; ``env_method("action_masks")``, what sb3-contrib's
``get_action_masks`` calls, then answers from those masks without asking the workers.

Environment ``i`` is the same environment, with the same seed and the same episodes
given the same actions, as ``SubprocVecEnv``'s environment ``i``: how environments are
grouped into processes changes nothing they compute (tested).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (CloudpickleWrapper, VecEnv,
                                                           VecEnvIndices, VecEnvObs,
                                                           VecEnvStepReturn)
from stable_baselines3.common.vec_env.patch_gym import _patch_env

__all__ = ["GroupedVecEnv", "default_workers"]

_MASKS = "action_masks"


def default_workers(n_envs: int) -> int:
    """One worker process per core this process may run on, at most one per environment."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(n_envs, cores))


def _stack(observations: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.stack([o[key] for o in observations]) for key in observations[0]}


def _masks(env: gym.Env) -> np.ndarray:
    return np.asarray(env.get_wrapper_attr(_MASKS)())


def _worker(remote: Any, parent_remote: Any, fns: CloudpickleWrapper) -> None:
    from stable_baselines3.common.env_util import is_wrapped

    parent_remote.close()
    envs = [_patch_env(fn()) for fn in fns.var]
    # Environments of one process share their per-instance tables where they can (the
    # same instances and settings): each instance's are then built once per process.
    first = envs[0].unwrapped
    for env in envs[1:]:
        if hasattr(env.unwrapped, "share_contexts") and hasattr(first, "share_contexts"):
            env.unwrapped.share_contexts(first)
    # Each environment's last reset info, sent with every step (as SubprocVecEnv does).
    reset_infos: list[dict[str, Any]] = [{} for _ in envs]
    while True:
        try:
            cmd, data = remote.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "step":
            observations, rewards, dones, infos = [], [], [], []
            for i, (env, action) in enumerate(zip(envs, data)):
                obs, reward, terminated, truncated, info = env.step(action)
                done = terminated or truncated
                info["TimeLimit.truncated"] = truncated and not terminated
                if done:
                    info["terminal_observation"] = obs
                    obs, reset_infos[i] = env.reset()
                observations.append(obs)
                rewards.append(reward)
                dones.append(done)
                infos.append(info)
            remote.send((_stack(observations), rewards, dones, infos, list(reset_infos),
                         np.stack([_masks(env) for env in envs])))
        elif cmd == "reset":
            observations = []
            for i, (seed, options) in enumerate(data):
                obs, reset_infos[i] = envs[i].reset(
                    seed=seed, **({"options": options} if options else {}))
                observations.append(obs)
            remote.send((_stack(observations), list(reset_infos),
                         np.stack([_masks(env) for env in envs])))
        elif cmd == "env_method":
            local, name, args, kwargs = data
            remote.send([envs[i].get_wrapper_attr(name)(*args, **kwargs) for i in local])
        elif cmd == "get_attr":
            local, name = data
            remote.send([envs[i].get_wrapper_attr(name) for i in local])
        elif cmd == "has_attr":
            found = True
            for env in envs:
                try:
                    env.get_wrapper_attr(data)
                except AttributeError:
                    found = False
            remote.send(found)
        elif cmd == "set_attr":
            local, name, value = data
            for i in local:
                setattr(envs[i], name, value)
            remote.send([None] * len(local))
        elif cmd == "is_wrapped":
            local, wrapper = data
            remote.send([is_wrapped(envs[i], wrapper) for i in local])
        elif cmd == "render":
            remote.send([env.render() for env in envs])
        elif cmd == "get_spaces":
            remote.send((envs[0].observation_space, envs[0].action_space))
        elif cmd == "close":
            for env in envs:
                env.close()
            remote.close()
            break
        else:
            raise NotImplementedError(f"{cmd!r} is not a command of the worker")


class GroupedVecEnv(VecEnv):
    """``len(env_fns)`` environments in ``workers`` subprocesses (contiguous groups:
    environments ``0..k-1`` in the first), stepped with one message per worker; each
    reply carries the new states' action masks. The environments must have an
    ``action_masks`` method (wrappers included) and ``Dict`` observations."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], workers: int | None = None,
                 start_method: str | None = None) -> None:
        n = len(env_fns)
        if n < 1:
            raise ValueError("GroupedVecEnv needs at least one environment")
        workers = default_workers(n) if workers is None else max(1, min(int(workers), n))
        # Contiguous groups as even as they can be: the first n % workers get one more.
        sizes = [n // workers + (w < n % workers) for w in range(workers)]
        self._groups: list[range] = []
        start = 0
        for size in sizes:
            self._groups.append(range(start, start + size))
            start += size
        self._where = [(w, i - group.start) for w, group in enumerate(self._groups)
                       for i in group]
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() \
                else "spawn"
        ctx = mp.get_context(start_method)
        self.remotes, work_remotes = zip(*[ctx.Pipe() for _ in range(workers)])
        self.processes = []
        for group, work_remote, remote in zip(self._groups, work_remotes, self.remotes):
            fns = CloudpickleWrapper([env_fns[i] for i in group])
            # daemon: a crashed trainer must not leave workers behind.
            process = ctx.Process(target=_worker, args=(work_remote, remote, fns), daemon=True)
            process.start()
            self.processes.append(process)
            work_remote.close()
        self.waiting = False
        self.closed = False
        self._masks: np.ndarray | None = None
        self.remotes[0].send(("get_spaces", None))
        observation_space, action_space = self.remotes[0].recv()
        if not isinstance(observation_space, gym.spaces.Dict):
            raise ValueError("GroupedVecEnv stacks Dict observations only")
        super().__init__(n, observation_space, action_space)

    @property
    def workers(self) -> int:
        return len(self.remotes)

    # ---- stepping ------------------------------------------------------------------------
    def step_async(self, actions: np.ndarray) -> None:
        for remote, group in zip(self.remotes, self._groups):
            remote.send(("step", [actions[i] for i in group]))
        self.waiting = True
        self._masks = None

    def step_wait(self) -> VecEnvStepReturn:
        results = [remote.recv() for remote in self.remotes]
        self.waiting = False
        obs = {key: np.concatenate([r[0][key] for r in results]) for key in results[0][0]}
        # As SubprocVecEnv stacks them (float64 rewards).
        rewards = np.stack([x for r in results for x in r[1]])
        dones = np.stack([x for r in results for x in r[2]])
        infos = [x for r in results for x in r[3]]
        self.reset_infos = [x for r in results for x in r[4]]
        self._masks = np.concatenate([r[5] for r in results])
        return obs, rewards, dones, infos

    def reset(self) -> VecEnvObs:
        for remote, group in zip(self.remotes, self._groups):
            remote.send(("reset", [(self._seeds[i], self._options[i]) for i in group]))
        results = [remote.recv() for remote in self.remotes]
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = [x for r in results for x in r[1]]
        self._masks = np.concatenate([r[2] for r in results])
        return {key: np.concatenate([r[0][key] for r in results]) for key in results[0][0]}

    def close(self) -> None:
        if self.closed:
            return
        if self.waiting:
            for remote in self.remotes:
                remote.recv()
        for remote in self.remotes:
            remote.send(("close", None))
        for process in self.processes:
            process.join()
        for remote in self.remotes:
            remote.close()
        self.closed = True

    # ---- what else a VecEnv offers -------------------------------------------------------
    def _by_worker(self, indices: VecEnvIndices) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i in self._get_indices(indices):
            worker, local = self._where[i]
            out.setdefault(worker, []).append(local)
        return out

    def _ask(self, cmd: str, indices: VecEnvIndices, *payload: Any) -> list[Any]:
        """One command to the workers holding ``indices``; answers in index order."""
        wanted = list(self._get_indices(indices))
        asked = self._by_worker(wanted)
        for worker, local in asked.items():
            self.remotes[worker].send((cmd, (local, *payload)))
        answers = {worker: dict(zip(local, self.remotes[worker].recv()))
                   for worker, local in asked.items()}
        return [answers[self._where[i][0]][self._where[i][1]] for i in wanted]

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        if method_name == _MASKS and self._masks is not None and not method_args \
                and not method_kwargs:
            # The masks of the current states came with the last step or reset.
            return list(self._masks[list(self._get_indices(indices))])
        # Anything else may change an environment's state: ask again for masks after it.
        self._masks = None
        return self._ask("env_method", indices, method_name, method_args, method_kwargs)

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._ask("get_attr", indices, attr_name)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._masks = None
        self._ask("set_attr", indices, attr_name, value)

    def has_attr(self, attr_name: str) -> bool:
        for remote in self.remotes:
            remote.send(("has_attr", attr_name))
        return all([remote.recv() for remote in self.remotes])

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper],
                       indices: VecEnvIndices = None) -> list[bool]:
        return self._ask("is_wrapped", indices, wrapper_class)

    def get_images(self) -> Sequence[np.ndarray | None]:
        for remote in self.remotes:
            remote.send(("render", None))
        return [image for remote in self.remotes for image in remote.recv()]
