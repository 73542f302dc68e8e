"""Topology suites: seeded families of problem instances for the plan-building environment.

A *suite* is either generated from a spec (``configs/suites/*.yaml``, format in
``configs/README.md`` section 8) or a fixed list of instances read from a file (a held-out
test set). Instance ``i`` of a generated suite depends only on ``(suite seed, i)``: it is
drawn from ``numpy.random.SeedSequence([seed, i])`` and never touches global random state,
so ``suite.instance(i)`` is the same on every machine and in every process.

An instance is an ``Instance`` (``hetpar.problem.instance``): a cluster, a model and a training
document in the formats of ``configs/``, parsed lazily. Every generated instance has at
least one feasible plan of the searched plan space: the generator draws a cluster, then
the model (among the suite's models) only where ``feasible_plan`` finds a plan that fits,
and redraws the cluster if none does.

Typical use::

    suite = load_suite("train-small")
    inst = suite.instance(0)                      # deterministic
    inst = suite.sample(np.random.default_rng(1)) # a random index
    save_instances("test.yaml", load_suite("test-iid").instances(100))
    fixed = load_suite("test.yaml")               # the same 100 instances, in order
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetpar.cluster.gpu import GpuType, load_gpu_catalog
from hetpar import limits
from hetpar.configio import Reader, list_bundled, load_document, resolve_config
from hetpar.costmodel.constants import CostConstants, FrameworkConstants, load_constants
from hetpar.costmodel.memory import gpu_usable_bytes, stage_bytes
from hetpar.problem.instance import Instance
from hetpar.errors import ConfigError
from hetpar.workload.model import ModelSpec, parse_model
from hetpar.workload.training import RECOMPUTE_MODES, TrainingSpec

__all__ = [
    "INSTANCES_FORMAT",
    "SHAPES",
    "BandwidthSpec",
    "GpuChoice",
    "NetworkSpec",
    "Suite",
    "SuiteSpec",
    "TrainingChoice",
    "describe_instance",
    "feasible_plan",
    "is_instances_file",
    "list_suites",
    "load_instances",
    "load_suite",
    "parse_suite_spec",
    "save_instances",
]

SHAPES = ("single_switch", "leaf_spine", "geo")
INSTANCES_FORMAT = "hetpar-instances"
_MAX_TRIES = 64  # cluster draws per instance before giving up
_UNBOUNDED = 2**31  # index range of a suite without a size
# The memory check keeps this fraction of a GPU's usable memory free, so that the cost
# model (the judge) agrees with the cheap check despite rounding.
_FIT_MARGIN = 0.97


# ---- spec --------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuChoice:
    """A GPU type a suite may use, with the host shapes it comes in."""

    type: str  # canonical catalog name
    gpus: tuple[int, ...]  # GPUs per host, choices
    nic_gbps: tuple[float, ...]  # host NIC, choices


@dataclass(frozen=True)
class NetworkSpec:
    """Network shapes and their parameters (choices are lists, ranges are ``[lo, hi]``)."""

    shapes: tuple[str, ...] = ("single_switch",)
    hosts_per_leaf: tuple[int, ...] = (2, 4)  # leaf_spine, choices
    oversubscription: tuple[float, ...] = (1.0,)  # leaf_spine, choices
    uplink_latency_us: tuple[float, float] = (2.0, 2.0)  # host to switch, range
    fabric_latency_us: tuple[float, float] = (1.0, 1.0)  # leaf to spine, range
    sites: tuple[int, int] = (2, 4)  # geo, range
    wan_gbps: tuple[float, float] = (1.0, 1.0)  # geo, WAN link capacity, range
    wan_latency_ms: tuple[float, float] = (10.0, 70.0)  # geo, one-way, range


@dataclass(frozen=True)
class BandwidthSpec:
    """Log-normal link bandwidth: per link, ``mean = mean_fraction x capacity`` and ``cv``."""

    cv: tuple[float, float] = (0.0, 0.0)  # host uplinks and leaf-spine links
    mean_fraction: tuple[float, float] = (1.0, 1.0)
    stochastic: float = 1.0  # probability that a link is log-normal (else constant)
    fabric: bool = True  # leaf-spine links are drawn as well
    wan_cv: tuple[float, float] = (0.2, 0.5)
    wan_mean_fraction: tuple[float, float] = (0.6, 0.9)


@dataclass(frozen=True)
class TrainingChoice:
    global_batch: tuple[int, ...]  # choices, powers of two
    precision: str = "fp16"
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    zero: tuple[int, ...] = (0, 1)
    flash_attention: bool = False
    seq_len: int | None = None


@dataclass(frozen=True)
class SuiteSpec:
    """A parsed suite file: a family of instances and the seed that enumerates it."""

    name: str
    description: str
    seed: int
    max_hosts: int
    hosts: tuple[int, int]
    types_per_instance: tuple[int, int]
    gpu_types: tuple[GpuChoice, ...]
    network: NetworkSpec
    bandwidth: BandwidthSpec
    models: tuple[str, ...]  # names as given in the file
    training: TrainingChoice
    size: int | None = None  # None: indices 0 .. 2**31 - 1
    source: str = ""
    # Model documents (configs/models format) in the order of ``models``.
    model_docs: tuple[Mapping[str, Any], ...] = field(default=(), repr=False, compare=False)


_TOP_KEYS = frozenset({"name", "description", "seed", "max_hosts", "size", "hosts",
                       "types_per_instance", "gpu_types", "network", "bandwidth", "models",
                       "training"})


def _range(r: Reader, key: str, default: Any, *, integer: bool = False,
           minimum: float | None = None, maximum: float | None = limits.MAX_NUMBER) -> tuple:
    """A ``[lo, hi]`` field (a single number means ``[x, x]``)."""
    value = r.raw(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value, value]
    kind = "integers" if integer else "numbers"
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int if integer else (int, float))
                   for v in value)):
        raise r.error(key, f"expected [lo, hi] ({kind}), got {value!r}")
    lo, hi = value
    if not all(math.isfinite(v) for v in value):
        raise r.error(key, f"must be finite, got {value!r}")
    if lo > hi:
        raise r.error(key, f"lo must not exceed hi, got [{lo}, {hi}]")
    if minimum is not None and lo < minimum:
        raise r.error(key, f"must be at least {minimum:g}, got {lo:g}")
    if maximum is not None and hi > maximum:
        raise r.error(key, f"must be at most {maximum:g}, got {hi:g}")
    return (int(lo), int(hi)) if integer else (float(lo), float(hi))


def _choices(r: Reader, key: str, default: Any, *, integer: bool = False,
             positive: bool = True, maximum: float = limits.MAX_NUMBER) -> tuple:
    """A non-empty list of choices (a single value means a list of one), each at most
    ``maximum``."""
    value = r.raw(key, default)
    if not isinstance(value, list):
        value = [value]
    ok = bool(value) and all(
        not isinstance(v, bool) and isinstance(v, int if integer else (int, float))
        and math.isfinite(v) and (v > 0 or not positive) and v <= maximum for v in value)
    if not ok:
        what = "positive integers" if integer else "positive numbers"
        raise r.error(key, f"expected a non-empty list of {what} of at most {maximum:g}, "
                           f"got {value!r}"[:300])
    if len(set(value)) != len(value):
        raise r.error(key, f"lists a value twice: {value!r}")
    return tuple(int(v) for v in value) if integer else tuple(float(v) for v in value)


def _parse_gpu_types(root: Reader, precision: str) -> tuple[GpuChoice, ...]:
    catalog = load_gpu_catalog()
    out: list[GpuChoice] = []
    for r in root.sub_list("gpu_types"):
        r.check_keys(frozenset({"type", "gpus", "nic_gbps"}))
        gpu = catalog.get(r.str("type"), source=r.source, where=r.field("type"))
        if precision == "bf16" and gpu.peak_bf16_tflops is None:
            raise r.error("type", f"{gpu.name} has no bf16 support, but the suite trains in "
                                  "bf16 (use precision fp16)")
        if any(g.type == gpu.name for g in out):
            raise r.error("type", f"{gpu.name} is listed twice")
        out.append(GpuChoice(gpu.name, _choices(r, "gpus", None, integer=True,
                                                maximum=limits.MAX_GPUS_PER_HOST),
                             _choices(r, "nic_gbps", None, maximum=1e6)))
    if not out:
        raise root.error("gpu_types", "lists no GPU types")
    return tuple(out)


def _parse_network(r: Reader, hosts: tuple[int, int]) -> NetworkSpec:
    r.check_keys(frozenset({"shapes", "hosts_per_leaf", "oversubscription", "uplink_latency_us",
                            "fabric_latency_us", "sites", "wan_gbps", "wan_latency_ms"}))
    shapes = r.raw("shapes", ["single_switch"])
    shapes = [shapes] if isinstance(shapes, str) else shapes
    if not isinstance(shapes, list) or not shapes or any(s not in SHAPES for s in shapes):
        raise r.error("shapes", f"expected a list drawn from {', '.join(SHAPES)}, got {shapes!r}")
    d = NetworkSpec()
    spec = NetworkSpec(
        shapes=tuple(dict.fromkeys(shapes)),
        hosts_per_leaf=_choices(r, "hosts_per_leaf", list(d.hosts_per_leaf), integer=True,
                                maximum=limits.MAX_HOSTS),
        oversubscription=_choices(r, "oversubscription", list(d.oversubscription)),
        uplink_latency_us=_range(r, "uplink_latency_us", list(d.uplink_latency_us), minimum=0),
        fabric_latency_us=_range(r, "fabric_latency_us", list(d.fabric_latency_us), minimum=0),
        sites=_range(r, "sites", list(d.sites), integer=True, minimum=2),
        wan_gbps=_range(r, "wan_gbps", list(d.wan_gbps), minimum=1e-3),
        wan_latency_ms=_range(r, "wan_latency_ms", list(d.wan_latency_ms), minimum=0),
    )
    if any(o < 1 for o in spec.oversubscription):
        raise r.error("oversubscription", "must be at least 1 (1 = non-blocking)")
    if "geo" in spec.shapes and hosts[0] < spec.sites[0]:
        raise r.error("sites", f"geo needs at least {spec.sites[0]} hosts (one per site), but "
                               f"hosts starts at {hosts[0]}")
    return spec


def _parse_bandwidth(r: Reader) -> BandwidthSpec:
    r.check_keys(frozenset({"cv", "mean_fraction", "stochastic", "fabric", "wan_cv",
                            "wan_mean_fraction"}))
    d = BandwidthSpec()
    spec = BandwidthSpec(
        cv=_range(r, "cv", list(d.cv), minimum=0, maximum=5),
        mean_fraction=_range(r, "mean_fraction", list(d.mean_fraction), minimum=1e-3, maximum=1),
        stochastic=r.number("stochastic", d.stochastic, nonnegative=True, maximum=1),
        fabric=r.bool("fabric", d.fabric),
        wan_cv=_range(r, "wan_cv", list(d.wan_cv), minimum=0, maximum=5),
        wan_mean_fraction=_range(r, "wan_mean_fraction", list(d.wan_mean_fraction),
                                 minimum=1e-3, maximum=1),
    )
    return spec


def _parse_training(r: Reader) -> TrainingChoice:
    r.check_keys(frozenset({"global_batch", "precision", "recompute", "zero", "flash_attention",
                            "seq_len"}))
    batches = _choices(r, "global_batch", None, integer=True, maximum=limits.MAX_GLOBAL_BATCH)
    for b in batches:
        if b & (b - 1):
            raise r.error("global_batch", f"must be powers of two (few divisors keep the "
                                          f"micro-batch choices small), got {b}")
    modes = r.raw("recompute", list(RECOMPUTE_MODES))
    modes = [modes] if isinstance(modes, str) else modes
    if not isinstance(modes, list) or not modes or any(m not in RECOMPUTE_MODES for m in modes):
        raise r.error("recompute", f"expected a list drawn from {', '.join(RECOMPUTE_MODES)}, "
                                   f"got {modes!r}")
    zero = r.raw("zero", [0, 1])
    zero = [zero] if isinstance(zero, int) and not isinstance(zero, bool) else zero
    if not isinstance(zero, list) or not zero or any(z not in (0, 1) or isinstance(z, bool)
                                                     for z in zero):
        raise r.error("zero", f"expected a list drawn from 0 (off) and 1 (ZeRO-1), got {zero!r}")
    return TrainingChoice(
        global_batch=batches,
        precision=r.choice("precision", ("fp16", "bf16"), "fp16"),
        recompute=tuple(dict.fromkeys(modes)),
        zero=tuple(sorted(set(zero))),
        flash_attention=r.bool("flash_attention", False),
        seq_len=r.int("seq_len", None, minimum=1),
    )


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name longer than the file system allows, say
        return False


def _load_model_doc(r: Reader, index: int, entry: Any, base_dir: Path) -> dict[str, Any]:
    where = f"{r.field('models')}[{index}]"
    if not isinstance(entry, str) or not entry:
        raise ConfigError(r.source, where, f"expected a model name or file, got {entry!r}")
    local = base_dir / entry
    try:
        path = local if _is_file(local) else resolve_config(entry, "models")
    except ConfigError as exc:
        raise ConfigError(r.source, where, f"{entry}: {exc.problem}") from None
    doc = load_document(path)
    if not isinstance(doc, dict):
        raise ConfigError(str(path), "", "expected a mapping")
    # Keep the architecture; free text would only bloat saved instance files.
    doc = {k: v for k, v in doc.items() if k not in ("description", "source")}
    doc.setdefault("name", path.stem)
    parse_model(doc, str(path))  # report a bad model file against the file itself
    return doc


def parse_suite_spec(data: Any, source: str = "<dict>", base_dir: Path | None = None) -> SuiteSpec:
    """Build and validate a suite spec from a parsed suite document."""
    base_dir = base_dir or Path(".")
    root = Reader.of(data, source)
    root.check_keys(_TOP_KEYS)
    max_hosts = root.int("max_hosts", minimum=1, maximum=limits.MAX_HOSTS,
                         why=" hosts (hetpar.limits.MAX_HOSTS)")
    hosts = _range(root, "hosts", None, integer=True, minimum=1, maximum=limits.MAX_HOSTS)
    if hosts[1] > max_hosts:
        raise root.error("hosts", f"can draw up to {hosts[1]} hosts, more than max_hosts "
                                  f"({max_hosts})")
    training = _parse_training(root.sub("training"))
    gpu_types = _parse_gpu_types(root, training.precision)
    types_per = _range(root, "types_per_instance", [1, 1], integer=True, minimum=1)
    if types_per[1] > len(gpu_types):
        raise root.error("types_per_instance", f"asks for up to {types_per[1]} GPU types, but "
                                               f"gpu_types lists {len(gpu_types)}")
    if types_per[0] > hosts[1]:
        raise root.error("types_per_instance", f"asks for at least {types_per[0]} GPU types, "
                                               f"more than the largest host count {hosts[1]}")
    network = _parse_network(root.sub("network", {}), hosts)
    bandwidth = _parse_bandwidth(root.sub("bandwidth", {}))
    names = [entry for _, entry, _ in root.items("models")]
    if not names:
        raise root.error("models", "lists no models")
    docs = tuple(_load_model_doc(root, i, entry, base_dir) for i, entry in enumerate(names))
    if len(set(names)) != len(names):
        raise root.error("models", "lists a model twice")
    largest_tp = max(1 << (g.bit_length() - 1) for c in gpu_types for g in c.gpus)
    need = min(4, largest_tp)
    for i, doc in enumerate(docs):
        if doc["heads"] % need:
            raise ConfigError(source, f"models[{i}]",
                              f"{doc['name']} has {doc['heads']} heads: every suite model needs "
                              f"heads divisible by {need} so tensor parallelism up to {need} is "
                              f"possible")
    size = root.int("size", None, minimum=1, maximum=_UNBOUNDED)
    return SuiteSpec(
        name=root.str("name", Path(source).stem),
        description=root.str("description", ""),
        seed=root.int("seed", minimum=0, maximum=limits.MAX_SEED),
        max_hosts=max_hosts,
        hosts=hosts,
        types_per_instance=types_per,
        gpu_types=gpu_types,
        network=network,
        bandwidth=bandwidth,
        models=tuple(str(n) for n in names),
        training=training,
        size=size,
        source=source,
        model_docs=docs,
    )


# ---- memory check: a plan that surely fits -------------------------------------------------

@dataclass(frozen=True)
class _FitModel:
    """Per-GPU memory of a one-replica stage by the cost model's own formula
    (``hetpar.costmodel.memory.stage_bytes``, what ``CostModel.stage_memory`` gives)."""

    model: ModelSpec
    batch: int
    recompute: str
    flash: bool
    constants: CostConstants
    framework: FrameworkConstants
    # max_layers per (tp, usable, first, last, inflight): a suite has few of them.
    _fits: dict[tuple, int] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, model: ModelSpec, training: TrainingSpec, constants: CostConstants,
           ) -> _FitModel:
        modes = training.recompute_modes
        lightest = next(m for m in ("full", "selective", "none") if m in modes)
        return cls(model.with_seq_len(training.seq_len), training.global_batch, lightest,
                   training.flash_attention, constants,
                   constants.framework(training.framework))

    def used(self, layers: int, tp: int, first: bool, last: bool, inflight: int) -> float:
        """Peak bytes per GPU of a stage of ``layers`` layers on ``tp`` GPUs, one replica,
        one sequence per micro-batch, ``inflight`` micro-batches held at once."""
        return stage_bytes(self.model, self.model.seq_len, layers, tp, 1, 1.0, inflight,
                           first, last, self.recompute, False, flash=self.flash,
                           constants=self.constants, framework=self.framework)[1]

    def max_layers(self, tp: int, usable: float, first: bool, last: bool, inflight: int) -> int:
        """The most layers a stage of ``tp`` GPUs (one replica, one sequence per micro-batch)
        holds within ``usable`` bytes per GPU (0 when not even one)."""
        key = (tp, usable, first, last, inflight)
        hit = self._fits.get(key)
        if hit is None:
            hit = self._fits[key] = self._max_layers(*key)
        return hit

    def _max_layers(self, tp: int, usable: float, first: bool, last: bool,
                    inflight: int) -> int:
        budget = usable * _FIT_MARGIN

        def fits(layers: int) -> bool:
            return self.used(layers, tp, first, last, inflight) <= budget

        one = self.used(1, tp, first, last, inflight)
        if one > budget:
            return 0
        # Every layer adds the same bytes: a guess from one and two layers, then steps to
        # the formula's own answer (the guess's rounding may be one off).
        per_layer = self.used(2, tp, first, last, inflight) - one
        top = self.model.layers
        n = max(1, min(top, 1 + int((budget - one) // per_layer)))
        while n > 1 and not fits(n):
            n -= 1
        while n < top and fits(n + 1):
            n += 1
        return n


def _tp_for(gpus: int, heads: int) -> int:
    """The largest power of two dividing both the host's GPU count and the heads."""
    g = math.gcd(gpus, heads)
    return g & -g


