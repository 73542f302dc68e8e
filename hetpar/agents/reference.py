"""Reference optima as data: ``hetpar reference build`` and ``hetpar reference check``.

A reference file (``configs/references/SUITE.json``, format in configs/README.md section
9) holds, for the first instances of a suite, the best plan known, its value, the lower
bound the exact search proved and the gap between them, under one objective, sample
count and seed and one cost model. ``hetpar evaluate`` measures every method against it,
so a gap is to a proven optimum where there is one, and never to a plan the evaluated
method found itself.

``build`` solves one instance at a time: the seed methods (``metis``, ``megatron`` and
``local-search`` by default; a policy method if asked) in this process, then the exact
search with a time limit in a child process that is killed ``grace_s`` after it
(``solvers.isolated``), so an overrun costs a bounded time and never the build. The best
plan of all becomes the entry; the bound is the exact search's. The file is rewritten
(temp file, then rename) after every instance, so an interrupted build keeps what it
finished and a re-run skips it. With ``retry`` a re-run solves the entries not proven
optimal again, the stored plan among the exact search's starts, and keeps the better plan
and the higher bound of the two attempts (``merge``): both bounds hold under the file's
header, so the larger one does.

``check`` re-scores every stored plan under the current cost model (``Problem.value``)
and reports what is stale: a header for another cost model or suite, an instance the
suite no longer generates, a plan that is no longer valid or whose value moved by more
than ``TIE`` relative. It never writes unless asked (``update``), and then drops the
stale entries, for a build to solve again: a bound proven under another cost model
proves nothing under this one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpar.configio import Reader, bundled_dir, load_document
from hetpar.costmodel.objective import Objective
from hetpar.costmodel.constants import CostConstants
from hetpar.costmodel.version import cost_model_id, instance_constants_digest
from hetpar.errors import ConfigError, HetparError
from hetpar.plan import Plan
from hetpar.problem import DEFAULT_SEED, POLICY_SAMPLES, Problem
from hetpar.problem.instance import Instance

__all__ = [
    "DEFAULT_SEEDS",
    "POLICY_SEEDS",
    "SEED_METHODS",
    "FORMAT",
    "TIE",
    "Entry",
    "References",
    "Stale",
    "build",
    "check",
    "default_seeds",
    "default_path",
    "entry_constants_digest",
    "find_reference",
    "instance_digest",
    "load_references",
    "merge",
    "suite_id",
]

FORMAT = "hetpar-references"
FORMAT_VERSION = 1
# Relative difference below which two values are the same (check, and the optimal flag).
TIE = 1e-9
# Cheap methods whose plans compete with exact's: a time-limited exact answer is never
# worse than theirs, and local search often finds what a stopped search has not.
DEFAULT_SEEDS = ("metis", "megatron", "local-search")
# The shipped policy's methods that plan best (``hetpar plan``'s default and its beam
# variant): seeds by default where the ``rl`` extra is installed, so that no shipped
# baseline beats a reference (tests/test_reference.py checks the shipped files against
# the golden snapshot's plans).
POLICY_SEEDS = ("policy", "policy-beam")
# Every method a build may take as a seed (``--seeds``).
SEED_METHODS = ("metis", "megatron", "random", "local-search", "policy", "policy-beam",
                "policy-greedy", "policy-raw")


_EXACT_KEYS = frozenset({"value_s", "lower_bound_s", "optimal", "found_by", "stopped",
                         "wall_s", "error"})


def default_seeds() -> tuple[str, ...]:
    """The seed methods of a build that names none: ``DEFAULT_SEEDS``, and
    ``POLICY_SEEDS`` where torch and sb3-contrib are installed."""
    import importlib.util

    policy = all(importlib.util.find_spec(m) is not None for m in ("torch", "sb3_contrib"))
    return DEFAULT_SEEDS + (POLICY_SEEDS if policy else ())


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=list)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def instance_digest(instance: Instance) -> str:
    """A digest of the instance's documents: a file entry is for this instance only."""
    return _digest(instance.to_dict())


