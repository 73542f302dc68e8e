"""``hetpar profile``: measure this machine's device and links, and write what hetpar reads.

**Compute.** One transformer layer of the model's shape (pre-norm attention and MLP, as
the cost model counts them) runs forward and backward in torch on the device, for a few
micro-batch sizes; the fastest of the timed repeats are fitted to the cost model's own
form of a layer,

    t(b) = 3 (F(b) / R + S(b) / H) + 3 o,

(``hetpar.costmodel.compute.stage_work`` without recomputation: forward plus a backward
of twice its cost; F the layer's matmul and attention FLOPs, S the bytes its memory-bound
kernels stream, o the framework's fixed cost per pass). F and S both grow in proportion
to the micro-batch, so the timings cannot tell R from H apart: H is measured on its own
(a copy of a large tensor), and R is the matmul rate that makes the worst relative error
over the micro-batch sizes least. The device's
entry in a GPU catalog is then written with ``peak = R / gemm_efficiency`` and
``hbm = H / hbm_efficiency`` under the calibration's default efficiencies, so that the
cost model with that calibration reproduces the measured layer times
(``reproduce`` says how closely). The device's memory is the GPU's (CUDA) or the host's
(CPU). On a CPU the layer runs in float32 (torch's CPU half-precision matmuls are far
slower than float32), and the entry's fp16 and bf16 rates are that float32 rate.

**Network.** ``nccl-tests`` output (``all_reduce_perf``, ``sendrecv_perf``: the bus
bandwidth of the large messages) or ``iperf3 --json`` files (the mean and the variation
of the interval throughputs) become host uplink bandwidth models, lognormal with the
measured mean and coefficient of variation, in a ``hosts:`` section to merge into a
cluster file.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from hetpar.costmodel.constants import CostConstants
from hetpar.errors import ConfigError
from hetpar.workload.model import ModelSpec

__all__ = ["LayerTiming", "DeviceProfile", "profile_device", "fit_rates", "catalog_entry",
           "reproduce", "parse_nccl_tests", "parse_iperf3", "network_section"]


@dataclass(frozen=True)
class LayerTiming:
    micro_batch: int  # sequences
    fwd_s: float  # forward of one layer (the fastest repeat)
    fwd_bwd_s: float  # forward and backward of one layer (the fastest repeat)


@dataclass(frozen=True)
class DeviceProfile:
    device: str  # "cpu" or "cuda:0"
    device_name: str  # what torch reports
    host: str
    date: str  # ISO 8601, UTC
    dtype: str
    model: ModelSpec
    seq_len: int
    memory_gib: float
    stream_GBps: float  # copy bandwidth of device memory (read + write)
    timings: tuple[LayerTiming, ...]


# ---- measuring -----------------------------------------------------------------------------------
def _layer(model: ModelSpec, torch: Any, device: Any, dtype: Any) -> Any:
    """One pre-norm transformer layer of ``model``'s shape (torch module)."""
    nn = torch.nn
    h, heads, kv = model.hidden, model.heads, model.kv_heads
    head_dim = h // heads
    bias = model.bias

    class Layer(nn.Module):  # type: ignore[name-defined]  # torch, imported by the caller
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(h)
            self.qkv = nn.Linear(h, h + 2 * kv * head_dim, bias=bias)
            self.proj = nn.Linear(h, h, bias=bias)
            self.norm2 = nn.LayerNorm(h)
            gate = 2 if model.mlp == "swiglu" else 1
            self.up = nn.Linear(h, gate * model.ffn_hidden, bias=bias)
            self.down = nn.Linear(model.ffn_hidden, h, bias=bias)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split([h, kv * head_dim, kv * head_dim], -1)
            q = q.view(b, s, heads, head_dim).transpose(1, 2)
            k = k.view(b, s, kv, head_dim).transpose(1, 2).repeat_interleave(heads // kv, 1)
            v = v.view(b, s, kv, head_dim).transpose(1, 2).repeat_interleave(heads // kv, 1)
            # Scores as the cost model counts them (no flash attention): s x s per head.
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim), -1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, h))
            y = self.up(self.norm2(x))
            if model.mlp == "swiglu":
                a, g = y.chunk(2, -1)
                y = torch.nn.functional.silu(a) * g
            else:
                y = torch.nn.functional.gelu(y)
            return x + self.down(y)

    return Layer().to(device=device, dtype=dtype)


