"""``Problem``: what is being planned and how a plan of it is scored.

A problem is an instance (cluster, model, training spec) together with the objective a
planner minimises and the bandwidth states every plan is scored under. It is built once,
where the user's input is read (the CLI, ``hetpar evaluate``, the training callbacks, the
dynamics simulator), and passed down: planners never re-parse the objective or redraw
the bandwidth states, so two values of one problem are always comparable.

The bandwidth states are ``samples`` draws from ``numpy.random.default_rng(seed)``
(``Cluster.bandwidth_states``); ``seed`` means that and nothing else. ``value(plan)`` is
the one definition of a plan's score: the objective over its iteration times under those
states, or infinity when it does not fit in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from hetpar.cluster.topology import Cluster
from hetpar.costmodel.constants import GIB, CostConstants
from hetpar.costmodel.estimate import CostModel, Estimate
from hetpar.costmodel.objective import Objective
from hetpar.errors import InfeasibleError
from hetpar.plan import Plan
from hetpar.problem.instance import Instance
from hetpar.problem.space import PlanSpace
from hetpar.workload.model import ModelSpec
from hetpar.workload.training import TrainingSpec

__all__ = ["DEFAULT_SAMPLES", "DEFAULT_SEED", "POLICY_SAMPLES", "Problem"]

# Bandwidth states a plan is scored under when the user does not say (CLI, solve).
DEFAULT_SAMPLES = 32
# Bandwidth states of the environment's robust objective and of a policy whose metadata
# does not say (training configs, policy files, ``hetpar evaluate`` with a policy).
POLICY_SAMPLES = 16
# Seed of the bandwidth draws when the user gives none: ``hetpar solve``/``plan``/
# ``evaluate --seed`` default to it, and the training's evaluation references and expert
# plans always use it (``callbacks.reference_values``, ``imitation.expert_plans``), so a
# training run's gaps are measured on the states ``hetpar evaluate`` scores by default,
# whatever the run's own ``seed`` (which seeds PPO and the environments only).
DEFAULT_SEED = 0


@dataclass(frozen=True, eq=False)
class Problem:
    """One planning problem: the instance, the objective and the bandwidth draws.

    Build it with ``Problem.of`` (which parses a textual objective once) or
    ``Problem.from_instance``. The cost model and the plan space are made on first use
    and kept: scoring many plans of one problem shares their tables.
    """

    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
    objective: Objective = field(default_factory=lambda: Objective("mean"))
    samples: int = DEFAULT_SAMPLES
    seed: int = DEFAULT_SEED
    constants: CostConstants | None = None
    name: str = ""
    bandwidth: np.ndarray | None = None  # explicit (K, links) states in Gb/s; overrides draws

    @classmethod
    def of(cls, cluster: Cluster, model: ModelSpec, training: TrainingSpec, *,
           objective: Objective | str = "mean", samples: int = DEFAULT_SAMPLES,
           seed: int = DEFAULT_SEED,
           constants: CostConstants | None = None, name: str = "") -> Problem:
        obj = objective if isinstance(objective, Objective) else Objective.parse(objective)
        return cls(cluster, model, training, obj, samples, seed, constants,
                   name or f"{cluster.name}/{model.name}")

    @classmethod
    def from_instance(cls, instance: Instance, *, objective: Objective | str = "mean",
                      samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED,
                      constants: CostConstants | None = None) -> Problem:
        """The problem of a suite instance, scored under draws of ``seed`` (the user's
        seed, the same for every instance and method: gaps compare like with like)."""
        return cls.of(instance.cluster, instance.model, instance.training,
                      objective=objective, samples=samples, seed=seed, constants=constants,
                      name=instance.name)

    # ---- what it is made of ------------------------------------------------------------
    @cached_property
    def cost_model(self) -> CostModel:
        return CostModel(self.cluster, self.model, self.training, constants=self.constants,
                         samples=self.samples, seed=self.seed, bandwidth=self.bandwidth)

    @cached_property
    def space(self) -> PlanSpace:
        return PlanSpace(self.cluster, self.cost_model.model, self.training)

    def with_bandwidth(self, bandwidth: np.ndarray) -> Problem:
        """The same problem under explicit bandwidth states (a network state of the
        dynamics simulator); the cost model shares this one's bandwidth-free tables."""
        states = np.atleast_2d(np.asarray(bandwidth, dtype=float))
        other = replace(self, bandwidth=states, samples=states.shape[0])
        if "cost_model" in self.__dict__:
            other.__dict__["cost_model"] = self.cost_model.with_bandwidth(other.bandwidth)
        if "space" in self.__dict__:
            other.__dict__["space"] = self.space
        return other

    def with_cluster(self, cluster: Cluster, *, seed: int | None = None,
                     name: str = "") -> Problem:
        """This problem on ``cluster``, a cluster of the same topology (hosts, links,
        routes) under other link bandwidth models (a re-planner's next network state),
        scored under ``samples`` draws of ``seed`` (this one's when None) from its links.
        The cost model shares this one's bandwidth-free tables; the plan space is made
        afresh (its host symmetries depend on the links' bandwidth models)."""
        if cluster.topology_key != self.cluster.topology_key:
            raise ValueError(f"cluster {cluster.name!r} differs from {self.cluster.name!r} "
                             f"in more than link bandwidth")
        other = replace(self, cluster=cluster, seed=self.seed if seed is None else seed,
                        name=name or self.name, bandwidth=None)
        if "cost_model" in self.__dict__:
            # The draws cost_model would make, under this one's bandwidth-free tables.
            other.__dict__["cost_model"] = self.cost_model.with_bandwidth(
                cluster.bandwidth_states(other.samples, other.seed))
        return other

    def with_objective(self, objective: Objective | str) -> Problem:
        obj = objective if isinstance(objective, Objective) else Objective.parse(objective)
        other = replace(self, objective=obj)
        for kept in ("cost_model", "space"):
            if kept in self.__dict__:
                other.__dict__[kept] = self.__dict__[kept]
        return other

    # ---- scoring -----------------------------------------------------------------------
    def value(self, plan: Plan) -> float:
        """The plan's score in seconds (infinite when it does not fit). The plan must be
        valid for the cluster; ``estimate`` validates."""
        times, feasible = self.cost_model.iteration_times(plan)
        return self.objective.score(times, feasible)

    def estimate(self, plan: Plan, *, source: str = "<plan>") -> Estimate:
        """Validate the plan and report on it: times per state, breakdown, memory."""
        return self.cost_model.evaluate(plan, source=source)

    def describe(self) -> dict[str, Any]:
        """The inputs every result names (JSON-ready)."""
        return {"cluster": self.cluster.name, "model": self.model.name,
                "training": self.training.name, "objective": self.objective.name,
                "samples": self.samples,
                # Explicit states (a network state of the dynamics) are drawn by no seed.
                "seed": self.seed if self.bandwidth is None else None}

    def check_fits_somewhere(self) -> None:
        """Refuse at once a problem whose model fits on no plan at all (InfeasibleError)."""
        cm, space = self.cost_model, self.space
        zero = max(space.zero_stages)
        rc = "full" if "full" in space.recompute_modes else space.recompute_modes[-1]
        # The lightest possible per-GPU footprint: every layer spread over the whole
        # cluster at the largest tensor-parallel degree, one sequence per micro-batch, as
        # many replicas as the cluster could give a stage to shard states over, and
        # without ZeRO-3's gathered layers (a lower bound of any plan's).
        layers = cm.model.layers
        total_gpus = cm.cluster.num_gpus
        smallest = math.inf
        biggest = max(h.gpu.memory_bytes for h in cm.cluster.hosts)
        for gpu_type in space.types:
            for tp in space.tp_options[gpu_type]:
                stages = max(1, min(layers, total_gpus // tp))
                per_stage = -(-layers // stages)
                _, used = cm.stage_memory(per_stage, tp, max(1, total_gpus // tp), 1.0, 1,
                                          False, False, rc, zero, gathered=False,
                                          offload=space.offloads)
                smallest = min(smallest, used)
        usable = max((perf.usable_bytes for i in range(len(cm.cluster.hosts))
                      if (perf := cm.host_perf(i)) is not None), default=-math.inf)
        if smallest > usable:
            raise InfeasibleError(
                f"no feasible plan: the smallest per-GPU footprint is {smallest / GIB:.1f} "
                f"GiB, the largest GPU has {biggest / GIB:.1f} GiB ({usable / GIB:.1f} GiB "
                "usable)")
