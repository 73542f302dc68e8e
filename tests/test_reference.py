"""Reference optima as data: ``hetpar reference build`` / ``check`` and ``hetpar evaluate``'s
gaps to a reference file (hetpar/agents/reference.py)."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, run
from hetpar.agents import reference
from hetpar.agents.evaluate import CSV_COLUMNS, REFERENCE_COLUMNS
from hetpar.agents.reference import (FORMAT, build, check, instance_digest, load_references,
                                     suite_id)
from hetpar.configio import bundled_dir
from hetpar.costmodel.constants import load_constants
from hetpar.costmodel.version import COST_MODEL_VERSION, constants_digest, cost_model_id
from hetpar.plan import Plan
from hetpar.problem import Problem
from hetpar.problem.generator import load_suite

LIMIT = 1.0  # seconds of exact search per instance: enough for a bound, not always a proof
SEEDS = ("metis", "megatron")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A reference file of the first two tiny instances."""
    path = tmp_path_factory.mktemp("ref") / "tiny.json"
    report = build("tiny", 2, time_limit=LIMIT, out=path, seeds=SEEDS)
    assert report.solved == [0, 1] and not report.skipped
    return path


@pytest.fixture
def copy(built, tmp_path) -> Path:
    out = tmp_path / "tiny.json"
    shutil.copy(built, out)
    return out


def _edit(path: Path, change) -> None:  # noqa: ANN001 - a function of the document
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_built_file_holds_the_header_and_an_honest_entry_per_instance(built):
    doc = json.loads(built.read_text())
    assert doc["format"] == FORMAT and doc["version"] == 1
    suite = load_suite("tiny")
    assert doc["suite"] == suite_id(suite) and doc["suite"]["seed"] == 7
    assert doc["cost_model"] == {"version": COST_MODEL_VERSION,
                                 "constants_digest": constants_digest()}
    assert (doc["objective"], doc["samples"], doc["seed"]) == ("mean", 16, 0)
    refs = load_references(built)
    assert sorted(refs.entries) == [0, 1]
    for i, e in refs.entries.items():
        inst = suite.instance(i)
        assert e.name == inst.name and e.instance_digest == instance_digest(inst)
        assert e.time_limit_s == LIMIT and e.workers == 1 and e.wall_s > 0
        problem = Problem.from_instance(inst, samples=16, seed=0)
        # The stored value is the stored plan's, and no seed did better.
        assert e.value_s == pytest.approx(problem.value(Plan.from_dict(e.plan)), rel=1e-12)
        assert all(v is None or e.value_s <= v * (1 + 1e-9) for v in e.seeds.values())
        assert set(e.seeds) == set(SEEDS) and e.found_by
        assert e.lower_bound_s is not None and 0 < e.lower_bound_s <= e.value_s * (1 + 1e-9)
        assert e.optimal == (e.gap == 0.0)
        assert e.gap == pytest.approx(max(0.0, e.value_s / e.lower_bound_s - 1), abs=1e-12)
        assert e.optimal or e.exact["stopped"]


def test_check_passes_on_a_fresh_build(capsys, built):
    assert check(load_references(built)) == []
    code, out, err = run(capsys, "reference", "check", built)
    assert code == 0, err
    assert "all current" in out


def test_tampered_value_is_stale_and_the_file_unchanged_without_update(capsys, copy):
    _edit(copy, lambda d: d["instances"][0].update(value_s=d["instances"][0]["value_s"] * 1.01))
    before = copy.read_bytes()
    code, out, err = run(capsys, "reference", "check", copy)
    assert code == 1, (out, err)
    assert "1 stale" in out and "#0 tiny-0" in out and "stored" in out
    assert "#1" not in out
    assert copy.read_bytes() == before
    # --update drops the stale entry; what is left checks clean.
    code, out, err = run(capsys, "reference", "check", copy, "--update")
    assert code == 0, err
    assert sorted(load_references(copy).entries) == [1]
    code, out, _ = run(capsys, "reference", "check", copy)
    assert code == 0 and "all current" in out


