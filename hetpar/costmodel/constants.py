"""Calibrated constants of the cost model (``configs/calibration.yaml``).

Datasheet figures say what a GPU or link could do; these constants say how much of it
training gets in practice. Some belong to the hardware (how close a GPU type gets to
its peak), others to the training framework and its transport (fixed costs per layer
and micro-batch, how pipeline transfers are split, allocator reserve, how fast its
collectives drive a NIC). A training spec names its framework; the constants of each
framework are fitted on runs made with it.

All are fitted by ``hetpar calibrate`` on the calibration data only (Megatron SC21
Table 1 and AMP's homogeneous runs) and judged on held-out data by ``hetpar validate``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hetpar.configio import Reader, bundled_dir, load_document
from hetpar.errors import ConfigError

__all__ = ["GpuEfficiency", "FrameworkConstants", "CostConstants", "load_constants"]

GIB = 2**30


@dataclass(frozen=True)
class GpuEfficiency:
    """Fractions of peak tensor FLOP/s and of HBM bandwidth that large kernels reach."""

    gemm: float
    hbm: float


@dataclass(frozen=True)
class FrameworkConstants:
    """What one training framework (and the transport under it) adds to the hardware."""

    # Fixed cost of one pass of one transformer layer per micro-batch (kernel launches,
    # framework code): what keeps small per-GPU matrices far from peak.
    layer_overhead_s: float = 50e-6
    microbatch_overhead_s: float = 300e-6  # per stage and micro-batch (scheduling, p2p setup)
    iteration_overhead_s: float = 0.02  # per iteration (loss scaling, clipping, logging)
    # Megatron-LM splits a pipeline transfer over the tp ranks (scatter-gather); DeepSpeed's
    # pipeline engine sends the whole activation from every tp rank.
    p2p_copy_per_tp_rank: bool = False
    # Megatron-LM all-reduces the tied word-embedding gradient between the first and the
    # last stage; frameworks that untie or overlap it do not pay it on the critical path.
    tied_embedding_sync: bool = True
    net_efficiency: float = 0.8  # achievable fraction of a link's bandwidth
    step_latency_s: float = 20e-6  # software latency of one collective step
    reserve_bytes: float = 1.0 * GIB  # CUDA context, workspaces, allocator slack
    fragmentation: float = 0.05  # fraction of device memory lost to fragmentation
    optimizer_bytes: float = 12.0  # optimizer state bytes per parameter (Adam: fp32 master, m, v)
    logits_bytes_per_value: float = 6.0  # logits, their fp32 loss copy and gradients


_FW_FIELDS = {
    # yaml key: (attribute, scale from yaml units to SI)
    "layer_overhead_us": ("layer_overhead_s", 1e-6),
    "microbatch_overhead_us": ("microbatch_overhead_s", 1e-6),
    "iteration_overhead_ms": ("iteration_overhead_s", 1e-3),
    "net_efficiency": ("net_efficiency", 1.0),
    "step_latency_us": ("step_latency_s", 1e-6),
    "reserve_gib": ("reserve_bytes", GIB),
    "fragmentation": ("fragmentation", 1.0),
    "optimizer_bytes": ("optimizer_bytes", 1.0),
    "logits_bytes_per_value": ("logits_bytes_per_value", 1.0),
}
_FW_FLAGS = ("p2p_copy_per_tp_rank", "tied_embedding_sync")
# Plausible upper ends of each constant (in the file's units): a fitted value beyond is a
# unit slip or a broken fit, and would give estimates off by orders of magnitude.
_FW_MAX = {"layer_overhead_us": 1e6, "microbatch_overhead_us": 1e7,
           "iteration_overhead_ms": 1e6, "net_efficiency": 1.0, "step_latency_us": 1e6,
           "reserve_gib": 1024.0, "fragmentation": 0.9, "optimizer_bytes": 64.0,
           "logits_bytes_per_value": 64.0}
_SHARED_MAX = {"elementwise_traffic": 100.0, "optimizer_bytes_per_param": 256.0,
               "weight_bytes": 16.0, "grad_bytes": 16.0}


@dataclass(frozen=True)
class CostConstants:
    gpu: Mapping[str, GpuEfficiency] = field(
        default_factory=lambda: {"default": GpuEfficiency(0.55, 0.8)})
    frameworks: Mapping[str, FrameworkConstants] = field(
        default_factory=lambda: {"megatron-lm": FrameworkConstants()})
    # Bytes read+written by memory-bound ops (norms, softmax, dropout, GeLU) per byte of
    # activation they store: they stream what they produce.
    elementwise_traffic: float = 2.0
    optimizer_bytes_per_param: float = 32.0  # HBM traffic of one Adam step per parameter
    intra_efficiency: Mapping[str, float] = field(
        default_factory=lambda: {"nvswitch": 0.8, "nvlink": 0.8, "xgmi": 0.7, "pcie": 0.6})
    weight_bytes: float = 2.0
    grad_bytes: float = 2.0
    # The fall-back of a GPU type without an entry of its own: architecture -> the
    # ``gpu`` entry (a calibrated type of that architecture) it reads; others read
    # ``default``.
    architectures: Mapping[str, str] = field(default_factory=dict)
    # Where each constant comes from (``source_of``): dotted paths of the file's keys, a
    # group's path covering its members, mapped to a line of text. Metadata: not in
    # ``to_dict``, so not in the digest a stored value records (``costmodel.version``).
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def gpu_key(self, gpu_name: str, architecture: str = "") -> str:
        """The ``gpus`` entry a GPU type reads: its own; else that of the calibrated type
        ``architectures`` names for its architecture (an H200 reads the H100's: the same
        chip at the same datasheet peak); else ``default``."""
        if gpu_name in self.gpu:
            return gpu_name
        return self.architectures.get(architecture, "default")

    def gpu_efficiency(self, gpu_name: str, architecture: str = "") -> GpuEfficiency:
        return self.gpu[self.gpu_key(gpu_name, architecture)]

    def framework(self, name: str) -> FrameworkConstants:
        fw = self.frameworks.get(name)
        if fw is None:
            raise ConfigError("", "framework", f"no calibrated constants for framework {name!r} "
                                               f"(known: {', '.join(self.frameworks)})")
        return fw

    def with_framework(self, name: str, **changes: Any) -> CostConstants:
        fw = replace(self.frameworks.get(name, FrameworkConstants()), **changes)
        return replace(self, frameworks={**self.frameworks, name: fw})

    def to_dict(self) -> dict[str, Any]:
        frameworks = {}
        for name, fw in self.frameworks.items():
            out: dict[str, Any] = {key: round(getattr(fw, attr) / scale, 6)
                                   for key, (attr, scale) in _FW_FIELDS.items()}
            out.update({flag: getattr(fw, flag) for flag in _FW_FLAGS})
            frameworks[name] = out
        return {
            "gpus": {name: {"gemm_efficiency": round(e.gemm, 6), "hbm_efficiency": round(e.hbm, 6)}
                     for name, e in self.gpu.items()},
            # Only where there is one: constants without it keep the digest they had.
            **({"architectures": dict(self.architectures)} if self.architectures else {}),
            "frameworks": frameworks,
            "shared": {
                "elementwise_traffic": round(self.elementwise_traffic, 4),
                "optimizer_bytes_per_param": self.optimizer_bytes_per_param,
                "intra_efficiency": {k: round(v, 4) for k, v in self.intra_efficiency.items()},
                "weight_bytes": self.weight_bytes,
                "grad_bytes": self.grad_bytes,
            },
        }

    def to_document(self) -> dict[str, Any]:
        """``to_dict`` and, where any are known, the ``sources``: the file's content."""
        out = self.to_dict()
        if self.sources:
            out["sources"] = dict(self.sources)
        return out

    def constant_paths(self) -> list[str]:
        """The dotted path of every constant of the file (``gpus.T4-16GB.hbm_efficiency``,
        ``shared.intra_efficiency.pcie``), in the file's order."""
        return list(_leaf_paths(self.to_dict()))

    def source_of(self, path: str) -> str | None:
        """Where the constant at ``path`` comes from: its own entry in ``sources``, else
        that of the nearest group containing it; None if neither says."""
        while path:
            hit = self.sources.get(path)
            if hit is not None:
                return hit
            path = path.rpartition(".")[0]
        return None

    def to_yaml(self, header: str = "") -> str:
        """The file's text (``hetpar calibrate`` writes it), after ``header``."""
        return header + yaml.safe_dump(self.to_document(), sort_keys=False, width=1000)


