"""Gymnasium environment ``hetpar/PlanBuilder-v0`` and the topology suites it samples.

Importing ``hetpar`` registers the environment when gymnasium is installed (the ``rl``
extra): ``gymnasium.make("hetpar/PlanBuilder-v0", suite="train-small")``.
"""

from __future__ import annotations

__all__ = ["ENV_ID", "register"]

ENV_ID = "hetpar/PlanBuilder-v0"


def register() -> bool:
    """Register the environment with gymnasium; False when gymnasium is missing."""
    try:
        import gymnasium
    except ImportError:
        return False
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="hetpar.envs.env:PlanBuilderEnv")
    return True
