"""The HTML report: the page builder, the report of the shipped noisy-majority checkpoint (structure,
numbers checked against independent computations, offline by inspection), and bad input through the CLI."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from interp.errors import InterpError, TaskError

ROOT = Path(__file__).resolve().parents[1]
RENDER_RE = re.compile(r'CircuitsVis\.render\("([^"]+)", CircuitsVis\.(\w+), (.*?)\);</script>', re.S)


class PageParser(HTMLParser):
    """Collects what the tests look at: headings, tables (as lists of rows of cell text), every tag's
    attributes, and the text of inline scripts."""

    def __init__(self):
        super().__init__()
        self.h2: list[str] = []
        self.tables: list[dict] = []
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._stack: list[str] = []
        self._cell: list[str] | None = None
        self._caption: list[str] | None = None
        self._h2: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "table":
            self.tables.append({"rows": [], "caption": ""})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "caption":
            self._caption = []
        elif tag == "h2":
            self._h2 = []
        elif tag == "script":
            self.scripts.append("")
        self._stack.append(tag)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1]["rows"][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "caption" and self._caption is not None:
            self.tables[-1]["caption"] = "".join(self._caption).strip()
            self._caption = None
        elif tag == "h2" and self._h2 is not None:
            self.h2.append("".join(self._h2).strip())
            self._h2 = None
        if self._stack and self._stack[-1] == tag:
            self._stack.pop()

    def handle_data(self, data):
        for buf in (self._cell, self._caption, self._h2):
            if buf is not None:
                buf.append(data)
        if self._stack and self._stack[-1] == "script":
            self.scripts[-1] += data


def parse(page: str) -> PageParser:
    p = PageParser()
    p.feed(page)
    p.close()
    return p


def table_with_caption(page: PageParser, prefix: str) -> list[dict[str, str]]:
    """The rows (header -> cell) of the first table whose caption starts with ``prefix``."""
    for t in page.tables:
        if t["caption"].startswith(prefix):
            header, *rows = t["rows"]
            return [dict(zip(header, r)) for r in rows]
    raise AssertionError(f"no table captioned {prefix!r}; captions: {[t['caption'] for t in page.tables]}")


# -- the Report builder (no model needed) -----------------------------------------------------------
def test_report_builder_escapes_formats_and_inlines_scripts_once(tmp_path):
    import plotly.graph_objects as go

    from interp.report_page import Report
    from interp.visualize import AttentionView, circuitsvis_bundle

    r = Report(title="t <1>")
    r.section("First <b>", intro="intro & more")
    r.text("a <script>alert(1)</script> b\n\nsecond paragraph")
    r.table(
        [{"head": "L0H1", "score": 0.123456, "n": 3}, {"head": "<L0H2>", "score": torch.tensor(2.5), "extra": None}],
        formats={"score": ".2f"},
        caption="scores",
    )
    r.section("Second")
    for _ in range(2):
        r.figure(go.Figure(go.Scatter(x=[1, 2], y=[3, 4])), caption="a figure")
        pattern = torch.tril(torch.ones(2, 3, 3))
        r.attention(AttentionView(["a", "<b>", "c"], pattern / pattern.sum(-1, keepdim=True), ["L0H0", "L0H1"]))
    page = r.html()
    parsed = parse(page)

    assert parsed.h2 == ["First <b>", "Second"]
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    rows = table_with_caption(parsed, "scores")
    assert rows == [
        {"head": "L0H1", "score": "0.12", "n": "3", "extra": ""},
        {"head": "<L0H2>", "score": "2.50", "n": "", "extra": ""},
    ]
    from plotly.offline import get_plotlyjs

    assert page.count(get_plotlyjs()[:3000]) == 1  # plotly.js inlined once for two figures
    assert page.count(circuitsvis_bundle()[:3000]) == 1  # the circuitsvis bundle inlined once for two views
    assert len(RENDER_RE.findall(page)) == 2
    assert len([a for t, a in parsed.tags if "plotly-graph-div" in a.get("class", "")]) == 2
    out = r.save(tmp_path / "r.html")
    assert out.read_text(encoding="utf-8") == page and [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_report_without_figures_or_views_carries_no_scripts():
    from interp.report_page import Report

    r = Report()
    r.section("Only text")
    r.table([], columns=["a"], caption="empty")
    page = r.html()
    assert "<script" not in page and "(no rows)" in page


def test_report_builder_rejects_bad_arguments():
    from interp.report_page import Report

    r = Report()
    with pytest.raises(InterpError, match="unknown column"):
        r.table([{"a": 1}], formats={"b": ".2f"})
    with pytest.raises(InterpError, match="not a valid format spec"):
        r.table([{"a": 1}], formats={"a": ".2q"})
    with pytest.raises(InterpError, match="list of dicts"):
        r.table({"a": 1})
    with pytest.raises(InterpError, match="plotly Figure"):
        r.figure("<div>not a figure</div>")
    with pytest.raises(InterpError, match="AttentionView"):
        r.attention(torch.zeros(1, 2, 2))


def test_a_suite_that_cannot_be_loaded_gives_a_note_not_an_error():
    from types import SimpleNamespace

    import interp
    from interp import registry
    from interp.app.report import add_suite_sections
    from interp.report_page import Report
    from interp.tasks.noisy_majority import NoisyMajority

    class Broken(NoisyMajority):
        name = "broken-suite-task"

    interp.register_task(Broken, suite="no_such_module_here:SUITE")
    try:
        r = Report()
        add_suite_sections(SimpleNamespace(task=Broken(train_size=4, val_size=4, test_size=4)), r, progress=False)
    finally:
        registry.unregister_task("broken-suite-task")
    parsed = parse(r.html())
    assert parsed.h2 == ["Analyses"]
    assert "the suite 'no_such_module_here:SUITE' of task 'broken-suite-task' cannot be loaded" in html.unescape(
        r.html()
    )


def test_pick_examples_prefers_short_sequences_with_distinct_labels(nm_task):
    from interp.app.report import pick_examples

    chosen, why = pick_examples(nm_task, n=3, target_len=28)
    assert len(chosen) == 3
    # held-out splits come first, but noisy-majority's are all longer than a readable view: the reason says so
    assert all(split == "train" for split, _, _ in chosen)
    assert "the test sequences are 155-204 tokens long" in why and "the val sequences are 105-154 tokens long" in why
    labels = {int(ex.labels[0]) for _, _, ex in chosen}
    assert labels == {5, 6}  # both answers ('4' and '5') are shown
    for split, i, ex in chosen:
        full = nm_task.dataset(split)
        length = int(full.lengths[i])
        assert torch.equal(ex.tokens[0, :length], full.tokens[i, :length])
        assert abs(length - 28) <= 2  # the train split has thousands of sequences near 28 tokens


# -- the reports of the shipped checkpoints (built once per session, shared with test_browser.py) ----------
# the shipped reports take ~40 s to build on 2 cores: the tests that read them run with -m slow
SHIPPED = {"noisy-majority": "noisy-majority", "repeated-tokens": "repeated-tokens"}  # checkpoint -> task


@pytest.fixture(scope="module", params=list(SHIPPED))
def shipped_page(request, shipped_report):
    """(checkpoint name, page text, parsed page, seconds to build) for each shipped checkpoint."""
    path, seconds = shipped_report(request.param)
    text = path.read_text(encoding="utf-8")
    return request.param, text, parse(text), seconds


@pytest.fixture(scope="module")
def nm_page(shipped_report):
    path, seconds = shipped_report("noisy-majority")
    text = path.read_text(encoding="utf-8")
    return text, parse(text), seconds


@pytest.mark.slow
def test_report_sections(shipped_page):
    name, text, page, _ = shipped_page
    assert page.h2[0] == "Model card" and page.h2[-1] == "Attention patterns" and page.h2[-2] == "Circuit"
    try:
        from interp.analyses import suite_for

        suite_for(SHIPPED[name])
    except TaskError as e:
        assert page.h2[1:-1] == ["Analyses"] and str(e) in html.unescape(text)
    else:  # the suite's own sections sit between the model card and the attention views
        assert len(page.h2) >= 3 and "Analyses" not in page.h2
    assert len({a["href"] for t, a in page.tags if t == "a" and a.get("href", "").startswith("#")}) == len(page.h2)
    assert table_with_caption(page, "Task")[0]["task"] == SHIPPED[name]


@pytest.mark.slow
def test_model_card_accuracy_matches_a_plain_forward(nm_page, nm_ckpt):
    """Recompute the test accuracy with TransformerLens' full forward and the argmax at the "=" position
    (the report evaluates with the exact query-restricted forward of interp.query_forward)."""
    _, page, _ = nm_page
    model, task = nm_ckpt.model, nm_ckpt.task
    data = task.dataset("test")
    order = torch.argsort(data.answer_pos)  # batches of similar length, cut after "=" (causal: exact)
    correct = 0
    with torch.inference_mode():
        for idx in order.split(50):
            logits = model(data.tokens[idx, : int(data.answer_pos[idx].max()) + 1])
            answer = logits[torch.arange(len(idx)), data.answer_pos[idx]].argmax(-1)
            correct += int((answer == data.labels[idx]).sum())
    rows = {r["split"]: r for r in table_with_caption(page, "Metrics per split")}
    assert list(rows) == ["train", "val", "test"]
    assert rows["test"]["accuracy"] == format(correct / len(data), ".4f")
    recorded = nm_ckpt.training["metrics"]["val"]["accuracy"]
    assert rows["val"]["accuracy at training time"] == format(recorded, ".4f")

    spec = {r["field"]: r["value"] for r in table_with_caption(page, "Model spec")}
    assert spec["n_heads"] == "16" and spec["n_layers"] == "1" and spec["positional"] == "none"
    task_row = table_with_caption(page, "Task")[0]
    assert task_row["task"] == "noisy-majority" and task_row["test_lengths"] == "[151, 200]"
    prov = {r["field"]: r["value"] for r in table_with_caption(page, "Training provenance")}
    assert prov["seed"] == str(nm_ckpt.training["seed"])


@pytest.mark.slow
def test_attention_views_show_every_head_and_the_models_patterns(shipped_page):
    """Each view's tokens, encoded again and run through the model, give the patterns in the page."""
    from interp.tasks import load_checkpoint

    name, text, _, _ = shipped_page
    section = text[text.index("<h2>Attention patterns</h2>") :]
    views = [json.loads(props.replace("<\\/", "</")) for _, element, props in RENDER_RE.findall(section)]
    assert len(views) == 3
    ckpt = load_checkpoint(name, device="cpu")
    model, task = ckpt.model, ckpt.task
    cfg = model.cfg
    for props in views:
        assert props["attentionHeadNames"] == [f"L{l}H{h}" for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
        tokens = task.vocab.encode(props["tokens"])[None]
        assert tokens[0, 0] == task.vocab.bos
        with torch.inference_mode():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
        expected = torch.cat([cache["pattern", l][0] for l in range(cfg.n_layers)])
        torch.testing.assert_close(torch.tensor(props["attention"]), expected, atol=6e-6, rtol=0)  # 5 decimals


@pytest.mark.slow
def test_report_is_offline_by_inspection(shipped_page):
    """No tag refers to anything outside the file; a CSP forbids fetching; each library is inlined once."""
    _, text, page, _ = shipped_page
    from plotly.offline import get_plotlyjs

    from interp.visualize import circuitsvis_bundle

    for tag, attrs in page.tags:
        for key in ("src", "href", "data", "srcset", "poster", "action"):
            value = attrs.get(key)
            if value is not None:
                assert value.startswith("#"), f"<{tag} {key}={value!r}> points outside the page"
        assert tag not in ("link", "iframe", "object", "embed", "img"), f"unexpected <{tag}> element"
    csp = [a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert len(csp) == 1 and "default-src 'none'" in csp[0] and "connect-src 'none'" in csp[0]
    assert "@import" not in text.split("<script", 1)[0]
    assert text.count(get_plotlyjs()[:3000]) == 1
    assert text.count(circuitsvis_bundle()[:3000]) == 1
    # the libraries mention URLs inside their code (never loaded here); nothing else on the page does
    assert "unpkg.com" not in text.replace(circuitsvis_bundle(), "") and "cdn.plot.ly" not in text.replace(
        get_plotlyjs(), ""
    )
    assert all(s.strip() for s in page.scripts)  # every script is inline (none has a src)


# -- bad input through the CLI ----------------------------------------------------------------------
def _report(argv, capsys):
    from interp.app.cli import main

    rc = main(["report", *argv, "--quiet"])
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """A real (untrained) noisy-majority checkpoint with a small model, written with save_checkpoint."""
    from interp.checkpoint import save_checkpoint
    from interp.model import ModelSpec, build_model
    from interp.tasks import get_task

    task = get_task("noisy-majority")
    spec = ModelSpec(**{**task.default_spec(), "n_heads": 2, "d_model": 4})
    path = tmp_path_factory.mktemp("ckpt") / "small.safetensors"
    return save_checkpoint(build_model(spec, device="cpu"), task, path, training={"seed": 0}, spec=spec)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "no checkpoint file"),
        ("garbage", "not a valid .safetensors file"),
        ("pickle", "looks like a pickle"),
        ("truncated", "not a valid .safetensors file"),
    ],
)
def test_bad_checkpoint_is_one_line_and_leaves_no_file(case, expected, tmp_path, small_checkpoint, capsys):
    ckpt = tmp_path / f"{case}.safetensors"
    if case == "garbage":
        ckpt.write_bytes(b"this is not a checkpoint at all" * 4)
    elif case == "pickle":
        ckpt.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    elif case == "truncated":
        data = small_checkpoint.read_bytes()
        ckpt.write_bytes(data[: len(data) - 64])
    before = set(tmp_path.iterdir())
    rc, err = _report([str(ckpt), "--out", str(tmp_path / "report.html")], capsys)
    assert rc == 1
    assert err.startswith("interp: error: ") and "\n" not in err and expected in err, err
    assert set(tmp_path.iterdir()) == before  # no report, no temp file


