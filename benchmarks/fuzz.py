"""Fuzz hetpar's command line with bad and extreme inputs; count what happens to each.

    python benchmarks/fuzz.py --n 2000 --seed 0 [--jobs 2] [--examples 3]

Generates ``--n`` cases: first the defects issue 25 found (a fixed list), then random
mutations of every bundled config kind under ``configs/`` (clusters, models, training
specs, plans, suites, saved instance files, scenarios, bandwidth traces, the GPU catalog,
the calibration file, the reference files, small training configs), of the bundled policy
file (damaged metadata, safetensors headers and zips, zip bombs, and format-1 files with a
pickled payload in every member) and of the flags. Each case runs ``hetpar estimate``,
``solve``, ``plan``, ``evaluate``, ``train``, ``replan``, ``policy show`` or ``suite show``
in a subprocess, in a fresh folder, with a 30 s timeout (90 s for ``train``, a whole
tiny run) and a 2 GiB address-space limit
(``resource.setrlimit``), and is classed:

``code-ran``        a payload in an input file ran (it creates a marker file)
``ok``              exit 0, and the output holds no NaN, inf or negative figure
``refusal``         exit 2 with exactly one line ``hetpar: error: ...`` on stderr
``traceback``       a Python traceback (any exit status)
``hang``            still running after 30 s, 90 s for ``train`` (killed)
``memory``          a MemoryError, or killed at the 2 GiB limit
``nonsense``        exit 0 with NaN, inf or a negative figure in the output, or --json
                    output that is not strict JSON
``accepted-invalid``exit 0 on an input the generator knows to be invalid
``unclean``         any other ending (exit 2 with more than one line, exit 1, a signal)

Prints the count of each class and the first examples of every bad class (all but ``ok``
and ``refusal``); exits with status 1 if any case was bad. Cases are reproducible: the
same ``--seed`` generates the same inputs.
"""

from __future__ import annotations

import argparse
import base64
import copy
import io
import json
import math
import os
import pickle
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
TIMEOUT_S = 30.0
# A training case runs a whole (tiny) run: torch's start, imitation, PPO, evaluations and
# checkpoints take about 12 s on an idle 2-core machine, and the tests run cases two at a
# time beside other test workers, where 30 s was reached (stop 52's CI): a hang is still
# a run past this.
TRAIN_TIMEOUT_S = 90.0
MEMORY_BYTES = 2 * 2**30
BAD = ("code-ran", "traceback", "hang", "memory", "nonsense", "accepted-invalid", "unclean")

# Keys whose values may legitimately be negative in --json output (relative differences).
NEGATIVE_OK = re.compile(r"gap|delta|diff|change|saving|improve|vs|speedup|relative|rel_|"
                         r"spearman|kendall|corr|log|headroom")  # headroom < 0: does not fit


@dataclass
class Case:
    """One run: ``argv`` after ``hetpar``, files to write into the case's folder (name ->
    bytes or text), whether the generator knows the input is invalid, and a label."""

    label: str
    argv: list[str]
    files: dict[str, bytes | str] = field(default_factory=dict)
    invalid: bool = False


@dataclass
class Outcome:
    case: Case
    kind: str
    rc: int | None
    seconds: float
    detail: str


# ---- running and classing ----------------------------------------------------------------

def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def run_case(case: Case) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="hetpar-fuzz-") as tmp:
        for name, content in case.files.items():
            path = Path(tmp) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        argv = [a.replace("{tmp}", tmp) for a in case.argv]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        start = time.perf_counter()
        timeout = TRAIN_TIMEOUT_S if argv[:1] == ["train"] else TIMEOUT_S
        try:
            proc = subprocess.run([sys.executable, "-m", "hetpar", *argv], cwd=tmp, env=env,
                                  capture_output=True, timeout=timeout,
                                  preexec_fn=_limit_memory, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return Outcome(case, "hang", None, time.perf_counter() - start,
                           f"still running after {timeout:.0f} s")
        seconds = time.perf_counter() - start
        if (Path(tmp) / MARKER).exists():
            return Outcome(case, "code-ran", proc.returncode, seconds,
                           "a payload in an input file ran")
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    kind, detail = classify(case, proc.returncode, out, err)
    return Outcome(case, kind, proc.returncode, seconds, detail)


def classify(case: Case, rc: int, out: str, err: str) -> tuple[str, str]:
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if "MemoryError" in err or "Cannot allocate memory" in err or "bad_alloc" in err:
        return "memory", last
    if "Traceback (most recent call last)" in err:
        return "traceback", last
    if rc in (-9, -11, 137, 139):
        return "memory", f"killed by signal {-rc if rc < 0 else rc - 128}"
    if rc == 2:
        lines = err.strip().splitlines()
        if len(lines) == 1 and lines[0].startswith("hetpar: error: "):
            return "refusal", lines[0]
        return "unclean", f"exit 2 with {len(lines)} lines on stderr: {last}"
    if rc != 0:
        return "unclean", f"exit {rc}: {last}"
    bad = nonsense(case, out)
    if bad:
        return "nonsense", bad
    if case.invalid:
        return "accepted-invalid", "exit 0"
    return "ok", ""


def nonsense(case: Case, out: str) -> str:
    """Why exit-0 output is nonsense ("" if it is not)."""
    if "--json" in case.argv:
        try:
            doc = json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(
                ValueError(f"{c} is not JSON")))
        except ValueError as exc:
            return f"--json output is not strict JSON: {str(exc)[:100]}"
        found: list[str] = []

        def walk(x: Any, key: str) -> None:  # noqa: ANN401
            if isinstance(x, dict):
                for k, v in x.items():
                    if k != "meta":  # free-form data echoed back (suite show)
                        walk(v, str(k))
            elif isinstance(x, list):
                for v in x:
                    walk(v, key)
            elif isinstance(x, float) and not math.isfinite(x):
                found.append(f"{key}={x}")
            elif (isinstance(x, (int, float)) and not isinstance(x, bool) and x < 0
                  and not NEGATIVE_OK.search(key) and key not in ("seed",)):
                found.append(f"{key}={x}")

        walk(doc, "")
        return ("negative or non-finite figures: " + ", ".join(found[:3])) if found else ""
    hit = re.search(r"(?<![\w.-])(nan|inf|infinity|-inf)(?![\w-])", out, re.IGNORECASE)
    return f"{hit.group(0)!r} in the output" if hit else ""


