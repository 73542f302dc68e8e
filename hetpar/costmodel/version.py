"""Which cost model scored a value: a version for its formulas, a digest for its constants.

Stored values (the reference optima of ``configs/references/``) are only comparable with
values the same cost model gives. Two things can change a plan's value: the formulas in
this package, and the calibrated constants they read (``configs/calibration.yaml``).
``COST_MODEL_VERSION`` names the first and must be raised by hand whenever a change to
``hetpar.costmodel`` changes any plan's value or feasibility; ``constants_digest`` names
the second and changes by itself when the constants are refitted. The GPU catalog's
datasheet figures also enter a value; they are not in the digest (adding a GPU type
would stale every file), so ``hetpar reference check`` re-scores every stored plan.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hetpar.costmodel.constants import CostConstants, load_constants

__all__ = ["COST_MODEL_VERSION", "constants_digest", "cost_model_id"]

COST_MODEL_VERSION = 1


def constants_digest(constants: CostConstants | None = None) -> str:
    """A short digest of the calibrated constants (the bundled ones by default)."""
    consts = constants if constants is not None else load_constants()
    text = json.dumps(consts.to_dict(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def cost_model_id(constants: CostConstants | None = None) -> dict[str, Any]:
    """What a stored value records about the cost model that scored it."""
    return {"version": COST_MODEL_VERSION, "constants_digest": constants_digest(constants)}