def _pipeline_fit(fit: _FitModel, hosts: Sequence[tuple[float, int]],
                  ) -> list[tuple[int, int, int]] | None:
    """A pipeline of one-replica stages, one per host, that fits: ``(host, tp, layers)`` in
    stage order, or None. ``hosts`` are (usable bytes per GPU, GPU count).

    One sequence per micro-batch, the largest tensor-parallel degree each host allows and
    the lightest recompute mode: the smallest footprint short of ZeRO over replicas. Hosts
    are taken by their memory per TP group, largest first; the first (and most loaded)
    stage goes to the largest."""
    heads, layers = fit.model.heads, fit.model.layers
    ranked = sorted(range(len(hosts)),
                    key=lambda h: -hosts[h][0] * _tp_for(hosts[h][1], heads))
    for n_stages in range(1, min(len(hosts), layers) + 1):
        chosen = ranked[:n_stages]
        caps = []
        for k, h in enumerate(chosen):
            tp = _tp_for(hosts[h][1], heads)
            caps.append(fit.max_layers(tp, hosts[h][0], k == 0, k == n_stages - 1,
                                       min(n_stages - k, fit.batch)))
        if min(caps) >= 1 and sum(caps) >= layers:
            # Give each stage its share, then trim the fullest until the layers add up.
            split = list(caps)
            excess = sum(split) - layers
            while excess:
                k = max(range(n_stages), key=lambda j: split[j])
                cut = min(excess, split[k] - 1)
                split[k] -= cut
                excess -= cut
            return [(h, _tp_for(hosts[h][1], heads), n) for h, n in zip(chosen, split)]
    return None


