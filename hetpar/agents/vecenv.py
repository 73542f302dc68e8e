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

__all__ = ["GroupedVecEnv", "RayVecEnv", "EnvGroup", "default_workers"]

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


class EnvGroup:
    """Several environments stepped in turn, answering with stacked arrays and the new
    states' action masks: what a ``GroupedVecEnv`` worker process (or a ``RayVecEnv``
    actor) holds."""

    def __init__(self, fns: Sequence[Callable[[], gym.Env]]) -> None:
        self.envs = [_patch_env(fn()) for fn in fns]
        # Environments of one group share their per-instance tables where they can (the
        # same instances and settings): each instance's are then built once per group.
        first = self.envs[0].unwrapped
        for env in self.envs[1:]:
            if hasattr(env.unwrapped, "share_contexts") and hasattr(first, "share_contexts"):
                env.unwrapped.share_contexts(first)
        # Each environment's last reset info, sent with every step (as SubprocVecEnv does).
        self.reset_infos: list[dict[str, Any]] = [{} for _ in self.envs]

    def step(self, actions: Sequence[Any]) -> tuple:
        observations, rewards, dones, infos = [], [], [], []
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            obs, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            info["TimeLimit.truncated"] = truncated and not terminated
            if done:
                info["terminal_observation"] = obs
                obs, self.reset_infos[i] = env.reset()
            observations.append(obs)
            rewards.append(reward)
            dones.append(done)
            infos.append(info)
        return (_stack(observations), rewards, dones, infos, list(self.reset_infos),
                np.stack([_masks(env) for env in self.envs]))

    def reset(self, seeds_options: Sequence[tuple[Any, Any]]) -> tuple:
        observations = []
        for i, (seed, options) in enumerate(seeds_options):
            obs, self.reset_infos[i] = self.envs[i].reset(
                seed=seed, **({"options": options} if options else {}))
            observations.append(obs)
        return (_stack(observations), list(self.reset_infos),
                np.stack([_masks(env) for env in self.envs]))

    def env_method(self, local: Sequence[int], name: str, args: tuple, kwargs: dict) -> list:
        return [self.envs[i].get_wrapper_attr(name)(*args, **kwargs) for i in local]

    def get_attr(self, local: Sequence[int], name: str) -> list:
        return [self.envs[i].get_wrapper_attr(name) for i in local]

    def has_attr(self, name: str) -> bool:
        found = True
        for env in self.envs:
            try:
                env.get_wrapper_attr(name)
            except AttributeError:
                found = False
        return found

    def set_attr(self, local: Sequence[int], name: str, value: Any) -> list:
        for i in local:
            setattr(self.envs[i], name, value)
        return [None] * len(local)

    def is_wrapped(self, local: Sequence[int], wrapper: type) -> list:
        from stable_baselines3.common.env_util import is_wrapped

        return [is_wrapped(self.envs[i], wrapper) for i in local]

    def render(self) -> list:
        return [env.render() for env in self.envs]

    def spaces(self) -> tuple:
        return self.envs[0].observation_space, self.envs[0].action_space

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def handle(self, cmd: str, data: Any) -> Any:
        """One command of the vectorised environment (``GroupedVecEnv._ask``'s)."""
        if cmd == "step":
            return self.step(data)
        if cmd == "reset":
            return self.reset(data)
        if cmd == "env_method":
            return self.env_method(*data)
        if cmd == "get_attr":
            return self.get_attr(*data)
        if cmd == "has_attr":
            return self.has_attr(data)
        if cmd == "set_attr":
            return self.set_attr(*data)
        if cmd == "is_wrapped":
            return self.is_wrapped(*data)
        if cmd == "render":
            return self.render()
        if cmd == "get_spaces":
            return self.spaces()
        raise NotImplementedError(f"{cmd!r} is not a command of the worker")


