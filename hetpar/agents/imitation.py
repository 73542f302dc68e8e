"""Imitation pre-training: behaviour cloning of expert plans before PPO.

PPO from a random policy on this environment learns slowly: a plan's score arrives once,
at the end of an episode of 10-40 decisions, and most random plans are poor. So a run may
first clone an expert (AlphaStar and most neural combinatorial-optimisation work start
the same way), then let PPO improve on it:

1. **Expert plans** (``expert_plans``): for each training instance, the best plan of the
   configured methods (``exact`` with a short time limit, which is seeded with ``metis``
   and so never worse than it; or ``metis`` alone; or ``policy`` / ``policy-beam``, the
   structure search from a policy's own plan, which makes the cloning a round of expert
   iteration: the policy learns the plans a search finds near its own), computed in
   worker processes and cached one JSON line per instance, so an interrupted or repeated
   run reuses them.
2. **Demonstrations** (``demonstrations``): each expert plan replayed in the environment
   with ``PlanBuilderEnv.actions_for``; every decision with more than one allowed action
   gives (observation, mask, expert action), and the episode's return is the value
   target.
3. **Cloning** (``behaviour_clone``): the masked cross-entropy of the expert action plus
   the value head's squared error, on minibatches, with a held-out share of instances to
   report accuracy on decisions never trained on. Curves go to TensorBoard
   (``tb/imitation``).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetpar.envs.search import SearchEnv
from hetpar.errors import ConfigError, HetparError
from hetpar.problem import DEFAULT_SEED

__all__ = ["ImitationConfig", "Demonstrations", "expert_plans", "demonstrations",
           "behaviour_clone", "EXPERT_METHODS"]

EXPERT_METHODS = ("exact", "metis", "megatron", "policy", "policy-beam")
# Experts that plan with a policy (``ImitationConfig.policy``): hetpar plan's default
# pipeline, from the single rollout or from the beam search.
POLICY_EXPERTS = ("policy", "policy-beam")


@dataclass(frozen=True)
class ImitationConfig:
    """The ``imitation:`` section of a training config."""

    experts: tuple[str, ...] = ("exact",)
    exact_time_limit: float = 1.0
    instances: int | None = None  # training instances with an expert plan (default: the pool)
    workers: int = 1  # processes computing expert plans
    epochs: int = 20
    batch_size: int = 256
    learning_rate: float = 1e-3
    vf_coef: float = 0.5
    holdout: float = 0.1  # share of instances kept out of cloning, for validation
    cache: str | None = None  # expert-plan cache file shared between runs
    policy: str | None = None  # the policy file the policy experts plan with (None: shipped)

    def as_dict(self) -> dict[str, Any]:
        return {"experts": list(self.experts), "exact_time_limit": self.exact_time_limit,
                "instances": self.instances, "workers": self.workers, "epochs": self.epochs,
                "batch_size": self.batch_size, "learning_rate": self.learning_rate,
                "vf_coef": self.vf_coef, "holdout": self.holdout, "cache": self.cache,
                "policy": self.policy}


# ---- expert plans -------------------------------------------------------------------------

def _cache_key(suite: str, objective: str, samples: int, cfg: ImitationConfig,
               seed: int) -> str:
    key: dict[str, Any] = {"suite": suite, "objective": objective, "samples": samples,
                           "seed": seed, "experts": sorted(cfg.experts),
                           "exact_time_limit": cfg.exact_time_limit}
    if set(cfg.experts) & set(POLICY_EXPERTS):
        # Another policy makes other plans: the cache is for these weights only.
        key["policy_sha256"] = policy_digest(cfg.policy)
    return json.dumps(key, sort_keys=True)


def policy_digest(path: str | None) -> str:
    """SHA-256 of the policy file the policy experts load (None: the shipped one)."""
    import hashlib

    from hetpar.agents.io import policy_path

    try:
        return hashlib.sha256(policy_path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise ConfigError(str(path), "imitation.policy",
                          f"cannot read the policy file: {exc.strerror or exc}") from None


@functools.lru_cache(maxsize=2)
def _expert_policy(path: str | None) -> Any:
    """The policy experts' policy, loaded once per worker process."""
    from hetpar.agents.io import load_policy

    return load_policy(path)


def _header_key(header: Any) -> Any:
    """A cache header as ``_cache_key`` writes it now: caches written before the seed was
    recorded were all computed with seed 0 (``DEFAULT_SEED``), and stay valid for it."""
    try:
        doc = json.loads(header)
    except (TypeError, ValueError):
        return header
    if not isinstance(doc, dict):
        return header
    return json.dumps({"seed": 0, **doc}, sort_keys=True)