# ---- inputs ------------------------------------------------------------------------------

def _absolute_refs(doc: Any, base: Path) -> Any:  # noqa: ANN401
    """``doc`` with relative file references (traces, catalogs, clusters) made absolute, so
    a mutated copy written elsewhere still finds them."""
    if isinstance(doc, dict):
        return {k: _absolute_refs(v, base) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_absolute_refs(v, base) for v in doc]
    if (isinstance(doc, str) and len(doc) < 200 and "\n" not in doc
            and ("/" in doc or doc.endswith((".csv", ".yaml", ".json")))):
        candidate = base / doc
        if candidate.is_file():
            return str(candidate.resolve())
    return doc


def bundled(kind: str) -> list[tuple[str, Any]]:
    """(file name, parsed document) of every bundled config of one kind."""
    folder = CONFIGS / kind
    out = []
    for path in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.json")):
        with path.open(encoding="utf-8") as fh:
            doc = json.load(fh) if path.suffix == ".json" else yaml.safe_load(fh)
        out.append((path.name, _absolute_refs(doc, folder)))
    return out


EXTREMES: list[Any] = [0, -1, -0.5, 1e308, -1e308, 1e-308, 5e-324, 2**63, 2**64 + 1, 10**30,
                       10**18, 1e18, 0.001, 1e-9, 3.5, "", "x" * 5000, "\x00\x01", None, True,
                       [], {}, [1, 2], {"a": 1}, "../../../../etc/passwd", "-1", "nan", "1e308"]
NON_FINITE: list[Any] = [float("nan"), float("inf"), float("-inf")]


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:  # noqa: ANN401
    """Every path (tuple of keys / indices) to a value inside ``doc``."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def _get(doc: Any, path: tuple) -> Any:  # noqa: ANN401
    for p in path:
        doc = doc[p]
    return doc


def _free_form(path: tuple) -> bool:
    return any(p in ("meta", "description", "notes", "source", "name") for p in path)


def mutate(doc: Any, rng: random.Random) -> tuple[Any, bool, str]:  # noqa: ANN401
    """A mutated deep copy of ``doc``: (document, known invalid, what was done)."""
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc)]
    op = rng.choice(["extreme", "extreme", "non_finite", "scale", "scale", "scale", "scale",
                     "scale", "scale", "scale", "scale", "delete", "unknown_key", "retype",
                     "duplicate", "swap"])
    if not paths:
        op = "unknown_key"
    path = rng.choice(paths) if paths else ()
    parent = _get(doc, path[:-1]) if path else doc
    key = path[-1] if path else None
    if op == "extreme":
        value = rng.choice(EXTREMES)
        parent[key] = value
        return doc, False, f"{'.'.join(map(str, path))} = {str(value)[:40]!r}"
    if op == "non_finite":
        value = rng.choice(NON_FINITE)
        parent[key] = value
        return doc, True, f"{'.'.join(map(str, path))} = {value}"
    if op == "scale":
        numeric = [p for p in paths if isinstance(_get(doc, p), (int, float))
                   and not isinstance(_get(doc, p), bool)]
        if numeric:
            path = rng.choice(numeric)
            parent, key = _get(doc, path[:-1]), path[-1]
            factor = rng.choice([1e3, 1e6, 1e9, 1e12, 1e-3, 1e-6, 1e-12, -1, 0, 2, 0.5, 2, 0.5,
                                 10, 0.1, 4, 0.25, 3, 100, 0.01])
            value = parent[key] * factor
            parent[key] = int(value) if isinstance(parent[key], int) and factor >= 1 else value
            return doc, False, f"{'.'.join(map(str, path))} *= {factor:g}"
    if op == "delete" and key is not None:
        del parent[key]
        return doc, False, f"del {'.'.join(map(str, path))}"
    if op == "retype" and key is not None:
        value = parent[key]
        parent[key] = (str(value) if not isinstance(value, str) else [value])
        return doc, False, f"{'.'.join(map(str, path))} retyped"
    if op == "duplicate":
        lists = [p for p in paths if isinstance(_get(doc, p), list) and _get(doc, p)]
        if lists:
            path = rng.choice(lists)
            items = _get(doc, path)
            items.append(copy.deepcopy(rng.choice(items)))
            return doc, False, f"{'.'.join(map(str, path))} item duplicated"
    if op == "swap":
        lists = [p for p in paths if isinstance(_get(doc, p), list) and len(_get(doc, p)) > 1]
        if lists:
            path = rng.choice(lists)
            rng.shuffle(_get(doc, path))
            return doc, False, f"{'.'.join(map(str, path))} shuffled"
    # unknown key in a mapping that is a schema (not free-form, not a by-name mapping)
    maps = [p for p in [()] + paths if isinstance(_get(doc, p), dict) and not _free_form(p)
            and (not p or p[-1] not in ("gpus", "frameworks", "to", "intra_efficiency"))]
    where = rng.choice(maps) if maps else ()
    target = _get(doc, where)
    if isinstance(target, dict):
        target["bogus_field_xyz"] = 1
        return doc, True, f"unknown key at {'.'.join(map(str, where)) or 'top'}"
    return doc, False, "unchanged"


def still_invalid(doc: Any) -> bool:  # noqa: ANN401
    """Whether ``doc`` still holds a mark of a known-invalid mutation: a NaN or infinite
    number, or the unknown key ``bogus_field_xyz``."""
    if isinstance(doc, float):
        return not math.isfinite(doc)
    if isinstance(doc, dict):
        return "bogus_field_xyz" in doc or any(still_invalid(v) for v in doc.values())
    if isinstance(doc, list):
        return any(still_invalid(v) for v in doc)
    return False


def mutate_some(doc: Any, rng: random.Random, rounds: list[int]) -> tuple[Any, bool, str]:  # noqa: ANN401
    """``mutate`` applied a number of times drawn from ``rounds``: (document, still known
    invalid, what was done)."""
    mutated, invalid, what = doc, False, ""
    for _ in range(rng.choice(rounds)):
        mutated, inv, w = mutate(mutated, rng)
        invalid = invalid or inv
        what = f"{what}; {w}" if what else w
    # A later mutation may have removed what made the document invalid.
    return mutated, invalid and still_invalid(mutated), what


def dump(doc: Any, suffix: str, rng: random.Random) -> str:  # noqa: ANN401
    if suffix == ".json":
        return json.dumps(doc, allow_nan=True)
    try:
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=rng.random() < 0.3,
                              allow_unicode=True, width=4096)
    except yaml.YAMLError:
        return json.dumps(doc, allow_nan=True)


SENTINEL = 918273645546372819  # a number no config holds: the "bigint" attack's target


def with_sentinel(doc: Any, rng: random.Random) -> Any:  # noqa: ANN401
    """``doc`` with one numeric value (not free text) set to SENTINEL."""
    doc = copy.deepcopy(doc)
    numeric = [p for p in _paths(doc) if isinstance(_get(doc, p), (int, float))
               and not isinstance(_get(doc, p), bool) and not _free_form(p)]
    if numeric:
        path = rng.choice(numeric)
        _get(doc, path[:-1])[path[-1]] = SENTINEL
    return doc


def text_attack(text: str, suffix: str, rng: random.Random) -> tuple[str | bytes, bool, str]:
    """A whole-file attack on a document's text: (content, known invalid, what)."""
    op = rng.choice(["deep", "laughs", "selfref", "bigint", "binary", "truncate", "empty",
                     "garbage", "dup_key"])
    if op == "deep":
        depth = rng.choice([100, 1000, 5000])
        body = "[" * depth + "]" * depth
        return (body if suffix == ".json" else f"x: {body}\n"), True, f"nesting {depth} deep"
    if op == "laughs" and suffix != ".json":
        lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        for i in range(1, 10):
            lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
        return "\n".join(lines) + "\n" + text, True, "billion laughs"
    if op == "selfref" and suffix != ".json":
        return "meta: &m {self: *m}\n" + text, True, "self-referencing alias"
    if op == "bigint":
        digits = "9" * rng.choice([30, 400, 4000, 5000])
        new = text.replace(str(SENTINEL), digits, 1)
        return new, new != text, f"{len(digits)}-digit integer"
    if op == "binary":
        return bytes(rng.randrange(256) for _ in range(rng.choice([16, 4096]))), True, "binary"
    if op == "truncate" and len(text) > 10:
        return text[: rng.randrange(1, len(text) - 1)], False, "truncated"
    if op == "empty":
        return "", True, "empty file"
    if op == "dup_key" and suffix != ".json":
        first = text.split("\n", 1)[0]
        return first + "\n" + text, False, "duplicate key"
    return "\x7f{{{{ [[ :: --\n" + text, True, "garbage"


