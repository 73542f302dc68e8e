"""Which cost model scored a value: a version for its formulas, a digest for its constants.

Stored values (the reference optima of ``configs/references/``) are only comparable with
values the same cost model gives. Two things can change a plan's value: the formulas in
this package, and the calibrated constants they read (``configs/calibration.yaml``).
``COST_MODEL_VERSION`` names the first and must be raised by hand whenever a change to
``hetpar.costmodel`` changes any plan's value or feasibility; ``constants_digest`` names
the second and changes by itself when the constants are refitted. The GPU catalog's
datasheet figures also enter a value; they are not in the digest (adding a GPU type
would stale every file), so ``hetpar reference check`` re-scores every stored plan.

``instance_constants_digest`` names only the constants one instance's plans read: the
efficiencies its GPU types resolve to (their own, or what an uncalibrated type falls
back to: its architecture's calibrated type, else the default), its framework's and the
shared ones. A reference entry records it, so refitting
one GPU type (or adding one) stales only the entries of instances that use it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from hetpar.costmodel.constants import CostConstants, load_constants

__all__ = ["COST_MODEL_VERSION", "constants_digest", "cost_model_id",
           "instance_constants_digest"]

COST_MODEL_VERSION = 1


def _digest(doc: Any) -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def constants_digest(constants: CostConstants | None = None) -> str:
    """A short digest of the calibrated constants (the bundled ones by default)."""
    consts = constants if constants is not None else load_constants()
    return _digest(consts.to_dict())


def instance_constants_digest(gpu_types: Iterable[str | tuple[str, str]], framework: str,
                              constants: CostConstants | None = None) -> str:
    """A short digest of the constants that plans on these GPU types under this
    framework read (the bundled constants by default). A type is its name or (name,
    architecture): the architecture decides which entry an uncalibrated type reads."""
    consts = constants if constants is not None else load_constants()
    doc = consts.to_dict()
    arch = dict(t if isinstance(t, tuple) else (t, "") for t in gpu_types)
    return _digest({"gpus": {t: doc["gpus"][consts.gpu_key(t, arch[t])] for t in sorted(arch)},
                    "framework": doc["frameworks"].get(framework),
                    "shared": doc["shared"]})


def cost_model_id(constants: CostConstants | None = None) -> dict[str, Any]:
    """What a stored value records about the cost model that scored it."""
    return {"version": COST_MODEL_VERSION, "constants_digest": constants_digest(constants)}
