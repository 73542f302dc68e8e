"""Plans: the JSON format and every validity rule of configs/README.md, section 5."""

from __future__ import annotations

import copy
import json

import pytest

import hetpar
from hetpar import Plan, validate_plan
from hetpar.errors import ConfigError, PlanError
from hetpar.plan import Replica, Stage
from hetpar.workload import parse_training


@pytest.fixture(scope="module")
def cluster():
    return hetpar.load_cluster("amp-het-16")


@pytest.fixture(scope="module")
def model():
    return hetpar.load_model("gpt2-medium")


@pytest.fixture(scope="module")
def training():
    return hetpar.load_training()


def test_fixtures_are_what_the_tests_assume(cluster, model, training):
    assert [(h.name, h.num_gpus) for h in cluster.hosts] == [
        ("v100-0", 4), ("v100-1", 4), ("v100-2", 4), ("t4", 4)]
    assert (model.layers, model.heads) == (24, 16)
    assert training.global_batch == 32
    assert set(training.recompute_modes) == {"none", "selective", "full"}


def base_doc():
    """A valid plan: 12 layers tp2 dp2 on v100-0, then 12 layers tp4 on t4; M=8 (4 seqs)."""
    return {
        "version": 1,
        "micro_batches": 8,
        "recompute": "selective",
        "zero": 1,
        "stages": [
            {"layers": 12, "tp": 2, "replicas": [{"host": "v100-0", "gpus": [0, 1]},
                                                 {"host": "v100-0", "gpus": [2, 3]}]},
            {"layers": 12, "tp": 4, "replicas": [{"host": "t4", "gpus": [0, 1, 2, 3]}]},
        ],
    }


def check(doc, cluster, model, training, field, *rule_words, training_override=None):
    plan = Plan.from_dict(doc, "p.json")
    with pytest.raises(PlanError) as info:
        validate_plan(plan, cluster, model, training_override or training, source="p.json")
    err = info.value
    msg = str(err)
    assert err.field == field, msg
    assert msg.startswith(f"p.json: {field}: "), msg
    for word in rule_words:
        assert word in msg, msg
    assert "\n" not in msg
    return msg


# ---- format -----------------------------------------------------------------------------

def test_base_plan_is_valid(cluster, model, training):
    plan = Plan.from_dict(base_doc())
    validate_plan(plan, cluster, model, training)
    assert plan.num_stages == 2
    assert plan.num_gpus == 8
    assert [s.dp for s in plan.stages] == [2, 1]
    assert plan.stages[0].replicas[1] == Replica("v100-0", (2, 3))


def test_bundled_plan_is_valid(cluster, model, training):
    validate_plan(Plan.load(hetpar.configio.bundled_dir() / "plans" / "amp-het-16-gpt2.json"),
                  cluster, model, training)


def test_dict_round_trip():
    plan = Plan.from_dict(base_doc())
    assert plan.to_dict() == base_doc()
    assert Plan.from_dict(plan.to_dict()) == plan


def test_json_round_trip():
    plan = Plan.from_dict(base_doc())
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_json(plan.to_json(indent=None)) == plan
    assert json.loads(plan.to_json()) == base_doc()


def test_save_and_load(tmp_path):
    plan = Plan.from_dict(base_doc())
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    assert json.loads(path.read_text()) == base_doc()
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    # Saving again overwrites.
    other = Plan(stages=plan.stages, micro_batches=4)
    other.save(path)
    assert Plan.load(path) == other


def test_defaults_and_meta():
    doc = base_doc()
    for key in ("version", "recompute", "zero"):
        del doc[key]
    doc["meta"] = {"solver": "exact", "anything": [1, 2]}
    plan = Plan.from_dict(doc)
    assert (plan.version, plan.recompute, plan.zero) == (1, "none", 0)
    assert "meta" not in plan.to_dict()


def test_plan_equality_distinguishes_plans():
    a = Plan.from_dict(base_doc())
    doc = base_doc()
    doc["stages"][0]["replicas"][1]["gpus"] = [3, 2]
    assert Plan.from_dict(doc) != a
    assert Plan(stages=a.stages, micro_batches=a.micro_batches, recompute="full",
                zero=a.zero) != a
    assert Stage(12, 2, a.stages[0].replicas).dp == 2


