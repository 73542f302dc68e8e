"""Every bundled configuration loads, and the bundled models and networks are what they claim."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import hetpar
from hetpar.cluster import LogNormal, Markov, Trace
from hetpar.configio import bundled_dir, list_bundled

CLUSTERS = list_bundled("clusters")
MODELS = list_bundled("models")
TRAININGS = list_bundled("training")

# Published parameter counts (not derived from the config files).
PUBLISHED_PARAMS = {
    # Megatron-LM SC21 Table 1.
    "megatron-gpt-1.7b": 1.7e9,
    "megatron-gpt-3.6b": 3.6e9,
    "megatron-gpt-7.5b": 7.5e9,
    "megatron-gpt-18b": 18.4e9,
    "megatron-gpt-39b": 39.1e9,
    "megatron-gpt-76b": 76.1e9,
    "megatron-gpt-145b": 145.6e9,
    "megatron-gpt-310b": 310.1e9,
    "megatron-gpt-530b": 529.6e9,
    "megatron-gpt-1t": 1008.0e9,
    # GPT-3 paper, Table 2.1.
    "gpt3-1.3b": 1.3e9,
    "gpt3-2.7b": 2.7e9,
    "gpt3-6.7b": 6.7e9,
    # Llama 2 / Llama 3 (exact counts of the released checkpoints).
    "llama2-7b": 6.74e9,
    "llama2-13b": 13.02e9,
    "llama2-70b": 68.98e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.55e9,
    # GPT-2 medium (Radford et al. 2019: 345M; AMP's padded vocabulary of 52,256 adds ~3%).
    "gpt2-medium": 0.345e9,
    # GPT-2 XL (Radford et al. 2019, Table 2: 1542M).
    "gpt2-xl": 1.542e9,
}


def _path(kind: str, name: str):
    return bundled_dir() / kind / f"{name}.yaml"


def test_bundled_configs_are_discovered():
    assert {"dgx-a100-superpod-4", "dgx-a100-superpod-16", "dgx-a100-superpod-32",
            "cloud-mixed", "wan-two-region", "trace-demo"} <= set(CLUSTERS)
    assert set(PUBLISHED_PARAMS) <= set(MODELS)
    assert {"default", "megatron-sc21", "llama-bf16", "small-batch"} <= set(TRAININGS)


# ---- everything loads --------------------------------------------------------------------

@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_loads(name):
    cluster = hetpar.load_cluster(_path("clusters", name))
    assert cluster.name == name
    assert cluster.num_gpus > 0
    assert cluster.description, "bundled clusters say what they represent"
    rng = np.random.default_rng(0)
    bw = cluster.sample_link_bandwidth(rng, 64)
    caps = np.array([link.capacity_gbps for link in cluster.links])
    assert bw.shape == (64, len(cluster.links))
    assert np.all(bw > 0) and np.all(bw <= caps + 1e-9)


@pytest.mark.parametrize("name", MODELS)
def test_model_loads(name):
    model = hetpar.load_model(_path("models", name))
    assert model.name == name


@pytest.mark.parametrize("name", TRAININGS)
def test_training_loads(name):
    training = hetpar.load_training(_path("training", name))
    assert training.name == name


@pytest.mark.parametrize("kind,name", [("clusters", n) for n in CLUSTERS]
                         + [("models", n) for n in MODELS]
                         + [("training", n) for n in TRAININGS])
def test_bundled_config_loads_by_name(kind, name):
    """Bundled configs resolve by their stem, including stems with dots (``gpt3-1.3b``)."""
    loader = {"clusters": hetpar.load_cluster, "models": hetpar.load_model,
              "training": hetpar.load_training}[kind]
    assert loader(name).name == name


# ---- models ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_model_size_matches_publication(name):
    model = hetpar.load_model(_path("models", name))
    published = PUBLISHED_PARAMS[name]
    assert abs(model.total_params - published) <= 0.05 * published, (
        f"{name}: {model.total_params / 1e9:.3f}B vs published {published / 1e9:.3f}B")


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
                                  "llama3-70b"])
def test_llama_architecture(name):
    m = hetpar.load_model(_path("models", name))
    assert (m.mlp, m.position, m.norm, m.tied_embeddings, m.bias) == (
        "swiglu", "rope", "rmsnorm", False, False)
    gqa = name in ("llama2-70b", "llama3-8b", "llama3-70b")
    assert (m.kv_heads == 8) if gqa else (m.kv_heads == m.heads)
    assert m.seq_len == (8192 if name.startswith("llama3") else 4096)
    assert m.vocab == (128256 if name.startswith("llama3") else 32000)


# ---- training ----------------------------------------------------------------------------

def test_training_presets():
    sc21 = hetpar.load_training(_path("training", "megatron-sc21"))
    assert (sc21.global_batch, sc21.recompute_modes, sc21.zero_stages) == (512, ("full",), (0,))
    llama = hetpar.load_training(_path("training", "llama-bf16"))
    assert (llama.global_batch, llama.seq_len, llama.precision, llama.flash_attention) == (
        256, None, "bf16", True)
    assert set(llama.recompute_modes) == {"none", "selective", "full"}
    assert llama.zero_stages == (0, 1)
    small = hetpar.load_training(_path("training", "small-batch"))
    assert (small.global_batch, small.precision) == (8, "fp16")


# ---- networks ----------------------------------------------------------------------------

def test_trace_cluster_samples_within_trace_range():
    cluster = hetpar.load_cluster(_path("clusters", "trace-demo"))
    traces = [link for link in cluster.links if isinstance(link.bandwidth, Trace)]
    assert len(traces) == 1
    with (bundled_dir() / "traces" / "wan-demo.csv").open(newline="") as fh:
        values = [float(row["wan"]) for row in csv.DictReader(fh)]
    assert len(values) >= 50
    lo, hi = min(values), max(values)
    index = cluster.links.index(traces[0])
    bw = cluster.sample_link_bandwidth(np.random.default_rng(1), 5000)[:, index]
    assert np.all(bw >= lo) and np.all(bw <= hi)
    assert bw.min() < 0.5 * hi, "draws should reach the trace's congested periods"
    # The two hosts talk over the traced link.
    route = cluster.routes[0][1]
    assert index in {ch // 2 for ch in route}


def test_cloud_cluster_has_lognormal_links():
    cluster = hetpar.load_cluster(_path("clusters", "cloud-mixed"))
    lognormal = [link for link in cluster.links if isinstance(link.bandwidth, LogNormal)]
    assert lognormal
    switch_links = [link for link in lognormal if link.a not in cluster.host_index
                    and link.b not in cluster.host_index]
    host_links = [link for link in lognormal if link not in switch_links]
    assert switch_links and host_links
    for link in lognormal:
        assert link.bandwidth.mean() <= link.capacity_gbps
        assert link.bandwidth.cv() > 0
    assert len(cluster.gpu_types) == 3


def test_wan_cluster_route_crosses_wan_link():
    cluster = hetpar.load_cluster(_path("clusters", "wan-two-region"))
    wan = [i for i, link in enumerate(cluster.links) if isinstance(link.bandwidth, Markov)]
    assert len(wan) == 1
    wan_link = cluster.links[wan[0]]
    assert wan_link.latency_s >= 0.01
    sites = {h.name: h.switch for h in cluster.hosts}
    assert len(set(sites.values())) == 2
    for i, a in enumerate(cluster.hosts):
        for j, b in enumerate(cluster.hosts):
            if i == j:
                continue
            links = {ch // 2 for ch in cluster.routes[i][j]}
            if a.switch != b.switch:
                assert wan[0] in links
                assert cluster.route_latency_s[i, j] >= 0.01
            else:
                assert wan[0] not in links
                assert cluster.route_latency_s[i, j] < 0.001
    # Slow and variable: the Markov chain's mean is below capacity and it varies.
    assert wan_link.bandwidth.mean() < wan_link.capacity_gbps
    assert wan_link.bandwidth.cv() > 0.1