# ---- commands per input kind ---------------------------------------------------------------

AMP_PLAN = str(CONFIGS / "plans" / "amp-het-16-gpt2.json")


def case_for_kind(kind: str, name: str, content: str | bytes, rng: random.Random,
                  invalid: bool, what: str) -> Case:
    """A command reading a mutated file of one kind (written as the case folder's ``F``)."""
    suffix = Path(name).suffix
    f = f"F{suffix}"
    quick_solve = ["--method", rng.choice(["metis", "megatron"]), "--samples", "4", "--json"]
    if kind == "clusters":
        if name.startswith("amp-het-16") and rng.random() < 0.5:
            argv = ["estimate", "--cluster", f, "--model", "gpt2-medium", "--plan", AMP_PLAN,
                    "--json"]
        elif rng.random() < 0.15:
            argv = ["plan", "--cluster", f, "--model", "gpt3-125m", "--no-improve", "--json"]
        elif rng.random() < 0.15:
            argv = ["solve", "--cluster", f, "--model", "gpt3-125m", "--time-limit", "3",
                    "--samples", "4", "--no-policy-start", "--json"]
        else:
            argv = ["solve", "--cluster", f, "--model", "gpt3-125m", *quick_solve]
    elif kind == "models":
        if rng.random() < 0.1:
            argv = ["plan", "--cluster", "amp-het-16", "--model", f, "--no-improve", "--json"]
        else:
            argv = ["solve", "--cluster", "amp-het-16", "--model", f, *quick_solve]
    elif kind == "training":
        argv = ["solve", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--training", f,
                *quick_solve]
    elif kind == "plans":
        if rng.random() < 0.8:
            argv = ["estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--plan",
                    f, "--json"]
        else:
            argv = ["solve", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--start", f,
                    "--time-limit", "2", "--samples", "4", "--no-policy-start", "--json"]
    elif kind in ("suites", "instances"):
        argv = ["suite", "show", f, "--n", "2", "--json"]
    elif kind == "scenarios":
        # --time-limit caps the scenario's exact_time_limit_s (a search may use all of it);
        # the hindsight oracle (a search of every distinct state) is not what is fuzzed.
        argv = ["replan", "--scenario", f, "--strategies", "static", "--iterations", "50",
                "--time-limit", "2", "--no-oracle", "--out", "out"]
    elif kind == "gpus":
        argv = ["estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--plan",
                AMP_PLAN, "--gpus", f, "--json"]
    elif kind == "calibration":
        argv = ["estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--plan",
                AMP_PLAN, "--calibration", f, "--json"]
    else:
        raise ValueError(kind)
    return Case(f"{kind}/{name}: {what}", argv, {f: content}, invalid)


