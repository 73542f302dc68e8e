"""Worker processes started without ``fork``.

A process that holds threads (torch's, a Ray driver's gRPC and core-worker threads, a
training loop's) must not fork: the child inherits locks held by threads that do not
exist in it, and a driver's open connections. The trainer's expert-plan and reward
pools start their workers from a fork server instead (spawned where there is none),
which has the solvers imported once; so does the isolated exact search
(``hetpar/solvers/isolated.py``).
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

__all__ = ["thread_safe_context"]


def thread_safe_context(preload: tuple[str, ...] = ("hetpar.solvers.api",
                                                    "hetpar.problem")) -> Any:
    """A multiprocessing context whose children do not fork the caller: ``forkserver``
    (with ``preload`` imported in the server) where the platform has it, else ``spawn``."""
    if "forkserver" in mp.get_all_start_methods():
        ctx: Any = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        return ctx
    return mp.get_context("spawn")