def _expert_one(suite: str, index: int, objective: str, samples: int,
                experts: Sequence[str], time_limit: float, seed: int,
                policy: str | None = None) -> dict[str, Any]:
    """Best plan of ``experts`` on instance ``index`` (runs in a worker process), scored
    under ``samples`` bandwidth states drawn with ``seed``; the policy experts plan with
    the policy file ``policy`` (None: the shipped one)."""
    from hetpar.agents import planning
    from hetpar.problem import Problem
    from hetpar.problem.generator import load_suite
    from hetpar.solvers import solve

    inst = load_suite(suite).instance(index)
    # One problem for every expert: their values compare, and share its cost model.
    problem = Problem.from_instance(inst, objective=objective, samples=samples, seed=seed)
    best: dict[str, Any] = {"index": index, "plan": None, "method": None, "value": None}
    t0 = time.process_time()
    for method in experts:
        try:
            if method in POLICY_EXPERTS:
                sol = planning.plan(problem, method, policy=_expert_policy(policy))
            else:
                sol = solve(problem, method=method,
                            time_limit=time_limit if method == "exact" else None)
        except HetparError as exc:  # e.g. a generated instance that fits nowhere
            best.setdefault("errors", []).append(f"{method}: {exc}")
            continue
        if sol.found and (best["value"] is None or sol.value < best["value"]):
            best.update(plan=sol.plan.to_dict(), method=method, value=float(sol.value))
    best["cpu_s"] = time.process_time() - t0
    return best


def _worker_init() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the main process


def expert_plans(suite: str, indices: Iterable[int], *, objective: str, samples: int,
                 cfg: ImitationConfig, cache: Path,
                 log: Callable[[str], None] | None = None,
                 seed: int = DEFAULT_SEED, backend: str = "local",
                 address: str | None = None) -> dict[int, Any]:
    """Index -> expert ``Plan`` (or None where no method found one), cached in ``cache``.

    Each instance's experts plan its ``Problem`` of ``objective`` over ``samples``
    bandwidth states drawn with ``seed`` (the seed of the draws only; ``DEFAULT_SEED``,
    as for the training's evaluation references, unless told).

    The cache's first line records what the plans were computed for (suite, objective,
    samples, seed, experts, time limit); a cache made for something else is refused
    rather than silently mixed in.

    ``backend="ray"``: each instance's experts run as a Ray task, ``cfg.workers`` at a time
    (the cluster at ``address``, or a local Ray); each plan is appended to the cache as
    its task ends, as the local worker processes' are."""
    from hetpar.plan import Plan

    key = _cache_key(suite, objective, samples, cfg, seed)
    done: dict[int, dict[str, Any]] = {}
    lines = cache.read_text().splitlines() if cache.is_file() else []
    if lines:
        try:
            header = json.loads(lines[0]).get("expert_cache")
        except (json.JSONDecodeError, AttributeError):
            header = None
        if header is None:
            raise ConfigError(str(cache), "", "not a hetpar expert-plan cache")
        if _header_key(header) != key:
            raise ConfigError(str(cache), "", f"expert plans for another setting "
                                              f"({header}); expected {key}")
        for n, line in enumerate(lines[1:], start=2):
            try:
                row = json.loads(line)
                done[int(row["index"])] = row
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                # A line cut short by an interrupted run: recomputed below.
                if log:
                    log(f"{cache}:{n}: unreadable line skipped")
    else:  # a new (or empty) cache starts with what its plans are for
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"expert_cache": key}) + "\n")
    wanted = list(dict.fromkeys(int(i) for i in indices))
    todo = [i for i in wanted if i not in done]
    if todo:
        if log:
            log(f"expert plans: {len(wanted) - len(todo)} cached, computing {len(todo)} "
                f"({'+'.join(cfg.experts)}, exact time limit {cfg.exact_time_limit:g}s, "
                f"{cfg.workers} worker{'s' if cfg.workers > 1 else ''})")
        t0 = time.perf_counter()
        with cache.open("a") as out:
            def keep(row: dict[str, Any]) -> None:
                done[row["index"]] = row
                out.write(json.dumps(row) + "\n")
                out.flush()
                if log and len(done) % 50 == 0:
                    log(f"expert plans: {len(done)}/{len(wanted)} "
                        f"({time.perf_counter() - t0:.0f}s)")

            args = (objective, samples, tuple(cfg.experts), cfg.exact_time_limit, seed,
                    cfg.policy)
            if backend == "ray":
                from hetpar.solvers.ray_executor import ray_map

                ray_map(_expert_one, [(suite, i, *args) for i in todo], cfg.workers,
                        lambda _, row: keep(row), address=address)
            elif cfg.workers <= 1:
                for i in todo:
                    keep(_expert_one(suite, i, *args))
            else:
                from hetpar.procs import thread_safe_context

                # Not fork: the trainer holds torch's threads, and a Ray driver's.
                with ProcessPoolExecutor(cfg.workers, mp_context=thread_safe_context(),
                                         initializer=_worker_init) as pool:
                    futures = [pool.submit(_expert_one, suite, i, *args) for i in todo]
                    try:
                        for fut in as_completed(futures):
                            keep(fut.result())
                    except BaseException:
                        for fut in futures:
                            fut.cancel()
                        raise
    out_plans: dict[int, Any] = {}
    for i in wanted:
        row = done[i]
        out_plans[i] = Plan.from_dict(row["plan"], f"{cache}:{i}") if row.get("plan") else None
    return out_plans