# ---- validity rules ---------------------------------------------------------------------

def test_gpu_used_twice_across_stages(cluster, model, training):
    doc = base_doc()
    doc["stages"][1] = {"layers": 12, "tp": 2, "replicas": [{"host": "v100-0", "gpus": [1, 2]}]}
    msg = check(doc, cluster, model, training, "stages[1].replicas[0].gpus", "GPU 1",
                "v100-0", "already used", "stages[0].replicas[0]")
    assert "stages[0]" in msg


def test_gpu_used_twice_within_a_replica(cluster, model, training):
    doc = base_doc()
    doc["stages"][0]["replicas"][1]["gpus"] = [2, 2]
    check(doc, cluster, model, training, "stages[0].replicas[1].gpus", "GPU 2", "already used")


def test_gpu_index_the_host_lacks(cluster, model, training):
    doc = base_doc()
    doc["stages"][0]["replicas"][1]["gpus"] = [3, 4]
    check(doc, cluster, model, training, "stages[0].replicas[1].gpus", "v100-0", "no GPU 4",
          "has 4")


def test_negative_gpu_index(cluster, model, training):
    doc = base_doc()
    doc["stages"][0]["replicas"][0]["gpus"] = [-1, 0]
    check(doc, cluster, model, training, "stages[0].replicas[0].gpus", "no GPU -1")


def test_unknown_host(cluster, model, training):
    doc = base_doc()
    doc["stages"][1]["replicas"][0]["host"] = "t4-0"
    check(doc, cluster, model, training, "stages[1].replicas[0].host", "unknown host", "'t4-0'")


@pytest.mark.parametrize("gpus", [[0, 1, 2], [0]])
def test_replica_with_wrong_gpu_count(cluster, model, training, gpus):
    doc = base_doc()
    doc["stages"][1]["replicas"][0]["gpus"] = gpus
    check(doc, cluster, model, training, "stages[1].replicas[0].gpus", "tp=4",
          f"got {len(gpus)}")


def test_layers_not_summing_to_the_model(cluster, model, training):
    doc = base_doc()
    doc["stages"][1]["layers"] = 11
    check(doc, cluster, model, training, "stages", "sum to 23", "24")
    doc["stages"][1]["layers"] = 13
    check(doc, cluster, model, training, "stages", "sum to 25", "24")


def test_stage_with_zero_layers(cluster, model, training):
    doc = base_doc()
    doc["stages"][0]["layers"] = 24
    doc["stages"][1]["layers"] = 0
    check(doc, cluster, model, training, "stages[1].layers", "at least one layer")


def test_zero_layer_stage_allowed_on_request(cluster, model, training):
    doc = base_doc()
    doc["stages"][0]["layers"] = 24
    doc["stages"][1]["layers"] = 0
    validate_plan(Plan.from_dict(doc), cluster, model, training, allow_empty_stages=True)


@pytest.mark.parametrize("micro_batches", [3, 5, 64])
def test_micro_batches_not_dividing_the_batch(cluster, model, training, micro_batches):
    doc = base_doc()
    doc["micro_batches"] = micro_batches
    check(doc, cluster, model, training, "micro_batches", "32", str(micro_batches),
          "does not divide")


def test_micro_batch_not_dividing_over_replicas(cluster, model, training):
    doc = base_doc()
    doc["micro_batches"] = 32  # one sequence per micro-batch, two replicas in stage 0
    check(doc, cluster, model, training, "stages[0].replicas", "micro-batch of 1",
          "2 replicas")


def test_micro_batch_not_dividing_over_three_replicas(cluster, model, training):
    doc = base_doc()
    doc["micro_batches"] = 4  # 8 sequences over 3 replicas
    doc["stages"][1] = {"layers": 12, "tp": 1,
                        "replicas": [{"host": "t4", "gpus": [g]} for g in range(3)]}
    check(doc, cluster, model, training, "stages[1].replicas", "micro-batch of 8",
          "3 replicas")


def test_tp_not_dividing_heads(cluster, model, training):
    doc = base_doc()
    doc["stages"][1] = {"layers": 12, "tp": 3, "replicas": [{"host": "t4", "gpus": [0, 1, 2]}]}
    check(doc, cluster, model, training, "stages[1].tp", "tp 3", "16 attention heads")


