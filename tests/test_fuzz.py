"""No input breaks hetpar (issue 25): fuzzing the loaders, and a regression test per defect.

The hypothesis part draws documents of every input kind (mutations of the bundled configs,
and arbitrary YAML/JSON text) and checks that each loader either returns or raises a
``HetparError`` whose message is one line; estimating a plan on what loads gives finite,
non-negative figures. It is short by default (a few seconds); ``HETPAR_FUZZ_LONG=1`` runs
many more examples. ``benchmarks/fuzz.py`` runs the same idea through the command line in
subprocesses, with a timeout and a memory limit.

The regression part runs each defect the issue reported through ``hetpar`` in-process:
every one is now a one-line refusal with exit status 2 naming the file (or flag), the
field and the problem, or (the NaN in ``--json``) strict JSON.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_one_line_error, run  # noqa: E402
from hetpar import limits
from hetpar.cluster.gpu import parse_gpu_catalog
from hetpar.cluster.topology import parse_cluster
from hetpar.configio import bundled_dir, check_data, load_document, parse_text
from hetpar.costmodel.constants import parse_constants
from hetpar.costmodel.estimate import CostModel
from hetpar.errors import ConfigError, HetparError
from hetpar.plan import Plan
from hetpar.problem.generator import parse_suite_spec
from hetpar.workload.model import load_model, parse_model
from hetpar.workload.training import load_training, parse_training

CONFIGS = bundled_dir()
PLAN = str(CONFIGS / "plans" / "amp-het-16-gpt2.json")
EST = ["estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--plan", PLAN]
LONG = os.environ.get("HETPAR_FUZZ_LONG") == "1"
FUZZ = settings(max_examples=1500 if LONG else 40, deadline=None, derandomize=not LONG,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def _doc(kind: str, name: str) -> object:
    return load_document(CONFIGS / kind / name)


# ---- hypothesis: every loader returns or refuses in one line ------------------------------

def _one_line(exc: HetparError) -> None:
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text, text
    assert len(text) < 2000


LEAVES = (st.none() | st.booleans()
          | st.integers(min_value=-(2**70), max_value=2**70)
          | st.floats(allow_nan=True, allow_infinity=True)
          | st.sampled_from([0, -1, 1e308, -1e308, 1e-308, 5e-324, 2**63, 10**30, 1e18,
                             0.001, "", "x" * 300, "A100", "fp16", "single_switch", "none"])
          | st.text(max_size=12))
VALUES = st.recursive(LEAVES, lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)


def _paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    out = []
    items = (doc.items() if isinstance(doc, dict) else enumerate(doc)
             if isinstance(doc, list) else ())
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(_paths(v, prefix + (k,)))
    return out


@st.composite
def mutated(draw, doc: object) -> object:  # noqa: ANN001
    """``doc`` with one to three values replaced, deleted or given an unknown sibling."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        op = draw(st.sampled_from(["set", "set", "scale", "delete", "unknown"]))
        value = parent[path[-1]]
        if op == "scale" and isinstance(value, (int, float)) and not isinstance(value, bool):
            factor = draw(st.sampled_from([1e-12, 1e-3, 0.5, 2, 1e3, 1e9, 1e15, -1, 0]))
            parent[path[-1]] = value * factor
        elif op == "delete":
            del parent[path[-1]]
        elif op == "unknown" and isinstance(parent, dict):
            parent["bogus_field"] = 1
        else:
            parent[path[-1]] = draw(VALUES)
    return doc


def _loads_or_refuses(fn, *args) -> object:  # noqa: ANN001
    """``fn(*args)``, or None when it refuses with a one-line HetparError; any other
    exception fails the test."""
    try:
        return fn(*args)
    except HetparError as exc:
        _one_line(exc)
        return None


def _checked(doc: object, source: str) -> object:
    """What ``load_document`` would give for ``doc`` (the document limits applied)."""
    check_data(doc, source)
    return doc


