"""Optimizer offload (``plan.offload``, ``costmodel/offload.py``): the plan format, the
validity rule, the memory and time laws, the exports and ``hetpar estimate --offload``."""

from __future__ import annotations

import dataclasses
import json

import pytest
from cli_helpers import assert_one_line_error, run
from hypothesis import assume, given

from hetpar import Plan, validate_plan
from hetpar.cluster import load_gpu_catalog, parse_cluster
from hetpar.costmodel.offload import HOST_OPTIMIZER_GBPS
from hetpar.errors import PlanError
from hetpar.runtime.export import export_plan, read_export
from hetpar.runtime.rules import runnable_by
from hetpar.workload import parse_model, parse_training
from tests.test_costmodel_laws import LAWS, instances
from tests.test_parallelism_options import REL, _with, cost_model, two_host_plan


def test_round_trip_and_version():
    _, _, _, plan = two_host_plan(zero=1, offload="optimizer")
    doc = plan.to_dict()
    assert doc["version"] == 2 and doc["offload"] == "optimizer"
    assert Plan.from_json(plan.to_json()) == plan
    assert "offload" not in dataclasses.replace(plan, offload="none").to_dict()
    assert "optimizer offloaded to the host" in plan.option_words()
    assert "offload-optimizer" in plan.describe()


@pytest.mark.parametrize("value, problem", [
    ("activations", "activation offload is not modelled"),
    ("nvme", "unknown offload 'nvme'"),
])
def test_unmodelled_offload_is_refused_by_name(value, problem):
    _, _, _, plan = two_host_plan(zero=1)
    doc = {**plan.to_dict(), "version": 2, "offload": value}
    with pytest.raises(PlanError, match=problem):
        Plan.from_dict(doc)


def test_version_1_refuses_offload():
    _, _, _, plan = two_host_plan(zero=1)
    doc = {**plan.to_dict(), "version": 1, "offload": "optimizer"}
    with pytest.raises(PlanError, match="needs plan version 2"):
        Plan.from_dict(doc)


def test_offload_needs_a_sharded_optimizer():
    cluster, model, training, plan = two_host_plan(offload="optimizer")
    assert plan.zero == 0
    with pytest.raises(PlanError, match="needs zero >= 1"):
        validate_plan(plan, cluster, model, training)
    validate_plan(dataclasses.replace(plan, zero=1), cluster, model, training)


def test_the_optimizer_states_leave_the_gpu_and_its_step_goes_to_the_host():
    """On one stage of one replica: the GPU keeps weights and gradients, and the step is
    the gradient down and the weights back over PCIe plus Adam over the host's memory
    bandwidth shared by its GPUs (costmodel/offload.py)."""
    cluster, model, training, plan = two_host_plan(zero=1)
    one = Plan.from_dict({"version": 2, "micro_batches": 4, "zero": 1, "stages": [
        {"layers": 8, "tp": 1, "replicas": [{"host": "h-0", "gpus": [0]}]}]})
    cm = cost_model(cluster, model, training, samples=0)
    base = cm.evaluate(one)
    off = cm.evaluate(dataclasses.replace(one, offload="optimizer"))
    params = base.stages[0].params_per_gpu
    fw, c = cm.framework, cm.constants
    assert base.stages[0].memory_bytes - off.stages[0].memory_bytes == pytest.approx(
        params * fw.optimizer_bytes, rel=1e-9)
    gpu = cluster.hosts[0].gpu
    step = (params * (c.grad_bytes + c.weight_bytes) / (gpu.pcie_GBps * 1e9)
            + params * c.optimizer_bytes_per_param * cluster.hosts[0].num_gpus
            / (HOST_OPTIMIZER_GBPS * 1e9))
    assert off.breakdown["optimizer"] == pytest.approx(step, rel=1e-9)
    # Nothing else moves.
    for key in ("pipeline_fill", "pipeline_steady", "dp_allreduce", "fixed_overhead"):
        assert off.breakdown[key] == base.breakdown[key]
    assert sum(off.breakdown.values()) == pytest.approx(off.iter_time_mean, rel=1e-9)


