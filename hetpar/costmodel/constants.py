"""Calibrated constants of the cost model (``configs/calibration.yaml``).

Datasheet figures say what a GPU or link could do; these constants say how much of it
a training framework gets in practice. They are fitted by ``hetpar calibrate`` on the
calibration data only (Megatron SC21 Table 1 and AMP's homogeneous runs) and judged on
held-out data by ``hetpar validate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hetpar.configio import Reader, bundled_dir, load_document

__all__ = ["GpuEfficiency", "CostConstants", "load_constants"]


@dataclass(frozen=True)
class GpuEfficiency:
    """Fraction of peak tensor FLOP/s and of HBM bandwidth that large kernels reach."""

    gemm: float
    hbm: float


@dataclass(frozen=True)
class CostConstants:
    gpu: Mapping[str, GpuEfficiency] = field(
        default_factory=lambda: {"default": GpuEfficiency(0.55, 0.8)})
    # Framework costs that do not shrink with the work: kernel launches, Python, scheduling.
    layer_overhead_s: float = 50e-6
    microbatch_overhead_s: float = 300e-6
    iteration_overhead_s: float = 0.02
    # Bytes read+written by memory-bound ops (norms, softmax, dropout, GeLU) per byte of
    # activation they store: they stream what they produce.
    elementwise_traffic: float = 2.0
    optimizer_bytes_per_param: float = 32.0
    # Megatron-LM splits a pipeline transfer over the tp ranks (scatter-gather); DeepSpeed's
    # pipeline engine sends the whole activation from every tp rank.
    p2p_copy_per_tp_rank: bool = False
    # Megatron-LM all-reduces the tied word-embedding gradient between the first and the
    # last stage; frameworks that untie or overlap it do not pay this on the critical path.
    tied_embedding_sync: bool = True
    net_efficiency: float = 0.8
    step_latency_s: float = 20e-6
    intra_efficiency: Mapping[str, float] = field(
        default_factory=lambda: {"nvswitch": 0.8, "nvlink": 0.8, "xgmi": 0.7, "pcie": 0.6})
    reserve_bytes: float = 1.0 * 2**30
    fragmentation: float = 0.05
    weight_bytes: float = 2.0
    grad_bytes: float = 2.0
    optimizer_bytes: float = 12.0
    logits_bytes_per_value: float = 10.0

    def gpu_efficiency(self, gpu_name: str) -> GpuEfficiency:
        return self.gpu.get(gpu_name) or self.gpu["default"]

    def with_values(self, **changes: Any) -> CostConstants:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": {name: {"gemm_efficiency": round(e.gemm, 6), "hbm_efficiency": round(e.hbm, 6)}
                     for name, e in self.gpu.items()},
            "framework": {
                "layer_overhead_us": round(self.layer_overhead_s * 1e6, 3),
                "microbatch_overhead_us": round(self.microbatch_overhead_s * 1e6, 3),
                "iteration_overhead_ms": round(self.iteration_overhead_s * 1e3, 4),
                "elementwise_traffic": round(self.elementwise_traffic, 4),
                "optimizer_bytes_per_param": self.optimizer_bytes_per_param,
                "p2p_copy_per_tp_rank": self.p2p_copy_per_tp_rank,
                "tied_embedding_sync": self.tied_embedding_sync,
            },
            "network": {
                "efficiency": round(self.net_efficiency, 4),
                "step_latency_us": round(self.step_latency_s * 1e6, 3),
                "intra_efficiency": {k: round(v, 4) for k, v in self.intra_efficiency.items()},
            },
            "memory": {
                "reserve_gib": round(self.reserve_bytes / 2**30, 4),
                "fragmentation": round(self.fragmentation, 4),
                "weight_bytes": self.weight_bytes,
                "grad_bytes": self.grad_bytes,
                "optimizer_bytes": self.optimizer_bytes,
                "logits_bytes_per_value": round(self.logits_bytes_per_value, 4),
            },
        }

    def save(self, path: str | Path, header: str = "") -> None:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        Path(path).write_text(header + text, encoding="utf-8")


def parse_constants(data: Any, source: str) -> CostConstants:
    root = Reader.of(data, source)
    root.check_keys(frozenset({"gpus", "framework", "network", "memory"}))
    gpus: dict[str, GpuEfficiency] = {}
    g = root.sub("gpus")
    for name in g.data:
        e = g.sub(str(name))
        e.check_keys(frozenset({"gemm_efficiency", "hbm_efficiency"}))
        gpus[str(name)] = GpuEfficiency(e.number("gemm_efficiency", positive=True, maximum=1.0),
                                        e.number("hbm_efficiency", positive=True, maximum=1.0))
    if "default" not in gpus:
        raise g.error("default", "is required (efficiency of GPUs without their own entry)")
    fw, net, mem = root.sub("framework"), root.sub("network"), root.sub("memory")
    fw.check_keys(frozenset({"layer_overhead_us", "microbatch_overhead_us", "iteration_overhead_ms",
                             "elementwise_traffic", "optimizer_bytes_per_param",
                             "p2p_copy_per_tp_rank", "tied_embedding_sync"}))
    net.check_keys(frozenset({"efficiency", "step_latency_us", "intra_efficiency"}))
    mem.check_keys(frozenset({"reserve_gib", "fragmentation", "weight_bytes", "grad_bytes",
                              "optimizer_bytes", "logits_bytes_per_value"}))
    intra = net.sub("intra_efficiency")
    return CostConstants(
        gpu=gpus,
        layer_overhead_s=fw.number("layer_overhead_us", nonnegative=True) * 1e-6,
        microbatch_overhead_s=fw.number("microbatch_overhead_us", nonnegative=True) * 1e-6,
        iteration_overhead_s=fw.number("iteration_overhead_ms", nonnegative=True) * 1e-3,
        elementwise_traffic=fw.number("elementwise_traffic", nonnegative=True),
        optimizer_bytes_per_param=fw.number("optimizer_bytes_per_param", nonnegative=True),
        p2p_copy_per_tp_rank=fw.bool("p2p_copy_per_tp_rank", False),
        tied_embedding_sync=fw.bool("tied_embedding_sync", True),
        net_efficiency=net.number("efficiency", positive=True, maximum=1.0),
        step_latency_s=net.number("step_latency_us", nonnegative=True) * 1e-6,
        intra_efficiency={str(k): intra.number(str(k), positive=True, maximum=1.0)
                          for k in intra.data},
        reserve_bytes=mem.number("reserve_gib", nonnegative=True) * 2**30,
        fragmentation=mem.number("fragmentation", nonnegative=True, maximum=0.9),
        weight_bytes=mem.number("weight_bytes", positive=True),
        grad_bytes=mem.number("grad_bytes", positive=True),
        optimizer_bytes=mem.number("optimizer_bytes", nonnegative=True),
        logits_bytes_per_value=mem.number("logits_bytes_per_value", nonnegative=True),
    )


def load_constants(path: str | Path | None = None) -> CostConstants:
    """The bundled calibration, or a calibration file of the same format."""
    path = Path(path) if path is not None else bundled_dir() / "calibration.yaml"
    return parse_constants(load_document(path), str(path))