TRACES = {  # trace file -> (cluster or scenario whose links it names, model)
    "wan-demo.csv": ("trace-demo", "gpt3-1.3b"),
    "scenario-geo-degrading.csv": ("geo-degrading", "gpt3-1.3b"),
    "scenario-stable-dc.csv": ("stable-dc", "gpt3-1.3b"),
    "scenario-cloud-congested.csv": ("cloud-congested", "gpt3-1.3b"),
}


def trace_case(rng: random.Random) -> Case:
    name = rng.choice(sorted(TRACES))
    cluster, model = TRACES[name]
    lines = (CONFIGS / "traces" / name).read_text(encoding="utf-8").splitlines()
    op = rng.choice(["nan_time", "nan_value", "neg", "huge", "backwards", "binary", "garbage",
                     "missing", "extra", "empty", "header", "long", "inf_time", "big_time"])
    invalid = True
    rows = [ln.split(",") for ln in lines]
    i = rng.randrange(1, len(rows)) if len(rows) > 1 else 0
    content: str | bytes
    if op == "nan_time":
        rows[i][0] = "nan"
    elif op == "inf_time":
        rows[i][0] = "inf"
    elif op == "big_time":
        rows[i][0] = "1" + "0" * 400
    elif op == "nan_value":
        rows[i][-1] = "nan"
    elif op == "neg":
        rows[i][-1] = "-5"
    elif op == "huge":
        rows[i][-1] = "1e308"
    elif op == "backwards" and len(rows) > 2:
        rows[1], rows[-1] = rows[-1], rows[1]
        invalid = rows[1][0] != rows[-1][0]
    elif op == "missing":
        rows[i] = rows[i][:1]
    elif op == "extra":
        rows[i] = rows[i] + ["7"]
    elif op == "header":
        rows[0][0] = "time"
    elif op == "long":
        rows[i][-1] = "1" * 200_000
    content = "\n".join(",".join(r) for r in rows) + "\n"
    if op == "binary":
        content = bytes(rng.randrange(256) for _ in range(2048))
    elif op == "garbage":
        content = "time_s,\x00\x00\n\xff\n"
    elif op == "empty":
        content = ""
    if name == "wan-demo.csv":  # a link's bandwidth trace inside a cluster file
        doc = yaml.safe_load((CONFIGS / "clusters" / "trace-demo.yaml").read_text())
        doc["links"][0]["bandwidth"]["file"] = "T.csv"
        argv = ["solve", "--cluster", "C.yaml", "--model", model, "--method", "metis",
                "--samples", "4", "--json"]
        return Case(f"traces/{name}: {op}", argv, {"T.csv": content, "C.yaml": yaml.safe_dump(doc)},
                    invalid)
    argv = ["replan", "--trace", "T.csv", "--cluster", cluster, "--model", model,
            "--iterations", "50", "--strategies", "static", "--no-oracle", "--out", "out"]
    return Case(f"traces/{name}: {op}", argv, {"T.csv": content}, invalid)


# ---- policy files, evaluate and train ------------------------------------------------------

POLICY = ROOT / "hetpar" / "agents" / "data" / "default_policy.zip"
MARKER = "PWNED"  # a payload that runs creates this file in the case's folder


class _Payload:
    """Unpickling this creates MARKER in the working folder: the proof that code ran."""

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (Path(MARKER),))


def _zip(members: dict[str, bytes], compress: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _policy_members() -> dict[str, bytes]:
    with zipfile.ZipFile(POLICY) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def legacy_payload_file() -> bytes:
    """A format-1 file (stable-baselines3's zip) with a payload in every pickled member."""
    blob = base64.b64encode(pickle.dumps(_Payload(), protocol=4)).decode()
    item = {":type:": "<class 'x'>", ":serialized:": blob}
    data = {k: item for k in ("policy_class", "observation_space", "action_space",
                              "rollout_buffer_class", "lr_schedule")}
    meta = json.loads(_policy_members()["hetpar_meta.json"])
    meta["format_version"] = 1
    meta.pop("network", None)
    raw = pickle.dumps(_Payload(), protocol=4)
    return _zip({"data": json.dumps(data).encode(), "hetpar_meta.json": json.dumps(meta).encode(),
                 "policy.pth": raw, "pytorch_variables.pth": raw,
                 "policy.optimizer.pth": raw, "_stable_baselines3_version": b"2.3.0"})


def _safetensors_parts(blob: bytes) -> tuple[dict[str, Any], bytes]:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _safetensors(header: Any, body: bytes) -> bytes:  # noqa: ANN401
    text = json.dumps(header, allow_nan=True).encode()
    return len(text).to_bytes(8, "little") + text + body


def policy_file(rng: random.Random) -> tuple[bytes | str, bool, str]:
    """A damaged or hostile policy file: (content, known invalid, what)."""
    members = _policy_members()
    meta = json.loads(members["hetpar_meta.json"])
    op = rng.choice(["meta", "meta", "meta", "meta_text", "header", "header", "header_len",
                     "flip", "truncate", "drop", "extra", "bomb", "legacy", "legacy",
                     "empty", "yaml", "stored", "dup_member"])
    if op == "meta":
        mutated, _, what = mutate_some(meta, rng, [1, 1, 2])
        members["hetpar_meta.json"] = json.dumps(mutated, allow_nan=True).encode()
        return _zip(members), False, f"metadata: {what}"
    if op == "meta_text":
        text, invalid, what = text_attack(json.dumps(meta), ".json", rng)
        members["hetpar_meta.json"] = text.encode() if isinstance(text, str) else text
        return _zip(members), invalid, f"metadata text: {what}"
    if op == "header":
        header, body = _safetensors_parts(members["policy.safetensors"])
        mutated, _, what = mutate(header, rng)
        members["policy.safetensors"] = _safetensors(mutated, body)
        return _zip(members), False, f"safetensors header: {what}"
    if op == "header_len":
        blob = members["policy.safetensors"]
        n = rng.choice([0, 1, 2**32, 2**63, len(blob), len(blob) * 4])
        members["policy.safetensors"] = n.to_bytes(8, "little") + blob[8:]
        return _zip(members), True, f"safetensors header length {n}"
    whole = _zip(members)
    if op == "flip":
        data = bytearray(whole)
        for _ in range(rng.choice([1, 4, 64])):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data), False, "bytes flipped"
    if op == "truncate":
        return whole[: rng.randrange(0, len(whole) - 1)], True, "truncated"
    if op == "drop":
        name = rng.choice(sorted(members))
        del members[name]
        return _zip(members), True, f"{name} missing"
    if op == "extra":
        name = rng.choice(["data", "policy.pth", "x.pkl", "optimizer.safetensors"])
        members[name] = pickle.dumps(_Payload(), protocol=4)
        return _zip(members), False, f"pickled payload as {name}"  # never read: fine
    if op == "bomb":
        name = rng.choice(["hetpar_meta.json", "policy.safetensors"])
        members[name] = bytes(300 * 2**20)
        return _zip(members), True, f"300 MB {name} (zip bomb)"
    if op == "legacy":
        return legacy_payload_file(), True, "format 1 with pickled payloads"
    if op == "empty":
        return b"", True, "empty file"
    if op == "yaml":
        return "max_hosts: 32\n", True, "not a zip"
    if op == "stored":  # no compression: the same file, still valid
        return _zip(members, zipfile.ZIP_STORED), False, "stored, not deflated"
    buf = io.BytesIO()  # the same member twice (zipfile warns, keeps both)
    with zipfile.ZipFile(buf, "w") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr("hetpar_meta.json", b"{}")
    return buf.getvalue(), True, "metadata member twice"