@LAWS
@given(instances())
def test_offload_never_needs_more_memory_nor_buys_time(inst):
    """On random clusters of the catalog's GPU types: less or equal memory on every GPU,
    and never a faster iteration (PCIe and host memory are slower than HBM)."""
    cluster, model, training, plan = inst
    base = _with(plan, cluster, model, training, zero=1)
    off = _with(plan, cluster, model, training, zero=1, offload="optimizer")
    assume(base is not None)
    assert off is not None
    for a, b in zip(base.memory, off.memory):
        assert b.used_bytes <= a.used_bytes * (1 + REL)
    assert off.iter_time_mean >= base.iter_time_mean * (1 - REL)


def test_every_catalog_gpu_steps_slower_on_its_host():
    """The law above for each bundled GPU type on a host of 8: the host step per
    parameter is slower than the HBM step."""
    for gpu in load_gpu_catalog().types.values():
        cluster = parse_cluster({"hosts": [{"name": "h", "gpu": gpu.name, "gpus": 8,
                                            "nic_gbps": 100}],
                                 "topology": {"kind": "single_switch"}})
        model = parse_model({"layers": 4, "hidden": 512, "heads": 8, "vocab": 8000,
                             "seq_len": 512})
        training = parse_training({"global_batch": 8})
        plan = Plan.from_dict({"version": 2, "micro_batches": 1, "zero": 1, "stages": [
            {"layers": 4, "tp": 1, "replicas": [{"host": "h", "gpus": [0]}]}]})
        cm = cost_model(cluster, model, training, samples=0)
        a = cm.evaluate(plan).breakdown["optimizer"]
        b = cm.evaluate(dataclasses.replace(plan, offload="optimizer")).breakdown["optimizer"]
        assert b > a, gpu.name


def test_a_model_that_fits_only_with_its_optimizer_on_the_host():
    """GPT-2 XL (1.56B) on one 24 GB RTX 4090: weights and gradients take 6 GiB, Adam's
    fp32 states 17 GiB more, so without offload it does not fit; with it, it does."""
    cluster = parse_cluster({"hosts": [{"name": "ws", "gpu": "RTX-4090-24GB", "gpus": 1,
                                        "nic_gbps": 10}],
                             "topology": {"kind": "single_switch"}})
    from hetpar.workload.model import load_model
    model = load_model("gpt2-xl")
    training = parse_training({"global_batch": 8, "recompute": ["full"]})
    plan = Plan.from_dict({"version": 2, "micro_batches": 8, "zero": 1, "recompute": "full",
                           "stages": [{"layers": model.layers, "tp": 1,
                                       "replicas": [{"host": "ws", "gpus": [0]}]}]})
    cm = cost_model(cluster, model, training, samples=0)
    assert not cm.evaluate(plan).feasible
    assert cm.evaluate(dataclasses.replace(plan, offload="optimizer")).feasible


def test_exports_say_offload_and_read_back(tmp_path):
    cluster, model, training, plan = two_host_plan(zero=1, offload="optimizer")
    validate_plan(plan, cluster, model, training)
    assert runnable_by(plan) == ("any", "megatron", "deepspeed")
    export_plan(plan, "megatron", tmp_path / "m", model, training)
    args = (tmp_path / "m" / "megatron.args").read_text().split()
    assert "--optimizer-cpu-offload" in args and "--use-distributed-optimizer" in args
    assert args[args.index("--optimizer-offload-fraction") + 1] == "1.0"
    assert read_export(tmp_path / "m", "megatron") == plan
    export_plan(plan, "torchrun", tmp_path / "t", model, training)
    assert read_export(tmp_path / "t", "torchrun") == plan
    export_plan(plan, "deepspeed", tmp_path / "d", model, training)
    cfg = json.loads((tmp_path / "d" / "ds_config.json").read_text())
    assert cfg["zero_optimization"] == {"stage": 1, "offload_optimizer": {
        "device": "cpu", "pin_memory": True}}
    assert read_export(tmp_path / "d", "deepspeed").offload == "optimizer"
    plain = dataclasses.replace(plan, offload="none")
    export_plan(plain, "deepspeed", tmp_path / "p", model, training)
    cfg = json.loads((tmp_path / "p" / "ds_config.json").read_text())
    assert "offload_optimizer" not in cfg["zero_optimization"]


