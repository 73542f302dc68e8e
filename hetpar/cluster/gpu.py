"""GPU types and the catalog that names them (``configs/gpus.yaml`` plus user files)."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hetpar.configio import Reader, bundled_dir, load_document
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


_GPU_KEYS = frozenset({"vendor", "aliases", "peak_tflops", "memory_gib", "hbm_GBps",
                       "scaleup", "pcie_GBps", "notes", "source"})


def _parse_gpu(name: str, r: Reader) -> GpuType:
    r.check_keys(_GPU_KEYS)
    peak = r.sub("peak_tflops")
    peak.check_keys(frozenset({"fp16", "bf16"}))
    scaleup = r.sub("scaleup")
    scaleup.check_keys(frozenset({"kind", "GBps"}))
    aliases = r.raw("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise r.error("aliases", "expected a list of names")
    return GpuType(
        name=name,
        vendor=r.str("vendor", "unknown"),
        peak_fp16_tflops=peak.number("fp16", positive=True),
        peak_bf16_tflops=peak.number("bf16", None, positive=True),
        memory_gib=r.number("memory_gib", positive=True),
        hbm_GBps=r.number("hbm_GBps", positive=True),
        scaleup_kind=scaleup.choice("kind", SCALEUP_KINDS),
        scaleup_GBps=scaleup.number("GBps", positive=True),
        pcie_GBps=r.number("pcie_GBps", 16.0, positive=True),
        aliases=tuple(aliases),
    )


def parse_gpu_catalog(data: object, source: str) -> GpuCatalog:
    root = Reader.of(data, source)
    root.check_keys(frozenset({"gpus"}))
    gpus = root.sub("gpus")
    types: dict[str, GpuType] = {}
    for name in gpus.data:
        types[str(name)] = _parse_gpu(str(name), gpus.sub(str(name)))
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