@FUZZ
@given(st.data())
def test_mutated_clusters_load_or_refuse_and_estimate_finite(data):
    doc = data.draw(mutated(_doc("clusters", "amp-het-16.yaml")))
    cluster = _loads_or_refuses(lambda: parse_cluster(_checked(doc, "c.yaml"), "c.yaml"))
    if cluster is None:
        return
    model, training = load_model("gpt2-medium"), load_training(None)
    try:
        est = CostModel(cluster, model, training, samples=4, seed=0).evaluate(Plan.load(PLAN))
    except HetparError as exc:  # the plan does not fit the mutated cluster
        _one_line(exc)
        return
    figures = np.asarray(est.iter_time, dtype=float)
    assert not np.isnan(figures).any() and (figures > 0).all(), figures
    for m in est.memory:
        assert m.used_bytes >= 0 and m.usable_bytes >= 0 and m.capacity_bytes >= 0


@FUZZ
@given(st.data())
def test_mutated_models_and_trainings_load_or_refuse(data):
    model = data.draw(mutated(_doc("models", "llama2-7b.yaml")))
    training = data.draw(mutated(_doc("training", "llama-bf16.yaml")))
    _loads_or_refuses(lambda: parse_model(_checked(model, "m.yaml"), "m.yaml"))
    _loads_or_refuses(lambda: parse_training(_checked(training, "t.yaml"), "t.yaml"))


@FUZZ
@given(st.data())
def test_mutated_plans_load_or_refuse(data):
    doc = data.draw(mutated(json.loads(Path(PLAN).read_text())))
    _loads_or_refuses(lambda: Plan.from_dict(_checked(doc, "p.json"), "p.json"))


@FUZZ
@given(st.data())
def test_mutated_gpu_catalogs_and_calibrations_load_or_refuse(data):
    gpus = data.draw(mutated(_doc("", "gpus.yaml")))
    cal = data.draw(mutated(_doc("", "calibration.yaml")))
    catalog = _loads_or_refuses(lambda: parse_gpu_catalog(_checked(gpus, "g.yaml"), "g.yaml"))
    for gpu in catalog or ():
        for kind, value in (("peak_tflops", gpu.peak_fp16_tflops),
                            ("memory_gib", gpu.memory_gib), ("hbm_GBps", gpu.hbm_GBps)):
            lo, hi, _ = limits.GPU_RANGES[kind]
            assert lo <= value <= hi
    _loads_or_refuses(lambda: parse_constants(_checked(cal, "k.yaml"), "k.yaml"))


@FUZZ
@given(st.data())
def test_mutated_suites_load_or_refuse(data):
    doc = data.draw(mutated(_doc("suites", "tiny.yaml")))
    spec = _loads_or_refuses(lambda: parse_suite_spec(_checked(doc, "s.yaml"), "s.yaml"))
    if spec is not None:
        assert spec.max_hosts <= limits.MAX_HOSTS


@settings(max_examples=1500 if LONG else 60, deadline=None, derandomize=not LONG)
@given(st.one_of(st.text(max_size=200),
                 st.builds(lambda v: yaml.safe_dump(v), VALUES),
                 st.builds(lambda v: json.dumps(v), VALUES),
                 st.builds(lambda n, t: "[" * n + t + "]" * n, st.integers(0, 3000),
                           st.sampled_from(["", "1", "{a: 1}"]))))
def test_any_text_parses_or_refuses_in_one_line(text):
    for json_format in (False, True):
        try:
            data = parse_text(text, "f.yaml", json_format=json_format)
        except ConfigError as exc:
            _one_line(exc)
            continue
        json.dumps(data, allow_nan=False)  # plain, finite JSON data


# ---- regression tests: the defects issue 25 reported -------------------------------------

def _write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


AMP = (CONFIGS / "clusters" / "amp-het-16.yaml").read_text()
GPUS = yaml.safe_load((CONFIGS / "gpus.yaml").read_text())


def _catalog(tmp_path: Path, **changes: object) -> str:
    entry = {**GPUS["gpus"]["V100-SXM2-16GB"], **changes}
    return _write(tmp_path, "g.yaml", yaml.safe_dump({"gpus": {"V100-SXM2-16GB": entry}}))


def test_deep_yaml_and_json_nesting_are_refused(capsys, tmp_path):
    f = _write(tmp_path, "c.yaml", "x: " + "[" * 1000 + "]" * 1000 + "\n")
    code, _, err = run(capsys, "solve", "--cluster", f, "--model", "gpt3-125m")
    assert_one_line_error(code, err, "c.yaml", "nested more than 64 levels deep")
    p = _write(tmp_path, "p.json", "[" * 1000 + "]" * 1000)
    code, _, err = run(capsys, *EST[:6], p)
    assert_one_line_error(code, err, "p.json", "nested more than 64 levels deep")


