"""Reading YAML/JSON configuration with errors that name the file and the field.

Bundled configurations live in the repository's top-level ``configs/`` folder; a wheel
carries them as ``hetpar/_configs`` (see ``pyproject.toml``). ``bundled_dir()`` finds
whichever exists, so a source checkout, an editable install and a wheel all work.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hetpar.errors import ConfigError

__all__ = ["Reader", "bundled_dir", "load_document", "resolve_config", "list_bundled"]


def bundled_dir() -> Path:
    """The folder holding the bundled ``configs`` (GPU catalog, clusters, models, ...)."""
    packaged = Path(str(resources.files("hetpar"))) / "_configs"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "configs"


def list_bundled(kind: str) -> list[str]:
    """Names of the bundled configs of one kind (``clusters``, ``models``, ...)."""
    folder = bundled_dir() / kind
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def resolve_config(path_or_name: str | Path, kind: str) -> Path:
    """A path if it exists, else the bundled config of that name, else a ConfigError."""
    path = Path(path_or_name)
    if path.is_file():
        return path
    if path.exists():
        raise ConfigError(str(path), "", "is not a file")
    candidate = bundled_dir() / kind / f"{path.name}.yaml"
    if path.suffix not in (".yaml", ".yml", ".json") and len(path.parts) == 1 and candidate.is_file():
        return candidate
    known = ", ".join(list_bundled(kind)) or "none"
    raise ConfigError(str(path), "", f"no such file, and no bundled {kind[:-1]} of that name "
                                     f"(bundled: {known})")


def load_document(path: str | Path) -> Any:
    """Parse one YAML or JSON file; syntax errors become one-line ConfigErrors."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), "", "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), "", f"cannot read: {exc}") from None
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(str(path), f"line {exc.lineno}", f"malformed JSON: {exc.msg}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(str(path), where, f"malformed YAML: {problem}") from None


_MISSING = object()


@dataclass(frozen=True)
class Reader:
    """A view of one mapping in a config document that knows where it came from.

    Every accessor validates type and range and raises a ConfigError naming the source
    file and the dotted field path, so loaders stay declarative.
    """

    data: Mapping[str, Any]
    source: str
    path: str = ""

    @classmethod
    def of(cls, data: Any, source: str, path: str = "") -> Reader:
        if not isinstance(data, Mapping):
            kind = "empty" if data is None else type(data).__name__
            raise ConfigError(source, path, f"expected a mapping, got {kind}")
        return cls(data, source, path)

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.source, self.field(key), problem)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.data and self.data[key] is not None:
            return self.data[key]
        if default is _MISSING:
            raise self.error(key, "is required")
        return default

    def check_keys(self, allowed: set[str] | frozenset[str]) -> None:
        """Reject unknown keys: a typo in a config should not be silently ignored."""
        for key in self.data:
            if key not in allowed:
                hint = ", ".join(sorted(allowed))
                raise self.error(str(key), f"unknown field (allowed: {hint})")

    def str(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {value!r}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if value not in options:
            raise self.error(key, f"expected one of {', '.join(options)}, got {value!r}")
        return value

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def int(self, key: str, default: Any = _MISSING, minimum: int | None = None) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        return value

    def number(self, key: str, default: Any = _MISSING, *, positive: bool = False,
               nonnegative: bool = False, maximum: float | None = None) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise self.error(key, f"must be finite, got {value}")
        if positive and value <= 0:
            raise self.error(key, f"must be positive, got {value:g}")
        if nonnegative and value < 0:
            raise self.error(key, f"must not be negative, got {value:g}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be at most {maximum:g}, got {value:g}")
        return value

    def sub(self, key: str, default: Any = _MISSING) -> Reader:
        value = self.raw(key, {} if default is not _MISSING else _MISSING)
        return Reader.of(value, self.source, self.field(key))

    def items(self, key: str, default: Any = _MISSING) -> Iterator[tuple[int, Any, str]]:
        """(index, value, field path) for each element of a list field."""
        value = self.raw(key, default)
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            yield i, item, f"{self.field(key)}[{i}]"

    def sub_list(self, key: str, default: Any = _MISSING) -> list[Reader]:
        return [Reader.of(item, self.source, where) for _, item, where in self.items(key, default)]
