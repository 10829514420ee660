"""The picture of a :class:`interp.analyses.circuit_discovery.Circuit`: nodes by layer, edges coloured by score."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .circuit_graph import ComputationalGraph


def node_positions(graph: ComputationalGraph) -> dict[str, tuple[float, float]]:
    """``name -> (x, y)``: the input at the bottom, each layer's heads in a row (an MLP half a row above them), the
    logits at the top; key/value heads of grouped-query attention beside their layer's query heads."""
    pos = {"input": (0.0, 0.0), "logits": (0.0, 2.0 * graph.n_layers + 1.0)}
    H, K = graph.n_heads, graph.n_kv_heads
    for l in range(graph.n_layers):
        y = 2.0 * l + 1.0
        for h in range(H):
            pos[f"L{l}H{h}"] = (h - (H - 1) / 2, y)
        if K != H:
            for h in range(K):
                pos[f"L{l}KV{h}"] = ((h - (K - 1) / 2) * H / max(K, 1), y - 0.45)
        if graph.has_mlp:
            pos[f"MLP{l}"] = (0.0, y + 1.0)
    return pos


def circuit_figure(circuit, show_all: bool = False):
    """Plotly figure of a :class:`interp.analyses.circuit_discovery.Circuit`: kept edges (all edges with
    ``show_all``) as lines, red for scores below 0 (removing the edge lowers the metric), blue above, width and
    opacity by ``|score|``; q / k / v inputs end at the receiving head, labelled on hover."""
    import plotly.graph_objects as go

    g = circuit.graph
    pos = node_positions(g)
    scores = circuit.scores.nan_to_num(0)
    top = float(scores.abs().max()) or 1.0
    fig = go.Figure()
    offset = {"q": -0.18, "k": 0.0, "v": 0.18}
    for e, (r, s) in enumerate(g.edges):
        if not (show_all or bool(circuit.kept[e])):
            continue
        a = pos[g.senders[s]]
        name = g.receivers[r]
        node, _, letter = name.partition(".")
        b = pos[node]
        b = (b[0] + offset.get(letter, 0.0), b[1] - (0.12 if letter else 0.0))
        v = float(scores[e])
        w = abs(v) / top
        colour = f"rgba({200 if v < 0 else 40},60,{40 if v < 0 else 200},{0.25 + 0.75 * w:.3f})"
        fig.add_trace(
            go.Scatter(
                x=[a[0], b[0]],
                y=[a[1], b[1]],
                mode="lines",
                line={"width": 1 + 5 * w, "color": colour},
                hovertext=f"{g.senders[s]} -> {name}: {v:+.4g}",
                hoverinfo="text",
                showlegend=False,
            )
        )
    used = set(circuit.nodes) | {"input", "logits"}
    names = [n for n in pos if n in used or show_all]
    fig.add_trace(
        go.Scatter(
            x=[pos[n][0] for n in names],
            y=[pos[n][1] for n in names],
            mode="markers+text",
            text=names,
            textposition="middle right",
            marker={"size": 14, "color": ["#444" if n in used else "#ccc" for n in names]},
            hoverinfo="text",
            showlegend=False,
        )
    )
    fig.update_layout(
        title=f"Circuit ({circuit.method}, {circuit.ablation} ablation): {circuit.size} of {g.n_edges} edges, "
        f"faithfulness {circuit.faithfulness:.3f}<br><sup>red: removing the edge lowers {circuit.metric}; blue: "
        "raises it; width ~ |score|</sup>",
        xaxis={"visible": False},
        yaxis={"visible": False},
        template="plotly_white",
        height=200 + 120 * g.n_layers,
    )
    return fig
