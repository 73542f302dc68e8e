"""What is trained: the model architecture and the training settings."""

from hetpar.workload.model import ModelSpec, load_model, parse_model
from hetpar.workload.training import RECOMPUTE_MODES, TrainingSpec, load_training, parse_training

__all__ = ["ModelSpec", "load_model", "parse_model", "TrainingSpec", "load_training",
           "parse_training", "RECOMPUTE_MODES"]
