"""Running exact-search subtrees in worker processes that share the incumbent.

``ProcessExecutor`` implements ``SearchExecutor`` over ``concurrent.futures``: every
worker process receives the problem once (initializer), keeps its own bound caches
across tasks, and reads and lowers one shared double, the incumbent's value, so a good
plan found by one worker prunes the others at once.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from hetpar.solvers.bounds import Bounds
from hetpar.solvers.exact import (
    SearchProblem,
    Task,
    TaskResult,
    few_collections,
    make_bounds,
    search_subtree,
)

__all__ = ["ProcessExecutor", "SharedIncumbent", "dispatch"]


@dataclass
class SharedIncumbent:
    """The incumbent's value in shared memory."""

    cell: object  # multiprocessing Value('d')

    def get(self) -> float:
        return self.cell.value  # type: ignore[attr-defined]

    def offer(self, value: float) -> None:
        with self.cell.get_lock():  # type: ignore[attr-defined]
            if value < self.cell.value:  # type: ignore[attr-defined]
                self.cell.value = value  # type: ignore[attr-defined]


# Tasks in flight per worker: enough that a worker never waits for its next task.
_IN_FLIGHT = 4

# One per worker process, set by the pool's initializer: the problem travels to each
# worker once instead of with every task.
_WORKER: dict[str, object] = {}


def _init_worker(problem: SearchProblem, cell: object, done: object) -> None:
    _WORKER["problem"] = problem
    _WORKER["incumbent"] = SharedIncumbent(cell)
    _WORKER["bounds"] = make_bounds(problem)
    _WORKER["done"] = done.is_set  # type: ignore[attr-defined]


def _run_task(task: Task) -> TaskResult:
    with few_collections():  # as in the caller's search; a spawned worker has its own gc
        return search_subtree(_WORKER["problem"], task,  # type: ignore[arg-type]
                              _WORKER["incumbent"], _WORKER["bounds"],  # type: ignore[arg-type]
                              _WORKER["done"])  # type: ignore[arg-type]


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    # The executor has no public way to stop a running task; its worker processes are
    # in ``_processes`` (CPython 3.8+). SIGKILL, not SIGTERM: a worker forked a moment
    # before still runs the parent's SIGTERM handler, which raises in it and printed a
    # worker's traceback under `hetpar solve` (tests/test_signals.py, now and then).
    # Workers hold nothing to save: their results reach the caller or are not wanted.
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        try:
            proc.kill()
        except (OSError, ValueError):
            pass


def dispatch(problem: SearchProblem, tasks: Iterable[Task], window: int,
             submit: Callable[[Task], Any],
             wait_some: Callable[[list[Any]], list[tuple[Any, TaskResult]]],
             on_result: Callable[[int, TaskResult], None],
             subtrees_done: Callable[[], None],
             pending: dict[Any, tuple[int, bool]] | None = None) -> None:
    """Run ``tasks`` through a backend: ``submit(task)`` sends one and returns its
    handle, ``wait_some(handles)`` returns (handle, result) of those that ended (after a
    short wait); ``subtrees_done()`` is called once every subtree sent has answered and
    none is left to send. ``pending`` (handle -> (index, is a seed)): the caller's, to
    cancel what is in flight when it is interrupted.

    Tasks go out ``window`` at a time, taken from ``tasks`` as they go (it may be lazy:
    millions of first stages): submitting hundreds of thousands at once kept the caller
    busy for longer than a time limit, and past the deadline a task not yet sent is
    simply not sent. The seeds (first) go out whatever the clock says: their plans are
    the answer of a search stopped before its first subtree."""
    pending = {} if pending is None else pending
    source = enumerate(tasks)
    held: tuple[int, Task] | None = None  # taken from ``source``, not yet sent
    exhausted = False
    subtrees = 0  # subtree tasks sent and not yet answered
    while True:
        while len(pending) < window:
            if held is None:
                held = next(source, None)
                if held is None:
                    exhausted = True
                    break
            i, task = held
            if not task.seed and time.time() > problem.deadline:
                break
            pending[submit(task)] = (i, bool(task.seed))
            subtrees += not task.seed
            held = None
        if not pending:
            break
        for handle, result in wait_some(list(pending)):
            i, seed = pending.pop(handle)
            subtrees -= not seed
            on_result(i, result)
        if subtrees == 0 and (exhausted or time.time() > problem.deadline):
            subtrees_done()


@dataclass
class ProcessExecutor:
    workers: int = 2
    _cell: object = field(default=None)

    def run(self, problem: SearchProblem, tasks: Iterable[Task],
            on_result: Callable[[int, TaskResult], None],
            bounds: Bounds | None = None) -> None:
        # ``bounds`` is not used: each worker builds its own tables (the caller's would
        # travel pickled, and the search does not rank subtrees for several workers).
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        self._cell = ctx.Value("d", problem.seed_value)
        # Set once every subtree is searched: a seed still running (the dive) can only
        # offer a plan the search has already matched, so it ends instead of holding up
        # the answer (on a 1-second proof the dive took most of one worker's time).
        subtrees_done = ctx.Event()
        pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(problem, self._cell, subtrees_done))
        try:
            dispatch(problem, tasks, _IN_FLIGHT * self.workers,
                     lambda task: pool.submit(_run_task, task),
                     lambda handles: [(f, f.result()) for f in wait(
                         handles, timeout=0.2, return_when=FIRST_COMPLETED)[0]],
                     on_result, subtrees_done.set)
        except BaseException:
            # Interrupted (Ctrl-C; SIGTERM, which only this process receives) or failed:
            # the workers stop now rather than when their subtrees end, and none is left
            # running after this process has gone.
            _terminate_workers(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def incumbent(self) -> float:
        return math.inf if self._cell is None else self._cell.value  # type: ignore[attr-defined]
