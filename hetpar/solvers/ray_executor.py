"""Running exact-search subtrees as Ray tasks, on one machine or a Ray cluster.

``RayExecutor`` implements ``SearchExecutor`` as ``ProcessExecutor`` does, with Ray in
place of a process pool: the problem goes to the object store once, each task runs
``search_subtree`` in a Ray worker (which keeps its bound tables across the tasks of one
problem), and the incumbent lives in a small actor. Workers read it through a cache
refreshed every ``REFRESH_S`` (a remote call per search node would cost more than the
node) and offer every better value at once, so a plan found anywhere prunes everywhere
within that delay. A Ray worker that dies has its task retried by Ray (``max_retries``);
results already reported stay reported.

Ray is an optional extra (``pip install 'hetpar[ray]'``) and is imported only here.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpar.errors import ConfigError
from hetpar.solvers.bounds import Bounds
from hetpar.solvers.exact import (SearchProblem, Task, TaskResult, few_collections, make_bounds,
                                  search_subtree)
from hetpar.solvers.parallel import _IN_FLIGHT, dispatch

__all__ = ["RayExecutor", "connect", "ray_map", "REFRESH_S"]

REFRESH_S = 0.05  # seconds a worker trusts its cached incumbent
_RETRIES = 3  # Ray's retries of a task whose worker died


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend", "", "ray is not installed: pip install "
                                           "'hetpar[ray]'") from None
    return ray


def _reachable(address: str, timeout: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def _current_cluster() -> str | None:
    """The address ``ray start --head`` on this machine left, as ``address='auto'``
    finds it (the RAY_ADDRESS variable first)."""
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env
    path = Path("/tmp/ray/ray_current_cluster")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def connect(address: str | None, workers: int) -> None:
    """Join the Ray cluster at ``address`` (``auto``: the one started on this machine;
    ``HOST:PORT``), or with None start a local one of ``workers`` CPUs; ConfigError in
    one line when none is reachable (Ray's own connection attempt waits a minute)."""
    ray = _ray()
    if ray.is_initialized():
        return
    if address is None:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
        return
    target = _current_cluster() if address == "auto" else address
    if not target or target.startswith("ray://"):
        if not target:
            raise ConfigError("--address", "", "no Ray cluster started on this machine "
                                               "(start one with: ray start --head)")
    elif not _reachable(target):
        raise ConfigError("--address", "", f"no Ray cluster reachable at {target} (start one "
                                           f"with: ray start --head)")
    try:
        # "auto" itself, not the address it found: Ray then also reads the session's
        # settings (its authentication token among them).
        ray.init(address="auto" if address == "auto" else target, log_to_driver=False,
                 logging_level=logging.ERROR)
    except Exception as exc:  # Ray raises ConnectionError and others
        raise ConfigError("--address", "", f"cannot join the Ray cluster at {target}: "
                                           f"{exc}") from None


def ray_map(fn: Callable[..., Any], calls: Sequence[tuple], in_flight: int,
            on_done: Callable[[int, Any], None], num_cpus: int = 1,
            address: str | None = None) -> None:
    """``fn(*calls[k])`` for every k as Ray tasks of ``num_cpus`` CPUs, ``in_flight`` at
    a time, ``on_done(k, result)`` as each ends (in the order they end); a task whose
    worker dies is retried by Ray, and the tasks in flight are cancelled when the caller
    is interrupted. Joins the cluster at ``address`` first (``connect``)."""
    ray = _ray()
    connect(address, max(1, in_flight) * num_cpus)
    remote = ray.remote(num_cpus=num_cpus, max_retries=_RETRIES)(fn)
    queue = list(enumerate(calls))
    pending: dict[Any, int] = {}
    try:
        while queue or pending:
            while queue and len(pending) < max(1, in_flight):
                k, args = queue.pop(0)
                pending[remote.remote(*args)] = k
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in done:
                on_done(pending.pop(ref), ray.get(ref))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


# ---- in the Ray workers ---------------------------------------------------------------------------
# Per worker process: the bound tables of the problem it last searched (the tables of one
# problem are shared by all its subtrees, as in a ProcessExecutor worker).
_CACHE: dict[str, tuple[SearchProblem, Bounds]] = {}


class _CachedIncumbent:
    """``Incumbent`` through the actor: a value cached for ``REFRESH_S``, offers sent at
    once (and kept locally)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.value = math.inf
        self.read = 0.0

    def get(self) -> float:
        now = time.monotonic()
        if now - self.read > REFRESH_S:
            ray = _ray()
            self.value = min(self.value, ray.get(self.actor.get.remote()))
            self.read = now
        return self.value

    def offer(self, value: float) -> None:
        if value < self.value:
            self.value = value
        self.actor.offer.remote(value)


def _fault() -> None:
    """Fault injection for the tests: with HETPAR_RAY_FAULT=die-once:PATH, the first
    task to create PATH kills its worker process (as a lost machine would)."""
    spec = os.environ.get("HETPAR_RAY_FAULT", "")
    if spec.startswith("die-once:"):
        try:
            fd = os.open(spec.split(":", 1)[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except OSError:
            return
        os.close(fd)
        os._exit(1)


def _run(token: str, problem_box: list[Any], task: Task, actor: Any) -> TaskResult:
    _fault()
    # The problem's reference comes in a list, which Ray does not resolve: a worker
    # fetches and unpickles the problem (its cost model's tables) once, not per task.
    cached = _CACHE.get(token)
    if cached is None:
        _CACHE.clear()
        problem = _ray().get(problem_box[0])
        cached = _CACHE[token] = (problem, make_bounds(problem))
    incumbent = _CachedIncumbent(actor)
    done_read = [0.0, False]

    def stop() -> bool:
        now = time.monotonic()
        if now - done_read[0] > REFRESH_S:
            done_read[0], done_read[1] = now, _ray().get(actor.done.remote())
        return bool(done_read[1])

    with few_collections():
        return search_subtree(cached[0], task, incumbent, cached[1], stop)


class _Best:
    """The incumbent's value, and whether every subtree is searched (a seed still
    running then stops, as with ``ProcessExecutor``)."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.finished = False

    def get(self) -> float:
        return self.value

    def offer(self, value: float) -> None:
        self.value = min(self.value, value)

    def done(self) -> bool:
        return self.finished

    def finish(self) -> None:
        self.finished = True