def feasible_plan(instance: Instance, constants: CostConstants | None = None):
    """A plan of the searched space that fits in memory on ``instance``, or None.

    A sufficient check, not a necessary one (it never shards optimizer states over
    replicas): every generated instance has such a plan, which is how the generator
    guarantees a feasible plan exists. Returns a ``hetpar.plan.Plan``."""
    from hetpar.plan import Plan, Replica, Stage

    constants = constants or load_constants()
    cluster, training = instance.cluster, instance.training
    fit = _FitModel.of(instance.model, training, constants)
    fw = constants.framework(training.framework)
    usable = [gpu_usable_bytes(h.gpu, fw) if _supports(h.gpu, training.precision) else 0.0
              for h in cluster.hosts]
    stages = _pipeline_fit(fit, [(u, h.num_gpus) for u, h in zip(usable, cluster.hosts)])
    if stages is None:
        return None
    out = tuple(Stage(n, tp, (Replica(cluster.hosts[h].name, tuple(range(tp))),))
                for h, tp, n in stages)
    return Plan(out, training.global_batch, fit.recompute, training.zero_stages[0])


def _supports(gpu: GpuType, precision: str) -> bool:
    return precision != "bf16" or gpu.peak_bf16_tflops is not None


# ---- generation -----------------------------------------------------------------------------

