"""Runtime profiles: which plans a training framework can execute as they stand.

hetpar's plan space (``--runtime any``) lets every stage pick its own tensor-parallel
degree, replica count and hosts, as Alpa- or Metis-style runtimes do. Megatron-LM and
DeepSpeed run a narrower set:

* one TP degree and one data-parallel degree for every stage (their process grids are
  ``tp x dp x pp`` boxes);
* global ranks laid out tp-fastest, then dp, then pp (Megatron-core's default order
  ``tp-cp-ep-dp-pp``; DeepSpeed's ``PipeModelDataParallelTopology`` axes pipe, data,
  model), so each pipeline stage is a contiguous block of ranks; a launcher numbers the
  ranks host by host (torchrun: each node's ranks follow the local world sizes of the
  nodes before it), so each host's ranks are contiguous too. Both hold at once only if
  the stages can be laid along an order of the hosts: a host shared by two stages is the
  last host of the first and the first of the second, and no host comes back later;
* layer splits the framework can express: Megatron-LM splits evenly, optionally with a
  different count on the first and the last stage (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``); DeepSpeed's ``PipelineModule`` with
  ``partition_method='uniform'`` gives the first ``L mod p`` stages one layer more
  (``partition_uniform`` in deepspeed/runtime/utils.py);
* ZeRO: Megatron-LM's distributed optimizer is ZeRO-1; DeepSpeed's pipeline engine runs
  ZeRO stage 0 or 1 only (its engine refuses 2 and 3 with pipeline parallelism; without a
  pipeline DeepSpeed runs every stage);
* sequence parallelism and the interleaved schedule are Megatron-LM's
  (``--sequence-parallel``, ``--num-layers-per-virtual-pipeline-stage``); Megatron-core
  builds no uneven first or last stage under interleaving (``get_num_layers_to_build``
  asserts it), so an interleaved plan needs an even split. DeepSpeed's pipeline engine has
  neither (its own "sequence parallelism", Ulysses, splits attention heads, not
  Megatron's LayerNorm and dropout activations);
* context parallelism is Megatron-LM's (``--context-parallel-size``; its default order
  ``tp-cp-ep-dp-pp`` puts a stage's context-parallel ranks next to each other, so a plan's
  consecutive TP blocks are one group and the launch layout is the one without it);
  DeepSpeed's pipeline engine has none.

The rules are written twice over the same data: on the exact search's ``StageChoice``
(host indices, checked node by node) and on a ``Plan`` (host names, for any plan a user
brings). ``hetpar.runtime.launch`` builds the launch layout the second proves exists.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetpar.errors import ConfigError
from hetpar.plan import Plan

__all__ = ["Runtime", "RUNTIMES", "get_runtime", "check_plan", "runnable_by", "host_runs",
           "stage_extends", "structure_ok", "split_ok", "allowed_splits", "uniform_split",
           "usable_free"]


@dataclass(frozen=True)
class Runtime:
    """What a framework requires of a plan."""

    name: str
    uniform: bool  # one TP degree and one replica count for every stage
    contiguous: bool  # stages laid along an order of the hosts (rank order)
    splits: str  # "any", "ends" (even but first and last) or "uniform" (partition_uniform)
    zero_stages: tuple[int, ...]
    description: str
    sequence_parallel: bool = True
    interleaving: str = "any"  # the splits it interleaves: "any", "even" or "none"
    single_stage_zero: tuple[int, ...] | None = None  # without a pipeline (None: as above)
    context_parallel: bool = True

    def zero_for(self, stages: int) -> tuple[int, ...]:
        """The ZeRO stages it runs for a pipeline of this many stages."""
        if stages == 1 and self.single_stage_zero is not None:
            return self.single_stage_zero
        return self.zero_stages

    def interleaves(self, split: tuple[int, ...]) -> bool:
        """Whether it runs this layer split with an interleaved schedule at all (the chunk
        count must also divide every stage's layers: ``validate_plan``)."""
        return self.interleaving == "any" or (self.interleaving == "even"
                                              and len(set(split)) == 1)

    @property
    def unrestricted(self) -> bool:
        return self.name == "any"


RUNTIMES: dict[str, Runtime] = {
    "any": Runtime("any", False, False, "any", (0, 1, 2, 3),
                   "every plan of hetpar's space (stages may differ, as in Alpa- or "
                   "Metis-style runtimes)"),
    "megatron": Runtime("megatron", True, True, "ends", (0, 1),
                        "Megatron-LM: one TP and DP degree, tp-dp-pp rank order, even layers "
                        "but the first and last stage", interleaving="even"),
    "deepspeed": Runtime("deepspeed", True, True, "uniform", (0, 1),
                         "DeepSpeed pipeline engine: one TP and DP degree, pipe-data-model "
                         "rank order, partition_method='uniform', ZeRO 0 or 1 (any without "
                         "a pipeline), no interleaving or sequence parallelism",
                         sequence_parallel=False, interleaving="none",
                         single_stage_zero=(0, 1, 2, 3), context_parallel=False),
}


def get_runtime(name: str | Runtime) -> Runtime:
    if isinstance(name, Runtime):
        return name
    rt = RUNTIMES.get(name)
    if rt is None:
        raise ConfigError("--runtime", "", f"unknown runtime {name!r} (known: "
                                           f"{', '.join(RUNTIMES)})")
    return rt


# ---- host order ------------------------------------------------------------------------------
def host_runs(stage_hosts: Sequence[Sequence[object]]) -> list[list[object]] | None:
    """Each stage's hosts in rank order, such that every host's ranks are contiguous over
    the whole pipeline; None if no order does. ``stage_hosts[i]``: the distinct hosts of
    stage i (any order). On a prefix of a pipeline the answer is whether some stages
    could still follow: the last stage's host shared with the next is not chosen yet.

    A host shared by stages i and i+1 must close stage i and open stage i+1; a host that
    spans three or more stages must hold the middle ones alone; a host left behind never
    comes back."""
    out: list[list[object]] = []
    closed: set[object] = set()  # hosts whose ranks are over
    entry: object = None  # the host the current stage continues from the previous one
    n = len(stage_hosts)
    for i, hosts in enumerate(stage_hosts):
        hs = list(dict.fromkeys(hosts))
        if any(h in closed for h in hs):
            return None
        nxt = set(stage_hosts[i + 1]) if i + 1 < n else set()
        shared = [h for h in hs if h in nxt]
        if len(shared) > 1:
            return None
        exit_ = shared[0] if shared else None
        if exit_ is not None and exit_ == entry and len(hs) > 1:
            return None  # the entry host would have to close the stage too
        middle = [h for h in hs if h != entry and h != exit_]
        order = ([entry] if entry is not None else []) + middle + (
            [exit_] if exit_ is not None and exit_ != entry else [])
        out.append(order)
        # Every host of this stage but the one continuing into the next is done.
        closed.update(h for h in hs if h != exit_)
        entry = exit_
    return out


def stage_extends(prefix: Sequence, stage, runtime: Runtime) -> bool:  # noqa: ANN001
    """Whether appending ``stage`` (a ``StageChoice``) to ``prefix`` keeps a prefix of a
    plan ``runtime`` can run (uniform degrees, a host order)."""
    if runtime.unrestricted or not prefix:
        return True
    first = prefix[0]
    if runtime.uniform and (stage.tp != first.tp or stage.dp != first.dp):
        return False
    if runtime.contiguous:
        return host_runs([s.hosts for s in prefix] + [stage.hosts]) is not None
    return True


def usable_free(prefix: Sequence, free: tuple[int, ...], runtime: Runtime) -> tuple[int, ...]:  # noqa: ANN001
    """``free`` without the hosts no later stage of ``runtime`` may use: with a host
    order, every host of the prefix is done but the one the next stage may continue on
    (any host of the last stage but its entry host, or that host if it is alone)."""
    if not runtime.contiguous or not prefix:
        return free
    last = prefix[-1]
    entry = None
    if len(prefix) > 1:
        shared = set(prefix[-2].hosts) & set(last.hosts)
        entry = next(iter(shared)) if len(shared) == 1 else None
    going_on = set(last.hosts) if len(last.hosts) == 1 else set(last.hosts) - {entry}
    used = {h for st in prefix for h in st.hosts}
    done = used - going_on
    if not any(free[h] for h in done):
        return free
    return tuple(0 if h in done else f for h, f in enumerate(free))


def structure_ok(stages: Sequence, runtime: Runtime) -> bool:  # noqa: ANN001
    """Whether a complete pipeline of ``StageChoice``s suits ``runtime`` (its split aside)."""
    if runtime.unrestricted:
        return True
    if runtime.uniform and any(s.tp != stages[0].tp or s.dp != stages[0].dp for s in stages):
        return False
    return not runtime.contiguous or host_runs([s.hosts for s in stages]) is not None


# ---- layer splits ----------------------------------------------------------------------------
def uniform_split(layers: int, stages: int) -> tuple[int, ...]:
    """DeepSpeed's ``partition_uniform`` as layer counts: ``L // p`` each, the first
    ``L mod p`` stages one more (restated from deepspeed/runtime/utils.py)."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if i < extra else 0) for i in range(stages))


def split_ok(split: Sequence[int], runtime: Runtime) -> bool:
    p = len(split)
    if runtime.splits == "any" or p == 1:
        return True
    if runtime.splits == "uniform":
        return tuple(split) == uniform_split(sum(split), p)
    # "ends": every stage but the first and the last holds the same count.
    return p <= 2 or len(set(split[1:-1])) == 1


@functools.lru_cache(maxsize=512)
def allowed_splits(layers: int, caps: tuple[int, ...], splits: str) -> np.ndarray:
    """Every layer split a runtime's rule admits with 1 <= n_i <= caps[i] ((N, p),
    read-only)."""
    p = len(caps)
    rows: list[tuple[int, ...]] = []
    if splits == "uniform":
        rows = [uniform_split(layers, p)]
    elif p <= 2:
        rows = [(layers,)] if p == 1 else [(f, layers - f) for f in range(1, layers)]
    else:
        for mid in range(1, layers // (p - 2) + 1):
            rest = layers - mid * (p - 2)
            rows.extend((f, *([mid] * (p - 2)), rest - f) for f in range(1, rest))
    arr = np.array([r for r in rows if all(1 <= n <= c for n, c in zip(r, caps))],
                   dtype=np.intp).reshape(-1, p)
    arr.setflags(write=False)
    return arr


# ---- plans -------------------------------------------------------------------------------------
def check_plan(plan: Plan, runtime: str | Runtime) -> list[str]:
    """Why ``runtime`` cannot run ``plan`` (empty: it can), in words."""
    rt = get_runtime(runtime)
    if rt.unrestricted:
        return []
    why: list[str] = []
    if rt.uniform:
        tps = sorted({s.tp for s in plan.stages})
        dps = sorted({s.dp for s in plan.stages})
        if len(tps) > 1:
            why.append(f"stages use TP degrees {', '.join(map(str, tps))}; {rt.name} needs "
                       f"one for all")
        if len(dps) > 1:
            why.append(f"stages have {', '.join(map(str, dps))} replicas; {rt.name} needs one "
                       f"data-parallel degree for all")
    if rt.contiguous and host_runs([[r.host for r in s.replicas] for s in plan.stages]) is None:
        why.append("no order of the hosts lays the stages out in rank order (a host's ranks "
                   "must be contiguous: a host shared by two stages must end the first and "
                   "start the second, and none may come back later)")
    split = tuple(s.layers for s in plan.stages)
    if not split_ok(split, rt):
        if rt.splits == "uniform":
            why.append(f"layer split {'/'.join(map(str, split))} is not DeepSpeed's uniform "
                       f"partition {'/'.join(map(str, uniform_split(sum(split), len(split))))}")
        else:
            why.append(f"layer split {'/'.join(map(str, split))}: Megatron-LM needs the same "
                       f"count on every stage but the first and the last")
    if plan.zero not in rt.zero_for(plan.num_stages):
        why.append(f"ZeRO stage {plan.zero}: {rt.name} runs "
                   f"{' or '.join(map(str, rt.zero_stages))} with pipeline parallelism")
    if plan.sequence_parallel and not rt.sequence_parallel:
        why.append(f"sequence parallelism: {rt.name} has no Megatron-style sequence "
                   f"parallelism")
    if plan.context_parallel > 1 and not rt.context_parallel:
        why.append(f"context parallelism: {rt.name} has no ring-attention context "
                   f"parallelism")
    if plan.virtual_stages > 1 and not rt.interleaves(split):
        if rt.interleaving == "none":
            why.append(f"{plan.virtual_stages} virtual stages: {rt.name} has no interleaved "
                       f"schedule")
        else:
            why.append(f"{plan.virtual_stages} virtual stages with layer split "
                       f"{'/'.join(map(str, split))}: {rt.name} interleaves even splits only")
    return why


def runnable_by(plan: Plan) -> tuple[str, ...]:
    """The runtimes that can run ``plan`` as it stands."""
    return tuple(name for name in RUNTIMES if not check_plan(plan, name))