def test_invalid_plan_and_foreign_instance_are_stale(copy):
    def tamper(doc):
        doc["instances"][0]["plan"]["stages"][0]["replicas"][0]["host"] = "no-such-host"
        doc["instances"][1]["instance_digest"] = "sha256:0000000000000000"
    _edit(copy, tamper)
    stale = {s.index: s.why for s in check(load_references(copy))}
    assert set(stale) == {0, 1}
    assert stale[0].startswith("plan invalid") and "no longer generates" in stale[1]


def _refit(gpu_type: str):
    """The bundled constants with ``gpu_type`` given efficiencies of its own."""
    import dataclasses

    from hetpar.costmodel.constants import GpuEfficiency

    consts = load_constants()
    return dataclasses.replace(consts, gpu={**consts.gpu, gpu_type: GpuEfficiency(0.5, 0.7)})


def test_entries_record_the_constants_their_instances_read(built):
    refs = load_references(built)
    suite = load_suite("tiny")
    assert refs.per_entry_constants
    for i, e in refs.entries.items():
        assert e.constants_digest == reference.entry_constants_digest(suite.instance(i))
    # Instance 0 runs on A10 and A100 GPUs, instance 1 on RTX 3090 and V100 ones.
    assert reference.entry_constants_digest(suite.instance(0)) != \
        reference.entry_constants_digest(suite.instance(1))


def test_a_refit_stales_only_the_entries_of_the_gpu_types_it_touches(copy):
    refs = load_references(copy)
    # A type no instance uses (the H100) calibrated: nothing is stale, though the
    # constants' digest (the header's) changed.
    h100 = _refit("H100-SXM5-80GB")
    assert constants_digest(h100) != refs.cost_model["constants_digest"]
    assert check(refs, constants=h100) == []
    # The V100 (instance 1's) refitted: instance 1 alone is stale, and --update keeps 0.
    v100 = _refit("V100-SXM2-32GB")
    stale = check(refs, constants=v100)
    assert [(s.index, "other calibrated constants" in s.why) for s in stale] == [(1, True)]
    kept = reference.drop_stale(refs, stale)
    assert sorted(kept.entries) == [0]


def test_a_legacy_file_gets_its_entries_digests_on_update(copy):
    _edit(copy, lambda d: [e.pop("constants_digest") for e in d["instances"]])
    refs = load_references(copy)
    assert not refs.per_entry_constants
    kept = reference.drop_stale(refs, check(refs))
    assert kept.per_entry_constants and sorted(kept.entries) == [0, 1]


def test_evaluate_refuses_an_entry_solved_under_other_constants(capsys, copy, tmp_path):
    _edit(copy, lambda d: d["instances"][0].update(constants_digest="sha256:x"))
    code, _, err = _evaluate(capsys, tmp_path, "--reference", copy)
    assert_one_line_error(code, err, "instances[0]", "stale", "other calibrated constants",
                          "hetpar reference check")


def test_a_build_solves_again_only_the_entries_a_refit_staled(copy):
    # As after a refit of instance 0's GPU types: its entry's digest and the header's
    # are not the current ones; the build resumes the file and solves 0 alone.
    _edit(copy, lambda d: (d["instances"][0].update(constants_digest="sha256:x"),
                           d["cost_model"].update(constants_digest="sha256:y")))
    report = build("tiny", 2, time_limit=LIMIT, out=copy, seeds=SEEDS)
    assert report.solved == [0] and report.skipped == [1]
    refs = load_references(copy)
    assert refs.cost_model == cost_model_id() and check(refs) == []
    assert refs.entries[0].constants_digest == reference.entry_constants_digest(
        load_suite("tiny").instance(0))


def test_other_cost_model_makes_the_header_stale(copy):
    stale = check(load_references(copy), cost_model={**cost_model_id(), "version": -1})
    assert [s.index for s in stale] == [None]
    assert "cost_model.version" in stale[0].why


