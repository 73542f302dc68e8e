"""``hetpar export``: the files that launch a plan with Megatron-LM, DeepSpeed or bare torchrun.

Each format writes into one folder:

* ``megatron``: ``megatron.args`` (Megatron-LM's parallelism, batch, recompute, optimizer
  and model-shape arguments, one per line), ``hostfile``, ``launch.sh`` (one torchrun line
  per host, with ``CUDA_VISIBLE_DEVICES`` listing the plan's GPUs in local-rank order),
  ``ranks.json`` (every global rank's host, GPU, stage, data- and tensor-parallel rank)
  and ``README.md``;
* ``deepspeed``: ``ds_config.json``, ``pipeline.json`` (stages, partition method and the
  layer counts it gives), ``hostfile``, ``launch.sh`` (the ``deepspeed`` launcher with
  ``--include``), ``ranks.json``, ``plan.json`` (the plan with each host's GPUs numbered
  in rank order, as DeepSpeed's launcher sorts them) and ``README.md``;
* ``torchrun``: ``launch.sh``, ``ranks.json`` and ``README.md`` for a training script of
  the user's own that builds its groups in Megatron's tp-dp-pp order.

``read_export`` parses a folder back into the plan it launches: the round trip is how the
tests check that the files say what the plan says.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpar.errors import ConfigError, PlanError
from hetpar.plan import Plan
from hetpar.runtime.launch import (HostLaunch, Launch, check_layout, launch_layout,
                                   plan_from_layout)
from hetpar.runtime.rules import uniform_split
from hetpar.workload.model import ModelSpec
from hetpar.workload.training import TrainingSpec

__all__ = ["FORMATS", "export_plan", "read_export", "megatron_args"]

FORMATS = ("megatron", "deepspeed", "torchrun")
_RUNTIME_OF = {"megatron": "megatron", "deepspeed": "deepspeed", "torchrun": "megatron"}
MASTER_PORT = 29500


@dataclass(frozen=True)
class _Context:
    plan: Plan
    launch: Launch
    model: ModelSpec
    training: TrainingSpec

    @property
    def data_parallel(self) -> int:
        """Data-parallel replicas: the launch's TP blocks per stage over the context
        parallelism (Megatron-LM's rank order puts a group's blocks side by side)."""
        return self.launch.dp // self.plan.context_parallel

    @property
    def micro_batch_size(self) -> int:
        return self.training.global_batch // (self.plan.micro_batches * self.data_parallel)

    @property
    def seq_len(self) -> int:
        return self.training.seq_len or self.model.seq_len


def _context(plan: Plan, fmt: str, model: ModelSpec, training: TrainingSpec) -> _Context:
    if fmt not in FORMATS:
        raise ConfigError("--format", "", f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    try:
        launch = launch_layout(plan, _RUNTIME_OF[fmt], sorted_gpus=fmt == "deepspeed")
    except PlanError as exc:
        raise PlanError(exc.source, exc.field, f"{fmt} export: {exc.problem}") from None
    ctx = _Context(plan, launch, model, training)
    dp = ctx.data_parallel
    if training.global_batch % (plan.micro_batches * dp):
        raise PlanError("<plan>", "micro_batches", f"{fmt} export: global batch "
                        f"{training.global_batch} is not micro_batches x dp = "
                        f"{plan.micro_batches} x {dp} times a whole micro-batch size")
    return ctx


# ---- Megatron-LM ---------------------------------------------------------------------------
def megatron_args(plan: Plan, model: ModelSpec, training: TrainingSpec) -> list[str]:
    """Megatron-LM's arguments for ``plan`` (``pretrain_gpt.py``), one flag or value per
    item. Data, tokenizer, learning-rate and checkpoint arguments are the user's."""
    ctx = _context(plan, "megatron", model, training)
    return _megatron_args(ctx)