def entry_constants_digest(instance: Instance, constants: CostConstants | None = None) -> str:
    """The digest of the calibrated constants an instance's plans read (its GPU types'
    efficiencies, its framework's constants, the shared ones): an entry solved under
    other such constants is stale, one whose instance reads none of a change is not."""
    return instance_constants_digest({(h.gpu.name, h.gpu.architecture)
                                      for h in instance.cluster.hosts},
                                     instance.training.framework, constants)


def suite_id(suite: Any) -> dict[str, Any]:
    """The suite's name, seed (None for a fixed instance file) and spec digest.

    The digest covers what generates instances (not the description, nor where the file
    lies), so rewording a suite keeps its references and changing a range does not."""
    spec = suite.spec
    if spec is not None:
        doc = {k: v for k, v in dataclasses.asdict(spec).items()
               if k not in ("description", "source")}
        return {"name": suite.name, "seed": spec.seed, "spec_digest": _digest(doc)}
    return {"name": suite.name, "seed": None,
            "spec_digest": _digest([instance_digest(i) for i in suite.fixed])}


def default_path(suite_name: str) -> Path:
    """Where the reference file of a suite lives: ``configs/references/SUITE.json``."""
    return bundled_dir() / "references" / f"{suite_name}.json"


def find_reference(suite: Any) -> Path | None:
    """The bundled reference file of a generated suite, if there is one. A fixed instance
    file is matched to no file by name: its instances may come from anywhere."""
    if suite.spec is None:
        return None
    path = default_path(suite.name)
    return path if path.is_file() else None


