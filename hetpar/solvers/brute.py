"""Plain enumeration of the plan space: the reference the exact solver is tested against.

No symmetry breaking, no bounds, no dominance: every sequence of stages, every layer
split, micro-batch count, recompute mode and ZeRO stage is scored. Only for tiny
instances.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

from hetpar.costmodel.estimate import CostModel
from hetpar.costmodel.objective import Objective
from hetpar.problem.solution import Certificate, Solution
from hetpar.problem.space import PlanSpace, StageChoice

__all__ = ["brute", "compositions", "count_plans", "skeletons"]


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as an ordered sum of ``parts`` positive integers."""
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in compositions(total - first, parts - 1):
            yield (first, *rest)


def skeletons(space: PlanSpace, max_stages: int) -> Iterator[tuple[StageChoice, ...]]:
    """Every non-empty sequence of stages that fits the cluster."""
    def walk(free: tuple[int, ...], prefix: tuple[StageChoice, ...]):
        if prefix:
            yield prefix
        if len(prefix) == max_stages:
            return
        for stage in space.stage_choices(free):
            yield from walk(space.take(free, stage), prefix + (stage,))
    yield from walk(space.capacity, ())


def count_plans(space: PlanSpace, cap: int) -> int | None:
    """The number of plans ``brute`` would score, counted exactly by walking the same
    stage sequences; None as soon as the count (or the sequences walked) passes ``cap``,
    so refusing a large space up front costs at most ``cap`` steps."""
    layers = space.model.layers
    memory = len(space.zero_stages) + (sum(z >= 1 for z in space.zero_stages)
                                       if space.offloads else 0)
    n_opts = len(space.recompute_modes) * memory * len(space.virtual_options)
    total = walked = 0
    for stages in skeletons(space, layers):
        walked += 1
        total += (math.comb(layers - 1, len(stages) - 1) * n_opts
                  * len(space.micro_batch_options([s.dp for s in stages])))
        if total > cap or walked > cap:
            return None
    return total


def brute(cm: CostModel, space: PlanSpace, objective: Objective) -> Solution:
    start = time.perf_counter()
    layers = cm.model.layers
    # Every ZeRO stage, and each from 1 up with the optimizer on the host where allowed.
    memory = [(z, "none") for z in space.zero_stages] + (
        [(z, "optimizer") for z in space.zero_stages if z >= 1] if space.offloads else [])
    best_value, best = math.inf, None
    leaves = 0
    for stages in skeletons(space, layers):
        ms = space.micro_batch_options([s.dp for s in stages])
        for split in compositions(layers, len(stages)):
            for m in ms:
                for rc in space.recompute_modes:
                    for zero, off in memory:
                        for v in space.virtual_allowed(split, m):
                            plan = space.to_plan(stages, split, m, rc, zero, v, off)
                            value = objective.score(*cm.iteration_times(plan))
                            leaves += 1
                            if value < best_value:
                                best_value, best = value, plan
    wall = time.perf_counter() - start
    cert = Certificate(optimal=True, lower_bound=best_value, nodes=leaves, leaves=leaves,
                       space_size=leaves, space_size_exact=True, wall_s=wall)
    return Solution("brute", objective.name, best, cm.evaluate(best) if best else None,
                    best_value, wall, evaluations=leaves, certificate=cert)
