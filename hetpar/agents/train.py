"""``hetpar train``: MaskablePPO with ``HostAttentionPolicy`` on a topology suite.

Configuration (YAML, in the style of rl-baselines3-zoo; ``configs/train/*.yaml``)::

    suite: train-small        # training suite (name or file)
    seed: 0
    total_timesteps: 200000
    n_envs: 2                 # GroupedVecEnv (several envs per process) when > 1
    torch_threads: 1
    env:                      # PlanBuilderEnv keyword arguments
      max_hosts: 32
      objective: mean
      bandwidth: robust       # or sampled
      samples: 16
      instances: 1024         # pool of training instances (indices 0..N-1 of the suite)
      max_layers: 128
      max_micro: 16
      max_tp: 16
    ppo: {learning_rate: 3.0e-4, n_steps: 512, batch_size: 256, n_epochs: 4, gamma: 1.0,
          gae_lambda: 0.95, clip_range: 0.2, ent_coef: 0.01, vf_coef: 0.5,
          max_grad_norm: 0.5, target_kl: null}   # learning_rate may be "lin_3e-4"
    policy_kwargs: {dim: 64, heads: 4, rounds: 2, edge_dim: 32, value_dim: 64}
    eval:                     # fixed held-out evaluation set
      suite: train-small      # indices start .. start+n-1, never in the training pool
      start: 1000000
      n: 12
      freq: 20000             # timesteps between evaluations (0: only at the end)
      exact_time_limit: 20    # seconds per instance, computed once and cached
      samples: 16             # bandwidth draws of the robust objective
    checkpoint: {freq: 50000, keep: 3}

``seed`` seeds PPO, the networks and the environments; it is not the seed of the
bandwidth states that the evaluation references and the imitation's expert plans are
scored under: those are drawn with ``hetpar.problem.DEFAULT_SEED`` (0, ``hetpar
evaluate``'s default ``--seed``), so runs of any seed share the reference values and the
expert-plan cache, and their logged gaps are the ones ``hetpar evaluate`` measures.

A run folder ``runs/<run-name>/`` holds ``config.yaml`` (resolved), ``tb/`` (TensorBoard),
``checkpoints/``, ``eval_reference.json`` (exact and metis values of the evaluation set),
``eval_history.jsonl``, ``best_policy.zip``, ``final_policy.zip`` and, after Ctrl-C,
``interrupted_policy.zip``, from which ``--resume`` continues.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from hetpar import limits as lim
from hetpar.configio import Reader, bundled_dir, load_document
from hetpar.errors import ConfigError, TrainingDiverged
from hetpar.problem import POLICY_SAMPLES

__all__ = ["TrainConfig", "load_train_config", "parse_train_config", "train", "TrainResult",
           "resolve_train_config_path", "make_vec_env", "make_model"]

_TOP_KEYS = frozenset({"suite", "seed", "total_timesteps", "n_envs", "torch_threads",
                       "update_threads", "overlap_envs", "env",
                       "ppo", "policy_kwargs", "eval", "checkpoint", "description",
                       "imitation", "finetune", "dagger"})
_ENV_KEYS = frozenset({"max_hosts", "objective", "bandwidth", "samples", "instances",
                       "max_layers", "max_micro", "max_tp"})
_PPO_FLOAT = ("gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm")
_PPO_INT = ("n_steps", "batch_size", "n_epochs")
_PPO_KEYS = frozenset({"learning_rate", "clip_range", "target_kl", *_PPO_FLOAT, *_PPO_INT})
_POLICY_KEYS = frozenset({"dim", "heads", "rounds", "edge_dim", "value_dim"})
_EVAL_KEYS = frozenset({"suite", "start", "n", "freq", "exact_time_limit", "samples"})
_CKPT_KEYS = frozenset({"freq", "keep"})
_FINETUNE_KEYS = frozenset({"init_policy", "reward", "repeat", "anchor_coef", "value_warmup",
                            "explore_openings"})
# What PPO learns from and where it starts (hetpar/agents/shaping.py, anchored.py); the
# defaults are plain MaskablePPO on the utilisation reward from a fresh network.
FINETUNE_DEFAULTS: dict[str, Any] = {"init_policy": None, "reward": "mfu", "repeat": 1,
                                     "anchor_coef": 0.0, "value_warmup": 0,
                                     "explore_openings": 0.0}
_IMITATION_KEYS = frozenset({"experts", "exact_time_limit", "instances", "workers", "epochs",
                             "batch_size", "learning_rate", "vf_coef", "holdout", "cache",
                             "policy"})
_DAGGER_KEYS = frozenset({"rounds", "width", "instances", "workers", "epochs", "batch_size",
                          "learning_rate", "holdout"})

RESUME_FILE = "interrupted_policy.zip"
IMITATION_FILE = "imitation_policy.zip"
DAGGER_FILE = "dagger_policy.zip"


@dataclass(frozen=True)
class TrainConfig:
    """A validated training configuration (``as_dict`` is what ``config.yaml`` holds)."""

    suite: str
    seed: int
    total_timesteps: int
    n_envs: int
    torch_threads: int
    env: dict[str, Any]
    ppo: dict[str, Any]
    policy_kwargs: dict[str, Any]
    eval: dict[str, Any]
    checkpoint: dict[str, Any]
    imitation: dict[str, Any] | None = None  # behaviour cloning before PPO (imitation.py)
    dagger: dict[str, Any] | None = None  # DAgger rounds before PPO (dagger.py)
    finetune: dict[str, Any] = field(default_factory=lambda: dict(FINETUNE_DEFAULTS))
    update_threads: int = 0  # torch threads of the PPO update (0: one per core)
    # Rollouts: a worker group's forward pass overlaps the other groups' steps (rollouts.py)
    overlap_envs: bool = True
    name: str = "train"
    source: str = "<dict>"
    description: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "seed": self.seed, "total_timesteps": self.total_timesteps,
                "n_envs": self.n_envs, "torch_threads": self.torch_threads,
                "update_threads": self.update_threads, "overlap_envs": self.overlap_envs,
                "env": dict(self.env), "ppo": dict(self.ppo),
                "policy_kwargs": dict(self.policy_kwargs), "eval": dict(self.eval),
                "checkpoint": dict(self.checkpoint), "description": self.description,
                **({"imitation": dict(self.imitation)} if self.imitation is not None else {}),
                **({"dagger": dict(self.dagger)} if self.dagger is not None else {}),
                **({"finetune": dict(self.finetune)} if self.finetune != FINETUNE_DEFAULTS
                   else {})}

    def with_overrides(self, *, timesteps: int | None = None, seed: int | None = None,
                       n_envs: int | None = None) -> TrainConfig:
        data = self.as_dict()
        if timesteps is not None:
            data["total_timesteps"] = timesteps
        if seed is not None:
            data["seed"] = seed
        if n_envs is not None:
            data["n_envs"] = n_envs
        return parse_train_config(data, self.source, name=self.name)


def _lr(value: Any, r: Reader, key: str) -> float | str:
    if isinstance(value, str):
        m = re.fullmatch(r"lin_([0-9.eE+-]+)", value)
        try:
            if m and float(m.group(1)) > 0:
                return value
        except ValueError:
            pass
        raise r.error(key, f"expected a positive number or 'lin_<number>', got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise r.error(key, f"expected a positive number or 'lin_<number>', got {value!r}")
    return float(value)


def parse_train_config(data: Any, source: str = "<dict>", *, name: str = "train") -> TrainConfig:
    """Validate a training config mapping; unknown or bad fields raise ``ConfigError``."""
    r = Reader.of(data, source)
    r.check_keys(_TOP_KEYS)
    suite = r.str("suite")
    env_r = r.sub("env", {})
    env_r.check_keys(_ENV_KEYS)
    env: dict[str, Any] = {
        "max_hosts": env_r.int("max_hosts", 32, minimum=1, maximum=lim.MAX_POLICY_HOSTS),
        "objective": env_r.str("objective", "mean"),
        "bandwidth": env_r.choice("bandwidth", ("sampled", "robust"), "robust"),
        "samples": env_r.int("samples", POLICY_SAMPLES, minimum=1, maximum=lim.MAX_SAMPLES),
        "instances": env_r.int("instances", None, minimum=1,
                               maximum=lim.MAX_TRAIN_INSTANCES),
        "max_layers": env_r.int("max_layers", 128, minimum=1, maximum=lim.MAX_LAYERS),
        "max_micro": env_r.int("max_micro", 16, minimum=1, maximum=1024),
        "max_tp": env_r.int("max_tp", 16, minimum=1, maximum=1024),
    }
    from hetpar.costmodel.objective import Objective
    try:
        Objective.parse(env["objective"])
    except ConfigError as exc:
        raise env_r.error("objective", exc.problem) from None
    if env["max_tp"] & (env["max_tp"] - 1):
        raise env_r.error("max_tp", f"must be a power of two, got {env['max_tp']}")
    ppo_r = r.sub("ppo", {})
    ppo_r.check_keys(_PPO_KEYS)
    ppo: dict[str, Any] = {"learning_rate": _lr(ppo_r.raw("learning_rate", 3e-4), ppo_r,
                                                "learning_rate")}
    defaults = {"n_steps": 512, "batch_size": 256, "n_epochs": 4, "gamma": 1.0,
                "gae_lambda": 0.95, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5}
    for key in _PPO_INT:
        ppo[key] = ppo_r.int(key, defaults[key], minimum=1,
                             maximum=lim.MAX_EPOCHS if key == "n_epochs" else lim.MAX_BATCH)
    for key in _PPO_FLOAT:  # gamma and lambda are discounts: a value above 1 grows without end
        ppo[key] = ppo_r.number(key, defaults[key], nonnegative=True,
                                maximum=1.0 if key in ("gamma", "gae_lambda") else None)
    ppo["clip_range"] = ppo_r.number("clip_range", 0.2, positive=True)
    ppo["target_kl"] = ppo_r.number("target_kl", None, positive=True)
    pol_r = r.sub("policy_kwargs", {})
    pol_r.check_keys(_POLICY_KEYS)
    pol = {"dim": pol_r.int("dim", 64, minimum=4, maximum=lim.MAX_NETWORK_DIM),
           "heads": pol_r.int("heads", 4, minimum=1, maximum=lim.MAX_HEADS),
           "rounds": pol_r.int("rounds", 2, minimum=0, maximum=lim.MAX_ROUNDS),
           "edge_dim": pol_r.int("edge_dim", 32, minimum=1, maximum=lim.MAX_NETWORK_DIM),
           "value_dim": pol_r.int("value_dim", 64, minimum=1, maximum=lim.MAX_NETWORK_DIM)}
    if pol["dim"] % pol["heads"] or pol["dim"] % 2:
        raise pol_r.error("dim", f"must be even and divisible by heads={pol['heads']}, "
                                 f"got {pol['dim']}")
    ev_r = r.sub("eval", {})
    ev_r.check_keys(_EVAL_KEYS)
    ev = {"suite": ev_r.str("suite", suite), "start": ev_r.int("start", 1_000_000, minimum=0),
          "n": ev_r.int("n", 8, minimum=0, maximum=lim.MAX_INSTANCES),
          "freq": ev_r.int("freq", 20_000, minimum=0),
          "exact_time_limit": ev_r.number("exact_time_limit", 10.0, positive=True,
                                          maximum=lim.MAX_TIME_LIMIT_S),
          "samples": ev_r.int("samples", env["samples"], minimum=1, maximum=lim.MAX_SAMPLES)}
    ck_r = r.sub("checkpoint", {})
    ck_r.check_keys(_CKPT_KEYS)
    ck = {"freq": ck_r.int("freq", 50_000, minimum=0),
          "keep": ck_r.int("keep", 3, minimum=1, maximum=lim.MAX_EPOCHS)}
    imitation = _parse_imitation(r)
    finetune = _parse_finetune(r)
    dagger = _parse_dagger(r)
    if dagger is not None and imitation is None and finetune["init_policy"] is None:
        raise r.error("dagger", "DAgger improves a policy: give it one to start from "
                                "(finetune.init_policy or an imitation: section)")
    _check_rollout_size(r, env["max_hosts"], env, ppo, r.raw("n_envs", 1))
    cfg = TrainConfig(suite=suite, seed=r.int("seed", 0, minimum=0),
                      # With imitation or DAgger, 0 timesteps of PPO leaves their policy.
                      total_timesteps=r.int("total_timesteps",
                                            minimum=0 if imitation is not None or
                                            dagger is not None else 1,
                                            maximum=lim.MAX_TIMESTEPS),
                      n_envs=r.int("n_envs", 1, minimum=1, maximum=lim.MAX_TRAIN_ENVS),
                      torch_threads=r.int("torch_threads", 1, minimum=1,
                                          maximum=lim.MAX_THREADS),
                      update_threads=r.int("update_threads", 0, minimum=0,
                                           maximum=lim.MAX_THREADS),
                      overlap_envs=r.bool("overlap_envs", True), env=env, ppo=ppo,
                      policy_kwargs=pol, eval=ev, checkpoint=ck, imitation=imitation,
                      dagger=dagger, finetune=finetune, name=name, source=source,
                      description=str(r.raw("description", "")).strip())
    return cfg


def _check_rollout_size(r: Reader, max_hosts: int, env: dict[str, Any], ppo: dict[str, Any],
                        n_envs: Any) -> None:  # noqa: ANN401
    """Refuse a PPO rollout buffer beyond limits.MAX_ROLLOUT_BYTES up front: otherwise
    the run fails (or swaps) at its first update, after the environments are built."""
    from hetpar.envs.types import GLOBAL_FEATURES, HOST_FEATURES, PAIR_FEATURES

    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        return  # n_envs' own check names the problem
    obs = (max_hosts * (len(HOST_FEATURES) + 1) + max_hosts**2 * len(PAIR_FEATURES)
           + len(GLOBAL_FEATURES))
    mask = 6 + env["max_micro"] + env["max_tp"].bit_length() + max_hosts + env["max_layers"]
    size = ppo["n_steps"] * n_envs * 4 * (obs + mask)
    if size > lim.MAX_ROLLOUT_BYTES:
        raise r.sub("ppo", {}).error(
            "n_steps", f"a rollout of n_steps={ppo['n_steps']:,} x n_envs={n_envs} "
                       f"transitions of {max_hosts} hosts holds {size / 2**30:,.1f} GiB, over "
                       f"the {lim.MAX_ROLLOUT_BYTES / 2**30:g} GiB limit")


def _parse_finetune(r: Reader) -> dict[str, Any]:
    from hetpar.agents.shaping import REWARDS

    ft = r.sub("finetune", {})
    ft.check_keys(_FINETUNE_KEYS)
    init = ft.raw("init_policy", None)
    if init is not None and (not isinstance(init, str) or not init.strip()):
        raise ft.error("init_policy", f"expected a policy file or 'shipped', got {init!r}")
    return {"init_policy": init,
            "reward": ft.choice("reward", REWARDS, "mfu"),
            "repeat": ft.int("repeat", 1, minimum=1, maximum=lim.MAX_BATCH),
            "anchor_coef": ft.number("anchor_coef", 0.0, nonnegative=True),
            "value_warmup": ft.int("value_warmup", 0, minimum=0, maximum=lim.MAX_TIMESTEPS),
            "explore_openings": ft.number("explore_openings", 0.0, nonnegative=True,
                                          maximum=1.0)}


def _parse_imitation(r: Reader) -> dict[str, Any] | None:
    if r.raw("imitation", None) is None:
        return None
    from hetpar.agents.imitation import EXPERT_METHODS

    im = r.sub("imitation", {})
    im.check_keys(_IMITATION_KEYS)
    experts = im.raw("experts", ["exact"])
    if isinstance(experts, str):
        experts = [experts]
    if not isinstance(experts, list) or not experts or \
            any(e not in EXPERT_METHODS for e in experts):
        raise im.error("experts", f"expected a list of {', '.join(EXPERT_METHODS)}, "
                                  f"got {experts!r}")
    holdout = im.number("holdout", 0.1, nonnegative=True)
    if holdout >= 1:
        raise im.error("holdout", f"must be below 1, got {holdout}")
    cache = im.raw("cache", None)
    if cache is not None and not isinstance(cache, str):
        raise im.error("cache", f"expected a file path, got {cache!r}")
    policy = im.raw("policy", None)
    if policy is not None and not isinstance(policy, str):
        raise im.error("policy", f"expected a policy file, 'shipped' or 'clone', got {policy!r}")
    return {"policy": policy,
            "experts": [str(e) for e in experts],
            "exact_time_limit": im.number("exact_time_limit", 1.0, positive=True,
                                          maximum=lim.MAX_TIME_LIMIT_S),
            "instances": im.int("instances", None, minimum=1, maximum=lim.MAX_TRAIN_INSTANCES),
            "workers": im.int("workers", 1, minimum=1, maximum=lim.MAX_WORKERS),
            "epochs": im.int("epochs", 20, minimum=1, maximum=lim.MAX_EPOCHS),
            "batch_size": im.int("batch_size", 256, minimum=1, maximum=lim.MAX_BATCH),
            "learning_rate": im.number("learning_rate", 1e-3, positive=True),
            "vf_coef": im.number("vf_coef", 0.5, nonnegative=True),
            "holdout": holdout, "cache": cache}


def _parse_dagger(r: Reader) -> dict[str, Any] | None:
    if r.raw("dagger", None) is None:
        return None
    d = r.sub("dagger", {})
    d.check_keys(_DAGGER_KEYS)
    holdout = d.number("holdout", 0.1, nonnegative=True)
    if holdout >= 1:
        raise d.error("holdout", f"must be below 1, got {holdout}")
    return {"rounds": d.int("rounds", 1, minimum=1, maximum=lim.MAX_EPOCHS),
            "width": d.int("width", 8, minimum=2, maximum=lim.MAX_BEAM),
            "instances": d.int("instances", None, minimum=1, maximum=lim.MAX_TRAIN_INSTANCES),
            "workers": d.int("workers", 1, minimum=1, maximum=lim.MAX_WORKERS),
            "epochs": d.int("epochs", 20, minimum=1, maximum=lim.MAX_EPOCHS),
            "batch_size": d.int("batch_size", 256, minimum=1, maximum=lim.MAX_BATCH),
            "learning_rate": d.number("learning_rate", 3e-4, positive=True),
            "holdout": holdout}


def resolve_train_config_path(path_or_name: str | Path) -> Path:
    """A config file, or the name of a bundled one in ``configs/train/``."""
    p = Path(path_or_name)
    if p.is_file():
        return p
    if p.exists():
        raise ConfigError(str(p), "", "is not a file")
    folder = bundled_dir() / "train"
    candidate = folder / f"{p.name}.yaml"
    if len(p.parts) == 1 and p.suffix not in (".yaml", ".yml") and candidate.is_file():
        return candidate
    known = ", ".join(sorted(q.stem for q in folder.glob("*.yaml"))) or "none"
    raise ConfigError(str(p), "", f"no such training config (bundled: {known})")


def load_train_config(path_or_name: str | Path) -> TrainConfig:
    path = resolve_train_config_path(path_or_name)
    return parse_train_config(load_document(path), str(path), name=path.stem)


# ---- training --------------------------------------------------------------------------------

@dataclass
class TrainResult:
    run_dir: Path
    final_policy: Path | None
    best_policy: Path | None
    timesteps: int
    wall_s: float
    interrupted: bool
    last_eval: dict[str, Any] | None = None
    log: list[str] = field(default_factory=list)


def _env_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.env.items() if k != "instances"}


def _make_env_fn(suite: str, env: Mapping[str, Any], rank: int, seed: int,
                 subprocess: bool, wrap: Callable[[Any], Any] | None = None,
                 ) -> Callable[[], Any]:
    env = dict(env)

    def make() -> Any:
        if subprocess:
            # Ctrl-C is the main process's business (it saves a checkpoint and closes us).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            import torch
            torch.set_num_threads(1)
        from stable_baselines3.common.monitor import Monitor

        from hetpar.agents.callbacks import StatsWrapper
        from hetpar.envs.env import PlanBuilderEnv

        e: Any = PlanBuilderEnv(suite, **env)
        e.reset(seed=seed + rank)
        if wrap is not None:
            e = wrap(e)
        return Monitor(StatsWrapper(e), info_keywords=())

    return make


def make_vec_env(cfg: TrainConfig, *, wrap: Callable[[Any], Any] | None = None,
                 workers: int | None = None, reward_refs: dict[str, float] | None = None,
                 backend: str = "local", address: str | None = None) -> Any:
    """The training environments of ``cfg``, as ``hetpar train`` runs them: ``n_envs``
    ``PlanBuilderEnv``s in ``workers`` subprocesses (``GroupedVecEnv``; by default one
    per core, at most one per environment), or in this process (``DummyVecEnv``) for one.

    ``wrap`` (picklable) wraps each bare environment inside its worker, under the
    training wrappers; benchmarks use it to time the environment where it runs.
    ``reward_refs``: the ``log_metis`` reward's references (``shaping.reference_table``),
    else each worker computes them as it meets the instances. ``backend="ray"``: the
    groups of environments are Ray actors (``RayVecEnv``) on the cluster at ``address``
    (default a local Ray), the learner stays here."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from hetpar.agents.vecenv import GroupedVecEnv
    from hetpar.envs.env import CACHE_SIZE, PlanBuilderEnv

    # Check the suite (and a few instances) in this process first, for clear errors.
    env_kwargs = _env_kwargs(cfg)
    try:
        PlanBuilderEnv(cfg.suite, max_hosts=cfg.env["max_hosts"], instances=cfg.env["instances"],
                       **{k: v for k, v in env_kwargs.items() if k != "max_hosts"})
    except ConfigError as exc:
        raise ConfigError(cfg.source, "suite", f"{cfg.suite}: {exc}") from None
    from hetpar.agents.shaping import shaping

    wrap = shaping(cfg.finetune["reward"], cfg.finetune["repeat"], wrap, reward_refs,
                   cfg.finetune["explore_openings"])
    # Every instance of the pool stays cached (the environments of a worker share them).
    pool = {**env_kwargs, "instances": cfg.env["instances"],
            "cache_size": max(CACHE_SIZE, cfg.env["instances"] or 0)}
    fns = [_make_env_fn(cfg.suite, pool, rank,
                        cfg.seed, cfg.n_envs > 1, wrap) for rank in range(cfg.n_envs)]
    if backend not in ("local", "ray"):
        raise ConfigError("", "backend", f"unknown backend {backend!r} (local, ray)")
    if backend == "ray":
        from hetpar.agents.vecenv import RayVecEnv

        return RayVecEnv(fns, workers, address)
    return GroupedVecEnv(fns, workers) if cfg.n_envs > 1 else DummyVecEnv(fns)


