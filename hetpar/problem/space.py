"""The searched plan space (docs/solvers.md), shared by solvers and the environment.

A plan of the space is a sequence of stages, each described by a ``StageChoice``: one
GPU type, a tensor-parallel degree ``tp`` (a power of two dividing the GPU count of every
host it uses) and how many TP blocks it takes from each host of that type. GPUs may stay
idle. Layers (at least one per stage), the micro-batch count (a divisor of the global
batch that splits evenly over every stage's replicas), the recompute mode and the ZeRO
stage complete a plan. Which GPUs of a host a block uses does not matter to the cost
model, so ``to_plan`` numbers them canonically.

Hosts that are interchangeable (same GPU type and count, same scale-up fabric, same
switch, identical uplinks with a constant bandwidth) form symmetry classes: swapping two
of them maps every plan to one of equal cost, so a search only needs plans whose usage of
a class's hosts is in non-increasing lexicographic order (``SymmetryCheck``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

from hetpar.cluster.bandwidth import Constant
from hetpar.cluster.topology import Cluster
from hetpar.errors import PlanError
from hetpar.plan import Plan, Replica, Stage
from hetpar.workload.model import ModelSpec
from hetpar.workload.training import TrainingSpec

__all__ = ["StageChoice", "PlanSpace", "SymmetryCheck"]


@dataclass(frozen=True)
class StageChoice:
    """A stage's resources: ``blocks[j]`` TP blocks of ``tp`` GPUs from host ``hosts[j]``."""

    gpu_type: str
    tp: int
    hosts: tuple[int, ...]  # host indices, increasing, each with at least one block
    blocks: tuple[int, ...]

    @property
    def dp(self) -> int:
        return sum(self.blocks)

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    def used(self, host: int) -> int:
        """GPUs this stage takes from ``host``."""
        for h, b in zip(self.hosts, self.blocks):
            if h == host:
                return b * self.tp
        return 0