def test_recompute_mode_not_allowed(cluster, model, training):
    only_none = parse_training({"global_batch": 32, "recompute": ["none", "full"]})
    check(base_doc(), cluster, model, training, "recompute", "'selective'", "not allowed",
          training_override=only_none)
    doc = base_doc()
    doc["recompute"] = "full"
    validate_plan(Plan.from_dict(doc), cluster, model, only_none)


def test_zero_stage_not_allowed(cluster, model, training):
    no_zero = parse_training({"global_batch": 32, "zero": 0})
    check(base_doc(), cluster, model, training, "zero", "ZeRO stage 1", "not allowed",
          training_override=no_zero)


def test_stage_without_replicas(cluster, model, training):
    doc = base_doc()
    doc["stages"][1]["replicas"] = []
    check(doc, cluster, model, training, "stages[1].replicas", "at least one replica")


def test_cost_model_validates(cluster, model, training):
    doc = base_doc()
    doc["stages"][1]["replicas"][0]["host"] = "nowhere"
    with pytest.raises(PlanError):
        hetpar.costmodel.estimate(cluster, model, training, Plan.from_dict(doc), samples=2)


# ---- format errors ----------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 3])
def test_unsupported_version(version):
    doc = base_doc()
    doc["version"] = version
    with pytest.raises(PlanError) as info:
        Plan.from_dict(doc, "p.json")
    assert info.value.field == "version"
    assert f"unsupported plan version {version}" in str(info.value)


def test_malformed_json_text():
    with pytest.raises(PlanError) as info:
        Plan.from_json('{"version": 1,\n "stages": [}', "p.json")
    msg = str(info.value)
    assert msg.startswith("p.json: line 2: malformed JSON")


def test_malformed_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"version": 1,\n "micro_batches": 4,\n "stages": [}\n', encoding="utf-8")
    with pytest.raises(PlanError) as info:
        Plan.load(path)
    msg = str(info.value)
    assert str(path) in msg and "line 3" in msg and "malformed JSON" in msg


def test_unknown_plan_field():
    doc = base_doc()
    doc["microbatches"] = 8
    with pytest.raises(PlanError) as info:
        Plan.from_dict(doc, "p.json")
    assert info.value.field == "microbatches"
    doc = base_doc()
    doc["stages"][0]["pp"] = 2
    with pytest.raises(PlanError) as info:
        Plan.from_dict(doc, "p.json")
    assert info.value.field == "stages[0].pp"


def test_no_stages():
    doc = base_doc()
    doc["stages"] = []
    with pytest.raises(PlanError) as info:
        Plan.from_dict(doc)
    assert info.value.field == "stages"


def test_gpus_must_be_a_list_of_indices():
    doc = base_doc()
    doc["stages"][1]["replicas"][0]["gpus"] = ["0", "1", "2", "3"]
    with pytest.raises(PlanError) as info:
        Plan.from_dict(doc)
    assert info.value.field == "stages[1].replicas[0].gpus"


def _mutate(path, value):
    doc = base_doc()
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value, field", [
    (("micro_batches",), KeyError, "micro_batches"),
    (("micro_batches",), 0, "micro_batches"),
    (("recompute",), "some", "recompute"),
    (("stages", 0, "tp"), 0, "stages[0].tp"),
    (("stages", 0, "replicas", 0, "gpus"), KeyError, "stages[0].replicas[0].gpus"),
])
def test_structural_errors_are_plan_errors(path, value, field):
    # Plan.from_dict: "structural problems raise PlanError naming the field".
    with pytest.raises(PlanError) as info:
        Plan.from_dict(_mutate(path, value), "p.json")
    assert info.value.field == field


def test_non_mapping_plan_rejected():
    with pytest.raises(ConfigError):
        Plan.from_dict([base_doc()], "p.json")


def test_plan_errors_are_config_errors():
    assert issubclass(PlanError, ConfigError)
    doc = copy.deepcopy(base_doc())
    doc["version"] = 3
    with pytest.raises(hetpar.HetparError):
        Plan.from_dict(doc)
