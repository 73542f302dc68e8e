"""A training run's folder is owned by one process, and a stop never loses what it saved.

* ``RunLock``: ``runs/<name>/.lock`` holds the pid of the ``hetpar train`` that writes the
  folder; a second run on it is refused with one line while that process lives, and takes
  the lock over once it has died (a crash or ``kill -9`` leaves the file behind).
* ``stop_on_sigterm``: SIGTERM (what ``kill``, ``timeout``, Slurm and container runtimes
  send) becomes the ``KeyboardInterrupt`` that Ctrl-C raises, so both leave a resumable
  checkpoint.
* ``signals_held``: while a checkpoint is written after an interrupt, a second Ctrl-C or
  SIGTERM waits for the write instead of cutting it.
* ``stale_temporaries``: the half-written files a ``kill -9`` during a save left.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from hetpar.errors import ConfigError

__all__ = ["LOCK_FILE", "RunLock", "stop_on_sigterm", "signals_held", "stale_temporaries",
           "clear_run_folder"]

LOCK_FILE = ".lock"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's live process
        return True
    except OSError as exc:
        return exc.errno != errno.ESRCH
    return True


class RunLock:
    """Exclusive ownership of a run folder for the life of this object (a context
    manager): ``acquire`` creates ``LOCK_FILE`` atomically with this pid in it."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.held = False

    def acquire(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and owner != os.getpid() and _alive(owner):
                    raise ConfigError(str(self.run_dir), "",
                                      f"in use by another 'hetpar train' (pid {owner}, "
                                      f"{self.path}); wait for it to end or pick another "
                                      "--run-name") from None
                # Its owner is gone: take the lock over (a crash left it).
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{os.getpid()}\n")
            self.held = True
            return self
        raise ConfigError(str(self.run_dir), "", f"cannot take the lock {self.path}")

    def _owner(self) -> int | None:
        try:
            return int(self.path.read_text().strip() or "0")
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.held and self._owner() == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` inside the block (main thread only; elsewhere
    the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def signals_held() -> Iterator[list[int]]:
    """SIGINT and SIGTERM are recorded, not acted on, inside the block; the list it yields
    names those that came."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return

    def record(signum: int, frame: FrameType | None) -> None:
        came.append(signum)

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield came
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def stale_temporaries(run_dir: Path) -> list[Path]:
    """Half-written policy files (``save_policy``'s ``.<name>.<pid>.tmp``) in a run
    folder whose writer is gone."""
    found = []
    for p in [*run_dir.glob(".*.tmp"), *run_dir.glob("checkpoints/.*.tmp")]:
        pid = p.name.rsplit(".", 2)[-2]
        if not (pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid))):
            found.append(p)
    return found


def clear_run_folder(run_dir: Path) -> None:
    """Remove what an earlier run saved in ``run_dir`` (``--overwrite``), keeping the lock."""
    for p in run_dir.iterdir():
        if p.name == LOCK_FILE:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
