"""Reading YAML/JSON configuration with errors that name the file and the field.

Bundled configurations live in the repository's top-level ``configs/`` folder; a wheel
carries them as ``hetpar/_configs`` (see ``pyproject.toml``). ``bundled_dir()`` finds
whichever exists, so a source checkout, an editable install and a wheel all work.
"""

from __future__ import annotations

import json
import math
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hetpar import limits
from hetpar.errors import ConfigError

__all__ = ["Reader", "bundled_dir", "load_document", "resolve_config", "list_bundled",
           "parse_text", "check_data", "read_bounded_text"]


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
    try:
        return _resolve(Path(path_or_name), kind)
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise ConfigError(str(path_or_name), "", f"cannot use this path: "
                                                 f"{exc.strerror or exc}") from None


def _resolve(path: Path, kind: str) -> Path:
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


def read_bounded_text(path: str | Path, max_bytes: int = limits.MAX_FILE_BYTES, *,
                      source: str | None = None, field: str = "", what: str = "file") -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes`` bytes, else a one-line
    ConfigError: a folder, a device such as ``/dev/zero``, a FIFO, a binary file or a
    huge one is refused before it is read (reading ``/dev/zero`` would never end)."""
    path = Path(path)
    src = str(path) if source is None else source
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(src, field, f"no such {what}" if source is None
                          else f"no such {what} {path}") from None
    except OSError as exc:
        raise ConfigError(src, field, f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ConfigError(src, field, f"{path} is {kind}" if source is not None
                          else f"is {kind}")
    if st.st_size > max_bytes:
        raise ConfigError(src, field, f"{path.name} is {st.st_size:,} bytes, more than the "
                                      f"{max_bytes:,} a {what} may have")
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(src, field, f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ConfigError(src, field, f"{path.name} is more than the {max_bytes:,} bytes a "
                                      f"{what} may have")
    if b"\0" in data:
        raise ConfigError(src, field, f"{path.name} is a binary file, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(src, field, f"{path.name} is not UTF-8 text (byte {exc.start})") from None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with nesting depth and alias count bounded while composing
    (deep nesting would exhaust the composer's stack; see ``hetpar.limits``)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: ANN401 - yaml.Node
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > limits.MAX_ALIASES:
                raise _LimitError(self.peek_event().start_mark,
                                  f"more than {limits.MAX_ALIASES:,} YAML aliases")
        self._depth += 1
        try:
            if self._depth > limits.MAX_DEPTH:
                raise _LimitError(self.peek_event().start_mark,
                                  f"nested more than {limits.MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# No hetpar format holds a date: a date-like scalar (2024-01-01) stays a string, so every
# parsed value is plain JSON data (mappings, lists, strings, numbers, booleans, null).
_BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


class _LimitError(Exception):
    def __init__(self, mark: Any, problem: str) -> None:  # noqa: ANN401 - yaml.Mark
        super().__init__(problem)
        self.mark = mark
        self.problem = problem


def parse_text(text: str, source: str, *, json_format: bool) -> Any:
    """Parse YAML (or JSON) text into plain data within ``hetpar.limits``: nesting depth,
    aliases, the size of the data once aliases are expanded, no value that contains
    itself, integers within int64. Problems become one-line ConfigErrors."""
    if json_format:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(source, f"line {exc.lineno}", f"malformed JSON: {exc.msg}") from None
        except RecursionError:
            raise ConfigError(source, "", f"nested more than {limits.MAX_DEPTH} levels "
                                          "deep") from None
        except ValueError as exc:  # an integer of more than 4,300 digits
            raise _long_number(text, source, exc) from None
    else:
        loader = None
        try:
            loader = _BoundedLoader(text)  # checks the characters: may raise a YAMLError
            data = loader.get_single_data()
        except _LimitError as exc:
            raise ConfigError(source, f"line {exc.mark.line + 1}", exc.problem) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(source, where, f"malformed YAML: {problem}") from None
        except RecursionError:
            raise ConfigError(source, "", f"nested more than {limits.MAX_DEPTH} levels "
                                          "deep") from None
        except (ValueError, OverflowError) as exc:  # e.g. an integer of > 4,300 digits
            raise _long_number(text, source, exc) from None
        finally:
            if loader is not None:
                loader.dispose()
    check_data(data, source)
    return data


def _long_number(text: str, source: str, exc: Exception) -> ConfigError:
    """The error for a number Python will not convert (more than 4,300 digits), at its line."""
    m = re.search(r"\d{4000,}", text)
    if m is None:
        return ConfigError(source, "", f"malformed document: {str(exc).split(';')[0]}")
    line = text.count("\n", 0, m.start()) + 1
    return ConfigError(source, f"line {line}", f"a number of {len(m.group(0)):,} digits is out "
                                               f"of range (at most {limits.MAX_INT})")


def _field_path(parts: list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def check_data(data: Any, source: str) -> None:
    """Refuse parsed data beyond ``hetpar.limits``: nesting deeper than MAX_DEPTH, more
    than MAX_NODES values once YAML aliases are expanded (a "billion laughs" document),
    a mapping or list that contains itself, an integer beyond int64, a NaN or infinite
    number (no hetpar field takes one), a value of another type than JSON's (a YAML
    ``!!set`` or ``!!binary``). The field path of the offending value is named."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def visit(x: Any, parts: list[Any]) -> int:  # noqa: ANN401
        if isinstance(x, (dict, list)):
            key = id(x)
            if key in active:
                raise ConfigError(source, _field_path(parts),
                                  "contains itself (a recursive YAML alias)")
            if key in memo:
                return memo[key]
            if len(parts) >= limits.MAX_DEPTH:
                raise ConfigError(source, _field_path(parts),
                                  f"nested more than {limits.MAX_DEPTH} levels deep")
            active.add(key)
            total = 1
            items = x.items() if isinstance(x, dict) else enumerate(x)
            for k, v in items:
                if isinstance(x, dict):
                    visit(k, parts + [f"<key {k!r}>" if not isinstance(k, str) else k])
                total += visit(v, parts + [k])
                if total > limits.MAX_NODES:
                    raise ConfigError(source, _field_path(parts),
                                      f"expands to more than {limits.MAX_NODES:,} values "
                                      "(YAML aliases?)")
            active.discard(key)
            memo[key] = total
            return total
        if isinstance(x, int) and not isinstance(x, bool) and abs(x) > limits.MAX_INT:
            raise ConfigError(source, _field_path(parts),
                              f"integer of {x.bit_length()} bits is out of range (at most "
                              f"{limits.MAX_INT})")
        if isinstance(x, float) and not math.isfinite(x):
            raise ConfigError(source, _field_path(parts), f"must be finite, got {x}")
        if not isinstance(x, (str, int, float, type(None))):
            raise ConfigError(source, _field_path(parts),
                              f"a {type(x).__name__} value (a YAML tag?) is not allowed here: "
                              "use a string, number, true/false, list or mapping")
        return 1

    visit(data, [])