def test_a_build_naming_no_seeds_seeds_with_the_policy_where_it_is_installed(capsys, tmp_path,
                                                                            monkeypatch):
    """Without --seeds, the shipped policy's best methods compete with exact's too (where
    the rl extra is installed): a shipped baseline never beats a reference built with the
    defaults. Without torch, the defaults are the solver baselines alone."""
    import importlib.util

    pytest.importorskip("sb3_contrib")
    assert reference.default_seeds() == reference.DEFAULT_SEEDS + reference.POLICY_SEEDS
    assert set(reference.POLICY_SEEDS) == {"policy", "policy-beam"}
    path = tmp_path / "tiny.json"
    code, out, err = run(capsys, "reference", "build", "tiny", "--n", "1", "--time-limit",
                         LIMIT, "--out", path)
    assert code == 0, err
    entry = load_references(path).entries[0]
    assert set(entry.seeds) == set(reference.DEFAULT_SEEDS + reference.POLICY_SEEDS)
    assert all(v is not None for v in entry.seeds.values())
    assert all(entry.value_s <= v * (1 + 1e-9) for v in entry.seeds.values())
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert reference.default_seeds() == reference.DEFAULT_SEEDS


def test_interrupted_build_keeps_what_it_finished_and_a_rerun_skips_it(capsys, tmp_path):
    path = tmp_path / "tiny.json"
    code, out, err = run(capsys, "reference", "build", "tiny", "--n", "1", "--time-limit",
                         LIMIT, "--seeds", ",".join(SEEDS), "--out", path)
    assert code == 0, err
    assert "#0 tiny-0" in out and "1 solved, 0 done before" in out
    first = load_references(path).entries[0]
    code, out, err = run(capsys, "reference", "build", "tiny", "--n", "2", "--time-limit",
                         LIMIT, "--seeds", ",".join(SEEDS), "--out", path)
    assert code == 0, err
    assert "#0 tiny-0: done before, skipped" in out and "1 solved, 1 done before" in out
    refs = load_references(path)
    assert sorted(refs.entries) == [0, 1] and refs.entries[0] == first
    assert not list(tmp_path.glob("*.tmp"))


def test_retry_solves_unproven_entries_again_from_their_plan_and_keeps_the_best(capsys,
                                                                             copy):
    """--retry re-solves only the entries not proven optimal, with the stored plan among
    the starts, and merges: the better plan, the higher bound, the attempts counted."""
    refs = load_references(copy)
    proven = {i: e for i, e in refs.entries.items() if e.optimal}
    assert 0 in proven, "tiny-0 is proven within the limit"
    # Entry 0 as a stopped search would have left it: a weak bound, not proven.
    weak = proven[0].lower_bound_s / 2
    _edit(copy, lambda d: d["instances"][0].update(lower_bound_s=weak, gap=1.0,
                                                   optimal=False))
    before = load_references(copy).entries
    again = sorted(i for i, e in before.items() if not e.optimal)  # 0, and 1 if unproven
    code, out, err = run(capsys, "reference", "build", "tiny", "--n", "2", "--time-limit",
                         LIMIT, "--seeds", ",".join(SEEDS), "--out", copy, "--retry")
    assert code == 0, err
    assert f"{len(again)} solved ({len(again)} of them again)" in out
    after = load_references(copy)
    for i, old in before.items():
        e = after.entries[i]
        if i not in again:
            assert e == old  # proven: as it was
            continue
        assert e.attempts == 2 and e.wall_s > old.wall_s
        assert e.value_s <= old.value_s * (1 + 1e-12)
        assert e.lower_bound_s >= old.lower_bound_s
    e = after.entries[0]
    assert e.optimal and e.lower_bound_s > weak
    assert check(after) == []
    # Without --retry a re-run skips every entry, proven or not.
    code, out, err = run(capsys, "reference", "build", "tiny", "--n", "2", "--time-limit",
                         LIMIT, "--seeds", ",".join(SEEDS), "--out", copy)
    assert code == 0 and "0 solved, 2 done before" in out


