"""DAgger with a lookahead expert: labels at the states the policy itself visits.

Cloning an expert's plans teaches the policy the expert's states only; once the policy
errs, it meets states no demonstration covered, and its errors compound (measured in
docs/history/agents-history.md: a clone that matched 89% of the searched plans' decisions
planned worse than the policy it started from). DAgger (Ross et al., 2011) labels the
states the learner visits instead. Here the expert at a state is a beam search of the
policy itself from that state (``planner._beam_search``, width ``width``), scored by the
cost model: the label is the first action of the best plan the beam finishes. The beam
keeps the greedy continuation, so the label is the policy's own action unless a plan
within the policy's reach one decision away is better, and every labelled plan is one
the policy can build one decision at a time (unlike the structure search's plans).

One round (``lookahead_demonstrations``): roll out the policy greedily on each instance;
at every state with more than one allowed action, run the beam, record (observation,
mask, label, the env's reward of the best plan), then take the policy's own action. The
rounds' demonstrations are aggregated and the policy is cloned on them
(``imitation.behaviour_clone``), starting from its own weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetpar.agents.imitation import Demonstrations, stack_demonstrations
from hetpar.errors import HetparError

__all__ = ["LookaheadStats", "lookahead_demonstrations", "merge_demonstrations"]

CHUNK = 8  # instances a worker labels per task


@dataclass(frozen=True)
class LookaheadStats:
    """What one round of labelling found."""

    instances: int
    decisions: int  # states with more than one allowed action, each labelled
    changed: int  # labels that differ from the policy's own action
    mean_gain: float  # mean of T(greedy continuation) / T(best in the beam) - 1, changed only


def _episode(env: Any, forward: Any, bundle: Any, index: int, width: int,
             ) -> tuple[list[tuple[dict[str, np.ndarray], np.ndarray, int, float]], int, list[float]]:
    """One learner rollout of instance ``index`` with a lookahead label at every decision."""
    import torch

    from hetpar.agents.planner import _beam_search

    rows: list[tuple[dict[str, np.ndarray], np.ndarray, int, float]] = []
    gains: list[float] = []
    obs, _ = env.reset(options={"instance": index})
    changed = 0
    for _ in range(10_000):
        mask = env.action_masks()
        allowed = np.flatnonzero(mask)
        if len(allowed) == 1:
            obs, _, terminated, truncated, _ = env.step(int(allowed[0]))
        else:
            state, mask = env.snapshot(), mask.copy()
            firsts: list[int] = []
            with torch.inference_mode():
                plans, _, _ = _beam_search(env, forward, bundle, width, firsts)
            values = [env.plan_value(p) for p in plans]
            best = int(np.argmin(values))
            label, own = firsts[best], firsts[0]
            reward = env.plan_reward(values[best])
            rows.append((obs, mask, label, reward))
            if label != own:
                changed += 1
                gains.append(values[0] / values[best] - 1.0)
            env.restore(state, observe=False)
            obs, _, terminated, truncated, _ = env.step(own)
        if terminated or truncated:
            return rows, changed, gains
    raise HetparError(f"dagger: the rollout of instance {index} did not end")


def _label_chunk(policy_path: str, env_kwargs: dict[str, Any], indices: list[int],
                 width: int) -> tuple[list[tuple[int, Any]], int, list[float]]:
    from hetpar.agents.io import load_policy
    from hetpar.agents.planner import forward_for
    from hetpar.envs.env import PlanBuilderEnv

    bundle = load_policy(policy_path)
    policy = bundle.model.policy
    policy.set_training_mode(False)
    forward = forward_for(policy)
    env = PlanBuilderEnv(**env_kwargs)
    out: list[tuple[int, Any]] = []
    changed, gains = 0, []
    for i in indices:
        rows, c, g = _episode(env, forward, bundle, i, width)
        out.append((i, rows))
        changed += c
        gains += g
    return out, changed, gains


def lookahead_demonstrations(policy_path: str, env_kwargs: dict[str, Any],
                             indices: Iterable[int], *, width: int = 8, workers: int = 1,
                             log: Callable[[str], None] | None = None,
                             ) -> tuple[Demonstrations, LookaheadStats]:
    """Label the states the policy in ``policy_path`` visits on ``indices`` of the
    environment ``PlanBuilderEnv(**env_kwargs)`` builds (module docstring)."""
    if width < 2:
        raise HetparError(f"dagger: the lookahead beam needs a width of at least 2, got {width}")
    idx = list(indices)
    n = max(1, min(workers, len(idx)))
    # Small chunks: progress to report, and workers whose caller died stop soon.
    size = max(1, min(CHUNK, -(-len(idx) // n)))
    chunks = [idx[k:k + size] for k in range(0, len(idx), size)]
    by_index: dict[int, Any] = {}
    changed, gains = 0, []
    t0, next_report = time.perf_counter(), 0.1

    def collect(part: list[tuple[int, Any]], c: int, g: list[float]) -> None:
        nonlocal changed, next_report
        by_index.update(part)
        changed += c
        gains.extend(g)
        done = len(by_index) / len(idx)
        if log and done >= next_report and done < 1.0:
            log(f"dagger: {len(by_index)}/{len(idx)} instances labelled "
                f"({time.perf_counter() - t0:.0f}s)")
            next_report = done + 0.1

    if n == 1:
        for chunk in chunks:
            collect(*_label_chunk(policy_path, env_kwargs, chunk, width))
    else:
        from hetpar.agents.imitation import _worker_init
        from hetpar.procs import thread_safe_context

        # Not fork: the caller's torch and BLAS threads would not survive it.
        with ProcessPoolExecutor(n, mp_context=thread_safe_context(),
                                 initializer=_worker_init) as pool:
            futures = [pool.submit(_label_chunk, policy_path, env_kwargs, chunk, width)
                       for chunk in chunks]
            try:
                for fut in as_completed(futures):
                    collect(*fut.result())
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
    rows = [(o, m, a, r, i) for i in idx for o, m, a, r in by_index[i]]
    if not rows:
        raise HetparError("dagger: no decision to label")
    demos = stack_demonstrations(rows)
    stats = LookaheadStats(len(idx), len(rows), changed,
                           float(np.mean(gains)) if gains else 0.0)
    if log:
        log(f"dagger: {stats.decisions} decisions on {stats.instances} instances, "
            f"{stats.changed} labels differ from the policy's action "
            f"(mean gain {100 * stats.mean_gain:.1f}%)")
    return demos, stats


def merge_demonstrations(parts: list[Demonstrations]) -> Demonstrations:
    """The rounds' demonstrations as one set (DAgger's aggregation)."""
    if len(parts) == 1:
        return parts[0]
    return Demonstrations({k: np.concatenate([p.obs[k] for p in parts]) for k in parts[0].obs},
                          np.concatenate([p.masks for p in parts]),
                          np.concatenate([p.actions for p in parts]),
                          np.concatenate([p.returns for p in parts]),
                          np.concatenate([p.episode for p in parts]), {}, {})