# ---- the file ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One instance's reference: the best plan known and what is proven about it."""

    index: int
    name: str
    instance_digest: str
    hosts: int
    gpus: int
    model: str
    plan: dict[str, Any] | None  # Plan.to_dict(); None: no method found a plan
    value_s: float  # inf without a plan
    lower_bound_s: float | None  # proven over the plan space by exact; None: no proof
    optimal: bool
    found_by: str  # "exact/<part>" or the seed method, e.g. "local-search/improve"
    wall_s: float  # the whole instance: seeds and exact
    time_limit_s: float
    workers: int
    exact: dict[str, Any] = field(default_factory=dict)  # value, bound, stopped, wall, error
    seeds: dict[str, float | None] = field(default_factory=dict)  # value per seed method
    attempts: int = 1  # builds that solved this instance (``build(..., retry=True)``)
    # The constants this instance's plans read (``entry_constants_digest``) when it was
    # solved; "" in files written before entries recorded it (the header's digest rules).
    constants_digest: str = ""

    @property
    def gap(self) -> float | None:
        """value / bound - 1 (0 when the bound meets the value); None without a bound."""
        lb = self.lower_bound_s
        if lb is None or not math.isfinite(self.value_s):
            return None
        if self.value_s <= lb:
            return 0.0
        return self.value_s / lb - 1.0 if lb > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        gap = self.gap
        return {"index": self.index, "name": self.name, "instance_digest": self.instance_digest,
                "hosts": self.hosts, "gpus": self.gpus, "model": self.model,
                "value_s": _num(self.value_s), "lower_bound_s": self.lower_bound_s,
                "gap": None if gap is None or math.isinf(gap) else gap,
                "optimal": self.optimal, "found_by": self.found_by,
                "wall_s": round(self.wall_s, 3), "time_limit_s": self.time_limit_s,
                "workers": self.workers, "exact": self.exact,
                "seeds": {k: _num(v) for k, v in self.seeds.items()},
                "attempts": self.attempts,
                **({"constants_digest": self.constants_digest}
                   if self.constants_digest else {}),
                "plan": self.plan}

    @classmethod
    def from_dict(cls, r: Reader) -> Entry:
        r.check_keys(frozenset({"index", "name", "instance_digest", "hosts", "gpus", "model",
                                "value_s", "lower_bound_s", "gap", "optimal", "found_by",
                                "wall_s", "time_limit_s", "workers", "exact", "seeds",
                                "attempts", "constants_digest", "plan"}))
        plan = r.raw("plan", None)
        if plan is not None and not isinstance(plan, dict):
            raise r.error("plan", f"expected a plan mapping or null, got {plan!r}")
        if plan is not None:  # its structure now, so a damaged entry fails the load
            try:
                Plan.from_dict(plan, r.source)
            except ConfigError as exc:
                raise r.error("plan" + (f".{exc.field}" if exc.field else ""),
                              exc.problem) from None
        value = r.number("value_s", None, positive=True)
        if (plan is None) != (value is None):
            raise r.error("value_s", "a plan and its value go together (both or neither)")
        seeds = r.raw("seeds", {})
        if not isinstance(seeds, dict) or not all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                for v in seeds.values()):
            raise r.error("seeds", f"expected a mapping of method to value or null, "
                                   f"got {seeds!r}")
        exact = r.raw("exact", {})
        if not isinstance(exact, dict):
            raise r.error("exact", f"expected a mapping, got {exact!r}")
        ex = r.sub("exact", {})  # the exact search's own record of this instance
        ex.check_keys(_EXACT_KEYS)
        for key in ("value_s", "lower_bound_s", "wall_s"):
            ex.number(key, None, nonnegative=True)
        ex.bool("optimal", False)
        for key in ("found_by", "stopped", "error"):
            if not isinstance(exact.get(key), (str, type(None))):
                raise ex.error(key, f"expected text or null, got {exact[key]!r}")
        return cls(index=r.int("index", minimum=0), name=r.str("name"),
                   instance_digest=r.str("instance_digest"), hosts=r.int("hosts", 0),
                   gpus=r.int("gpus", 0), model=r.str("model", ""), plan=plan,
                   value_s=math.inf if value is None else value,
                   lower_bound_s=r.number("lower_bound_s", None, nonnegative=True),
                   optimal=r.bool("optimal", False), found_by=r.str("found_by", ""),
                   wall_s=r.number("wall_s", 0.0, nonnegative=True),
                   time_limit_s=r.number("time_limit_s", 0.0, nonnegative=True),
                   workers=r.int("workers", 1, minimum=1), exact=dict(exact),
                   seeds={str(k): (math.inf if v is None else float(v))
                          for k, v in seeds.items()},
                   attempts=r.int("attempts", 1, minimum=1),
                   constants_digest=r.str("constants_digest", ""))