def _leaf_paths(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _leaf_paths(value, path + ".")
        else:
            yield path


def parse_constants(data: Any, source: str) -> CostConstants:
    root = Reader.of(data, source)
    root.check_keys(frozenset({"gpus", "architectures", "frameworks", "shared", "sources"}))
    gpus: dict[str, GpuEfficiency] = {}
    g = root.sub("gpus")
    for name in g.data:
        e = g.sub(str(name))
        e.check_keys(frozenset({"gemm_efficiency", "hbm_efficiency"}))
        gpus[str(name)] = GpuEfficiency(e.number("gemm_efficiency", positive=True, maximum=1.0),
                                        e.number("hbm_efficiency", positive=True, maximum=1.0))
    if "default" not in gpus:
        raise g.error("default", "is required (efficiency of GPUs without their own entry)")
    architectures: dict[str, str] = {}
    if "architectures" in root.data:
        arch = root.sub("architectures")
        for name in arch.data:
            target = arch.str(str(name))
            if target not in gpus or target == "default":
                raise arch.error(str(name), f"names {target!r}, which is not a GPU type of "
                                            f"gpus: (known: {', '.join(k for k in gpus if k != 'default')})")
            architectures[str(name).strip().lower()] = target
    frameworks: dict[str, FrameworkConstants] = {}
    fws = root.sub("frameworks")
    for name in fws.data:
        f = fws.sub(str(name))
        f.check_keys(frozenset(_FW_FIELDS) | frozenset(_FW_FLAGS))
        base = FrameworkConstants()
        values: dict[str, Any] = {}
        for key, (attr, scale) in _FW_FIELDS.items():
            values[attr] = f.number(key, getattr(base, attr) / scale, nonnegative=True,
                                    maximum=_FW_MAX[key]) * scale
        if values["net_efficiency"] <= 0:
            raise f.error("net_efficiency", "must be positive")
        for flag in _FW_FLAGS:
            values[flag] = f.bool(flag, getattr(base, flag))
        frameworks[str(name)] = FrameworkConstants(**values)
    if not frameworks:
        raise root.error("frameworks", "lists no framework")
    shared = root.sub("shared")
    shared.check_keys(frozenset({"elementwise_traffic", "optimizer_bytes_per_param",
                                 "intra_efficiency", "weight_bytes", "grad_bytes"}))
    intra = shared.sub("intra_efficiency")
    from hetpar.cluster.gpu import SCALEUP_KINDS

    intra.check_keys(frozenset(SCALEUP_KINDS))
    constants = CostConstants(
        gpu=gpus,
        architectures=architectures,
        frameworks=frameworks,
        elementwise_traffic=shared.number("elementwise_traffic", nonnegative=True,
                                          maximum=_SHARED_MAX["elementwise_traffic"]),
        optimizer_bytes_per_param=shared.number("optimizer_bytes_per_param", nonnegative=True,
                                                maximum=_SHARED_MAX["optimizer_bytes_per_param"]),
        intra_efficiency={str(k): intra.number(str(k), positive=True, maximum=1.0)
                          for k in intra.data},
        weight_bytes=shared.number("weight_bytes", positive=True,
                                   maximum=_SHARED_MAX["weight_bytes"]),
        grad_bytes=shared.number("grad_bytes", positive=True, maximum=_SHARED_MAX["grad_bytes"]),
    )
    if "sources" not in root.data:
        return constants
    src = root.sub("sources")
    paths = constants.constant_paths()
    sources: dict[str, str] = {}
    for key in src.data:
        key = str(key)
        if not any(p == key or p.startswith(key + ".") for p in paths):
            raise src.error(key, "names no constant of this file (a dotted path such as "
                                 "gpus.T4-16GB.gemm_efficiency, or a group such as gpus.T4-16GB)")
        sources[key] = src.str(key)
    return replace(constants, sources=sources)


def load_constants(path: str | Path | None = None) -> CostConstants:
    """The bundled calibration, or a calibration file of the same format."""
    path = Path(path) if path is not None else bundled_dir() / "calibration.yaml"
    try:
        st = path.stat()
    except OSError:
        return parse_constants(load_document(path), str(path))  # reports the error
    return _constants_cached(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _constants_cached(path: str, mtime_ns: int, size: int) -> CostConstants:
    # Parsed once per version of the file: environments build a cost model per instance.
    return parse_constants(load_document(path), path)
