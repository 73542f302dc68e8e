"""Fidelity of the cost model against the bundled reference runs.

* Calibration: predicted vs published time for every Megatron SC21 Table 1 row (MAPE).
* Validation: for both AMP experiments, rank correlation of predicted and measured time
  over the runs that finished, how the plan predicted best really measured, and whether
  runs that failed (out of memory) are predicted infeasible.
* Held out: published runs never used in fitting (Korthikanti et al. 2022, sequence
  parallelism and selective recomputation against full recomputation): MAPE, and whether
  every one is predicted to fit.

Megatron rows do not state the micro-batch size; its authors tuned it, so a row is
predicted with the size (1, 2, 4 or 8) that the model itself finds fastest among
those it predicts to fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import kendalltau, spearmanr

from hetpar.costmodel.constants import CostConstants
from hetpar.costmodel.estimate import CostModel, Estimate
from hetpar.fidelity.reference import (
    Run,
    amp_runs,
    fsdp_fitted_runs,
    fsdp_heldout_runs,
    korthikanti_runs,
    megatron_runs,
)

__all__ = ["RunResult", "ExperimentReport", "predict", "predicted_time", "calibration_report",
           "validation_report", "heldout_report", "heldout_fsdp_report", "fitted_fsdp_report"]


@dataclass(frozen=True)
class RunResult:
    row_id: str
    measured_s: float
    predicted_s: float
    feasible: bool  # the memory model's verdict: every replica fits
    estimate: Estimate
    # A pipeline stage without transformer layers (embedding or head alone), as some of
    # AMP's plans have: no plan of hetpar's space has one (``validate_plan``), so hetpar
    # never proposes such a plan. Every AMP run with one failed.
    empty_stage: bool = False

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def predicted_time(run: Run, constants: CostConstants, like: CostModel | None = None) -> float:
    """The fast path of ``predict``: the predicted iteration time only. ``like``, a cost
    model of the same run under other constants, lends its tables of where data goes."""
    cm = (like.with_constants(constants) if like is not None else
          CostModel(run.cluster, run.model, run.training, constants=constants, samples=0))
    best = (False, -math.inf)
    for plan in run.plans:
        times, fits = cm.iteration_times(plan)
        best = max(best, (fits, -float(times[0])))
    return -best[1]


def predict(run: Run, constants: CostConstants) -> RunResult:
    """Estimate a run (mean bandwidth); with several candidate plans, the best that fits."""
    cm = CostModel(run.cluster, run.model, run.training, constants=constants, samples=0)
    best: Estimate | None = None
    empty = False
    for plan in run.plans:
        est = cm.evaluate(plan, allow_empty_stages=True)
        if best is None or (est.feasible, -est.iter_time_mean) > (best.feasible,
                                                                  -best.iter_time_mean):
            best, empty = est, any(st.layers == 0 for st in plan.stages)
    assert best is not None
    return RunResult(run.row_id, run.measured_s, best.iter_time_mean, best.feasible, best,
                     empty)


@dataclass(frozen=True)
class ExperimentReport:
    name: str
    results: tuple[RunResult, ...]

    @property
    def finite(self) -> list[RunResult]:
        return [r for r in self.results if math.isfinite(r.measured_s)]

    @property
    def failed(self) -> list[RunResult]:
        return [r for r in self.results if not math.isfinite(r.measured_s)]

    @property
    def mape(self) -> float:
        return float(np.mean([abs(r.error) for r in self.finite]))

    @property
    def mape_by_gpu(self) -> dict[str, tuple[float, int]]:
        """Per GPU type of the runs' first replica: (MAPE, rows), finished runs only."""
        groups: dict[str, list[float]] = {}
        for r in self.finite:
            groups.setdefault(r.estimate.memory[0].gpu_type, []).append(abs(r.error))
        return {gpu: (float(np.mean(errs)), len(errs)) for gpu, errs in sorted(groups.items())}

    @property
    def uncalibrated(self) -> frozenset[str]:
        """GPU types the runs ran on that have no fitted efficiency of their own."""
        return frozenset(t for r in self.results for t in r.estimate.uncalibrated)

    @property
    def spearman(self) -> float:
        f = self.finite
        return float(spearmanr([r.measured_s for r in f], [r.predicted_s for r in f])[0])

    @property
    def kendall(self) -> float:
        f = self.finite
        return float(kendalltau([r.measured_s for r in f], [r.predicted_s for r in f])[0])

    @property
    def predicted_best(self) -> RunResult | None:
        """The run the model would pick: fastest predicted among those predicted to fit."""
        fits = [r for r in self.results if r.feasible]
        return min(fits, key=lambda r: r.predicted_s) if fits else None

    @property
    def measured_best(self) -> RunResult:
        return min(self.finite, key=lambda r: r.measured_s)

    @property
    def pick_slowdown(self) -> float:
        """How much slower the predicted-best plan measured than the measured best."""
        pick = self.predicted_best
        if pick is None:
            return math.inf
        return pick.measured_s / self.measured_best.measured_s - 1.0

    @property
    def failed_caught(self) -> int:
        """Failed runs the memory model predicts not to fit."""
        return sum(1 for r in self.failed if not r.feasible)

    @property
    def false_infeasible(self) -> int:
        """Finished runs the memory model predicts not to fit."""
        return sum(1 for r in self.finite if not r.feasible)

    @property
    def failed_outside_space(self) -> int:
        """Failed runs that fit by the memory model but have a stage without transformer
        layers, which hetpar's plan space excludes (it would never propose them)."""
        return sum(1 for r in self.failed if r.feasible and r.empty_stage)

    @property
    def finished_outside_space(self) -> int:
        """Finished runs that fit by the memory model but have a stage without transformer
        layers: the plan-space rule would be wrong on them (apart from ``false_infeasible``,
        so that the two add up)."""
        return sum(1 for r in self.finite if r.feasible and r.empty_stage)


def calibration_report(constants: CostConstants) -> ExperimentReport:
    return ExperimentReport("megatron_sc21_table1",
                            tuple(predict(r, constants) for r in megatron_runs()))


def validation_report(constants: CostConstants, experiment: str) -> ExperimentReport:
    return ExperimentReport(experiment, tuple(predict(r, constants) for r in amp_runs(experiment)))


def heldout_report(constants: CostConstants) -> ExperimentReport:
    """Published runs never used in fitting (``configs/reference/README.md``)."""
    return ExperimentReport("korthikanti_2022_table5",
                            tuple(predict(r, constants) for r in korthikanti_runs()))


def heldout_fsdp_report(constants: CostConstants) -> ExperimentReport:
    """llm-foundry's MPT runs with FSDP on H100 and A100 hosts that are never used in
    fitting (``configs/reference/README.md``): ZeRO-3 plans."""
    return ExperimentReport("llm_foundry_fsdp",
                            tuple(predict(r, constants) for r in fsdp_heldout_runs()))


def fitted_fsdp_report(constants: CostConstants) -> ExperimentReport:
    """The llm-foundry rows the H100's matmul efficiency is fitted on (``FSDP_FITTED``),
    reported apart from the held-out ones."""
    return ExperimentReport("llm_foundry_fsdp_fitted",
                            tuple(predict(r, constants) for r in fsdp_fitted_runs()))
