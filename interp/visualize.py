"""Visualisation building blocks: offline circuitsvis attention views and plotly heatmaps.

circuitsvis' ``str(view)`` loads its JavaScript from a CDN (blank offline); these helpers always use
the package's bundled ``dist/cdn/iife.js``, so every file and notebook output works without a network.
"""

from __future__ import annotations

import html as _html
import json
import numbers
import uuid
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .errors import InterpError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


@lru_cache(maxsize=1)
def circuitsvis_bundle() -> str:
    """The circuitsvis JavaScript bundle (defines the global ``CircuitsVis``), safe to inline in <script>."""
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    return path.read_text(encoding="utf-8").replace("</script>", "<\\/script>")


_ON_PAGE: set[str] = set()  # scripts already put on the notebook page by this kernel


def notebook_script(name: str) -> str:
    """``<script>`` with the ``plotly`` or ``circuitsvis`` bundle the first time this kernel asks, ``""`` after:
    notebook outputs load each bundle once per page and reference it (a 64-head view is then ~100 kB, not 2 MB).
    :func:`forget_notebook_scripts` starts over (e.g. for a new page)."""
    if name in _ON_PAGE:
        return ""
    if name == "plotly":
        from plotly.offline import get_plotlyjs

        js = get_plotlyjs().replace("</script>", "<\\/script>")
    elif name == "circuitsvis":
        js = circuitsvis_bundle()
    else:
        raise InterpError(f"unknown script {name!r}; expected 'plotly' or 'circuitsvis'")
    _ON_PAGE.add(name)
    return f"<script>{js}</script>"


def forget_notebook_scripts() -> None:
    """Make the next notebook output carry its bundles again."""
    _ON_PAGE.clear()


def notebook_figure_html(fig) -> str:
    """A plotly figure as notebook HTML that needs no network (plotly.js once per kernel)."""
    return notebook_script("plotly") + fig.to_html(
        full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True}
    )


HOLE = -1.0  # the value a sparse mask's hole takes in a view (drawn in HOLE_COLOR, apart from zero attention)
HOLE_COLOR = "#8a8f98"


def attention_props(
    tokens: Sequence[str],
    pattern: Float[Tensor, "heads dest src"],
    head_names: Sequence[str] | None = None,
    holes: Bool[Tensor, "heads dest src"] | None = None,
) -> dict:
    """Validated props for circuitsvis' ``AttentionHeads``. Tokens are passed as plain text: React renders
    them as text (escaping them would show ``&lt;``); :func:`render_call` keeps ``</script>`` out of the JSON.
    ``holes`` marks keys a sparse attention mask hides from a query (before it, so not the causal mask's): they
    show as :data:`HOLE` in grey, apart from keys that are seen and get no weight (white)."""
    pattern = torch.as_tensor(pattern).detach().float().cpu()
    if pattern.ndim == 2:
        pattern = pattern[None]
    if pattern.ndim != 3 or pattern.shape[1] != pattern.shape[2]:
        raise InterpError(
            f"attention pattern must have shape [heads, dest, src] with dest == src, got {tuple(pattern.shape)}"
        )
    if len(tokens) != pattern.shape[-1]:
        raise InterpError(
            f"{len(tokens)} tokens were given for an attention pattern over {pattern.shape[-1]} positions"
        )
    names = list(head_names) if head_names is not None else [f"H{h}" for h in range(pattern.shape[0])]
    if len(names) != pattern.shape[0]:
        raise InterpError(f"{len(names)} head names were given for {pattern.shape[0]} heads")
    extra = {}
    if holes is not None and bool(torch.as_tensor(holes).any()):
        holes = torch.as_tensor(holes, dtype=torch.bool).cpu()
        if holes.shape != pattern.shape:
            raise InterpError(f"holes of shape {tuple(holes.shape)} for a pattern of shape {tuple(pattern.shape)}")
        pattern = pattern.masked_fill(holes, HOLE)
        extra = {"minValue": HOLE, "maxValue": 1.0, "negativeColor": HOLE_COLOR}
    return {
        "attention": [[[round(float(v), 5) for v in row] for row in head] for head in pattern.tolist()],
        "tokens": [str(t) for t in tokens],
        "attentionHeadNames": names,
        **extra,
    }


def render_call(element: str, props: dict, div_id: str | None = None) -> str:
    """A <div> plus the script that renders a circuitsvis element into it (needs the bundle on the page)."""
    div_id = div_id or f"cv-{uuid.uuid4().hex[:12]}"
    return (
        f'<div id="{div_id}" class="cv-view" style="margin: 8px 0"></div>'
        f'<script>CircuitsVis.render("{div_id}", CircuitsVis.{element}, {_script_json(props)});</script>'
    )


