"""The page builder of the self-contained HTML reports.

:class:`Report` is what analysis suites write into (``section``, ``text``, ``table``, ``figure``, ``result``,
``attention``, and ``add_html`` for markup of their own). The finished page inlines plotly.js once and the
circuitsvis bundle once, and a Content-Security-Policy forbids every fetch: it opens offline in any browser.
The app layer (:mod:`interp.app.report`) assembles whole reports of checkpoints and sweep directories from it.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InterpError
from .files import atomic_write_text
from .visualize import escape_text as _escape_text
from .visualize import render_table

# Nothing may be fetched: scripts and styles are inline, images only data:/blob: URLs.
CSP = (
    "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; worker-src blob:; connect-src 'none'"
)

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 16px 28px 60px; color: #1d2330; line-height: 1.45; }
h1 { margin-bottom: 4px; } h2 { margin-top: 40px; border-bottom: 1px solid #d5dae3; padding-bottom: 4px; }
.subtitle, .caption, .note { color: #5b6475; } .caption { font-size: 0.92em; margin: 2px 0 18px; }
.note { font-style: italic; }
nav ol { columns: 2; } nav a { color: #2952a3; text-decoration: none; }
table.data { border-collapse: collapse; margin: 8px 0 4px; font-size: 0.92em; }
table.data caption { caption-side: bottom; text-align: left; color: #5b6475; padding-top: 4px; }
table.data th, table.data td { border-bottom: 1px solid #e3e7ee; padding: 3px 10px; text-align: left; }
table.data th { background: #f3f5f9; } table.data td.num { text-align: right; font-variant-numeric: tabular-nums; }
.figure { margin: 8px 0; overflow-x: auto; }
.cards { display: flex; flex-wrap: wrap; gap: 8px 40px; align-items: flex-start; }
"""


@dataclass
class _Section:
    title: str
    anchor: str
    parts: list[str]


class Report:
    """An HTML page built from sections of plain text, tables, plotly figures and attention views.

    Analysis suites add content only through :meth:`section`, :meth:`text`, :meth:`table`, :meth:`figure`,
    :meth:`result`, :meth:`attention` and :meth:`add_html`; :meth:`html` renders the page and :meth:`save` writes
    it."""

    def __init__(self, title: str = "interp report", subtitle: str = ""):
        self.title = title
        self.subtitle = subtitle
        self.sections: list[_Section] = []
        self.n_figures = 0
        self.n_attention = 0
        self.on_section = None  # called with each new section's title (the progress bar shows it)

    # -- the builder methods the suites use ---------------------------------------------------------
    def section(self, title: str, intro: str = "") -> None:
        """Start a new section; ``intro`` is plain text saying what it shows."""
        anchor = f"s{len(self.sections) + 1}"
        if self.on_section is not None:
            self.on_section(str(title))
        self.sections.append(_Section(str(title), anchor, []))
        if intro:
            self.add_html(f'<p class="intro">{_escape_text(intro)}</p>')

    def text(self, text: str) -> None:
        """A paragraph of plain text (escaped; blank lines separate paragraphs)."""
        for para in str(text).split("\n\n"):
            if para.strip():
                self.add_html(f"<p>{_escape_text(para)}</p>")

    def table(
        self,
        rows: Any,
        columns: Sequence[str] | None = None,
        caption: str = "",
        formats: Mapping[str, str] | None = None,
    ) -> None:
        """A table with one row per mapping in ``rows`` (a sequence of mappings; anything else is refused with one
        clear line, so it is not narrowed by its annotation); ``columns`` picks and orders the columns (default: the
        keys in first-seen order); ``formats`` maps a column to a format spec such as ``".3f"``."""
        self.add_html(render_table(rows, columns, caption, formats))

    def figure(self, fig, caption: str = "") -> None:
        """A plotly figure (interactive; plotly.js is inlined once for the whole page)."""
        if not hasattr(fig, "to_html") or not hasattr(fig, "to_plotly_json"):
            raise InterpError(f"report.figure expects a plotly Figure, got {type(fig).__name__}")
        self.n_figures += 1
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=f"fig-{self.n_figures}",
            config={"displaylogo": False, "responsive": True},
        )
        self.add_html(f'<div class="figure">{div}</div>' + caption_html(caption))

    def result(self, result, caption: str = "") -> None:
        """An analysis result (:class:`interp.results.Result`): its table and its figure, where it has them."""
        table = result.table_html()
        if table:
            self.add_html(table)
        fig = result.figure()
        if fig is not None:
            self.figure(fig, caption)
        elif caption:
            self.add_html(caption_html(caption))

    def attention(self, view, caption: str = "") -> None:
        """An interactive circuitsvis attention view (:class:`interp.visualize.AttentionView`)."""
        from .visualize import AttentionView

        if not isinstance(view, AttentionView):
            raise InterpError(f"report.attention expects an interp.visualize.AttentionView, got {type(view).__name__}")
        self.n_attention += 1
        self.add_html(f'<div class="figure">{view.body_html()}</div>' + caption_html(caption))

    def add_html(self, markup: str) -> None:
        """Markup of the caller's own, added to the current section as it is (the caller escapes any text in it:
        :func:`interp.visualize.escape_text`)."""
        if not self.sections:
            self.sections.append(_Section("", "s0", []))
        self.sections[-1].parts.append(markup)

    def html(self) -> str:
        """The complete page: one file, every script inline, no external reference."""
        from .visualize import circuitsvis_bundle

        scripts = []
        if self.n_figures:
            from plotly.offline import get_plotlyjs

            scripts.append(f'<script type="text/javascript">{get_plotlyjs()}</script>')
        if self.n_attention:
            scripts.append(f"<script>{circuitsvis_bundle()}</script>")
        titled = [s for s in self.sections if s.title]
        nav = (
            (
                "<nav><ol>"
                + "".join(f'<li><a href="#{s.anchor}">{html.escape(s.title)}</a></li>' for s in titled)
                + "</ol></nav>"
            )
            if len(titled) > 1
            else ""
        )
        body = "".join(
            (f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>' if s.title else f'<section id="{s.anchor}">')
            + "".join(s.parts)
            + "</section>"
            for s in self.sections
        )
        subtitle = f'<p class="subtitle">{_escape_text(self.subtitle)}</p>' if self.subtitle else ""
        return (
            "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style>{''.join(scripts)}</head>"
            f"<body><h1>{html.escape(self.title)}</h1>{subtitle}{nav}{body}</body></html>\n"
        )

    def save(self, path) -> Path:
        """Write :meth:`html` to ``path`` atomically (a temp file in the same folder, then a rename)."""
        return atomic_write_text(path, self.html(), "the report")


def caption_html(caption: str) -> str:
    return f'<p class="caption">{_escape_text(caption)}</p>' if caption else ""
