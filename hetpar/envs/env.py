"""``hetpar/PlanBuilder-v0``: build a hybrid-parallel training plan step by step.

An episode builds one plan of the searched plan space (docs/solvers.md) for one
instance (cluster with stochastic bandwidth, model, training) drawn from a topology suite.

**Actions** (one flat ``Discrete``, layout in ``ActionLayout``; use ``action_masks()``):

1. choose the memory options: a (recompute mode, ZeRO stage) pair;
2. choose the micro-batch count (slot ``i`` = the ``i``-th smallest divisor of the batch);
3. then stages, built from the **last pipeline stage to the first**: open a stage with a
   TP degree, add TP blocks (data-parallel replicas) from hosts of one GPU type, close
   it with ``k`` layers. Closing with all remaining layers makes it the first pipeline
   stage and ends the episode.

Building back to front is what makes the masks exact and cheap: a stage's activation
memory under 1F1B depends on how many stages come after it, which is known at that
point (see ``feasibility.py``).

**Masks** allow exactly the actions after which a plan that fits in memory can still be
completed, so every episode ends with a feasible plan, and every feasible plan of the
space (with at most ``max_hosts`` hosts, ``max_layers`` per stage and a micro-batch
count among the first ``max_micro`` divisors) is reachable: ``actions_for(plan)``.
With ``runtime="megatron"`` or ``"deepspeed"`` the masks allow only plans that framework
runs (one TP and DP degree, a host order, its layer split; ``runtime_feasibility.py``).

**Observation** (``Dict`` of ``Box`` in [0, 1]; the columns are named and scaled in
``types.py``): ``hosts`` (max_hosts x host features: GPU figures, free GPUs, the partial
plan), ``host_mask`` (1 for real hosts), ``pairs`` (max_hosts x max_hosts x route
bandwidth mean, its variability, this episode's draw, latency) and ``globals`` (phase,
choices so far, layers left, the open stage, model and training figures).

**Bandwidth modes**: ``sampled`` draws every link once per episode from its bandwidth
model, shows the draw next to the distribution, and scores the plan under that draw;
``robust`` shows only the distribution and scores the plan's ``objective`` (mean, pNN
or cvarA) over a fixed set of ``samples`` draws of the instance.

**Reward**: 0 until the last step; then the plan's cluster model-FLOPs utilisation,
``T_ideal / T``, where ``T`` is the objective's iteration time and ``T_ideal`` the
model's FLOPs over the peak of every GPU of the cluster. It is scale-free (comparable
across clusters and models) and ranks plans of one instance exactly as ``T`` does.

**Termination**: when the plan is complete (``terminated``). ``info`` then has ``plan``
(a ``Plan``), ``objective_s``, ``iter_time_mean_s``, ``feasible`` and ``instance``.
An action that the mask forbids (as environment checkers send) leaves the state
unchanged, gives ``invalid_action_reward`` and ``info["invalid_action"] = True``; after
``max_invalid_actions`` of them in one episode the episode is truncated.

**Beyond Gymnasium** two things are public: ``state``, a frozen copy of the episode
(``types.State``, what the viewer draws), and the planner's interface, ``search.SearchEnv``
(masks asked one action at a time, ``snapshot``/``restore`` for branching, ``retarget``
and ``actions_for``).
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hetpar.costmodel.constants import CostConstants
from hetpar.costmodel.objective import Objective
from hetpar.envs.actions import KINDS, RECOMPUTE_MODES, ZERO_STAGES, ActionLayout
from hetpar.envs.context import InstanceContext, log_scale
from hetpar.envs.feasibility import bits_upto
from hetpar.envs.observation import (observation_space, pair_features,
                                     static_globals, static_host_features)
from hetpar.envs.search import Snapshot
from hetpar.envs.sources import InstanceSource, as_source
from hetpar.envs.types import PHASES, GlobalFeature, HostFeature, State
from hetpar.envs.viewer import RENDERERS
from hetpar.problem import POLICY_SAMPLES
from hetpar.problem.instance import Instance
from hetpar.errors import ConfigError, InfeasibleError, PlanError
from hetpar.plan import Plan
from hetpar.problem.space import StageChoice
from hetpar.runtime.rules import get_runtime

__all__ = ["CACHE_SIZE", "PlanBuilderEnv"]

_MEMORY, _MICRO, _TP, _BLOCKS, _DONE = range(5)  # indices of PHASES
H, G = HostFeature, GlobalFeature
# The phase's one-hot column; the final observation (done) keeps the block phase's, as the
# shipped policy was trained with (it never acts on that observation).
_PHASE_COLUMN = (G.PHASE_MEMORY, G.PHASE_MICRO_BATCHES, G.PHASE_TP, G.PHASE_BLOCKS,
                 G.PHASE_BLOCKS)
_RECOMPUTE_COLUMN = {"none": G.RECOMPUTE_NONE, "selective": G.RECOMPUTE_SELECTIVE,
                     "full": G.RECOMPUTE_FULL}
CACHE_SIZE = 512  # instances whose tables an environment keeps, by default
_MASK_MEMO = 50_000  # masks memoised per instance before the memo starts afresh


@dataclass
class _Episode:
    ctx: InstanceContext
    index: int
    cm: Any  # the CostModel that scores this episode's plan
    pairs: np.ndarray
    free: list[int]
    phase: int = _MEMORY
    recompute: str = ""
    zero: int = 0
    micro_batches: int = 0
    # Closed stages in construction order (the last pipeline stage first).
    built: list[tuple[StageChoice, int]] = field(default_factory=list)
    open_cls: int = -1
    open_tp: int = 0
    open_blocks: dict[int, int] = field(default_factory=dict)
    layers_left: int = 0
    invalid: int = 0
    # Per-host figures of the partial plan, kept up to date for the observation.
    open_use: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    layer_gpus: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    previous: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    @property
    def open_dp(self) -> int:
        return sum(self.open_blocks.values())


def _identity(inst: Instance) -> tuple[Any, ...]:
    return (inst.name, inst.seed, inst.num_hosts, inst.model.name, inst.cluster.name)


class PlanBuilderEnv(gym.Env):
    __doc__ = __doc__
    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 2}

    def __init__(self, suite: str | Any = "train-small", *, max_hosts: int | None = None,
                 objective: str = "mean", bandwidth: str = "sampled",
                 samples: int = POLICY_SAMPLES,
                 instances: int | None = None, max_layers: int = 128, max_micro: int = 16,
                 max_tp: int = 16, render_mode: str | None = None,
                 constants: CostConstants | None = None, cache_size: int = CACHE_SIZE,
                 invalid_action_reward: float = -1.0, max_invalid_actions: int = 32,
                 mask_witness: bool = True, runtime: str = "any") -> None:
        self.runtime = get_runtime(runtime)
        if bandwidth not in ("sampled", "robust"):
            raise ConfigError("", "bandwidth", f"expected 'sampled' or 'robust', got {bandwidth!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError("", "render_mode", f"expected one of {self.metadata['render_modes']}"
                                                 f", got {render_mode!r}")
        if max_tp < 1 or max_tp & (max_tp - 1):
            raise ConfigError("", "max_tp", f"must be a power of two, got {max_tp}")
        self.source: InstanceSource = as_source(suite, instances)
        self.max_hosts = int(max_hosts or self.source.max_hosts)
        if self.source.max_hosts > self.max_hosts:
            raise ConfigError(self.source.name, "max_hosts",
                              f"the suite has clusters of up to {self.source.max_hosts} hosts, "
                              f"more than max_hosts={self.max_hosts}")
        self.objective = Objective.parse(objective)
        self.bandwidth_mode = bandwidth
        self.samples = samples if bandwidth == "robust" else 1
        self.layout = ActionLayout(self.max_hosts, max_micro, max_tp.bit_length() - 1,
                                   max_layers)
        self.render_mode = render_mode
        self.constants = constants
        self.invalid_action_reward = float(invalid_action_reward)
        self.max_invalid_actions = max_invalid_actions
        self.mask_witness = bool(mask_witness)
        self.action_space = spaces.Discrete(self.layout.n)
        self.observation_space = observation_space(self.max_hosts)
        self._cache: OrderedDict[int, InstanceContext] = OrderedDict()
        self._cache_size = cache_size
        self._static: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._routes: dict[int, np.ndarray] = {}
        self._ep: _Episode | None = None
        self._mask_cache: np.ndarray | None = None
        self._allowed: dict[int, bool] = {}  # single actions checked in this state
        self._phase_actions: dict[int, np.ndarray] = {}
        self._infeasible: set[int] = set()  # instances found to admit no plan
        # A bad suite should fail here, not in the middle of training.
        for i in self.source.check_indices():
            self._context(i)

    # ---- instances -----------------------------------------------------------------------
    def _context(self, index: int) -> InstanceContext:
        ctx = self._cache.get(index)
        if ctx is not None:
            self._cache.move_to_end(index)
            return ctx
        inst = self.source.get(index)
        self._check_instance(inst)
        ctx = InstanceContext.build(inst, samples=max(self.samples, 1) if
                                    self.bandwidth_mode == "robust" else 0,
                                    constants=self.constants, max_micro=self.layout.max_micro,
                                    witness=self.mask_witness, runtime=self.runtime)
        ctx.check_feasible()
        self._install(index, ctx)
        if len(self._cache) > self._cache_size:
            old, _ = self._cache.popitem(last=False)
            self._static.pop(old, None)
            self._routes.pop(old, None)
        return ctx

    def _install(self, index: int, ctx: InstanceContext) -> None:
        self._cache[index] = ctx
        routes = ctx.cluster.route_link_indices()
        self._routes[index] = routes
        self._static[index] = (static_host_features(ctx, self.max_hosts),
                               pair_features(ctx, self.max_hosts, None, routes=routes),
                               static_globals(ctx, self.max_hosts, self.layout.max_layers,
                                              self.bandwidth_mode == "robust"))

    def _draw_index(self) -> int:
        """A random instance index; a generated instance that admits no plan (the
        generators guarantee none does) is skipped and counted rather than ending a
        training run."""
        for _ in range(100):
            index = int(self.np_random.integers(self.source.count))
            if index in self._infeasible:
                continue
            try:
                self._context(index)
            except InfeasibleError:
                self._infeasible.add(index)
                continue
            return index
        raise InfeasibleError(f"suite {self.source.name}: no feasible instance in 100 draws")

    def share_contexts(self, other: PlanBuilderEnv) -> bool:
        """Use ``other``'s per-instance contexts (cost model, plan space, feasibility memo,
        action-mask memo: pure caches) from now on, when both environments build the same
        contexts: the same instances and settings. Environments stepped in one process
        (``GroupedVecEnv``'s workers) then build each instance's tables once between them
        instead of once each. Returns whether they are shared; nothing an episode draws
        or scores changes."""
        if other is self:
            return True
        same = (self.source.name == other.source.name and
                self.source.count == other.source.count and
                self.source.fixed == other.source.fixed and
                self.max_hosts == other.max_hosts and self.samples == other.samples and
                self.bandwidth_mode == other.bandwidth_mode and
                self.constants == other.constants and self.layout == other.layout and
                self.mask_witness == other.mask_witness and
                self.runtime == other.runtime and
                _identity(self.source.get(0)) == _identity(other.source.get(0)))
        if not same:
            return False
        self._cache, self._static, self._routes = other._cache, other._static, other._routes
        self._infeasible = other._infeasible
        self._cache_size = max(self._cache_size, other._cache_size)
        other._cache_size = self._cache_size
        return True

    def _check_instance(self, inst: Instance) -> None:
        if inst.num_hosts > self.max_hosts:
            raise ConfigError(inst.name, "hosts", f"{inst.num_hosts} hosts exceed "
                                                  f"max_hosts={self.max_hosts}")
        if inst.model.layers > self.layout.max_layers:
            raise ConfigError(inst.name, "model.layers",
                              f"{inst.model.layers} layers exceed max_layers="
                              f"{self.layout.max_layers}")

    # ---- gymnasium API -------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode on a random instance of the suite.

        ``options={"instance": i}`` picks instance index ``i`` of the suite instead, and
        ``options={"instance": Instance(...)}`` an explicit instance."""
        super().reset(seed=seed)
        choice = (options or {}).get("instance")
        if isinstance(choice, Instance):
            key = -1 - (id(choice) % 10**9)
            if key not in self._cache or self._cache[key].instance is not choice:
                self._cache.pop(key, None)
                self.source.pin(key, choice)
            index = key
        elif choice is not None:
            index = int(choice)
        else:
            index = self._draw_index()
        ctx = self._context(index)
        hosts0, pairs0, self._globals0 = self._static[index]
        if self.bandwidth_mode == "sampled":
            draw = ctx.cluster.sample_link_bandwidth(self.np_random, 1)
            cm = ctx.cm.with_bandwidth(draw)
            pairs = pair_features(ctx, self.max_hosts, draw, static=pairs0,
                                  routes=self._routes[index])
        else:
            cm = ctx.cm
            pairs = pairs0
        n = len(ctx.cluster.hosts)
        self._ep = _Episode(ctx, index, cm, pairs, list(ctx.full_free),
                            layers_left=ctx.cm.model.layers,
                            open_use=np.zeros(n, dtype=np.float32),
                            layer_gpus=np.zeros(n, dtype=np.float32),
                            previous=np.zeros(n, dtype=np.float32))
        self._host_mask = np.zeros(self.max_hosts, dtype=np.float32)
        self._host_mask[:n] = 1.0
        self._hosts0 = hosts0
        self._mask_cache: np.ndarray | None = None
        self._allowed = {}
        return self._observation(), {"instance": ctx.instance.name}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool,
                                         dict[str, Any]]:
        ep = self._ep
        if ep is None or ep.phase == _DONE:
            raise RuntimeError("the episode is over: call reset()")
        action = int(action)
        if not (0 <= action < self.layout.n) or not self.allows(action):
            ep.invalid += 1
            truncated = ep.invalid >= self.max_invalid_actions
            return (self._observation(), self.invalid_action_reward, False, truncated,
                    {"invalid_action": True})
        kind, slot = self.layout.decode(action)
        self._mask_cache, self._allowed = None, {}
        if kind == "memory":
            ep.recompute, ep.zero = ActionLayout.memory_option(slot)
            ep.phase = _MICRO
        elif kind == "micro_batches":
            ep.micro_batches = ep.ctx.micro_options[slot]
            ep.phase = _TP
        elif kind == "tp":
            ep.open_tp = 1 << slot
            ep.phase = _BLOCKS
        elif kind == "host":
            ep.open_cls = ep.ctx.classes.of_host[slot]
            ep.open_blocks[slot] = ep.open_blocks.get(slot, 0) + 1
            ep.free[slot] -= ep.open_tp
            ep.open_use[slot] += ep.open_tp
        else:
            return self._close(slot + 1)
        return self._observation(), 0.0, False, False, {}

    def _close(self, k: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        ep = self._ep
        assert ep is not None
        hosts = tuple(sorted(ep.open_blocks))
        stage = StageChoice(ep.ctx.classes.gpu_type[ep.open_cls], ep.open_tp, hosts,
                            tuple(ep.open_blocks[h] for h in hosts))
        ep.built.append((stage, k))
        ep.layers_left -= k
        ep.previous = ep.open_use
        ep.layer_gpus += k * ep.open_use
        ep.open_use = np.zeros_like(ep.previous)
        ep.open_cls, ep.open_tp, ep.open_blocks = -1, 0, {}
        if ep.layers_left:
            ep.phase = _TP
            return self._observation(), 0.0, False, False, {}
        ep.phase = _DONE
        plan = self.current_plan()
        assert plan is not None
        times, feasible = self._times(plan)
        value = self.objective.score(times, feasible)
        reward = self.plan_reward(value) if feasible else 0.0
        info = {"plan": plan, "objective_s": value, "iter_time_mean_s": float(times.mean()),
                "feasible": bool(feasible), "instance": ep.ctx.instance.name,
                "objective": self.objective.name, "reward": reward}
        return self._observation(), float(reward), True, False, info

    def _times(self, plan: Plan) -> tuple[np.ndarray, bool]:
        assert self._ep is not None
        times, feasible = self._ep.cm.iteration_times(plan)
        return np.atleast_1d(np.asarray(times, dtype=float)), bool(feasible)

    def plan_value(self, plan: Plan) -> float:
        """The objective of ``plan`` on the current episode's instance, as an episode that
        built it is scored (inf where it does not fit)."""
        return float(self.objective.score(*self._times(plan)))

    def plan_reward(self, value: float) -> float:
        """The episode's reward for a plan of objective ``value`` (0 where infinite)."""
        assert self._ep is not None
        return float(self._ep.ctx.ideal_s / value) if math.isfinite(value) and value > 0 else 0.0

    def action_masks(self) -> np.ndarray:
        """Boolean mask of the actions after which a feasible plan can still be built."""
        if self._mask_cache is not None:
            return self._mask_cache
        ep = self._ep
        if ep is None:
            raise RuntimeError("call reset() first")
        ctx = ep.ctx
        # States recur across episodes of an instance: masks are memoised per state.
        key = self._mask_key()
        hit = ctx.masks.get(key)
        if hit is not None:
            self._mask_cache = hit
            return hit
        lay = self.layout
        mask = np.zeros(lay.n, dtype=bool)
        if ep.phase == _MEMORY:
            for rc in RECOMPUTE_MODES:
                for z in ZERO_STAGES:
                    mask[lay.memory(rc, z)] = ctx.allowed_memory_option(rc, z)
        elif ep.phase == _MICRO:
            ok = set(ctx.feasible_micro(ep.recompute, ep.zero))
            for i, m in enumerate(ctx.micro_options):
                mask[lay.micro(i)] = m in ok
        elif ep.phase == _TP:
            for tp in range(lay.max_tp_log2 + 1):
                mask[lay.tp(1 << tp)] = self._tp_allowed(1 << tp)
        elif ep.phase == _BLOCKS:
            mask[lay.start("host"):lay.start("host") + len(ctx.cluster.hosts)] = \
                self._host_options(ep.open_tp)
            if ep.open_dp:
                mask[lay.start("layers"):lay.start("layers") + lay.max_layers] = \
                    self._layer_options()
        mask.flags.writeable = False  # shared by every episode that reaches this state
        if len(ctx.masks) >= _MASK_MEMO:
            ctx.masks.clear()
        ctx.masks[key] = mask
        self._mask_cache = mask
        return mask

    def render(self) -> str | np.ndarray | None:
        """The episode so far in ``render_mode``: text (``ansi``) or a picture of the
        cluster (``rgb_array``); drawn by ``viewer.py`` from ``state`` alone."""
        if self.render_mode is None or self._ep is None:
            return None
        return RENDERERS[self.render_mode](self.state)

    # ---- public read-only state --------------------------------------------------------
    @property
    def state(self) -> State:
        """A frozen copy of the episode so far (``types.State``): what a viewer, a logger
        or a test reads. Planners branch with ``snapshot``/``restore`` instead."""
        ep = self._ep
        if ep is None:
            raise RuntimeError("call reset() first")
        return State(ep.ctx.instance, PHASES[ep.phase], ep.recompute, ep.zero,
                     ep.micro_batches, tuple(ep.built), ep.open_tp,
                     tuple(sorted(ep.open_blocks.items())), tuple(ep.free), ep.layers_left)

    @property
    def instance(self) -> Instance:
        """The instance of the current episode."""
        if self._ep is None:
            raise RuntimeError("call reset() first")
        return self._ep.ctx.instance

    @property
    def instance_index(self) -> int:
        """The suite index of the current episode's instance (``reset(options={"instance":
        i})`` starts another episode on it)."""
        if self._ep is None:
            raise RuntimeError("call reset() first")
        return self._ep.index

    @property
    def context(self) -> InstanceContext:
        """The current instance's precomputed tables (cost model, plan space, feasibility
        oracles): internals, for tests and diagnostics, which may change."""
        if self._ep is None:
            raise RuntimeError("call reset() first")
        return self._ep.ctx

    def phase_name(self) -> str:
        """``state.phase`` without the copy ("memory" before the first reset)."""
        ep = self._ep
        return PHASES[ep.phase if ep else 0]

    def current_plan(self) -> Plan | None:
        """The finished plan (None while stages are missing)."""
        ep = self._ep
        if ep is None or ep.layers_left or not ep.built:
            return None
        stages = [st for st, _ in reversed(ep.built)]
        layers = [k for _, k in reversed(ep.built)]
        return ep.ctx.space.to_plan(stages, layers, ep.micro_batches, ep.recompute, ep.zero)

    # ---- the planner's interface (search.SearchEnv) ------------------------------------
    # What a planner may call besides reset/step/action_masks; keep in step with search.py.

    def known_masks(self) -> np.ndarray | None:
        """The action mask of the current state if it is already known (computed for this
        state, memoised from an earlier episode, or needed by the observation, as in the
        block phase), else None: a caller that only needs a few actions' answers can ask
        ``allows`` or ``masked_argmax`` instead of paying for the whole mask."""
        if self._mask_cache is None and self._ep is not None:
            hit = self._ep.ctx.masks.get(self._mask_key())
            if hit is not None:
                self._mask_cache = hit
        return self._mask_cache

    def allows(self, action: int) -> bool:
        """``action_masks()[action]``, without building the whole mask in the memory,
        micro-batch and TP phases (each of their actions is its own feasibility question,
        and a TP option costs a completion search)."""
        ep = self._ep
        if ep is None:
            raise RuntimeError("call reset() first")
        if self._mask_cache is not None or ep.phase == _BLOCKS:
            return bool(self.action_masks()[action])
        hit = self._allowed.get(action)
        if hit is None:
            known = self.known_masks()
            if known is not None:
                return bool(known[action])
            kind, slot = self.layout.decode(action)
            ctx = ep.ctx
            if kind != KINDS[ep.phase]:
                hit = False
            elif kind == "memory":
                hit = ctx.allowed_memory_option(*ActionLayout.memory_option(slot))
            elif kind == "micro_batches":
                hit = slot < len(ctx.micro_options) and ctx.micro_feasible(
                    ep.recompute, ep.zero, ctx.micro_options[slot])
            else:
                hit = self._tp_allowed(1 << slot)
            self._allowed[action] = hit = bool(hit)
        return hit

    def phase_actions(self) -> np.ndarray:
        """Every action of the decision kinds of the current phase, allowed or not (a
        superset of ``action_masks()``; the block phase has two kinds, hosts and layers)."""
        ep = self._ep
        if ep is None:
            raise RuntimeError("call reset() first")
        hit = self._phase_actions.get(ep.phase)
        if hit is None:
            lay = self.layout
            hit = np.zeros(lay.n, dtype=bool)
            kinds = ("host", "layers") if ep.phase == _BLOCKS else \
                () if ep.phase == _DONE else (KINDS[ep.phase],)
            for kind in kinds:
                i = KINDS.index(kind)
                hit[lay.offsets[i]:lay.offsets[i] + lay.sizes[i]] = True
            hit.flags.writeable = False
            self._phase_actions[ep.phase] = hit
        return hit

    def masked_argmax(self, logits: np.ndarray) -> int:
        """``argmax(where(action_masks(), logits, -inf))`` (the policy's deterministic
        choice), asking ``allows`` of the phase's actions from the most likely down, so
        that a confident policy's choice costs one feasibility question, not the mask's."""
        known = self.known_masks()
        if known is not None:
            return int(np.argmax(np.where(known, logits, -np.inf)))
        candidates = np.flatnonzero(self.phase_actions())
        # Stable: equal logits in index order, as argmax breaks ties.
        for i in np.argsort(-np.asarray(logits)[candidates], kind="stable"):
            action = int(candidates[i])
            if self.allows(action):
                return action
        raise RuntimeError("no action is allowed in this state")

    def snapshot(self) -> Snapshot:
        """An independent copy of the episode so far, for ``restore``: planners that
        search over action sequences (beam search) branch from it without re-playing.
        Opaque: only ``restore`` of the same environment reads it."""
        ep = self._ep
        if ep is None:
            raise RuntimeError("call reset() first")
        return _copy_episode(ep)

    def restore(self, state: Snapshot, *, observe: bool = True,
                ) -> dict[str, np.ndarray] | None:
        """Continue from a ``snapshot`` of an episode of this environment's current
        instance; returns its observation (None with ``observe=False``, for a caller that
        kept it). The snapshot itself stays unchanged."""
        ep = self._ep
        if ep is None or not isinstance(state, _Episode) or state.ctx is not ep.ctx:
            raise RuntimeError("restore() takes a snapshot of the current instance's episode")
        self._ep = _copy_episode(state)
        self._mask_cache, self._allowed = None, {}
        return self._observation() if observe else None

    def state_key(self) -> tuple:
        """A hashable key of the episode state: equal keys have equal futures (the same
        stages, free GPUs and open stage, whatever order the blocks were added in)."""
        ep = self._ep
        if ep is None:
            raise RuntimeError("call reset() first")
        return (ep.phase, ep.recompute, ep.zero, ep.micro_batches, tuple(ep.free),
                tuple(ep.built), ep.open_tp, tuple(sorted(ep.open_blocks.items())))

    def retarget(self, instance: Instance) -> PlanBuilderEnv:
        """A one-instance environment like this one for ``instance``: the cluster of this
        one-instance environment's instance under other link bandwidth (what a
        re-planner asks for at every bandwidth change). It shares this environment's
        memory-feasibility tables and action masks (``InstanceContext.rebind``) and
        rebuilds the observation's bandwidth features; this environment is unchanged."""
        if self.source.count != 1:
            raise ValueError("retarget needs an environment of a single instance")
        other = copy.copy(self)
        other.source = as_source([instance])
        other._cache = OrderedDict()
        other._static, other._routes = {}, {}
        other._ep, other._infeasible = None, set()
        other._mask_cache, other._allowed = None, {}
        other._install(0, self._context(0).rebind(instance))
        return other

    def actions_for(self, plan: Plan) -> list[int]:
        """The action sequence that builds ``plan`` on the current episode's instance.

        Raises PlanError if the plan is outside the space this environment can build."""
        ep = self._ep
        if ep is None:
            raise RuntimeError("call reset() first")
        ctx, lay = ep.ctx, self.layout
        stages, layers = ctx.space.decompose(plan)
        if plan.micro_batches not in ctx.micro_options:
            raise PlanError("<plan>", "micro_batches", f"{plan.micro_batches} is not among "
                                                       f"the first {lay.max_micro} divisors")
        out = [lay.memory(plan.recompute, plan.zero),
               lay.micro(ctx.micro_options.index(plan.micro_batches))]
        for st, k in zip(reversed(stages), reversed(layers)):
            if st.tp > 2 ** lay.max_tp_log2 or k > lay.max_layers:
                raise PlanError("<plan>", "stages", "tp or layers exceed the action layout")
            out.append(lay.tp(st.tp))
            for h, b in zip(st.hosts, st.blocks):
                out.extend([lay.host(h)] * b)
            out.append(lay.layers(k))
        return out

    # ---- masks -------------------------------------------------------------------------
    def _mask_key(self) -> tuple:
        ep = self._ep
        assert ep is not None
        key = (ep.phase, ep.recompute, ep.zero, ep.micro_batches, tuple(ep.free),
               min(len(ep.built), ep.micro_batches), ep.layers_left, ep.open_cls, ep.open_tp,
               ep.open_dp)
        if self.runtime.unrestricted:
            return key
        # A runtime's rules read which hosts each stage used and the split so far.
        return key + (tuple(ep.built), tuple(sorted(ep.open_blocks.items())))

    def _tp_allowed(self, tp: int) -> bool:
        return bool(self._host_options(tp, first_only=True).any())

    def _oracle(self):  # noqa: ANN202
        ep = self._ep
        assert ep is not None
        return ep.ctx.oracle(ep.recompute, ep.zero, ep.micro_batches)

    def _host_options(self, tp: int, first_only: bool = False) -> np.ndarray:
        """Hosts from which a block of ``tp`` GPUs keeps the plan completable (with
        ``first_only``, stop at the first such host)."""
        ep = self._ep
        assert ep is not None
        if not self.runtime.unrestricted:
            return ep.ctx.runtime_oracle(ep.recompute, ep.zero, ep.micro_batches).host_options(
                ep.built, ep.free, ep.open_cls, tp, ep.open_blocks, ep.layers_left, first_only)
        ctx, oracle = ep.ctx, self._oracle()
        n = len(ctx.cluster.hosts)
        out = np.zeros(n, dtype=bool)
        dp = ep.open_dp
        if dp >= oracle.mb:
            return out
        want = ep.layers_left
        j = len(ep.built)
        seen: dict[tuple[int, int, int], bool] = {}
        hosts = ctx.cluster.hosts
        for h in range(n):
            cls = ctx.classes.of_host[h]
            if cls < 0 or ep.free[h] < tp or hosts[h].num_gpus % tp:
                continue
            if tp not in ctx.space.tp_options[ctx.classes.gpu_type[cls]]:
                continue
            if dp and cls != ep.open_cls:
                continue
            # Hosts of a type with equal GPU and free counts are alike.
            key = (cls, hosts[h].num_gpus, ep.free[h])
            if key not in seen:
                ep.free[h] -= tp
                seen[key] = oracle.open(ep.free, j, cls, tp, dp + 1, 1 << want)
                ep.free[h] += tp
            out[h] = seen[key]
            if first_only and out[h]:
                break
        return out

    def _layer_options(self) -> np.ndarray:
        ep = self._ep
        assert ep is not None
        if not self.runtime.unrestricted:
            return ep.ctx.runtime_oracle(ep.recompute, ep.zero, ep.micro_batches).close_options(
                ep.built, ep.free, ep.open_cls, ep.open_tp, ep.open_blocks, ep.layers_left,
                self.layout.max_layers)
        oracle = self._oracle()
        j, want = len(ep.built), ep.layers_left
        cls, tp, dp = ep.open_cls, ep.open_tp, ep.open_dp
        out = np.zeros(self.layout.max_layers, dtype=bool)
        if oracle.mb % dp:
            return out
        if oracle.capacity(cls, tp, dp, j, True) >= want:
            out[want - 1] = True
        cap = min(oracle.capacity(cls, tp, dp, j, False), want - 1)
        if cap:
            # Remaining counts want-cap .. want-1 after closing with 1 .. cap layers.
            rest = oracle.closed_all(ep.free, j + 1,
                                     bits_upto(want - 1) & ~bits_upto(want - cap - 1))
            for k in range(1, cap + 1):
                out[k - 1] = bool(rest >> (want - k) & 1)
        return out

    # ---- observation ---------------------------------------------------------------------
    def _observation(self) -> dict[str, np.ndarray]:
        ep = self._ep
        assert ep is not None
        n = len(ep.free)
        hosts = self._hosts0.copy()
        cap = ep.ctx.gpus_per_host
        free = np.asarray(ep.free, dtype=np.float32)
        hosts[:n, H.FREE_FRACTION] = free / cap
        hosts[:n, H.OPEN_STAGE_FRACTION] = ep.open_use / cap
        hosts[:n, H.CLOSED_STAGES_FRACTION] = (cap - free - ep.open_use) / cap
        if ep.phase == _BLOCKS:
            start = self.layout.start("host")
            hosts[:n, H.CAN_ADD_BLOCK] = self.action_masks()[start:start + n]
        hosts[:n, H.LAYERS_PER_GPU] = ep.layer_gpus / (ep.ctx.cm.model.layers * cap)
        hosts[:n, H.PREVIOUS_STAGE_FRACTION] = ep.previous / cap
        if ep.open_cls >= 0:
            hosts[:n, H.SAME_TYPE_AS_OPEN_STAGE] = ep.ctx.class_of_host == ep.open_cls
        # Fresh arrays every call: callers may keep or modify what they are given.
        return {"hosts": hosts, "host_mask": self._host_mask.copy(), "pairs": ep.pairs.copy(),
                "globals": self._globals()}

    def _globals(self) -> np.ndarray:
        ep = self._ep
        assert ep is not None
        g = self._globals0.copy()
        g[_PHASE_COLUMN[ep.phase]] = 1.0
        if ep.recompute:
            g[_RECOMPUTE_COLUMN[ep.recompute]] = 1.0
            g[G.ZERO] = ep.zero
        if ep.micro_batches:
            g[G.MICRO_BATCHES] = log_scale(ep.micro_batches, 1.0, 4096.0)
            g[G.MICRO_BATCH_SEQUENCES] = log_scale(
                ep.ctx.instance.training.global_batch / ep.micro_batches, 1.0, 4096.0)
        layers = ep.ctx.cm.model.layers
        g[G.LAYERS_LEFT] = ep.layers_left / layers
        g[G.STAGES_BUILT] = min(len(ep.built) / 32.0, 1.0)
        if ep.open_tp:
            g[G.OPEN_TP] = (ep.open_tp.bit_length() - 1) / max(self.layout.max_tp_log2, 1)
            dp = ep.open_dp
            g[G.OPEN_DP] = min(dp / 64.0, 1.0)
            if dp:
                oracle = self._oracle()
                j = len(ep.built)
                g[G.OPEN_CAPACITY] = oracle.capacity(ep.open_cls, ep.open_tp, dp, j,
                                                     False) / layers
                g[G.OPEN_CAPACITY_FIRST] = oracle.capacity(ep.open_cls, ep.open_tp, dp, j,
                                                           True) / layers
                g[G.OPEN_CLOSABLE] = float(oracle.mb % dp == 0)
        return g

def _copy_episode(ep: _Episode) -> _Episode:
    # What steps mutate in place is copied; the instance context and pair features are
    # shared (read-only). Field by field: dataclasses.replace re-runs __init__ and costs
    # ~5x more, and a speculative rollout snapshots at every guessed step.
    twin = object.__new__(_Episode)
    twin.__dict__.update(ep.__dict__)
    twin.free, twin.built, twin.open_blocks = list(ep.free), list(ep.built), dict(ep.open_blocks)
    twin.open_use, twin.layer_gpus = ep.open_use.copy(), ep.layer_gpus.copy()
    twin.previous = ep.previous.copy()
    return twin


def random_masked_action(env: PlanBuilderEnv, rng: np.random.Generator) -> int:
    """A uniformly random action among those the mask allows."""
    allowed = np.flatnonzero(env.action_masks())
    return int(allowed[rng.integers(allowed.size)])

