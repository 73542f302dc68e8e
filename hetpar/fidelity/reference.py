"""The bundled reference runs, turned into (cluster, model, training, plan) instances.

* Megatron-LM SC21 Table 1 (calibration): GPT models on DGX A100 hosts.
* AMP's GPT-2 runs (validation; only its ``homogeneous`` rows may be used for fitting).
* Korthikanti et al. (2022) Table 5 (validation, held out): GPT models of 22B to 1T
  parameters on DGX A100 hosts, full recomputation against sequence parallelism with
  selective recomputation.
* MosaicML llm-foundry's MPT training benchmarks (validation, held out): MPT models of
  125M to 30B parameters trained with PyTorch FSDP (full sharding, ZeRO-3's traffic) on
  H100 and A100 hosts, the only rows with H100s and with ZeRO-3.

Plans are built exactly as the data README describes: global rank
``r = tp_rank + tp * (dp_rank + dp * stage)`` lives on host ``r // gpus_per_host``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from hetpar.cluster.topology import Cluster, load_cluster, parse_cluster
from hetpar.configio import bundled_dir
from hetpar.plan import Plan, Replica, Stage
from hetpar.workload.model import ModelSpec, load_model
from hetpar.workload.training import TrainingSpec

__all__ = ["FSDP_FITTED", "Run", "megatron_runs", "amp_runs", "korthikanti_runs", "fsdp_runs",
           "fsdp_fitted_runs", "fsdp_heldout_runs", "rank_placement_plan"]


@dataclass(frozen=True)
class Run:
    """One published or measured run and what it takes to re-estimate it."""

    row_id: str
    experiment: str
    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
    plans: tuple[Plan, ...]  # candidates; Megatron rows leave the micro-batch size open
    measured_s: float  # inf for a run that failed (out of memory)


def reference_dir() -> Path:
    return bundled_dir() / "reference"


def rank_placement_plan(cluster: Cluster, tp: int, dp: int, layers: list[int],
                        micro_batches: int, recompute: str) -> Plan:
    hosts = cluster.hosts
    per_host = hosts[0].num_gpus
    stages = []
    for p, n_layers in enumerate(layers):
        replicas = []
        for d in range(dp):
            ranks = [t + tp * (d + dp * p) for t in range(tp)]
            host = {r // per_host for r in ranks}
            assert len(host) == 1, "a tensor-parallel group never spans hosts in these runs"
            replicas.append(Replica(hosts[ranks[0] // per_host].name,
                                    tuple(r % per_host for r in ranks)))
        stages.append(Stage(n_layers, tp, tuple(replicas)))
    return Plan(tuple(stages), micro_batches, recompute, 0)


def _dgx_a100(num_hosts: int) -> Cluster:
    """DGX A100 hosts: 8x A100-80GB on NVSwitch, 8x 200 Gb/s HDR, non-blocking fat tree."""
    spec = {
        "name": f"dgx-a100-{num_hosts}",
        "hosts": [{"name": "dgx", "count": num_hosts, "gpu": "A100-SXM4-80GB", "gpus": 8,
                   "nic_gbps": 1600}],
        "topology": {"kind": "leaf_spine", "hosts_per_leaf": 16, "spines": 4,
                     "uplink_gbps": "auto"},
    }
    return parse_cluster(spec, source=f"<dgx-a100-{num_hosts}>")


def _dgx_gpt_row(row: dict[str, str], recompute: str,
                 ) -> tuple[ModelSpec, TrainingSpec, Cluster]:
    """A published GPT run on DGX A100 hosts (the SC21 and Korthikanti tables share the
    columns): its model, its fp16 Megatron-LM training with one recompute mode, and its
    cluster."""
    heads = int(row["heads"])
    model = ModelSpec(name=f"gpt-{row['params_B']}B", layers=int(row["layers"]),
                      hidden=int(row["hidden"]), heads=heads, kv_heads=heads,
                      ffn_hidden=int(row["ffn_hidden"]), vocab=int(row["vocab"]),
                      seq_len=int(row["seq_len"]))
    training = TrainingSpec(global_batch=int(row["global_batch"]), precision="fp16",
                            recompute_modes=(recompute,), zero_stages=(0,),
                            framework="megatron-lm")
    return model, training, _dgx_a100(int(row["num_gpus"]) // int(row["gpus_per_host"]))


def megatron_runs() -> list[Run]:
    path = reference_dir() / "megatron_sc21_table1.csv"
    runs = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            model, training, cluster = _dgx_gpt_row(row, "full")
            layers = model.layers
            tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
            batch = training.global_batch
            per_replica = batch // dp
            plans = tuple(
                rank_placement_plan(cluster, tp, dp, [layers // pp] * pp, batch // (mbs * dp),
                                    "full")
                for mbs in (1, 2, 4, 8) if per_replica % mbs == 0)
            runs.append(Run(row["row_id"], "megatron", cluster, model, training, plans,
                            float(row["iter_time_s"])))
    return runs


def korthikanti_runs() -> list[Run]:
    """Korthikanti et al. (2022) Table 5: one plan per row, as published (micro-batch size
    given; the schedule is not stated, so plain 1F1B as for the SC21 rows)."""
    path = reference_dir() / "korthikanti_2022_table5.csv"
    runs = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            recompute = row["recompute"]
            model, training, cluster = _dgx_gpt_row(row, recompute)
            layers, batch, mbs = model.layers, training.global_batch, int(row["micro_batch"])
            tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
            plan = rank_placement_plan(cluster, tp, dp, [layers // pp] * pp,
                                       batch // (mbs * dp), recompute)
            plan = replace(plan, sequence_parallel=row["sequence_parallel"] == "true")
            runs.append(Run(row["row_id"], "korthikanti", cluster, model, training, (plan,),
                            float(row["iter_time_s"])))
    return runs


# The H100 rows its matmul efficiency is fitted on (``calibrate.fit_constants``): one model
# size each from 1B to 13B, all at 4,096 tokens. The other rows stay held out.
FSDP_FITTED = frozenset({"MPT-H100-1b-4k", "MPT-H100-3b-4k", "MPT-H100-7b-4k",
                         "MPT-H100-13b-4k"})


def fsdp_fitted_runs() -> list[Run]:
    """The llm-foundry rows the calibration fits (``FSDP_FITTED``)."""
    return [r for r in fsdp_runs() if r.row_id in FSDP_FITTED]


def fsdp_heldout_runs() -> list[Run]:
    """The llm-foundry rows never used in fitting."""
    return [r for r in fsdp_runs() if r.row_id not in FSDP_FITTED]


def fsdp_runs() -> list[Run]:
    """llm-foundry's MPT benchmarks (``llm_foundry_fsdp.csv``): one data-parallel stage over
    every GPU, ZeRO-3 (FSDP's full sharding), bf16, flash attention, full recomputation
    where the row used activation checkpointing, ``grad_accum`` micro-batches of
    ``micro_batch`` sequences per GPU. MPT has no biases, learned positions, a tied
    embedding and a 4h GELU MLP."""
    path = reference_dir() / "llm_foundry_fsdp.csv"
    runs = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            hidden, heads = int(row["hidden"]), int(row["heads"])
            model = ModelSpec(name=f"mpt-{row['model']}", layers=int(row["layers"]),
                              hidden=hidden, heads=heads, kv_heads=heads,
                              ffn_hidden=4 * hidden, vocab=int(row["vocab"]),
                              seq_len=int(row["seq_len"]), mlp="gelu", position="learned",
                              norm="layernorm", tied_embeddings=True, bias=False)
            recompute = "full" if row["activation_checkpointing"] == "true" else "none"
            training = TrainingSpec(global_batch=int(row["global_batch"]), precision="bf16",
                                    recompute_modes=(recompute,), zero_stages=(3,),
                                    flash_attention=True, framework="megatron-lm")
            per_host, gpus = int(row["gpus_per_host"]), int(row["num_gpus"])
            spec = {"name": f"{row['gpu']}-x{gpus}",
                    "hosts": [{"name": "node", "count": gpus // per_host, "gpu": row["gpu"],
                               "gpus": per_host, "nic_gbps": float(row["nic_gbps"])}],
                    "topology": {"kind": "single_switch"}}
            cluster = parse_cluster(spec, source=f"<{row['row_id']}>")
            replicas = tuple(Replica(h.name, (g,)) for h in cluster.hosts
                             for g in range(h.num_gpus))
            plan = Plan((Stage(model.layers, 1, replicas),), int(row["grad_accum"]),
                        recompute, 3)
            iter_time = int(row["global_batch_tokens"]) / float(row["tokens_per_s"])
            runs.append(Run(row["row_id"], "llm_foundry", cluster, model, training, (plan,),
                            iter_time))
    return runs


def amp_runs(experiment: str | None = None) -> list[Run]:
    path = reference_dir() / "amp_gpt2_16gpu.csv"
    model = load_model("gpt2-medium")
    training = TrainingSpec(global_batch=32, precision="fp16", recompute_modes=("none",),
                            zero_stages=(0,), framework="megatron-deepspeed")
    clusters = {"het_cluster": load_cluster("amp-het-16"),
                "homogeneous": load_cluster("amp-homo-16")}
    runs = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if experiment and row["experiment"] != experiment:
                continue
            cluster = clusters[row["experiment"]]
            mbs, tp, dp = int(row["micro_batch"]), int(row["tp"]), int(row["dp"])
            layers = [int(x) for x in row["layers_per_stage"].split()]
            plan = rank_placement_plan(cluster, tp, dp, layers, 32 // (mbs * dp), "none")
            measured = float(row["measured_iter_time_s"])
            runs.append(Run(row["row_id"], row["experiment"], cluster, model, training, (plan,),
                            measured if math.isfinite(measured) else math.inf))
    return runs
