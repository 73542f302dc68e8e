"""Everything the environment precomputes once per instance and reuses across episodes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetpar.costmodel.constants import CostConstants
from hetpar.costmodel.estimate import CostModel
from hetpar.envs.actions import RECOMPUTE_MODES, ZERO_STAGES
from hetpar.envs.feasibility import Completions, HostClasses
from hetpar.envs.runtime_feasibility import RuntimeCompletions
from hetpar.errors import ConfigError, InfeasibleError
from hetpar.problem.instance import Instance
from hetpar.problem.problem import Problem
from hetpar.problem.space import PlanSpace
from hetpar.runtime.rules import RUNTIMES, Runtime

__all__ = ["InstanceContext", "bandwidth_seed"]


def bandwidth_seed(instance: Instance) -> int:
    """The seed of an instance's bandwidth states in the environment: the instance's own
    ``seed`` (the suite generator draws it from ``SeedSequence([suite seed, i])``), or 0
    for an instance made without one (``seed == -1``, such as a user's cluster file).

    Tied to the instance rather than to a user's seed, the robust mode's states are a
    property of the instance: every episode, process and training run scores a plan of it
    under the same states, so its rewards compare across a run. They are not the states
    of ``Problem.from_instance(instance, seed=...)`` that the solvers and ``hetpar
    evaluate`` score under; ``plan_with_policy`` reports both (``env_value``, ``value``)."""
    return instance.seed if instance.seed >= 0 else 0


@dataclass
class InstanceContext:
    """Cost model, plan space, feasibility oracles and static features of one instance.

    ``problem`` is the instance's ``Problem`` under ``samples`` bandwidth states drawn with
    ``bandwidth_seed(instance)`` (the robust mode's fixed set; each link's mean when
    ``samples`` is 0); ``cm`` and ``space`` are its cost model and plan space, kept at hand.
    The sampled mode swaps in one fresh draw per episode with ``CostModel.with_bandwidth``,
    sharing the memo tables. The problem's objective is not used here: the environment
    scores with its own.
    """

    instance: Instance
    problem: Problem
    cm: CostModel
    space: PlanSpace
    classes: HostClasses
    micro_options: tuple[int, ...]  # divisors of the global batch, ascending
    ideal_s: float  # model FLOPs of an iteration over the peak of every usable GPU
    gpus_per_host: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    class_of_host: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    masks: dict[tuple, np.ndarray] = field(default_factory=dict)
    _oracles: dict[tuple[str, int, int], Completions] = field(default_factory=dict)
    _caps: dict[tuple, Any] = field(default_factory=dict)
    _feasible_m: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)
    _any_m: dict[tuple[str, int], bool] = field(default_factory=dict)
    witness: bool = True  # oracles try a greedy completion before searching
    samples: int = 0  # bandwidth states of ``cm`` (0: each link's mean)
    # The framework the plans must run on: the masks allow its plans only.
    runtime: Runtime = RUNTIMES["any"]
    _rt_oracles: dict[tuple[str, int, int], RuntimeCompletions] = field(default_factory=dict)

    @classmethod
    def build(cls, instance: Instance, *, samples: int, constants: CostConstants | None,
              max_micro: int, witness: bool = True,
              runtime: Runtime = RUNTIMES["any"]) -> InstanceContext:
        cluster, training = instance.cluster, instance.training
        if training.sequence_parallel and not runtime.sequence_parallel:
            raise ConfigError(
                "training", "sequence_parallel", f"runtime {runtime.name} has no sequence "
                f"parallelism; training spec {training.name} asks for it")
        if not set(training.zero_stages) & set(ZERO_STAGES):
            raise ConfigError(
                "training", "zero", f"the environment's actions choose ZeRO "
                f"{' or '.join(map(str, ZERO_STAGES))}; training spec {training.name} allows "
                f"only {', '.join(map(str, training.zero_stages))} (hetpar solve --method "
                f"exact searches every stage)")
        problem = Problem.from_instance(instance, samples=samples,
                                        seed=bandwidth_seed(instance), constants=constants)
        cm, space = problem.cost_model, problem.space
        classes = HostClasses.of(cm)
        batch = training.global_batch
        micro = tuple(m for m in range(1, batch + 1) if batch % m == 0)[:max_micro]
        peak = sum(h.num_gpus * perf.peak_flops for i, h in enumerate(cluster.hosts)
                   if (perf := cm.host_perf(i)) is not None)
        if peak <= 0:
            raise InfeasibleError(f"instance {instance.name}: no GPU supports "
                                  f"{training.precision} training")
        return cls(instance, problem, cm, space, classes, micro,
                   cm.model_flops_per_iter / peak,
                   np.array([h.num_gpus for h in cluster.hosts], dtype=np.float32),
                   np.array(classes.of_host, dtype=np.int64), witness=witness,
                   samples=samples, runtime=runtime)

    def rebind(self, instance: Instance) -> InstanceContext:
        """This context for ``instance``, a cluster of the same topology (hosts, links,
        routes) under other link bandwidth, with the same model and training.

        Memory feasibility does not depend on bandwidth, so the completion oracles,
        capacity tables and memoised action masks are shared with this context; the cost
        model is this one's under ``instance``'s bandwidth states (drawn as ``build``
        draws them, by ``Problem.with_cluster``), sharing its bandwidth-free work, memory
        and flow tables. A re-planner asks for a plan at every bandwidth change of one
        cluster: this is what it keeps between those calls."""
        cluster = instance.cluster
        if cluster.topology_key != self.cluster.topology_key:
            raise ValueError(f"cluster {cluster.name!r} differs from {self.cluster.name!r} "
                             f"in more than link bandwidth")
        if instance.model != self.instance.model or \
                instance.training != self.instance.training:
            raise ValueError("rebind keeps the model and training spec")
        problem = self.problem.with_cluster(cluster, seed=bandwidth_seed(instance),
                                            name=instance.name)
        return dataclasses.replace(self, instance=instance, problem=problem,
                                   cm=problem.cost_model)

    @property
    def full_free(self) -> tuple[int, ...]:
        """Free GPUs per host at the start (0 on hosts that cannot train)."""
        return tuple(h.num_gpus if self.classes.of_host[i] >= 0 else 0
                     for i, h in enumerate(self.cluster.hosts))

    @property
    def cluster(self):  # noqa: ANN201 - a Cluster
        return self.instance.cluster

    def oracle(self, recompute: str, zero: int, m: int) -> Completions:
        key = (recompute, zero, m)
        hit = self._oracles.get(key)
        if hit is None:
            hit = self._oracles[key] = Completions(self.cm, self.space, self.classes,
                                                   recompute, zero, m,
                                                   shared_caps=self._caps,
                                                   witness=self.witness)
        return hit

    def runtime_oracle(self, recompute: str, zero: int, m: int) -> RuntimeCompletions:
        """The completion answers under ``runtime`` (which must restrict the space)."""
        key = (recompute, zero, m)
        hit = self._rt_oracles.get(key)
        if hit is None:
            hit = self._rt_oracles[key] = RuntimeCompletions(self.oracle(recompute, zero, m),
                                                             self.runtime)
        return hit

    def allowed_memory_option(self, recompute: str, zero: int) -> bool:
        """Whether some micro-batch count completes a plan with these memory options."""
        if recompute not in self.space.recompute_modes or zero not in self.space.zero_stages:
            return False
        key = (recompute, zero)
        if key in self._feasible_m:
            return bool(self._feasible_m[key])
        hit = self._any_m.get(key)
        if hit is None:
            # Many small micro-batches need the least memory: try them first.
            hit = any(self.micro_feasible(recompute, zero, m)
                      for m in reversed(self.micro_options))
            self._any_m[key] = hit
        return hit

    def micro_feasible(self, recompute: str, zero: int, m: int) -> bool:
        layers = self.cm.model.layers
        if not self.oracle(recompute, zero, m).closed(self.full_free, 0, 1 << layers):
            return False
        if self.runtime.unrestricted:
            return True
        return self.runtime_oracle(recompute, zero, m).closed((), self.full_free, layers)

    def feasible_micro(self, recompute: str, zero: int) -> tuple[int, ...]:
        key = (recompute, zero)
        hit = self._feasible_m.get(key)
        if hit is None:
            hit = self._feasible_m[key] = tuple(
                m for m in self.micro_options if self.micro_feasible(recompute, zero, m))
        return hit

    def check_feasible(self) -> None:
        if not any(self.allowed_memory_option(rc, z)
                   for rc in RECOMPUTE_MODES for z in ZERO_STAGES):
            what = "" if self.runtime.unrestricted else f" that {self.runtime.name} can run"
            # The environment's actions keep the optimizer on the GPUs: where the spec
            # allows offload, plans may still exist that the searchers find.
            offload = "optimizer" in self.instance.training.offload_modes
            raise InfeasibleError(
                f"instance {self.instance.name}: no feasible plan: {self.cm.model.name} fits on "
                f"no plan{what} of cluster {self.cluster.name} with training "
                f"{self.instance.training.name}" + (
                    " with the optimizer on the GPUs (the policy does not offload it; "
                    "'hetpar solve --method exact' or 'metis' do)" if offload else ""))


def log_scale(x: float, lo: float, hi: float) -> float:
    """Map [lo, hi] to [0, 1] on a log scale (clipped), for quantities spanning decades."""
    v = (math.log10(max(x, 1e-12)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    return min(max(v, 0.0), 1.0)
