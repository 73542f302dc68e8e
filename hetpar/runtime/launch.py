"""Launch layouts: which process (global rank) runs on which host and GPU.

A launcher numbers ranks host by host: torchrun gives each node the ranks that follow the
local world sizes of the nodes before it (torch.distributed.elastic's worker-rank
assignment), and each local rank runs on the GPU at its position in
``CUDA_VISIBLE_DEVICES``; DeepSpeed's launcher does the same over its hostfile's hosts and
the slots ``--include`` names, sorted. Megatron-LM and DeepSpeed then cut the ranks into
tensor-, data- and pipeline-parallel groups by a fixed formula
(``megatron_groups``). A plan is launchable when some order of hosts and GPUs makes those
groups exactly its stages and replicas: ``launch_layout`` builds that order, and
``check_layout`` re-derives the groups from it and compares them with the plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from hetpar.errors import PlanError
from hetpar.plan import Plan, Replica, Stage
from hetpar.runtime.rules import check_plan, get_runtime, host_runs

__all__ = ["HostLaunch", "Launch", "launch_layout", "orthogonal_groups", "megatron_groups",
           "check_layout", "plan_from_layout"]


@dataclass(frozen=True)
class HostLaunch:
    """One node of the launch: ``gpus[k]`` is the physical GPU of local rank ``k``."""

    host: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Launch:
    """Hosts in node-rank order, and the process grid (one TP and DP degree)."""

    hosts: tuple[HostLaunch, ...]
    tp: int
    dp: int
    pp: int

    @property
    def world_size(self) -> int:
        return sum(len(h.gpus) for h in self.hosts)

    def devices(self) -> list[tuple[str, int]]:
        """(host, GPU) of every global rank, in rank order."""
        return [(h.host, g) for h in self.hosts for g in h.gpus]


def launch_layout(plan: Plan, runtime: str = "megatron", sorted_gpus: bool = False) -> Launch:
    """The launch order that makes ``runtime``'s rank groups the plan's stages and
    replicas; PlanError naming the first rule the plan breaks if there is none.

    ``sorted_gpus``: the launcher gives each host's local ranks its GPUs in increasing
    order (DeepSpeed's ``--include`` sorts the slots); the plan's GPUs on a host are then
    renumbered in rank order, which moves no replica to another host (a plan's cost
    depends on how many GPUs of each host a stage holds, not on their numbers)."""
    rt = get_runtime(runtime)
    if rt.unrestricted:
        raise PlanError("<plan>", "runtime", "a launch layout needs a framework's runtime "
                                             "(megatron or deepspeed), not 'any'")
    why = check_plan(plan, rt)
    if why:
        raise PlanError("<plan>", "runtime", f"{rt.name} cannot run this plan: {why[0]}")
    runs = host_runs([[r.host for r in s.replicas] for s in plan.stages])
    assert runs is not None  # check_plan tested it
    per_host: dict[str, list[int]] = {}
    for stage, order in zip(plan.stages, runs):
        for host in order:
            for rep in stage.replicas:
                if rep.host == host:
                    per_host.setdefault(str(host), []).extend(rep.gpus)
    hosts = tuple(HostLaunch(h, tuple(sorted(g) if sorted_gpus else g))
                  for h, g in per_host.items())
    return Launch(hosts, plan.stages[0].tp, plan.stages[0].dp, plan.num_stages)


def orthogonal_groups(sizes: Sequence[int], mask: Sequence[bool]) -> list[list[int]]:
    """The rank groups of the parallel dimensions ``mask`` selects, for a grid of
    ``sizes`` (first dimension fastest): a global rank is ``sum_k idx_k * stride_k``
    with strides the running products of the sizes. One group per assignment of the
    unselected dimensions (the earlier fastest), its ranks over the selected ones (the
    earlier fastest). This restates Megatron-core's
    ``generate_masked_orthogonal_rank_groups`` (megatron/core/parallel_state.py), which
    ``RankGenerator`` calls with the order ``tp-cp-ep-dp-pp`` by default."""
    strides = [1]
    for s in sizes[:-1]:
        strides.append(strides[-1] * s)
    sel = [k for k, m in enumerate(mask) if m]
    rest = [k for k, m in enumerate(mask) if not m]

    def digits(dims: list[int]) -> list[tuple[int, ...]]:
        # itertools.product varies its last factor fastest: reverse so the first is.
        return [tuple(reversed(t)) for t in itertools.product(
            *[range(sizes[k]) for k in reversed(dims)])]

    groups = []
    for outer in digits(rest):
        base = sum(i * strides[k] for i, k in zip(outer, rest))
        groups.append([base + sum(i * strides[k] for i, k in zip(inner, sel))
                       for inner in digits(sel)])
    return groups


def megatron_groups(tp: int, dp: int, pp: int) -> dict[str, list[list[int]]]:
    """Megatron-LM's tensor-, data- and pipeline-parallel groups (order tp-dp-pp, no
    context or expert parallelism); DeepSpeed's ``PipeModelDataParallelTopology`` (axes
    pipe, data, model: model fastest) gives the same."""
    sizes = [tp, dp, pp]
    return {"tp": orthogonal_groups(sizes, [True, False, False]),
            "dp": orthogonal_groups(sizes, [False, True, False]),
            "pp": orthogonal_groups(sizes, [False, False, True])}


def plan_from_layout(launch: Launch, layers: Sequence[int], micro_batches: int,
                     recompute: str, zero: int, sequence_parallel: bool = False,
                     virtual_stages: int = 1, context_parallel: int = 1,
                     offload: str = "none") -> Plan:
    """The plan the framework runs from this launch: stage ``s`` is pipeline rank ``s``
    of every pipeline group, its replicas the TP groups there, in data-parallel rank
    order."""
    devices = launch.devices()
    groups = megatron_groups(launch.tp, launch.dp, launch.pp)
    stage_of = {}
    for group in groups["pp"]:
        for s, rank in enumerate(group):
            stage_of[rank] = s
    replicas: list[list[Replica]] = [[] for _ in range(launch.pp)]
    # TP groups come out in dp-then-pp order: each stage's in data-parallel rank order.
    for group in groups["tp"]:
        hosts = {devices[r][0] for r in group}
        if len(hosts) != 1:
            raise PlanError("<launch>", "tp", f"a tensor-parallel group spans hosts "
                                              f"{', '.join(sorted(hosts))}")
        replicas[stage_of[group[0]]].append(
            Replica(hosts.pop(), tuple(devices[r][1] for r in group)))
    stages = tuple(Stage(n, launch.tp, tuple(reps)) for n, reps in zip(layers, replicas))
    return Plan(stages, micro_batches, recompute, zero, sequence_parallel, virtual_stages,
                context_parallel, offload)


def check_layout(plan: Plan, launch: Launch) -> list[str]:
    """Where the framework's rank groups under ``launch`` differ from ``plan`` (empty:
    every replica lands on the hosts and GPUs the plan names, in its TP rank order, and
    every stage holds exactly its replicas)."""
    if launch.world_size != launch.tp * launch.dp * launch.pp:
        return [f"the launch has {launch.world_size} processes, not tp x dp x pp = "
                f"{launch.tp * launch.dp * launch.pp}"]
    try:
        got = plan_from_layout(launch, [s.layers for s in plan.stages], plan.micro_batches,
                               plan.recompute, plan.zero)
    except PlanError as exc:
        return [str(exc.problem)]
    problems = []
    for s, (want, have) in enumerate(zip(plan.stages, got.stages)):
        w = sorted((r.host, r.gpus) for r in want.replicas)
        h = sorted((r.host, r.gpus) for r in have.replicas)
        if w != h:
            problems.append(f"stage {s}: the plan's replicas {w} but the framework's groups "
                            f"{h}")
    return problems