# ---- demonstrations --------------------------------------------------------------------------

@dataclass(frozen=True)
class Demonstrations:
    """Expert decisions: stacked observations, masks, actions and return targets."""

    obs: dict[str, np.ndarray]
    masks: np.ndarray  # (N, n_actions) bool
    actions: np.ndarray  # (N,) int64
    returns: np.ndarray  # (N,) float32
    episode: np.ndarray  # (N,) the instance index each decision belongs to
    expert_reward: dict[int, float]  # instance -> the expert plan's reward in the env
    skipped: dict[int, str]  # instance -> why it gave no demonstration

    def __len__(self) -> int:
        return len(self.actions)

    def subset(self, rows: np.ndarray) -> Demonstrations:
        return Demonstrations({k: v[rows] for k, v in self.obs.items()}, self.masks[rows],
                              self.actions[rows], self.returns[rows], self.episode[rows],
                              self.expert_reward, self.skipped)


def demonstrations(env: SearchEnv, plans: Mapping[int, Any]) -> Demonstrations:
    """Replay each instance's expert plan in ``env`` (a ``PlanBuilderEnv`` over the same
    suite); decisions with a single allowed action are left out (nothing to learn)."""
    from hetpar.errors import PlanError

    rows: list[tuple[dict[str, np.ndarray], np.ndarray, int, float, int]] = []
    rewards: dict[int, float] = {}
    skipped: dict[int, str] = {}
    for index, plan in plans.items():
        if plan is None:
            skipped[index] = "no expert plan"
            continue
        try:
            obs, _ = env.reset(options={"instance": index})
            seq = env.actions_for(plan)
        except (PlanError, ConfigError) as exc:
            skipped[index] = str(exc)
            continue
        steps: list[tuple[dict[str, np.ndarray], np.ndarray, int]] = []
        total, ok = 0.0, False
        for a in seq:
            mask = env.action_masks()
            if not mask[a]:
                break  # outside what the masks allow (e.g. a cut completion query)
            if mask.sum() > 1:
                steps.append((obs, mask.copy(), a))
            obs, reward, terminated, truncated, _ = env.step(a)
            total += float(reward)
            if terminated or truncated:
                ok = terminated and not truncated
                break
        if not ok:
            skipped[index] = "the replayed plan did not finish an episode"
            continue
        rewards[index] = total
        # gamma = 1 and a single reward at the end: every decision's return is the total.
        rows += [(o, m, a, total, index) for o, m, a in steps]
    if not rows:
        raise HetparError("imitation: no expert plan could be replayed in the environment")
    return stack_demonstrations(rows, rewards, skipped)


def stack_demonstrations(rows: Sequence[tuple[dict[str, np.ndarray], np.ndarray, int, float,
                                              int]],
                         expert_reward: dict[int, float] | None = None,
                         skipped: dict[int, str] | None = None) -> Demonstrations:
    """``Demonstrations`` of (observation, mask, action, return, instance) rows."""
    keys = rows[0][0].keys()
    return Demonstrations({k: np.stack([r[0][k] for r in rows]) for k in keys},
                          np.stack([r[1] for r in rows]).astype(bool),
                          np.asarray([r[2] for r in rows], dtype=np.int64),
                          np.asarray([r[3] for r in rows], dtype=np.float32),
                          np.asarray([r[4] for r in rows], dtype=np.int64),
                          expert_reward or {}, skipped or {})


# ---- behaviour cloning --------------------------------------------------------------------