def _num(x: float | None) -> float | None:
    """JSON has no infinity: no plan is null."""
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass
class References:
    """A reference file: the header (what every value was computed under) and entries."""

    suite: dict[str, Any]  # suite_id
    cost_model: dict[str, Any]  # cost_model_id
    objective: str
    samples: int
    seed: int
    entries: dict[int, Entry] = field(default_factory=dict)
    path: Path | None = None

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else "<references>"

    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": FORMAT_VERSION, "suite": dict(self.suite),
                "cost_model": dict(self.cost_model), "objective": self.objective,
                "samples": self.samples, "seed": self.seed}

    def to_dict(self) -> dict[str, Any]:
        return {**self.header(),
                "instances": [self.entries[i].to_dict() for i in sorted(self.entries)]}

    def to_json(self) -> str:
        """The file's text: one field a line, nested values (the plan, the exact search's
        figures, the seeds' values) on one line each, so a diff shows what changed."""
        def one(v: Any) -> str:
            return json.dumps(v, allow_nan=False, separators=(", ", ": "))

        header = [f' "{k}": {one(v)},' for k, v in self.header().items()]
        entries = []
        for i in sorted(self.entries):
            d = self.entries[i].to_dict()
            entries.append("  {" + ",\n   ".join(f'"{k}": {one(v)}' for k, v in d.items())
                           + "}")
        text = "\n".join(["{", *header, ' "instances": [', ",\n".join(entries), " ]", "}"])
        return text + "\n"

    def save(self, path: str | Path | None = None) -> Path:
        """Write atomically (temp file in the same folder, then rename): a build killed
        mid-write leaves the previous file whole."""
        out = Path(path) if path is not None else self.path
        if out is None:
            raise ValueError("no path to save the references to")
        text = self.to_json()
        tmp = out.with_name(out.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)
        except OSError as exc:
            raise ConfigError(str(out), "", f"cannot write: {exc.strerror}") from None
        self.path = out
        return out

    @property
    def proven(self) -> int:
        return sum(e.optimal for e in self.entries.values())

    @property
    def per_entry_constants(self) -> bool:
        """Whether every entry records the constants it was solved under: the header's
        constants digest then only says what the file was last written under, and a
        refit stales the entries whose instances read what changed (``check``)."""
        return all(e.constants_digest for e in self.entries.values())

    def mismatch(self, suite: Any, objective: str, samples: int, seed: int,
                 cost_model: dict[str, Any] | None = None) -> tuple[str, str] | None:
        """(field, why) of the first way this file differs from what it is asked to
        serve, or None when it matches."""
        sid = suite_id(suite)
        now = cost_model if cost_model is not None else cost_model_id()
        checks = (
            ("suite.name", "suite", self.suite.get("name"), sid["name"]),
            ("suite.seed", "suite seed", self.suite.get("seed"), sid["seed"]),
            ("suite.spec_digest", "suite spec digest", self.suite.get("spec_digest"),
             sid["spec_digest"]),
            ("cost_model.version", "cost-model version", self.cost_model.get("version"),
             now["version"]),
            ("cost_model.constants_digest", "calibrated constants digest",
             self.cost_model.get("constants_digest"),
             self.cost_model.get("constants_digest") if self.per_entry_constants
             else now["constants_digest"]),
            ("objective", "objective", self.objective, objective),
            ("samples", "samples", self.samples, samples),
            ("seed", "bandwidth seed", self.seed, seed),
        )
        for key, what, theirs, ours in checks:
            if theirs != ours:
                return key, f"built for {what} {theirs}, not {ours}"
        return None

    def require_match(self, suite: Any, objective: str, samples: int, seed: int,
                      hint: str) -> None:
        """ConfigError (one line, naming the mismatch) unless the file matches."""
        bad = self.mismatch(suite, objective, samples, seed)
        if bad is not None:
            raise ConfigError(self.source, bad[0], f"{bad[1]} ({hint})")


_HEADER_KEYS = frozenset({"format", "version", "suite", "cost_model", "objective", "samples",
                          "seed", "instances"})


def load_references(path: str | Path) -> References:
    """Read a reference file; a malformed one is a ConfigError naming the field."""
    path = Path(path)
    root = Reader.of(load_document(path), str(path))
    root.check_keys(_HEADER_KEYS)
    fmt = root.str("format")
    if fmt != FORMAT:
        raise root.error("format", f"expected {FORMAT!r}, got {fmt!r}")
    if root.int("version") != FORMAT_VERSION:
        raise root.error("version", f"only version {FORMAT_VERSION} is read")
    suite = root.sub("suite")
    suite.check_keys(frozenset({"name", "seed", "spec_digest"}))
    cm = root.sub("cost_model")
    cm.check_keys(frozenset({"version", "constants_digest"}))
    objective = root.str("objective")
    try:
        objective = Objective.parse(objective).name
    except HetparError as exc:
        raise root.error("objective", str(exc)) from None
    refs = References(
        suite={"name": suite.str("name"), "seed": suite.int("seed", None, minimum=0),
               "spec_digest": suite.str("spec_digest")},
        cost_model={"version": cm.int("version"),
                    "constants_digest": cm.str("constants_digest")},
        objective=objective, samples=root.int("samples", minimum=1),
        seed=root.int("seed"), path=path)
    for r in root.sub_list("instances", []):
        entry = Entry.from_dict(r)
        if entry.index in refs.entries:
            raise r.error("index", f"instance {entry.index} is listed twice")
        refs.entries[entry.index] = entry
    return refs