@pytest.mark.parametrize(
    "case, expected",
    [
        ("no-such-dir", "does not exist"),
        ("is-a-dir", "is a directory"),
        ("parent-is-a-file", "is not a directory"),
        ("unwritable", "Permission denied"),
    ],
)
def test_bad_output_path_is_one_line_and_leaves_no_file(case, expected, tmp_path, small_checkpoint, capsys):
    out = {
        "no-such-dir": tmp_path / "missing" / "r.html",
        "is-a-dir": tmp_path,
        "parent-is-a-file": tmp_path / "file.txt" / "r.html",
        "unwritable": Path("/sys/interp-report.html"),
    }[case]
    (tmp_path / "file.txt").write_text("x")
    if case == "unwritable" and not Path("/sys").is_dir():
        pytest.skip("no /sys directory (not Linux): no unwritable directory to test with, even as root")
    before = set(tmp_path.iterdir())
    rc, err = _report([str(small_checkpoint), "--out", str(out)], capsys)
    assert rc == 1
    assert err.startswith("interp: error: cannot write the report to ") and "\n" not in err and expected in err, err
    assert set(tmp_path.iterdir()) == before and not Path("/sys/interp-report.html").exists()


def test_failure_while_building_leaves_no_partial_file(tmp_path, small_checkpoint):
    """An error after the output was opened (here: the task cannot make its data) removes the temp file."""
    from dataclasses import replace

    from interp.app.report import write_report
    from interp.tasks import load_checkpoint
    from interp.tasks.noisy_majority import NoisyMajority

    class NoData(NoisyMajority):
        def dataset(self, split, seed=None):
            raise TaskError(f"no data for split {split!r}")

    ckpt = load_checkpoint(small_checkpoint, device="cpu")
    broken = replace(ckpt, task=NoData())
    with pytest.raises(TaskError, match="no data for split"):
        write_report(broken, tmp_path / "report.html", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_model_card_and_views_of_an_untrained_checkpoint(small_checkpoint):
    """Any checkpoint of a task gets a model card (even with little provenance) and views of all its heads."""
    from interp.app.report import add_attention_views, add_model_card
    from interp.report_page import Report
    from interp.tasks import load_checkpoint

    ckpt = load_checkpoint(small_checkpoint, device="cpu")
    r = Report()
    add_model_card(ckpt, r)
    add_attention_views(ckpt, r, n_examples=2)
    text = r.html()
    page = parse(text)
    assert page.h2 == ["Model card", "Attention patterns"]
    prov = {row["field"]: row["value"] for row in table_with_caption(page, "Training provenance")}
    assert prov == {"seed": "0"}
    views = [json.loads(p.replace("<\\/", "</")) for _, _, p in RENDER_RE.findall(text)]
    assert len(views) == 2 and all(v["attentionHeadNames"] == ["L0H0", "L0H1"] for v in views)
    assert all(torch.tensor(v["attention"]).shape[0] == 2 for v in views)


@pytest.mark.slow
def test_cli_subprocess_reports_a_missing_checkpoint_in_one_line(tmp_path):
    """The real command (one subprocess): exit status 1, one line on stderr, nothing written."""
    out = tmp_path / "r.html"
    proc = subprocess.run(
        [sys.executable, "-m", "interp.app", "report", str(tmp_path / "nope.safetensors"), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("interp: error: no checkpoint file") and proc.stderr.strip().count("\n") == 0
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []
