"""What ``CostModel.core`` computes, and the part of it that a layer split leaves alone.

A plan's pipeline structure (each stage's replicas, hosts and TP degree, the micro-batch
count, recompute mode and ZeRO stage) fixes every transfer of the iteration: activation
volumes depend on the micro-batch size, not on how many layers a stage holds. Only the
stages' work, memory and gradient sizes follow the layer split. ``PlanFrame`` holds the
structure's share, bandwidth terms included, so that the exact search's layer-split
subroutine and the refinement of a policy's plan, which score hundreds of splits of one
structure, pay for the routes and flows once (``CostModel.frame`` / ``CostModel.core_split``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hetpar.costmodel.compute import GpuPerf, StageWork

__all__ = ["CoreTerms", "PlanFrame", "SplitTables", "StageFrame"]


@dataclass(frozen=True, eq=False)
class StageFrame:
    """One stage of a pipeline structure: what does not depend on its layer count."""

    tp: int
    dp: int
    seqs: float  # sequences per replica per micro-batch
    inflight: float  # micro-batches whose activations it holds under 1F1B
    first: bool
    last: bool
    host_ids: tuple[int, ...]  # per replica
    perfs: tuple[GpuPerf, ...]  # per replica
    kinds: tuple[GpuPerf, ...]  # distinct kinds of replica (each costed once)
    usable_bytes: float  # the smallest usable memory of its GPUs
    hbm: float  # the slowest memory bandwidth of its GPUs (optimizer step)
    intra_bw: float  # the slowest scale-up link (all-reduce within a host)
    intra_step: float
    host_members: int  # the most replicas on one host (they reduce over scale-up first)
    # Seconds of the offloaded optimizer step per parameter a GPU owns, its slowest
    # kind's (costmodel/offload.py); 0 where the structure keeps the optimizer on the GPU.
    host_step_per_param: float = 0.0


@dataclass(frozen=True, eq=False)
class PlanFrame:
    """The layer-independent terms of one pipeline structure under a ``CostModel``'s
    bandwidth states (K of them)."""

    stages: tuple[StageFrame, ...]
    micro_batches: int
    recompute: str
    zero: int
    boundary: np.ndarray  # (K, p-1) seconds per boundary, forward and backward
    cycle_transfers: np.ndarray  # (K, p) the transfers in each stage's steady-state cycle
    boundary_total: np.ndarray  # (K,) the first micro-batch's trip across every boundary
    dp_inv_bw: np.ndarray  # (K, C) seconds per byte of the C channels gradients cross
    dp_per_param: np.ndarray  # (C, p) bytes on each channel per parameter of each stage
    dp_fixed: np.ndarray  # (C,) bytes on each channel independent of the split
    dp_latency: float  # latency of the inter-host all-reduce steps
    sequence_parallel: bool = False
    virtual_stages: int = 1  # chunks per stage (interleaved 1F1B)
    wrap: np.ndarray | None = None  # (K,) last stage back to the first, when interleaved
    dp_volume: float = 1.0  # data-parallel bytes relative to one all-reduce (ZeRO-2/3)
    context_parallel: int = 1  # GPUs (TP blocks) a sequence is split over
    offload: bool = False  # optimizer states and step on the host (plan.offload)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @cached_property
    def perfs(self) -> tuple[tuple[GpuPerf, ...], ...]:
        """Per stage, each replica's GPU figures (what reports read)."""
        return tuple(sf.perfs for sf in self.stages)

    @cached_property
    def host_ids(self) -> tuple[tuple[int, ...], ...]:
        """Per stage, each replica's host index."""
        return tuple(sf.host_ids for sf in self.stages)


@dataclass(frozen=True)
class CoreTerms:
    """What ``CostModel.core`` computes for a plan, before any report object is built."""

    total: np.ndarray
    feasible: bool
    works: list[StageWork]
    params: list[float]
    used: list[float]
    perfs: Sequence[Sequence[GpuPerf]]  # per stage, per replica
    host_ids: Sequence[Sequence[int]]
    boundary: np.ndarray
    stage_s: np.ndarray
    cycle: np.ndarray
    dp_time: np.ndarray | float
    dp_intra: list[float]
    opt_s: float


@dataclass(frozen=True, eq=False)
class SplitTables:
    """Per stage of one structure, the layer-dependent terms of every layer count
    ``n = 0..max_layers`` (columns; infinite work where a count was not tabulated), so
    that a batch of layer splits is scored by indexing (``CostModel.score_splits``)."""

    work: np.ndarray  # (p, L+1) seconds per micro-batch of the slowest replica kind
    params: np.ndarray  # (p, L+1) parameters per GPU
    fits: np.ndarray  # (p, L+1) bool: peak memory within the stage's smallest usable memory
    opt: np.ndarray  # (p, L+1) optimizer-step seconds
    intra: np.ndarray  # (p, L+1) all-reduce seconds over a host's scale-up link first