def make_model(cfg: TrainConfig, vec_env: Any, *, tensorboard_log: str | None = None,
               start: Any = None) -> Any:
    """A fresh ``AnchoredMaskablePPO`` with ``HostAttentionPolicy`` on ``vec_env``, as
    ``cfg`` asks (what ``hetpar train`` trains when it does not resume; ``_algorithm``),
    with the weights of ``finetune.init_policy`` where the config names one (``start``:
    that policy already loaded, ``load_start``)."""
    from hetpar.agents.policy import HostAttentionPolicy

    ppo = dict(cfg.ppo)
    ppo["learning_rate"] = _lr_schedule(ppo["learning_rate"])
    policy_kwargs = dict(cfg.policy_kwargs, max_micro=cfg.env["max_micro"],
                         max_tp_log2=cfg.env["max_tp"].bit_length() - 1)
    cls, extra = _algorithm(cfg)
    model = cls(HostAttentionPolicy, vec_env, policy_kwargs=policy_kwargs,
                tensorboard_log=tensorboard_log, seed=cfg.seed, device="cpu", verbose=0,
                **ppo, **extra)
    if start is None:
        start = load_start(cfg)
    if start is not None:
        init_weights(model, start, cfg.source)
    return model


def _algorithm(cfg: TrainConfig) -> tuple[Any, dict[str, Any]]:
    """``AnchoredMaskablePPO`` with the config's anchor, warm-up and update threads (a run
    that starts from a policy, by imitation or ``init_policy``, is anchored to it: the KL
    is logged, and optimised with ``anchor_coef``; without either it is sb3-contrib's
    update)."""
    from hetpar.agents.anchored import AnchoredMaskablePPO

    ft = cfg.finetune
    cores = os.cpu_count() or 1
    threads = min(cfg.update_threads or cores, cores)
    return AnchoredMaskablePPO, {"anchor_coef": ft["anchor_coef"],
                                 "value_warmup": ft["value_warmup"],
                                 "update_threads": threads,
                                 "overlap_envs": cfg.overlap_envs}