def _host_prefix(gpu_type: str) -> str:
    parts = [p for p in gpu_type.lower().split("-") if not p.startswith("sxm")]
    return "-".join(parts)


def _r(x: float, digits: int = 3) -> float:
    return float(round(float(x), digits))


def _num(x: float) -> int | float:
    """An integral figure as an int (reads better in saved files)."""
    return int(x) if float(x).is_integer() else float(x)


class _Generator:
    """Draws instances of one spec; holds what is costly to rebuild (catalog, models)."""

    def __init__(self, spec: SuiteSpec, constants: CostConstants | None = None) -> None:
        self.spec = spec
        catalog = load_gpu_catalog()
        self.gpus = [catalog.get(c.type) for c in spec.gpu_types]
        constants = constants or load_constants()
        self.training_docs: list[dict[str, Any]] = []
        self.fits: dict[tuple[int, int], _FitModel] = {}
        t = spec.training
        for b in t.global_batch:
            doc: dict[str, Any] = {"name": f"{spec.name}-b{b}", "global_batch": b,
                                   "precision": t.precision, "recompute": list(t.recompute),
                                   "zero": list(t.zero), "flash_attention": t.flash_attention}
            if t.seq_len is not None:
                doc["seq_len"] = t.seq_len
            self.training_docs.append(doc)
        trainings = [TrainingSpec(global_batch=b, seq_len=t.seq_len, precision=t.precision,
                                  recompute_modes=t.recompute, zero_stages=t.zero,
                                  flash_attention=t.flash_attention) for b in t.global_batch]
        fw = constants.framework(trainings[0].framework)
        self.usable = [gpu_usable_bytes(g, fw) for g in self.gpus]
        for m, doc in enumerate(spec.model_docs):
            model = parse_model(doc)
            for b, training in enumerate(trainings):
                self.fits[m, b] = _FitModel.of(model, training, constants)

    def instance(self, index: int) -> Instance:
        spec = self.spec
        ss = np.random.SeedSequence([spec.seed, index])
        rng = np.random.default_rng(ss)
        for _ in range(_MAX_TRIES):
            drawn = self._draw_hosts(rng)
            batch = int(rng.integers(len(spec.training.global_batch)))
            hosts = [(self.usable[t], g) for t, g, _ in drawn]
            model = None
            for m in rng.permutation(len(spec.models)):
                stages = _pipeline_fit(self.fits[int(m), batch], hosts)
                if stages is not None:
                    model = int(m)
                    break
            if model is None:
                continue  # nothing fits this cluster: draw another
            shape = spec.network.shapes[int(rng.integers(len(spec.network.shapes)))]
            cluster, net_meta = self._cluster_doc(index, drawn, shape, rng)
            types = list(dict.fromkeys(spec.gpu_types[t].type for t, _, _ in drawn))
            meta = {"suite": spec.name, "index": index, "suite_seed": spec.seed,
                    "shape": shape, **net_meta, "gpu_types": types,
                    "model": spec.models[model],
                    "global_batch": spec.training.global_batch[batch]}
            return Instance(name=f"{spec.name}-{index}", cluster_doc=cluster,
                            model_doc=dict(spec.model_docs[model]),
                            training_doc=dict(self.training_docs[batch]),
                            seed=int(ss.generate_state(1)[0]), meta=meta)
        raise ConfigError(spec.source, "models",
                          f"instance {index}: no model of the suite fits any of {_MAX_TRIES} "
                          "clusters drawn; add smaller models or larger GPUs")

    def _draw_hosts(self, rng: np.random.Generator) -> list[tuple[int, int, float]]:
        """(GPU choice index, GPUs, NIC Gb/s) per host, grouped by type."""
        spec = self.spec
        n = int(rng.integers(spec.hosts[0], spec.hosts[1] + 1))
        lo, hi = spec.types_per_instance
        k = int(rng.integers(min(lo, n), min(hi, n) + 1))
        types = [int(t) for t in rng.choice(len(spec.gpu_types), size=k, replace=False)]
        # Every chosen type gets a host; the rest are drawn among the chosen.
        per_host = types + [types[int(j)] for j in rng.integers(k, size=n - k)]
        # One machine shape (GPUs, NIC) per type and instance, like a cloud instance type.
        shape = {}
        for t in types:
            c = spec.gpu_types[t]
            shape[t] = (c.gpus[int(rng.integers(len(c.gpus)))],
                        c.nic_gbps[int(rng.integers(len(c.nic_gbps)))])
        return [(t, *shape[t]) for t in sorted(per_host, key=types.index)]

    def _link_model(self, rng: np.random.Generator, capacity: float, cv: tuple[float, float],
                    mean_fraction: tuple[float, float], p: float) -> dict[str, Any] | None:
        """A log-normal model (or None: constant) for a link of ``capacity`` Gb/s."""
        u, c, f = rng.random(3)
        if u >= p:
            return None
        cv_ = _r(cv[0] + c * (cv[1] - cv[0]))
        frac = mean_fraction[0] + f * (mean_fraction[1] - mean_fraction[0])
        if cv_ == 0 and frac >= 1:
            return None
        return {"kind": "lognormal", "mean_gbps": min(capacity, _r(frac * capacity, 4)),
                "cv": cv_}

    def _cluster_doc(self, index: int, drawn: list[tuple[int, int, float]], shape: str,
                     rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, Any]]:
        spec, net, bw = self.spec, self.spec.network, self.spec.bandwidth
        n = len(drawn)
        # Hosts are grouped by type; racks (leaves) and sites take contiguous runs of them.
        if shape == "single_switch":
            groups = [n]
            switches = ["switch"]
        elif shape == "leaf_spine":
            fits = [p for p in net.hosts_per_leaf if p < n]
            per_leaf = fits[int(rng.integers(len(fits)))] if fits else max(1, n // 2)
            groups = [min(per_leaf, n - s) for s in range(0, n, per_leaf)]
            switches = [f"leaf{j}" for j in range(len(groups))]
        else:
            sites = int(rng.integers(net.sites[0], min(net.sites[1], n) + 1))
            cuts = sorted(int(c) + 1 for c in rng.choice(n - 1, size=sites - 1, replace=False))
            groups = [b - a for a, b in zip([0, *cuts], [*cuts, n])]
            switches = [f"site{j}" for j in range(sites)]
        counters: dict[str, int] = {}
        hosts = []
        nic_per_switch = [0.0] * len(switches)
        at = [j for j, size in enumerate(groups) for _ in range(size)]
        # One latency per instance and tier (one kind of cabling): hosts that differ in
        # nothing else stay interchangeable, which exact solvers exploit.
        lat_lo, lat_hi = net.uplink_latency_us
        up_latency = _r(lat_lo + rng.random() * (lat_hi - lat_lo), 2)
        for (t, gpus, nic), sw in zip(drawn, at):
            gpu_type = spec.gpu_types[t].type
            prefix = _host_prefix(gpu_type)
            num = counters.get(prefix, 0)
            counters[prefix] = num + 1
            uplink: dict[str, Any] = {"latency_us": up_latency}
            model = self._link_model(rng, nic, bw.cv, bw.mean_fraction, bw.stochastic)
            if model is not None:
                uplink["bandwidth"] = model
            hosts.append({"name": f"{prefix}-{num}", "gpu": gpu_type, "gpus": gpus,
                          "nic_gbps": _num(nic), "switch": switches[sw], "uplink": uplink})
            nic_per_switch[sw] += nic
        links: list[dict[str, Any]] = []
        meta: dict[str, Any] = {}
        if shape == "leaf_spine":
            over = net.oversubscription[int(rng.integers(len(net.oversubscription)))]
            lo, hi = net.fabric_latency_us
            fabric_latency = _r(lo + rng.random() * (hi - lo), 2)
            for j, leaf in enumerate(switches):
                cap = _num(_r(nic_per_switch[j] / over, 3))
                link: dict[str, Any] = {"a": leaf, "b": "spine", "capacity_gbps": cap,
                                        "latency_us": fabric_latency}
                model = self._link_model(rng, cap, bw.cv, bw.mean_fraction,
                                         bw.stochastic if bw.fabric else 0.0)
                if model is not None:
                    link["bandwidth"] = model
                links.append(link)
            switches = [*switches, "spine"]
            meta = {"leaves": len(groups), "oversubscription": _num(over)}
        elif shape == "geo":
            glo, ghi = net.wan_gbps
            llo, lhi = net.wan_latency_ms
            for a in range(len(groups)):
                for b in range(a + 1, len(groups)):
                    cap = _r(glo + rng.random() * (ghi - glo), 3)
                    link = {"a": switches[a], "b": switches[b], "capacity_gbps": cap,
                            "latency_us": _r((llo + rng.random() * (lhi - llo)) * 1000, 0)}
                    model = self._link_model(rng, cap, bw.wan_cv, bw.wan_mean_fraction, 1.0)
                    if model is not None:
                        link["bandwidth"] = model
                    links.append(link)
            meta = {"sites": len(groups)}
        doc: dict[str, Any] = {"name": f"{spec.name}-{index}",
                               "description": f"instance {index} of suite {spec.name} ({shape})",
                               "switches": switches, "hosts": hosts}
        if links:
            doc["links"] = links
        return doc, meta


# ---- suites ---------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Suite:
    """A family of instances: generated from a ``spec``, or a fixed tuple of instances.

    ``max_hosts`` bounds the host count of every instance (the environment sizes its
    observations by it). ``size`` is the number of instances (None: a generated suite
    without a size, indexed 0 .. 2**31 - 1).
    """

    name: str
    max_hosts: int
    description: str = ""
    spec: SuiteSpec | None = None
    fixed: tuple[Instance, ...] | None = None
    source: str = ""
    _generator: _Generator | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.spec is None) == (self.fixed is None):
            raise ValueError("a suite needs exactly one of spec and fixed")
        if self.spec is not None:
            object.__setattr__(self, "_generator", _Generator(self.spec))

    @classmethod
    def from_spec(cls, spec: SuiteSpec) -> Suite:
        return cls(spec.name, spec.max_hosts, spec.description, spec=spec, source=spec.source)

    @classmethod
    def from_instances(cls, name: str, instances: Iterable[Instance], max_hosts: int | None = None,
                       description: str = "", source: str = "") -> Suite:
        """A suite of exactly these instances (in order); ``max_hosts`` defaults to the
        largest instance. ConfigError if an instance has more hosts than ``max_hosts``."""
        fixed = tuple(instances)
        if not fixed:
            raise ConfigError(source or name, "instances", "lists no instances")
        sizes = [inst.num_hosts for inst in fixed]
        bound = max(sizes) if max_hosts is None else max_hosts
        for k, (inst, n) in enumerate(zip(fixed, sizes)):
            if n > bound:
                raise ConfigError(source or name, f"instances[{k}]",
                                  f"{inst.name} has {n} hosts, more than max_hosts ({bound})")
        return cls(name, bound, description, fixed=fixed, source=source)

    @property
    def size(self) -> int | None:
        if self.fixed is not None:
            return len(self.fixed)
        assert self.spec is not None
        return self.spec.size

    def instance(self, i: int) -> Instance:
        """Instance ``i``: the same every time (from ``SeedSequence([seed, i])``)."""
        i = int(i)
        limit = self.size if self.size is not None else _UNBOUNDED
        if not 0 <= i < limit:
            raise ConfigError(self.source or self.name, "",
                              f"instance index {i} is out of range (the suite has {limit})")
        if self.fixed is not None:
            return self.fixed[i]
        assert self._generator is not None
        return self._generator.instance(i)

    def sample(self, rng: np.random.Generator) -> Instance:
        """The instance of an index drawn from ``rng``."""
        limit = self.size if self.size is not None else _UNBOUNDED
        return self.instance(int(rng.integers(limit)))

    def instances(self, n: int, start: int = 0) -> list[Instance]:
        """Instances ``start .. start + n - 1``."""
        if n < 0:
            raise ConfigError(self.source or self.name, "", f"n must not be negative, got {n}")
        return [self.instance(start + j) for j in range(n)]


