"""Build hook: compile the exact search's bound module with mypyc, where a compiler exists.

``hetpar/solvers/bounds.py`` is the branch and bound's hot path (94% of a proof, in many
small functions over tuples, dicts and floats). mypyc compiles it, unchanged, into a C
extension that runs it about twice as fast. The extension is built from a copy named
``hetpar/solvers/_bounds_native.py`` that records the SHA-256 of the source it came from;
``bounds.py`` uses it only while that digest matches its own text, so an edited source
never runs stale compiled code (it falls back to itself, the pure-Python reference).

Skipped (pure Python, same results) when ``HETPAR_PURE_PYTHON`` is set, and with a
warning when the compilation fails (no C compiler, an unsupported interpreter).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("hetpar/solvers/bounds.py")
NATIVE = "_bounds_native"


class NativeBoundsHook(BuildHookInterface):
    PLUGIN_NAME = "custom"
    _work: Path | None = None

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or os.environ.get("HETPAR_PURE_PYTHON"):
            return
        root = Path(self.root)
        out_dir = root / SOURCE.parent
        if version == "editable":
            for old in _extensions(out_dir):
                old.unlink()  # a stale build must not outlive a failed one
        self._work = Path(tempfile.mkdtemp(prefix="hetpar-mypyc-"))
        try:
            built = _compile(root, self._work)
        except (OSError, subprocess.CalledProcessError, RuntimeError) as err:
            self.app.display_warning(
                f"hetpar: compiling {SOURCE} with mypyc failed ({err}); the exact search "
                "runs its pure-Python bounds instead (same results, about half the speed)")
            self.finalize(version, build_data, "")
            return
        for lib in built:
            if version == "editable":
                # An editable install imports from the source tree.
                shutil.copy2(lib, out_dir / lib.name)
            else:
                build_data["force_include"][str(lib)] = str(SOURCE.parent / lib.name)
        if version == "editable":
            self.finalize(version, build_data, "")
        else:
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None


def _compile(root: Path, work: Path) -> list[Path]:
    """Compile the twin of ``SOURCE`` in a copy of the package under ``work``; the built
    extension files (there)."""
    text = (root / SOURCE).read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    shutil.copytree(root / "hetpar", work / "hetpar",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "data"))
    twin = work / SOURCE.parent / f"{NATIVE}.py"
    twin.write_bytes(text + f'\nSOURCE_DIGEST = "{digest}"\n'.encode())
    # mypy type-checks the module as it compiles it; the project's other modules are only
    # followed for their names, and installed packages not at all (with torch and numpy
    # in reach, analysing them took 100 s of a 2-minute build).
    setup = work / "setup_native.py"
    setup.write_text(
        "from setuptools import setup\n"
        "from mypyc.build import mypycify\n"
        f"setup(name='hetpar-native', ext_modules=mypycify(["
        f"'--ignore-missing-imports', '--follow-imports=silent', '--no-site-packages', "
        f"'{twin.relative_to(work).as_posix()}'], opt_level='3'))\n")
    subprocess.run([sys.executable, str(setup), "build_ext", "--inplace"], cwd=work,
                   check=True, stdout=subprocess.DEVNULL)
    built = _extensions(work / SOURCE.parent)
    if not built:
        raise RuntimeError("mypyc built no extension")
    return built


def _extensions(folder: Path) -> list[Path]:
    """The compiled twin's extension files in ``folder`` (.so, or .pyd on Windows)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(p for p in folder.glob(f"{NATIVE}*") if p.name.endswith(suffixes))