EVALUATE = ["evaluate", "--suite", "tiny", "--n", "1", "--methods", "metis,policy-raw",
            "--time-limit", "2", "--no-reference", "--out", "out", "--json"]


def policy_case(rng: random.Random) -> Case:
    content, invalid, what = policy_file(rng)
    command = rng.choice(["plan", "plan", "show", "evaluate", "train"])
    files: dict[str, bytes | str] = {"P.zip": content}
    if command == "plan":
        argv = ["plan", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--policy",
                "P.zip", "--no-improve", "--json"]
    elif command == "show":
        argv = ["policy", "show", "P.zip"]
        # 'policy show' reads the metadata member alone: damage elsewhere is not its to see
        invalid = invalid and ("hetpar_meta.json" in what or what.startswith(
            ("metadata", "truncated", "empty", "not a zip")))
    elif command == "evaluate":
        argv = ["evaluate", "--suite", "tiny", "--n", "1", "--methods", "policy-raw",
                "--policy", "P.zip", "--no-reference", "--out", "out", "--json"]
    else:
        doc = train_doc()
        doc["total_timesteps"] = 64
        doc.pop("imitation", None)
        doc["finetune"] = {"init_policy": "P.zip"}
        files["T.yaml"] = yaml.safe_dump(doc)
        argv = ["train", "--config", "T.yaml", "--run-name", "r", "--runs-dir", "runs",
                "--no-progress"]
    return Case(f"policies/{command}: {what}", argv, files, invalid)


def train_doc() -> dict[str, Any]:
    """configs/train/tiny.yaml made small enough to run in seconds."""
    doc = yaml.safe_load((CONFIGS / "train" / "tiny.yaml").read_text(encoding="utf-8"))
    doc["total_timesteps"] = 128
    doc["env"]["instances"] = 4
    doc["imitation"]["epochs"] = 2
    doc["ppo"].update(n_steps=64, batch_size=32)
    doc["eval"].update(freq=64, n=1)
    doc["checkpoint"]["freq"] = 64
    return doc


# A training run's length is its config's to choose: a mutation that asks for more work
# (timesteps, epochs, instances, evaluations) is cut back to this size, so the case tests
# the config's checks, not the patience of the harness. Other values pass unchanged.
TRAIN_WORK = {("total_timesteps",): (256, None), ("env", "instances"): (8, None),
              ("imitation", "epochs"): (3, None), ("ppo", "n_steps"): (128, None),
              ("ppo", "n_epochs"): (2, None), ("eval", "n"): (1, None),
              ("eval", "exact_time_limit"): (2, None), ("imitation", "exact_time_limit"): (1, None),
              ("eval", "freq"): (None, 64), ("checkpoint", "freq"): (None, 64),
              ("n_envs",): (2, None), ("env", "samples"): (16, None)}


def _bounded_work(doc: Any) -> Any:  # noqa: ANN401
    for path, (most, least) in TRAIN_WORK.items():
        try:
            parent = _get(doc, path[:-1])
            value = parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value <= 0:
            continue
        if most is not None and value > most:
            parent[path[-1]] = most
        if least is not None and value < least:
            parent[path[-1]] = least
    return doc


def train_case(rng: random.Random) -> Case:
    argv = ["train", "--config", "F.yaml", "--run-name", "r", "--runs-dir", "runs",
            "--no-progress"]
    doc = train_doc()
    if rng.random() < 0.12:
        content, invalid, what = text_attack(dump(with_sentinel(doc, rng), ".yaml", rng),
                                             ".yaml", rng)
        return Case(f"train: {what}", argv, {"F.yaml": content}, invalid)
    if rng.random() < 0.15:  # a flag of train
        flag, values = rng.choice([("--timesteps", ["-1", "0", str(10**30), "1e9", "x"]),
                                   ("--seed", ["-1", str(2**64)]),
                                   ("--n-envs", ["0", "-2", "100000"]),
                                   ("--run-name", ["../x", "", "a/b", ".", "x" * 300]),
                                   ("--runs-dir", ["/dev/null", "/proc/x", ""]),
                                   ("--resume", ["nope", "r"])])
        value = rng.choice(values)
        return Case(f"train flag {flag} {value[:20]!r}", [*argv, flag, value],
                    {"F.yaml": yaml.safe_dump(doc)}, None)
    mutated, invalid, what = mutate_some(doc, rng, [1, 1, 2])
    return Case(f"train: {what}", argv, {"F.yaml": dump(_bounded_work(mutated), ".yaml", rng)},
                invalid)