def profile_device(model: ModelSpec, *, device: str = "cpu", seq_len: int | None = None,
                   micro_batches: Sequence[int] = (2, 4, 8), repeats: int = 5,
                   warmup: int = 2, threads: int | None = None) -> DeviceProfile:
    """Time one layer of ``model`` forward, and forward and backward, on ``device`` for
    each micro-batch size (the fastest of ``repeats`` after ``warmup`` runs). ``threads``:
    torch's CPU threads while timing (default: as torch has them, every core)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - the rl extra brings torch
        raise ConfigError("--device", "", "hetpar profile needs torch: pip install "
                                          "'hetpar[rl]'") from None
    if device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", device):
        raise ConfigError("--device", "", f"unknown device {device!r} (cpu, cuda or cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device", "", f"{device}: no CUDA device here (torch "
                                          f"{torch.__version__})")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise ConfigError("--device", "", f"{device}: this machine has "
                                          f"{torch.cuda.device_count()} CUDA device(s)")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _profile(torch, model, device, seq_len, micro_batches, repeats, warmup)
    finally:
        torch.set_num_threads(before)


def _profile(torch: Any, model: ModelSpec, device: str, seq_len: int | None,
             micro_batches: Sequence[int], repeats: int, warmup: int) -> DeviceProfile:
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    s = seq_len or model.seq_len
    layer = _layer(model, torch, dev, dtype)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    inputs = {b: torch.randn(b, s, model.hidden, device=dev, dtype=dtype, requires_grad=True)
              for b in micro_batches}
    fwd: dict[int, list[float]] = {b: [] for b in micro_batches}
    both: dict[int, list[float]] = {b: [] for b in micro_batches}
    # Round-robin over the sizes: a slow spell of a shared machine then falls on every
    # size alike, not on one, and the fastest run of each is kept.
    for i in range(warmup + repeats):
        for b, x in inputs.items():
            sync()
            t0 = time.perf_counter()
            out = layer(x)
            sync()
            t1 = time.perf_counter()
            out.backward(torch.ones_like(out))
            sync()
            t2 = time.perf_counter()
            layer.zero_grad(set_to_none=True)
            x.grad = None
            if i >= warmup:
                fwd[b].append(t1 - t0)
                both[b].append(t2 - t0)
    # The fastest run: on a shared machine other work only ever adds time.
    timings = [LayerTiming(b, min(fwd[b]), min(both[b])) for b in micro_batches]
    # Device memory bandwidth: a copy of 64 Mi values reads and writes each once.
    big = torch.empty(64 * 2**20, device=dev, dtype=torch.float32)
    dst = torch.empty_like(big)
    copies = []
    for i in range(warmup + repeats):
        sync()
        t0 = time.perf_counter()
        dst.copy_(big)
        sync()
        if i >= warmup:
            copies.append(time.perf_counter() - t0)
    stream = 2.0 * big.numel() * 4 / min(copies) / 1e9
    del big, dst
    if cuda:
        props = torch.cuda.get_device_properties(dev)
        name, memory = props.name, props.total_memory / 2**30
    else:
        name = platform.processor() or platform.machine() or "cpu"
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return DeviceProfile(device, name, platform.node() or "localhost",
                         _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
                         str(dtype).replace("torch.", ""), model, s, round(memory, 2),
                         round(stream, 3), tuple(timings))


# ---- fitting ---------------------------------------------------------------------------------------
def _work(model: ModelSpec, seq_len: int, b: int, c: CostConstants) -> tuple[float, float]:
    """(FLOPs, streamed bytes) of one layer's forward for ``b`` sequences: the cost model's
    own ``stage_work`` on a device of 1 FLOP/s and endless bandwidth, then the reverse
    (so the fit follows the cost model whatever it counts)."""
    from hetpar.costmodel.compute import GpuPerf, stage_work

    fw = c.framework("megatron-lm")

    def forward(flops: float, hbm: float) -> float:
        perf = GpuPerf("probe", flops, hbm, 1.0, 0.0, math.inf, flops)
        return stage_work(model, seq_len, b, 1, 1, False, False, "none", False, perf, c,
                          fw).fwd

    return forward(1.0, math.inf), forward(math.inf, 1.0)


def fit_rates(prof: DeviceProfile, c: CostConstants, framework: str = "megatron-lm",
              ) -> tuple[float, float]:
    """(R FLOP/s, H bytes/s): H the measured copy bandwidth, R the matmul rate whose
    modelled layer times have the least worst relative error against the measured
    forward-and-backward times."""
    h = prof.stream_GBps * 1e9
    over = 3.0 * c.framework(framework).layer_overhead_s
    # Relative error of timing i at u = 1/R: a_i u + b_i, a line in u.
    lines = []
    for t in prof.timings:
        f, s = _work(prof.model, prof.seq_len, t.micro_batch, c)
        lines.append((3.0 * f / t.fwd_bwd_s, (3.0 * s / h + over) / t.fwd_bwd_s - 1.0))
    # max_i |a_i u + b_i| is convex in u: its least is where two lines of opposite slope
    # sign cross (a_i u + b_i = -(a_j u + b_j)) or at u with one line at zero.
    cands = [max(0.0, -b / a) for a, b in lines if a > 0]
    cands += [max(0.0, -(b1 + b2) / (a1 + a2)) for a1, b1 in lines for a2, b2 in lines
              if a1 + a2 > 0]
    u = min(cands, key=lambda v: max(abs(a * v + b) for a, b in lines))
    return (1.0 / u if u > 0 else math.inf), h


def reproduce(prof: DeviceProfile, catalog: dict[str, Any], c: CostConstants,
              framework: str = "megatron-lm") -> list[tuple[int, float, float]]:
    """(micro-batch, measured s, modelled s) per timing: the cost model's own layer time
    (``stage_work``, one layer, no recomputation, without the per-micro-batch cost) on a
    host of the catalog's one GPU type."""
    from hetpar.cluster.gpu import parse_gpu_catalog
    from hetpar.cluster.topology import Host
    from hetpar.costmodel.compute import gpu_perf, stage_work

    gpu = next(iter(parse_gpu_catalog(catalog, "<profile>")))
    host = Host("profiled", gpu, 1, "pcie", gpu.pcie_GBps, 0.0, 10.0, "s")
    fw = c.framework(framework)
    perf = gpu_perf(host, "fp16", c, fw)
    out = []
    for t in prof.timings:
        work = stage_work(prof.model, prof.seq_len, t.micro_batch, 1, 1, False, False, "none",
                          False, perf, c, fw)
        out.append((t.micro_batch, t.fwd_bwd_s, work.total - fw.microbatch_overhead_s))
    return out