def load_start(cfg: TrainConfig, trust_pickle: bool = False) -> Any:
    """The policy ``finetune.init_policy`` names, loaded (``shipped``, ``clone``: the
    bundled ones), or None; a missing or corrupt file is a ConfigError (one line).
    ``trust_pickle``: a format-1 file may be unpickled (``load_policy``)."""
    from hetpar.agents.io import load_policy

    init = cfg.finetune["init_policy"]
    return None if init is None else load_policy(init, trust_pickle=trust_pickle)


def init_weights(model: Any, bundle: Any, source: str = "") -> None:
    """Copy the network weights of a loaded policy into ``model``'s policy; its
    architecture must be the config's (ConfigError otherwise)."""
    try:
        model.policy.load_state_dict(bundle.model.policy.state_dict())
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise ConfigError(source, "finetune.init_policy",
                          f"{bundle.path}: its network does not match the config's "
                          f"policy_kwargs ({first[1].strip() if len(first) > 1 else first[0]})"
                          ) from None


def _lr_schedule(value: float | str) -> Any:
    if isinstance(value, str):
        start = float(value.split("_", 1)[1])
        return _Linear(start)
    return float(value)


@dataclass(frozen=True)
class _Linear:
    start: float

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.start


def policy_meta(cfg: TrainConfig, run_name: str, timesteps: int,
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    env_kwargs = {k: cfg.env[k] for k in ("objective", "bandwidth", "samples", "max_layers",
                                          "max_micro", "max_tp")}
    meta = {"max_hosts": cfg.env["max_hosts"], "env_kwargs": env_kwargs,
            "training": cfg.as_dict(), "run_name": run_name, "timesteps": int(timesteps),
            "saved_at": datetime.now().isoformat(timespec="seconds")}
    if extra:
        meta.update(extra)
    return meta


def train(cfg: TrainConfig, *, run_name: str | None = None, runs_dir: str | Path = "runs",
          resume: bool = False, overwrite: bool = False, trust_pickle: bool = False,
          progress: bool = True, log: Callable[[str], None] | None = None,
          backend: str = "local", address: str | None = None) -> TrainResult:
    """Train (or, with ``resume``, continue) a run; returns where everything went.

    The run folder is locked for the run (``runfolder.RunLock``): a second run on it is
    refused. A folder holding an earlier run's results is refused unless ``resume``
    (continue it) or ``overwrite`` (delete them first). A ``KeyboardInterrupt`` or SIGTERM
    during training saves ``interrupted_policy.zip`` in the run folder and returns with
    ``interrupted=True``; ``resume`` continues from the newest checkpoint that loads,
    skipping damaged ones with a line each. ``trust_pickle``: ``init_policy`` may be a
    format-1 (pickled) file. ``backend="ray"``: the environments run as Ray actors
    (``make_vec_env``), on the cluster at ``address`` or a local Ray."""
    from hetpar.agents.runfolder import RunLock

    runs = Path(runs_dir)
    name = run_name or f"{cfg.name}-{datetime.now():%Y%m%d-%H%M%S}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError("--run-name", "", f"use letters, digits, '.', '_' and '-', got {name!r}")
    if resume and overwrite:
        raise ConfigError("--overwrite", "", "give --resume or --overwrite, not both")
    run_dir = runs / name
    if resume and not run_dir.is_dir():
        raise ConfigError(str(run_dir), "", "no such run folder to resume")
    created = not run_dir.exists()
    try:
        lock = RunLock(run_dir).acquire()
    except OSError as exc:
        raise ConfigError(str(run_dir), "", f"cannot create the run folder "
                                            f"({exc.strerror or exc})") from None
    try:
        return _train_locked(cfg, name, runs, run_dir, resume=resume, overwrite=overwrite,
                             trust_pickle=trust_pickle, progress=progress, log=log,
                             backend=backend, address=address)
    finally:
        lock.release()
        if created and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()


def _train_locked(cfg: TrainConfig, name: str, runs: Path, run_dir: Path, *, resume: bool,
                  overwrite: bool, trust_pickle: bool, progress: bool,
                  log: Callable[[str], None] | None, backend: str = "local",
                  address: str | None = None) -> TrainResult:
    import torch
    from stable_baselines3.common.callbacks import CallbackList

    from hetpar.agents.callbacks import (CheckpointCallback, EvalGapCallback,
                                         RichProgressCallback, StatsCallback,
                                         reference_problem, reference_values)
    from hetpar.agents.io import save_policy
    from hetpar.envs.env import PlanBuilderEnv
    from hetpar.problem import DEFAULT_SEED
    from hetpar.problem.generator import load_suite

    from hetpar.agents.runfolder import (clear_run_folder, signals_held, stale_temporaries,
                                         stop_on_sigterm)

    messages: list[str] = []

    def say(text: str) -> None:
        messages.append(text)
        if log:
            log(text)

    ckpt_dir = run_dir / "checkpoints"
    for tmp in stale_temporaries(run_dir):
        tmp.unlink(missing_ok=True)
        say(f"removed {tmp}, a checkpoint whose write was cut short")
    resume_from: list[Path] = []
    if resume:
        resume_from = _checkpoints(run_dir)
        if not resume_from:
            raise ConfigError(str(run_dir), "", "no checkpoint to resume from")
    elif _has_results(run_dir):
        if not overwrite:
            raise ConfigError(str(run_dir), "", "the run folder holds an earlier run; pick "
                                                f"another --run-name, continue it with --resume "
                                                f"{name}, or replace it with --overwrite")
        clear_run_folder(run_dir)
        say(f"--overwrite: removed the earlier run's files from {run_dir}")
    # The start policy before anything is written or computed: a bad file fails at once.
    start_policy = load_start(cfg, trust_pickle)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.as_dict(), sort_keys=False))

    cores = os.cpu_count() or 1
    if cfg.torch_threads > cores:  # more threads than cores never helps, and may not start
        say(f"torch_threads {cfg.torch_threads} is more than this machine's {cores} cores: "
            f"using {cores}")
    torch.set_num_threads(min(cfg.torch_threads, cores))
    env_kwargs = _env_kwargs(cfg)
    reward_refs = None
    if cfg.finetune["reward"] == "log_metis":
        from hetpar.agents.shaping import reference_table

        samples = cfg.env["samples"] if cfg.env["bandwidth"] == "robust" else 0
        count = _pool_size(cfg)
        cache = runs / "reward-cache" / f"{cfg.suite}-{cfg.env['objective']}-{samples}.json"
        reward_refs = reference_table(cfg.suite, count, objective=cfg.env["objective"],
                                      samples=samples, cache=cache,
                                      workers=max(1, min(cfg.n_envs, os.cpu_count() or 1)),
                                      log=say)
    vec_env = make_vec_env(cfg, reward_refs=reward_refs, backend=backend, address=address)

    # Fixed evaluation set, with exact and metis values computed once per run folder.
    ev = cfg.eval
    refs: list[Any] = []
    eval_problems: list[Any] = []
    eval_env = None
    if ev["n"] > 0:
        eval_suite = load_suite(ev["suite"])
        size = eval_suite.size
        start = ev["start"] if size is None else min(ev["start"], max(size - ev["n"], 0))
        instances = eval_suite.instances(ev["n"] if size is None else min(ev["n"], size), start)
        say(f"evaluation set: {len(instances)} instances of {ev['suite']} from index {start}; "
            f"exact (time limit {ev['exact_time_limit']:g}s) and metis, cached")
        # Not cfg.seed: the references' bandwidth states are every run's (module docstring).
        refs = reference_values(instances, objective=cfg.env["objective"],
                                samples=ev["samples"], time_limit=ev["exact_time_limit"],
                                seed=DEFAULT_SEED, cache=run_dir / "eval_reference.json",
                                log=say)
        # The policy's plans are scored on the references' problems, not by the env.
        eval_problems = [reference_problem(inst, objective=cfg.env["objective"],
                                           samples=ev["samples"], seed=DEFAULT_SEED)
                         for inst in instances]
        eval_env = PlanBuilderEnv(instances, **{**env_kwargs, "bandwidth": "robust",
                                                "samples": ev["samples"]})

    def save(model: Any, path: Path, extra: Mapping[str, Any] | None = None) -> Path:
        _require_finite(model, cfg, ckpt_dir)  # a NaN network is never saved as a policy
        return save_policy(model, path, policy_meta(cfg, name, model.num_timesteps, extra))

    model = make_model(cfg, vec_env, tensorboard_log=str(run_dir / "tb"), start=start_policy)
    if resume_from:
        _resume_state(model, resume_from, say)
        say(f"resuming {name} at {model.num_timesteps} timesteps")
    start_steps = int(model.num_timesteps)
    best_path = run_dir / "best_policy.zip"
    history = run_dir / "eval_history.jsonl"
    best_so_far = _best_from_history(history) if resume else math.inf
    imitation_stats: dict[str, Any] | None = None
    if cfg.imitation is not None and not resume_from:
        try:
            with _divergence_named(model, cfg, ckpt_dir, "imitation"):
                imitation_stats = _pretrain(model, cfg, run_dir, runs, say, backend, address)
        except KeyboardInterrupt:
            vec_env.close()
            say("interrupted during imitation pre-training; the expert plans computed so far "
                "are cached and reused by the next run")
            return TrainResult(run_dir, None, None, 0, 0.0, True, None, messages)
        path = save(model, run_dir / IMITATION_FILE, {"imitation": imitation_stats})
        say(f"imitation policy saved to {path}")
    init = cfg.finetune["init_policy"]
    if not resume_from and init is not None and cfg.imitation is None:
        say(f"{'DAgger' if cfg.dagger is not None else 'PPO'} starts from the weights of "
            f"{'the shipped policy' if init == 'shipped' else init}")
    dagger_stats: dict[str, Any] | None = None
    if cfg.dagger is not None and not resume_from:
        try:
            with _divergence_named(model, cfg, ckpt_dir, "dagger"):
                dagger_stats = _dagger(model, cfg, run_dir, save, say)
        except KeyboardInterrupt:
            vec_env.close()
            say(f"interrupted during DAgger; {DAGGER_FILE} holds the policy of the last "
                "finished round (or the start)")
            return TrainResult(run_dir, None, None, 0, 0.0, True, None, messages)
        path = save(model, run_dir / DAGGER_FILE, {"dagger": dagger_stats})
        say(f"DAgger policy saved to {path}")
    start_phase = ("dagger" if cfg.dagger is not None else
                   "imitation" if cfg.imitation is not None else
                   "init" if init is not None else None)
    if not resume_from and start_phase is not None:
        if eval_env is not None:
            from hetpar.agents.callbacks import evaluate_policy_gaps

            res = evaluate_policy_gaps(model, eval_env, refs, eval_problems)
            res["timesteps"] = 0
            res["phase"] = start_phase
            with history.open("a") as fh:
                fh.write(json.dumps({k: v for k, v in res.items() if k != "values"},
                                    default=str) + "\n")
            say(f"eval after {start_phase}: gap to exact mean {res['gap_exact_mean']:.2%} "
                f"p90 {res['gap_exact_p90']:.2%}, to metis mean {res['gap_metis_mean']:.2%}")
            if math.isfinite(res["gap_exact_mean"]):
                best_so_far = res["gap_exact_mean"]
                save(model, best_path, {"eval": _summary(res),
                                        **({"imitation": imitation_stats}
                                           if imitation_stats is not None else {}),
                                        **({"dagger": dagger_stats}
                                           if dagger_stats is not None else {})})
    if start_phase is not None or cfg.finetune["anchor_coef"] > 0:
        # The anchor is the policy PPO started from: the clone, the initial weights (or,
        # with anchor_coef alone, the fresh network); a resumed run loads it again (the
        # clone from the run folder), else anchors where it resumes.
        clone = run_dir / IMITATION_FILE
        if not resume_from:
            model.set_anchor()
        elif start_policy is not None:
            model.set_anchor(start_policy.model.policy)
        elif clone.is_file():
            from hetpar.agents.io import load_policy

            model.set_anchor(load_policy(clone, trust_pickle=trust_pickle).model.policy)
        else:
            model.set_anchor()
    callbacks: list[Any] = [StatsCallback()]
    eval_cb = None
    if eval_env is not None:
        eval_cb = EvalGapCallback(
            eval_env, refs, ev["freq"],
            save_best=lambda m, res: save(m, best_path, {"eval": _summary(res)}),
            history=history, log=say, last_eval=start_steps, best=best_so_far,
            problems=eval_problems)
        callbacks.append(eval_cb)
    callbacks.append(CheckpointCallback(cfg.checkpoint["freq"], save, ckpt_dir,
                                        cfg.checkpoint["keep"]))
    bar = RichProgressCallback(cfg.total_timesteps, start_steps, enabled=progress)
    bar.eval_cb = eval_cb
    callbacks.append(bar)
    remaining = cfg.total_timesteps - start_steps
    t0 = time.perf_counter()
    interrupted = False
    final: Path | None = None
    try:
        with stop_on_sigterm(), _divergence_named(model, cfg, ckpt_dir, "ppo"):
            if remaining > 0:
                model.learn(remaining, callback=CallbackList(callbacks), tb_log_name="ppo",
                            reset_num_timesteps=not resume, progress_bar=False)
            final = save(model, run_dir / "final_policy.zip",
                         {"eval": _summary(eval_cb.last)} if eval_cb and eval_cb.last else None)
            (run_dir / RESUME_FILE).unlink(missing_ok=True)
    except KeyboardInterrupt:
        interrupted = True
        bar.stop()
        # A second Ctrl-C or SIGTERM waits for the checkpoint instead of cutting it.
        with signals_held():
            try:
                model.logger.dump(model.num_timesteps)
            except Exception:  # noqa: BLE001 - never lose the checkpoint over a log line
                pass
            path = save(model, run_dir / RESUME_FILE)
        where = "" if runs == Path("runs") else f" --runs-dir {runs}"
        say(f"interrupted at {model.num_timesteps} timesteps; saved {path}; continue with "
            f"'hetpar train --resume {name}{where}'")
    finally:
        bar.stop()
        try:
            vec_env.close()
        except (EOFError, BrokenPipeError, ConnectionError):
            pass
    wall = time.perf_counter() - t0
    if not interrupted:
        say(f"trained {model.num_timesteps - start_steps} timesteps in {wall:.0f}s; "
            f"final policy {final}")
    return TrainResult(run_dir, final, best_path if best_path.exists() else None,
                       int(model.num_timesteps), wall, interrupted,
                       eval_cb.last if eval_cb else None, messages)