def test_huge_integers_are_refused(capsys, tmp_path):
    f = _write(tmp_path, "c.yaml", AMP.replace("count: 3", "count: " + "9" * 5000))
    code, _, err = run(capsys, "solve", "--cluster", f, "--model", "gpt3-125m")
    assert_one_line_error(code, err, "c.yaml", "line 7", "a number of 5,000 digits")
    f = _write(tmp_path, "d.yaml", AMP.replace("count: 3", "count: " + "9" * 40))
    code, _, err = run(capsys, "solve", "--cluster", f, "--model", "gpt3-125m")
    assert_one_line_error(code, err, "d.yaml", "hosts[0].count", "out of range")
    plan = Path(PLAN).read_text().replace('"micro_batches": 16', '"micro_batches": ' + "9" * 5000)
    code, _, err = run(capsys, *EST[:6], _write(tmp_path, "p.json", plan))
    assert_one_line_error(code, err, "p.json", "line 1", "a number of 5,000 digits")


@pytest.mark.parametrize("content", [b"\x00\x01\xff" * 100, "/dev/zero", "folder"])
def test_binary_or_device_traces_are_refused(capsys, tmp_path, content):
    if content == "/dev/zero":
        trace = "/dev/zero"
    elif content == "folder":
        trace = str(tmp_path)
    else:
        trace = _write(tmp_path, "t.csv", content)
    code, _, err = run(capsys, "replan", "--trace", trace, "--cluster", "trace-demo",
                       "--model", "gpt3-1.3b", "--iterations", "10", "--out", tmp_path / "o")
    assert_one_line_error(code, err, trace)
    # and the same trace named by a cluster's link
    doc = (CONFIGS / "clusters" / "trace-demo.yaml").read_text().replace(
        "../traces/wan-demo.csv", trace)
    code, _, err = run(capsys, "solve", "--cluster", _write(tmp_path, "c.yaml", doc),
                       "--model", "gpt3-1.3b", "--method", "metis")
    assert_one_line_error(code, err, "c.yaml", "links[0].bandwidth.file")


def _solve_with_trace(capsys, tmp_path: Path, text: str) -> tuple[int, str, str]:
    """'hetpar solve' on trace-demo with its WAN link's trace replaced by ``text``."""
    trace = _write(tmp_path, "t.csv", text)
    doc = (CONFIGS / "clusters" / "trace-demo.yaml").read_text().replace(
        "../traces/wan-demo.csv", trace)
    return run(capsys, "solve", "--cluster", _write(tmp_path, "c.yaml", doc),
               "--model", "gpt3-1.3b", "--method", "metis")


def test_trace_with_a_nan_time_is_refused(capsys, tmp_path):
    code, _, err = _solve_with_trace(capsys, tmp_path, "time_s,wan\n0,8\nnan,7\n")
    assert_one_line_error(code, err, "t.csv", "line 3", "time_s must be finite")
    trace = _write(tmp_path, "u.csv", "time_s,us--eu\n0,80\nnan,25\n")
    code, _, err = run(capsys, "replan", "--trace", trace, "--cluster", "geo-degrading",
                       "--model", "gpt3-1.3b", "--iterations", "10", "--out", tmp_path / "o")
    assert_one_line_error(code, err, "u.csv", "line 3", "time_s must be finite")


def test_markov_rates_are_bounded(capsys, tmp_path):
    scenario = (CONFIGS / "scenarios" / "geo-degrading.yaml").read_text()
    for rate, needle in (("1.0e+308", "must be at most 1000"),
                         ("500.0", "state changes")):  # 500/s over 6 hours: 1e7 changes
        f = _write(tmp_path, "s.yaml", scenario.replace("congested: 0.0015", f"congested: {rate}"))
        code, _, err = run(capsys, "replan", "--scenario", f, "--strategies", "static",
                           "--iterations", "10", "--out", tmp_path / "o")
        assert_one_line_error(code, err, "s.yaml", "processes[0].states", needle)


def test_scenario_timeline_is_bounded(capsys, tmp_path):
    scenario = (CONFIGS / "scenarios" / "host-loss.yaml").read_text()
    f = _write(tmp_path, "s.yaml", scenario.replace("step_s: 60", "step_s: 0.001"))
    code, _, err = run(capsys, "replan", "--scenario", f, "--strategies", "static",
                       "--iterations", "10", "--out", tmp_path / "o")
    assert_one_line_error(code, err, "s.yaml", "step_s", "steps, more than")


