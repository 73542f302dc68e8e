"""Solvers in a child process with a hard stop and a memory cap: the one killable runner.

The exact search's time limit is soft: past it the search still bounds what it left (a
few seconds), and on some instances building a node's bound tables alone takes longer
than the limit. A caller that must go on regardless (``hetpar evaluate`` over a suite,
the training's evaluation references) runs it here: in a child process, in its own
process group (so its search workers go with it), with its address space capped, killed
``grace_s`` seconds after the time limit. A run that is stopped, dies or runs out of
memory answers "no plan" with the reason, never an exception.

``run_isolated`` runs several methods one after the other in one child and keeps each
answer as soon as it is sent (a cheap baseline's survives an exact search that is
stopped). ``run_exact_isolated`` is the exact search alone, as ``hetpar evaluate`` reads
it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from hetpar.costmodel.objective import Objective
from hetpar.errors import HetparError
from hetpar.problem.instance import Instance
from hetpar.problem.problem import DEFAULT_SAMPLES, DEFAULT_SEED, Problem

__all__ = ["IsolatedResult", "run_exact_isolated", "run_isolated"]


@dataclass(frozen=True)
class IsolatedResult:
    """One method's answer from the child (or why there is none)."""

    method: str
    value: float = math.inf  # the objective's value in seconds; inf without a plan
    optimal: bool = False  # proven optimal (``Solution.optimal``)
    gap: float = math.inf  # ``Solution.gap``: 0 when the proven bound meets the value
    wall_s: float | None = None  # seconds of the solve call (None: the child did not answer)
    error: str = ""  # "" when fine
    # What a caller that keeps the answer needs (``hetpar reference build``): the plan
    # (``Plan.to_dict``), the proven bound, the part that found the plan and why the
    # search stopped early ("" when it did not).
    plan: dict[str, Any] | None = None
    lower_bound: float | None = None
    found_by: str = ""
    stopped: str = ""


def run_isolated(problem: Problem, methods: tuple[str, ...] = ("exact",), *,
                 time_limit: float, workers: int = 1, grace_s: float | None = None,
                 memory_gib: float = 8.0, starts: tuple[Any, ...] = ()
                 ) -> dict[str, IsolatedResult]:
    """``solve(problem, method)`` for each of ``methods`` in turn (``exact`` with
    ``time_limit``, ``workers`` and the start plans ``starts``, the others as they are)
    in one child process.

    The child and the search workers it starts are killed ``grace_s`` seconds after
    ``time_limit`` (default max(30, time_limit) seconds), counted from the child's start,
    whatever is still running; its address space is capped at ``memory_gib`` GiB (0: no
    cap). Returns every method's ``IsolatedResult``, in the order given."""
    import os
    import signal

    from hetpar.procs import thread_safe_context

    grace = max(30.0, time_limit) if grace_s is None else grace_s
    hard = time_limit + grace
    # Not fork: the caller may hold threads (torch, a training loop). Children fork from
    # a server that has the solvers imported (once per process).
    ctx = thread_safe_context()
    recv, send = ctx.Pipe(duplex=False)
    # A fresh copy: the cost model and plan space it may hold are rebuilt in the child
    # rather than pickled.
    proc = ctx.Process(target=_child, daemon=False,
                       args=(send, dataclasses.replace(problem), tuple(methods), time_limit,
                             workers, int(memory_gib * 2**30), tuple(starts)))
    proc.start()
    send.close()
    out: dict[str, IsolatedResult] = {}
    why = ""
    try:
        stop_at = time.perf_counter() + hard
        while len(out) < len(methods):
            left = stop_at - time.perf_counter()
            if left <= 0 or not recv.poll(left):
                why = (f"did not return within {hard:.0f} s (time limit {time_limit:g} s + "
                       f"{grace:.0f} s grace); stopped")
                break
            try:
                got = recv.recv()
            except EOFError:
                proc.join(5)
                why = f"search process died (exit code {proc.exitcode}; out of memory?)"
                break
            out[got["method"]] = IsolatedResult(**got)
    finally:
        if proc.pid is not None:
            try:  # the child and the search workers it started (its process group)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if proc.is_alive():  # stopped before it made its own group
                proc.kill()
        proc.join(5)
        recv.close()
    return {m: out.get(m) or IsolatedResult(m, error=f"{m} {why}") for m in methods}


def run_exact_isolated(problem: Problem | Instance, objective: Objective | str | None = None,
                       samples: int | None = None, seed: int | None = None,
                       time_limit: float = 60.0, workers: int = 1, *,
                       grace_s: float | None = None, memory_gib: float = 8.0,
                       ) -> dict[str, Any]:
    """``solve(problem, "exact")`` in a child process with a hard stop (``run_isolated``).

    ``problem``: a ``Problem``, or an ``Instance`` with the problem's ``objective``,
    ``samples`` and ``seed`` (``Problem.from_instance``). Returns ``value_s`` (inf
    without a plan), ``optimal``, ``error`` ("" when fine) and, when the search
    answered, ``wall_s``."""
    if isinstance(problem, Instance):
        problem = Problem.from_instance(
            problem, objective=objective if objective is not None else "mean",
            samples=DEFAULT_SAMPLES if samples is None else samples,
            seed=DEFAULT_SEED if seed is None else seed)
    elif (objective, samples, seed) != (None, None, None):
        raise TypeError("objective, samples and seed are the Problem's own: give them "
                        "with an Instance, not with a Problem")
    res = run_isolated(problem, ("exact",), time_limit=time_limit, workers=workers,
                       grace_s=grace_s, memory_gib=memory_gib)["exact"]
    out: dict[str, Any] = {"value_s": res.value, "optimal": res.optimal, "error": res.error}
    if res.wall_s is not None:
        out["wall_s"] = res.wall_s
    return out


def _child(conn: Any, problem: Problem, methods: tuple[str, ...], time_limit: float,
           workers: int, memory_bytes: int, starts: tuple[Any, ...] = ()) -> None:
    """Body of the child process of ``run_isolated``: each method's answer is sent as
    soon as it is known."""
    import os
    import resource

    os.setsid()  # its own process group: the parent stops it together with its workers
    if memory_bytes > 0:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        except (ValueError, OSError):  # pragma: no cover - a hard limit below ours
            pass
    from hetpar.solvers.api import solve

    for method in methods:
        out: dict[str, Any] = {"method": method}
        start = time.perf_counter()
        try:
            exact = method == "exact"
            sol = solve(problem, method, workers=workers if exact else 1,
                        time_limit=time_limit if exact else None,
                        starts=starts if exact else ())
            out.update(wall_s=time.perf_counter() - start, optimal=sol.optimal,
                       gap=sol.gap, lower_bound=sol.lower_bound, found_by=sol.found_by,
                       stopped=sol.certificate.stopped if sol.certificate else "")
            if sol.found and sol.plan is not None:
                out.update(value=sol.value, plan=sol.plan.to_dict())
            else:
                out["error"] = "no plan found"
        except HetparError as exc:
            out.update(wall_s=time.perf_counter() - start,
                       error=" ".join(str(exc).split()))
        except MemoryError:
            out.update(wall_s=time.perf_counter() - start,
                       error=f"out of memory (limit {memory_bytes / 2**30:.0f} GiB)")
        try:
            conn.send(out)
        except (BrokenPipeError, OSError):  # the parent stopped waiting
            return
    conn.close()
