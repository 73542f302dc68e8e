"""Parallelisation plans (configs/README.md, section 5): JSON format and validity rules.

A plan is a pipeline of stages; a stage holds ``layers`` transformer layers, runs them
with ``tp``-way tensor parallelism and is replicated (data parallelism) over its
``replicas``, each replica being ``tp`` GPUs of one host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetpar import limits
from hetpar.configio import Reader, load_document, parse_text
from hetpar.errors import ConfigError, PlanError
from hetpar.workload.training import RECOMPUTE_MODES

if TYPE_CHECKING:
    from hetpar.cluster.topology import Cluster
    from hetpar.workload.model import ModelSpec
    from hetpar.workload.training import TrainingSpec

__all__ = ["Plan", "Stage", "Replica", "validate_plan", "PLAN_VERSION"]

PLAN_VERSION = 1


@dataclass(frozen=True)
class Replica:
    host: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Stage:
    layers: int
    tp: int
    replicas: tuple[Replica, ...]

    @cached_property
    def dp(self) -> int:
        return len(self.replicas)


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    micro_batches: int
    recompute: str = "none"
    zero: int = 0
    version: int = PLAN_VERSION

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_gpus(self) -> int:
        return sum(s.tp * s.dp for s in self.stages)

    # ---- (de)serialisation -------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, source: str = "<plan>") -> Plan:
        """Parse a plan document; structural problems raise PlanError naming the field."""
        try:
            return cls._parse(data, source)
        except PlanError:
            raise
        except ConfigError as exc:
            raise PlanError(exc.source, exc.field, exc.problem) from None

    @classmethod
    def _parse(cls, data: Any, source: str) -> Plan:
        r = Reader.of(data, source)
        unknown = set(r.data) - {"version", "micro_batches", "recompute", "zero", "stages",
                                 "meta"}
        if unknown:
            raise PlanError(source, sorted(map(str, unknown))[0], "unknown plan field")
        version = r.int("version", PLAN_VERSION)
        if version != PLAN_VERSION:
            raise PlanError(source, "version", f"unsupported plan version {version} "
                                               f"(this hetpar reads version {PLAN_VERSION})")
        stages = []
        for sr in r.sub_list("stages"):
            if set(sr.data) - {"layers", "tp", "replicas"}:
                extra = sorted(map(str, set(sr.data) - {"layers", "tp", "replicas"}))[0]
                raise PlanError(source, sr.field(extra), "unknown stage field")
            replicas = []
            for rr in sr.sub_list("replicas"):
                if set(rr.data) - {"host", "gpus"}:
                    extra = sorted(map(str, set(rr.data) - {"host", "gpus"}))[0]
                    raise PlanError(source, rr.field(extra), "unknown replica field "
                                                             "(allowed: gpus, host)")
                gpus = rr.raw("gpus")
                if not isinstance(gpus, list) or not all(
                        isinstance(g, int) and not isinstance(g, bool)
                        and abs(g) < limits.MAX_GPUS_PER_HOST for g in gpus):
                    raise PlanError(source, rr.field("gpus"), "expected a list of GPU indices "
                                                              f"(0 to {limits.MAX_GPUS_PER_HOST - 1})")
                replicas.append(Replica(str(rr.str("host")), tuple(gpus)))
            stages.append(Stage(sr.int("layers", minimum=0, maximum=limits.MAX_LAYERS),
                                sr.int("tp", minimum=1, maximum=limits.MAX_GPUS_PER_HOST),
                                tuple(replicas)))
        if not stages:
            raise PlanError(source, "stages", "a plan needs at least one stage")
        return cls(
            stages=tuple(stages),
            micro_batches=r.int("micro_batches", minimum=1, maximum=limits.MAX_GLOBAL_BATCH),
            recompute=r.choice("recompute", RECOMPUTE_MODES, "none"),
            zero=r.int("zero", 0, minimum=0, maximum=3),
            version=version,
        )

    @classmethod
    def from_json(cls, text: str, source: str = "<json>") -> Plan:
        try:
            data = parse_text(text, source, json_format=True)
        except ConfigError as exc:
            raise PlanError(exc.source, exc.field, exc.problem) from None
        return cls.from_dict(data, source)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            data = load_document(path)
        except ConfigError as exc:
            raise PlanError(exc.source, exc.field, exc.problem) from None
        return cls.from_dict(data, str(path))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "micro_batches": self.micro_batches,
            "recompute": self.recompute,
            "zero": self.zero,
            "stages": [{"layers": s.layers, "tp": s.tp,
                        "replicas": [{"host": r.host, "gpus": list(r.gpus)} for r in s.replicas]}
                       for s in self.stages],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        """Write atomically, so an interrupted save never leaves a half-written plan."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.to_json() + "\n", encoding="utf-8")
        tmp.replace(path)

    def describe(self) -> str:
        parts = []
        for i, s in enumerate(self.stages):
            hosts = sorted({r.host for r in s.replicas})
            parts.append(f"S{i}[{s.layers}L tp{s.tp} dp{s.dp} on {','.join(hosts)}]")
        return f"M={self.micro_batches} {self.recompute} zero{self.zero}: " + " | ".join(parts)


