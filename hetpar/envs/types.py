"""The data of ``PlanBuilder-v0`` in one place: observation columns and the episode state.

Modelled on Jumanji's ``types.py``: what the environment hands out is declared here, apart
from the code that computes it.

* ``HostFeature``, ``PairFeature`` and ``GlobalFeature`` name the columns of the
  observation's ``hosts`` (max_hosts x features), ``pairs`` (max_hosts x max_hosts x
  features) and ``globals`` (features) arrays. Every place that reads or writes a column
  does so by name (``hosts[:, HostFeature.FREE_FRACTION]``); a member's value is its
  column. ``HOST_FEATURES``, ``PAIR_FEATURES`` and ``GLOBAL_FEATURES`` are the lower-case
  names in column order, which a policy file records (``observation_signature``) and
  compares at load time: renaming, adding or reordering a member makes every trained
  policy incompatible, and the shipped one must then be retrained.
* ``Observation``: the observation's keys and shapes (every value is float32 in [0, 1]).
* ``State``: a frozen, read-only view of the current episode (``PlanBuilderEnv.state``):
  the only thing the viewer reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TypedDict

import numpy as np

from hetpar.problem.instance import Instance
from hetpar.problem.space import StageChoice

__all__ = ["GLOBAL_FEATURES", "GlobalFeature", "HOST_FEATURES", "HostFeature", "Observation",
           "PAIR_FEATURES", "PHASES", "PairFeature", "State"]


class HostFeature(IntEnum):
    """Columns of ``hosts``: one row per host (zero rows pad up to ``max_hosts``)."""

    # Static per instance (the cluster's figures):
    PEAK_TFLOPS = 0  # peak TFLOPS at the training precision, log [1, 4000]
    EFFECTIVE_TFLOPS = 1  # the cost model's achievable TFLOPS, log [1, 4000]
    USABLE_MEMORY = 2  # GiB per GPU left for training, log [1, 512]
    HBM_BANDWIDTH = 3  # GB/s, log [100, 20000]
    GPUS = 4  # GPUs on the host / 16 (at most 1)
    SCALEUP_BANDWIDTH = 5  # intra-host GB/s, log [1, 2000]
    NIC_BANDWIDTH = 6  # Gb/s, log [0.1, 6400]
    CAN_TRAIN = 7  # 1 when its GPUs support the training precision (else the above are 0)
    # The partial plan (fractions of the host's GPUs):
    FREE_FRACTION = 8  # GPUs not yet in a stage
    OPEN_STAGE_FRACTION = 9  # GPUs in the open stage
    CLOSED_STAGES_FRACTION = 10  # GPUs in closed stages
    CAN_ADD_BLOCK = 11  # 1 when the mask allows a block from it (block phase only)
    LAYERS_PER_GPU = 12  # layer x GPU products of its closed stages / (layers x GPUs)
    PREVIOUS_STAGE_FRACTION = 13  # GPUs in the stage closed last (the next pipeline stage)
    SAME_TYPE_AS_OPEN_STAGE = 14  # 1 when its GPU type is the open stage's


class PairFeature(IntEnum):
    """Channels of ``pairs[i, j]``: the route from host ``i`` to host ``j`` through its
    bottleneck link (the diagonal describes the host's own scale-up fabric)."""

    BANDWIDTH_MEAN = 0  # mean Gb/s of the bottleneck link, log [0.1, 1e5]
    BANDWIDTH_CV = 1  # its coefficient of variation (at most 1)
    BANDWIDTH_NOW = 2  # this episode's draw (sampled mode), else the mean; same scale
    LATENCY = 3  # route latency in seconds, log [1e-7, 1]


class GlobalFeature(IntEnum):
    """Entries of ``globals``."""

    # One-hot phase (the final observation keeps PHASE_BLOCKS):
    PHASE_MEMORY = 0
    PHASE_MICRO_BATCHES = 1
    PHASE_TP = 2
    PHASE_BLOCKS = 3
    # The choices so far (0 until made):
    RECOMPUTE_NONE = 4  # one-hot recompute mode
    RECOMPUTE_SELECTIVE = 5
    RECOMPUTE_FULL = 6
    ZERO = 7  # ZeRO stage (0 or 1)
    MICRO_BATCHES = 8  # micro-batch count, log [1, 4096]
    MICRO_BATCH_SEQUENCES = 9  # sequences per micro-batch, log [1, 4096]
    LAYERS_LEFT = 10  # layers not yet in a closed stage / the model's layers
    STAGES_BUILT = 11  # closed stages / 32 (at most 1)
    OPEN_TP = 12  # log2 of the open stage's TP degree / log2(max_tp)
    OPEN_DP = 13  # its blocks / 64 (at most 1)
    OPEN_CAPACITY = 14  # most layers it can close with, not as the first stage / layers
    OPEN_CAPACITY_FIRST = 15  # the same as the first pipeline stage / layers
    OPEN_CLOSABLE = 16  # 1 when its blocks divide the sequences of a micro-batch
    # Static per instance (the model, the training and the cluster):
    MODEL_PARAMS = 17  # log [1e7, 1e13]
    MODEL_LAYERS = 18  # layers / max_layers (at most 1)
    MODEL_HIDDEN = 19  # log [64, 65536]
    SEQ_LEN = 20  # log [64, 131072]
    GLOBAL_BATCH = 21  # sequences, log [1, 65536]
    ROBUST_MODE = 22  # 1 in the robust bandwidth mode
    CLUSTER_GPUS = 23  # log [1, 4096]
    CLUSTER_HOSTS = 24  # hosts / max_hosts
    IDEAL_TIME = 25  # model FLOPs over the cluster's peak, seconds, log [1e-4, 1e4]
    NETWORK_CV = 26  # the largest coefficient of variation of a link (at most 1)


HOST_FEATURES = tuple(f.name.lower() for f in HostFeature)
PAIR_FEATURES = tuple(f.name.lower() for f in PairFeature)
GLOBAL_FEATURES = tuple(f.name.lower() for f in GlobalFeature)


class Observation(TypedDict):
    """One observation of ``PlanBuilder-v0`` (float32 arrays, values in [0, 1])."""

    hosts: np.ndarray  # (max_hosts, len(HostFeature))
    host_mask: np.ndarray  # (max_hosts,): 1 for the instance's hosts, 0 for padding
    pairs: np.ndarray  # (max_hosts, max_hosts, len(PairFeature))
    globals: np.ndarray  # (len(GlobalFeature),)


# The phases of an episode in order; ``State.phase`` is one of them.
PHASES = ("memory", "micro_batches", "tp", "blocks", "done")


@dataclass(frozen=True)
class State:
    """The episode so far, read-only (``PlanBuilderEnv.state``; a new copy each time).

    Stages are built from the last pipeline stage to the first, so ``built[0]`` is the
    last pipeline stage. Host indices are those of ``instance.cluster.hosts``.
    """

    instance: Instance
    phase: str  # one of PHASES
    recompute: str  # "" until the memory options are chosen
    zero: int
    micro_batches: int  # 0 until chosen
    built: tuple[tuple[StageChoice, int], ...]  # closed stages with their layer counts
    open_tp: int  # TP degree of the open stage (0: none open)
    open_blocks: tuple[tuple[int, int], ...]  # (host, TP blocks) of the open stage, by host
    free: tuple[int, ...]  # free GPUs per host (0 on hosts that cannot train)
    layers_left: int  # layers not yet in a closed stage

    @property
    def open_dp(self) -> int:
        """Data-parallel degree of the open stage so far (its TP blocks)."""
        return sum(b for _, b in self.open_blocks)
