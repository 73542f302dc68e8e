"""Where an environment's instances come from: a generated suite or a fixed list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpar.problem.instance import Instance
from hetpar.errors import ConfigError

__all__ = ["InstanceSource", "as_source", "DEFAULT_POOL"]

# A generated suite is an endless family; by default an environment samples from its
# first DEFAULT_POOL instances (``instances=N`` for more). The pool fits the default
# per-instance cache, so each instance's tables (cost model, feasibility memo) are built
# once and reused: episodes on known instances run several times faster.
DEFAULT_POOL = 256
_UNBOUNDED = 2**31  # a generated family's index range (as Suite.instance)


@dataclass
class InstanceSource:
    name: str
    max_hosts: int
    count: int
    _get: Any  # callable: index -> Instance
    fixed: bool  # a finite list (checked in full at construction)
    _pinned: dict[int, Instance] = field(default_factory=dict)

    def get(self, index: int) -> Instance:
        if index < 0:
            return self._pinned[index]
        if not 0 <= index < self.count:
            raise ConfigError(self.name, "instance", f"index {index} outside 0..{self.count - 1}")
        return self._get(index)

    def pin(self, key: int, instance: Instance) -> None:
        """Register an explicit instance under a negative key (``reset(options=...)``)."""
        self._pinned[key] = instance

    def check_indices(self) -> range:
        """Instances to check at construction: all of a fixed list (so a bad test set fails
        at once), the first few of a generated suite (its generator guarantees the rest)."""
        return range(self.count) if self.fixed and self.count <= 256 else range(min(4, self.count))


def as_source(suite: Any, instances: int | None = None) -> InstanceSource:
    """A suite name or file, a ``Suite``, an instances file, a list of instances or one."""
    if isinstance(suite, Instance):
        suite = [suite]
    if isinstance(suite, Sequence) and not isinstance(suite, str):
        items = list(suite)
        if not items or not all(isinstance(i, Instance) for i in items):
            raise ConfigError("<instances>", "suite", "expected a non-empty list of Instance")
        return InstanceSource("<instances>", max(i.num_hosts for i in items),
                              _count(len(items), instances), items.__getitem__, True)
    if isinstance(suite, (str, Path)):
        from hetpar.problem import generator  # suites need the generator; lists do not

        path = Path(suite)
        if path.is_file() and generator.is_instances_file(path):
            items = generator.load_instances(path)
            if not items:
                raise ConfigError(str(path), "instances", "holds no instances")
            return InstanceSource(str(path), max(i.num_hosts for i in items),
                                  _count(len(items), instances), items.__getitem__, True)
        suite = generator.load_suite(suite)
    if not hasattr(suite, "instance") or not hasattr(suite, "max_hosts"):
        raise ConfigError("<suite>", "suite", f"expected a suite name, file, Suite or list of "
                                              f"instances, got {type(suite).__name__}")
    size = getattr(suite, "size", None)
    fixed = getattr(suite, "fixed", None) is not None  # an explicit list, not a family
    limit = size if size is not None else _UNBOUNDED
    # DEFAULT_POOL is the default only: an explicit ``instances`` may ask for more.
    count = min(limit, DEFAULT_POOL) if instances is None else _count(limit, instances)
    return InstanceSource(str(getattr(suite, "name", "<suite>")), int(suite.max_hosts), count,
                          suite.instance, fixed)


def _count(available: int, wanted: int | None) -> int:
    if wanted is None:
        return available
    if wanted < 1:
        raise ConfigError("<suite>", "instances", f"must be at least 1, got {wanted}")
    return min(wanted, available)
