"""Learned planners: a size-independent ``MaskablePPO`` policy over ``PlanBuilder-v0``.

* ``hetpar.agents.io``: save / load policy files with metadata (``load_policy``);
* ``hetpar.agents.policy``: the host-attention policy (``HostAttentionPolicy``);
* ``hetpar.agents.train``: ``hetpar train`` (configs in ``configs/train/``).

Importing this package does not import torch; the submodules that need it do.
"""

from __future__ import annotations

__all__: list[str] = []