def _worker(remote: Any, parent_remote: Any, fns: CloudpickleWrapper) -> None:
    parent_remote.close()
    group = EnvGroup(fns.var)
    while True:
        try:
            cmd, data = remote.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "close":
            group.close()
            remote.close()
            break
        remote.send(group.handle(cmd, data))


class GroupedVecEnv(VecEnv):
    """``len(env_fns)`` environments in ``workers`` subprocesses (contiguous groups:
    environments ``0..k-1`` in the first), stepped with one message per worker; each
    reply carries the new states' action masks. The environments must have an
    ``action_masks`` method (wrappers included) and ``Dict`` observations."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], workers: int | None = None,
                 start_method: str | None = None) -> None:
        n = self._plan_groups(env_fns, workers)
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() \
                else "spawn"
        ctx = mp.get_context(start_method)
        self.remotes, work_remotes = zip(*[ctx.Pipe() for _ in self._groups])
        self.processes = []
        for group, work_remote, remote in zip(self._groups, work_remotes, self.remotes):
            fns = CloudpickleWrapper([env_fns[i] for i in group])
            # daemon: a crashed trainer must not leave workers behind.
            process = ctx.Process(target=_worker, args=(work_remote, remote, fns), daemon=True)
            process.start()
            self.processes.append(process)
            work_remote.close()
        self._start(n)

    def _plan_groups(self, env_fns: Sequence[Callable[[], gym.Env]],
                     workers: int | None) -> int:
        n = len(env_fns)
        if n < 1:
            raise ValueError(f"{type(self).__name__} needs at least one environment")
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
        return n

    def _start(self, n: int) -> None:
        self.waiting = False
        self.closed = False
        self._group_pending: dict[int, Any] = {}
        self._masks: np.ndarray | None = None
        observation_space, action_space = self._collect([self._submit(0, "get_spaces", None)])[0]
        if not isinstance(observation_space, gym.spaces.Dict):
            raise ValueError(f"{type(self).__name__} stacks Dict observations only")
        super().__init__(n, observation_space, action_space)

    # How commands reach a group and come back (a pipe to a process here; ``RayVecEnv``:
    # an actor's method).
    def _submit(self, worker: int, cmd: str, data: Any) -> Any:
        self.remotes[worker].send((cmd, data))
        return worker

    def _collect(self, handles: Sequence[Any]) -> list[Any]:
        return [self.remotes[w].recv() for w in handles]

    @property
    def workers(self) -> int:
        return len(self._groups)

    # ---- stepping ------------------------------------------------------------------------
    def _idle(self, what: str) -> None:
        """Refuse ``what`` while a group's step is unanswered: its reply would be read
        as the answer to ``what``."""
        if self._group_pending:
            raise RuntimeError(f"{type(self).__name__}: {what} while groups "
                               f"{sorted(self._group_pending)} are stepping")

    def step_async(self, actions: np.ndarray) -> None:
        self._idle("step")
        self._pending = [self._submit(w, "step", [actions[i] for i in group])
                         for w, group in enumerate(self._groups)]
        self.waiting = True
        self._masks = None

    def step_wait(self) -> VecEnvStepReturn:
        results = self._collect(self._pending)
        self.waiting = False
        obs = {key: np.concatenate([r[0][key] for r in results]) for key in results[0][0]}
        # As SubprocVecEnv stacks them (float64 rewards).
        rewards = np.stack([x for r in results for x in r[1]])
        dones = np.stack([x for r in results for x in r[2]])
        infos = [x for r in results for x in r[3]]
        self.reset_infos = [x for r in results for x in r[4]]
        self._masks = np.concatenate([r[5] for r in results])
        return obs, rewards, dones, infos

    # ---- one group at a time (``hetpar.agents.rollouts``: a group steps while the
    # trainer computes the next group's actions) ------------------------------------------
    @property
    def groups(self) -> list[range]:
        """The environments each worker holds (contiguous index ranges, in order)."""
        return list(self._groups)

    def step_group_async(self, worker: int, actions: Sequence[Any]) -> None:
        """Send the actions of ``worker``'s environments (in their order); the other
        groups are not stepped. ``step_group_wait(worker)`` collects the answer."""
        if self.waiting or worker in self._group_pending:
            raise RuntimeError(f"group {worker} is already stepping")
        self._group_pending[worker] = self._submit(worker, "step", list(actions))
        self._masks = None

    def step_group_wait(self, worker: int) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                    np.ndarray, list[dict[str, Any]],
                                                    np.ndarray]:
        """``worker``'s answer to ``step_group_async``: its environments' observations,
        rewards, dones, infos and the new states' action masks, as ``step_wait`` gives
        them for all environments."""
        result = self._collect([self._group_pending.pop(worker)])[0]
        group = self._groups[worker]
        self.reset_infos[group.start:group.stop] = result[4]
        return (result[0], np.stack(result[1]), np.stack(result[2]), result[3], result[5])

    def reset(self) -> VecEnvObs:
        self._idle("reset")
        results = self._collect([
            self._submit(w, "reset", [(self._seeds[i], self._options[i]) for i in group])
            for w, group in enumerate(self._groups)])
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = [x for r in results for x in r[1]]
        self._masks = np.concatenate([r[2] for r in results])
        return {key: np.concatenate([r[0][key] for r in results]) for key in results[0][0]}

    def close(self) -> None:
        if self.closed:
            return
        if self.waiting:
            self._collect(self._pending)
        # A group step a stopped rollout left unanswered (Ctrl-C mid-collection).
        self._collect(list(self._group_pending.values()))
        self._group_pending.clear()
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
        self._idle(cmd)
        wanted = list(self._get_indices(indices))
        asked = self._by_worker(wanted)
        handles = [self._submit(worker, cmd, (local, *payload)) for worker, local in asked.items()]
        answers = {worker: dict(zip(local, reply))
                   for (worker, local), reply in zip(asked.items(), self._collect(handles))}
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
        self._idle("has_attr")
        return all(self._collect([self._submit(w, "has_attr", attr_name)
                                  for w in range(self.workers)]))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper],
                       indices: VecEnvIndices = None) -> list[bool]:
        return self._ask("is_wrapped", indices, wrapper_class)

    def get_images(self) -> Sequence[np.ndarray | None]:
        self._idle("render")
        replies = self._collect([self._submit(w, "render", None) for w in range(self.workers)])
        return [image for reply in replies for image in reply]


class RayVecEnv(GroupedVecEnv):
    """``GroupedVecEnv`` with its groups in Ray actors (one CPU each) instead of local
    processes, on the cluster ``hetpar.solvers.ray_executor.connect`` joined: the
    environments' side of training spread over machines, the learner in this process.
    Environment ``i`` computes what it computes in a ``GroupedVecEnv`` (tested)."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], workers: int | None = None,
                 address: str | None = None) -> None:
        from hetpar.solvers.ray_executor import _ray, connect

        n = self._plan_groups(env_fns, workers)
        connect(address, len(self._groups))
        self._ray = _ray()
        actor = self._ray.remote(num_cpus=1)(EnvGroup)
        # Each actor builds its environments from the factories (cloudpickled by Ray).
        self.actors = [actor.remote([env_fns[i] for i in group]) for group in self._groups]
        self._start(n)

    def _submit(self, worker: int, cmd: str, data: Any) -> Any:
        return self.actors[worker].handle.remote(cmd, data)

    def _collect(self, handles: Sequence[Any]) -> list[Any]:
        return list(self._ray.get(list(handles)))

    def close(self) -> None:
        if self.closed:
            return
        if self.waiting:
            self._collect(self._pending)
        self._collect(list(self._group_pending.values()))
        self._group_pending.clear()
        self._ray.get([a.close.remote() for a in self.actors])
        for a in self.actors:
            self._ray.kill(a)
        self.closed = True
