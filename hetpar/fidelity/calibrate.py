"""Fit the cost model's constants on calibration data only.

Fitting data: Megatron SC21 Table 1 (A100) and the ``homogeneous`` rows of the AMP
GPT-2 runs (T4). The ``het_cluster`` rows are never read here: they are the held-out
judge of ``hetpar validate``. Then each GPU type with runs of its own beyond those
(``GPU_PARAMETERS``: the H100, on four of llm-foundry's MPT runs) gets its matmul
efficiency fitted on them alone, everything else held: so it moves no other constant, and
the other rows of those benchmarks stay held out.

Time constants minimise the squared log error of predicted vs measured iteration
time (each data set weighted equally). Memory constants are then chosen on a grid: no
homogeneous run that finished may be predicted infeasible (it proves its plan fits),
and within that as many failed runs as possible are (a failure may have had another
cause), with the widest margin between the two. GPU types with no calibration data use
the ``default`` figures, set to the fitted A100 ones: a data-centre GPU under
Megatron-LM, the best prior available without measurements.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from hetpar.costmodel.constants import CostConstants, FrameworkConstants
from hetpar.fidelity.reference import Run, amp_runs, fsdp_fitted_runs, megatron_runs
from hetpar.costmodel.estimate import CostModel
from hetpar.fidelity.report import predict, predicted_time

__all__ = ["DISCRETE_CHOICES", "GPU_PARAMETERS", "Parameter", "TIME_PARAMETERS", "fit_constants",
           "fit_sources", "calibration_runs", "gpu_calibration_runs"]

A100, T4, H100 = "A100-SXM4-80GB", "T4-16GB", "H100-SXM5-80GB"


@dataclass(frozen=True)
class Parameter:
    """One fitted constant: how to write it into CostConstants, its start and bounds."""

    name: str
    start: float
    low: float
    high: float
    apply: Callable[[CostConstants, float], CostConstants]
    path: str = ""  # where the file keeps it (``CostConstants.constant_paths``)
    data: str = ""  # the calibration data that determine it, in words


def _gpu(name: str, which: str, scale: float = 1.0,
         ) -> Callable[[CostConstants, float], CostConstants]:
    def apply(c: CostConstants, v: float) -> CostConstants:
        new = replace(c.gpu_efficiency(name), **{which: v * scale})
        return replace(c, gpu={**c.gpu, name: new})
    return apply


def _shared(name: str) -> Callable[[CostConstants, float], CostConstants]:
    return lambda c, v: replace(c, **{name: v})


def _fw(framework: str, attr: str, scale: float = 1.0,
        ) -> Callable[[CostConstants, float], CostConstants]:
    return lambda c, v: c.with_framework(framework, **{attr: v * scale})


def _intra(kind: str) -> Callable[[CostConstants, float], CostConstants]:
    return lambda c, v: replace(c, intra_efficiency={**c.intra_efficiency, kind: v})


MLM, MDS = "megatron-lm", "megatron-deepspeed"

_SC21 = "Megatron-LM SC21 Table 1 (10 runs on DGX A100)"
_AMP = "AMP's homogeneous GPT-2 runs (4 hosts of 4 T4-16GB, Megatron-DeepSpeed)"
_FOUNDRY_H100 = ("MosaicML llm-foundry's MPT runs with PyTorch FSDP on one host of 8 "
                 "H100-SXM5-80GB (the 1B, 3B, 7B and 13B models at 4,096 tokens)")

TIME_PARAMETERS: tuple[Parameter, ...] = (
    Parameter("A100 gemm efficiency", 0.55, 0.2, 0.95, _gpu(A100, "gemm"),
              f"gpus.{A100}.gemm_efficiency", _SC21),
    Parameter("T4 gemm efficiency", 0.3, 0.02, 0.95, _gpu(T4, "gemm"),
              f"gpus.{T4}.gemm_efficiency", _AMP),
    Parameter("T4 hbm efficiency", 0.7, 0.2, 0.95, _gpu(T4, "hbm"),
              f"gpus.{T4}.hbm_efficiency", _AMP),
    Parameter("elementwise traffic", 2.0, 0.5, 8.0, _shared("elementwise_traffic"),
              "shared.elementwise_traffic", f"{_SC21} and {_AMP}"),
    Parameter("PCIe efficiency", 0.6, 0.05, 1.0, _intra("pcie"),
              "shared.intra_efficiency.pcie", _AMP),
    Parameter(f"{MLM} layer overhead (us)", 50.0, 0.0, 5000.0, _fw(MLM, "layer_overhead_s", 1e-6),
              f"frameworks.{MLM}.layer_overhead_us", _SC21),
    Parameter(f"{MDS} layer overhead (us)", 200.0, 0.0, 5000.0,
              _fw(MDS, "layer_overhead_s", 1e-6), f"frameworks.{MDS}.layer_overhead_us", _AMP),
    Parameter(f"{MDS} micro-batch overhead (us)", 300.0, 0.0, 2e5,
              _fw(MDS, "microbatch_overhead_s", 1e-6),
              f"frameworks.{MDS}.microbatch_overhead_us", _AMP),
    Parameter(f"{MDS} iteration overhead (ms)", 20.0, 0.0, 2000.0,
              _fw(MDS, "iteration_overhead_s", 1e-3),
              f"frameworks.{MDS}.iteration_overhead_ms", _AMP),
    Parameter(f"{MDS} network efficiency", 0.8, 0.1, 1.0, _fw(MDS, "net_efficiency"),
              f"frameworks.{MDS}.net_efficiency", _AMP),
    Parameter(f"{MDS} collective step latency (us)", 20.0, 1.0, 20000.0,
              _fw(MDS, "step_latency_s", 1e-6), f"frameworks.{MDS}.step_latency_us", _AMP),
)


# Per GPU type, fitted after the rest on the runs of that type alone (``GPU_PARAMETERS``
# and ``gpu_calibration_runs`` in the same order). The HBM efficiency is not fitted: these
# runs are matmul-bound, and the type keeps the default's.
GPU_PARAMETERS: tuple[Parameter, ...] = (
    Parameter("H100 gemm efficiency", 0.55, 0.2, 0.95, _gpu(H100, "gemm"),
              f"gpus.{H100}.gemm_efficiency", _FOUNDRY_H100),
)


def gpu_calibration_runs() -> list[list[Run]]:
    """The runs each of ``GPU_PARAMETERS`` is fitted on."""
    return [fsdp_fitted_runs()]


# The fall-back of a GPU type without fitted efficiencies of its own
# (``CostConstants.architectures``): its architecture's calibrated type. Chosen, not fitted.
ARCHITECTURES = {"hopper": H100, "ampere": A100}


def fit_sources(params: Sequence[Parameter] = TIME_PARAMETERS + GPU_PARAMETERS
                ) -> dict[str, str]:
    """Where each constant ``fit_constants`` writes comes from (``CostConstants.sources``):
    the fitted ones name their data, the others why they have their value. A group's entry
    covers the members without their own."""
    out = {
        "gpus": "not fitted: the starting value, which the calibration data do not determine",
        "gpus.default": (f"the {A100} entry, copied: a GPU type without an entry of its own, "
                         "whose architecture architectures: does not name, takes these "
                         "efficiencies with its own datasheet peak and memory bandwidth, and "
                         "every estimate names it uncalibrated"),
        "architectures": ("the fall-back of a GPU type without an entry of its own "
                          "(configs/gpus.yaml architecture:): the calibrated type of the same "
                          "chip generation, whose efficiencies it takes with its own datasheet "
                          "peak and memory bandwidth (an H200 is the H100's GH100 chip at the "
                          "same peak with more memory bandwidth); every estimate names it "
                          "uncalibrated. Not for turing: the T4's efficiencies reflect its "
                          "70 W power limit, not its architecture. Volta, Ada and AMD types "
                          "have no calibrated type and take the default"),
        "frameworks": ("not fitted: hetpar's defaults (FrameworkConstants), which the "
                       "calibration data do not determine"),
        f"frameworks.{MLM}.p2p_copy_per_tp_rank": ("known: Megatron-LM splits a pipeline "
                                                   "transfer over the tensor-parallel ranks"),
        f"frameworks.{MLM}.tied_embedding_sync": ("known: Megatron-LM all-reduces the tied "
                                                  "embedding's gradient between the first "
                                                  "and last stage"),
        f"frameworks.{MDS}.p2p_copy_per_tp_rank": f"chosen: the combination that fits {_AMP} best",
        f"frameworks.{MDS}.tied_embedding_sync": f"chosen: the combination that fits {_AMP} best",
        "shared": "not fitted: hetpar's defaults, which the calibration data do not determine",
        "shared.weight_bytes": "the size of an fp16 or bf16 value",
        "shared.grad_bytes": "the size of an fp16 or bf16 value",
        "shared.optimizer_bytes_per_param": ("not fitted: HBM bytes one Adam step reads and "
                                             "writes per parameter"),
        "shared.intra_efficiency": ("not fitted: assumed fractions of the datasheet scale-up "
                                    "bandwidth"),
        f"gpus.{H100}.hbm_efficiency": ("the default's: the runs its matmul efficiency is "
                                        "fitted on do not determine it"),
    }
    for key in ("reserve_gib", "fragmentation", "logits_bytes_per_value", "optimizer_bytes"):
        out[f"frameworks.{MDS}.{key}"] = (
            f"chosen on a grid from {_AMP}: no finished run predicted out of memory, then "
            "the most failed runs caught")
    for p in params:
        out[p.path] = f"fitted by `hetpar calibrate`: {p.data}"
    return out


def calibration_runs() -> list[Run]:
    """Every run fitting may look at (never the het_cluster rows)."""
    return megatron_runs() + amp_runs("homogeneous")


def _apply(base: CostConstants, params: Sequence[Parameter], values: Sequence[float]
           ) -> CostConstants:
    c = base
    for p, v in zip(params, values):
        c = p.apply(c, float(v))
    return c


def _time_residuals(c: CostConstants, runs: Sequence[Run],
                    models: dict[str, CostModel] | None = None) -> np.ndarray:
    """Log errors of the predicted times; ``models`` (row id -> a cost model of the run,
    filled on first use) lets every evaluation of the fit reuse each run's geometry."""
    by_set: dict[str, list[float]] = {}
    for run in runs:
        if not math.isfinite(run.measured_s):
            continue
        like = None
        if models is not None:
            like = models.get(run.row_id)
            if like is None:
                like = models[run.row_id] = CostModel(run.cluster, run.model, run.training,
                                                      constants=c, samples=0)
        pred = predicted_time(run, c, like)
        by_set.setdefault(run.experiment, []).append(math.log(pred / run.measured_s))
    # Equal weight per data set, whatever its number of rows.
    return np.concatenate([np.array(v) / math.sqrt(len(v)) for v in by_set.values()])


