"""Rendering of ``PlanBuilder-v0``: the plan so far as text, or the cluster as a picture."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hetpar.envs.env import PlanBuilderEnv

__all__ = ["render_text", "render_rgb"]


def render_text(env: PlanBuilderEnv) -> str:
    ep = env._ep
    assert ep is not None
    ctx = ep.ctx
    inst = ctx.instance
    hosts = ctx.cluster.hosts
    lines = [f"instance {inst.name}: {ctx.cluster.num_gpus} GPUs on {len(hosts)} hosts, "
             f"model {ctx.cm.model.name} ({ctx.cm.model.layers} layers), "
             f"batch {inst.training.global_batch}",
             f"phase {env.phase_name()}; layers left {ep.layers_left}"]
    if ep.recompute:
        lines.append(f"recompute {ep.recompute}, zero {ep.zero}" +
                     (f", {ep.micro_batches} micro-batches" if ep.micro_batches else ""))
    n = len(ep.built)
    for idx, (st, k) in enumerate(ep.built):
        where = ", ".join(f"{hosts[h].name}x{b}" for h, b in zip(st.hosts, st.blocks))
        lines.append(f"  stage -{idx + 1} (pipeline stage {n - idx} counted from the end): "
                     f"{st.gpu_type} tp={st.tp} dp={st.dp} layers={k} on {where}")
    if ep.open_tp:
        where = ", ".join(f"{hosts[h].name}x{b}" for h, b in sorted(ep.open_blocks.items()))
        lines.append(f"  open stage: tp={ep.open_tp} dp={ep.open_dp} on {where or '-'}")
    free = " ".join(f"{h.name}:{f}/{h.num_gpus}" for h, f in zip(hosts, ep.free))
    lines.append(f"free GPUs: {free}")
    return "\n".join(lines) + "\n"


def render_rgb(env: PlanBuilderEnv, size: tuple[int, int] = (640, 480)) -> np.ndarray:
    """Hosts coloured by the stage they serve (grey: unused), links by mean bandwidth."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import networkx as nx
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    ep = env._ep
    assert ep is not None
    cluster = ep.ctx.cluster
    graph = cluster.graph
    pos = nx.spring_layout(graph, seed=0)  # fixed seed: the same picture every frame
    stage_of: dict[str, int] = {}
    for idx, (st, _) in enumerate(ep.built):
        for h in st.hosts:
            stage_of.setdefault(cluster.hosts[h].name, idx)
    open_hosts = {cluster.hosts[h].name for h in ep.open_blocks}
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
    ax.set_title(f"{ep.ctx.instance.name}: {len(ep.built)} stage(s) built, "
                 f"{ep.layers_left} layers left", fontsize=9)
    nx.draw_networkx_edges(graph, pos, ax=ax, width=widths, edge_color=edge_vals,
                           edge_cmap=plt.get_cmap("viridis"))
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=colours, edgecolors="black",
                           node_size=300)
    nx.draw_networkx_labels(graph, pos, ax=ax, font_size=6)
    canvas.draw()
    img = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return img
