"""Time-varying bandwidth of links, as piecewise-constant step functions.

A *step function* is a pair ``(times, values)``: ``values[i]`` holds from ``times[i]`` to
``times[i+1]`` (the last for ever), ``times[0] == 0``. Processes draw theirs from the
``numpy.random.Generator`` the caller passes; nothing uses global random state.

* ``MarkovProcess``: Markov-modulated congestion states (``hetpar.cluster.bandwidth.Markov``
  followed through time with ``Markov.sample_path`` on a time grid);
* ``DiurnalProcess``: a daily (or any period) cosine between a busy and a quiet level,
  quantised to a time grid and a bandwidth step so that states repeat;
* ``StepProcess``: a fixed step function (a replayed trace column, or a constant).

Events (``Degrade``, ``LinkDown``, ``HostDown``) act on top of them over an interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hetpar.cluster.bandwidth import Markov

__all__ = [
    "Degrade",
    "DiurnalProcess",
    "Event",
    "HostDown",
    "LinkDown",
    "MarkovProcess",
    "Process",
    "StepProcess",
    "compress",
    "step_value",
]


def compress(times: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop points where the value does not change."""
    times = np.asarray(times, dtype=float)
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return times, values
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return times[keep], values[keep]


def step_value(times: np.ndarray, values: np.ndarray, t: float | np.ndarray) -> np.ndarray:
    idx = np.searchsorted(times, t, side="right") - 1
    return values[np.clip(idx, 0, len(values) - 1)]


class Process(Protocol):
    def path(self, rng: np.random.Generator, horizon_s: float,
             step_s: float) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class MarkovProcess:
    """Congestion states of a link (rates per second), sampled every ``step_s``."""

    chain: Markov

    def path(self, rng: np.random.Generator, horizon_s: float,
             step_s: float) -> tuple[np.ndarray, np.ndarray]:
        times = np.arange(0.0, horizon_s, step_s)
        return compress(times, self.chain.sample_path(rng, times))


@dataclass(frozen=True)
class DiurnalProcess:
    """``quiet_gbps`` at ``busiest_s + period/2``, ``busy_gbps`` at ``busiest_s``
    (cosine in between), held constant for ``step_s`` and rounded to ``quantum_gbps``.
    With ``random_phase`` the busiest instant is drawn uniformly within the period."""

    busy_gbps: float
    quiet_gbps: float
    period_s: float = 86400.0
    busiest_s: float = 0.0
    quantum_gbps: float = 0.0
    random_phase: bool = False

    def path(self, rng: np.random.Generator, horizon_s: float,
             step_s: float) -> tuple[np.ndarray, np.ndarray]:
        busiest = rng.uniform(0.0, self.period_s) if self.random_phase else self.busiest_s
        times = np.arange(0.0, horizon_s, step_s)
        mid = times + step_s / 2
        busy = 0.5 * (1.0 + np.cos(2.0 * math.pi * (mid - busiest) / self.period_s))
        values = self.quiet_gbps - (self.quiet_gbps - self.busy_gbps) * busy
        if self.quantum_gbps > 0:
            values = np.maximum(np.round(values / self.quantum_gbps) * self.quantum_gbps,
                                min(self.busy_gbps, self.quiet_gbps))
        return compress(times, values)


@dataclass(frozen=True)
class StepProcess:
    """A fixed step function (a trace column, or a constant with one point)."""

    times: tuple[float, ...]
    values: tuple[float, ...]

    def path(self, rng: np.random.Generator, horizon_s: float,
             step_s: float) -> tuple[np.ndarray, np.ndarray]:
        del rng, horizon_s, step_s
        t = np.array(self.times, dtype=float)
        v = np.array(self.values, dtype=float)
        if t[0] > 0:  # before the first row, the first value holds
            t[0] = 0.0
        return compress(t, v)


@dataclass(frozen=True)
class Degrade:
    """Bandwidth of ``links`` multiplied by a factor falling linearly from 1 to
    ``factor`` over ``ramp_s`` (in ``ramp_steps`` steps) from ``at_s``, until ``until_s``."""

    links: tuple[str, ...]
    at_s: float
    factor: float
    until_s: float = math.inf
    ramp_s: float = 0.0
    ramp_steps: int = 1

    def factor_path(self) -> tuple[np.ndarray, np.ndarray]:
        if self.ramp_s > 0 and self.ramp_steps > 1:
            k = np.arange(1, self.ramp_steps + 1)
            times = self.at_s + (k - 1) * self.ramp_s / self.ramp_steps
            values = 1.0 - (1.0 - self.factor) * k / self.ramp_steps
        else:
            times, values = np.array([self.at_s]), np.array([self.factor])
        times = np.concatenate([[0.0], times])
        values = np.concatenate([[1.0], values])
        if math.isfinite(self.until_s):
            keep = times < self.until_s
            times = np.concatenate([times[keep], [self.until_s]])
            values = np.concatenate([values[keep], [1.0]])
        return compress(times, values)


@dataclass(frozen=True)
class LinkDown:
    """``link`` is removed from ``at_s`` until ``until_s`` (routes are recomputed)."""

    link: str
    at_s: float
    until_s: float = math.inf


@dataclass(frozen=True)
class HostDown:
    """``host`` is lost from ``at_s`` until ``until_s`` (plans using it become invalid)."""

    host: str
    at_s: float
    until_s: float = math.inf


Event = Degrade | LinkDown | HostDown