def reference_case(rng: random.Random) -> Case:
    """A mutated reference file (configs/references/) read by 'hetpar evaluate'."""
    name = rng.choice(["test-iid.json", "test-geo.json"])
    doc = json.loads((CONFIGS / "references" / name).read_text(encoding="utf-8"))
    argv = ["evaluate", "--suite", name[:-5], "--n", "1", "--methods", "metis",
            "--reference", "F.json", "--out", "out", "--json"]
    if rng.random() < 0.12:
        content, invalid, what = text_attack(json.dumps(with_sentinel(doc, rng)), ".json", rng)
        return Case(f"references/{name}: {what}", argv, {"F.json": content}, invalid)
    mutated, invalid, what = mutate_some(doc, rng, [1, 1, 2])
    return Case(f"references/{name}: {what}", argv,
                {"F.json": json.dumps(mutated, allow_nan=True)}, invalid)


BASE_COMMANDS: list[list[str]] = [
    ["estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--plan", AMP_PLAN,
     "--json"],
    ["solve", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--method", "metis",
     "--json"],
    ["solve", "--cluster", "amp-het-16", "--model", "gpt3-125m", "--time-limit", "2",
     "--no-policy-start", "--json"],
    ["plan", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--no-improve", "--json"],
    ["suite", "show", "tiny", "--n", "2", "--json"],
    ["replan", "--scenario", "host-loss", "--strategies", "static", "--iterations", "50",
     "--no-oracle", "--out", "out"],
    EVALUATE,
]

FLAG_VALUES: dict[str, list[tuple[str, bool]]] = {  # flag -> (value, known invalid)
    "--seed": [("-1", True), ("0", False), (str(2**64), True), ("9" * 5000, True),
               ("1.5", True), ("", True)],
    "--samples": [("-1", True), ("0", False), ("1000000000", True), ("1e9", True),
                  ("100001", True), ("abc", True), ("7", False)],
    "--time-limit": [("inf", True), ("nan", True), ("-1", True), ("0", True), ("1e308", True),
                     ("1e-9", False), ("-inf", True), ("x", True)],
    "--out": [(".", True), ("/", True), ("/proc/nope/x.json", True), ("/dev/null/x", True),
              ("existing.txt", None), ("missing/folder/x.json", None), ("", True)],
    "--objective": [("p0", None), ("p100", None), ("p101", True), ("p-5", True),
                    ("cvar2", None), ("cvarnan", True), ("cvar0", None), ("", True),
                    ("p1e308", True), ("mean ", None), ("cvar" + "9" * 5000, True)],
    "--workers": [("0", True), ("1000000", True), ("-3", True)],
    "--budget": [("0", True), ("1000000000000", True)],
    "--n": [("-1", True), ("1000000000", True), ("0", None)],
    "--seed-offset": [("-1", True), (str(2**40), True)],
    "--beam": [("0", True), ("1000000", True)],
    "--refine-steps": [("0", True), (str(10**12), True)],
    "--iterations": [("0", True), (str(10**15), True)],
    "--method": [("brute", None), ("nope", True)],
    "--training": [("llama-bf16", None), ("/dev/zero", True), ("/", True)],
    "--cluster": [("/dev/zero", True), ("/", True), ("nope", True)],
    "--model": [("/dev/zero", True), ("llama3-70b", None)],
    "--plan": [("/dev/zero", True), ("/dev/null", True), ("/", True)],
    "--methods": [("nope", True), ("", True), (",", True), ("metis,metis", None),
                  ("brute", None), ("exact,policy-beam", None), ("metis," * 2000, None)],
    "--reference": [("/dev/zero", True), ("/", True), ("nope.json", True),
                    (str(CONFIGS / "references" / "test-geo.json"), True)],
    "--policy": [("/dev/zero", True), ("/", True), ("nope.zip", True), ("clone", None),
                 (str(CONFIGS / "gpus.yaml"), True)],
}


FLAG_COMMANDS = {  # flag -> the BASE_COMMANDS (by their first words) that take it
    "--seed": ("estimate", "solve", "plan", "evaluate"),
    "--samples": ("estimate", "solve", "plan", "evaluate"),
    "--time-limit": ("solve", "plan", "replan", "evaluate"),
    "--out": ("solve", "plan", "replan", "evaluate"),
    "--objective": ("estimate", "solve", "plan", "evaluate"),
    "--workers": ("solve", "evaluate"), "--methods": ("evaluate",),
    "--reference": ("evaluate",), "--policy": ("plan", "evaluate"),
    "--budget": ("solve",), "--n": ("suite",), "--seed-offset": ("suite",),
    "--beam": ("plan", "replan", "evaluate"), "--refine-steps": ("plan", "replan"),
    "--iterations": ("replan",), "--method": ("solve",),
    "--training": ("estimate", "solve", "plan", "replan"),
    "--cluster": ("estimate", "solve", "plan"), "--model": ("estimate", "solve", "plan"),
    "--plan": ("estimate",),
}


def flag_case(rng: random.Random) -> Case:
    flag = rng.choice(sorted(FLAG_VALUES))
    argv = list(rng.choice([c for c in BASE_COMMANDS if c[0] in FLAG_COMMANDS[flag]]))
    value, invalid = rng.choice(FLAG_VALUES[flag])
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    files = {"existing.txt": "I was here\n"} if value == "existing.txt" else {}
    if flag == "--out" and argv[0] in ("replan", "evaluate"):  # --out names a folder there
        if value == "/":
            argv[argv.index(flag) + 1] = value = "sub/dir"  # never write into /
        invalid = value in ("existing.txt", "", "/proc/nope/x.json", "/dev/null/x")
    if flag == "--method" and value == "brute" and "gpt2-medium" in argv:
        invalid = None  # refused up front (space too large), or fine
    return Case(f"flags: {argv[0]} {flag} {value[:30]!r}", argv, files, bool(invalid))


def known_cases() -> list[Case]:
    """The defects issue 25 reported, each once (the harness's regression list)."""
    amp = (CONFIGS / "clusters" / "amp-het-16.yaml").read_text()
    gpus = yaml.safe_load((CONFIGS / "gpus.yaml").read_text())
    est = ["estimate", "--cluster", "amp-het-16", "--model", "gpt2-medium", "--plan", AMP_PLAN,
           "--json"]
    plan_doc = json.loads(Path(AMP_PLAN).read_text())
    cases = [
        Case("1000-level YAML nesting", ["solve", "--cluster", "F.yaml", "--model", "gpt3-125m"],
             {"F.yaml": "x: " + "[" * 1000 + "]" * 1000 + "\n"}, True),
        Case("1000-level JSON plan nesting", [*est[:6], "F.json", "--json"],
             {"F.json": "[" * 1000 + "]" * 1000}, True),
        Case("5000-digit integer in a cluster", ["solve", "--cluster", "F.yaml", "--model",
                                                 "gpt3-125m", "--method", "metis"],
             {"F.yaml": amp.replace("count: 3", "count: " + "9" * 5000)}, True),
        Case("5000-digit integer in a plan", [*est[:6], "F.json", "--json"],
             {"F.json": Path(AMP_PLAN).read_text().replace('"micro_batches": 16',
                                                           '"micro_batches": ' + "9" * 5000)},
             True),
        Case("/dev/zero trace", ["replan", "--trace", "/dev/zero", "--cluster", "trace-demo",
                                 "--model", "gpt3-1.3b", "--iterations", "10", "--out", "o"],
             {}, True),
        Case("binary trace", ["replan", "--trace", "T.csv", "--cluster", "trace-demo",
                              "--model", "gpt3-1.3b", "--iterations", "10", "--out", "o"],
             {"T.csv": bytes(range(256)) * 8}, True),
        Case("Markov rates of 1e308", ["replan", "--scenario", "F.yaml", "--strategies",
                                       "static", "--iterations", "10", "--out", "o"],
             {"F.yaml": (CONFIGS / "scenarios" / "geo-degrading.yaml").read_text()
              .replace("congested: 0.0015", "congested: 1.0e+308")}, True),
        Case("self-referencing instance meta", ["suite", "show", "F.yaml", "--json"],
             {"F.yaml": "format: hetpar-instances\nversion: 1\ninstances:\n- name: x\n"
                        "  meta: &m {self: *m}\n  cluster: {}\n  model: {}\n  training: {}\n"},
             True),
        Case("--seed -1", [*est, "--seed", "-1"], {}, True),
        Case("--out .", ["solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                         "--method", "metis", "--out", "."], {}, True),
        Case("--out names a file (replan)", ["replan", "--scenario", "host-loss",
                                             "--strategies", "static", "--iterations", "10",
                                             "--out", "x.txt"], {"x.txt": "x"}, True),
        Case("--out uncreatable", ["replan", "--scenario", "host-loss", "--strategies",
                                   "static", "--iterations", "10", "--out", "/proc/1/nope/x"],
             {}, True),
        Case("plan --no-improve --json", ["plan", "--cluster", "amp-het-16", "--model",
                                          "gpt2-medium", "--no-improve", "--json"], {}, False),
        Case("unknown key in a plan replica", [*est[:6], "F.json", "--json"],
             {"F.json": json.dumps({**plan_doc, "stages": [
                 {**s, "replicas": [{**r, "bogus": 1} for r in s["replicas"]]}
                 for s in plan_doc["stages"]]})}, True),
        Case("trace with a NaN time", ["solve", "--cluster", "C.yaml", "--model", "gpt3-1.3b",
                                       "--method", "metis"],
             {"C.yaml": (CONFIGS / "clusters" / "trace-demo.yaml").read_text()
              .replace("../traces/wan-demo.csv", "T.csv"),
              "T.csv": "time_s,wan\n0,8\nnan,7\n"}, True),
        Case("a link from a switch to itself", ["solve", "--cluster", "F.yaml", "--model",
                                                "gpt3-125m", "--method", "metis"],
             {"F.yaml": amp + "switches: [s2]\nlinks:\n  - {a: s2, b: s2, capacity_gbps: 10}\n"},
             True),
        Case("two GPU types sharing an alias", [*est, "--gpus", "G.yaml"],
             {"G.yaml": yaml.safe_dump({"gpus": {
                 "X1": {**gpus["gpus"]["T4-16GB"], "aliases": ["dup"]},
                 "X2": {**gpus["gpus"]["T4-16GB"], "aliases": ["dup"]}}})}, True),
        Case("host group of 2**63 hosts", ["solve", "--cluster", "F.yaml", "--model",
                                           "gpt3-125m", "--method", "metis"],
             {"F.yaml": amp.replace("count: 3", f"count: {2**63 - 1}")}, True),
        Case("global batch of 1e18", ["solve", "--cluster", "amp-het-16", "--model",
                                      "gpt2-medium", "--training", "T.yaml", "--method", "metis"],
             {"T.yaml": f"global_batch: {10**18}\n"}, True),
        Case("suite of 10**6 hosts", ["suite", "show", "F.yaml", "--n", "1"],
             {"F.yaml": (CONFIGS / "suites" / "tiny.yaml").read_text()
              .replace("max_hosts: 4", "max_hosts: 1000000")
              .replace("hosts: [2, 3]", "hosts: [1000000, 1000000]")}, True),
        Case("--samples 1e9", [*est, "--samples", "1000000000"], {}, True),
        Case("--time-limit inf", ["solve", "--cluster", "amp-het-16", "--model", "gpt2-medium",
                                  "--time-limit", "inf"], {}, True),
        Case("brute on 32 GPUs", ["solve", "--cluster", "dgx-a100-superpod-4", "--model",
                                  "gpt3-125m", "--method", "brute"], {}, True),
        Case("TFLOP/s given in FLOP/s", [*est, "--gpus", "G.yaml"],
             {"G.yaml": yaml.safe_dump({"gpus": {"V100-SXM2-16GB": {
                 **gpus["gpus"]["V100-SXM2-16GB"], "peak_tflops": {"fp16": 125e12}}}})}, True),
        Case("HBM in TB/s", [*est, "--gpus", "G.yaml"],
             {"G.yaml": yaml.safe_dump({"gpus": {"V100-SXM2-16GB": {
                 **gpus["gpus"]["V100-SXM2-16GB"], "hbm_GBps": 0.9}}})}, True),
        Case("GPU of 1e-308 TFLOP/s", [*est, "--gpus", "G.yaml"],
             {"G.yaml": yaml.safe_dump({"gpus": {"V100-SXM2-16GB": {
                 **gpus["gpus"]["V100-SXM2-16GB"], "peak_tflops": {"fp16": 1e-308}}}})}, True),
        Case("GPU memory of 1e308", [*est, "--gpus", "G.yaml"],
             {"G.yaml": yaml.safe_dump({"gpus": {"V100-SXM2-16GB": {
                 **gpus["gpus"]["V100-SXM2-16GB"], "memory_gib": 1e308}}})}, True),
        Case("0.001 GiB GPU", [*est, "--gpus", "G.yaml"],
             {"G.yaml": yaml.safe_dump({"gpus": {"V100-SXM2-16GB": {
                 **gpus["gpus"]["V100-SXM2-16GB"], "memory_gib": 0.001}}})}, True),
        Case("bf16 on a cluster with V100s", ["solve", "--cluster", "amp-het-16", "--model",
                                              "gpt2-medium", "--training", "llama-bf16",
                                              "--method", "metis"], {}, True),
    ]
    return cases


def instances_doc(suite: str, n: int) -> dict[str, Any]:
    """A saved instance file's document ('hetpar suite sample' writes these)."""
    sys.path.insert(0, str(ROOT))
    from hetpar.problem.generator import INSTANCES_FORMAT, load_suite

    s = load_suite(suite)
    return {"format": INSTANCES_FORMAT, "version": 1, "suite": s.name,
            "max_hosts": s.max_hosts, "instances": [i.to_dict() for i in s.instances(n)]}


def generate(n: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases = known_cases()[:n]
    kinds = {k: bundled(k) for k in ("clusters", "models", "training", "plans", "suites",
                                     "scenarios")}
    kinds["gpus"] = [("gpus.yaml", yaml.safe_load((CONFIGS / "gpus.yaml").read_text()))]
    kinds["calibration"] = [("calibration.yaml",
                             yaml.safe_load((CONFIGS / "calibration.yaml").read_text()))]
    kinds["instances"] = [(f"{name}.yaml", instances_doc(name, 2))
                          for name in ("tiny", "test-geo")]
    weights = {"clusters": 14, "models": 8, "training": 8, "plans": 12, "suites": 8,
               "instances": 4, "scenarios": 4, "gpus": 10, "calibration": 8,
               "traces": 6, "flags": 18, "policies": 8, "train": 5, "references": 3}
    made = {"traces": trace_case, "flags": flag_case, "policies": policy_case,
            "train": train_case, "references": reference_case}
    names = [k for k in weights if k in kinds or k in made]
    while len(cases) < n:
        kind = rng.choices(names, [weights[k] for k in names])[0]
        if kind in made:
            cases.append(made[kind](rng))
            continue
        name, doc = rng.choice(kinds[kind])
        suffix = Path(name).suffix
        if rng.random() < 0.12:
            content, invalid, what = text_attack(dump(with_sentinel(doc, rng), suffix, rng),
                                                 suffix, rng)
        else:
            mutated, invalid, what = mutate_some(doc, rng, [1, 1, 1, 2, 3])
            content = dump(mutated, suffix, rng)
        cases.append(case_for_kind(kind, name, content, rng, invalid, what))
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="cases to run (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generator (default 0)")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--examples", type=int, default=3,
                    help="examples printed of each bad class (default 3)")
    ap.add_argument("--json", metavar="FILE", help="also write every outcome to FILE")
    args = ap.parse_args(argv)
    cases = generate(args.n, args.seed)
    start = time.perf_counter()
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for i, outcome in enumerate(pool.map(run_case, cases), start=1):
            outcomes.append(outcome)
            if outcome.kind in BAD:
                print(f"[{i}/{len(cases)}] {outcome.kind}: {outcome.case.label}: "
                      f"{outcome.detail[:200]}", file=sys.stderr, flush=True)
            elif i % 100 == 0:
                print(f"[{i}/{len(cases)}] {time.perf_counter() - start:.0f} s",
                      file=sys.stderr, flush=True)
    counts = Counter(o.kind for o in outcomes)
    wall = time.perf_counter() - start
    print(f"{len(outcomes)} cases (seed {args.seed}) in {wall:.0f} s")
    for kind in ("ok", "refusal", *BAD):
        print(f"  {kind:<17} {counts.get(kind, 0)}")
    examples: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        if o.kind in BAD and len(examples[o.kind]) < args.examples:
            examples[o.kind].append(o)
    for kind, items in examples.items():
        print(f"\n{kind}:")
        for o in items:
            print(f"  {o.case.label}\n    hetpar {' '.join(a[:60] for a in o.case.argv)}\n"
                  f"    -> {o.detail[:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"label": o.case.label, "argv": o.case.argv, "kind": o.kind, "rc": o.rc,
              "seconds": round(o.seconds, 3), "detail": o.detail} for o in outcomes],
            indent=1) + "\n", encoding="utf-8")
    return 1 if any(counts.get(k) for k in BAD) else 0


if __name__ == "__main__":
    sys.exit(main())
