"""The analytic cost model: plan -> Estimate (time distribution, breakdown, memory)."""

from hetpar.costmodel.constants import CostConstants, GpuEfficiency, load_constants
from hetpar.costmodel.estimate import CostModel, Estimate, ReplicaMemory, StageCost, estimate
from hetpar.costmodel.objective import Objective
from hetpar.costmodel.version import COST_MODEL_VERSION, constants_digest, cost_model_id

__all__ = ["CostConstants", "GpuEfficiency", "load_constants", "CostModel", "Estimate",
           "ReplicaMemory", "StageCost", "estimate", "Objective", "COST_MODEL_VERSION",
           "constants_digest", "cost_model_id"]