def list_suites() -> list[str]:
    """Names of the bundled suites."""
    return list_bundled("suites")


def load_suite(name_or_path: str | Path) -> Suite:
    """A bundled suite by name (``train-small``), a suite spec file, or a saved instance file
    (as written by ``save_instances``: a fixed suite of those instances)."""
    path = resolve_config(name_or_path, "suites")
    data = load_document(path)
    if isinstance(data, dict) and "instances" in data:
        name, max_hosts, instances = _read_instances(data, str(path))
        return Suite.from_instances(name, instances, max_hosts, source=str(path))
    spec = parse_suite_spec(data, str(path), path.parent)
    suite = Suite.from_spec(spec)
    suite.instance(0)  # a spec whose models fit nothing fails here, not mid-training
    return suite


def is_instances_file(path: str | Path) -> bool:
    """Whether ``path`` is an instance file (``save_instances``) rather than a suite spec."""
    try:
        data = load_document(path)
    except ConfigError:
        return False
    return isinstance(data, dict) and "instances" in data


def save_instances(path: str | Path, instances: Iterable[Instance], *, suite: str = "",
                   max_hosts: int | None = None) -> Path:
    """Write instances to a YAML (or, for ``.json``, JSON) file that ``load_instances`` and
    ``load_suite`` read back into identical instances."""
    import json

    import yaml

    path = Path(path)
    items = list(instances)
    data: dict[str, Any] = {"format": INSTANCES_FORMAT, "version": 1,
                            "suite": suite or (str(items[0].meta.get("suite", "")) if items else ""),
                            "max_hosts": max_hosts if max_hosts is not None else
                            max((inst.num_hosts for inst in items), default=1),
                            "instances": [inst.to_dict() for inst in items]}
    if not data["suite"]:
        data["suite"] = path.stem
    if path.suffix == ".json":
        text = json.dumps(data, indent=1)
    else:
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    try:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot write: {exc.strerror}") from None
    return path


