"""SIGTERM (kill, timeout, Slurm) ends a command as Ctrl-C does: no search worker is left
running after ``hetpar`` has gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_stops_exact_and_its_workers() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetpar", "solve", "--cluster", "cloud-mixed", "--model",
         "llama2-7b", "--training", "llama-bf16", "--method", "exact", "--workers", "2",
         "--time-limit", "120", "--no-policy-start", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        end = time.monotonic() + 90
        while len(_children(proc.pid)) < 2:  # the search's worker processes are up
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "no search workers appeared"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert "Traceback" not in err
        end = time.monotonic() + 10
        while _group_alive(proc.pid) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _group_alive(proc.pid), "search workers outlived hetpar"
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