def _memory_terms(c: CostConstants, runs: Sequence[Run]) -> list[tuple[bool, list[np.ndarray]]]:
    """Per run (did it finish?) and per candidate plan, each replica's memory as
    ``used = base + optimizer_bytes * per_optim + logits_bytes * per_logit`` against its
    device memory: the memory model is linear in the fitted constants."""
    probes = [c.with_framework(MDS, optimizer_bytes=o, logits_bytes_per_value=lg)
              for o, lg in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0))]
    out = []
    for run in runs:
        per_plan = []
        for plan in run.plans:
            used = []
            for probe in probes:
                cm = CostModel(run.cluster, run.model, run.training, constants=probe, samples=0)
                est = cm.evaluate(plan, allow_empty_stages=True)
                used.append(np.array([m.used_bytes for m in est.memory]))
            capacity = np.array([m.capacity_bytes for m in est.memory])
            base, with_o, with_l = used
            per_plan.append(np.stack([base, with_o - base, with_l - base, capacity]))
        out.append((math.isfinite(run.measured_s), per_plan))
    return out


def _memory_score(terms: list[tuple[bool, list[np.ndarray]]], reserve: float, frag: float,
                  logits: float, optim: float) -> tuple[int, int, float]:
    """(failed runs predicted infeasible, finished runs predicted infeasible, margin): the
    margin is the smallest distance (bytes) of any finished run or caught failure from the
    memory limit, as in a max-margin classifier."""
    caught = wrong = 0
    margin = math.inf
    for finished, plans in terms:
        # A run fits if its best candidate plan does; its headroom is that plan's smallest.
        headroom = max(float(np.min(t[3] * (1.0 - frag) - reserve
                                    - (t[0] + optim * t[1] + logits * t[2]))) for t in plans)
        if finished:
            wrong += headroom < 0
        elif headroom < 0:
            caught += 1
        if finished or headroom < 0:
            margin = min(margin, abs(headroom))
    return caught, wrong, margin