@pytest.mark.parametrize("field,value,needle", [
    ("peak_tflops", {"fp16": 1e308}, "implausible"),
    ("peak_tflops", {"fp16": 125e12}, "not FLOP/s"),   # TFLOP/s given in FLOP/s
    ("peak_tflops", {"fp16": 1e-308}, "implausible"),  # NaN percentiles before
    ("memory_gib", 1e308, "implausible"),
    ("memory_gib", 0.001, "implausible"),              # negative usable memory before
    ("hbm_GBps", 0.9, "not TB/s"),                     # HBM in TB/s
    ("pcie_GBps", float("nan"), "must be finite"),
])
def test_implausible_gpu_figures_are_refused(capsys, tmp_path, field, value, needle):
    f = _catalog(tmp_path, **{field: value})
    code, _, err = run(capsys, *EST, "--gpus", f)
    key = field + (".fp16" if field == "peak_tflops" else "")
    assert_one_line_error(code, err, "g.yaml", f"gpus.V100-SXM2-16GB.{key}", needle)


def test_usable_memory_is_never_negative():
    from hetpar.costmodel.constants import load_constants
    from hetpar.costmodel.memory import gpu_usable_bytes

    gpu = parse_gpu_catalog({"gpus": {"SMALL": {**GPUS["gpus"]["T4-16GB"], "memory_gib": 1.0}}},
                            "g.yaml").get("SMALL")
    fw = load_constants().framework("megatron-lm")
    assert gpu_usable_bytes(gpu, fw) == 0.0 < fw.reserve_bytes


def test_self_referencing_instance_meta_is_refused(capsys, tmp_path):
    f = _write(tmp_path, "i.yaml", "format: hetpar-instances\nversion: 1\ninstances:\n"
                                   "- name: x\n  meta: &m {self: *m}\n  cluster: {}\n"
                                   "  model: {}\n  training: {}\n")
    code, _, err = run(capsys, "suite", "show", f, "--json")
    assert_one_line_error(code, err, "i.yaml", "instances[0].meta.self", "contains itself")


def test_billion_laughs_is_refused_at_once(tmp_path):
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    with pytest.raises(ConfigError, match="expands to more than"):
        load_document(_write(tmp_path, "b.yaml", "\n".join(lines)))
    with pytest.raises(ConfigError, match="YAML aliases"):
        parse_text("a: &a [1]\nb: [" + ", ".join(["*a"] * (limits.MAX_ALIASES + 1)) + "]",
                   "c.yaml", json_format=False)


def test_yaml_tags_and_non_finite_numbers_are_refused():
    for text, needle in (("a: !!set {x, y}", "a set value"), ("a: !!binary aGk=", "bytes"),
                         ("a: .nan", "must be finite"), ("a: [1, -.inf]", "must be finite")):
        with pytest.raises(ConfigError, match=needle):
            parse_text(text, "x.yaml", json_format=False)
    assert parse_text("d: 2024-01-01", "x.yaml", json_format=False) == {"d": "2024-01-01"}


@pytest.mark.parametrize("argv,needle", [
    (["--seed", "-1"], "--seed: must be at least 0"),
    (["--samples", "1000000000"], "--samples: must be at most 100,000"),
    (["--seed", str(2**64)], "--seed: must be at most"),
])
def test_bad_scoring_flags_are_refused(capsys, argv, needle):
    code, _, err = run(capsys, *EST, *argv)
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "0", "-1", "1e9"])
def test_time_limit_takes_only_finite_positive_values(capsys, value):
    code, _, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       f"--time-limit={value}")
    assert_one_line_error(code, err, "--time-limit")


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        run(capsys, *EST, "--samples", "1e9")
    assert_one_line_error(exc.value.code, capsys.readouterr().err, "--samples",
                          "invalid int value")