def catalog_entry(prof: DeviceProfile, rates: tuple[float, float], c: CostConstants,
                  name: str) -> dict[str, Any]:
    """A GPU catalog document (``--gpus`` accepts it) whose one type runs, under ``c``'s
    default efficiencies, at the fitted rates."""
    eff = c.gpu_efficiency(name)
    r, h = rates
    if not math.isfinite(h):
        # The data saw no memory-bound time: any plausible bandwidth reproduces them.
        h = 1e12
    peak = r / eff.gemm / 1e12
    hbm = h / eff.hbm / 1e9
    cuda = prof.device.startswith("cuda")
    entry: dict[str, Any] = {
        "vendor": "nvidia" if cuda else "cpu",
        "peak_tflops": {"fp16": round(peak, 4), "bf16": round(peak, 4)},
        "memory_gib": max(1.0, round(prof.memory_gib, 2)),
        "hbm_GBps": round(hbm, 2),
        "scaleup": {"kind": "pcie", "GBps": 16},
        "pcie_GBps": 16,
    }
    doc = {"gpus": {name: entry}}
    worst = max(abs(modelled / measured - 1.0)
                for _, measured, modelled in reproduce(prof, doc, c))
    entry["source"] = (f"measured by hetpar profile on {prof.host} ({prof.device}: "
                   f"{prof.device_name}) at {prof.date}: one {prof.model.name} layer, "
                   f"seq {prof.seq_len}, micro-batches "
                   f"{', '.join(str(t.micro_batch) for t in prof.timings)}, {prof.dtype}; "
                   f"fitted {r / 1e12:.4g} TFLOP/s and "
                   f"{(h / 1e9 if math.isfinite(h) else math.inf):.4g} GB/s effective, worst "
                   f"layer time off by {worst:.1%}; peak and HBM are those rates over the "
                   f"calibration's efficiencies ({eff.gemm:.4g}, {eff.hbm:.4g}); the "
                   f"scale-up link is not measured (PCIe assumed)")
    return doc