def load_instances(path: str | Path) -> list[Instance]:
    """The instances of a file written by ``save_instances``, each checked (cluster, model
    and training parse) so that a bad file fails here with the file and field named."""
    data = load_document(path)
    return _read_instances(data, str(path))[2]


_INSTANCE_KEYS = frozenset({"name", "seed", "meta", "cluster", "model", "training"})


def _read_instances(data: Any, source: str) -> tuple[str, int, list[Instance]]:
    root = Reader.of(data, source)
    root.check_keys(frozenset({"format", "version", "suite", "max_hosts", "instances"}))
    fmt = root.str("format", INSTANCES_FORMAT)
    if fmt != INSTANCES_FORMAT:
        raise root.error("format", f"expected {INSTANCES_FORMAT!r}, got {fmt!r}")
    if root.int("version", 1) != 1:
        raise root.error("version", "only version 1 is read")
    out = []
    for r in root.sub_list("instances"):
        r.check_keys(_INSTANCE_KEYS)
        for key in ("cluster", "model", "training"):
            r.sub(key)  # a mapping, or a ConfigError naming the field
        meta = r.raw("meta", {})
        if not isinstance(meta, dict):
            raise r.error("meta", f"expected a mapping, got {type(meta).__name__}")
        inst = Instance(name=r.str("name"), cluster_doc=dict(r.raw("cluster")),
                        model_doc=dict(r.raw("model")), training_doc=dict(r.raw("training")),
                        seed=r.int("seed", -1, minimum=-1), meta=dict(meta))
        for key in ("cluster", "model", "training"):
            try:
                getattr(inst, key)
            except ConfigError as exc:
                field_ = r.field(key) + (f".{exc.field}" if exc.field else "")
                raise ConfigError(source, field_, exc.problem) from None
        out.append(inst)
    if not out:
        raise root.error("instances", "lists no instances")
    max_hosts = root.int("max_hosts", max(inst.num_hosts for inst in out), minimum=1,
                         maximum=limits.MAX_HOSTS)
    name = root.str("suite", Path(source).stem)
    for k, inst in enumerate(out):
        if inst.num_hosts > max_hosts:
            raise ConfigError(source, f"instances[{k}]", f"{inst.name} has {inst.num_hosts} "
                                                         f"hosts, more than max_hosts ({max_hosts})")
    return name, max_hosts, out


