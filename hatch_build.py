"""Build hook: compile hetpar's two hottest pure-Python modules with mypyc, where a
compiler exists.

- ``hetpar/solvers/bounds.py``: the branch and bound's hot path (94% of a proof, in many
  small functions over tuples, dicts and floats);
- ``hetpar/envs/feasibility.py``: the completion search behind the environment's action
  masks (most of an environment step in training, and of a policy rollout in ``hetpar
  plan``).

mypyc compiles each, unchanged, into a C extension that runs it about twice as fast
(bounds) or 1.7 times (masks). Each extension is built from a copy named after its
twin (``hetpar/solvers/_bounds_native.py``, ``hetpar/envs/_feasibility_native.py``: the
list is ``hetpar.native.TWINS``) that records the SHA-256 of the source it came from; the
source module uses it only while that digest matches its own text, so an edited source
never runs stale compiled code (it falls back to itself, the pure-Python reference).

Skipped (pure Python, same results) when ``HETPAR_PURE_PYTHON`` is set, and with a
warning when the compilation fails (no C compiler, an unsupported interpreter).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _sources(root: Path) -> dict[Path, str]:
    """Source file -> the name of its compiled twin, from ``hetpar.native.TWINS`` (loaded
    by path: the build runs before hetpar is installed)."""
    spec = importlib.util.spec_from_file_location("_hetpar_native", root / "hetpar/native.py")
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    return {Path(*module.split(".")).with_suffix(".py"): twin.rsplit(".", 1)[1]
            for module, twin in native.TWINS.items()}


class NativeBoundsHook(BuildHookInterface):
    PLUGIN_NAME = "custom"
    _work: Path | None = None

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or os.environ.get("HETPAR_PURE_PYTHON"):
            return
        root = Path(self.root)
        sources = _sources(root)
        if version == "editable":
            for source, native in sources.items():
                for old in _extensions(root / source.parent, native):
                    old.unlink()  # a stale build must not outlive a failed one
        self._work = Path(tempfile.mkdtemp(prefix="hetpar-mypyc-"))
        try:
            built = _compile(root, self._work, sources)
        except (OSError, subprocess.CalledProcessError, RuntimeError) as err:
            self.app.display_warning(
                f"hetpar: compiling {', '.join(map(str, sources))} with mypyc failed "
                f"({err}); the exact search's bounds and the action masks run as pure "
                "Python instead (same results, about half the speed)")
            self.finalize(version, build_data, "")
            return
        for source, lib in built:
            if version == "editable":
                # An editable install imports from the source tree.
                shutil.copy2(lib, root / source.parent / lib.name)
            else:
                build_data["force_include"][str(lib)] = str(source.parent / lib.name)
        if version == "editable":
            self.finalize(version, build_data, "")
        else:
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None


def _compile(root: Path, work: Path, sources: dict[Path, str]) -> list[tuple[Path, Path]]:
    """Compile the twin of every file of ``sources`` in a copy of the package under
    ``work``; (the source, an extension file built there) for each file built."""
    shutil.copytree(root / "hetpar", work / "hetpar",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "data"))
    calls = []
    for source, native in sources.items():
        text = (root / source).read_bytes()
        digest = hashlib.sha256(text).hexdigest()
        twin = work / source.parent / f"{native}.py"
        twin.write_bytes(text + f'\nSOURCE_DIGEST = "{digest}"\n'.encode())
        # One mypycify call per twin: each gets its own support library, named after it.
        # mypy type-checks the module as it compiles it; the project's other modules are
        # only followed for their names, and installed packages not at all (with torch
        # and numpy in reach, analysing them took 100 s of a 2-minute build).
        calls.append(f"mypycify(['--ignore-missing-imports', '--follow-imports=silent', "
                     f"'--no-site-packages', '{twin.relative_to(work).as_posix()}'], "
                     f"opt_level='3')")
    setup = work / "setup_native.py"
    setup.write_text(
        "from setuptools import setup\n"
        "from mypyc.build import mypycify\n"
        f"setup(name='hetpar-native', ext_modules={' + '.join(calls)})\n")
    subprocess.run([sys.executable, str(setup), "build_ext", "--inplace"], cwd=work,
                   check=True, stdout=subprocess.DEVNULL)
    built = []
    for source, native in sources.items():
        libs = _extensions(work / source.parent, native)
        if not libs:
            raise RuntimeError(f"mypyc built no extension for {source}")
        built += [(source, lib) for lib in libs]
    return built


def _extensions(folder: Path, native: str) -> list[Path]:
    """The extension files of the twin ``native`` in ``folder`` (.so, or .pyd on
    Windows)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(p for p in folder.glob(f"{native}*") if p.name.endswith(suffixes))