def test_out_must_be_a_writable_place(capsys, tmp_path):
    solve = ["solve", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--method", "metis"]
    for out, needle in ((".", "is a folder"), (str(tmp_path), "is a folder"),
                        ("/proc/1/nope/x.json", "cannot write"),
                        (str(tmp_path / "missing" / "x.json"), "folder does not exist")):
        code, _, err = run(capsys, *solve, "--out", out)
        assert_one_line_error(code, err, "--out", needle)
    existing = _write(tmp_path, "x.txt", "x")
    replan = ["replan", "--scenario", "host-loss", "--strategies", "static", "--iterations", "10",
              "--no-oracle"]
    code, _, err = run(capsys, *replan, "--out", existing)
    assert_one_line_error(code, err, "x.txt", "--out", "exists and is not a folder")
    code, _, err = run(capsys, *replan, "--out", "/proc/1/nope/x")
    assert_one_line_error(code, err, "--out", "cannot create it")
    code, _, err = run(capsys, "calibrate", "--out", ".")
    assert_one_line_error(code, err, "--out", "is a folder")


def test_unknown_key_in_a_plan_replica_is_refused(capsys, tmp_path):
    doc = json.loads(Path(PLAN).read_text())
    doc["stages"][0]["replicas"][0]["bogus"] = 1
    code, _, err = run(capsys, *EST[:6], _write(tmp_path, "p.json", json.dumps(doc)))
    assert_one_line_error(code, err, "p.json", "stages[0].replicas[0].bogus",
                          "unknown replica field")


def test_a_link_from_a_node_to_itself_is_refused(capsys, tmp_path):
    doc = AMP + "switches: [s2]\nlinks:\n  - {a: s2, b: s2, capacity_gbps: 10}\n"
    code, _, err = run(capsys, "solve", "--cluster", _write(tmp_path, "c.yaml", doc),
                       "--model", "gpt3-125m", "--method", "metis")
    assert_one_line_error(code, err, "c.yaml", "links[0].b", "to itself")


def test_two_gpu_types_sharing_an_alias_are_refused(capsys, tmp_path):
    t4 = GPUS["gpus"]["T4-16GB"]
    for names in (("dup", "dup"), ("Dup", "dUP")):
        doc = {"gpus": {"X1": {**t4, "aliases": [names[0]]}, "X2": {**t4, "aliases": [names[1]]}}}
        code, _, err = run(capsys, *EST, "--gpus", _write(tmp_path, "g.yaml", yaml.safe_dump(doc)))
        assert_one_line_error(code, err, "g.yaml", "gpus.X2.aliases[0]", "already names")
    doc = {"gpus": {"X1": {**t4, "aliases": ["X2"]}, "X2": t4}}
    code, _, err = run(capsys, *EST, "--gpus", _write(tmp_path, "h.yaml", yaml.safe_dump(doc)))
    assert_one_line_error(code, err, "h.yaml", "gpus.X2", "already names GPU type 'X1'")


def test_host_counts_are_bounded_up_front(capsys, tmp_path):
    f = _write(tmp_path, "c.yaml", AMP.replace("count: 3", f"count: {2**63 - 1}"))
    code, _, err = run(capsys, "solve", "--cluster", f, "--model", "gpt3-125m")
    assert_one_line_error(code, err, "c.yaml", "hosts[0].count")
    suite = (CONFIGS / "suites" / "tiny.yaml").read_text()
    f = _write(tmp_path, "s.yaml", suite.replace("max_hosts: 4", "max_hosts: 1000000")
               .replace("hosts: [2, 3]", "hosts: [1000000, 1000000]"))
    code, _, err = run(capsys, "suite", "show", f, "--n", "1")
    assert_one_line_error(code, err, "s.yaml", "max_hosts", "must be at most 20,000")


def test_global_batch_is_bounded(capsys, tmp_path):
    f = _write(tmp_path, "t.yaml", f"global_batch: {10**18}\n")
    code, _, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       "--training", f, "--method", "metis")
    assert_one_line_error(code, err, "t.yaml", "global_batch", "must be at most 1,048,576")


def test_brute_refuses_a_large_space_up_front(capsys):
    code, _, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       "--method", "brute")
    assert_one_line_error(code, err, "brute", "more than 250,000 plans", "use exact")


def test_bf16_on_a_cluster_with_v100s_is_refused(capsys):
    code, _, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       "--training", "llama-bf16", "--method", "metis")
    assert_one_line_error(code, err, "amp-het-16.yaml", "V100-SXM2-16GB", "cannot train in bf16")


def test_json_output_is_strict(capsys):
    from hetpar.problem.solution import strict_json

    assert json.loads(strict_json({"a": [math.nan, 1.0, math.inf], "b": {"c": -math.inf}})) \
        == {"a": [None, 1.0, None], "b": {"c": None}}
    code, out, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                         "--method", "metis", "--samples", "4", "--json")
    assert code == 0, err
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