@dataclass(frozen=True)
class PlanSpace:
    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
    # Derived in __post_init__:
    types: tuple[str, ...] = field(default=(), init=False)
    hosts_of_type: dict[str, tuple[int, ...]] = field(default_factory=dict, init=False)
    tp_options: dict[str, tuple[int, ...]] = field(default_factory=dict, init=False)
    classes: tuple[tuple[int, ...], ...] = field(default=(), init=False)
    _capacity: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _eligible: dict[tuple[str, int], tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    _micro: dict[tuple[int, ...], tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hosts = self.cluster.hosts
        by_type: dict[str, list[int]] = {}
        for i, h in enumerate(hosts):
            by_type.setdefault(h.gpu.name, []).append(i)
        tps: dict[str, tuple[int, ...]] = {}
        for name, idx in by_type.items():
            largest = max(hosts[i].num_gpus for i in idx)
            opts = []
            t = 1
            while t <= largest:
                if self.model.heads % t == 0 and any(hosts[i].num_gpus % t == 0 for i in idx):
                    opts.append(t)
                t *= 2
            tps[name] = tuple(opts)
        object.__setattr__(self, "types", tuple(by_type))
        object.__setattr__(self, "hosts_of_type", {k: tuple(v) for k, v in by_type.items()})
        object.__setattr__(self, "tp_options", tps)
        object.__setattr__(self, "classes", _symmetry_classes(self.cluster))
        # Read in every search loop: built once (a tuple over thousands of hosts per read
        # made the dive quadratic in hosts).
        object.__setattr__(self, "_capacity", tuple(h.num_gpus for h in hosts))
        # Asked for at every node of every search (thousands of hosts: 12 million
        # generator steps in one stopped search on 2,000 hosts): built once.
        object.__setattr__(self, "_eligible", {
            (t, tp): tuple(i for i in by_type[t] if hosts[i].num_gpus % tp == 0)
            for t in tps for tp in tps[t]})

    # ---- stages ------------------------------------------------------------------------
    @property
    def capacity(self) -> tuple[int, ...]:
        return self._capacity

    def eligible_hosts(self, gpu_type: str, tp: int) -> tuple[int, ...]:
        hit = self._eligible.get((gpu_type, tp))
        if hit is not None:
            return hit
        return tuple(i for i in self.hosts_of_type[gpu_type]
                     if self.cluster.hosts[i].num_gpus % tp == 0)

    def stage_groups(self, free: Sequence[int], types: Sequence[str] | None = None,
                     ) -> Iterator[tuple[str, int, tuple[int, ...], tuple[int, ...]]]:
        """(GPU type, TP degree, hosts, room): for each type (of ``types``, in that order;
        default all) and degree, the eligible hosts with a block free and how many blocks
        each has room for. The stage choices of a group are its nonzero block-count
        vectors up to ``room`` (``stage_from_counts``)."""
        for gpu_type in self.types if types is None else types:
            for tp in self.tp_options[gpu_type]:
                hosts = tuple(h for h in self.eligible_hosts(gpu_type, tp) if free[h] >= tp)
                yield gpu_type, tp, hosts, tuple(free[h] // tp for h in hosts)

    @staticmethod
    def stage_from_counts(gpu_type: str, tp: int, hosts: Sequence[int],
                          counts: Sequence[int]) -> StageChoice:
        """The stage of ``counts[j]`` blocks from ``hosts[j]`` (zero counts left out)."""
        used = [(h, c) for h, c in zip(hosts, counts) if c]
        return StageChoice(gpu_type, tp, tuple(h for h, _ in used), tuple(c for _, c in used))

    def stage_choices(self, free: Sequence[int]) -> Iterator[StageChoice]:
        """Every stage that fits in the ``free`` GPUs per host (no symmetry reduction)."""
        for gpu_type, tp, hosts, room in self.stage_groups(free):
            for counts in itertools.product(*(range(r + 1) for r in room)):
                if any(counts):
                    yield self.stage_from_counts(gpu_type, tp, hosts, counts)

    def stage_choices_by_size(self, free: Sequence[int], largest_first: bool = True,
                              sizes: Collection[int] | None = None) -> Iterator[StageChoice]:
        """``sorted(stage_choices(free), key=gpus)`` (descending with ``largest_first``),
        ties in ``stage_choices`` order, without listing them: on clusters of many hosts a
        level of the stage tree has hundreds of millions of stages, and a search under a
        time limit visits a few thousand of them. Each (type, TP degree) group yields its
        count vectors by total, and the groups are merged by GPU count (``heapq.merge`` is
        stable across its inputs, as ``sorted`` is across the concatenated list). With
        ``sizes``, only the stages of those GPU counts (the others are never built)."""
        groups = [self._group_by_size(gpu_type, tp, hosts, room, largest_first, sizes)
                  for gpu_type, tp, hosts, room in self.stage_groups(free)]
        sign = -1 if largest_first else 1
        return heapq.merge(*groups, key=lambda s: sign * s.gpus)

    def _group_by_size(self, gpu_type: str, tp: int, hosts: tuple[int, ...],
                       room: tuple[int, ...], largest_first: bool,
                       sizes: Collection[int] | None) -> Iterator[StageChoice]:
        total = sum(room)
        for t in range(total, 0, -1) if largest_first else range(1, total + 1):
            if sizes is not None and t * tp not in sizes:
                continue
            for counts in _bounded_compositions(room, t):
                yield self.stage_from_counts(gpu_type, tp, hosts, counts)

    def count_stage_choices(self, free: Sequence[int]) -> int:
        """How many stages ``stage_choices(free)`` yields, without listing them."""
        return sum(math.prod(r + 1 for r in room) - 1
                   for _, _, _, room in self.stage_groups(free))

    def stage_choice_at(self, free: Sequence[int], index: int) -> StageChoice:
        """``list(stage_choices(free))[index]`` without listing them: a random probe of
        the stage tree draws from hundreds of thousands of first stages on clusters of
        many identical hosts, where listing them took seconds per draw."""
        if index < 0:
            raise IndexError(index)
        for gpu_type, tp, hosts, room in self.stage_groups(free):
            size = math.prod(r + 1 for r in room) - 1  # every count vector but all zeros
            if index >= size:
                index -= size
                continue
            # itertools.product order: the last host's count varies fastest, and the
            # all-zero vector (skipped) comes first.
            rest, counts = index + 1, []
            for r in reversed(room):
                rest, c = divmod(rest, r + 1)
                counts.append(c)
            return self.stage_from_counts(gpu_type, tp, hosts, counts[::-1])
        raise IndexError(index)

    @staticmethod
    def take(free: Sequence[int], stage: StageChoice) -> tuple[int, ...]:
        out = list(free)
        for h, b in zip(stage.hosts, stage.blocks):
            out[h] -= b * stage.tp
        return tuple(out)

    # ---- whole-plan options --------------------------------------------------------------
    def micro_batch_options(self, dps: Sequence[int]) -> tuple[int, ...]:
        """Micro-batch counts whose micro-batches split evenly over every stage's replicas."""
        key = tuple(sorted(set(dps)))
        hit = self._micro.get(key)
        if hit is None:  # memoised: the searches ask for the same few sets of counts
            batch = self.training.global_batch
            hit = self._micro[key] = tuple(
                m for m in range(1, batch + 1)
                if batch % m == 0 and all((batch // m) % d == 0 for d in key))
        return hit

    @property
    def recompute_modes(self) -> tuple[str, ...]:
        return self.training.recompute_modes

    @property
    def zero_stages(self) -> tuple[int, ...]:
        return self.training.zero_stages

    @property
    def offloads(self) -> bool:
        """Whether plans may put the optimizer on the host (with ZeRO >= 1)."""
        return "optimizer" in self.training.offload_modes and max(self.zero_stages) >= 1

    @property
    def virtual_options(self) -> tuple[int, ...]:
        """Chunk counts per stage of the interleaved schedule plans may use (1 first)."""
        return self.training.virtual_stages

    def virtual_allowed(self, layers: Sequence[int], micro_batches: int) -> tuple[int, ...]:
        """The chunk counts a split may use: each divides every stage's layers, and the
        micro-batches are a multiple of the stage count (``validate_plan``'s rules)."""
        p = len(layers)
        if p < 2 or micro_batches % p:
            return (1,)
        return tuple(v for v in self.training.virtual_stages
                     if all(n % v == 0 for n in layers))

    # ---- plans ---------------------------------------------------------------------------
    def to_plan(self, stages: Sequence[StageChoice], layers: Sequence[int], micro_batches: int,
                recompute: str, zero: int, virtual_stages: int = 1,
                offload: str = "none") -> Plan:
        """The plan of these choices, taking each host's GPUs in index order."""
        nxt = [0] * len(self.cluster.hosts)
        out = []
        for st, n in zip(stages, layers):
            reps = []
            for h, b in zip(st.hosts, st.blocks):
                name = self.cluster.hosts[h].name
                for _ in range(b):
                    reps.append(Replica(name, tuple(range(nxt[h], nxt[h] + st.tp))))
                    nxt[h] += st.tp
            out.append(Stage(n, st.tp, tuple(reps)))
        sp = self.training.sequence_parallel and any(st.tp > 1 for st in stages)
        return Plan(tuple(out), micro_batches, recompute, zero, sp, virtual_stages,
                    offload=offload)

    def decompose(self, plan: Plan, source: str = "<plan>",
                  ) -> tuple[tuple[StageChoice, ...], tuple[int, ...]]:
        """(stages, layers) of a plan of this space; PlanError naming the rule otherwise."""
        index = self.cluster.host_index
        stages = []
        for i, st in enumerate(plan.stages):
            types = {self.cluster.host(r.host).gpu.name for r in st.replicas}
            if len(types) != 1:
                raise PlanError(source, f"stages[{i}]", "mixes GPU types, outside the searched "
                                                        "space")
            gpu_type = types.pop()
            if st.tp not in self.tp_options[gpu_type]:
                raise PlanError(source, f"stages[{i}].tp", f"tp {st.tp} is not a power of two "
                                                           "dividing the host's GPU count")
            counts: dict[int, int] = {}
            for r in st.replicas:
                h = index[r.host]
                if self.cluster.hosts[h].num_gpus % st.tp:
                    raise PlanError(source, f"stages[{i}].tp",
                                    f"tp {st.tp} does not divide the GPUs of {r.host}")
                counts[h] = counts.get(h, 0) + 1
            hosts = tuple(sorted(counts))
            stages.append(StageChoice(gpu_type, st.tp, hosts, tuple(counts[h] for h in hosts)))
        return tuple(stages), tuple(s.layers for s in plan.stages)

    def canonical(self, plan: Plan) -> Plan:
        """The same plan with canonical GPU numbering (equal cost)."""
        stages, layers = self.decompose(plan)
        return self.to_plan(stages, layers, plan.micro_batches, plan.recompute, plan.zero)


def _bounded_compositions(room: Sequence[int], total: int) -> Iterator[tuple[int, ...]]:
    """Vectors ``c`` with ``0 <= c[j] <= room[j]`` summing to ``total``, in increasing
    lexicographic order (the order ``itertools.product`` gives vectors of one sum).

    An odometer, not a recursion: a cluster of thousands of distinct hosts has thousands
    of entries, deeper than Python's recursion limit."""
    n = len(room)
    after = [0] * (n + 1)  # after[j]: the most hosts j.. can take together
    for j in range(n - 1, -1, -1):
        after[j] = after[j + 1] + room[j]
    if not 0 <= total <= after[0]:
        return
    counts = [0] * n
    left = [0] * (n + 1)  # left[j]: what entries j.. must still take
    left[0] = total

    def lowest_from(j: int) -> None:  # entries j.. at their smallest given left[j]
        for k in range(j, n):
            counts[k] = max(0, left[k] - after[k + 1])
            left[k + 1] = left[k] - counts[k]

    lowest_from(0)
    while True:
        yield tuple(counts)
        j = n - 1
        while j >= 0 and counts[j] >= min(room[j], left[j]):
            j -= 1
        if j < 0:
            return
        counts[j] += 1
        left[j + 1] = left[j] - counts[j]
        lowest_from(j + 1)


def _symmetry_classes(cluster: Cluster) -> tuple[tuple[int, ...], ...]:
    """Groups of interchangeable hosts (classes of one host are left out)."""
    uplink: dict[str, tuple] = {}
    for link in cluster.links:
        for host, other in ((link.a, link.b), (link.b, link.a)):
            if host in cluster.host_index:
                uplink.setdefault(host, ())
                # A stochastic link draws its own bandwidth, so its host is unique.
                model = link.bandwidth if isinstance(link.bandwidth, Constant) else id(link)
                uplink[host] += ((other, link.capacity_gbps, link.latency_s, model),)
    groups: dict[tuple, list[int]] = {}
    for i, h in enumerate(cluster.hosts):
        key = (h.gpu.name, h.num_gpus, h.intra_kind, h.intra_GBps, h.intra_latency_s,
               h.nic_gbps, tuple(sorted(uplink.get(h.name, ()), key=repr)))
        groups.setdefault(key, []).append(i)
    return tuple(tuple(g) for g in groups.values() if len(g) > 1)


@dataclass
class SymmetryCheck:
    """Incremental lexicographic-leader test over interchangeable hosts.

    Keeps, for each adjacent pair of hosts in a class, whether their usage columns (GPUs
    taken by stage 1, 2, ...) are still equal; a new stage is canonical if it never gives
    the later host of a tied pair more than the earlier one.
    """

    pairs: tuple[tuple[int, int], ...]
    tied: tuple[bool, ...]

    @classmethod
    def start(cls, space: PlanSpace) -> SymmetryCheck:
        pairs = tuple((a, b) for cls_ in space.classes for a, b in zip(cls_, cls_[1:]))
        return cls(pairs, (True,) * len(pairs))

    def extend(self, stage: StageChoice) -> SymmetryCheck | None:
        """The check after appending ``stage``, or None if the prefix is not canonical."""
        tied = list(self.tied)
        # Blocks per host (the GPUs taken are blocks x tp, the same tp for every host).
        use = dict(zip(stage.hosts, stage.blocks))
        for k, (a, b) in enumerate(self.pairs):
            if tied[k]:
                ua, ub = use.get(a, 0), use.get(b, 0)
                if ub > ua:
                    return None
                if ua > ub:
                    tied[k] = False
        return SymmetryCheck(self.pairs, tuple(tied))
