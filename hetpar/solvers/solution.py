"""What a solver returns: the plan, its estimate and (for exact search) a certificate."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hetpar.costmodel.estimate import Estimate
from hetpar.plan import Plan

__all__ = ["Certificate", "Solution"]


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
    method: str
    objective: str
    plan: Plan | None
    estimate: Estimate | None
    value: float  # the objective's value in seconds (inf when no plan fits)
    wall_s: float
    evaluations: int = 0
    certificate: Certificate | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.plan is not None and math.isfinite(self.value)

    @property
    def gap(self) -> float:
        """Relative distance between the value and the proven bound (0 when optimal)."""
        if self.certificate is None or not self.found:
            return math.inf
        lb = self.certificate.lower_bound
        return 0.0 if lb >= self.value else self.value / lb - 1.0 if lb > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "objective": self.objective,
                               "value_s": self.value, "wall_s": self.wall_s,
                               "evaluations": self.evaluations,
                               "plan": self.plan.to_dict() if self.plan else None,
                               "details": self.details}
        if self.estimate is not None:
            out["estimate"] = self.estimate.to_dict()
        if self.certificate is not None:
            out["certificate"] = self.certificate.to_dict()
            out["gap"] = self.gap
        return out