def test_plan_no_improve_json_is_strict(capsys):
    pytest.importorskip("sb3_contrib")
    code, out, err = run(capsys, "plan", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                         "--no-improve", "--json")
    if code == 2 and "policy" in err:  # no loadable shipped policy in this checkout
        pytest.skip(err.strip())
    assert code == 0, err
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


def test_errors_are_one_line_whatever_a_key_holds(capsys, tmp_path):
    f = _write(tmp_path, "m.yaml", '"bad\\nkey\\u0000": 1\n')
    code, _, err = run(capsys, "solve", "--cluster", "amp-het-16", "--model", f)
    assert_one_line_error(code, err, "m.yaml", "unknown field")


def test_implausible_calibration_constants_are_refused(capsys, tmp_path):
    text = (CONFIGS / "calibration.yaml").read_text().replace(
        "logits_bytes_per_value: 6.0", "logits_bytes_per_value: 6.0e+9", 1)
    code, _, err = run(capsys, *EST, "--calibration", _write(tmp_path, "k.yaml", text))
    assert_one_line_error(code, err, "k.yaml", "frameworks.megatron-lm.logits_bytes_per_value",
                          "must be at most 64")


def test_trace_row_with_an_extra_field_is_refused(capsys, tmp_path):
    code, _, err = _solve_with_trace(capsys, tmp_path, "time_s,wan\n0,8\n10,7,3\n")
    assert_one_line_error(code, err, "t.csv", "line 3", "3 fields, the header has 2")


def test_instance_counts_are_bounded(capsys):
    code, _, err = run(capsys, "suite", "show", "tiny", "--n", str(limits.MAX_INSTANCES + 1))
    assert_one_line_error(code, err, "--n", "must be at most 10,000")


def test_exact_time_limit_holds_on_hundreds_of_identical_hosts(capsys, tmp_path):
    """Finding the next canonical first stage among 200 identical hosts took minutes, past
    any --time-limit; the lazy first level now stops at the deadline (and is not taken
    for exhausted: the answer is not claimed optimal)."""
    import time

    doc = AMP.replace("count: 3", "count: 200")
    t0 = time.perf_counter()
    code, out, err = run(capsys, "solve", "--cluster", _write(tmp_path, "c.yaml", doc),
                         "--model", "gpt3-125m", "--time-limit", "1", "--samples", "2",
                         "--no-policy-start", "--json")
    assert code == 0, err
    assert time.perf_counter() - t0 < 20
    cert = json.loads(out)["certificate"]
    assert cert["stopped"] == "time limit" and not cert["optimal"]
    assert math.isfinite(cert["space_size"])


def test_paths_the_file_system_refuses_are_one_line(capsys, tmp_path):
    suite = (CONFIGS / "suites" / "tiny.yaml").read_text().replace(
        "models: [gpt3-125m, gpt3-350m]", "models: [gpt3-125m, " + "x" * 300 + "]")
    code, _, err = run(capsys, "suite", "show", _write(tmp_path, "s.yaml", suite))
    assert_one_line_error(code, err, "s.yaml", "models[1]")
    code, _, err = run(capsys, "replan", "--scenario", "host-loss", "--strategies", "static",
                       "--iterations", "10", "--no-oracle", "--out", "/proc/nope/x")
    assert_one_line_error(code, err, "--out", "cannot create it")


# ---- training configs, reference files and policy files ------------------------------------

def _tiny_train(tmp_path: Path, **changes: object) -> str:
    """configs/train/tiny.yaml cut to seconds, with ``changes`` ('a.b': value) applied."""
    doc = yaml.safe_load((CONFIGS / "train" / "tiny.yaml").read_text())
    doc.update(total_timesteps=64)
    doc["env"]["instances"] = 2
    doc["imitation"]["epochs"] = 1
    doc["ppo"].update(n_steps=32, batch_size=32, n_epochs=1)
    doc["eval"]["n"] = 0
    for key, value in changes.items():
        *parents, last = key.split(".")
        target = doc
        for p in parents:
            target = target[p]
        target[last] = value
    return _write(tmp_path, "t.yaml", yaml.safe_dump(doc))