def _script_json(obj) -> str:
    """JSON that is safe inside a <script> element."""
    return json.dumps(obj).replace("</", "<\\/").replace("<!--", "<\\!--")


class AttentionView:
    """Interactive attention patterns of several heads on one sequence (circuitsvis ``AttentionHeads``).

    Displays itself in Jupyter (offline: the bundle is inlined), ``.save(path)`` writes a self-contained
    HTML file, ``.pattern`` keeps the numbers (``.holes`` the keys a sparse mask hides, where it has one)."""

    def __init__(
        self,
        tokens: Sequence[str],
        pattern: Float[Tensor, "heads dest src"],
        head_names: Sequence[str] | None = None,
        title: str = "",
        holes: Bool[Tensor, "heads dest src"] | None = None,
    ):
        self.props = attention_props(tokens, pattern, head_names, holes)
        self.holes = None if holes is None else torch.as_tensor(holes).detach().cpu()
        self.tokens = list(tokens)
        self.pattern = torch.as_tensor(pattern).detach().cpu()
        self.head_names = self.props["attentionHeadNames"]
        self.title = title

    def body_html(self) -> str:
        """The view's markup for a page that already includes :func:`circuitsvis_bundle`."""
        title = f"<h3>{_html.escape(self.title)}</h3>" if self.title else ""
        return title + render_call("AttentionHeads", self.props)

    def html(self) -> str:
        """A complete, self-contained HTML document."""
        return (
            "<!DOCTYPE html><html><head><meta charset='utf-8'><title>attention</title>"
            f"<script>{circuitsvis_bundle()}</script></head><body>{self.body_html()}</body></html>"
        )

    def save(self, path) -> Path:
        from .files import atomic_write_text

        return atomic_write_text(path, self.html(), "the attention view")

    def _repr_html_(self) -> str:
        return notebook_script("circuitsvis") + self.body_html()


def attention_patterns(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], fwd_hooks=()
) -> Float[Tensor, "batch layer head q k"]:
    """Every layer's attention pattern ``[batch, layer, head, query, key]`` from one forward pass (optionally with
    intervention hooks): the one attention-pattern function of analyses and reports."""
    store: dict[int, Tensor] = {}

    def keep(pattern, hook):
        store[hook.layer()] = pattern

    names = [(f"blocks.{l}.attn.hook_pattern", keep) for l in range(model.cfg.n_layers)]
    with torch.inference_mode():
        model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks) + names, return_type=None)
    return torch.stack([store[l] for l in range(model.cfg.n_layers)], dim=1)


def attention_view(
    model: HookedTransformer,
    tokens: Int[Tensor, " pos"],
    heads=None,
    vocab=None,
    token_strs=None,
    title: str = "",
    max_len: int | None = None,
) -> AttentionView:
    """A circuitsvis view of ``heads`` (default: all) on one sequence, its tokens named by ``vocab`` (the task's) or
    ``token_strs`` (else their ids); only the first ``max_len`` tokens are shown if given (causal attention: the
    shown rows are exact). Displays inline in Jupyter; ``.save(path)`` writes an offline HTML file."""
    from .device import model_device
    from .errors import TokenError
    from .evaluation import check_tokens
    from .heads import head_label, parse_heads

    tokens = torch.as_tensor(tokens)
    if tokens.ndim == 2 and tokens.shape[0] == 1:
        tokens = tokens[0]
    if tokens.ndim != 1:
        raise TokenError(f"attention_view takes one sequence [pos], got shape {tuple(tokens.shape)}")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    heads = (
        [(l, h) for l in range(n_layers) for h in range(n_heads)]
        if heads is None
        else parse_heads(heads, n_layers, n_heads)
    )
    tokens = tokens.to(model_device(model))
    check_tokens(model, tokens[None])
    shown = len(tokens) if max_len is None else min(len(tokens), max_len)
    pats = attention_patterns(model, tokens[None])[0]  # [layer, head, q, k]
    pattern = torch.stack([pats[l, h, :shown, :shown] for l, h in heads])
    if token_strs is None:
        token_strs = vocab.decode(tokens[:shown]) if vocab is not None else [str(int(t)) for t in tokens[:shown]]
    holes = mask_holes(model, shown)
    return AttentionView(
        list(token_strs)[:shown],
        pattern,
        [head_label(*h) for h in heads],
        title=title,
        holes=None if holes is None else torch.stack([holes[l] for l, _ in heads]),
    )


