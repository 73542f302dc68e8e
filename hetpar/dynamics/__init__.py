"""Dynamic networks: time-varying bandwidth, topology events and re-planning over a
training run (``hetpar replan``; docs/dynamics.md)."""

from hetpar.dynamics.scenario import (
                                      Migration,
                                      NetworkState,
                                      Scenario,
                                      Timeline,
                                      build_timeline,
                                      cluster_without,
                                      load_scenario,
)

__all__ = ["Migration", "NetworkState", "Scenario", "Timeline", "build_timeline",
           "cluster_without", "load_scenario"]
