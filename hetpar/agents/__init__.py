"""Learned planners: a size-independent ``MaskablePPO`` policy over ``PlanBuilder-v0``.

* ``hetpar.agents.planning``: ``plan(problem, method)``, the one entry point of every
  planning method (solvers, local search and the policy), returning a ``Solution``;
* ``hetpar.agents.planner``: planning with a trained policy (``plan_with_policy``);
* ``hetpar.agents.io``: save / load policy files with metadata (``load_policy``);
* ``hetpar.agents.policy``: the host-attention policy (``HostAttentionPolicy``);
* ``hetpar.agents.train``: ``hetpar train`` (configs in ``configs/train/``).

Importing this package does not import torch; the submodules that need it do.
``plan`` and ``METHODS`` are re-exported from ``planning`` on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["METHODS", "plan"]


def __getattr__(name: str) -> Any:
    # Lazily: ``import hetpar.agents`` stays as light as it was (no solvers, no env).
    if name in __all__:
        from hetpar.agents import planning

        return getattr(planning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