def test_merge_keeps_the_better_plan_and_the_higher_bound(built):
    import dataclasses

    e = load_references(built).entries[0]
    worse = dataclasses.replace(e, value_s=e.value_s * 1.5, lower_bound_s=e.value_s * 0.5,
                                optimal=False, found_by="metis", wall_s=1.0)
    # A later attempt that found the better plan but proved less: plan from it, bound
    # from the earlier one.
    a = reference.merge(dataclasses.replace(worse, lower_bound_s=e.value_s * 0.9), e)
    assert a.value_s == e.value_s and a.found_by == e.found_by
    assert a.lower_bound_s == e.lower_bound_s and a.attempts == 2
    # A tie keeps the earlier plan's credit; a bound is never above the plan's value.
    b = reference.merge(dataclasses.replace(e, found_by="first"),
                        dataclasses.replace(e, found_by="second",
                                            lower_bound_s=e.value_s * 2))
    assert b.found_by == "first" and b.lower_bound_s == e.value_s and b.optimal
    c = reference.merge(e, worse)
    assert c.value_s == e.value_s and c.wall_s == e.wall_s + 1.0


def test_a_build_stopped_mid_instance_keeps_the_finished_ones(monkeypatch, copy):
    _edit(copy, lambda d: d["instances"].pop())  # instance 1 not done yet
    done = copy.read_bytes()

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(reference, "solve_instance", stop)
    with pytest.raises(KeyboardInterrupt):
        build("tiny", 2, time_limit=LIMIT, out=copy, seeds=SEEDS)
    assert sorted(load_references(copy).entries) == [0]
    assert json.loads(copy.read_bytes()) == json.loads(done)


def test_build_into_a_file_of_other_settings_is_refused(capsys, copy):
    code, _, err = run(capsys, "reference", "build", "tiny", "--n", "2", "--time-limit", LIMIT,
                       "--objective", "p90", "--out", copy)
    assert_one_line_error(code, err, str(copy), "objective", "mean", "p90")


def _evaluate(capsys, tmp_path, *extra):
    return run(capsys, "evaluate", "--suite", "tiny", "--n", "2", "--methods",
               "metis,megatron", "--out", tmp_path / "ev", *extra)


@pytest.mark.parametrize("change,field,needles", [
    (None, "objective", ("built for objective mean, not p90",)),
    (lambda d: d["cost_model"].update(version=0), "cost_model.version",
     ("cost-model version 0, not",)),
    # A file whose entries do not record their constants (written before they did): the
    # header's constants digest rules.
    (lambda d: (d["cost_model"].update(constants_digest="sha256:x"),
                [e.pop("constants_digest") for e in d["instances"]]),
     "cost_model.constants_digest", ("sha256:x",)),
    (lambda d: d["suite"].update(seed=8), "suite.seed", ("suite seed 8, not 7",)),
    (lambda d: d.update(samples=4), "samples", ("samples 4, not 16",)),
])
def test_evaluate_refuses_a_mismatched_reference_in_one_line(capsys, copy, tmp_path, change,
                                                             field, needles):
    extra: tuple = ("--objective", "p90") if change is None else ()
    if change is not None:
        _edit(copy, change)
    code, _, err = _evaluate(capsys, tmp_path, "--reference", copy, *extra)
    assert_one_line_error(code, err, str(copy), f": {field}: ", "--no-reference", *needles)
    assert not (tmp_path / "ev").exists()


def test_evaluate_refuses_a_stale_plan(capsys, copy, tmp_path):
    _edit(copy, lambda d: d["instances"][1].update(value_s=d["instances"][1]["value_s"] * 2))
    code, _, err = _evaluate(capsys, tmp_path, "--reference", copy)
    assert_one_line_error(code, err, "instances[1]", "stale", "hetpar reference check")


def test_evaluate_refuses_an_invalid_plan(capsys, copy, tmp_path):
    _edit(copy, lambda d: d["instances"][0]["plan"]["stages"][0]["replicas"][0].update(
        host="no-such-host"))
    code, _, err = _evaluate(capsys, tmp_path, "--reference", copy)
    assert_one_line_error(code, err, str(copy), "instances[0].plan", "no-such-host")


