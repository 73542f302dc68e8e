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
        where = ": ".join(one_line(p, 200) for p in (source, field) if p)
        problem = one_line(problem, 600)
        super().__init__(f"{where}: {problem}" if where else problem)


def one_line(text: object, limit: int = 600) -> str:
    """``text`` as one line of at most ``limit`` characters: an error names the file,
    the field and the problem on exactly one line, whatever a field name (a YAML key) or
    a value holds."""
    out = " ".join(str(text).replace("\r", "\n").split("\n")) if text else ""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in out)
    return out if len(out) <= limit else out[:limit - 3] + "..."


class PlanError(ConfigError):
    """A plan breaks one of the validity rules (configs/README.md, section 5)."""


class InfeasibleError(HetparError):
    """No plan can run (for example the model fits on no GPU of the cluster)."""


class TrainingDiverged(HetparError):
    """A training run's network became NaN or infinite (a learning rate or coefficient
    too large for the data); what was saved before stays."""
