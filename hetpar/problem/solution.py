"""What every planner returns: ``Solution`` (the plan, its value and estimate, how it was
found and how long each part took) and, for the exact search, a ``Certificate``.

One result type for every method (exact, brute, the baselines, local search and the
policy's planners), so that ``hetpar solve``, ``hetpar plan`` and ``hetpar evaluate``
print and save the same fields.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from hetpar.costmodel.estimate import Estimate
from hetpar.plan import Plan
from hetpar.runtime.rules import runnable_by

__all__ = ["Certificate", "Solution", "TIMING_KEYS", "without_timings"]

#: Keys of ``Solution.to_dict`` (and of the documents that hold one) whose values are
#: wall-clock seconds: they differ from run to run, and ``--json`` leaves them out unless
#: ``--timings`` (``hetpar.cli.jsonout``).
TIMING_KEYS = frozenset({"wall_s", "timings_s"})


def strict_json(doc: Any) -> str:  # noqa: ANN401 - JSON-ready data
    """``doc`` as strict JSON text, every NaN or infinite float as null (``NaN`` and
    ``Infinity`` are not JSON; null stands for "none": no bound proven, no plan found).
    What every ``--json`` prints."""
    return json.dumps(_finite(doc), allow_nan=False, default=float)


def _finite(doc: Any) -> Any:  # noqa: ANN401
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


def without_timings(doc: Any, keys: frozenset[str] = TIMING_KEYS) -> Any:
    """``doc`` (JSON-ready data) without the entries of ``keys``, at any depth."""
    if isinstance(doc, dict):
        return {k: without_timings(v, keys) for k, v in doc.items() if k not in keys}
    if isinstance(doc, (list, tuple)):
        return [without_timings(v, keys) for v in doc]
    return doc


@dataclass(frozen=True)
class Certificate:
    """How a search went: its counts and, when it stopped early, the bound it proved.

    ``lower_bound`` is a proven lower bound of the optimum (equal to the objective when
    the search completed); ``space_size`` is the number of plans the space holds before
    pruning (``space_size_exact`` says whether it was counted or estimated).
    """

    optimal: bool
    lower_bound: float
    nodes: int = 0
    leaves: int = 0
    pruned_bound: int = 0
    pruned_memory: int = 0
    pruned_symmetry: int = 0
    space_size: float = 0.0
    space_size_exact: bool = False
    wall_s: float = 0.0
    workers: int = 1
    stopped: str = ""  # "", "time limit", "interrupted" or "space too large" (seed returned)

    @property
    def pruned_fraction(self) -> float:
        """Share of the space's plans never evaluated."""
        if self.space_size <= 0:
            return 0.0
        return max(0.0, 1.0 - self.leaves / self.space_size)

    def to_dict(self) -> dict[str, Any]:
        return {"optimal": self.optimal, "lower_bound_s": self.lower_bound, "nodes": self.nodes,
                "leaves": self.leaves, "pruned_bound": self.pruned_bound,
                "pruned_memory": self.pruned_memory, "pruned_symmetry": self.pruned_symmetry,
                "space_size": self.space_size, "space_size_exact": self.space_size_exact,
                "pruned_fraction": self.pruned_fraction, "wall_s": self.wall_s,
                "workers": self.workers, "stopped": self.stopped}


@dataclass(frozen=True)
class Solution:
    """A planner's answer.

    ``value`` is the problem's score of ``plan`` (``Problem.value``), ``found_by`` the part
    of the method that found it (e.g. ``metis``, ``dive`` or ``search`` for exact;
    ``rollout``, ``refine`` or ``improve`` for the policy), ``timings`` the seconds of each
    part (``wall_s`` is their whole), ``details`` method-specific figures.
    """

    method: str
    objective: str
    plan: Plan | None
    estimate: Estimate | None
    value: float  # the objective's value in seconds (inf when no plan fits)
    wall_s: float
    evaluations: int = 0
    certificate: Certificate | None = None
    details: dict[str, Any] = field(default_factory=dict)
    found_by: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)  # Problem.describe()

    @property
    def found(self) -> bool:
        return self.plan is not None and math.isfinite(self.value)

    @property
    def lower_bound(self) -> float | None:
        """A proven lower bound of the optimum, where the method proves one."""
        return self.certificate.lower_bound if self.certificate is not None else None

    @property
    def optimal(self) -> bool:
        return self.certificate is not None and self.certificate.optimal and self.found

    @property
    def gap(self) -> float:
        """Relative distance between the value and the proven bound (0 when optimal)."""
        if self.certificate is None or not self.found:
            return math.inf
        lb = self.certificate.lower_bound
        return 0.0 if lb >= self.value else self.value / lb - 1.0 if lb > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """The result fields every command prints with ``--json``."""
        return {"method": self.method, "objective": self.objective,
                "inputs": dict(self.inputs), "found": self.found, "value_s": self.value,
                "found_by": self.found_by, "optimal": self.optimal,
                "lower_bound_s": self.lower_bound,
                "gap": self.gap if self.certificate is not None else None,
                "wall_s": self.wall_s, "timings_s": dict(self.timings),
                "evaluations": self.evaluations,
                "plan": self.plan.to_dict() if self.plan else None,
                # The frameworks that can run the plan as it stands (hetpar.runtime).
                "runtimes": list(runnable_by(self.plan)) if self.plan else [],
                "estimate": self.estimate.to_dict() if self.estimate is not None else None,
                "certificate": (self.certificate.to_dict() if self.certificate is not None
                                else None),
                "details": self.details}
