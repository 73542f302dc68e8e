"""Searching the plan space: exact branch and bound, enumeration, and baselines."""

from hetpar.solvers.api import METHODS, Progress, solve

__all__ = ["solve", "METHODS", "Progress"]