# ---- build ---------------------------------------------------------------------------------

def _label(method: str, found_by: str) -> str:
    return method if not found_by or found_by == method else f"{method}/{found_by}"


def solve_instance(problem: Problem, instance: Instance, index: int, *, time_limit: float,
                   workers: int = 1, seeds: Sequence[str] = DEFAULT_SEEDS, policy: Any = None,
                   grace_s: float | None = None, memory_gib: float = 8.0,
                   starts: Sequence[tuple[str, Plan]] = ()) -> Entry:
    """The reference entry of one instance: the seeds' plans here, then exact in a
    child process with those plans and ``starts`` as its starts (they prune its search,
    and a seed's plan the search cannot beat comes back credited to it); the best plan
    of all, the exact search's bound."""
    from hetpar.agents import planning
    from hetpar.solvers.isolated import run_isolated

    start = time.perf_counter()
    # (value, plan, label), exact's first: on a tie it keeps the credit, as it proved
    # (or failed to beat) the plan.
    found: list[tuple[float, dict[str, Any] | None, str]] = []
    seed_values: dict[str, float | None] = {}
    grace = max(10.0, time_limit) if grace_s is None else grace_s
    starts = list(starts)
    for method in seeds:
        options: dict[str, Any] = {}
        if method == "local-search":
            options["time_limit"] = time_limit
        elif method.startswith("policy"):
            options["instance"] = instance
        try:
            sol = planning.plan(problem, method,
                                **({"policy": policy} if method.startswith("policy") else {}),
                                **options)
        except HetparError:
            seed_values[method] = None
            continue
        seed_values[method] = sol.value if sol.found else None
        if sol.found and sol.plan is not None:
            starts.append((method, sol.plan))
    ex = run_isolated(problem, ("exact",), time_limit=time_limit, workers=workers,
                      grace_s=grace, memory_gib=memory_gib, starts=tuple(starts))["exact"]
    exact = {"value_s": _num(ex.value), "lower_bound_s": _num(ex.lower_bound),
             "optimal": ex.optimal, "found_by": ex.found_by, "stopped": ex.stopped,
             "wall_s": None if ex.wall_s is None else round(ex.wall_s, 3), "error": ex.error}
    if ex.plan is not None and math.isfinite(ex.value):
        found.append((ex.value, ex.plan, _label("exact", ex.found_by)))
    # Should the child have died, the seeds' plans still stand (exact's first: on a tie
    # it keeps the credit, as it proved or failed to beat the plan).
    for method, given in starts:
        found.append((problem.value(given), given.to_dict(), method))
    best = min(found, key=lambda f: f[0]) if found else (math.inf, None, "")
    value, plan, by = best
    if plan is not None:
        # The value check() will compute: this process's cost model, not the child's
        # (they agree; a disagreement would be a bug worth failing on).
        value = problem.value(Plan.from_dict(plan))
    lb = ex.lower_bound if ex.lower_bound is not None and math.isfinite(ex.lower_bound) \
        else None
    # The bound holds over the plan space; a seed outside it (megatron may mix GPU types
    # in a stage) can beat it, and is then at least as good as any plan of the space.
    optimal = plan is not None and lb is not None and value <= lb * (1 + TIE)
    return Entry(index=index, name=instance.name, instance_digest=instance_digest(instance),
                 hosts=instance.num_hosts, gpus=instance.cluster.num_gpus,
                 model=instance.model.name, plan=plan, value_s=value, lower_bound_s=lb,
                 optimal=optimal,
                 found_by=by, wall_s=time.perf_counter() - start, time_limit_s=time_limit,
                 workers=workers, exact=exact, seeds=seed_values,
                 constants_digest=entry_constants_digest(instance))


