"""Searching the plan space: exact branch and bound, enumeration, and baselines."""

from hetpar.solvers.api import METHODS, Progress, solve
from hetpar.solvers.solution import Certificate, Solution
from hetpar.solvers.space import PlanSpace, StageChoice, SymmetryCheck

__all__ = ["solve", "METHODS", "Progress", "Solution", "Certificate", "PlanSpace",
           "StageChoice", "SymmetryCheck"]