def load_document(path: str | Path) -> Any:
    """Parse one YAML or JSON file within ``hetpar.limits``; every problem (no such file,
    not a regular file, too large, binary, syntax, nesting, aliases, huge integers)
    becomes a one-line ConfigError naming the file."""
    path = Path(path)
    text = read_bounded_text(path)
    return parse_text(text, str(path), json_format=path.suffix == ".json")


_MISSING = object()


def as_float(value: Any) -> float:  # noqa: ANN401
    """``float(value)``, with an integer too large for a float becoming inf (then refused
    as not finite) rather than an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _short(value: Any, limit: int = 60) -> str:  # noqa: ANN401
    """``repr(value)`` cut to ``limit`` characters (an error stays one short line)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 150:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
            raise self.error(key, f"expected a non-empty string, got {_short(value)}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if value not in options:
            raise self.error(key, f"expected one of {', '.join(options)}, got {_short(value)}")
        return value

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_short(value)}")
        return value

    def int(self, key: str, default: Any = _MISSING, minimum: int | None = None,
            maximum: int | None = None, why: str = "") -> Any:
        """An integer field; ``maximum`` defaults to ``limits.MAX_INT`` (``why``, if
        given, says where a stated limit comes from)."""
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {_short(value)}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {_short(value)}")
        top = limits.MAX_INT if maximum is None else maximum
        if value > top or value < -limits.MAX_INT:
            raise self.error(key, f"must be at most {top:,}{why}, got {_short(value)}")
        return value

    def number(self, key: str, default: Any = _MISSING, *, positive: bool = False,
               nonnegative: bool = False, maximum: float | None = None) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {_short(value)}")
        value = as_float(value)
        if not math.isfinite(value):
            raise self.error(key, f"must be finite, got {_short(value)}")
        if positive and value <= 0:
            raise self.error(key, f"must be positive, got {value:g}")
        if nonnegative and value < 0:
            raise self.error(key, f"must not be negative, got {value:g}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be at most {maximum:g}, got {value:g}")
        if abs(value) > limits.MAX_NUMBER:
            raise self.error(key, f"must be at most {limits.MAX_NUMBER:g} in magnitude, got "
                                  f"{value:g}")
        if positive and value < limits.MIN_POSITIVE:
            raise self.error(key, f"must be at least {limits.MIN_POSITIVE:g}, got {value:g}")
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