def _non_finite(model: Any) -> bool:
    import torch

    return any(not bool(torch.isfinite(p).all()) for p in model.policy.parameters())


def _diverged_error(model: Any, cfg: TrainConfig, ckpt_dir: Path,
                    phase: str) -> TrainingDiverged:
    lr = cfg.ppo["learning_rate"] if phase == "ppo" else (
        (cfg.dagger if phase == "dagger" else cfg.imitation) or {}).get("learning_rate")
    kept = (f"; checkpoints saved before it are kept in {ckpt_dir}"
            if ckpt_dir.is_dir() and any(ckpt_dir.iterdir()) else "")
    return TrainingDiverged(
        f"{cfg.source}: training diverged at timestep {int(model.num_timesteps):,}: the "
        f"network's weights or outputs became NaN or infinite during {phase} (lower "
        f"{phase}.learning_rate, now {lr}, or the {phase} coefficients){kept}")


@contextlib.contextmanager
def _divergence_named(model: Any, cfg: TrainConfig, ckpt_dir: Path,
                      phase: str) -> Iterator[None]:
    """A run whose network turned NaN ends with one line saying so, not with torch's
    'invalid values' traceback from deep inside a distribution."""
    try:
        yield
    except (ValueError, RuntimeError) as exc:
        if _non_finite(model) or re.search(r"\bnan\b|\binf\b|invalid values", str(exc),
                                           re.IGNORECASE):
            raise _diverged_error(model, cfg, ckpt_dir, phase) from None
        raise