def validate_plan(plan: Plan, cluster: Cluster, model: ModelSpec, training: TrainingSpec, *,
                  source: str = "<plan>", allow_empty_stages: bool = False) -> None:
    """Raise PlanError naming the first broken validity rule (configs/README.md, section 5).

    ``allow_empty_stages`` admits stages without transformer layers (holding only the
    embedding or head), which some published plans use; the searched space never does.
    """
    if plan.recompute not in training.recompute_modes:
        raise PlanError(source, "recompute", f"mode {plan.recompute!r} is not allowed by the "
                                             f"training spec ({', '.join(training.recompute_modes)})")
    if plan.zero not in training.zero_stages:
        raise PlanError(source, "zero", f"ZeRO stage {plan.zero} is not allowed by the training "
                                        f"spec ({', '.join(map(str, training.zero_stages))})")
    used: dict[tuple[str, int], str] = {}
    total_layers = 0
    for i, stage in enumerate(plan.stages):
        where = f"stages[{i}]"
        if stage.layers < (0 if allow_empty_stages else 1):
            raise PlanError(source, f"{where}.layers", "every stage needs at least one layer")
        total_layers += stage.layers
        if model.heads % stage.tp:
            raise PlanError(source, f"{where}.tp", f"tp {stage.tp} does not divide the "
                                                   f"model's {model.heads} attention heads")
        if not stage.replicas:
            raise PlanError(source, f"{where}.replicas", "a stage needs at least one replica")
        for j, rep in enumerate(stage.replicas):
            rw = f"{where}.replicas[{j}]"
            if rep.host not in cluster.host_index:
                raise PlanError(source, f"{rw}.host", f"unknown host {rep.host!r} in cluster "
                                                      f"{cluster.name}")
            host = cluster.host(rep.host)
            if len(rep.gpus) != stage.tp:
                raise PlanError(source, f"{rw}.gpus", f"a replica needs exactly tp={stage.tp} "
                                                      f"GPUs of one host, got {len(rep.gpus)}")
            for g in rep.gpus:
                if not 0 <= g < host.num_gpus:
                    raise PlanError(source, f"{rw}.gpus", f"host {rep.host!r} has no GPU {g} "
                                                          f"(it has {host.num_gpus})")
                if (rep.host, g) in used:
                    raise PlanError(source, f"{rw}.gpus", f"GPU {g} of host {rep.host!r} is "
                                                          f"already used by {used[rep.host, g]}")
                used[rep.host, g] = rw
    if total_layers != model.layers:
        raise PlanError(source, "stages", f"stage layers sum to {total_layers}, the model "
                                          f"{model.name} has {model.layers}")
    batch = training.global_batch
    if batch % plan.micro_batches:
        raise PlanError(source, "micro_batches", f"global batch {batch} does not divide evenly "
                                                 f"into {plan.micro_batches} micro-batches")
    mbs = batch // plan.micro_batches
    for i, stage in enumerate(plan.stages):
        if mbs % stage.dp:
            raise PlanError(source, f"stages[{i}].replicas",
                            f"micro-batch of {mbs} sequences does not divide evenly over "
                            f"{stage.dp} replicas")