@pytest.mark.parametrize("key,value,needle", [
    ("ppo.n_steps", 918273645546372819, "ppo.n_steps"),       # a numpy 'array is too big'
    ("ppo.n_steps", 10_000_000, "GiB"),                        # the rollout would not fit
    ("ppo.gae_lambda", 1e12, "ppo.gae_lambda"),                # NaN advantages
    ("ppo.gamma", 1.5, "ppo.gamma"),
    ("n_envs", 100_000, "n_envs"),                             # 100,000 processes
    ("policy_kwargs.dim", 2**40, "policy_kwargs.dim"),
    ("env.max_hosts", 10**6, "env.max_hosts"),
    ("total_timesteps", 10**30, "total_timesteps"),
])
def test_training_configs_beyond_their_limits_are_refused(capsys, tmp_path, key, value, needle):
    code, _, err = run(capsys, "train", "--config", _tiny_train(tmp_path, **{key: value}),
                       "--runs-dir", tmp_path / "runs", "--run-name", "r", "--no-progress")
    assert_one_line_error(code, err, "t.yaml", needle)


@pytest.mark.slow
def test_a_diverging_run_ends_in_one_line_and_saves_no_nan_policy(capsys, tmp_path):
    from hetpar.agents.io import load_policy

    cfg = _tiny_train(tmp_path, **{"imitation.learning_rate": 1e-3, "ppo.learning_rate": 1e6})
    code, _, err = run(capsys, "train", "--config", cfg, "--runs-dir", tmp_path / "runs",
                       "--run-name", "r", "--no-progress")
    assert_one_line_error(code, err, "t.yaml", "training diverged", "ppo.learning_rate")
    run_dir = tmp_path / "runs" / "r"
    assert not (run_dir / "final_policy.zip").exists()
    for saved in run_dir.rglob("*.zip"):  # whatever was saved before is a finite network
        policy = load_policy(saved).model.policy
        assert all(bool(p.isfinite().all()) for p in policy.parameters()), saved


def test_a_reference_file_with_a_damaged_plan_is_refused(capsys, tmp_path):
    doc = json.loads((CONFIGS / "references" / "test-geo.json").read_text())
    last = next(e for e in reversed(doc["instances"]) if e.get("plan"))
    last["plan"]["stages"][0]["replicas"][0]["bogus"] = 1
    code, _, err = run(capsys, "evaluate", "--suite", "test-geo", "--n", "1", "--methods",
                       "metis", "--reference", _write(tmp_path, "r.json", json.dumps(doc)),
                       "--out", tmp_path / "ev", "--json")
    assert_one_line_error(code, err, "r.json", "plan.stages[0].replicas[0].bogus")
    assert not (tmp_path / "ev").exists()


# ---- the command-line harness (benchmarks/fuzz.py), a short real run ---------------------------

def _harness():
    from bench_helpers import load_benchmark

    return load_benchmark("fuzz", "hetpar_fuzz_harness")


@pytest.mark.slow
def test_command_line_harness_finds_nothing_bad(tmp_path):
    """Generated cases of every kind through 'hetpar' in subprocesses (30 s, 90 s for a
    training run, 2 GiB each):
    4 a kind here (about a minute on 2 cores), 40 with HETPAR_FUZZ_LONG=1."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    fuzz = _harness()
    per_kind = 40 if LONG else 4
    rng = random.Random(25)
    cases = [make(rng) for make in (fuzz.policy_case, fuzz.train_case, fuzz.reference_case,
                                    fuzz.flag_case, fuzz.trace_case) for _ in range(per_kind)]
    cases += [c for c in fuzz.generate(60 + 10 * per_kind, seed=25)[-10 * per_kind:]]
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(fuzz.run_case, cases))
    bad = [f"{o.kind}: {o.case.label}: {o.detail[:200]}" for o in outcomes if o.kind in fuzz.BAD]
    assert not bad, "\n".join(bad)
    kinds = {o.kind for o in outcomes}
    assert "refusal" in kinds and "ok" in kinds  # the generator makes both


def test_a_pickled_payload_in_a_policy_file_never_runs(capsys, tmp_path, monkeypatch):
    """Through the command line: a format-1 file with a payload in every pickled member,
    read by plan, evaluate, policy show and train's init_policy."""
    fuzz = _harness()
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "p.zip"
    p.write_bytes(fuzz.legacy_payload_file())
    for argv in (["plan", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--policy", p,
                  "--no-improve"],
                 ["evaluate", "--suite", "tiny", "--n", "1", "--methods", "policy-raw",
                  "--policy", p, "--no-reference", "--out", tmp_path / "ev"]):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, "p.zip", "--trust-pickle")
    code, out, _ = run(capsys, "policy", "show", p)
    assert code == 0 and "format 1" in out and "--trust-pickle" in out
    cfg = _tiny_train(tmp_path, **{"finetune": {"init_policy": str(p)}})
    code, _, err = run(capsys, "train", "--config", cfg, "--runs-dir", tmp_path / "runs",
                       "--run-name", "r", "--no-progress")
    assert_one_line_error(code, err, "p.zip", "--trust-pickle")
    assert not (tmp_path / fuzz.MARKER).exists()