def behaviour_clone(model: Any, demos: Demonstrations, cfg: ImitationConfig, *, seed: int = 0,
                    tb_dir: Path | None = None,
                    log: Callable[[str], None] | None = None) -> dict[str, float]:
    """Fit ``model.policy`` (a MaskablePPO policy) to the expert decisions in ``demos``.

    Returns the final training and held-out accuracy (the expert's action is the policy's
    most likely allowed one) and losses."""
    import torch

    policy = model.policy
    rng = np.random.default_rng(seed)
    episodes = np.unique(demos.episode)
    n_hold = int(round(cfg.holdout * len(episodes))) if len(episodes) > 1 else 0
    held = set(rng.choice(episodes, size=n_hold, replace=False).tolist()) if n_hold else set()
    is_held = np.fromiter((e in held for e in demos.episode), dtype=bool, count=len(demos))
    train, valid = demos.subset(np.flatnonzero(~is_held)), demos.subset(np.flatnonzero(is_held))
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(cfg.epochs, 1))
    writer = None
    if tb_dir is not None:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(str(tb_dir))
    stats: dict[str, float] = {}
    policy.set_training_mode(True)
    t0 = time.perf_counter()
    try:
        for epoch in range(1, cfg.epochs + 1):
            order = rng.permutation(len(train))
            tot = {"policy_loss": 0.0, "value_loss": 0.0, "correct": 0.0}
            for lo in range(0, len(order), cfg.batch_size):
                rows = order[lo:lo + cfg.batch_size]
                obs_t, masks, act_t, ret_t = _batch(policy, train, rows)
                values, log_prob, _ = policy.evaluate_actions(obs_t, act_t, action_masks=masks)
                p_loss = -log_prob.mean()
                v_loss = torch.nn.functional.mse_loss(values.flatten(), ret_t)
                loss = p_loss + cfg.vf_coef * v_loss
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
                opt.step()
                tot["policy_loss"] += p_loss.item() * len(rows)
                tot["value_loss"] += v_loss.item() * len(rows)
                tot["correct"] += float(_correct(policy, obs_t, masks, act_t))
            sched.step()
            n = max(len(train), 1)
            stats = {"epoch": epoch, "policy_loss": tot["policy_loss"] / n,
                     "value_loss": tot["value_loss"] / n, "accuracy": tot["correct"] / n}
            if len(valid):
                stats.update(_validate(policy, valid, cfg.batch_size))
            if writer is not None:
                for k, v in stats.items():
                    if k != "epoch":
                        writer.add_scalar(f"imitation/{k}", v, epoch)
            if log:
                held_txt = (f", held-out accuracy {stats['valid_accuracy']:.3f}"
                            if "valid_accuracy" in stats else "")
                log(f"imitation epoch {epoch}/{cfg.epochs}: loss {stats['policy_loss']:.3f}, "
                    f"accuracy {stats['accuracy']:.3f}{held_txt} "
                    f"({time.perf_counter() - t0:.0f}s)")
    finally:
        policy.set_training_mode(False)
        if writer is not None:
            writer.close()
    stats["decisions"] = float(len(train))
    stats["held_out_decisions"] = float(len(valid))
    return stats


def _batch(policy: Any, demos: Demonstrations, rows: np.ndarray) -> tuple[Any, ...]:
    import torch

    obs_t = {k: torch.as_tensor(v[rows], device=policy.device) for k, v in demos.obs.items()}
    return (obs_t, demos.masks[rows], torch.as_tensor(demos.actions[rows], device=policy.device),
            torch.as_tensor(demos.returns[rows], device=policy.device))


def _correct(policy: Any, obs_t: Any, masks: np.ndarray, act_t: Any) -> int:
    import torch

    with torch.no_grad():
        dist = policy.get_distribution(obs_t, action_masks=masks)
        return int((dist.get_actions(deterministic=True) == act_t).sum())


def _validate(policy: Any, demos: Demonstrations, batch_size: int) -> dict[str, float]:
    import torch

    correct, loss = 0, 0.0
    policy.set_training_mode(False)
    with torch.no_grad():
        for lo in range(0, len(demos), batch_size):
            rows = np.arange(lo, min(lo + batch_size, len(demos)))
            obs_t, masks, act_t, _ = _batch(policy, demos, rows)
            _, log_prob, _ = policy.evaluate_actions(obs_t, act_t, action_masks=masks)
            loss -= float(log_prob.sum())
            correct += _correct(policy, obs_t, masks, act_t)
    policy.set_training_mode(True)
    n = max(len(demos), 1)
    return {"valid_accuracy": correct / n, "valid_policy_loss": loss / n}


def expert_summary(plans: Mapping[int, Any], cache: Path) -> str:
    """One line: how many instances have an expert plan and which method gave it."""
    counts: dict[str, int] = {}
    for line in cache.read_text().splitlines()[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if int(row.get("index", -1)) in plans:
            m = row.get("method") or "none"
            counts[m] = counts.get(m, 0) + 1
    parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    found = sum(p is not None for p in plans.values())
    return f"expert plans for {found}/{len(plans)} instances ({parts})"
