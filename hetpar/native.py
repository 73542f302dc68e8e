"""Compiled twins of hot pure-Python modules, used only while they match their source.

``hatch_build.py`` compiles each module of ``TWINS`` with mypyc at install time into a
sibling extension (``bounds.py`` -> ``_bounds_native``), unchanged, recording the SHA-256
of the text it was built from. The module then swaps its classes for the twin's, but only
while that digest matches its own file: an edited source runs as written (with a warning
saying so), never a stale build. Without a C compiler, or with ``HETPAR_PURE_PYTHON``
set, the pure-Python module runs: same decisions, same numbers, slower. At run time
``HETPAR_PURE_PYTHON`` may name modules instead (``feasibility``, ``bounds``, comma
separated): only those run as pure Python, which is how a benchmark times one twin alone.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import warnings
from pathlib import Path
from types import ModuleType

__all__ = ["TWINS", "compiled_twin", "matching_twin"]

# Source module -> its compiled twin (what hatch_build.py builds, reading this file by
# path, and what is loaded). Keep this module to the standard library: the build loads
# it before hetpar is installed.
TWINS: dict[str, str] = {
    "hetpar.solvers.bounds": "hetpar.solvers._bounds_native",  # the exact search's bounds
    "hetpar.envs.feasibility": "hetpar.envs._feasibility_native",  # the action masks
}


def matching_twin(twin: ModuleType, source: bytes, name: str = "the source") -> ModuleType | None:
    """``twin`` if it was compiled from ``source`` (its recorded digest), else None, with
    a warning: the source was edited since the package was installed."""
    if getattr(twin, "SOURCE_DIGEST", None) == hashlib.sha256(source).hexdigest():
        return twin
    warnings.warn(f"{name} differs from the source of its compiled twin: it runs as pure "
                  "Python (slower, same results) until the package is installed again",
                  RuntimeWarning, stacklevel=3)
    return None


def compiled_twin(module: str, source_file: str) -> ModuleType | None:
    """The compiled twin of ``module`` (whose text is ``source_file``), or None: ``module``
    has no twin (the twin itself asks when it runs its copy of the source), pure Python
    asked for (``HETPAR_PURE_PYTHON``), no twin installed, or one built from other text."""
    if module not in TWINS or _pure(module):
        return None
    try:
        twin = importlib.import_module(TWINS[module])
    except ImportError:
        return None
    path = Path(source_file)
    return matching_twin(twin, path.read_bytes(), f"hetpar/{path.parent.name}/{path.name}")


def _pure(module: str) -> bool:
    """Whether ``HETPAR_PURE_PYTHON`` asks for ``module`` as pure Python: any value that
    names no twin asks it for all of them."""
    value = os.environ.get("HETPAR_PURE_PYTHON", "")
    if not value:
        return False
    named = {part.strip() for part in value.split(",")}
    short = {m.rsplit(".", 1)[1] for m in TWINS}
    return module.rsplit(".", 1)[1] in named or not named & short
