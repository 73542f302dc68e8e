"""Run one benchmark on two revisions of hetpar, alternately, in one run.

    python benchmarks/side_by_side.py --base HEAD~1 [--rounds 2] costmodel_speed.py [ARGS...]

Each side runs its own copy of ``benchmarks/NAME`` against its own ``hetpar`` (the base
revision from a temporary git worktree, the other side from this working tree), one
after the other and ``--rounds`` times, so that both see the same machine load. Lines of
the two outputs that read the same but for their numbers are paired (in order), and the
ratio of each figure that differs (this tree over the base) is printed under them: below
1 is faster where the figure is a time, slower where it is a rate.

The exact search's bound module is compiled with mypyc at install (``hatch_build.py``);
the base worktree gets its own compiled twin when mypyc and hatchling are importable
here, else both sides run the pure-Python bounds (``HETPAR_PURE_PYTHON=1``) so that the
comparison stays fair.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _skeleton(line: str) -> str:
    return _NUMBER.sub("#", line.strip())


def _numbers(line: str) -> list[float]:
    return [float(m.replace(",", "")) for m in _NUMBER.findall(line)]


def _compile_twin(tree: Path) -> bool:
    """Build the base's compiled bounds in place; False where mypyc is missing."""
    if any(importlib.util.find_spec(m) is None for m in ("mypyc", "hatchling")):
        return False
    sys.path.insert(0, str(ROOT))
    from hatch_build import _compile  # noqa: PLC0415 - the project's own build step

    work = Path(tempfile.mkdtemp(prefix="hetpar-side-"))
    try:
        for lib in _compile(tree, work):
            shutil.copy2(lib, tree / "hetpar" / "solvers" / lib.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return True


def _run(tree: Path, script: str, args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, str(tree / "benchmarks" / script), *args],
                          cwd=tree, env={**env, "PYTHONPATH": str(tree)},
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"side_by_side: {script} failed in {tree}:\n{proc.stderr.strip()}")
    return proc.stdout


def _pair(out_base: str, out_head: str) -> None:
    seen: dict[str, list[str]] = {}
    for line in out_base.splitlines():
        seen.setdefault(_skeleton(line), []).append(line)
    for line in out_head.splitlines():
        twins = seen.get(_skeleton(line))
        print(f"  {line}")
        if not line.strip() or not twins:
            continue
        other = twins.pop(0)  # the i-th line of this shape pairs with the base's i-th
        ratios = [f"{y / x:.2f}" for x, y in zip(_numbers(other), _numbers(line))
                  if x != y and x != 0]
        if ratios:
            print(f"      base:   {other.strip()}")
            print(f"      ratios: {' '.join(ratios)}")
    left = [line for twins in seen.values() for line in twins if line.strip()]
    if left:  # shapes only the base printed: shown, so nothing measured goes unseen
        print("  base only:")
        for line in left:
            print(f"      {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD~1", help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the two sides")
    ap.add_argument("script", help="a file of benchmarks/, e.g. costmodel_speed.py")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's arguments")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hetpar-base-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), a.base], cwd=ROOT,
                   check=True, capture_output=True)
    env = dict(os.environ)
    try:
        compiled = _compile_twin(base)
        if not compiled:
            env["HETPAR_PURE_PYTHON"] = "1"
        print(f"base {a.base} vs this working tree; bounds "
              f"{'compiled on both sides' if compiled else 'pure Python on both sides'}")
        for r in range(a.rounds):
            out_base = _run(base, a.script, a.args, env)
            out_head = _run(ROOT, a.script, a.args, env)
            print(f"\n=== round {r + 1}: this tree, and each figure over the base's")
            _pair(out_base, out_head)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                       capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
