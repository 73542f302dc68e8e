"""What a planner may ask of ``PlanBuilderEnv``: the ``SearchEnv`` protocol.

A planner that drives the environment with a policy (``hetpar.agents.planner``: the
speculative greedy rollout and the beam search; ``hetpar.agents.imitation``: replayed
expert plans) uses Gymnasium's ``reset``/``step``, sb3-contrib's ``action_masks`` and the
members below, and nothing else: the rest of the environment (its instance context,
feasibility oracles and episode record) is private and may change. ``PlanBuilderEnv``
implements the protocol; the tests check that it does.

* **The action layout**: ``layout`` (an ``ActionLayout``: which index is which decision).
* **Masks without the whole mask**: the mask of a TP option costs a completion search, and
  a confident policy needs the answer for one action only. ``known_masks()`` is the mask
  when it costs nothing (else None), ``allows(a)`` is ``action_masks()[a]``,
  ``phase_actions()`` the actions of the current phase's kinds (a superset of the mask)
  and ``masked_argmax(logits)`` the policy's deterministic choice. Each answer equals the
  one the full mask gives.
* **Branching**: ``snapshot()`` copies the episode so far into an opaque ``Snapshot`` and
  ``restore(snapshot)`` continues from it; ``state_key()`` is equal for states with equal
  futures (so a search can merge them).
* **Instances**: ``retarget(instance)`` is a one-instance environment for the same
  cluster under other link bandwidth that shares this one's feasibility tables (a
  re-planner's next network state); ``actions_for(plan)`` is the action sequence that
  builds ``plan``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hetpar.envs.actions import ActionLayout
from hetpar.plan import Plan
from hetpar.problem.instance import Instance

__all__ = ["SearchEnv", "Snapshot"]


class Snapshot(Protocol):
    """An episode saved by ``SearchEnv.snapshot``: opaque, only ``restore`` of the
    environment that made it reads it."""


@runtime_checkable
class SearchEnv(Protocol):
    """The environment as a planner sees it (see the module docstring)."""

    layout: ActionLayout

    # Gymnasium's and sb3-contrib's API.
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool,
                                         dict[str, Any]]: ...

    def action_masks(self) -> np.ndarray: ...

    # Masks without the whole mask.
    def known_masks(self) -> np.ndarray | None:
        """The current state's mask when already known, else None."""
        ...

    def allows(self, action: int) -> bool:
        """``action_masks()[action]``, without building the whole mask."""
        ...

    def phase_actions(self) -> np.ndarray:
        """Every action of the current phase's decision kinds, allowed or not."""
        ...

    def masked_argmax(self, logits: np.ndarray) -> int:
        """``argmax(where(action_masks(), logits, -inf))``, asking few actions."""
        ...

    def phase_name(self) -> str:
        """The decision the current state asks for (``hetpar.envs.types.PHASES``)."""
        ...

    # Branching.
    def snapshot(self) -> Snapshot:
        """An independent copy of the episode so far."""
        ...

    def restore(self, state: Snapshot, *, observe: bool = True,
                ) -> dict[str, np.ndarray] | None:
        """Continue from ``state``; its observation (None with ``observe=False``)."""
        ...

    def state_key(self) -> Hashable:
        """Equal for states with equal futures."""
        ...

    # Instances.
    def retarget(self, instance: Instance) -> SearchEnv:
        """This one-instance environment for ``instance`` (other link bandwidth)."""
        ...

    def actions_for(self, plan: Plan) -> list[int]:
        """The actions that build ``plan`` on the current episode's instance."""
        ...
