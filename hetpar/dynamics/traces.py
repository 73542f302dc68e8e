"""Per-link bandwidth traces over time (CSV): parsing with precise errors, and writing.

Format (documented in docs/dynamics.md)::

    time_s,us--eu,a-0--tor
    0,8.0,200
    60,3.0,200
    120,8.0,180

* the header is ``time_s`` followed by one column per link, named ``A--B`` after the two
  nodes the link joins (either order); each link may appear once;
* every row gives a time in seconds (not decreasing) and a value for every column, in
  Gb/s, positive and at most the link's capacity;
* a value holds from its row's time until the next row's (piecewise constant); the last
  row holds for ever. Links without a column keep their capacity.

Any problem raises ``ConfigError(file, "line N", problem)``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetpar import limits
from hetpar.cluster.topology import Cluster, Link
from hetpar.configio import read_bounded_text
from hetpar.errors import ConfigError

__all__ = ["LinkTrace", "find_link", "link_name", "load_link_trace", "write_link_trace"]


def link_name(link: Link) -> str:
    """The name traces and scenarios use for a link: ``a--b``."""
    return f"{link.a}--{link.b}"


def find_link(cluster: Cluster, name: str) -> int | None:
    """Index of the link ``a--b`` (either order) in ``cluster.links``; None if absent."""
    parts = name.split("--")
    if len(parts) != 2:
        return None
    a, b = (p.strip() for p in parts)
    for i, link in enumerate(cluster.links):
        if {link.a, link.b} == {a, b}:
            return i
    return None


@dataclass(frozen=True)
class LinkTrace:
    """A parsed trace: change times and, per link name, its value at each time."""

    source: str
    times: tuple[float, ...]
    values: Mapping[str, tuple[float, ...]]  # canonical link name -> Gb/s per row

    def step_function(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.times), np.array(self.values[name])


def load_link_trace(path: str | Path, cluster: Cluster) -> LinkTrace:
    """Read and check a per-link trace against ``cluster`` (names, capacities)."""
    src = str(path)
    text = read_bounded_text(path, limits.MAX_TRACE_BYTES, what="trace")
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as exc:
        raise ConfigError(src, "", f"malformed CSV: {exc}") from None
    if len(rows) > limits.MAX_TRACE_ROWS + 1:
        raise ConfigError(src, "", f"{len(rows) - 1:,} rows, more than the "
                                   f"{limits.MAX_TRACE_ROWS:,} a trace may have")
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise ConfigError(src, "line 1", "empty trace: expected a header 'time_s,<link>,...'")
    header = [cell.strip() for cell in rows[0]]
    if header[0] != "time_s":
        raise ConfigError(src, "line 1", f"the first column must be 'time_s', got {header[0]!r}")
    if len(header) < 2:
        raise ConfigError(src, "line 1", "no link columns after time_s")
    names: list[str] = []
    for col in header[1:]:
        idx = find_link(cluster, col)
        if idx is None:
            known = ", ".join(link_name(lk) for lk in cluster.links)
            raise ConfigError(src, "line 1", f"column {col!r} names no link of cluster "
                                             f"{cluster.name} (links: {known})")
        canon = link_name(cluster.links[idx])
        if canon in names:
            raise ConfigError(src, "line 1", f"link {canon!r} has two columns")
        names.append(canon)
    caps = [cluster.links[find_link(cluster, n)].capacity_gbps for n in names]  # type: ignore[index]
    times: list[float] = []
    cols: list[list[float]] = [[] for _ in names]
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(header):
            missing = ", ".join(header[len(row):])
            raise ConfigError(src, f"line {lineno}", f"missing value for {missing}")
        if len(row) > len(header):
            raise ConfigError(src, f"line {lineno}", f"{len(row)} fields, the header has "
                                                     f"{len(header)}")
        try:
            t = float(row[0])
        except ValueError:
            raise ConfigError(src, f"line {lineno}", f"time_s: not a number: {row[0]!r}") from None
        if not math.isfinite(t) or t < 0 or t > limits.MAX_NUMBER:
            raise ConfigError(src, f"line {lineno}", f"time_s must be finite and >= 0, got {row[0]!r}")
        if times and t < times[-1]:
            raise ConfigError(src, f"line {lineno}", f"time goes backwards ({t:g} s after "
                                                     f"{times[-1]:g} s)")
        for j, (name, cap) in enumerate(zip(names, caps)):
            cell = row[j + 1].strip()
            if not cell:
                raise ConfigError(src, f"line {lineno}", f"missing value for link {name!r}")
            try:
                v = float(cell)
            except ValueError:
                raise ConfigError(src, f"line {lineno}", f"link {name!r}: not a number: "
                                                         f"{cell!r}") from None
            if not math.isfinite(v) or v <= 0:
                raise ConfigError(src, f"line {lineno}", f"link {name!r}: bandwidth must be "
                                                         f"positive, got {cell}")
            if v > cap * (1 + 1e-9):
                raise ConfigError(src, f"line {lineno}", f"link {name!r}: {v:g} Gb/s exceeds "
                                                         f"its capacity {cap:g} Gb/s")
            cols[j].append(v)
        times.append(t)
    if not times:
        raise ConfigError(src, "line 2", "the trace holds no rows")
    return LinkTrace(src, tuple(times), {n: tuple(c) for n, c in zip(names, cols)})


def write_link_trace(path: str | Path, times: Sequence[float],
                     values: Mapping[str, Sequence[float]]) -> Path:
    """Write a trace in the format above (consecutive identical rows are merged)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(values)
    last: tuple[float, ...] | None = None
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["time_s", *names])
        for i, t in enumerate(times):
            row = tuple(round(float(values[n][i]), 4) for n in names)
            if row == last:
                continue
            last = row
            w.writerow([f"{float(t):g}", *(f"{v:g}" for v in row)])
    return path
