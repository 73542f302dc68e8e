"""hetpar: hybrid-parallel training plans for heterogeneous GPU clusters on dynamic networks."""

from hetpar.cluster import Cluster, load_cluster
from hetpar.costmodel import CostModel, Estimate, estimate
from hetpar.errors import ConfigError, HetparError, PlanError
from hetpar.plan import Plan, Replica, Stage, validate_plan
from hetpar.workload import ModelSpec, TrainingSpec, load_model, load_training

__version__ = "0.1.0"

__all__ = ["Cluster", "load_cluster", "ModelSpec", "load_model", "TrainingSpec", "load_training",
           "Plan", "Stage", "Replica", "validate_plan", "CostModel", "Estimate", "estimate",
           "HetparError", "ConfigError", "PlanError", "__version__"]
