"""Topology suites: deterministic, within their family, feasible, and saved/loaded exactly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import hetpar
from hetpar.cli.main import main
from hetpar.costmodel.estimate import CostModel
from hetpar.problem.generator import (Suite, describe_instance, feasible_plan, is_instances_file,
                                   list_suites, load_instances, load_suite, save_instances)
from hetpar.errors import ConfigError
from hetpar.problem import Problem
from hetpar.problem.space import PlanSpace

SUITES = ["tiny", "train-small", "train-mixed", "test-iid", "test-larger", "test-unseen-gpus",
          "test-geo", "test-hard"]
N = 20


@pytest.fixture(scope="module")
def suites() -> dict[str, Suite]:
    return {name: load_suite(name) for name in SUITES}


def test_bundled_suites_are_listed():
    assert set(SUITES) <= set(list_suites())


def test_same_seed_same_documents(suites):
    for name in SUITES:
        again = load_suite(name)
        for i in (0, 7, 123):
            a, b = suites[name].instance(i), again.instance(i)
            assert a.to_dict() == b.to_dict()
            assert a.seed == b.seed and a.seed >= 0


def test_instances_differ_and_seeds_separate_families(suites):
    docs = [json.dumps(inst.to_dict()["cluster"], sort_keys=True)
            for inst in suites["train-small"].instances(N)]
    assert len(set(docs)) == N
    # test-iid is the same family with another seed: no instance coincides.
    iid = {json.dumps(inst.cluster_doc | {"name": "", "description": ""}, sort_keys=True)
           for inst in suites["test-iid"].instances(N)}
    train = {json.dumps(inst.cluster_doc | {"name": "", "description": ""}, sort_keys=True)
             for inst in suites["train-small"].instances(N)}
    assert not iid & train
    a, b = suites["train-small"].spec, suites["test-iid"].spec
    assert a.seed != b.seed
    assert (a.hosts, a.gpu_types, a.network, a.bandwidth, a.models) == (
        b.hosts, b.gpu_types, b.network, b.bandwidth, b.models)


def test_train_mixed_has_slow_fabrics_but_stays_apart_from_the_test_suites(suites):
    """The shipped policy's training family: some racks joined by a few Gb/s, but never the
    geo shape (test-geo) nor 8 or more hosts (test-larger)."""
    mixed = suites["train-mixed"]
    assert "geo" not in mixed.spec.network.shapes
    assert mixed.spec.hosts[1] < suites["test-larger"].spec.hosts[0]
    slowest = []
    for inst in mixed.instances(60):
        fabric = [lk.capacity_gbps for lk in inst.cluster.links
                  if lk.a not in inst.cluster.host_index and lk.b not in inst.cluster.host_index]
        if fabric:
            slowest.append(min(fabric))
    assert slowest and min(slowest) < 10 < max(slowest)
    # Fabric latencies stay below test-geo's WAN links (10-70 ms).
    assert mixed.spec.network.fabric_latency_us[1] < 10_000


def test_sample_uses_only_the_given_generator(suites):
    s = suites["train-small"]
    a = [s.sample(np.random.default_rng(5)).to_dict() for _ in range(2)]
    assert a[0] == a[1]
    np.random.seed(0)
    x = s.sample(np.random.default_rng(9)).to_dict()
    np.random.seed(1)
    assert s.sample(np.random.default_rng(9)).to_dict() == x
    assert s.instances(3, start=4)[1].to_dict() == s.instance(5).to_dict()


@pytest.mark.parametrize("name", SUITES)
def test_first_instances_parse_and_respect_the_family(suites, name):
    suite = suites[name]
    spec = suite.spec
    allowed = {c.type: c for c in spec.gpu_types}
    model_names = set(spec.models)
    for i, inst in enumerate(suite.instances(N)):
        cluster, model, training = inst.cluster, inst.model, inst.training
        n = len(cluster.hosts)
        assert spec.hosts[0] <= n <= spec.hosts[1] <= suite.max_hosts
        assert inst.num_hosts <= suite.max_hosts
        types = {h.gpu.name for h in cluster.hosts}
        assert types <= set(allowed)
        assert spec.types_per_instance[0] <= len(types) <= spec.types_per_instance[1]
        for h in cluster.hosts:
            assert h.num_gpus in allowed[h.gpu.name].gpus
            assert h.nic_gbps in allowed[h.gpu.name].nic_gbps
        assert model.name in model_names
        assert training.global_batch in spec.training.global_batch
        assert inst.meta["suite"] == name and inst.meta["index"] == i
        shape = inst.meta["shape"]
        assert shape in spec.network.shapes
        caps = np.array([lk.capacity_gbps for lk in cluster.links])
        bw = cluster.sample_link_bandwidth(np.random.default_rng(i), 16)
        assert np.all(bw > 0) and np.all(bw <= caps + 1e-9)
        for lk in cluster.links:
            if lk.a in cluster.host_index or lk.b in cluster.host_index:
                assert lk.bandwidth.cv() <= spec.bandwidth.cv[1] + 1e-9
        fabric = [lk for lk in cluster.links
                  if lk.a not in cluster.host_index and lk.b not in cluster.host_index]
        if shape == "single_switch":
            assert len(cluster.switches) == 1 and not fabric
        elif shape == "leaf_spine":
            assert len(fabric) == inst.meta["leaves"] >= 2
            assert "spine" in cluster.switches
        else:
            sites = inst.meta["sites"]
            assert spec.network.sites[0] <= sites <= spec.network.sites[1]
            assert len(fabric) == sites * (sites - 1) // 2
            (glo, ghi), (llo, lhi) = spec.network.wan_gbps, spec.network.wan_latency_ms
            for lk in fabric:
                assert glo <= lk.capacity_gbps <= ghi
                assert llo / 1e3 <= lk.latency_s <= lhi / 1e3
                assert lk.bandwidth.cv() > 0
            # Hosts on different sites talk across a WAN link, with tens of ms.
            for a, ha in enumerate(cluster.hosts):
                for b, hb in enumerate(cluster.hosts):
                    if ha.switch != hb.switch:
                        assert cluster.route_latency_s[a, b] >= llo / 1e3


def test_family_figures():
    train = load_suite("train-small").spec
    assert (train.hosts, train.types_per_instance, train.max_hosts) == ((2, 6), (2, 3), 8)
    assert set(train.network.shapes) == {"single_switch", "leaf_spine"}
    assert train.bandwidth.cv == (0.0, 0.5)
    sizes = [hetpar.load_model(m).total_params for m in train.models]
    assert 0.1e9 <= min(sizes) <= 0.15e9 and 6e9 <= max(sizes) <= 7.5e9
    larger = load_suite("test-larger")
    assert larger.spec.hosts == (8, 16) and larger.max_hosts == 16
    unseen = load_suite("test-unseen-gpus").spec
    train_types = {c.type for c in train.gpu_types}
    assert not train_types & {c.type for c in unseen.gpu_types}
    assert len(unseen.gpu_types) >= 3
    geo = load_suite("test-geo").spec
    assert geo.network.shapes == ("geo",) and geo.network.sites == (2, 4)
    assert geo.network.wan_latency_ms == (10.0, 70.0)
    tiny = load_suite("tiny").spec
    assert tiny.hosts[1] <= 3 and max(g for c in tiny.gpu_types for g in c.gpus) <= 4
    for spec in (train, unseen, geo, tiny, larger.spec):
        for b in spec.training.global_batch:
            assert 8 <= b <= 512 and b & (b - 1) == 0


def test_test_hard_is_unlike_the_training_family(suites):
    """Held out by construction: 64-128 GPUs, vendor mixes, consumer GPUs on Ethernet and
    three or more WAN regions, none of which the training family has."""
    hard, mixed = suites["test-hard"], suites["train-mixed"].spec
    amd = {"MI300X-192GB", "MI250X-GCD"}
    consumer = {"RTX-4090-24GB", "RTX-3090-24GB"}
    assert hard.spec.hosts[0] > mixed.hosts[1] and hard.spec.network.sites[0] >= 3
    seen = {"vendor mix": 0, "consumer on Ethernet": 0, "geo": 0}
    for inst in hard.instances(N):
        cluster = inst.cluster
        assert 64 <= cluster.num_gpus <= 128
        types = {h.gpu.name for h in cluster.hosts}
        seen["vendor mix"] += bool(types & amd) and bool(types - amd)
        seen["consumer on Ethernet"] += any(h.gpu.name in consumer and h.nic_gbps <= 25
                                            for h in cluster.hosts)
        if inst.meta["shape"] == "geo":
            seen["geo"] += 1
            assert inst.meta["sites"] >= 3
    assert all(count >= 3 for count in seen.values()), seen


@pytest.mark.parametrize("name", SUITES)
def test_every_instance_has_a_feasible_plan(suites, name):
    for inst in suites[name].instances(8, start=100):
        plan = feasible_plan(inst)
        assert plan is not None
        cm = CostModel(inst.cluster, inst.model, inst.training, samples=2)
        est = cm.evaluate(plan)
        assert est.feasible, inst.name
        Problem.from_instance(inst, samples=2).check_fits_somewhere()


def test_model_size_is_capped_by_cluster_memory(tmp_path):
    # Only 1-GPU T4 hosts: the 6.7B model never fits, the small one always does.
    doc = yaml.safe_load((Path(load_suite("tiny").source)).read_text())
    doc.update(name="t4-only", hosts=[2, 2], types_per_instance=[1, 1],
               gpu_types=[{"type": "T4-16GB", "gpus": [1], "nic_gbps": [25]}],
               models=["gpt3-6.7b", "gpt3-125m"])
    path = tmp_path / "t4.yaml"
    path.write_text(yaml.safe_dump(doc))
    suite = load_suite(path)
    assert {inst.model.name for inst in suite.instances(10)} == {"gpt3-125m"}
    doc["models"] = ["gpt3-6.7b"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="no model of the suite fits"):
        load_suite(path)


def test_generation_is_fast(suites):
    for name in ("train-small", "test-larger"):
        start = time.perf_counter()
        suites[name].instances(200)
        per = (time.perf_counter() - start) / 200
        assert per < 5e-3, f"{name}: {per * 1e3:.2f} ms per instance"


# ---- save / load -----------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_save_load_round_trip(tmp_path, suites, suffix):
    items = suites["test-geo"].instances(5) + suites["test-larger"].instances(2)
    path = save_instances(tmp_path / f"set{suffix}", items, suite="mixed", max_hosts=16)
    assert is_instances_file(path)
    back = load_instances(path)
    assert [b.to_dict() for b in back] == [a.to_dict() for a in items]
    for a, b in zip(items, back):
        assert np.array_equal(a.cluster.route_latency_s, b.cluster.route_latency_s)
        assert a.model == b.model and a.training == b.training
    fixed = load_suite(path)
    assert (fixed.name, fixed.max_hosts, fixed.size) == ("mixed", 16, 7)
    assert fixed.instance(3).to_dict() == items[3].to_dict()
    assert fixed.sample(np.random.default_rng(0)).name in {i.name for i in items}


def test_from_instances(suites):
    items = suites["tiny"].instances(3)
    s = Suite.from_instances("mine", items)
    assert s.max_hosts == max(i.num_hosts for i in items) and s.size == 3
    assert s.instances(2, start=1)[0] is items[1]
    with pytest.raises(ConfigError, match="more than max_hosts"):
        Suite.from_instances("mine", suites["test-larger"].instances(1), max_hosts=4)
    with pytest.raises(ConfigError, match="out of range"):
        s.instance(3)


# ---- bad input -------------------------------------------------------------------------------

def test_unknown_suite_is_one_clear_error():
    with pytest.raises(ConfigError, match="no bundled suite of that name.*train-small"):
        load_suite("no-such-suite")


def _spec_file(tmp_path: Path, **changes) -> Path:
    doc = yaml.safe_load(Path(load_suite("train-small").source).read_text())
    doc.update(changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("changes,field,needle", [
    ({"hosts": [2, 12]}, "hosts", "more than max_hosts (8)"),
    ({"hosts": [6, 2]}, "hosts", "lo must not exceed hi"),
    ({"seed": "x"}, "seed", "expected an integer"),
    ({"colour": 1}, "colour", "unknown field"),
    ({"models": ["gpt3-125m", "nope-7b"]}, "models[1]", "no bundled model"),
    ({"gpu_types": [{"type": "Z100", "gpus": [8], "nic_gbps": [100]}]}, "gpu_types[0].type",
     "unknown GPU type"),
    ({"gpu_types": [{"type": "T4", "gpus": [0], "nic_gbps": [100]}]}, "gpu_types[0].gpus",
     "positive integers"),
    ({"types_per_instance": [2, 9]}, "types_per_instance", "gpu_types lists 6"),
    ({"training": {"global_batch": [48]}}, "training.global_batch", "powers of two"),
    ({"training": {"global_batch": [32], "precision": "bf16"}}, "gpu_types[0].type",
     "no bf16 support"),
    ({"network": {"shapes": ["torus"]}}, "network.shapes", "single_switch, leaf_spine, geo"),
    ({"bandwidth": {"cv": [0, 9]}}, "bandwidth.cv", "at most 5"),
])
def test_bad_spec_names_file_and_field(tmp_path, changes, field, needle):
    path = _spec_file(tmp_path, **changes)
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    err = info.value
    assert err.source == str(path) and err.field == field, str(err)
    assert needle in str(err) and "\n" not in str(err)


def test_bad_instance_files(tmp_path, suites):
    inst = suites["tiny"].instance(0)
    good = {"format": "hetpar-instances", "version": 1, "suite": "x", "max_hosts": 4,
            "instances": [inst.to_dict()]}
    cases = [
        ("garbage: [", "malformed YAML"),
        (yaml.safe_dump({**good, "format": "other"}), "format"),
        (yaml.safe_dump({**good, "instances": []}), "lists no instances"),
        (yaml.safe_dump({**good, "instances": [{"name": "a"}]}), "instances[0].cluster"),
        (yaml.safe_dump({**good, "max_hosts": 1}), "more than max_hosts"),
    ]
    broken = inst.to_dict()
    broken["cluster"]["hosts"][0]["nic_gbps"] = 0
    cases.append((yaml.safe_dump({**good, "instances": [broken]}),
                  "instances[0].cluster.hosts[0].nic_gbps: must be positive"))
    for text, needle in cases:
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_instances(path)
        assert needle in str(info.value) and str(path) in str(info.value), str(info.value)


# ---- CLI -------------------------------------------------------------------------------------

def test_cli_suite_show(capsys):
    assert main(["suite", "show", "test-geo", "--n", "2"]) == 0
    out = capsys.readouterr().out
    for text in ("test-geo-0", "test-geo-1", "WAN", "ms", "sites", "global batch", "Gb/s"):
        assert text in out
    assert main(["suite", "show", "train-small", "--n", "1", "--seed-offset", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (item,) = data["instances"]
    assert item["instance"] == load_suite("train-small").instance(3).to_dict()
    assert item["summary"]["hosts"] == len(item["instance"]["cluster"]["hosts"])
    assert describe_instance(load_suite("train-small").instance(3)) == item["summary"]


def test_cli_suite_sample_and_list(tmp_path, capsys):
    out = tmp_path / "held-out.yaml"
    assert main(["suite", "sample", "test-iid", "--n", "3", "--out", str(out)]) == 0
    assert "wrote 3 instances" in capsys.readouterr().out
    back = load_instances(out)
    assert [b.to_dict() for b in back] == [a.to_dict() for a in load_suite("test-iid").instances(3)]
    assert main(["suite", "show", str(out), "--n", "3"]) == 0
    assert "test-iid-2" in capsys.readouterr().out
    assert main(["suite", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SUITES)


@pytest.mark.parametrize("argv,needle", [
    (["suite", "show", "no-such-suite"], "no bundled suite"),
    (["suite", "show", "test-iid", "--seed-offset", "199", "--n", "3"], "out of range"),
    (["suite", "show", "tiny", "--n", "-1"], "--n"),
    (["suite", "sample", "tiny", "--n", "2", "--out", "/no/such/dir/x.yaml"], "folder"),
])
def test_cli_suite_errors_are_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hetpar: error: ") and needle in err[0]


def test_new_small_models_match_gpt3_table():
    # Brown et al. 2020, Table 2.1: GPT-3 Small, Medium, Large.
    for name, published, heads in (("gpt3-125m", 125e6, 12), ("gpt3-350m", 350e6, 16),
                                   ("gpt3-760m", 760e6, 16)):
        m = hetpar.load_model(name)
        assert abs(m.total_params - published) <= 0.05 * published
        assert m.heads == heads and m.seq_len == 2048


def test_readme_example_spec_parses():
    from hetpar.configio import bundled_dir
    from hetpar.problem.generator import parse_suite_spec

    text = (bundled_dir() / "README.md").read_text()
    example = text.split("## 8.")[1].split("```yaml\n")[1].split("```")[0]
    suite = Suite.from_spec(parse_suite_spec(yaml.safe_load(example), "README"))
    assert feasible_plan(suite.instance(0)) is not None
