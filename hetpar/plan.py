"""Parallelisation plans (configs/README.md, section 5): JSON format and validity rules.

A plan is a pipeline of stages; a stage holds ``layers`` transformer layers, runs them
with ``tp``-way tensor parallelism and is replicated (data parallelism) over its
``replicas``, each replica being ``tp`` GPUs of one host.

Format version 2 adds four whole-plan options (a version-1 file still reads, and a plan
that uses none of them is written as version 1, so older readers keep reading it):

* ``sequence_parallel``: Megatron-LM's sequence parallelism (Korthikanti et al., 2022):
  the tensor-parallel group also splits the LayerNorm and dropout activations along the
  sequence; it needs a stage with ``tp`` > 1.
* ``virtual_stages``: the interleaved 1F1B schedule (Narayanan et al., 2021) with each
  stage's layers in that many chunks; it needs two stages or more, a count dividing every
  stage's layers, and a micro-batch count that is a multiple of the stage count (the
  schedule runs micro-batches in groups of one per stage; Megatron-LM asserts it).
* ``zero`` 2 and 3: gradients (2), and parameters too (3, as FSDP), sharded over each
  stage's replicas; 0 and 1 as before (1 = Megatron-LM's distributed optimizer).
* ``context_parallel``: Megatron-LM's context parallelism, each sequence split over that
  many TP blocks of a stage (consecutive entries of its ``replicas``, on one host), which
  exchange keys and values around a ring in every attention layer; a stage's
  data-parallel degree is then its replica count over it.
* ``offload``: ``"optimizer"`` keeps the optimizer states (fp32 master weights, Adam's
  moments) in host memory and runs the optimizer step on the host CPU (DeepSpeed's
  ZeRO-Offload, Megatron-LM's ``--optimizer-cpu-offload``); it needs ``zero`` >= 1.
  ``"none"`` (the default) keeps them on the GPUs. Activation offload is not modelled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetpar import limits
from hetpar.configio import Reader, load_document, parse_text
from hetpar.errors import ConfigError, PlanError
from hetpar.workload.training import OFFLOAD_MODES, RECOMPUTE_MODES

if TYPE_CHECKING:
    from hetpar.cluster.topology import Cluster
    from hetpar.workload.model import ModelSpec
    from hetpar.workload.training import TrainingSpec

__all__ = ["Plan", "Stage", "Replica", "validate_plan", "PLAN_VERSION", "OFFLOAD_MODES"]

PLAN_VERSION = 2
_V2_FIELDS = ("sequence_parallel", "virtual_stages", "context_parallel", "offload")


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
        """TP blocks of the stage (its data-parallel degree times the plan's context
        parallelism: what the cost model and the search count)."""
        return len(self.replicas)


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    micro_batches: int
    recompute: str = "none"
    zero: int = 0
    sequence_parallel: bool = False
    virtual_stages: int = 1
    context_parallel: int = 1
    offload: str = "none"  # OFFLOAD_MODES
    # The format version it was read from (not part of the plan's identity).
    version: int = field(default=1, compare=False)

    @property
    def format_version(self) -> int:
        """The oldest format that expresses the plan (what ``to_dict`` writes)."""
        return 2 if (self.sequence_parallel or self.virtual_stages != 1 or self.zero > 1
                     or self.context_parallel != 1 or self.offload != "none") else 1

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
                                 "meta", *_V2_FIELDS}
        if unknown:
            raise PlanError(source, sorted(map(str, unknown))[0], "unknown plan field")
        version = r.int("version", 1)
        if version not in (1, PLAN_VERSION):
            raise PlanError(source, "version", f"unsupported plan version {version} "
                                               f"(this hetpar reads versions 1 and {PLAN_VERSION})")
        if version == 1:
            newer = sorted(set(r.data) & set(_V2_FIELDS))
            if newer:
                raise PlanError(source, newer[0], "needs plan version 2 (set \"version\": 2)")
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
        offload = r.str("offload", "none")
        if offload not in OFFLOAD_MODES:
            raise PlanError(source, "offload", (
                "activation offload is not modelled" if offload == "activations" else
                f"unknown offload {offload!r}") + " (hetpar models: "
                + ", ".join(OFFLOAD_MODES) + ")")
        return cls(
            stages=tuple(stages),
            micro_batches=r.int("micro_batches", minimum=1, maximum=limits.MAX_GLOBAL_BATCH),
            recompute=r.choice("recompute", RECOMPUTE_MODES, "none"),
            zero=r.int("zero", 0, minimum=0, maximum=3 if version > 1 else 1),
            sequence_parallel=r.bool("sequence_parallel", False),
            virtual_stages=r.int("virtual_stages", 1, minimum=1, maximum=limits.MAX_LAYERS),
            context_parallel=r.int("context_parallel", 1, minimum=1,
                                   maximum=limits.MAX_GPUS_PER_HOST),
            offload=offload,
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
        out: dict[str, Any] = {
            "version": self.format_version,
            "micro_batches": self.micro_batches,
            "recompute": self.recompute,
            "zero": self.zero,
        }
        if self.format_version > 1:
            out.update(sequence_parallel=self.sequence_parallel,
                       virtual_stages=self.virtual_stages,
                       context_parallel=self.context_parallel,
                       offload=self.offload)
        out["stages"] = [{"layers": s.layers, "tp": s.tp,
                          "replicas": [{"host": r.host, "gpus": list(r.gpus)}
                                       for r in s.replicas]}
                         for s in self.stages]
        return out

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        """Write atomically, so an interrupted save never leaves a half-written plan."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.to_json() + "\n", encoding="utf-8")
        tmp.replace(path)

    def option_words(self) -> list[str]:
        """The version-2 options in use, in words (what reports and exports print)."""
        words = ["sequence parallel"] if self.sequence_parallel else []
        if self.virtual_stages > 1:
            words.append(f"{self.virtual_stages} virtual stages (interleaved 1F1B)")
        if self.context_parallel > 1:
            words.append(f"context parallel {self.context_parallel}")
        if self.offload != "none":
            words.append(f"{self.offload} offloaded to the host")
        return words

    def describe(self) -> str:
        parts = []
        for i, s in enumerate(self.stages):
            hosts = sorted({r.host for r in s.replicas})
            parts.append(f"S{i}[{s.layers}L tp{s.tp} dp{s.dp} on {','.join(hosts)}]")
        extra = (" sp" if self.sequence_parallel else "") + (
            f" v{self.virtual_stages}" if self.virtual_stages > 1 else "") + (
            f" cp{self.context_parallel}" if self.context_parallel > 1 else "") + (
            f" offload-{self.offload}" if self.offload != "none" else "")
        return (f"M={self.micro_batches} {self.recompute} zero{self.zero}{extra}: "
                + " | ".join(parts))


