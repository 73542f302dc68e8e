"""Stochastic link bandwidth models.

A model describes the bandwidth a link offers (Gb/s, never above its capacity). A
*bandwidth state* is one draw of every link. All randomness comes from a
``numpy.random.Generator`` passed in by the caller.

Formats (YAML, under a link's ``bandwidth:`` key; omitted means ``constant``):

    {kind: constant}                              # the link's capacity
    {kind: lognormal, mean_gbps: 40, cv: 0.3}     # clipped at capacity
    {kind: markov, states: [{name: ok, gbps: 100, to: {busy: 0.02}},
                            {name: busy, gbps: 20, to: {ok: 0.1}}]}   # rates per second
    {kind: trace, file: traces/wan.csv, column: wan}  # CSV: time_s,<column>,... in Gb/s
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from hetpar import limits
from hetpar.configio import Reader, read_bounded_text
from hetpar.errors import ConfigError

__all__ = ["BandwidthModel", "Constant", "LogNormal", "Markov", "Trace", "parse_bandwidth_model"]


class BandwidthModel(Protocol):
    """What the cost model needs of a link's bandwidth (all figures in Gb/s)."""

    def mean(self) -> float: ...
    def cv(self) -> float: ...
    def sample(self, rng: np.random.Generator, k: int) -> np.ndarray: ...


def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True)
class Constant:
    gbps: float

    def mean(self) -> float:
        return self.gbps

    def cv(self) -> float:
        return 0.0

    def sample(self, rng: np.random.Generator, k: int) -> np.ndarray:
        return np.full(k, self.gbps)


@dataclass(frozen=True)
class LogNormal:
    """Log-normal bandwidth with a given mean and coefficient of variation, capped."""

    mean_gbps: float
    cv_: float
    cap_gbps: float

    def _params(self) -> tuple[float, float]:
        sigma2 = math.log1p(self.cv_ ** 2)
        return math.log(self.mean_gbps) - sigma2 / 2, math.sqrt(sigma2)

    def _clipped_moment(self, n: int) -> float:
        """E[min(X, cap)^n] of the log-normal X: what the capped samples average to."""
        mu, sigma = self._params()
        if sigma == 0:
            return min(self.mean_gbps, self.cap_gbps) ** n
        z = (math.log(self.cap_gbps) - mu) / sigma
        below = math.exp(n * mu + (n * sigma) ** 2 / 2) * _phi(z - n * sigma)
        return below + self.cap_gbps ** n * (1.0 - _phi(z))

    def mean(self) -> float:
        return self._clipped_moment(1)

    def cv(self) -> float:
        m = self._clipped_moment(1)
        return math.sqrt(max(self._clipped_moment(2) - m * m, 0.0)) / m

    def sample(self, rng: np.random.Generator, k: int) -> np.ndarray:
        mu, sigma = self._params()
        return np.minimum(rng.lognormal(mu, sigma, size=k), self.cap_gbps)


@dataclass(frozen=True)
class Markov:
    """A continuous-time Markov chain over bandwidth levels (congestion, degradation).

    ``rates[i][j]`` is the rate (1/s) of switching from state i to j. A single draw
    takes the state from the stationary distribution; ``sample_path`` follows the chain
    through time, for simulators of dynamic networks.
    """

    names: tuple[str, ...]
    gbps: tuple[float, ...]
    rates: tuple[tuple[float, ...], ...]

    def stationary(self) -> np.ndarray:
        q = np.array(self.rates, dtype=float)
        np.fill_diagonal(q, 0.0)
        np.fill_diagonal(q, -q.sum(axis=1))
        n = len(self.gbps)
        # Solve pi Q = 0 with sum(pi) = 1 (least squares is exact for an irreducible chain).
        a = np.vstack([q.T, np.ones(n)])
        b = np.zeros(n + 1)
        b[-1] = 1.0
        pi, *_ = np.linalg.lstsq(a, b, rcond=None)
        pi = np.clip(pi, 0.0, None)
        return pi / pi.sum()

    def mean(self) -> float:
        return float(self.stationary() @ np.array(self.gbps))

    def cv(self) -> float:
        pi, levels = self.stationary(), np.array(self.gbps)
        m = pi @ levels
        return float(math.sqrt(max(pi @ (levels - m) ** 2, 0.0)) / m)

    def sample(self, rng: np.random.Generator, k: int) -> np.ndarray:
        states = rng.choice(len(self.gbps), size=k, p=self.stationary())
        return np.array(self.gbps)[states]

    def sample_path(self, rng: np.random.Generator, times: np.ndarray) -> np.ndarray:
        """Bandwidth at each of the (sorted) ``times``, starting from stationarity."""
        q = np.array(self.rates, dtype=float)
        np.fill_diagonal(q, 0.0)
        out = np.empty(len(times))
        state = int(rng.choice(len(self.gbps), p=self.stationary()))
        t = float(times[0]) if len(times) else 0.0
        for i, when in enumerate(times):
            while True:
                total = q[state].sum()
                if total <= 0:
                    break
                dwell = rng.exponential(1.0 / total)
                if t + dwell > when:
                    break
                t += dwell
                state = int(rng.choice(len(self.gbps), p=q[state] / total))
            # Memorylessness lets the next interval restart its dwell at ``when``.
            t = float(when)
            out[i] = self.gbps[state]
        return out