def test_estimate_what_if_offload(tmp_path, capsys):
    plan_file = tmp_path / "plan.json"
    Plan.from_dict({"micro_batches": 2, "zero": 1, "stages": [
        {"layers": 24, "tp": 1, "replicas": [{"host": f"t4-{i}", "gpus": [g]}
                                             for i in range(4) for g in range(4)]}]}
                   ).save(plan_file)
    common = ["estimate", "--cluster", "amp-homo-16", "--model", "gpt2-medium", "--plan",
              str(plan_file), "--samples", "0", "--json"]
    code, out, _ = run(capsys, *common)
    assert code == 0
    base = json.loads(out)
    code, out, _ = run(capsys, *common, "--offload", "optimizer")
    assert code == 0
    off = json.loads(out)
    assert off["plan"]["offload"] == "optimizer" and off["plan"]["version"] == 2
    assert max(m["used_gib"] for m in off["memory"]) < max(m["used_gib"] for m in base["memory"])
    assert off["breakdown_s"]["optimizer"] > base["breakdown_s"]["optimizer"]
    code, out, _ = run(capsys, *common[:-1], "--offload", "optimizer")
    assert code == 0 and "optimizer step (host CPU and PCIe copies)" in out
    code, _, err = run(capsys, *common, "--offload", "optimizer", "--zero", "0")
    assert_one_line_error(code, err, "needs zero >= 1")


# ---- the searchers, where the training spec allows offload --------------------------------

def _wide_layer(offload):
    """``_one_wide_layer``'s instance (one 7-billion-parameter layer, eight 1-GPU A100-40GB
    hosts) with ZeRO 0 and 1 only: ZeRO-1 over 8 replicas needs 5.5 bytes per parameter
    and does not fit; with the optimizer on the host it needs 4."""
    from hetpar.problem.problem import Problem
    cluster = parse_cluster({"hosts": [{"name": "a", "count": 8, "gpu": "A100-SXM4-40GB",
                                        "gpus": 1, "nic_gbps": 200}],
                             "topology": {"kind": "single_switch"}})
    model = parse_model({"layers": 1, "hidden": 24576, "heads": 64, "vocab": 32000,
                         "seq_len": 512})
    training = parse_training({"global_batch": 8, "recompute": ["full"], "zero": [0, 1],
                               **({"offload": ["none", "optimizer"]} if offload else {})})
    return Problem.of(cluster, model, training, samples=0)


def test_the_training_spec_names_the_offload_plans_may_use():
    assert parse_training({"global_batch": 8}).offload_modes == ("none",)
    assert parse_training({"global_batch": 8, "offload": "optimizer"}).offload_modes == (
        "none", "optimizer")
    from hetpar.errors import ConfigError
    with pytest.raises(ConfigError, match="activation offload is not modelled"):
        parse_training({"global_batch": 8, "offload": ["activations"]})