def validate_plan(plan: Plan, cluster: Cluster, model: ModelSpec, training: TrainingSpec, *,
                  source: str = "<plan>", allow_empty_stages: bool = False) -> None:
    """Raise PlanError naming the first broken validity rule (configs/README.md, section 5).

    ``allow_empty_stages`` admits stages without transformer layers (holding only the
    embedding or head), which some published plans use; the searched space never does.
    """
    if plan.recompute not in training.recompute_modes:
        raise PlanError(source, "recompute", f"mode {plan.recompute!r} is not allowed by the "
                                             f"training spec ({', '.join(training.recompute_modes)})")
    # The training spec lists the ZeRO stages the searchers choose among (0, 1); stages 2
    # and 3 are options of a plan the cost model scores but no searcher proposes yet.
    if plan.zero < 2 and plan.zero not in training.zero_stages:
        raise PlanError(source, "zero", f"ZeRO stage {plan.zero} is not allowed by the training "
                                        f"spec ({', '.join(map(str, training.zero_stages))})")
    if plan.offload != "none" and plan.zero < 1:
        raise PlanError(source, "offload", "optimizer offload moves the distributed "
                                           "optimizer's states to the host: it needs zero >= 1")
    if plan.sequence_parallel and all(s.tp == 1 for s in plan.stages):
        raise PlanError(source, "sequence_parallel", "sequence parallelism splits activations "
                                                     "over a tensor-parallel group: no stage "
                                                     "has tp > 1")
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
    cp = plan.context_parallel
    if cp > 1:
        seq_len = training.seq_len or model.seq_len
        if seq_len % (2 * cp):
            raise PlanError(source, "context_parallel",
                            f"context parallelism splits a sequence into 2 x {cp} chunks: "
                            f"{seq_len} tokens do not divide evenly")
    for i, stage in enumerate(plan.stages):
        if stage.dp % cp:
            raise PlanError(source, f"stages[{i}].replicas",
                            f"{stage.dp} replicas do not form groups of "
                            f"context_parallel={cp}")
        for g in range(0, stage.dp, cp) if cp > 1 else ():
            hosts = {r.host for r in stage.replicas[g:g + cp]}
            if len(hosts) > 1:
                raise PlanError(source, f"stages[{i}].replicas",
                                f"a context-parallel group spans hosts "
                                f"{', '.join(sorted(hosts))} (hetpar models a group's key and "
                                f"value ring over one host's scale-up link)")
        if mbs % (stage.dp // cp):
            raise PlanError(source, f"stages[{i}].replicas",
                            f"micro-batch of {mbs} sequences does not divide evenly over "
                            f"{stage.dp // cp} replicas" + (f" ({stage.dp} over context "
                                                            f"parallelism {cp})" if cp > 1
                                                            else ""))
    v = plan.virtual_stages
    if v > 1:
        p = plan.num_stages
        if p < 2:
            raise PlanError(source, "virtual_stages", "interleaving needs two pipeline stages "
                                                      "or more")
        for i, stage in enumerate(plan.stages):
            if stage.layers % v:
                raise PlanError(source, "virtual_stages",
                                f"{v} virtual stages do not divide stage {i}'s "
                                f"{stage.layers} layers")
        if plan.micro_batches % p:
            raise PlanError(source, "virtual_stages",
                            f"the interleaved schedule runs micro-batches in groups of one per "
                            f"stage: {plan.micro_batches} micro-batches are not a multiple of "
                            f"{p} stages")