def test_evaluate_reports_gaps_to_the_reference(capsys, copy, tmp_path):
    code, out, err = _evaluate(capsys, tmp_path, "--reference", copy)
    assert code == 0, err
    assert "Gaps to the reference file" in out and "gap to optimum" in out
    with (tmp_path / "ev" / "results.csv").open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS + REFERENCE_COLUMNS
        statuses = [r["ref_status"] for r in reader]
    # The figures from results.json (results.csv rounds to 6 digits).
    doc = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert doc["reference_file"] == str(copy)
    rows = doc["rows"]
    assert [r["ref_status"] for r in rows] == statuses and len(rows) == 4
    refs = load_references(copy)
    for r in rows:
        e = refs.entries[r["index"]]
        value = r["value_s"]
        assert r["ref_value_s"] == e.value_s
        if e.optimal:
            assert r["ref_status"] == "optimal" and r["gap_to_bound"] is None
            assert r["gap_to_optimum"] == pytest.approx(value / e.value_s - 1, abs=1e-12)
            assert value >= e.value_s * (1 - 1e-9)
        else:
            assert r["ref_status"] == "bounded" and r["gap_to_optimum"] is None
            assert r["gap_to_bound"] == pytest.approx(value / e.lower_bound_s - 1, abs=1e-12)
            assert r["gap_to_ref_best"] == pytest.approx(value / e.value_s - 1, abs=1e-12)
            assert r["gap_to_bound"] >= r["gap_to_ref_best"]  # the bound's gap bounds it


def test_evaluate_names_a_reference_that_a_method_of_the_run_beats():
    """A plan better than the file's best plan of an unproven instance means the file is
    stale against that method: the summary says so, names the instances and the retry
    that mends it. Equal plans and proven entries are not reported."""
    from hetpar.agents.evaluate import Evaluation, Row

    def row(index: int, method: str, status: str, gap_to_ref_best: float) -> Row:
        return Row(suite="test-iid", index=index, instance=f"test-iid-{index}", hosts=2,
                   gpus=8, model="gpt3-125m", method=method, objective="mean",
                   value_s=1.0 + gap_to_ref_best, wall_s=0.1, ref_status=status,
                   ref_value_s=1.0, ref_bound_s=0.5, gap_to_bound=1.0 + 2 * gap_to_ref_best,
                   gap_to_ref_best=gap_to_ref_best)

    rows = [row(0, "policy", "bounded", -0.05), row(0, "metis", "bounded", 0.10),
            row(1, "policy", "bounded", 0.0), row(1, "metis", "bounded", 0.0)]
    ev = Evaluation(suite="test-iid", n=2, methods=("policy", "metis"), objective="mean",
                    samples=16, seed=0, time_limit=10.0, rows=rows,
                    reference="configs/references/test-iid.json")
    assert ev.beaten_references() == [rows[0]]
    md = ev.summary_markdown()
    assert "**The reference file is stale against policy**" in md
    assert "test-iid-0 by policy (-5.0%)" in md and "test-iid-1" not in md.split("stale")[1]
    assert ("hetpar reference build test-iid --n 2 --retry --seeds "
            "metis,megatron,local-search,policy") in md
    # exact is no seed method: the retry runs it anyway, so the command leaves it out.
    rows[1].method, rows[1].gap_to_ref_best, rows[1].value_s = "exact", -0.02, 0.98
    md = ev.summary_markdown()
    assert "**The reference file is stale against exact,policy**" in md
    assert "--retry --seeds metis,megatron,local-search,policy`" in md
    for r in rows[:2]:
        r.value_s, r.gap_to_ref_best = 1.0, 0.0
    assert ev.beaten_references() == [] and "stale" not in ev.summary_markdown()


def test_evaluate_finds_the_suite_reference_by_default(capsys, copy, tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "default_path", lambda name: copy.with_name(f"{name}.json"))
    code, out, err = _evaluate(capsys, tmp_path)
    assert code == 0, err
    assert f"Gaps to the reference file `{copy}`" in out
    # --no-reference, or no file for the suite: the output of before.
    for extra in (("--no-reference",), ()):
        if not extra:
            monkeypatch.setattr(reference, "default_path", lambda name: tmp_path / "none.json")
        shutil.rmtree(tmp_path / "ev")
        code, out, err = _evaluate(capsys, tmp_path, *extra)
        assert code == 0, err
        assert "Gaps to the reference file" not in out
        with (tmp_path / "ev" / "results.csv").open(newline="") as fh:
            assert tuple(csv.DictReader(fh).fieldnames or ()) == CSV_COLUMNS