def merge(old: Entry, new: Entry) -> Entry:
    """Two attempts at one instance under one header as one entry: the better plan (the
    old one on a tie, with its credit) and the higher bound (each holds, so the larger
    does); ``exact``, ``seeds``, the time limit and workers are the new attempt's, the
    wall time their sum."""
    keep_old = old.plan is not None and not new.value_s < old.value_s * (1 - TIE)
    best = old if keep_old else new
    bounds = [b for b in (old.lower_bound_s, new.lower_bound_s) if b is not None]
    lb = max(bounds) if bounds else None
    if lb is not None and math.isfinite(best.value_s):
        lb = min(lb, best.value_s)  # a bound above a plan's value is no tighter
    optimal = best.plan is not None and lb is not None and best.value_s <= lb * (1 + TIE)
    return dataclasses.replace(new, plan=best.plan, value_s=best.value_s, lower_bound_s=lb,
                               optimal=optimal, found_by=best.found_by,
                               wall_s=old.wall_s + new.wall_s,
                               attempts=old.attempts + new.attempts)


@dataclass
class BuildReport:
    references: References
    solved: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    retried: list[int] = field(default_factory=list)
    wall_s: float = 0.0


def build(suite: Any, n: int, *, time_limit: float, workers: int = 1,
          out: str | Path | None = None, objective: str = "mean",
          samples: int = POLICY_SAMPLES, seed: int = DEFAULT_SEED,
          seeds: Sequence[str] | None = None, policy: Any = None,
          grace_s: float | None = None, memory_gib: float = 8.0, retry: bool = False,
          trust_pickle: bool = False,
          log: Callable[[str], None] | None = None, backend: str = "local",
          address: str | None = None, jobs: int = 1) -> BuildReport:
    """Build (or resume) the reference file of instances ``0 .. n-1`` of ``suite``.

    An existing file at ``out`` (default ``default_path``) must match the suite, the cost
    model, the objective, samples and seed (ConfigError otherwise); its entries for this
    suite's instances are kept and skipped, or with ``retry`` those not proven optimal
    are solved again from their stored plan and merged (``merge``). The file is saved
    after every instance.

    ``backend="ray"``: the instances are Ray tasks of ``workers`` CPUs each (their exact
    search's workers), ``jobs`` at a time, on the cluster at ``address`` (default a local
    Ray); each entry is saved as its task ends, so an interrupted build keeps what had
    ended, as locally."""
    if isinstance(suite, (str, Path)):
        from hetpar.problem.generator import load_suite
        suite = load_suite(suite)
    obj = Objective.parse(objective)
    # Seeds named by the caller must plan every instance; the default's policy seeds are
    # left out where the policy cannot (an error of the seed, recorded as no plan).
    named = seeds is not None
    seeds = tuple(seeds) if seeds is not None else default_seeds()
    bad = [m for m in seeds if m not in SEED_METHODS]
    if bad:
        raise ConfigError("", "seeds", f"unknown seed method(s) {', '.join(bad)} "
                                       f"(known: {', '.join(SEED_METHODS)})")
    if time_limit <= 0 or workers < 1 or samples < 1 or n < 1:
        raise ConfigError("", "build", "time limit, workers, samples and n must be positive")
    path = Path(out) if out is not None else default_path(suite.name)
    if path.exists():
        refs = load_references(path)
        refs.require_match(suite, obj.name, samples, seed,
                           "remove the file, or write elsewhere with --out")
        # Entries that record their constants are judged one by one (below): the file is
        # now written under the current ones.
        refs.cost_model = cost_model_id()
    else:
        if not path.parent.is_dir():
            raise ConfigError(str(path), "", "its folder does not exist")
        refs = References(suite_id(suite), cost_model_id(), obj.name, samples, seed,
                          path=path)
    if suite.size is not None and n > suite.size:
        raise ConfigError("--n", "", f"the suite {suite.name} has {suite.size} instances, "
                                     f"asked for {n}")
    if any(m.startswith("policy") for m in seeds) and not hasattr(policy, "env_kwargs"):
        from hetpar.agents.io import load_policy
        policy = load_policy(policy, trust_pickle=trust_pickle)
    if backend not in ("local", "ray"):
        raise ConfigError("", "backend", f"unknown backend {backend!r} (local, ray)")
    report = BuildReport(refs)
    start = time.perf_counter()
    todo: list[tuple[int, Any, Entry | None, tuple[tuple[str, Plan], ...]]] = []
    for i in range(n):
        inst = suite.instance(i)
        old = refs.entries.get(i)
        if old is not None and old.instance_digest != instance_digest(inst):
            old = None  # another instance's entry: solved afresh
        elif old is not None and old.constants_digest and \
                old.constants_digest != entry_constants_digest(inst):
            old = None  # solved under other constants: its bound no longer holds
        if old is not None and (old.optimal or not retry or old.plan is None):
            report.skipped.append(i)
            if log:
                log(f"#{i} {inst.name}: done before, skipped")
            continue
        if named and any(m.startswith("policy") for m in seeds):
            from hetpar.agents.planner import check_hosts
            check_hosts(policy, inst, f"{suite.name} instance {inst.name}")
        starts: tuple[tuple[str, Plan], ...] = ()
        if old is not None:
            assert old.plan is not None
            starts = (("reference", Plan.from_dict(old.plan)),)
        todo.append((i, inst, old, starts))
    options = {"objective": obj, "samples": samples, "seed": seed, "time_limit": time_limit,
               "workers": workers, "seeds": tuple(seeds), "grace_s": grace_s,
               "memory_gib": memory_gib}

    def record(i: int, old: Entry | None, entry: Entry) -> None:
        if old is not None:
            entry = merge(old, entry)
            report.retried.append(i)
        refs.entries[i] = entry
        refs.save(path)
        report.solved.append(i)
        if log:
            log(_entry_line(entry))

    if backend == "ray":
        _build_on_ray(todo, options, policy, address, jobs, record)
    else:
        for i, inst, old, starts in todo:
            record(i, old, _solve_job(i, inst, starts, options, policy))
    report.wall_s = time.perf_counter() - start
    return report


