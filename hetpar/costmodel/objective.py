"""Risk measures of an iteration-time distribution: mean, quantiles and CVaR."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from hetpar.errors import ConfigError

__all__ = ["Objective", "cvar", "quantile"]


def quantile(samples: np.ndarray, q: float) -> float:
    return float(np.quantile(samples, q))


def cvar(samples: np.ndarray, alpha: float) -> float:
    """Mean of the worst (1 - alpha) tail (Rockafellar-Uryasev, discrete samples).

    Uses the exact discrete definition: the tail weight of the sample that straddles the
    alpha quantile is split, so CVaR is continuous in alpha and CVaR_0 is the mean.
    """
    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    if alpha <= 0:
        return float(x.mean())
    tail = (1.0 - alpha) * n  # how many samples' worth of weight lie in the tail
    if tail <= 0:
        return float(x[-1])
    whole = int(math.floor(tail))
    frac = tail - whole
    total = x[n - whole:].sum() if whole else 0.0
    if frac > 0:
        total += frac * x[n - whole - 1]
    return float(total / tail)


_PATTERN = re.compile(r"^(mean|p(\d{1,2}(?:\.\d+)?)|cvar(0?\.\d+|\d{1,2}))$")


@dataclass(frozen=True)
class Objective:
    """What a search minimises: ``mean``, ``pNN`` (quantile) or ``cvarA`` (CVaR at A)."""

    kind: str  # mean | quantile | cvar
    level: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Objective:
        m = _PATTERN.match(text.strip().lower())
        if not m:
            raise ConfigError("", "objective", f"expected mean, pNN (e.g. p90) or cvarA "
                                               f"(e.g. cvar0.9), got {text!r}")
        if m.group(1) == "mean":
            return cls("mean")
        if m.group(2) is not None:
            level = float(m.group(2)) / 100.0
            return cls("quantile", level)
        raw = m.group(3)
        level = float(raw) if "." in raw else float(raw) / 100.0
        return cls("cvar", level)

    @property
    def name(self) -> str:
        if self.kind == "mean":
            return "mean"
        if self.kind == "quantile":
            return f"p{self.level * 100:g}"
        return f"cvar{self.level:g}"

    def rows(self, samples: np.ndarray) -> np.ndarray:
        """The objective of each row of ``samples`` ((N, K)): what ``__call__`` gives each
        row, vectorised (scoring a batch of plans)."""
        x = np.asarray(samples, dtype=float)
        if self.kind == "mean":
            return x.mean(axis=1)
        if self.kind == "quantile":
            return np.quantile(x, self.level, axis=1)
        n = x.shape[1]
        if self.level <= 0:
            return x.mean(axis=1)
        x = np.sort(x, axis=1)
        tail = (1.0 - self.level) * n
        if tail <= 0:
            return x[:, -1].copy()
        whole = int(math.floor(tail))
        frac = tail - whole
        total = x[:, n - whole:].sum(axis=1) if whole else np.zeros(len(x))
        if frac > 0:
            total = total + frac * x[:, n - whole - 1]
        return total / tail

    def score(self, samples: np.ndarray | float, feasible: bool) -> float:
        """A plan's value: the objective over its iteration times, or infinity when it
        does not fit in memory (the one definition every planner and the env use)."""
        if not feasible:
            return math.inf
        return self(np.atleast_1d(np.asarray(samples, dtype=float)))

    def score_rows(self, samples: np.ndarray, feasible: np.ndarray) -> np.ndarray:
        """``score`` of each row of ``samples`` ((N, K)) with its ``feasible`` flag, at once
        (scoring a batch of plans)."""
        return np.where(feasible, self.rows(samples), np.inf)

    def __call__(self, samples: np.ndarray) -> float:
        if self.kind == "mean":
            return float(np.mean(samples))
        if self.kind == "quantile":
            return quantile(samples, self.level)
        return cvar(samples, self.level)