def _require_finite(model: Any, cfg: TrainConfig, ckpt_dir: Path) -> None:
    if _non_finite(model):
        raise _diverged_error(model, cfg, ckpt_dir, "ppo")


def _pretrain(model: Any, cfg: TrainConfig, run_dir: Path, runs: Path,
              say: Callable[[str], None], backend: str = "local",
              address: str | None = None) -> dict[str, Any]:
    """Behaviour cloning of expert plans on the training pool (``imitation:`` section)."""
    from hetpar.agents.imitation import (POLICY_EXPERTS, ImitationConfig, behaviour_clone,
                                         demonstrations, expert_plans, expert_summary,
                                         policy_digest)
    from hetpar.envs.env import PlanBuilderEnv
    from hetpar.problem import DEFAULT_SEED

    assert cfg.imitation is not None
    # The policy experts plan with imitation.policy, else the policy the run starts from.
    expert_policy = cfg.imitation.get("policy") or cfg.finetune["init_policy"]
    im = ImitationConfig(**{**cfg.imitation, "experts": tuple(cfg.imitation["experts"]),
                            "policy": expert_policy})
    env = PlanBuilderEnv(cfg.suite, **{**_env_kwargs(cfg), "instances": cfg.env["instances"]})
    pool = env.source.count
    n = min(im.instances or pool, pool)
    objective, samples = cfg.env["objective"], cfg.env["samples"]
    suite_tag = re.sub(r"[^A-Za-z0-9._-]", "_", Path(cfg.suite).stem)
    # Shared between runs by default: expert plans depend only on the suite and settings
    # (the cache's header records them and a mismatch is refused).
    # A policy expert's plans are its weights': one cache per policy file's digest.
    tag = (f"-{policy_digest(im.policy)[:12]}" if set(im.experts) & set(POLICY_EXPERTS)
           else "")
    cache = Path(im.cache) if im.cache else (
        runs / "expert-cache" / f"{suite_tag}-{objective}-{samples}-"
                                f"{'+'.join(sorted(im.experts))}-{im.exact_time_limit:g}s"
                                f"{tag}.jsonl")
    t0 = time.perf_counter()
    # Scored under DEFAULT_SEED's bandwidth states, not cfg.seed's (module docstring).
    plans = expert_plans(cfg.suite, range(n), objective=objective, samples=samples, cfg=im,
                         cache=cache, log=say, seed=DEFAULT_SEED, backend=backend,
                         address=address)
    say(expert_summary(plans, cache) + f" in {time.perf_counter() - t0:.0f}s; cache {cache}")
    demos = demonstrations(env, plans)
    if demos.skipped:
        say(f"imitation: {len(demos.skipped)} instances without a demonstration "
            f"(e.g. {next(iter(demos.skipped.values()))})")
    say(f"imitation: {len(demos)} expert decisions from {len(demos.expert_reward)} plans; "
        f"{im.epochs} epochs")
    stats = behaviour_clone(model, demos, im, seed=cfg.seed, tb_dir=run_dir / "tb" / "imitation",
                            log=say)
    stats["expert_plans"] = float(len(demos.expert_reward))
    stats["wall_s"] = time.perf_counter() - t0
    return stats


