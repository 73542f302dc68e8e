"""Training callbacks and wrappers: hetpar statistics in TensorBoard, evaluation against
``exact`` / ``metis`` on a fixed held-out set, periodic checkpoints, a rich progress bar."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from hetpar.problem import DEFAULT_SEED, Instance, Problem
from hetpar.solvers.isolated import run_isolated

__all__ = ["StatsWrapper", "StatsCallback", "EvalGapCallback", "CheckpointCallback",
           "RichProgressCallback", "Reference", "reference_problem", "reference_values",
           "evaluate_policy_gaps"]


class StatsWrapper(gym.Wrapper):
    """Adds ``tokens_per_s`` (plan throughput under the episode's objective) to the info
    of a finished episode, and forwards ``action_masks``."""

    def action_masks(self) -> np.ndarray:
        return self.env.unwrapped.action_masks()  # type: ignore[attr-defined]

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated and "objective_s" in info:
            inst = self.env.unwrapped.instance  # type: ignore[attr-defined]
            seq = self.env.unwrapped.context.cm.seq_len  # type: ignore[attr-defined]
            value = float(info["objective_s"])
            info["tokens_per_s"] = (inst.training.global_batch * seq / value
                                    if info.get("feasible") and value > 0 and
                                    math.isfinite(value) else 0.0)
        return obs, reward, terminated, truncated, info


class StatsCallback(BaseCallback):
    """Per rollout: mean plan throughput, MFU and infeasible fraction of the episodes that
    finished, and environment steps per second (rollout collection, policy included)."""

    def __init__(self) -> None:
        super().__init__()
        self._tps: list[float] = []
        self._mfu: list[float] = []
        self._bad = 0
        self._done = 0
        self._t0 = 0.0
        self._n0 = 0

    def _on_rollout_start(self) -> None:
        self._t0, self._n0 = time.perf_counter(), self.num_timesteps

    def _on_step(self) -> bool:
        dones = self.locals.get("dones")
        infos = self.locals.get("infos") or []
        if dones is None:
            return True
        for done, info in zip(dones, infos):
            if not done:
                continue
            self._done += 1
            if info.get("feasible") and "tokens_per_s" in info:
                self._tps.append(float(info["tokens_per_s"]))
                self._mfu.append(float(info.get("reward", 0.0)))
            else:
                self._bad += 1
        return True

    def _on_rollout_end(self) -> None:
        dt = time.perf_counter() - self._t0
        if dt > 0:
            self.logger.record("hetpar/env_steps_per_s", (self.num_timesteps - self._n0) / dt)
        if self._done:
            self.logger.record("hetpar/infeasible_frac", self._bad / self._done)
        if self._tps:
            self.logger.record("hetpar/throughput_tokens_per_s", float(np.mean(self._tps)))
            self.logger.record("hetpar/mfu", float(np.mean(self._mfu)))
        self._tps, self._mfu, self._bad, self._done = [], [], 0, 0


# ---- evaluation against exact / metis ------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    """Baseline objective values (seconds) of one evaluation instance."""

    name: str
    exact: float  # inf when exact found nothing within its time limit
    exact_optimal: bool
    exact_wall_s: float
    metis: float

    @property
    def best(self) -> float:
        return min(self.exact, self.metis)


def reference_values(instances: Sequence[Instance], *, objective: str, samples: int,
                     time_limit: float, seed: int = DEFAULT_SEED, cache: Path | None = None,
                     log: Callable[[str], None] | None = None) -> list[Reference]:
    """``exact`` (time-limited) and ``metis`` values of each instance's ``Problem``:
    ``objective`` over ``samples`` bandwidth states drawn with ``seed`` (``DEFAULT_SEED``
    unless told: the states ``hetpar evaluate`` scores by default, not the environment's
    instance-seeded ones; ``evaluate_policy_gaps`` scores the policy's plans on the same
    problems). Cached in ``cache`` (JSON) keyed by objective, samples, seed and time
    limit. Each instance is solved by ``run_isolated`` (a child process with a memory
    cap, stopped ``time_limit + 10`` seconds after the time limit); where exact has no
    plan by then, the evaluation uses metis as the reference."""
    key = {"objective": objective, "samples": samples, "seed": seed, "time_limit": time_limit}
    stored: dict[str, Any] = {}
    if cache is not None and cache.is_file():
        try:
            data = json.loads(cache.read_text())
            if data.get("key") == key:
                stored = data.get("instances", {})
        except (OSError, ValueError):
            stored = {}
    out: list[Reference] = []
    for i, inst in enumerate(instances):
        hit = stored.get(inst.name)
        if hit is not None:
            out.append(Reference(hit["name"], float(hit["exact"]), bool(hit["exact_optimal"]),
                                 float(hit["exact_wall_s"]), float(hit["metis"])))
            continue
        problem = reference_problem(inst, objective=objective, samples=samples, seed=seed)
        t0 = time.perf_counter()
        # The grace keeps the hard stop at 2 * time_limit + 10 s: metis runs first.
        res = run_isolated(problem, ("metis", "exact"), time_limit=time_limit,
                           grace_s=time_limit + 10)
        exact = res["exact"]
        wall = exact.wall_s if exact.wall_s is not None else time.perf_counter() - t0
        ref = Reference(inst.name, exact.value, exact.gap == 0.0, wall, res["metis"].value)
        out.append(ref)
        stored[inst.name] = asdict(ref)
        if log:
            status = ("optimal" if ref.exact_optimal else "time limit" if
                      math.isfinite(ref.exact) else "no result")
            log(f"reference {i + 1}/{len(instances)} {inst.name}: exact {ref.exact:.4g}s "
                f"({status}, {ref.exact_wall_s:.1f}s), metis {ref.metis:.4g}s")
        if cache is not None:
            cache.write_text(json.dumps({"key": key, "instances": stored}, indent=1,
                                        default=_json_float))
    return out


def reference_problem(inst: Instance, *, objective: str, samples: int,
                      seed: int = DEFAULT_SEED) -> Problem:
    """The problem a reference value of ``inst`` is measured on (``reference_values``),
    and the policy's plan with it (``evaluate_policy_gaps``)."""
    return Problem.from_instance(inst, objective=objective, samples=samples, seed=seed)


def _json_float(x: Any) -> Any:
    return str(x)


def evaluate_policy_gaps(model: Any, env: Any, refs: Sequence[Reference],
                         problems: Sequence[Problem] | None = None) -> dict[str, Any]:
    """Deterministic masked rollouts of ``model`` on instance ``i`` of ``env`` (a robust
    ``PlanBuilderEnv`` over the evaluation instances) for each reference ``i``.

    ``problems``: reference ``i``'s problem (``reference_problem``); the rollout's plan is
    scored on it, so the gap compares two values under the same bandwidth states.
    Without, the environment's own score is used (its instance-seeded states)."""
    gaps_exact, gaps_metis, values, infeasible = [], [], [], 0
    refined_gaps: list[float] = []
    refined_wins = 0
    for i, ref in enumerate(refs):
        obs, _ = env.reset(options={"instance": i})
        info: dict[str, Any] = {}
        for _ in range(10_000):
            action, _ = model.predict(obs, action_masks=np.array(env.action_masks()),
                                      deterministic=True)
            obs, _, terminated, truncated, info = env.step(int(action))
            if terminated or truncated:
                break
        value = float(info.get("objective_s", math.inf))
        if problems is not None:
            plan = info.get("plan")
            value = problems[i].value(plan) if plan is not None else math.inf
        if not info.get("feasible") or not math.isfinite(value):
            infeasible += 1
            value = math.inf
        values.append(value)
        best = ref.exact if math.isfinite(ref.exact) else ref.best
        if math.isfinite(best):
            gaps_exact.append(value / best - 1.0)
        if math.isfinite(ref.metis):
            gaps_metis.append(value / ref.metis - 1.0)
        if problems is not None and math.isfinite(value) and math.isfinite(best):
            # The refined rollout, as ``hetpar plan --no-improve`` refines it.
            from hetpar.agents.planner import DEFAULT_REFINE_STEPS
            from hetpar.solvers.refine import refine_plan

            pr = problems[i]
            ref_plan = refine_plan(pr.cost_model, pr.space, pr.objective, info["plan"],
                                   max_steps=DEFAULT_REFINE_STEPS)
            refined = min(value, ref_plan.value)
            refined_gaps.append(refined / best - 1.0)
            refined_wins += bool(math.isfinite(ref.metis) and refined <= ref.metis * (1 + 1e-9))
    finite = [g for g in gaps_exact if math.isfinite(g)]
    return {
        "gap_exact_mean": float(np.mean(gaps_exact)) if gaps_exact else math.nan,
        "gap_exact_p90": float(np.percentile(gaps_exact, 90)) if gaps_exact else math.nan,
        "gap_exact_median": float(np.median(finite)) if finite else math.nan,
        "gap_metis_mean": float(np.mean(gaps_metis)) if gaps_metis else math.nan,
        "beats_metis_frac": (float(np.mean([g < 0 for g in gaps_metis])) if gaps_metis
                             else math.nan),
        "infeasible_frac": infeasible / max(len(refs), 1),
        "gap_refined_mean": float(np.mean(refined_gaps)) if refined_gaps else math.nan,
        "gap_refined_median": float(np.median(refined_gaps)) if refined_gaps else math.nan,
        "gap_refined_p90": (float(np.percentile(refined_gaps, 90)) if refined_gaps
                            else math.nan),
        "refined_as_good_as_metis_frac": (refined_wins / len(refined_gaps) if refined_gaps
                                          else math.nan),
        "values": values,
    }


class EvalGapCallback(BaseCallback):
    """Every ``freq`` timesteps (checked at rollout ends) and at the end of training:
    gaps of the deterministic policy to ``exact`` and ``metis`` on the fixed evaluation
    set, logged under ``hetpar/eval/``; the best policy by mean gap is saved."""

    def __init__(self, env: Any, refs: Sequence[Reference], freq: int,
                 save_best: Callable[[Any, dict[str, Any]], None] | None = None,
                 history: Path | None = None, log: Callable[[str], None] | None = None,
                 last_eval: int = 0, best: float = math.inf,
                 problems: Sequence[Problem] | None = None) -> None:
        super().__init__()
        self.env, self.refs, self.freq = env, list(refs), int(freq)
        # The references' problems: the policy's plans are scored on them (see
        # ``evaluate_policy_gaps``).
        self.problems = list(problems) if problems is not None else None
        self.save_best, self.history, self.log = save_best, history, log
        self.last_eval = last_eval
        self.best = best
        self.last: dict[str, Any] | None = None

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.freq > 0 and self.num_timesteps - self.last_eval >= self.freq:
            self.evaluate()

    def _on_training_end(self) -> None:
        if self.last_eval != self.num_timesteps:
            self.evaluate()
        # The last update's losses would otherwise never reach TensorBoard.
        self.logger.dump(self.num_timesteps)

    def evaluate(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        res = evaluate_policy_gaps(self.model, self.env, self.refs, self.problems)
        self.last_eval = self.num_timesteps
        for key in ("gap_exact_mean", "gap_exact_p90", "gap_exact_median", "gap_metis_mean",
                    "beats_metis_frac", "infeasible_frac", "gap_refined_mean",
                    "gap_refined_median", "gap_refined_p90",
                    "refined_as_good_as_metis_frac"):
            if not math.isnan(res[key]):
                self.logger.record(f"hetpar/eval/{key}", min(res[key], 1e3))
        self.logger.record("hetpar/eval/wall_s", time.perf_counter() - t0)
        res["timesteps"] = self.num_timesteps
        self.last = res
        if self.history is not None:
            with self.history.open("a") as fh:
                fh.write(json.dumps({k: v for k, v in res.items() if k != "values"},
                                    default=_json_float) + "\n")
        score = res["gap_exact_mean"]
        if self.save_best is not None and math.isfinite(score) and score < self.best:
            self.best = score
            self.save_best(self.model, res)
        if self.log:
            self.log(f"eval @ {self.num_timesteps}: gap to exact mean {res['gap_exact_mean']:.2%}"
                     f" p90 {res['gap_exact_p90']:.2%}, to metis mean "
                     f"{res['gap_metis_mean']:.2%}, infeasible {res['infeasible_frac']:.0%}; "
                     f"refined median {res['gap_refined_median']:.2%} p90 "
                     f"{res['gap_refined_p90']:.2%}")
        return res


class CheckpointCallback(BaseCallback):
    """Saves a checkpoint every ``freq`` timesteps (at rollout ends), keeping ``keep``."""

    def __init__(self, freq: int, save: Callable[[Any, Path], Path], folder: Path,
                 keep: int = 3) -> None:
        super().__init__()
        self.freq, self.save, self.folder, self.keep = int(freq), save, folder, int(keep)
        self._last = 0

    def _on_training_start(self) -> None:
        self._last = self.num_timesteps

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.freq > 0 and self.num_timesteps - self._last >= self.freq:
            self._last = self.num_timesteps
            self.save(self.model, self.folder / f"policy_{self.num_timesteps}_steps.zip")
            found = sorted(self.folder.glob("policy_*_steps.zip"),
                           key=lambda p: int(p.stem.split("_")[1]))
            for old in found[:-self.keep] if self.keep > 0 else []:
                old.unlink(missing_ok=True)


class RichProgressCallback(BaseCallback):
    """A rich progress bar over the timesteps of this run (with the last eval gap)."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True) -> None:
        super().__init__()
        self.total, self.start, self.enabled = int(total), int(start), enabled
        self._progress: Any = None
        self._task: Any = None
        self.eval_cb: EvalGapCallback | None = None

    def _on_training_start(self) -> None:
        if not self.enabled:
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TimeRemainingColumn(),
                                  TextColumn("{task.fields[note]}"), transient=False)
        self._progress.start()
        self._task = self._progress.add_task("train", total=self.total,
                                             completed=self.num_timesteps, note="")

    def _on_step(self) -> bool:
        if self._progress is not None:
            self._progress.update(self._task, completed=min(self.num_timesteps, self.total))
        return True

    def _on_rollout_end(self) -> None:
        if self._progress is not None and self.eval_cb is not None and self.eval_cb.last:
            gap = self.eval_cb.last["gap_exact_mean"]
            self._progress.update(self._task, note=f"gap to exact {gap:.1%}")

    def _on_training_end(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