def mask_holes(model: HookedTransformer, n: int) -> Bool[Tensor, "layer query key"] | None:
    """Per layer, the earlier keys a sparse attention mask hides from each of ``n`` queries (None: no layer has a
    mask; :mod:`interp.attention`)."""
    from .attention import layer_attention

    layers = [layer_attention(model, l) for l in range(model.cfg.n_layers)]
    if not any(a.masks for a in layers):
        return None
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.stack([causal & ~a.allowed(n) for a in layers])


def heatmap(
    matrix: Float[Tensor, "rows cols"],
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    title: str = "",
    colorscale: str | Sequence = "RdBu",
    zmid: float | None = 0.0,
    zmin: float | None = None,
    zmax: float | None = None,
    x_title: str = "",
    y_title: str = "",
    text_fmt: str | None = None,
):
    """A labelled plotly heatmap (rows top to bottom), values shown on hover (and in cells if ``text_fmt``)."""
    import plotly.graph_objects as go

    z = torch.as_tensor(matrix).detach().float().cpu()
    if z.shape != (len(y_labels), len(x_labels)):
        raise InterpError(
            f"heatmap of shape {tuple(z.shape)} needs {z.shape[0]} row and {z.shape[1]} column labels, "
            f"got {len(y_labels)} and {len(x_labels)}"
        )
    kw = dict(z=z.tolist(), x=list(x_labels), y=list(y_labels), colorscale=colorscale, hoverongaps=False)
    if zmid is not None and zmin is None and zmax is None:
        kw["zmid"] = zmid
    if zmin is not None:
        kw["zmin"] = zmin
    if zmax is not None:
        kw["zmax"] = zmax
    if text_fmt:
        kw["text"] = [[format(v, text_fmt) for v in row] for row in z.tolist()]
        kw["texttemplate"] = "%{text}"
    fig = go.Figure(go.Heatmap(**kw))
    fig.update_layout(
        title=title,
        xaxis_title=x_title,
        yaxis_title=y_title,
        yaxis_autorange="reversed",
        width=max(420, 28 * len(x_labels) + 200, int(7.5 * len(title)) + 120),
        height=max(360, 24 * len(y_labels) + 160),
        template="plotly_white",
    )
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def render_table(
    rows: Any,
    columns: Sequence[str] | None = None,
    caption: str = "",
    formats: Mapping[str, str] | None = None,
    float_format: str = ".4g",
) -> str:
    """The HTML of a table of dict rows (cells escaped, numbers right-aligned; ``formats`` per column,
    ``float_format`` for other non-integer numbers)."""
    if isinstance(rows, Mapping) or not all(isinstance(r, Mapping) for r in rows):
        raise InterpError("a table expects a list of dicts (one per row)")
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    columns = [str(c) for c in columns]
    formats = dict(formats or {})
    unknown = sorted(set(formats) - set(columns))
    if unknown:
        raise InterpError(f"table formats name unknown column(s) {unknown}; the columns are {columns}")
    for col, spec in formats.items():
        try:
            format(1.5, spec)
        except (ValueError, TypeError):
            raise InterpError(f"table format {spec!r} for column {col!r} is not a valid format spec") from None
    head = "".join(f"<th>{_html.escape(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            text, numeric = _cell(r.get(c), formats.get(c), float_format)
            cells.append(f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{escape_text(caption)}</caption>" if caption else ""
    empty = "" if rows else f'<tr><td colspan="{max(len(columns), 1)}" class="note">(no rows)</td></tr>'
    return f'<table class="data">{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}{empty}</tbody></table>'


def _cell(value, spec: str | None, float_format: str = ".4g") -> tuple[str, bool]:
    """(escaped text, is-number) for one table cell; 0-d tensors/arrays become numbers."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if value is None:
        return "", False
    if isinstance(value, bool):
        return str(value), False
    if isinstance(value, numbers.Number):
        if spec:
            return _html.escape(format(value, spec)), True
        if isinstance(value, numbers.Integral):
            return str(value), True
        return _html.escape(format(value, float_format)), True
    return _html.escape(str(value)), False


def escape_text(text: str) -> str:
    """Plain text as HTML (escaped, newlines kept)."""
    return _html.escape(str(text)).replace("\n", "<br>")


def aligned(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows of text cells as right-aligned columns under ``headers`` (the CLI's tables)."""
    width = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(headers)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, width)) for line in [list(headers), *rows])