@dataclass(frozen=True)
class Trace:
    """A measured per-link bandwidth trace replayed from CSV (piecewise constant)."""

    times: tuple[float, ...]
    values: tuple[float, ...]
    source: str

    def _weights(self) -> np.ndarray:
        """Time each row holds; the last row marks the end of the trace."""
        if len(self.times) == 1:
            return np.ones(1)
        w = np.diff(np.array(self.times))
        return np.append(w, 0.0) if w.sum() > 0 else np.append(np.ones(len(w)), 0.0)

    def mean(self) -> float:
        return float(np.average(self.values, weights=self._weights()))

    def cv(self) -> float:
        v, w = np.array(self.values), self._weights()
        m = np.average(v, weights=w)
        return float(math.sqrt(np.average((v - m) ** 2, weights=w)) / m)

    def value_at(self, t: np.ndarray | float) -> np.ndarray:
        idx = np.searchsorted(np.array(self.times), t, side="right") - 1
        return np.array(self.values)[np.clip(idx, 0, len(self.values) - 1)]

    def sample(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """Draws at uniformly random instants of the trace's time span."""
        if len(self.times) == 1:
            return np.full(k, self.values[0])
        return self.value_at(rng.uniform(self.times[0], self.times[-1], size=k))


def _load_trace(path: Path, column: str, source: str, where: str) -> Trace:
    text = read_bounded_text(path, limits.MAX_TRACE_BYTES, source=source, field=where,
                             what="trace")
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as exc:
        raise ConfigError(str(path), "", f"malformed CSV: {exc}") from None
    if len(rows) > limits.MAX_TRACE_ROWS + 1:
        raise ConfigError(str(path), "", f"{len(rows) - 1:,} rows, more than the "
                                         f"{limits.MAX_TRACE_ROWS:,} a trace may have")
    if not rows or "time_s" not in rows[0] or column not in rows[0]:
        raise ConfigError(str(path), "line 1", f"trace header needs columns time_s and {column!r}")
    ti, ci = rows[0].index("time_s"), rows[0].index(column)
    times: list[float] = []
    values: list[float] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(rows[0]):
            raise ConfigError(str(path), f"line {lineno}", f"{len(row)} fields, the header has "
                                                           f"{len(rows[0])}")
        try:
            t, v = float(row[ti]), float(row[ci])
        except (ValueError, IndexError):
            raise ConfigError(str(path), f"line {lineno}", f"non-numeric or missing value in "
                                                           f"time_s or {column!r}") from None
        if not math.isfinite(t) or t < 0 or t > limits.MAX_NUMBER:
            raise ConfigError(str(path), f"line {lineno}", f"time_s must be finite, at least 0 "
                                                           f"and at most {limits.MAX_NUMBER:g}, "
                                                           f"got {row[ti]!r}"[:200])
        if not (math.isfinite(v) and v >= limits.MIN_POSITIVE):
            raise ConfigError(str(path), f"line {lineno}", f"bandwidth must be positive, got {v:g}")
        if times and t < times[-1]:
            raise ConfigError(str(path), f"line {lineno}", "time goes backwards")
        times.append(t)
        values.append(v)
    if not values:
        raise ConfigError(str(path), "", "trace holds no rows")
    return Trace(tuple(times), tuple(values), str(path))


def parse_bandwidth_model(r: Reader, capacity_gbps: float, base_dir: Path) -> BandwidthModel:
    """Build a model from a link's ``bandwidth`` mapping (already wrapped in a Reader)."""
    kind = r.choice("kind", ("constant", "lognormal", "markov", "trace"), "constant")
    if kind == "constant":
        r.check_keys(frozenset({"kind"}))
        return Constant(capacity_gbps)
    if kind == "lognormal":
        r.check_keys(frozenset({"kind", "mean_gbps", "cv"}))
        mean = r.number("mean_gbps", capacity_gbps, positive=True)
        if mean > capacity_gbps:
            raise r.error("mean_gbps", f"{mean:g} exceeds the link capacity {capacity_gbps:g} Gb/s")
        return LogNormal(mean, r.number("cv", nonnegative=True, maximum=5.0), capacity_gbps)
    if kind == "markov":
        r.check_keys(frozenset({"kind", "states"}))
        states = r.sub_list("states")
        if len(states) < 1:
            raise r.error("states", "needs at least one state")
        names = []
        for s in states:
            s.check_keys(frozenset({"name", "gbps", "to"}))
            names.append(s.str("name"))
        if len(set(names)) != len(names):
            raise r.error("states", "state names must be distinct")
        gbps, rates = [], []
        for s in states:
            level = s.number("gbps", positive=True)
            if level > capacity_gbps:
                raise s.error("gbps", f"{level:g} exceeds the link capacity {capacity_gbps:g} Gb/s")
            gbps.append(level)
            to = s.sub("to", {})
            row = [0.0] * len(names)
            for target in to.data:
                if target not in names:
                    raise to.error(str(target), f"unknown state (states: {', '.join(names)})")
                row[names.index(target)] = to.number(
                    str(target), nonnegative=True, maximum=limits.MAX_MARKOV_RATE)
            rates.append(tuple(row))
        return Markov(tuple(names), tuple(gbps), tuple(rates))
    r.check_keys(frozenset({"kind", "file", "column"}))
    path = base_dir / r.str("file")
    trace = _load_trace(path, r.str("column"), r.source, r.field("file"))
    if max(trace.values) > capacity_gbps:
        raise r.error("file", f"trace exceeds the link capacity {capacity_gbps:g} Gb/s")
    return trace