def test_malformed_reference_file_is_one_line(capsys, tmp_path, copy):
    _edit(copy, lambda d: d.update(format="something-else"))
    code, _, err = _evaluate(capsys, tmp_path, "--reference", copy)
    assert_one_line_error(code, err, str(copy), "format")
    code, _, err = run(capsys, "reference", "check", tmp_path / "missing.json")
    assert_one_line_error(code, err, "missing.json", "no such file")


def test_constants_digest_follows_the_constants():
    consts = load_constants()
    assert constants_digest(consts) == constants_digest()
    other = consts.with_framework("megatron-lm", net_efficiency=0.5)
    assert constants_digest(other) != constants_digest(consts)


SHIPPED = sorted((bundled_dir() / "references").glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_reference_files_are_current(path):
    """Every shipped file re-scores as stored under this cost model: after a change to the
    cost model, run 'hetpar reference check --update' and rebuild (docs/solvers.md)."""
    refs = load_references(path)
    assert refs.suite["name"] == path.stem
    assert check(refs) == []
    assert all(math.isfinite(e.value_s) for e in refs.entries.values())


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_reference_files_cover_twenty_instances_and_exact_never_loses(path):
    """The first 20 instances of each held-out suite, each with a plan; the stored bound
    never above the stored value; exact's answer never worse than a seed method's (its
    plans were exact's start plans); and every entry not proven optimal had the shipped
    policy's ``hetpar plan`` among its seeds, so no shipped baseline beats a reference."""
    refs = load_references(path)
    assert sorted(refs.entries) == list(range(20))
    for e in refs.entries.values():
        assert e.plan is not None and e.lower_bound_s is not None
        assert e.lower_bound_s <= e.value_s * (1 + 1e-12)
        assert e.optimal == (e.gap == 0.0)
        exact = e.exact["value_s"]
        for method, value in e.seeds.items():
            assert value is None or exact <= value * (1 + 1e-9), (e.name, method)
        assert e.optimal or "policy" in e.seeds, e.name


def test_no_shipped_baseline_in_the_golden_snapshot_beats_a_shipped_reference():
    """The golden snapshot (tests/data/golden_plans.json) stores what the shipped methods
    plan on the first 20 instances of every held-out suite, under the reference files'
    objective, sample count and seed. A reference whose best plan one of them beats has
    gone stale against a shipped baseline (a new policy, or a new default decoding):
    solve its unproven entries again with that method among the seeds, e.g.
    'hetpar reference build SUITE --n 20 --retry --time-limit 10 --seeds
    metis,megatron,local-search,policy,policy-beam' (docs/solvers.md)."""
    from bench_helpers import load_benchmark

    same_plans = load_benchmark("same_plans")  # the snapshot's own reader
    golden = same_plans.load_golden(Path(__file__).parent / "data" / "golden_plans.json")
    refs = {p.stem: load_references(p) for p in SHIPPED}
    beaten, compared = [], 0
    for case in golden["cases"]:
        inputs = case["inputs"]
        if case["group"] != "suite" or inputs["suite"] not in refs:
            continue
        file = refs[inputs["suite"]]
        entry = file.entries.get(int(inputs["index"]))
        if entry is None:
            continue
        # The same problem: otherwise the values would not compare.
        assert (case["objective"], case["samples"], case["seed"]) == (
            file.objective, file.samples, file.seed), case["id"]
        value = same_plans._from_json_value(case["value_s"])
        if not math.isfinite(value):
            continue  # no plan
        compared += 1
        if value < entry.value_s * (1 - reference.TIE):
            beaten.append(f"{case['id']}: {value:.6g} < {entry.value_s:.6g}")
    assert compared >= 400  # 5 suites x 20 instances x the snapshot's 6 methods, most with plans
    assert not beaten, "; ".join(beaten)


def test_check_update_records_the_digests_of_a_legacy_file(capsys, copy):
    _edit(copy, lambda d: [e.pop("constants_digest") for e in d["instances"]])
    code, out, err = run(capsys, "reference", "check", str(copy), "--update")
    assert code == 0, err
    assert "recorded each entry's constants digest" in out
    assert load_references(copy).per_entry_constants
