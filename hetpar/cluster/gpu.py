"""GPU types and the catalog that names them (``configs/gpus.yaml`` plus user files)."""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hetpar import limits
from hetpar.configio import Reader, as_float, bundled_dir, load_document
from hetpar.errors import ConfigError

__all__ = ["GpuType", "GpuCatalog", "load_gpu_catalog", "SCALEUP_KINDS"]

SCALEUP_KINDS = ("nvswitch", "nvlink", "xgmi", "pcie")


@dataclass(frozen=True)
class GpuType:
    """Datasheet figures of one GPU model (one device as the framework sees it).

    ``scaleup_GBps`` is the per-direction bandwidth of one GPU's scale-up link (NVLink,
    xGMI or PCIe): the figure ring formulas use.
    """

    name: str
    vendor: str
    peak_fp16_tflops: float
    peak_bf16_tflops: float | None
    memory_gib: float
    hbm_GBps: float
    scaleup_kind: str
    scaleup_GBps: float
    pcie_GBps: float
    aliases: tuple[str, ...] = ()
    # The chip generation (``hopper``, ``ampere``, ...): a type without fitted efficiencies
    # of its own reads those of its architecture's calibrated type, where the calibration
    # names one (``CostConstants.gpu_key``). Empty: not stated.
    architecture: str = ""

    def peak_flops(self, precision: str) -> float:
        """Peak dense tensor FLOP/s for a precision; ConfigError if unsupported."""
        if precision == "bf16":
            if self.peak_bf16_tflops is None:
                raise ConfigError("", f"gpu {self.name}", "has no bf16 support; use precision fp16")
            return self.peak_bf16_tflops * 1e12
        return self.peak_fp16_tflops * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30


@dataclass(frozen=True)
class GpuCatalog:
    """GPU types by name, with case-insensitive lookup by name or alias."""

    types: Mapping[str, GpuType]
    _index: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, str] = {}
        for name, gpu in self.types.items():
            for key in (name, *gpu.aliases):
                index[key.lower()] = name
        object.__setattr__(self, "_index", index)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._index

    def __iter__(self):
        return iter(self.types.values())

    def __len__(self) -> int:
        return len(self.types)

    def get(self, name: str, *, source: str = "", where: str = "gpu") -> GpuType:
        key = self._index.get(str(name).lower())
        if key is None:
            close = difflib.get_close_matches(str(name), list(self.types), n=3, cutoff=0.4)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(source, where, f"unknown GPU type {name!r}{hint}; add it to a "
                                             "GPU catalog file (see configs/gpus.yaml)")
        return self.types[key]

    def merged(self, other: GpuCatalog) -> GpuCatalog:
        """This catalog with ``other``'s types added (``other`` wins on a name clash)."""
        return GpuCatalog({**self.types, **other.types})


_GPU_KEYS = frozenset({"vendor", "architecture", "aliases", "peak_tflops", "memory_gib",
                       "hbm_GBps", "scaleup", "pcie_GBps", "notes", "source"})


def _parse_gpu(name: str, r: Reader) -> GpuType:
    r.check_keys(_GPU_KEYS)
    peak = r.sub("peak_tflops")
    peak.check_keys(frozenset({"fp16", "bf16"}))
    scaleup = r.sub("scaleup")
    scaleup.check_keys(frozenset({"kind", "GBps"}))
    r.str("notes", ""), r.str("source", "")  # free text, but text
    aliases = r.raw("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise r.error("aliases", "expected a list of names")
    return GpuType(
        name=name,
        vendor=r.str("vendor", "unknown"),
        peak_fp16_tflops=_plausible(peak, "fp16", "peak_tflops"),
        peak_bf16_tflops=_plausible(peak, "bf16", "peak_tflops", None),
        memory_gib=_plausible(r, "memory_gib", "memory_gib"),
        hbm_GBps=_plausible(r, "hbm_GBps", "hbm_GBps"),
        scaleup_kind=scaleup.choice("kind", SCALEUP_KINDS),
        scaleup_GBps=_plausible(scaleup, "GBps", "scaleup.GBps"),
        pcie_GBps=_plausible(r, "pcie_GBps", "pcie_GBps", 16.0),
        aliases=tuple(aliases),
        architecture=r.str("architecture", "").strip().lower(),
    )


_NO_DEFAULT = object()


def _plausible(r: Reader, key: str, kind: str, default: object = _NO_DEFAULT) -> float | None:
    """A datasheet figure within its plausible range (``limits.GPU_RANGES``): a figure
    outside is almost surely in another unit, and is refused naming file and field."""
    lo, hi, unit = limits.GPU_RANGES[kind]
    raw = r.raw(key, None if default is _NO_DEFAULT else default)
    if (isinstance(raw, (int, float)) and not isinstance(raw, bool)
            and math.isfinite(as_float(raw)) and not lo <= raw <= hi):
        raise r.error(key, f"{as_float(raw):g} is implausible for a GPU: expected {lo:g} to "
                           f"{hi:g} {unit}")
    return (r.number(key, positive=True) if default is _NO_DEFAULT
            else r.number(key, default, positive=True))


def parse_gpu_catalog(data: object, source: str) -> GpuCatalog:
    root = Reader.of(data, source)
    root.check_keys(frozenset({"gpus"}))
    gpus = root.sub("gpus")
    types: dict[str, GpuType] = {}
    owner: dict[str, str] = {}  # lower-cased name or alias -> the type it names
    for name in gpus.data:
        if not isinstance(name, str) or not name:
            raise gpus.error(str(name), "a GPU type's name must be a non-empty string")
        gpu = _parse_gpu(name, gpus.sub(name))
        for i, key in enumerate((name, *gpu.aliases)):
            other = owner.get(key.lower())
            if other is not None and other != name:
                where = gpus.field(name) + ("" if i == 0 else f".aliases[{i - 1}]")
                raise ConfigError(source, where, f"{key!r} already names GPU type {other!r} "
                                                 "(names and aliases must be unique, "
                                                 "case-insensitively)")
            owner[key.lower()] = name
        types[name] = gpu
    if not types:
        raise root.error("gpus", "lists no GPU types")
    return GpuCatalog(types)


def load_gpu_catalog(extra: Iterable[str | Path] = ()) -> GpuCatalog:
    """The bundled catalog, extended by the user's own catalog files (later files win)."""
    catalog = _catalog_file(bundled_dir() / "gpus.yaml")
    for more in extra:
        catalog = catalog.merged(_catalog_file(Path(more)))
    return catalog


def _catalog_file(path: Path) -> GpuCatalog:
    # Environments parse thousands of generated clusters: parse each catalog file once
    # per version of it (the catalog is immutable, so sharing it is safe).
    try:
        st = path.stat()
    except OSError:
        return parse_gpu_catalog(load_document(path), str(path))  # reports the error
    return _parse_catalog_cached(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _parse_catalog_cached(path: str, mtime_ns: int, size: int) -> GpuCatalog:
    return parse_gpu_catalog(load_document(path), path)