def _solve_job(i: int, inst: Any, starts: tuple[tuple[str, Plan], ...],
               options: dict[str, Any], policy: Any) -> Entry:
    """One instance's entry (``solve_instance``), as both backends run it."""
    problem = Problem.from_instance(inst, objective=options["objective"],
                                    samples=options["samples"], seed=options["seed"])
    return solve_instance(problem, inst, i, time_limit=options["time_limit"],
                          workers=options["workers"], seeds=options["seeds"], policy=policy,
                          grace_s=options["grace_s"], memory_gib=options["memory_gib"],
                          starts=starts)


def _build_on_ray(todo: list[tuple[int, Any, Entry | None, tuple[tuple[str, Plan], ...]]],
                  options: dict[str, Any], policy: Any, address: str | None, jobs: int,
                  record: Callable[[int, Entry | None, Entry], None]) -> None:
    """``_solve_job`` of each instance as a Ray task, ``jobs`` in flight, each recorded
    (and the file saved) as it ends. A task whose worker dies is retried by Ray."""
    from hetpar.solvers.ray_executor import _ray, connect, ray_map

    connect(address, max(jobs, 1) * options["workers"])
    shared = _ray().put(policy)
    ray_map(_solve_job, [(i, inst, starts, options, shared) for i, inst, _, starts in todo],
            jobs, lambda k, entry: record(todo[k][0], todo[k][2], entry),
            num_cpus=options["workers"])


