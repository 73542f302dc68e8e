"""Optimizer offload: the optimizer step on the host CPU.

With ``offload: optimizer`` (DeepSpeed's ZeRO-Offload, Megatron-LM's
``--optimizer-cpu-offload``) each GPU keeps its weights and gradients, while the fp32
master weights and Adam's moments of the parameters it owns live in host memory
(``memory.stage_bytes``). Every iteration the GPU copies its gradient shard to the host
over PCIe, the host CPU runs Adam over the shard, and the updated weights come back:

    t_opt = q (g + w) / B_pcie + q O / B_cpu

``q`` the parameters whose optimizer state the GPU owns (its stage's parameters per GPU,
over the stage's replicas under ZeRO >= 1, which offload needs), ``g`` and ``w`` the
gradient and weight bytes per parameter, ``O`` the bytes one Adam step moves per
parameter (``optimizer_bytes_per_param``, what the GPU step costs over HBM), ``B_pcie``
the GPU's datasheet PCIe bandwidth per direction (``pcie_GBps`` in the GPU catalog) and
``B_cpu`` the host's memory bandwidth over its GPUs, every one of them stepping its shard
at once (``HOST_OPTIMIZER_GBPS``). The copies and the step are not overlapped with each
other or with the next iteration's compute (Megatron-LM can overlap them,
``--overlap-cpu-optimizer-d2h-h2d``): an upper estimate, as for ZeRO-2/3's traffic.
The offload therefore buys memory, never time (tested on every bundled GPU type).
"""

from __future__ import annotations

__all__ = ["HOST_OPTIMIZER_GBPS", "host_step_seconds_per_param"]

# Host memory bandwidth that one server's CPU optimizer step achieves, shared by its
# GPUs. Assumed, not fitted: a two-socket server's DRAM streams 200-400 GB/s, of which a
# vectorised CPU Adam (DeepSpeed's CPU-Adam) uses part; no published step time of a
# known host was at hand to calibrate it. An uncalibrated figure, as the documentation of
# the cost model says.
HOST_OPTIMIZER_GBPS = 100.0


def host_step_seconds_per_param(grad_bytes: float, weight_bytes: float,
                                optimizer_bytes: float, host_bw: float,
                                cpu_bw: float) -> float:
    """Seconds of the offloaded optimizer step per parameter a GPU owns: the gradient down
    and the weight back over PCIe (``host_bw`` bytes/s) and the step over host memory
    (``cpu_bw``)."""
    return (grad_bytes + weight_bytes) / host_bw + optimizer_bytes / cpu_bw