def _pool_size(cfg: TrainConfig) -> int:
    """How many instances the environments draw from: ``env.instances``, or the suite's
    default pool."""
    from hetpar.envs.sources import as_source
    from hetpar.problem.generator import load_suite

    return as_source(load_suite(cfg.suite), cfg.env["instances"]).count


def _dagger(model: Any, cfg: TrainConfig, run_dir: Path,
            save: Callable[[Any, Path, Mapping[str, Any] | None], Path],
            say: Callable[[str], None]) -> dict[str, Any]:
    """DAgger rounds on the training pool (``dagger:`` section, ``agents/dagger.py``): each
    round labels the states the current policy visits with a lookahead beam of that
    policy, and clones the policy, from its own weights, on every round's labels."""
    from hetpar.agents.dagger import lookahead_demonstrations, merge_demonstrations
    from hetpar.agents.imitation import ImitationConfig, behaviour_clone

    assert cfg.dagger is not None
    d = cfg.dagger
    pool = _pool_size(cfg)
    n = min(d["instances"] or pool, pool)
    env_kwargs = {"suite": cfg.suite, **_env_kwargs(cfg), "instances": cfg.env["instances"]}
    # The value head is left as it is: the lookahead's returns are those of plans the policy
    # does not make yet, and PPO after DAgger warms its value up (finetune.value_warmup).
    im = ImitationConfig(epochs=d["epochs"], batch_size=d["batch_size"],
                         learning_rate=d["learning_rate"], vf_coef=0.0, holdout=d["holdout"])
    parts = []
    stats: dict[str, Any] = {}
    t0 = time.perf_counter()
    for r in range(d["rounds"]):
        # The workers label with the policy as it stands: written where the result goes.
        labeller = save(model, run_dir / DAGGER_FILE, {"dagger": {"round": r}})
        say(f"DAgger round {r + 1}/{d['rounds']}: labelling {n} instances with a lookahead "
            f"beam of {d['width']}")
        demos, st = lookahead_demonstrations(str(labeller), env_kwargs, range(n),
                                             width=d["width"], workers=d["workers"], log=say)
        parts.append(demos)
        res = behaviour_clone(model, merge_demonstrations(parts), im, seed=cfg.seed + r,
                              tb_dir=run_dir / "tb" / f"dagger{r + 1}", log=say)
        stats = {**res, "rounds": r + 1, "decisions_labelled": st.decisions,
                 "labels_changed": st.changed, "mean_gain": st.mean_gain}
    stats["wall_s"] = time.perf_counter() - t0
    return stats