def _entry_line(e: Entry) -> str:
    if e.plan is None:
        return f"#{e.index} {e.name}: no plan found ({e.wall_s:.1f} s; {e.exact.get('error')})"
    gap = e.gap
    proof = ("proven optimal" if e.optimal else
             f"bound {e.lower_bound_s:.4g} s, gap {gap:.1%}" if gap is not None else
             "no bound (" + (e.exact.get("error") or "exact gave none") + ")")
    return (f"#{e.index} {e.name}: {e.value_s:.6g} s by {e.found_by}, {proof} "
            f"({e.wall_s:.1f} s)")


# ---- check ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stale:
    """One stale finding: the file's header (index None) or one entry."""

    index: int | None
    name: str
    why: str


def check(refs: References, suite: Any = None, *,
          cost_model: dict[str, Any] | None = None,
          constants: CostConstants | None = None) -> list[Stale]:
    """What in ``refs`` is stale under the current cost model and suite (empty: none).

    ``suite`` defaults to the bundled suite the file names; ``constants`` to the bundled
    calibration (an entry solved under other constants of its instance is stale)."""
    from hetpar.errors import PlanError
    from hetpar.problem.generator import load_suite

    if suite is None:
        suite = load_suite(refs.suite["name"])
    out: list[Stale] = []
    bad = refs.mismatch(suite, refs.objective, refs.samples, refs.seed, cost_model)
    if bad is not None:
        # Every bound was proven under that header: none holds under this one.
        out.append(Stale(None, refs.suite.get("name", ""), f"{bad[0]}: {bad[1]}"))
    size = suite.size if suite.size is not None else math.inf
    for i in sorted(refs.entries):
        e = refs.entries[i]
        if i >= size:
            out.append(Stale(i, e.name, f"the suite has {suite.size} instances"))
            continue
        inst = suite.instance(i)
        if instance_digest(inst) != e.instance_digest:
            out.append(Stale(i, e.name, "the suite no longer generates this instance"))
            continue
        if e.constants_digest and e.constants_digest != entry_constants_digest(inst,
                                                                               constants):
            # Its bound was proven under other constants, whatever its plan scores now.
            out.append(Stale(i, e.name, "solved under other calibrated constants of its "
                                        "GPU types or framework"))
            continue
        if e.plan is None:
            continue
        problem = Problem.from_instance(inst, objective=refs.objective, samples=refs.samples,
                                        seed=refs.seed)
        try:
            plan = Plan.from_dict(e.plan, f"{refs.source}: instances[{i}].plan")
            problem.estimate(plan, source=f"instance {i} plan")  # validates
            value = problem.value(plan)
        except PlanError as exc:
            out.append(Stale(i, e.name, f"plan invalid: {exc.problem}"))
            continue
        if not _same(value, e.value_s):
            now = "infeasible" if math.isinf(value) else f"{value:.9g} s"
            out.append(Stale(i, e.name, f"value {e.value_s:.9g} s stored, {now} now"))
    return out


def _same(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= TIE * max(abs(a), abs(b))


def drop_stale(refs: References, stale: Sequence[Stale], suite: Any = None) -> References:
    """``refs`` with the stale entries removed and the header made current (``check
    --update``); a stale header drops every entry. Entries of a file written before
    entries recorded their constants get their digest (the header's constants being the
    current ones, else the header is stale)."""
    if suite is None:
        from hetpar.problem.generator import load_suite
        suite = load_suite(refs.suite["name"])
    if any(s.index is None for s in stale):
        keep: dict[int, Entry] = {}
    else:
        gone = {s.index for s in stale}
        keep = {i: e if e.constants_digest else dataclasses.replace(
                    e, constants_digest=entry_constants_digest(suite.instance(i)))
                for i, e in refs.entries.items() if i not in gone}
    return References(suite_id(suite), cost_model_id(), refs.objective, refs.samples,
                      refs.seed, keep, refs.path)
