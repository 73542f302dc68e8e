"""Errors that reach users as one line: where the problem is, and what it is."""

from __future__ import annotations


class HetparError(Exception):
    """Base class for every error hetpar reports to a user (CLI exit status 2)."""


class ConfigError(HetparError):
    """A configuration file (or dict) is malformed or names something unknown.

    ``source`` is the file (or a short label such as ``<dict>``), ``field`` a dotted path
    to the offending value (``hosts[2].nic_gbps``); either may be empty.
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        where = ": ".join(p for p in (source, field) if p)
        super().__init__(f"{where}: {problem}" if where else problem)


class PlanError(ConfigError):
    """A plan breaks one of the validity rules (configs/README.md, section 5)."""


class InfeasibleError(HetparError):
    """No plan can run (for example the model fits on no GPU of the cluster)."""