def _summary(res: Mapping[str, Any] | None) -> dict[str, Any]:
    if not res:
        return {}
    return {k: v for k, v in res.items() if k != "values"}


def _best_from_history(history: Path) -> float:
    best = math.inf
    if history.is_file():
        for line in history.read_text().splitlines():
            try:
                value = float(json.loads(line).get("gap_exact_mean", math.inf))
            except (ValueError, TypeError):
                continue
            if math.isfinite(value):
                best = min(best, value)
    return best


def _has_results(run_dir: Path) -> bool:
    return run_dir.is_dir() and ((run_dir / "tb").exists() or any(run_dir.rglob("*.zip")))


def _checkpoints(run_dir: Path) -> list[Path]:
    """The interrupted, periodic and final checkpoints, newest first (by the timesteps
    their metadata records, then by file time); files whose metadata cannot be read come
    first, so that resuming names the damage (one line each) before it goes on."""
    from hetpar.agents.io import read_meta

    found: list[tuple[int, float, Path]] = []
    candidates = [run_dir / RESUME_FILE, *(run_dir / "checkpoints").glob("policy_*_steps.zip"),
                  run_dir / "final_policy.zip"]
    for p in candidates:
        if p.is_file():
            try:
                steps = int(read_meta(p).get("timesteps", 0))
            except (ConfigError, TypeError, ValueError):
                steps = 2**62
            found.append((steps, p.stat().st_mtime, p))
    return [p for *_, p in sorted(found, reverse=True)]


def _resume_state(model: Any, candidates: list[Path], say: Callable[[str], None]) -> Path:
    """Restore ``model`` from the first of ``candidates`` that loads; each damaged one is
    skipped with a line."""
    from hetpar.agents.io import restore_training_state

    reasons = []
    for p in candidates:
        try:
            restore_training_state(model, p)
        except ConfigError as exc:
            say(f"skipping checkpoint {p.name}: {exc}")
            reasons.append(str(exc))
            continue
        say(f"continuing from {p.name}")
        return p
    raise ConfigError(str(candidates[0].parent), "", f"no checkpoint loads ({reasons[0]})")


def load_run_config(run_dir: Path) -> TrainConfig:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(str(path), "", "no such file (is this a hetpar run folder?)")
    return parse_train_config(load_document(path), str(path), name=run_dir.name)


def copy_config(cfg: TrainConfig) -> TrainConfig:
    return copy.deepcopy(cfg)