# ---- network -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinkMeasurement:
    name: str  # the host (or file) it describes
    mean_gbps: float
    cv: float
    source: str


def parse_nccl_tests(text: str, source: str) -> LinkMeasurement:
    """The out-of-place bus bandwidth of an nccl-tests run (all_reduce_perf,
    sendrecv_perf, ...) over its messages of 1 MiB and more: mean and variation, Gb/s."""
    busbw = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#") or len(words) < 8:
            continue
        try:
            size = int(words[0])
            int(words[1])
            value = float(words[7])
        except ValueError:
            continue
        if size >= 2**20:
            busbw.append(value * 8.0)  # GB/s -> Gb/s
    if not busbw:
        raise ConfigError(source, "", "no nccl-tests result rows of 1 MiB or more (expected "
                                      "the output of all_reduce_perf or sendrecv_perf)")
    # The largest messages reach the link's rate; the smaller ones are latency-bound.
    top = sorted(busbw)[len(busbw) // 2:]
    mean = statistics.fmean(top)
    cv = statistics.pstdev(top) / mean if len(top) > 1 and mean > 0 else 0.0
    return LinkMeasurement(Path(source).stem, mean, cv, source)


def parse_iperf3(text: str, source: str) -> LinkMeasurement:
    """An ``iperf3 --json`` run: the mean received rate and the variation of its interval
    rates, Gb/s; named after the remote host."""
    try:
        doc = json.loads(text)
        intervals = [float(i["sum"]["bits_per_second"]) for i in doc.get("intervals", [])]
        end = doc["end"]
        mean = float((end.get("sum_received") or end["sum_sent"])["bits_per_second"]) / 1e9
        connected = doc.get("start", {}).get("connected", [{}])
        name = str(connected[0].get("remote_host", "")) if connected else ""
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise ConfigError(source, "", "not the output of iperf3 --json (expected end."
                                      "sum_received.bits_per_second)") from None
    if not mean > 0:
        raise ConfigError(source, "", "iperf3 measured no throughput")
    rates = [r / 1e9 for r in intervals if r > 0]
    cv = statistics.pstdev(rates) / statistics.fmean(rates) if len(rates) > 1 else 0.0
    return LinkMeasurement(name or Path(source).stem, mean, cv, source)


def network_section(links: Sequence[LinkMeasurement]) -> dict[str, Any]:
    """Hosts' uplink bandwidth models for a cluster file: lognormal with the measured mean
    and coefficient of variation (a measured CV of 0 gives a constant link at the mean:
    set it as the host's ``nic_gbps``)."""
    hosts: list[dict[str, Any]] = []
    for link in links:
        if link.cv > 0:
            up = {"bandwidth": {"kind": "lognormal", "mean_gbps": round(link.mean_gbps, 3),
                                "cv": round(min(link.cv, 3.0), 4)}}
            hosts.append({"name": link.name, "uplink": up})
        else:
            hosts.append({"name": link.name, "nic_gbps": round(link.mean_gbps, 3)})
    return {"hosts": hosts}