# ---- description ----------------------------------------------------------------------------

def describe_instance(instance: Instance) -> dict[str, Any]:
    """A JSON-able summary: hosts by GPU type, network shape, bandwidth figures, model."""
    cluster, model, training = instance.cluster, instance.model, instance.training
    groups: dict[tuple[str, int, float], int] = {}
    for h in cluster.hosts:
        key = (h.gpu.name, h.num_gpus, h.nic_gbps)
        groups[key] = groups.get(key, 0) + 1
    hosts = set(cluster.host_index)

    def stats(links: list) -> dict[str, Any]:
        if not links:
            return {"count": 0}
        caps = [lk.capacity_gbps for lk in links]
        means = [lk.bandwidth.mean() for lk in links]
        cvs = [lk.bandwidth.cv() for lk in links]
        lat = [lk.latency_s * 1e6 for lk in links]
        return {"count": len(links), "stochastic": sum(c > 0 for c in cvs),
                "capacity_gbps": [min(caps), max(caps)], "mean_gbps": [min(means), max(means)],
                "mean_fraction": [min(m / c for m, c in zip(means, caps)),
                                  max(m / c for m, c in zip(means, caps))],
                "cv": [min(cvs), max(cvs)], "latency_us": [min(lat), max(lat)]}

    uplinks = [lk for lk in cluster.links if lk.a in hosts or lk.b in hosts]
    fabric = [lk for lk in cluster.links if lk.a not in hosts and lk.b not in hosts]
    shape = str(instance.meta.get("shape", "custom"))
    network: dict[str, Any] = {"shape": shape, "switches": len(cluster.switches)}
    for key in ("leaves", "oversubscription", "sites"):
        if key in instance.meta:
            network[key] = instance.meta[key]
    return {
        "name": instance.name, "seed": instance.seed,
        "hosts": len(cluster.hosts), "gpus": cluster.num_gpus,
        "host_groups": [{"gpu": g, "count": c, "gpus_per_host": n, "nic_gbps": nic}
                        for (g, n, nic), c in groups.items()],
        "network": network,
        "uplinks": stats(uplinks),
        ("wan" if shape == "geo" else "fabric"): stats(fabric),
        "model": {"name": model.name, "params_B": model.total_params / 1e9,
                  "layers": model.layers, "heads": model.heads,
                  "seq_len": training.seq_len or model.seq_len},
        "training": {"global_batch": training.global_batch, "precision": training.precision},
    }
