"""Rendering of ``PlanBuilder-v0``: the plan so far as text, or the cluster as a picture.

The viewer reads the episode's public, frozen ``types.State`` and nothing of the
environment itself (an import-linter contract in pyproject.toml keeps it so):
``PlanBuilderEnv.render`` hands it ``env.state``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hetpar.envs.types import State

__all__ = ["RENDERERS", "render_text", "render_rgb"]


def render_text(state: State) -> str:
    inst = state.instance
    cluster, model = inst.cluster, inst.model
    hosts = cluster.hosts
    lines = [f"instance {inst.name}: {cluster.num_gpus} GPUs on {len(hosts)} hosts, "
             f"model {model.name} ({model.layers} layers), "
             f"batch {inst.training.global_batch}",
             f"phase {state.phase}; layers left {state.layers_left}"]
    if state.recompute:
        lines.append(f"recompute {state.recompute}, zero {state.zero}" +
                     (f", {state.micro_batches} micro-batches" if state.micro_batches else ""))
    n = len(state.built)
    for idx, (st, k) in enumerate(state.built):
        where = ", ".join(f"{hosts[h].name}x{b}" for h, b in zip(st.hosts, st.blocks))
        lines.append(f"  stage -{idx + 1} (pipeline stage {n - idx} counted from the end): "
                     f"{st.gpu_type} tp={st.tp} dp={st.dp} layers={k} on {where}")
    if state.open_tp:
        where = ", ".join(f"{hosts[h].name}x{b}" for h, b in state.open_blocks)
        lines.append(f"  open stage: tp={state.open_tp} dp={state.open_dp} on {where or '-'}")
    free = " ".join(f"{h.name}:{f}/{h.num_gpus}" for h, f in zip(hosts, state.free))
    lines.append(f"free GPUs: {free}")
    return "\n".join(lines) + "\n"


def render_rgb(state: State, size: tuple[int, int] = (640, 480)) -> np.ndarray:
    """Hosts coloured by the stage they serve (grey: unused), links by mean bandwidth."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import networkx as nx
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    cluster = state.instance.cluster
    graph = cluster.graph
    pos = nx.spring_layout(graph, seed=0)  # fixed seed: the same picture every frame
    stage_of: dict[str, int] = {}
    for idx, (st, _) in enumerate(state.built):
        for h in st.hosts:
            stage_of.setdefault(cluster.hosts[h].name, idx)
    open_hosts = {cluster.hosts[h].name for h, _ in state.open_blocks}
    cmap = plt.get_cmap("tab10")
    colours = []
    for node in graph.nodes:
        if node in open_hosts:
            colours.append("gold")
        elif node in stage_of:
            colours.append(cmap(stage_of[node] % 10))
        elif graph.nodes[node].get("kind") == "switch":
            colours.append("white")
        else:
            colours.append("lightgrey")
    widths, edge_vals = [], []
    for u, v in graph.edges:
        link = cluster.links[graph.edges[u, v]["index"]]
        edge_vals.append(np.log10(max(link.bandwidth.mean(), 1e-3)))
        widths.append(1.0 + edge_vals[-1])
    fig = plt.figure(figsize=(size[0] / 100, size[1] / 100), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_axis_off()
    ax.set_title(f"{state.instance.name}: {len(state.built)} stage(s) built, "
                 f"{state.layers_left} layers left", fontsize=9)
    nx.draw_networkx_edges(graph, pos, ax=ax, width=widths, edge_color=edge_vals,
                           edge_cmap=plt.get_cmap("viridis"))
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=colours, edgecolors="black",
                           node_size=300)
    nx.draw_networkx_labels(graph, pos, ax=ax, font_size=6)
    canvas.draw()
    img = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return img


# The frame of each of the environment's render modes.
RENDERERS: dict[str, Callable[[State], str | np.ndarray]] = {"ansi": render_text,
                                                             "rgb_array": render_rgb}