def _megatron_args(ctx: _Context) -> list[str]:
    plan, model, training, launch = ctx.plan, ctx.model, ctx.training, ctx.launch
    args = ["--tensor-model-parallel-size", str(launch.tp),
            "--pipeline-model-parallel-size", str(launch.pp)]
    if plan.context_parallel > 1:
        args += ["--context-parallel-size", str(plan.context_parallel)]
    split = [s.layers for s in plan.stages]
    if launch.pp > 1 and len(set(split)) > 1:
        # Megatron-LM gives the first and last stage their own counts; the rest split
        # the remaining layers evenly.
        if launch.pp == 2 or split[0] != split[1]:
            args += ["--decoder-first-pipeline-num-layers", str(split[0])]
        if launch.pp > 2 and split[-1] != split[1]:
            args += ["--decoder-last-pipeline-num-layers", str(split[-1])]
    args += ["--micro-batch-size", str(ctx.micro_batch_size),
             "--global-batch-size", str(training.global_batch),
             "--num-layers", str(model.layers), "--hidden-size", str(model.hidden),
             "--num-attention-heads", str(model.heads), "--ffn-hidden-size", str(model.ffn_hidden),
             "--seq-length", str(ctx.seq_len), "--max-position-embeddings", str(ctx.seq_len)]
    if model.kv_heads != model.heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.mlp == "swiglu":
        args.append("--swiglu")
    if model.position == "rope":
        args += ["--position-embedding-type", "rope"]
    if model.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.bias:
        args.append("--disable-bias-linear")
    args.append("--bf16" if training.precision == "bf16" else "--fp16")
    if plan.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif plan.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    if plan.zero >= 1:
        args.append("--use-distributed-optimizer")
    if plan.offload == "optimizer":
        # Megatron Core's CPU offload of the distributed optimizer, all of it.
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0",
                 "--use-precision-aware-optimizer"]
    if plan.sequence_parallel:
        args.append("--sequence-parallel")
    if plan.virtual_stages > 1:
        args += ["--num-layers-per-virtual-pipeline-stage",
                 str(model.layers // (launch.pp * plan.virtual_stages))]
    if training.flash_attention:
        args.append("--use-flash-attn")
    return args


def _torchrun_lines(launch: Launch, script: str) -> list[str]:
    lines = ['case "$NODE" in']
    n = len(launch.hosts)
    for i, h in enumerate(launch.hosts):
        devices = ",".join(map(str, h.gpus))
        lines.append(f"  # node {i}: {len(h.gpus)} processes, global ranks "
                     f"{sum(len(x.gpus) for x in launch.hosts[:i])}-"
                     f"{sum(len(x.gpus) for x in launch.hosts[:i + 1]) - 1}")
        lines.append(f"  {shlex.quote(h.host)}) CUDA_VISIBLE_DEVICES={devices} "
                     f"torchrun --nnodes {n} --node-rank {i} --nproc-per-node {len(h.gpus)} "
                     f"--master-addr \"$MASTER_ADDR\" --master-port {MASTER_PORT} {script} ;;")
    lines += ['  *) echo "NODE=$NODE is not a host of this plan" >&2; exit 2 ;;', "esac"]
    return lines


def _ranks(launch: Launch, cp: int = 1) -> list[dict[str, Any]]:
    """Every rank's host, GPU and group ranks in Megatron-LM's order tp-cp-dp-pp (the
    launch's ``dp`` counts TP blocks per stage: data-parallel times context-parallel)."""
    devices = launch.devices()
    out = []
    for rank, (host, gpu) in enumerate(devices):
        tp_rank = rank % launch.tp
        block = (rank // launch.tp) % launch.dp
        pp_rank = rank // (launch.tp * launch.dp)
        row = {"rank": rank, "host": host, "gpu": gpu, "stage": pp_rank,
               "dp_rank": block // cp, "tp_rank": tp_rank}
        if cp > 1:
            row["cp_rank"] = block % cp
        out.append(row)
    return out


def _hostfile(launch: Launch) -> str:
    return "".join(f"{h.host} slots={len(h.gpus)}\n" for h in launch.hosts)


def _launch_head(per_host: bool) -> str:
    if per_host:
        how = ("Run this file on every host with NODE set to the host's name\n# as the plan "
               "names it and MASTER_ADDR to node 0's address; each host runs its own case.")
        need = ': "${NODE:?set NODE to this host\'s name}" "${MASTER_ADDR:?set MASTER_ADDR to node 0}"'
    else:
        how = ("Run this file once, on node 0, with MASTER_ADDR set to its address\n# (the "
               "deepspeed launcher starts the other hosts over ssh).")
        need = ': "${MASTER_ADDR:?set MASTER_ADDR to node 0}"'
    return f"#!/usr/bin/env bash\n# Written by hetpar export. {how}\nset -euo pipefail\n{need}\n"


def _write(folder: Path, files: dict[str, str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in files.items():
        path = folder / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        if name.endswith(".sh"):
            path.chmod(0o755)
        out.append(path)
    return out


def export_plan(plan: Plan, fmt: str, folder: str | Path, model: ModelSpec,
                training: TrainingSpec, cluster_name: str = "") -> list[Path]:
    """Write the files that launch ``plan`` with ``fmt`` into ``folder``; PlanError (one
    line naming the rule) when the format cannot express the plan. Returns the paths."""
    ctx = _context(plan, fmt, model, training)
    problems = check_layout(plan if fmt != "deepspeed" else _renumbered(ctx), ctx.launch)
    if problems:  # a bug of the layout, never the user's: fail loudly
        raise AssertionError(f"launch layout disagrees with the plan: {problems[0]}")
    launch = ctx.launch
    cp = plan.context_parallel
    ranks = json.dumps({"format": f"hetpar-{fmt}-ranks", "tp": launch.tp, "cp": cp,
                        "dp": ctx.data_parallel, "pp": launch.pp,
                        "ranks": _ranks(launch, cp)}, indent=1) + "\n"
    what = (f"{cluster_name + ' / ' if cluster_name else ''}{model.name}: "
            f"tp {launch.tp} x {f'cp {cp} x ' if cp > 1 else ''}dp {ctx.data_parallel} x "
            f"pp {launch.pp} on {launch.world_size} GPUs of "
            f"{len(launch.hosts)} hosts, layers {'/'.join(str(s.layers) for s in plan.stages)}, "
            f"{plan.micro_batches} micro-batches of {ctx.micro_batch_size} sequences per "
            f"replica, recompute {plan.recompute}, ZeRO {plan.zero}"
            f"{''.join(', ' + w for w in plan.option_words())}")
    files: dict[str, str]
    if fmt == "megatron":
        args = _megatron_args(ctx)
        files = {
            "megatron.args": "".join(f"{a}\n" for a in args),
            "hostfile": _hostfile(launch),
            "launch.sh": _launch_head(True) + "\n".join(_torchrun_lines(
                launch, 'pretrain_gpt.py $(cat "$(dirname "$0")/megatron.args") "$@"')) + "\n",
            "ranks.json": ranks,
            "README.md": _readme_megatron(what),
        }
    elif fmt == "deepspeed":
        files = {
            "ds_config.json": json.dumps(_ds_config(ctx), indent=1) + "\n",
            "pipeline.json": json.dumps(_ds_pipeline(ctx), indent=1) + "\n",
            "hostfile": _hostfile(launch),
            "launch.sh": _launch_head(False)
            + "deepspeed --hostfile \"$(dirname \"$0\")/hostfile\" --include "
              f"{shlex.quote(_ds_include(launch))} --master_addr \"$MASTER_ADDR\" "
              f"--master_port {MASTER_PORT} train.py --deepspeed_config "
              "\"$(dirname \"$0\")/ds_config.json\" \"$@\"\n",
            "ranks.json": ranks,
            "plan.json": _renumbered(ctx).to_json() + "\n",
            "README.md": _readme_deepspeed(what),
        }
    else:
        files = {
            "launch.sh": _launch_head(True) + "\n".join(_torchrun_lines(launch, 'train.py "$@"')) + "\n",
            "ranks.json": ranks,
            "plan.json": plan.to_json() + "\n",
            "README.md": _readme_torchrun(what),
        }
    return _write(Path(folder), files)


# ---- DeepSpeed -------------------------------------------------------------------------------
def _renumbered(ctx: _Context) -> Plan:
    """The plan with each host's GPUs renumbered in rank order (DeepSpeed sorts the slots
    of ``--include``), as the launch runs it."""
    return plan_from_layout(ctx.launch, [s.layers for s in ctx.plan.stages],
                            ctx.plan.micro_batches, ctx.plan.recompute, ctx.plan.zero,
                            ctx.plan.sequence_parallel, ctx.plan.virtual_stages,
                            ctx.plan.context_parallel, ctx.plan.offload)


def _ds_include(launch: Launch) -> str:
    return "@".join(f"{h.host}:{','.join(map(str, h.gpus))}" for h in launch.hosts)


def _ds_config(ctx: _Context) -> dict[str, Any]:
    prec = "bf16" if ctx.training.precision == "bf16" else "fp16"
    zero: dict[str, Any] = {"stage": ctx.plan.zero}
    if ctx.plan.offload == "optimizer":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {"train_batch_size": ctx.training.global_batch,
            "train_micro_batch_size_per_gpu": ctx.micro_batch_size,
            "gradient_accumulation_steps": ctx.plan.micro_batches,
            "zero_optimization": zero,
            prec: {"enabled": True}}


def _ds_pipeline(ctx: _Context) -> dict[str, Any]:
    return {"num_stages": ctx.launch.pp, "model_parallel_size": ctx.launch.tp,
            "data_parallel_size": ctx.launch.dp, "partition_method": "uniform",
            "transformer_layers_per_stage": [s.layers for s in ctx.plan.stages],
            "activation_checkpoint": ctx.plan.recompute}


# ---- reading an export back ---------------------------------------------------------------------
def _parse_launch(text: str) -> list[tuple[str, tuple[int, ...], int, int]]:
    """(host, GPUs, node rank, processes) of every torchrun line of a launch.sh."""
    out = []
    for line in text.splitlines():
        if "torchrun" not in line or line.lstrip().startswith("#"):
            continue
        # Up to the launcher's own options: the training script's arguments follow.
        pattern, command = line.split(")", 1)
        host = shlex.split(pattern)[0]
        words = shlex.split(command.split(" --master-addr")[0])
        env = next(w for w in words if w.startswith("CUDA_VISIBLE_DEVICES="))
        gpus = tuple(int(g) for g in env.split("=", 1)[1].split(","))
        node = int(words[words.index("--node-rank") + 1])
        nproc = int(words[words.index("--nproc-per-node") + 1])
        out.append((host, gpus, node, nproc))
    return out


def _arg(args: list[str], flag: str, default: int | None = None) -> int | None:
    return int(args[args.index(flag) + 1]) if flag in args else default


def read_export(folder: str | Path, fmt: str) -> Plan:
    """The plan an export folder launches (the inverse of ``export_plan``)."""
    folder = Path(folder)
    if fmt == "deepspeed":
        cfg = json.loads((folder / "ds_config.json").read_text())
        pipe = json.loads((folder / "pipeline.json").read_text())
        launch_text = (folder / "launch.sh").read_text()
        include = shlex.split(launch_text[launch_text.index("--include"):])[1]
        hosts = []
        for spec in include.split("@"):
            name, slots = spec.split(":")
            hosts.append(HostLaunch(name, tuple(sorted(int(s) for s in slots.split(",")))))
        pp, tp = pipe["num_stages"], pipe["model_parallel_size"]
        world = sum(len(h.gpus) for h in hosts)
        launch = Launch(tuple(hosts), tp, world // (tp * pp), pp)
        layers = list(pipe["transformer_layers_per_stage"])
        if pipe["partition_method"] == "uniform" and layers != list(
                uniform_split(sum(layers), pp)):
            raise PlanError(str(folder), "pipeline.json", "layer counts are not DeepSpeed's "
                                                          "uniform partition")
        rc = pipe["activation_checkpoint"]
        offload = "optimizer" if cfg["zero_optimization"].get(
            "offload_optimizer", {}).get("device") == "cpu" else "none"
        return plan_from_layout(launch, layers, cfg["gradient_accumulation_steps"], rc,
                                cfg["zero_optimization"]["stage"], offload=offload)
    nodes = sorted(_parse_launch((folder / "launch.sh").read_text()), key=lambda n: n[2])
    hosts = [HostLaunch(h, g) for h, g, _, _ in nodes]
    if fmt == "torchrun":
        # The launch lines place the ranks; the layer split and batch are the plan file's.
        ranks = json.loads((folder / "ranks.json").read_text())
        plan = Plan.load(folder / "plan.json")
        blocks = ranks["dp"] * ranks.get("cp", 1)
        return plan_from_layout(Launch(tuple(hosts), ranks["tp"], blocks, ranks["pp"]),
                                [s.layers for s in plan.stages], plan.micro_batches,
                                plan.recompute, plan.zero, plan.sequence_parallel,
                                plan.virtual_stages, plan.context_parallel, plan.offload)
    args = (folder / "megatron.args").read_text().split()
    tp = _arg(args, "--tensor-model-parallel-size", 1)
    pp = _arg(args, "--pipeline-model-parallel-size", 1)
    assert tp is not None and pp is not None
    world = sum(len(h.gpus) for h in hosts)
    dp = world // (tp * pp)
    layers_total = _arg(args, "--num-layers")
    assert layers_total is not None
    first = _arg(args, "--decoder-first-pipeline-num-layers")
    last = _arg(args, "--decoder-last-pipeline-num-layers")
    split = _megatron_split(layers_total, pp, first, last)
    gbs, mbs = _arg(args, "--global-batch-size"), _arg(args, "--micro-batch-size")
    assert gbs is not None and mbs is not None
    recompute = "none"
    if "--recompute-granularity" in args:
        recompute = args[args.index("--recompute-granularity") + 1]
    zero = 1 if "--use-distributed-optimizer" in args else 0
    chunk = _arg(args, "--num-layers-per-virtual-pipeline-stage")
    virtual = layers_total // (pp * chunk) if chunk else 1
    cp = _arg(args, "--context-parallel-size", 1)
    assert cp is not None
    return plan_from_layout(Launch(tuple(hosts), tp, dp, pp), split,
                            gbs // (mbs * (dp // cp)), recompute, zero,
                            "--sequence-parallel" in args, virtual, cp,
                            "optimizer" if "--optimizer-cpu-offload" in args else "none")


def _megatron_split(layers: int, pp: int, first: int | None, last: int | None) -> list[int]:
    """Megatron-LM's layer counts per stage for these arguments."""
    if pp == 1:
        return [layers]
    middle_stages = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if middle_stages == 0:
        return [first or 0, last or 0]
    if rest % middle_stages:
        raise PlanError("megatron.args", "--num-layers", f"{rest} layers do not split evenly "
                                                         f"over {middle_stages} stages")
    mid = rest // middle_stages
    return ([first] if first is not None else [mid]) + [mid] * (pp - 2) + (
        [last] if last is not None else [mid])


# ---- READMEs -----------------------------------------------------------------------------------
def _readme_megatron(what: str) -> str:
    return f"""# Megatron-LM launch, written by `hetpar export`

Plan: {what}.

* `megatron.args`: Megatron-LM's arguments for this plan, one per line: parallel degrees
  (`--tensor-model-parallel-size`, `--pipeline-model-parallel-size`, and
  `--decoder-first/last-pipeline-num-layers` where the first or last stage holds its own
  count), micro and global batch, model shape, precision, recompute,
  `--use-distributed-optimizer` (ZeRO-1), `--optimizer-cpu-offload` with
  `--optimizer-offload-fraction 1.0` and `--use-precision-aware-optimizer` (the optimizer
  on the host CPU), `--sequence-parallel` and `--num-layers-per-virtual-pipeline-stage`
  (the interleaved schedule) where the plan uses them. Add your data, tokenizer,
  optimizer and checkpoint arguments after them.
* `hostfile`: the hosts in node-rank order and the processes each runs.
* `launch.sh`: one `torchrun` line per host. torchrun numbers global ranks node by node
  (each node's ranks follow the local world sizes of the nodes before it), and
  `CUDA_VISIBLE_DEVICES` puts local rank k on the k-th GPU listed, so rank r runs on the
  host and GPU `ranks.json` gives. Megatron-LM then forms its groups in its default order
  tp-dp-pp: rank = tp_rank + tp x (dp_rank + dp x stage), so each pipeline stage and each
  tensor-parallel group lands on the GPUs the plan names. Keep Megatron's default rank
  order (do not pass `--use-tp-pp-dp-mapping`).
* `ranks.json`: every global rank's host, GPU, stage, data-parallel and tensor-parallel
  rank.
"""


def _readme_deepspeed(what: str) -> str:
    return f"""# DeepSpeed launch, written by `hetpar export`

Plan: {what}.

* `ds_config.json`: batch (`train_batch_size`, `train_micro_batch_size_per_gpu`,
  `gradient_accumulation_steps` = the plan's micro-batch count), ZeRO stage (with
  `offload_optimizer` on the CPU where the plan offloads the optimizer), precision.
* `pipeline.json`: what your `PipelineModule` must be built with: `num_stages`,
  `partition_method='uniform'` over the transformer layers (the first `L mod p` stages hold
  one layer more), and the model-parallel (TP) degree for a
  `PipeModelDataParallelTopology(num_pp, num_mp, num_dp)`, whose axes pipe, data, model
  give rank = tp_rank + tp x (dp_rank + dp x stage).
* `hostfile`, `launch.sh`: the `deepspeed` launcher with `--include` naming each host's
  GPUs. DeepSpeed sorts each host's slots and numbers ranks host by host in hostfile
  order, so `plan.json` is the plan with each host's GPUs renumbered in that order (the
  same stages on the same hosts; the cost model scores it the same).
* `ranks.json`: every global rank's host, GPU, stage, data-parallel and tensor-parallel
  rank.
"""


def _readme_torchrun(what: str) -> str:
    return f"""# torchrun launch, written by `hetpar export`

Plan: {what}.

* `plan.json`: the plan (layer split, micro-batches, recompute, ZeRO).
* `launch.sh`: one `torchrun` line per host; rank r runs on the host and GPU `ranks.json`
  gives (torchrun numbers ranks node by node; `CUDA_VISIBLE_DEVICES` orders the GPUs).
* `ranks.json`: every rank's stage, data-parallel and tensor-parallel rank, in
  Megatron's order tp-dp-pp (rank = tp_rank + tp x (dp_rank + dp x stage)); build your
  process groups from it.
"""