DISCRETE_CHOICES = tuple(itertools.product((False, True), (True, False)))


def fit_constants(base: CostConstants | None = None,
                  runs: Sequence[Run] | None = None,
                  discrete: Sequence[tuple[bool, bool]] = DISCRETE_CHOICES,
                  gpu_runs: Sequence[Sequence[Run]] | None = None,
                  ) -> tuple[CostConstants, dict[str, float]]:
    """Fit time then memory constants, then each of ``GPU_PARAMETERS`` on its own runs
    (``gpu_runs``, default ``gpu_calibration_runs()``); returns the constants and the
    fitted values. ``discrete``: the (p2p copy per TP rank, tied-embedding sync)
    combinations of Megatron-DeepSpeed to fit under (each is a fit of its own: all four
    by default)."""
    base = base or CostConstants(frameworks={MLM: FrameworkConstants(),
                                             MDS: FrameworkConstants()})
    runs = list(runs) if runs is not None else calibration_runs()
    assert all(r.experiment != "het_cluster" for r in runs), "het_cluster rows are held out"
    params = TIME_PARAMETERS
    x0 = np.array([p.start for p in params])
    lo = np.array([p.low for p in params])
    hi = np.array([p.high for p in params])
    scale = np.maximum(np.abs(x0), 1e-3)

    # How the framework sends pipeline activations and whether it syncs tied embeddings
    # on the critical path are discrete properties: fit the continuous constants under
    # each combination and keep the best.
    fits = []
    models: dict[str, CostModel] = {}  # per run: its routes and crossings, for every step
    # (Megatron-LM's own behaviour is known: scatter-gather transfers, embedding sync.)
    for copies, sync in discrete:
        start = base.with_framework(MDS, p2p_copy_per_tp_rank=copies, tied_embedding_sync=sync)

        def residuals(z: np.ndarray, start: CostConstants = start) -> np.ndarray:
            return _time_residuals(_apply(start, params, z * scale), runs, models)

        fit = least_squares(residuals, x0 / scale, bounds=(lo / scale, hi / scale),
                            diff_step=1e-3, xtol=1e-6, ftol=1e-6, max_nfev=400)
        fits.append((fit.cost, start, fit.x * scale))
    cost, start, values = min(fits, key=lambda f: f[0])
    fitted = _apply(start, params, values)
    fitted = replace(fitted, gpu={**fitted.gpu, "default": fitted.gpu[A100]})
    mds_runs = [r for r in runs if r.training.framework == MDS]

    # Memory: a finished run proves its plan fits, while a failed run may have failed for
    # another reason, so no finished run may be predicted infeasible; within that, catch
    # the most failures, and among equals keep the constants with the widest margin.
    terms = _memory_terms(fitted, mds_runs)
    best = None
    for reserve, frag, logits, optim in itertools.product(
            np.arange(0.0, 3.01, 0.125), (0.0, 0.02, 0.05, 0.1),
            (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0), (12.0, 16.0, 20.0, 24.0)):
        caught, wrong, margin = _memory_score(terms, reserve * 2**30, frag, logits, optim)
        key = (wrong == 0, caught, margin)
        if best is None or key > best[0]:
            best = (key, float(reserve), frag, logits, optim)
    assert best is not None
    fitted = fitted.with_framework(MDS, reserve_bytes=best[1] * 2**30, fragmentation=best[2],
                                   logits_bytes_per_value=best[3], optimizer_bytes=best[4])
    # Every Megatron-LM run finished: its memory constants must predict them all to fit.
    for run in runs:
        if run.training.framework == MLM:
            assert predict(run, fitted).feasible, f"{run.row_id} predicted out of memory"
    report = {p.name: float(v) for p, v in zip(params, values)}
    # A type's own efficiency, on its own runs, after everything it shares is fitted (the
    # default it starts from included): one constant per type, nothing else moves.
    per_type = list(gpu_runs) if gpu_runs is not None else gpu_calibration_runs()
    for param, type_runs in zip(GPU_PARAMETERS, per_type):
        type_models: dict[str, CostModel] = {}

        def type_residuals(z: np.ndarray, param: Parameter = param,
                           type_runs: Sequence[Run] = type_runs,
                           type_models: dict[str, CostModel] = type_models) -> np.ndarray:
            return _time_residuals(param.apply(fitted, float(z[0])), type_runs, type_models)

        fit = least_squares(type_residuals, np.array([param.start]),
                            bounds=([param.low], [param.high]), diff_step=1e-3, xtol=1e-6,
                            ftol=1e-6, max_nfev=100)
        fitted = param.apply(fitted, float(fit.x[0]))
        report[param.name] = float(fit.x[0])
    report[f"{MDS} reserve (GiB)"] = best[1]
    report[f"{MDS} fragmentation"] = best[2]
    report[f"{MDS} logits bytes per value"] = best[3]
    report[f"{MDS} optimizer bytes per param"] = best[4]
    report[f"{MDS} p2p copy per tp rank"] = float(start.framework(MDS).p2p_copy_per_tp_rank)
    report[f"{MDS} tied embedding sync"] = float(start.framework(MDS).tied_embedding_sync)
    report["time fit cost"] = float(cost)
    fitted = replace(fitted, architectures={a: t for a, t in ARCHITECTURES.items()
                                            if t in fitted.gpu})
    return replace(fitted, sources=fit_sources(params + GPU_PARAMETERS)), report
