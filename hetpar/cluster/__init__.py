"""Hardware: GPU types, hosts, the network graph and its bandwidth models."""

from hetpar.cluster.bandwidth import Constant, LogNormal, Markov, Trace
from hetpar.cluster.gpu import GpuCatalog, GpuType, load_gpu_catalog
from hetpar.cluster.topology import Cluster, Host, Link, load_cluster, parse_cluster

__all__ = ["Cluster", "Host", "Link", "load_cluster", "parse_cluster", "GpuType", "GpuCatalog",
           "load_gpu_catalog", "Constant", "LogNormal", "Markov", "Trace"]