def test_a_reference_file_with_an_unknown_key_in_an_exact_record_is_refused(capsys, tmp_path):
    doc = json.loads((CONFIGS / "references" / "test-geo.json").read_text())
    doc["instances"][-1]["exact"]["bogus"] = 1
    code, _, err = run(capsys, "evaluate", "--suite", "test-geo", "--n", "1", "--methods",
                       "metis", "--reference", _write(tmp_path, "r.json", json.dumps(doc)),
                       "--out", tmp_path / "ev")
    assert_one_line_error(code, err, "r.json", "exact.bogus", "unknown field")


# ---- defects the 10,000-case run found (seed 2026) ---------------------------------------------

def test_bounded_compositions_of_thousands_of_distinct_hosts():
    """A cluster of 2,000 hosts that differ (their uplinks) has 2,000 symmetry classes: the
    recursive enumeration went past Python's recursion limit."""
    import itertools

    from hetpar.problem.space import _bounded_compositions

    first = next(_bounded_compositions([1] * 5000, 2500))
    assert first == (0,) * 2500 + (1,) * 2500
    for room, total in (([2, 0, 3], 3), ([1, 1, 1, 1], 2), ([], 0), ([3], 4), ([2, 2], -1)):
        want = [c for c in itertools.product(*(range(r + 1) for r in room)) if sum(c) == total]
        assert list(_bounded_compositions(room, total)) == want


def _policy_zip(tmp_path: Path, change) -> str:  # noqa: ANN001
    import zipfile

    src = Path(__file__).resolve().parents[1] / "hetpar" / "agents" / "data" / "default_policy.zip"
    with zipfile.ZipFile(src) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members = change(members)
    out = tmp_path / "p.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return str(out)


def test_a_policy_file_with_a_corrupt_deflate_stream_is_refused(capsys, tmp_path):
    path = Path(_policy_zip(tmp_path, lambda m: m))
    data = bytearray(path.read_bytes())
    import zipfile

    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("policy.safetensors")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for k in range(start + 50, start + 5000, 97):  # scramble the compressed weights
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))
    code, _, err = run(capsys, "plan", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                       "--policy", path, "--no-improve")
    assert_one_line_error(code, err, "p.zip", "policy.safetensors")


@pytest.mark.parametrize("value", ["-Infinity", "NaN", "3", "[1]"])
def test_policy_metadata_of_the_wrong_type_or_not_json_numbers_is_refused(capsys, tmp_path,
                                                                           value):
    def change(members):
        meta = members["hetpar_meta.json"].decode()
        meta = meta.replace('"network": {', f'"network": {value}, "x_network": {{', 1)
        return {**members, "hetpar_meta.json": meta.encode()}

    path = _policy_zip(tmp_path, change)
    for argv in (["policy", "show", path], ["policy", "show", path, "--json"]):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, "p.zip", "metadata")


def test_more_torch_threads_than_cores_are_capped_with_a_line(capsys, tmp_path):
    cfg = _tiny_train(tmp_path, torch_threads=1000, **{"imitation.epochs": 1})
    code, out, err = run(capsys, "train", "--config", cfg, "--runs-dir", tmp_path / "runs",
                         "--run-name", "r", "--no-progress")
    assert code == 0, err
    assert f"torch_threads 1000 is more than this machine's {os.cpu_count()} cores" in out + err


@pytest.mark.parametrize("value", ["p101", "cvar" + "9" * 60, "median"])
def test_a_bad_objective_is_refused_naming_the_flag(capsys, value):
    code, _, err = run(capsys, *EST, "--objective", value)
    assert_one_line_error(code, err, "hetpar: error: --objective: ")