def test_the_searchers_offload_only_where_nothing_fits_without():
    """Without offload in the spec the model fits nowhere; with it, the exact search
    proves an offloaded plan optimal and Metis and the Megatron-style baseline find ones
    no better; where a plan fits without offload, none offloads (it is never faster)."""
    from hetpar.errors import InfeasibleError
    from hetpar.solvers import solve
    for method in ("exact", "metis", "megatron"):
        with pytest.raises(InfeasibleError):
            solve(_wide_layer(False), method=method).plan  # noqa: B018
    megatron = solve(_wide_layer(True), method="megatron")
    assert megatron.found and megatron.plan.offload == "optimizer"
    exact = solve(_wide_layer(True), method="exact")
    assert exact.found and exact.certificate.optimal and exact.estimate.feasible
    assert exact.plan.offload == "optimizer" and exact.plan.zero == 1
    metis = solve(_wide_layer(True), method="metis")
    assert metis.found and metis.plan.offload == "optimizer"
    assert metis.details["offload_ladder"] == [1]
    assert exact.value <= metis.value and exact.value <= megatron.value
    # A model that fits without offload: the searches keep the optimizer on the GPUs.
    small = dataclasses.replace(_wide_layer(True), model=parse_model(
        {"layers": 1, "hidden": 8192, "heads": 64, "vocab": 32000, "seq_len": 512}))
    for method in ("exact", "metis", "megatron"):
        sol = solve(small, method=method)
        assert sol.found and sol.plan.offload == "none", method


def _tight_instance(seed: int):
    """``tests.test_solvers.tiny_instance`` with 16 GB GPUs and layers wide enough that
    the optimizer's states decide what fits, offload allowed."""
    import numpy as np
    rng = np.random.default_rng(500 + seed)
    hosts = [{"name": f"h{i}", "gpu": str(rng.choice(["T4-16GB", "V100-SXM2-16GB"])),
              "gpus": int(rng.choice([1, 2])), "nic_gbps": float(rng.choice([10, 100]))}
             for i in range(int(rng.integers(2, 4)))]
    cluster = parse_cluster({"hosts": hosts, "topology": {"kind": "single_switch"}})
    model = parse_model({"name": "wide", "layers": int(rng.integers(2, 5)),
                         "hidden": int(rng.choice([6144, 8192, 10240])), "heads": 32,
                         "vocab": 32000, "seq_len": 512})
    training = parse_training({"global_batch": int(rng.choice([2, 4])),
                               "recompute": ["full"], "zero": [0, 1],
                               "offload": ["none", "optimizer"]})
    return cluster, model, training


@pytest.mark.parametrize("seed", range(8))
def test_exact_equals_enumeration_with_offload_in_the_space(seed):
    """The exact search's bounds price memory with the optimizer on the host where the
    space allows it: it finds what enumerating every plan (offloaded ones included)
    finds, on instances where offload decides what fits."""
    from hetpar.problem.problem import Problem
    from hetpar.solvers import solve
    cluster, model, training = _tight_instance(seed)
    problem = Problem.of(cluster, model, training, samples=4, seed=seed)
    brute = solve(problem, method="brute")
    try:
        exact = solve(problem, method="exact")
    except Exception as exc:  # refused up front: then enumeration found nothing either
        assert not brute.found, exc
        return
    assert exact.value == pytest.approx(brute.value, rel=1e-9, abs=0.0)
    if brute.found:
        assert exact.certificate.optimal


def test_the_policy_says_it_does_not_offload(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(
        "name: a8\nhosts:\n  - {name: a, count: 8, gpu: A100-SXM4-40GB, gpus: 1, "
        "nic_gbps: 200}\ntopology: {kind: single_switch}\n")
    (tmp_path / "m.yaml").write_text(
        "name: wide\nlayers: 1\nhidden: 24576\nheads: 64\nvocab: 32000\nseq_len: 512\n")
    (tmp_path / "t.yaml").write_text(
        "name: host-optimizer\nglobal_batch: 8\nrecompute: [full]\nzero: [0, 1]\n"
        "offload: [none, optimizer]\n")
    files = ["--cluster", str(tmp_path / "c.yaml"), "--model", str(tmp_path / "m.yaml"),
             "--training", str(tmp_path / "t.yaml")]
    code, _, err = run(capsys, "plan", *files, "--no-improve")
    assert_one_line_error(code, err, "the policy does not offload it")
    code, out, _ = run(capsys, "solve", "--method", "metis", *files, "--json")
    assert code == 0 and json.loads(out)["plan"]["offload"] == "optimizer"
