"""hetpar: hybrid-parallel training plans for heterogeneous GPU clusters on dynamic networks."""

from hetpar.cluster import Cluster, load_cluster
from hetpar.costmodel import CostModel, Estimate, estimate
from hetpar.envs import register as _envs_register
from hetpar.errors import ConfigError, HetparError, PlanError
from hetpar.plan import Plan, Replica, Stage, validate_plan
from hetpar.workload import ModelSpec, TrainingSpec, load_model, load_training

__version__ = "0.1.0"

# Registers hetpar/PlanBuilder-v0 with gymnasium when it is installed (extra "rl").
_envs_register()

__all__ = ["Cluster", "load_cluster", "ModelSpec", "load_model", "TrainingSpec", "load_training",
           "Plan", "Stage", "Replica", "validate_plan", "CostModel", "Estimate", "estimate",
           "HetparError", "ConfigError", "PlanError", "__version__"]
