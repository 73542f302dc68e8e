"""Plain data of the environment: one problem instance of a topology suite."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from hetpar.cluster.topology import Cluster, parse_cluster
from hetpar.workload.model import ModelSpec, parse_model
from hetpar.workload.training import TrainingSpec, parse_training

__all__ = ["Instance"]


@dataclass(frozen=True, eq=False)
class Instance:
    """A cluster (with its bandwidth models), a model and a training spec.

    The three documents are kept in the formats of ``configs/`` (cluster, model and
    training YAML), so an instance saves as plain data and a saved test set reloads into
    exactly the same objects. ``seed`` is the seed it was generated from (or -1).
    """

    name: str
    cluster_doc: dict[str, Any]
    model_doc: dict[str, Any]
    training_doc: dict[str, Any]
    seed: int = -1
    meta: dict[str, Any] = field(default_factory=dict)  # suite, family fields; free-form

    @cached_property
    def cluster(self) -> Cluster:
        return parse_cluster(self.cluster_doc, f"instance {self.name}: cluster")

    @cached_property
    def model(self) -> ModelSpec:
        return parse_model(self.model_doc, f"instance {self.name}: model")

    @cached_property
    def training(self) -> TrainingSpec:
        return parse_training(self.training_doc, f"instance {self.name}: training")

    @property
    def num_hosts(self) -> int:
        return len(self.cluster.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "meta": dict(self.meta),
                "cluster": self.cluster_doc, "model": self.model_doc,
                "training": self.training_doc}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Instance:
        return cls(name=str(data["name"]), cluster_doc=data["cluster"], model_doc=data["model"],
                   training_doc=data["training"], seed=int(data.get("seed", -1)),
                   meta=dict(data.get("meta", {})))