@dataclass
class RayExecutor:
    """``SearchExecutor`` on Ray. ``address``: None starts a local Ray of ``workers``
    CPUs (or uses the session already started); ``auto`` or ``HOST:PORT`` joins a
    cluster. ``workers``: tasks in flight is ``_IN_FLIGHT`` times it, each task one CPU."""

    workers: int = 2
    address: str | None = None
    _actor: Any = field(default=None, repr=False)

    def run(self, problem: SearchProblem, tasks: Iterable[Task],
            on_result: Callable[[int, TaskResult], None],
            bounds: Bounds | None = None) -> None:
        ray = _ray()
        connect(self.address, self.workers)
        actor = self._actor = ray.remote(num_cpus=0)(_Best).remote(problem.seed_value)
        remote_run = ray.remote(num_cpus=1, max_retries=_RETRIES)(_run)
        token = uuid.uuid4().hex
        problem_ref = ray.put(problem)
        pending: dict[Any, tuple[int, bool]] = {}
        try:
            dispatch(problem, tasks, _IN_FLIGHT * self.workers,
                     lambda task: remote_run.remote(token, [problem_ref], task, actor),
                     lambda refs: [(r, ray.get(r)) for r in ray.wait(
                         refs, num_returns=1, timeout=0.2)[0]],
                     on_result, lambda: actor.finish.remote(), pending)
        except BaseException:
            # Interrupted or failed: the tasks in flight stop now, not when they end.
            for ref in pending:
                ray.cancel(ref, force=True)
            raise

    def incumbent(self) -> float:
        if self._actor is None:
            return math.inf
        return float(_ray().get(self._actor.get.remote()))
