"""When a running job should switch plans: the rule every strategy decides with.

At a change of the network the strategy offers plans (its candidates); the rule gives
each the time it is expected to save over the rest of the run against the plan running
now, and the simulator switches to the best one whose expected saving exceeds the cost
of migrating to it. Rules differ in what they believe about the future:

* ``expected``: the state just entered lasts as long as states have lasted
  so far in this run (on average), then the network behaves as it has so far: each
  plan's expected throughput is its time-weighted mean throughput over the states seen
  (0 where it could not run). A plan better only while this state lasts is worth its
  saving over that time less the migration back at its end. A forecast from the trace
  so far, the same for every strategy, with no knowledge of what comes next.
* ``recent:H`` (the default, ``recent:600``): as ``expected``, but the past is weighted by
  its recency, with a half-life of ``H`` seconds (an exponentially weighted mean over
  time): on a network that drifts one way (congestion building for hours) it expects the
  recent speeds, not the run's average, to continue. Measured on the scenario suite
  against ``expected`` in docs/results-dynamic.md.
* ``persist``: the state just entered lasts for the rest of the run (the most eager).
* ``lookahead:S``: the saving over a window of ``S`` seconds (at most the rest of the
  run), at the new state's speeds (the rule earlier hetpar versions used, 600 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from hetpar.errors import ConfigError
from hetpar.plan import Plan

__all__ = ["Belief", "SwitchRule", "parse_rule", "RULES"]

RULES = ("expected", "recent:H", "persist", "lookahead:S")


@dataclass
class Belief:
    """What has been seen so far: per plan, the time-weighted sum of its throughput
    (iterations per second) over the past states, and how long states lasted."""

    rate_of: Callable[[Plan, int], float]  # (plan, state index) -> iterations/s (0: cannot run)
    # Recency weighting of the past (``recent:H``): the half-life in seconds (None: none).
    half_life_s: float | None = None
    durations: list[float] = field(default_factory=list)  # finished states' durations
    elapsed_s: float = 0.0  # their sum
    # Per plan: the (weighted) time-weighted throughput summed over the first ``n``
    # finished states, as of ``elapsed_s`` then.
    _sums: dict[Plan, tuple[float, int, float]] = field(default_factory=dict)

    def observe(self, duration_s: float) -> None:
        """The state ``len(durations)`` ended after ``duration_s`` seconds."""
        self.durations.append(duration_s)
        self.elapsed_s += duration_s

    def _weight(self, start_s: float, end_s: float) -> float:
        """The weight of the past from ``start_s`` to ``end_s`` (seconds since the run
        began), now (``elapsed_s``): its length, or with a half-life the integral of
        ``2 ** (-(elapsed - t) / H)`` over it."""
        if self.half_life_s is None:
            return end_s - start_s
        h = self.half_life_s
        return h / math.log(2.0) * (2.0 ** (-(self.elapsed_s - end_s) / h)
                                    - 2.0 ** (-(self.elapsed_s - start_s) / h))

    def _decay(self, since_s: float) -> float:
        """What a weight of ``since_s`` (then) is worth now."""
        if self.half_life_s is None:
            return 1.0
        return 2.0 ** (-(self.elapsed_s - since_s) / self.half_life_s)

    def mean_rate(self, plan: Plan, now: int) -> float:
        """(Recency-)weighted mean throughput of ``plan`` over the finished states and
        the current one (``now``, counted as lasting the mean duration)."""
        done, n, as_of = self._sums.get(plan, (0.0, 0, 0.0))
        recent = self.half_life_s is not None
        if recent:
            done *= self._decay(as_of)
        start = sum(self.durations[:n]) if recent else 0.0
        for k in range(n, len(self.durations)):
            d = self.durations[k]
            done += (self._weight(start, start + d) if recent else d) * self.rate_of(plan, k)
            start += d
        self._sums[plan] = (done, len(self.durations), self.elapsed_s)
        h = self.holding_s()
        if not math.isfinite(h):
            return self.rate_of(plan, now)
        past = self._weight(0.0, self.elapsed_s) if recent else self.elapsed_s
        return (done + h * self.rate_of(plan, now)) / (past + h)

    def holding_s(self) -> float:
        """Expected time the current state lasts: the mean duration of the finished ones
        (unknown before any has finished: infinite, i.e. it persists)."""
        return self.elapsed_s / len(self.durations) if self.durations else math.inf


@dataclass(frozen=True)
class SwitchRule:
    """``kind``: recent (the default, half-life ``window_s``) | expected | persist |
    lookahead (window ``window_s``)."""

    kind: str = "recent"
    window_s: float = 600.0  # lookahead's window, recent's half-life

    @property
    def name(self) -> str:
        if self.kind in ("lookahead", "recent"):
            return f"{self.kind}:{self.window_s:g}"
        return self.kind

    def belief(self, rate_of: Callable[[Plan, int], float]) -> Belief:
        """A fresh belief of the kind this rule reasons with."""
        return Belief(rate_of, half_life_s=self.window_s if self.kind == "recent" else None)

    def remaining_s(self, plan: Plan, now_iter_s: float, work: float, belief: Belief,
                    state: int) -> float:
        """Expected seconds to finish ``work`` iterations with ``plan`` from now (its
        iteration time now: ``now_iter_s``)."""
        if not math.isfinite(now_iter_s):
            return math.inf
        here = work * now_iter_s
        if self.kind == "persist":
            return here
        h = belief.holding_s()
        if here <= h:
            return here
        rest = work - h / now_iter_s
        rate = belief.mean_rate(plan, state)
        return h + rest / rate if rate > 0 else math.inf

    def saving_s(self, current: Plan, cur_s: float, new: Plan, new_s: float, work: float,
                 belief: Belief, state: int, back_s: float = 0.0) -> float:
        """Expected seconds ``new`` saves over the rest of the run against ``current``
        (iteration times now ``cur_s``, ``new_s``); ``back_s``: what switching back
        would cost, for a rule that may expect to."""
        if not math.isfinite(cur_s):
            return math.inf
        if self.kind == "lookahead":
            window = min(self.window_s, work * cur_s)
            return window * (1.0 - new_s / cur_s)
        if self.kind == "persist":
            return work * (cur_s - new_s)
        # expected: the saving while this state lasts, then the difference of the two
        # plans' mean throughputs, or, where the new plan is the worse one on average,
        # the switch back at the state's end (whichever costs less).
        h = belief.holding_s()
        now = min(work, h / cur_s)
        saving = now * (cur_s - new_s)
        rest = work - now
        if rest <= 0:
            return saving
        r_cur, r_new = belief.mean_rate(current, state), belief.mean_rate(new, state)
        after = (rest / r_cur if r_cur > 0 else math.inf) - (
            rest / r_new if r_new > 0 else math.inf)
        if math.isnan(after):
            after = 0.0
        return saving + max(after, -back_s)


def parse_rule(text: str) -> SwitchRule:
    """``expected``, ``recent:H``, ``persist`` or ``lookahead:S`` (H, S seconds)."""
    text = text.strip()
    if text in ("expected", "persist"):
        return SwitchRule(text)
    if text.startswith("recent:"):
        return SwitchRule("recent", _seconds(text, "recent:H needs a positive half-life in "
                                                   "seconds"))
    if text == "lookahead":
        return SwitchRule("lookahead", 600.0)
    if text.startswith("lookahead:"):
        return SwitchRule("lookahead", _seconds(text, "lookahead:S needs a positive number "
                                                      "of seconds"))
    raise ConfigError("--switch-rule", "", f"unknown rule {text!r} (known: "
                                           f"{', '.join(RULES)})")


def _seconds(text: str, need: str) -> float:
    """The positive, finite number of seconds after the colon of ``text``."""
    try:
        value = float(text.partition(":")[2] or "nan")
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        raise ConfigError("--switch-rule", "", f"{need}, got {text!r}")
    return value
