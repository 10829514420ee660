"""The explorer: one Jupyter widget to pick an input, see every head's attention, switch heads off and patch, with
every number recomputed live by the toolkit in the kernel.

``w = interp.explore("noisy-majority")`` (a shipped name, a checkpoint path or a :class:`interp.Checkpoint`) or
``w = interp.explore(model, task)`` (any ``HookedTransformer`` paired with its task) returns an ``anywidget`` widget.
Its JavaScript (``explorer.js`` beside this file, shipped in the package; nothing is fetched from a CDN) only draws
and sends events; the kernel computes:

- the prediction at the task's answer positions (every position with a target), under the current head mask: one
  forward pass with ``hook_z`` hooks that zero the heads switched off or replace their output by its mean over the
  accuracy batch (seed 000 Definition 5.1's ablation, as :func:`analyses.learned_accuracy` does);
- every head's attention pattern on that input (the same forward pass);
- the learned accuracy under the mask on the first ``batch_size`` examples of the current split, by
  :func:`analyses.learned_accuracy` (its batched path; one-layer attention-only models recombine cached head
  outputs, so a new mask's accuracy costs well under a millisecond there, and deeper models one forward pass of the
  batch);
- for the head whose panel is open: its QK and OV circuits (:func:`analyses.full_qk_circuit`,
  :func:`analyses.full_ov_circuit`, and :func:`analyses.positional_qk_circuit` where positions are learned), its
  learned accuracy alone, its induction / previous-token scores (:func:`analyses.head_scores`, Olsson et al.,
  "In-context Learning and Induction Heads"), its separation accuracy (:func:`analyses.separation_accuracy`) and
  Shapley value (:func:`analyses.exact_shapley`) when asked for, and its direct logit contribution;
- activation patching of every head's output between the input and a corrupted one
  (:func:`analyses.activation_patching`), and path patching from a chosen sender head
  (:func:`analyses.path_patching`; Wang et al., "Interpretability in the Wild").

The state is readable and settable from Python (``w.example = ("test", 3)``, ``w.tokens = "0 1 1"``,
``w.mask = ["L0H1"]``, ``w.ablation = "mean"``, ``w.batch_size = 512``, ``w.head = "L0H3"``,
``w.corruption = "flip"``), and so are the numbers shown (``w.prediction``, ``w.accuracy``, ``w.patterns``,
``w.patching``, ``w.head_panel``). ``w.snippet()`` is the Python that reproduces the view, ``w.state()`` the view
as a :class:`interp.Result`. A notebook saved with the widget's output shows a static snapshot (HTML with the
patterns as images) where no kernel runs: nbconvert, GitHub's viewer.
"""

from __future__ import annotations

import base64
import html as _html
import importlib
import json
import math
import random
import struct
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anywidget
import torch
import traitlets
from jaxtyping import Float, Int
from torch import Tensor

import interp

_HERE = Path(__file__).parent

DEFAULT_BATCH = 256  # examples of the accuracy batch (the first ones of the current split)
MAX_POSITIONS = 256  # attention patterns drawn: at most this many positions (the last ones) per head
CELL_BUDGET = 1 << 21  # attention entries sent to the page at most (all heads): 4 MiB as uint16
TOP_K = 3  # tokens shown per answer position
MAX_ROWS = 64  # answer positions listed at most
CIRCUIT_MAX = 128  # circuit rows/columns drawn at most
SEPARATION_TRAIN = 2000  # train examples the separators are fitted on
SCORE_SEQS = 32  # repeated-random-token sequences of the induction / previous-token scores
SHAPLEY_EXACT_MAX = 16  # heads: exact Shapley values (2**16 coalitions); more heads are sampled
SHAPLEY_SAMPLES = 200  # permutations of sampled Shapley values
ABLATIONS = ("zero", "mean")
PAIR_KINDS = {"repeated-tokens": ("key", "query", "answer")}  # corruptions whose helper draws its own clean input
OWN_KINDS = {"noisy-majority": ("flip",)}  # corruptions of the current input by the task's own helper


def _errors():
    """The toolkit's error classes (``TokenError``, ``HeadError``, ...): every message is one line."""
    from interp import errors

    return errors


def _one_line(e: BaseException) -> str:
    """The first line of an error's message, at most 300 characters: what the widget's error line shows."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# -- typed input ---------------------------------------------------------------------------------------------------


def _pieces(vocab, text) -> list[str]:
    """Token strings from typed text (whitespace-separated; a run of one-character tokens may be typed without
    spaces, ``0112``), or from a list of token strings; a TokenError names the first unknown token."""
    errors = _errors()
    if isinstance(text, (list, tuple)):
        raw = [str(t) for t in text]
    elif isinstance(text, str):
        raw = text.split()
    else:
        raise errors.TokenError(f"tokens must be a string or a list of token strings, got {type(text).__name__}")
    idx = vocab.index
    out: list[str] = []
    for piece in raw:
        if piece in idx:
            out.append(piece)
        elif piece and all(ch in idx for ch in piece):
            out.extend(piece)
        else:
            shown = ", ".join(repr(t) for t in vocab.tokens[:14]) + (
                f", ... ({len(vocab)} tokens)" if len(vocab) > 14 else ""
            )
            raise errors.TokenError(f"unknown token {piece!r}; the vocabulary is {shown}")
    if not out:
        raise errors.TokenError("no tokens were typed")
    return out


def _task_module(task):
    """The module that defines ``task``'s class (its data builders live there)."""
    return importlib.import_module(type(task).__module__)


def _typed_noisy_majority(task, toks: list[str]):
    errors = _errors()
    if toks[0] == "[BOS]":
        toks = toks[1:]
    if "=" in toks:
        toks = toks[: toks.index("=")]
    bad = [t for t in toks if t not in ("0", "1", "2")]
    if bad:
        raise errors.TokenError(
            f"noisy-majority input is digits 0, 1, 2 (then '=' and the answer, optional); got {bad[0]!r}"
        )
    return _task_module(task).make_sentences([[int(t) for t in toks]])


def _typed_repeated_tokens(task, toks: list[str]):
    import interp

    errors = _errors()
    ids = [task.vocab.index[t] for t in toks]
    if ids[0] != task.bos:
        ids = [task.bos] + ids
    if task.bos in ids[1:]:
        raise errors.TokenError("[BOS] may only start the sequence")
    if len(ids) < 3:
        raise errors.TokenError("type at least two symbols (after the optional [BOS])")
    body = ids[1:]
    period = next(n for n in range(1, len(body) + 1) if all(body[i] == body[i - n] for i in range(n, len(body))))
    tokens = torch.tensor([ids])
    targets = torch.cat([tokens[:, 1:], torch.full((1, 1), interp.IGNORE)], 1)
    t = len(ids)
    return interp.TaskData(
        task=task.name,
        tokens=tokens,
        targets=targets,
        answer_pos=torch.tensor([t - 2]),
        labels=torch.tensor([ids[-1]]),
        lengths=torch.tensor([t]),
        fields={"repeat_len": torch.tensor([period])},
        vocab=task.vocab,
    )


def _typed_modular_addition(task, toks: list[str]):
    errors = _errors()
    if toks[-1] == "=":
        toks = toks[:-1]
    if len(toks) != 2 or "=" in toks:
        raise errors.TokenError(
            f"modular-addition input is two numbers 'a b' (0..{task.p - 1}), optionally followed by '='"
        )
    a, b = (int(t) for t in toks)
    return _task_module(task).make_pairs([a], [b], task.p)


def _typed_integer_addition(task, toks: list[str]):
    errors = _errors()
    if toks[0] == "[BOS]":
        toks = toks[1:]
    if "=" in toks:
        toks = toks[: toks.index("=")]
    if toks.count("+") != 1:
        raise errors.TokenError(
            "integer-addition input is 'a + b' in digits (e.g. 12345 + 678), optionally with '=' and the answer"
        )
    cut = toks.index("+")
    ops = [toks[:cut], toks[cut + 1 :]]
    if not all(ops) or any(t not in "0123456789" for op in ops for t in op):
        raise errors.TokenError("integer-addition operands are digits 0..9 on both sides of '+'")
    n = max(len(ops[0]), len(ops[1]))
    units = [[int(t) for t in (op if task.reverse_operands else op[::-1])] for op in ops]  # units first
    a, b = ([u[i] if i < len(u) else 0 for i in range(n)] for u in units)
    return _task_module(task).make_sums(
        torch.tensor([a]),
        torch.tensor([b]),
        torch.tensor([n]),
        reverse_answer=task.reverse_answer,
        reverse_operands=task.reverse_operands,
    )


_TYPED = {
    "noisy-majority": _typed_noisy_majority,
    "repeated-tokens": _typed_repeated_tokens,
    "modular-addition": _typed_modular_addition,
    "integer-addition": _typed_integer_addition,
}


def typed_example(task, text, n_ctx: int | None = None):
    """One example of ``task``'s data from typed tokens (a string such as ``"0 1 1 2"`` or ``"[BOS] 0 1 = 4"``, or a
    list of token strings), its answer and targets as the task defines them: noisy majority takes the digits (the
    answer is computed), repeated tokens the sequence itself, modular addition ``a b``, integer addition ``a + b``.
    Raises a TokenError (one line) for a token outside the vocabulary, input of the wrong shape, or more than
    ``n_ctx`` tokens."""
    errors = _errors()
    build = _TYPED.get(task.name)
    if build is None:
        raise errors.TaskError(
            f"typed input is not available for task {task.name!r} (the explorer builds typed examples "
            f"of {', '.join(sorted(_TYPED))}); pick an example of a split instead"
        )
    data = build(task, _pieces(task.vocab, text))
    if n_ctx is not None and data.tokens.shape[1] > n_ctx:
        raise errors.TokenError(f"the input has {data.tokens.shape[1]} tokens; the model's context is n_ctx={n_ctx}")
    return data


# -- corruptions ---------------------------------------------------------------------------------------------------


def corruption_kinds(task) -> tuple[str, ...]:
    """The corrupted inputs the explorer offers for ``task``: the task's own helpers (noisy majority's ``flip``: the
    fewest 0/1 swaps that flip the answer; repeated tokens' ``key``/``query``/``answer`` pairs), ``resample`` (the
    next example of the split with the same length and a different answer) and ``typed``."""
    return (
        OWN_KINDS.get(task.name, ())
        + PAIR_KINDS.get(task.name, ())
        + ("resample",)
        + (("typed",) if task.name in _TYPED else ())
    )


def resample(data, clean, start: int = 0):
    """Index of the first example of ``data`` (from ``start``, wrapping) with ``clean``'s length and answer position
    and another answer: a corrupted input drawn from the task's own distribution."""
    n = len(data)
    order = (torch.arange(n) + start) % n
    same = (
        (data.lengths.cpu() == int(clean.lengths[0]))
        & (data.answer_pos.cpu() == int(clean.answer_pos[0]))
        & (data.labels.cpu() != int(clean.labels[0]))
    )
    hits = order[same[order]]
    if len(hits) == 0:
        raise _errors().TaskError(
            "no example of the split has this input's length and answer position with another "
            "answer; type a corrupted input instead"
        )
    return int(hits[0])


# -- the computations ----------------------------------------------------------------------------------------------


def keep_mask(model, off) -> Float[Tensor, "layer head"]:
    """``[layer, head]`` with 0 for the heads in ``off`` (names like ``'L0H3'`` or pairs) and 1 elsewhere."""
    import interp

    cfg = model.cfg
    keep = torch.ones(cfg.n_layers, cfg.n_heads, device=next(model.parameters()).device)
    for spec in off:
        layer, head = interp.parse_head(spec, cfg.n_layers, cfg.n_heads)
        keep[layer, head] = 0.0
    return keep


def mask_hooks(model, keep: Float[Tensor, "layer head"], z_ref: Float[Tensor, "layer head d_head"] | None = None):
    """``hook_z`` hooks that ablate the heads where ``keep`` is 0: their output ``z`` becomes 0 (``z_ref`` None) or
    ``z_ref`` (mean ablation), exactly as :func:`analyses.learned_accuracy`'s hook path does."""

    def hook(z, hook):
        m = keep[hook.layer()][None, None, :, None].to(z.dtype)
        if z_ref is None:
            return z * m
        return z * m + z_ref[hook.layer()][None, None].to(z.dtype) * (1 - m)

    return [(f"blocks.{layer}.attn.hook_z", hook) for layer in range(model.cfg.n_layers)]


def masked_forward(
    model,
    tokens: Int[Tensor, "batch pos"],
    keep: Float[Tensor, "layer head"],
    z_ref: Float[Tensor, "layer head d_head"] | None = None,
) -> dict[str, Tensor]:
    """One forward pass with the heads where ``keep`` is 0 ablated: ``logits [batch, pos, vocab_out]``, every head's
    attention ``patterns [batch, layer, head, query, key]``, the head outputs after the ablation ``z [batch, layer,
    pos, head, d_head]`` and the final LayerNorm's ``scale [batch, pos, 1]`` (None without one)."""
    store: dict[str, Any] = {"pattern": {}, "z": {}}

    def keep_pattern(p, hook):
        store["pattern"][hook.layer()] = p

    def keep_z(z, hook):
        store["z"][hook.layer()] = z

    def keep_scale(s, hook):
        store["scale"] = s

    hooks = mask_hooks(model, keep, z_ref)
    hooks += [(f"blocks.{layer}.attn.hook_z", keep_z) for layer in range(model.cfg.n_layers)]
    hooks += [(f"blocks.{layer}.attn.hook_pattern", keep_pattern) for layer in range(model.cfg.n_layers)]
    if model.cfg.normalization_type is not None:
        hooks.append(("ln_final.hook_scale", keep_scale))
    with torch.inference_mode():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    L = model.cfg.n_layers
    return {
        "logits": logits,
        "patterns": torch.stack([store["pattern"][layer] for layer in range(L)], 1),
        "z": torch.stack([store["z"][layer] for layer in range(L)], 1),
        "scale": store.get("scale"),
    }


def direct_logit_attribution(
    model,
    z: Float[Tensor, "layer pos head d_head"],
    scale: Float[Tensor, "pos 1"] | None,
    pos: int,
    good: int,
    bad: int,
) -> tuple[Tensor, Tensor]:
    """Each head's direct contribution at ``pos`` to the logit of ``good`` and to ``logit[good] - logit[bad]``
    (``[layer, head]`` each): its output ``z W_O`` through the final LayerNorm with the run's own scale held fixed
    (centred, divided by the scale, times its weight) and ``W_U``. Without a final LayerNorm this is exactly the
    head's term of :func:`analyses.logit_decomposition`; with one it is the usual frozen-scale linearisation."""
    with torch.inference_mode():
        c = torch.einsum("lhe,lhed->lhd", z[:, pos], model.W_O)
        norm = model.cfg.normalization_type
        if norm in ("LN", "LNPre"):
            c = c - c.mean(-1, keepdim=True)
        if scale is not None:
            c = c / scale[pos]
        if norm in ("LN", "RMS"):
            c = c * model.ln_final.w
        w_u = model.W_U
        return c @ w_u[:, good], c @ (w_u[:, good] - w_u[:, bad])


# -- results --------------------------------------------------------------------------------------------------------


@dataclass
class Prediction(interp.Result):
    """The model's output at the input's answer positions under the current mask: per position its target, the top
    tokens and their probabilities, and whether the argmax is the target. ``answer`` is the row of the task's answer
    position (``TaskData.answer_pos``)."""

    positions: list[int]
    targets: list[int | None]
    top_ids: Int[Tensor, "row k"]
    top_probs: Float[Tensor, "row k"]
    logits: Float[Tensor, "row vocab_out"]
    answer_pos: int
    token_names: list[str] = field(repr=False, default_factory=list)

    @property
    def correct(self) -> list[bool | None]:
        return [None if t is None else int(self.top_ids[i, 0]) == t for i, t in enumerate(self.targets)]

    @property
    def answer(self) -> dict:
        return self.rows()[self.positions.index(self.answer_pos)]

    def rows(self) -> list[dict]:
        out = []
        for i, p in enumerate(self.positions):
            t = self.targets[i]
            out.append(
                {
                    "pos": p,
                    "answer": p == self.answer_pos,
                    "target": None if t is None else self.token_names[t],
                    "top": [[self.token_names[int(k)], float(v)] for k, v in zip(self.top_ids[i], self.top_probs[i])],
                    "correct": self.correct[i],
                }
            )
        return out

    def to_dict(self) -> dict:
        return {"answer_pos": self.answer_pos, "rows": self.rows()}

    def table_html(self) -> str:
        return _prediction_table(self.rows())

    def __repr__(self) -> str:
        a = self.answer
        top = ", ".join(f"{t} {p:.3f}" for t, p in a["top"])
        return f"Prediction(answer at {a['pos']}: target {a['target']}, top {top}, correct {a['correct']})"


class ExplorerState(interp.Result):
    """The explorer's view as a result: ``to_dict()`` holds the input, the mask, the prediction, the accuracy, the
    open head panel and the patching, all as plain JSON types; ``table_html()`` a summary."""

    def __init__(self, data: dict):
        self.data = data

    def to_dict(self) -> dict:
        return self.data

    def table_html(self) -> str:
        d = self.data
        rows = "".join(
            f"<tr><th style='text-align:left'>{_html.escape(k)}</th><td>{_html.escape(str(v))}</td></tr>"
            for k, v in (
                ("model", d["model"]),
                ("input", " ".join(d["input"]["tokens"])),
                ("heads off", ", ".join(d["mask"]) or "none"),
                ("ablation", d["ablation"]),
                (
                    "accuracy",
                    (
                        f"{d['accuracy']['accuracy']:.4f} ({d['accuracy']['correct']}/"
                        f"{d['accuracy']['n']} {d['accuracy']['split']})"
                    ),
                ),
            )
        )
        return f"<table>{rows}</table>" + _prediction_table(d["prediction"]["rows"])


# -- static HTML (no kernel) ------------------------------------------------------------------------------------------


def _png(rgb) -> bytes:
    """A PNG file of an ``[height, width, 3]`` uint8 array (zlib from the standard library; no imaging package)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def _pattern_images(p: Float[Tensor, "n query key"], size: int = 96) -> list[bytes]:
    """Attention patterns as PNG images (white to dark blue on the square root of the weight, as the live view draws
    them; keys after the query light grey), max-pooled to at most ``size`` pixels a side so that peaks stay visible."""
    import torch.nn.functional as F

    t = p.shape[-1]
    x = p.float().clamp(0, 1).sqrt().masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -1.0)
    if t > size:
        x = F.adaptive_max_pool2d(x[:, None], size)[:, 0]
    lo, hi = torch.tensor([255.0, 255.0, 255.0]), torch.tensor([8.0, 48.0, 107.0])
    rgb = lo + (hi - lo) * x.clamp(min=0)[..., None]
    rgb = torch.where((x < 0)[..., None], torch.tensor([240.0, 240.0, 240.0]), rgb)
    arr = rgb.round().to(torch.uint8).numpy()
    return [_png(a) for a in arr]


def _prediction_table(rows: list[dict]) -> str:
    head = "<tr><th>pos</th><th>target</th><th>top tokens (probability)</th><th>correct</th></tr>"
    body = []
    for r in rows[:MAX_ROWS]:
        top = ", ".join(f"{_html.escape(t)} {p:.3f}" for t, p in r["top"])
        ok = "" if r["correct"] is None else ("yes" if r["correct"] else "no")
        style = " style='font-weight:bold'" if r["answer"] else ""
        body.append(
            f"<tr{style}><td>{r['pos']}</td><td>{_html.escape(str(r['target']))}</td><td>{top}</td><td>{ok}</td></tr>"
        )
    more = f"<tr><td colspan='4'>... {len(rows) - MAX_ROWS} more</td></tr>" if len(rows) > MAX_ROWS else ""
    return f"<table class='interp-explorer-prediction'>{head}{''.join(body)}{more}</table>"


# -- the widget -----------------------------------------------------------------------------------------------------


class Explorer(anywidget.AnyWidget):
    """The interactive explorer (see the module docstring). Build it with :func:`explore`."""

    _esm = _HERE / "explorer.js"
    _css = _HERE / "explorer.css"

    info = traitlets.Dict().tag(sync=True)
    controls = traitlets.Dict().tag(sync=True)
    input_view = traitlets.Dict().tag(sync=True)
    prediction_view = traitlets.Dict().tag(sync=True)
    accuracy_view = traitlets.Dict().tag(sync=True)
    patterns_view = traitlets.Dict().tag(sync=True)
    head_view = traitlets.Dict().tag(sync=True)
    patch_view = traitlets.Dict().tag(sync=True)
    export_view = traitlets.Dict().tag(sync=True)
    status = traitlets.Dict().tag(sync=True)

    def __init__(
        self,
        model,
        task,
        *,
        name: str | None = None,
        checkpoint: str | None = None,
        split: str | None = None,
        index: int = 0,
        batch_size: int = DEFAULT_BATCH,
        ablation: str = "zero",
        max_positions: int = MAX_POSITIONS,
        seed: int = 0,
    ):
        super().__init__()
        self.model, self.task = model, task  # that they fit each other is checked by the first analysis (cache_answer)
        self._checkpoint = checkpoint  # how to load it again (a shipped name or a path), for the snippet
        self._name = name or checkpoint or f"a {task.name} model"
        cfg = model.cfg
        self._L, self._H = cfg.n_layers, cfg.n_heads
        self._device = next(model.parameters()).device
        if not isinstance(max_positions, int) or max_positions < 2:
            raise _errors().InterpError(f"max_positions must be an integer >= 2, got {max_positions!r}")
        self._max_positions = max_positions
        self._rng = random.Random(seed)
        self._datasets: dict[str, Any] = {}  # split -> its TaskData, generated on first use
        self._batches: dict[tuple, dict] = {}  # (split, size) -> the accuracy batch and what is cached about it
        self._circuits: dict[tuple[int, int], list] = {}
        self._scores = None  # analyses.HeadScores of every head, computed once
        self._scores_note: str | None = None
        self._off: set[tuple[int, int]] = set()
        self._head: tuple[int, int] | None = None
        self._corruption: str | None = None
        self._corrupt_text = ""
        self._corrupted = None
        self._sender: tuple[int, int] | None = None
        self._patch = self._path = None
        self._patch_error = ""
        self._resampled: int | None = None
        self._metrics: dict[str, float] | None = None
        self._fwd: dict[str, Any] = {}
        self._acc = None
        self._sent_patterns = None
        self._seq = 0
        self.timings: dict[str, float] = {}
        self.last_traceback: str | None = None
        self._split = split if split is not None else ("test" if "test" in task.splits else task.splits[-1])
        self._check_split(self._split)
        self._index, self._source, self._typed = 0, "example", ""
        self._ablation = self._check_ablation(ablation)
        self._batch_size = self._check_batch_size(batch_size)
        self.info = self._info()
        self.on_msg(self._on_msg)
        self._index = self._check_index(self._split, index)
        self._clean = self._example(self._split, self._index)
        self._refresh(input=True, batch=True)

    # -- public state ------------------------------------------------------------------------------------------

    @property
    def example(self) -> tuple[str, int] | None:
        """``(split, index)`` of the input shown, or None when it was typed (or drawn by a corruption helper)."""
        return (self._split, self._index) if self._source == "example" else None

    @example.setter
    def example(self, value):
        errors = _errors()
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise errors.InterpError(f"example must be (split, index), e.g. ('test', 3); got {value!r}")
        split, index = value
        self._check_split(split)
        index = self._check_index(split, index)
        batch = split != self._split
        self._split, self._index, self._source = split, index, "example"
        if self._corruption in PAIR_KINDS.get(self.task.name, ()):
            self._source = "pair"
            self._clean, self._corrupted = self._pair(self._corruption)
        else:
            self._clean = self._example(split, index)
        self._refresh(input=True, batch=batch)

    @property
    def tokens(self) -> list[str]:
        """The input's tokens (strings). Set it to typed tokens: ``w.tokens = "0 1 1 2"`` or a list of strings."""
        return self.task.vocab.decode(self._clean.tokens[0])

    @tokens.setter
    def tokens(self, value):
        data = typed_example(self.task, value, self.model.cfg.n_ctx)
        self._typed = value if isinstance(value, str) else " ".join(str(v) for v in value)
        self._clean, self._source = data.to(self._device), "typed"
        if self._corruption in PAIR_KINDS.get(self.task.name, ()):
            self._corruption = self._corrupted = None
        self._refresh(input=True)

    @property
    def mask(self) -> list[str]:
        """The heads switched off (names, in order). Set a list of heads (``['L0H1', 'L0H7']``, pairs also work)."""
        return [self._label(h) for h in sorted(self._off)]

    @mask.setter
    def mask(self, value):
        self._off = self._parse_heads(value)
        self._refresh(mask=True)

    @property
    def ablation(self) -> str:
        """``"zero"`` or ``"mean"``: what a head switched off outputs (0, or its mean output at the answer positions
        of the accuracy batch)."""
        return self._ablation

    @ablation.setter
    def ablation(self, value):
        self._ablation = self._check_ablation(value)
        self._refresh(mask=True)

    @property
    def batch_size(self) -> int:
        """How many examples (the first of the current split) the accuracy is measured on."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value):
        self._batch_size = self._check_batch_size(value)
        self._refresh(batch=True)

    @property
    def head(self) -> str | None:
        """The head whose panel is open (``'L0H3'``), or None."""
        return None if self._head is None else self._label(self._head)

    @head.setter
    def head(self, value):
        self._head = None if value is None else self._parse_head(value)
        self._refresh(head=True)

    @property
    def corruption(self) -> str | None:
        """The corrupted input of the patching: one of :func:`corruption_kinds` (``"typed"`` via
        :attr:`corrupted_tokens`), or None for no patching."""
        return self._corruption

    @corruption.setter
    def corruption(self, value):
        self._set_corruption(value, self._corrupt_text)

    @property
    def corrupted_tokens(self) -> list[str] | None:
        """The corrupted input's tokens; set typed tokens to patch against them (``corruption`` becomes ``"typed"``)."""
        return None if self._corrupted is None else self.task.vocab.decode(self._corrupted.tokens[0])

    @corrupted_tokens.setter
    def corrupted_tokens(self, value):
        self._set_corruption("typed", value if isinstance(value, str) else " ".join(str(v) for v in value))

    @property
    def sender(self) -> str | None:
        """The sender head of the path patching (``'L0H1'``), or None."""
        return None if self._sender is None else self._label(self._sender)

    @sender.setter
    def sender(self, value):
        self._sender = None if value is None else self._parse_sender(value)
        self._refresh(patch=True)

    # -- public numbers ----------------------------------------------------------------------------------------

    @property
    def prediction(self) -> Prediction:
        """Top tokens and probabilities at the answer positions under the current mask."""
        return self._fwd["prediction"]

    @property
    def accuracy(self) -> float:
        """Learned accuracy under the mask (heads off ablated) on the first ``batch_size`` examples of the current
        split: ``analyses.learned_accuracy(model, batch, [kept heads], ablation=...)``."""
        return float(self._acc.accuracy[0])

    @property
    def full_accuracy(self) -> float:
        """The same with every head on."""
        return self._batch()["full"][self._ablation]

    @property
    def learned_accuracy(self):
        """The :class:`analyses.LearnedAccuracy` behind :attr:`accuracy` (subsets: the kept heads, and the mask with
        the open head toggled when a panel is open)."""
        return self._acc

    @property
    def patterns(self) -> Float[Tensor, "layer head query key"]:
        """Every head's attention pattern on the input under the current mask (all positions, exact)."""
        return self._fwd["patterns"]

    @property
    def logits(self) -> Float[Tensor, "pos vocab_out"]:
        """The logits at every position of the input under the current mask."""
        return self._fwd["logits"]

    @property
    def patching(self):
        """The :class:`analyses.ActivationPatching` of every head's output (clean into corrupted, logit difference),
        or None without a corruption."""
        return self._patch

    @property
    def path_patching(self):
        """The :class:`analyses.PathPatching` from :attr:`sender`, or None."""
        return self._path

    @property
    def head_panel(self) -> dict:
        """The open head's numbers (as the panel shows them), or ``{}``."""
        return {k: v for k, v in self.head_view.items() if k not in ("circuits",)}

    @property
    def metrics(self) -> dict[str, float]:
        """The task's own metrics (``task.metrics``: e.g. exact match of integer addition, accuracy on every repeat
        position of repeated tokens) under the mask, on the accuracy batch; one hooked forward pass."""
        b = self._batch()
        out = _predictions_and_loss(
            self.model, b["batch"], fwd_hooks=mask_hooks(self.model, self._keep(), self._z_ref())
        )
        return self.task.metrics(out["preds"], out["loss"], b["batch"].to(out["preds"].device))

    def compute(self, what: str) -> None:
        """Compute, for every head, what the panel shows only on request: ``"separation"`` (separation accuracy, the
        separators fitted on the first train examples and scored on the accuracy batch), ``"shapley"`` (Shapley values
        of the learned accuracy on the batch: exact up to 16 heads, else sampled) or ``"metrics"`` (the task's own
        metrics under the mask)."""
        self._compute(what)

    def state(self) -> ExplorerState:
        """The current view as an :class:`interp.Result` (``to_dict()``: plain JSON)."""
        return ExplorerState(self._state_dict())

    def snippet(self) -> str:
        """Python that reproduces the numbers of the current view with the toolkit's own calls."""
        return self._snippet()

    def snapshot_html(self) -> str:
        """A static HTML picture of the current view (what a saved notebook shows where no kernel runs)."""
        return self._snapshot_html()

    def snapshot(self):
        """The static snapshot as an IPython HTML object: display it to keep a record of this state in the notebook."""
        from IPython.display import HTML

        return HTML(self._snapshot_html())

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        try:
            data["text/html"] = self._snapshot_html()
        except Exception:
            self.last_traceback = traceback.format_exc()
        return data, metadata

    # -- validation ----------------------------------------------------------------------------------------------

    def _label(self, h: tuple[int, int]) -> str:
        import interp

        return interp.head_label(*h)

    def _parse_head(self, spec) -> tuple[int, int]:
        import interp

        return interp.parse_head(spec, self._L, self._H)

    def _parse_heads(self, specs) -> set[tuple[int, int]]:
        errors = _errors()
        if isinstance(specs, str) or (
            isinstance(specs, tuple) and len(specs) == 2 and all(isinstance(x, int) for x in specs)
        ):
            specs = [specs]
        try:
            specs = list(specs)
        except TypeError:
            raise errors.HeadError(f"mask must be a list of heads (e.g. ['L0H1', 'L0H7']), got {specs!r}") from None
        return {self._parse_head(s) for s in specs}

    def _parse_sender(self, spec) -> tuple[int, int]:
        errors = _errors()
        h = self._parse_head(spec)
        if self._L < 2:
            raise errors.HeadError(
                "path patching needs a later layer to receive the sender's output; this model has one layer"
            )
        if h[0] >= self._L - 1:
            raise errors.HeadError(
                f"the sender {self._label(h)} is in the last layer; pick a head of layers 0..{self._L - 2}"
            )
        return h

    def _check_split(self, split) -> None:
        if split not in self.task.splits:
            raise _errors().TaskError(
                f"unknown split {split!r}; task {self.task.name} has {', '.join(self.task.splits)}"
            )

    def _check_index(self, split, index) -> int:
        n = len(self._dataset(split))
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise _errors().InterpError(f"index {index!r} is out of range: split {split!r} has examples 0..{n - 1}")
        return index

    def _check_ablation(self, value) -> str:
        if value not in ABLATIONS:
            raise _errors().InterpError(f"unknown ablation {value!r}; expected one of {ABLATIONS}")
        return value

    def _check_batch_size(self, value) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _errors().InterpError(f"batch_size must be a positive integer, got {value!r}")
        return min(value, len(self._dataset(self._split)))

    # -- data ----------------------------------------------------------------------------------------------------

    def _dataset(self, split: str):
        if split not in self._datasets:
            self._datasets[split] = self.task.dataset(split)
        return self._datasets[split]

    def _example(self, split: str, index: int):
        return self._dataset(split).select([index]).to(self._device)

    def _fast(self) -> bool:
        """Whether the toolkit's fast path applies (one-layer attention-only models: cached head outputs)."""
        return interp.supports_query_forward(self.model)

    def _batch(self) -> dict:
        """The accuracy batch of the current split, its answer cache (the mean-ablation reference, and the input of
        the fast path) and its mean head outputs, computed once per (split, size)."""
        import analyses

        key = (self._split, min(self._batch_size, len(self._dataset(self._split))))
        if key not in self._batches:
            batch = self._dataset(self._split).select(slice(0, key[1])).to(self._device)
            cache = analyses.cache_answer(self.model, batch, attention=False, task=self.task)
            self._batches[key] = {
                "key": key,
                "batch": batch,
                "cache": cache,
                "z_ref": analyses.mean_head_outputs(self.model, cache),
                "singles": {},
                "full": {},
                "separation": None,
                "shapley": {},
            }
        return self._batches[key]

    def _keep(self) -> Tensor:
        return keep_mask(self.model, self._off)

    def _z_ref(self) -> Tensor | None:
        return self._batch()["z_ref"] if self._ablation == "mean" else None

    def _all_heads(self) -> list[tuple[int, int]]:
        return [(layer, h) for layer in range(self._L) for h in range(self._H)]

    def _kept(self, off=None) -> list[tuple[int, int]]:
        off = self._off if off is None else off
        return [h for h in self._all_heads() if h not in off]

    # -- recomputation -----------------------------------------------------------------------------------------------

    def _refresh(
        self, *, input: bool = False, mask: bool = False, batch: bool = False, head: bool = False, patch: bool = False
    ) -> None:
        """Recompute what depends on what changed and push it to the page; times each part (:attr:`timings`)."""
        t: dict[str, float] = {}
        start = time.perf_counter()

        def timed(name, fn):
            t0 = time.perf_counter()
            fn()
            t[name] = (time.perf_counter() - t0) * 1000

        if batch:
            timed("batch", self._batch)
        if input or mask or batch:
            timed("forward", self._forward)
        if mask or batch or (head and self._head is not None):
            timed("accuracy", self._accuracy)
        if input or patch:
            timed("patching", self._patching)
        if self._head is not None and (head or mask or batch or input):
            timed("head", self._head_panel)
        elif head:
            self.head_view = {}
        with self.hold_sync():
            self._push(input=input)
            t["total"] = (time.perf_counter() - start) * 1000
            self.timings = t
            self._status()

    def _status(self, error: str = "") -> None:
        self._seq += 1
        self.status = {"seq": self._seq, "error": error, "ms": {k: round(v, 2) for k, v in self.timings.items()}}
        self.controls = {
            "split": self._split,
            "index": self._index,
            "source": self._source,
            "typed": self._typed,
            "mask": self.mask,
            "ablation": self._ablation,
            "batch_size": self._batch_size,
            "head": self.head,
            "corruption": self._corruption,
            "corrupt_text": self._corrupt_text,
            "sender": self.sender,
        }

    def _forward(self) -> None:
        out = masked_forward(self.model, self._clean.tokens, self._keep(), self._z_ref())
        logits = out["logits"][0]
        targets = self._clean.targets[0]
        positions = [int(p) for p in (targets >= 0).nonzero().flatten().tolist()] or [int(self._clean.answer_pos[0])]
        probs = logits[positions].float().softmax(-1)
        k = min(TOP_K, probs.shape[-1])
        top = probs.topk(k, -1)
        names = list(self.task.vocab.tokens)
        pred = Prediction(
            positions=positions,
            targets=[int(targets[p]) if int(targets[p]) >= 0 else None for p in positions],
            top_ids=top.indices.cpu(),
            top_probs=top.values.cpu(),
            logits=logits[positions].cpu(),
            answer_pos=int(self._clean.answer_pos[0]),
            token_names=names,
        )
        ap = pred.answer_pos
        label = int(self._clean.labels[0])
        # the runner-up among the task's answers (the labels of the accuracy batch, and this one): the other class of a
        # binary task, not a token that is never an answer there
        classes = torch.unique(torch.cat([self._batch()["batch"].labels, self._clean.labels]))
        others = torch.full_like(logits[ap], float("-inf"))
        others[classes] = logits[ap, classes]
        others[label] = float("-inf")
        bad = int(others.argmax()) if bool(torch.isfinite(others).any()) else label
        dla_good, dla_diff = direct_logit_attribution(
            self.model, out["z"][0], None if out["scale"] is None else out["scale"][0], ap, label, bad
        )
        self._fwd = {
            "prediction": pred,
            "patterns": out["patterns"][0].cpu(),
            "logits": logits.cpu(),
            "dla": dla_good.cpu(),
            "dla_diff": dla_diff.cpu(),
            "label": label,
            "runner_up": bad,
        }

    def _accuracy(self) -> None:
        """Learned accuracy of the kept heads (and, with a panel open, of the mask with that head toggled) in one
        batched call; the all-heads accuracy once per batch and ablation."""
        import analyses

        b = self._batch()
        kw = {
            "ablation": self._ablation,
            "reference": b["cache"],
            "cache": b["cache"] if self._fast() else None,
            "task": self.task,
        }
        if self._ablation not in b["full"]:
            b["full"][self._ablation] = float(
                analyses.learned_accuracy(self.model, b["batch"], [self._all_heads()], **kw).accuracy[0]
            )
        subsets = [self._kept()]
        if self._head is not None:
            subsets.append(self._kept(self._off ^ {self._head}))
        self._metrics = None
        self._acc = analyses.learned_accuracy(self.model, b["batch"], subsets, **kw)

    def _patching(self) -> None:
        """Per-head activation patching (and path patching from the sender) between the input and its corruption, on
        the full model. A corruption that no longer fits a new input leaves a note in the patching panel."""
        import analyses

        self._patch = self._path = None
        self._patch_error = ""
        if self._corruption is None:
            return
        try:
            if self._corruption not in PAIR_KINDS.get(self.task.name, ()):
                self._corrupted = self._corrupt(self._corruption, self._corrupt_text, self._clean)
            clean, corrupted = self._clean, self._corrupted
            self._patch = analyses.activation_patching(
                self.model, clean, corrupted, metric="logit_diff", where="z", per="head"
            )
            if self._sender is not None:
                self._path = analyses.path_patching(
                    self.model, clean, corrupted, metric="logit_diff", senders=[self._sender]
                )
        except _errors().InterpError as e:
            self._patch = self._path = None
            self._patch_error = _one_line(e)

    def _corrupt(self, kind: str, text: str, clean):
        """The corrupted input of ``kind`` for ``clean`` (the task's helper, a resampled example or typed tokens),
        checked to line up with it."""
        import analyses

        errors = _errors()
        if kind == "flip":
            corrupted = analyses.flip_answer(clean, seed=0)
        elif kind == "resample":
            data = self._dataset(self._split)
            self._resampled = resample(data, clean, self._index + 1 if self._source == "example" else 0)
            corrupted = data.select([self._resampled])
        elif kind == "typed":
            corrupted = typed_example(self.task, text, self.model.cfg.n_ctx)
        else:
            raise errors.InterpError(f"unknown corruption {kind!r}; expected one of {corruption_kinds(self.task)}")
        corrupted = corrupted.to(self._device)
        if corrupted.tokens.shape != clean.tokens.shape or int(corrupted.answer_pos[0]) != int(clean.answer_pos[0]):
            raise errors.TokenError(
                f"the corrupted input ({corrupted.tokens.shape[1]} tokens, answer at position "
                f"{int(corrupted.answer_pos[0])}) must line up with the clean one "
                f"({clean.tokens.shape[1]} tokens, answer at {int(clean.answer_pos[0])})"
            )
        return corrupted

    def _pair(self, kind: str):
        """A (clean, corrupted) pair from the task's own helper, drawn with ``seed = index``."""
        helper = importlib.import_module("analyses.repeated_tokens").corrupted_pair
        clean, corrupted = helper(self.task, n_seqs=1, kind=kind, seed=self._index)
        return clean.to(self._device), corrupted.to(self._device)

    def _set_corruption(self, kind, text: str) -> None:
        """Choose the corrupted input; a bad choice raises before anything changes."""
        errors = _errors()
        kinds = corruption_kinds(self.task)
        pairs = PAIR_KINDS.get(self.task.name, ())
        leave_pair = self._source == "pair"
        if kind in (None, "", "none"):
            self._corruption = self._corrupted = None
            if leave_pair:
                self._source, self._clean = "example", self._example(self._split, self._index)
            self._refresh(input=leave_pair, patch=True)
            return
        if kind not in kinds:
            raise errors.InterpError(f"unknown corruption {kind!r}; for task {self.task.name} expected one of {kinds}")
        if kind in pairs:
            self._clean, self._corrupted = self._pair(kind)
            self._corruption, self._source = kind, "pair"
            self._refresh(input=True, patch=True)
            return
        clean = self._example(self._split, self._index) if leave_pair else self._clean
        if leave_pair:
            self._source = "example"
        text = text if kind == "typed" else self._corrupt_text
        try:
            corrupted = self._corrupt(kind, text, clean)
        finally:
            if leave_pair:
                self._source = "pair"
        self._clean, self._corrupted, self._corruption, self._corrupt_text = clean, corrupted, kind, text
        if leave_pair:
            self._source = "example"
        self._refresh(input=leave_pair, patch=True)

    def _head_panel(self) -> None:
        import analyses

        layer, h = self._head
        b = self._batch()
        singles = b["singles"].get(self._ablation)
        if singles is None:
            singles = analyses.learned_accuracy(
                self.model,
                b["batch"],
                [[hd] for hd in self._all_heads()],
                ablation=self._ablation,
                reference=b["cache"],
                cache=b["cache"] if self._fast() else None,
                task=self.task,
            )
            b["singles"][self._ablation] = singles
        i = layer * self._H + h
        scores = self._head_scores()
        sep = b["separation"]
        shap = b["shapley"].get(self._ablation)
        label, bad = self._fwd["label"], self._fwd["runner_up"]
        names = self.task.vocab.tokens
        view = {
            "head": self._label(self._head),
            "layer": layer,
            "index": h,
            "off": self._head in self._off,
            "learned_alone": float(singles.accuracy[i]),
            "toggled_accuracy": float(self._acc.accuracy[1]) if len(self._acc.accuracy) > 1 else None,
            "dla": float(self._fwd["dla"][layer, h]),
            "dla_diff": float(self._fwd["dla_diff"][layer, h]),
            "dla_all": [[round(float(v), 5) for v in row] for row in self._fwd["dla_diff"]],
            "dla_tokens": [names[label], names[bad]],
            "scores": None
            if scores is None
            else {s: float(getattr(scores, s)[layer, h]) for s in ("induction", "prev_token", "duplicate", "bos")},
            "scores_on": self._scores_note,
            "separation": None
            if sep is None
            else {
                "accuracy": float(sep.accuracy[i]),
                "roc_auc": _num(sep.roc_auc[i]),
                "n_train": sep.n_train,
                "n_test": sep.n_test,
                "n_classes": int(torch.unique(b["batch"].labels).numel()),
                "chance": _num(sep.chance),
            },
            "shapley": None
            if shap is None
            else {
                "value": shap[self._head],
                "exact": shap.exact,
                "stderr": None if shap.stderr is None else float(shap.stderr[i]),
                "rank": shap.ranking().index(self._label(self._head)) + 1,
                "v_all": shap.v_all,
                "v_empty": shap.v_empty,
            },
            "circuits": self._circuit_views(self._head),
            "n": b["key"][1],
            "split": self._split,
        }
        self.head_view = view

    def _head_scores(self):
        """Induction / previous-token / duplicate / BOS scores of every head (Olsson et al.), on the task's probe
        sequences for repeated tokens, else on repeated random output tokens; None where the context is too short
        for a repeat."""
        import analyses

        if self._scores is None and self._scores_note is None:
            cfg, task = self.model.cfg, self.task
            if task.name == "repeated-tokens":
                tokens = importlib.import_module("analyses.repeated_tokens").probe_tokens(task, n_seqs=SCORE_SEQS)
                self._scores_note = f"{SCORE_SEQS} of the task's [BOS] R R probe sequences"
            elif cfg.n_ctx >= 9:
                rep = min((cfg.n_ctx - 1) // 2, 32)
                make = analyses.repeated_random_tokens
                tokens = make(SCORE_SEQS, rep, task.vocab.n_out, bos=task.vocab.bos, seed=0)
                self._scores_note = (
                    f"{SCORE_SEQS} sequences [BOS] R R of random output tokens, len(R) = {rep} "
                    "(outside the task's distribution)"
                )
            else:
                self._scores_note = f"not defined: a context of {cfg.n_ctx} tokens holds no repeat"
                return None
            self._scores = analyses.head_scores(self.model, tokens.to(self._device), n_boot=200)
        return self._scores

    def _circuit_views(self, head) -> list[dict]:
        """The head's circuits as float32 bytes for the page (cut to ``CIRCUIT_MAX`` rows and columns)."""
        import analyses

        if head not in self._circuits:
            vocab = self.task.vocab
            out = []
            circuits = [
                analyses.full_qk_circuit(self.model, head, vocab),
                analyses.full_ov_circuit(self.model, head, vocab),
            ]
            cfg = self.model.cfg
            if cfg.positional_embedding_type in ("standard", "shortformer") and bool(
                self.model.W_pos.detach().abs().max() > 0
            ):
                circuits.append(analyses.positional_qk_circuit(self.model, head))
            for c in circuits:
                m = c.dense().float()
                if c.causal:
                    m = m.masked_fill(torch.ones_like(m, dtype=torch.bool).triu(1), float("nan"))
                m = m[:CIRCUIT_MAX, :CIRCUIT_MAX].contiguous().cpu()
                out.append(
                    {
                        "name": c.name,
                        "rows": c.row_labels[: m.shape[0]],
                        "cols": c.col_labels[: m.shape[1]],
                        "row_title": c.row_title,
                        "col_title": c.col_title,
                        "shape": list(m.shape),
                        "full_shape": list(c.dense().shape),
                        "data": m.numpy().tobytes(),
                        "direct_only": head[0] > 0,
                    }
                )
            self._circuits[head] = out
        return self._circuits[head]

    def _compute(self, what: str) -> None:
        """The costlier numbers, on request: separation accuracy and Shapley values of every head (cached per batch
        and ablation), or the task's own metrics under the mask."""
        import analyses

        errors = _errors()
        b = self._batch()
        t0 = time.perf_counter()
        if what == "separation":
            if b["separation"] is None:
                train = self._dataset("train") if "train" in self.task.splits else self._dataset(self.task.splits[0])
                train = train.select(slice(0, min(SEPARATION_TRAIN, len(train)))).to(self._device)
                b["separation"] = analyses.separation_accuracy(self.model, train, b["cache"], task=self.task)
        elif what == "shapley":
            if self._ablation not in b["shapley"]:
                n = self._L * self._H
                data = b["cache"] if self._fast() else b["batch"]
                ref = {"reference": b["cache"]} if self._ablation == "mean" else {}
                if n <= SHAPLEY_EXACT_MAX:
                    cv = analyses.coalition_values(
                        self.model, data, value="learned-accuracy", ablation=self._ablation, **ref
                    )
                    res = analyses.exact_shapley(cv)
                else:
                    res = analyses.sampled_shapley(
                        self.model,
                        data,
                        value="learned-accuracy",
                        ablation=self._ablation,
                        samples=SHAPLEY_SAMPLES,
                        **ref,
                    )
                b["shapley"][self._ablation] = res
        elif what == "metrics":
            self._metrics = self.metrics
        else:
            raise errors.InterpError(f"unknown computation {what!r}; expected separation, shapley or metrics")
        self.timings = {what: (time.perf_counter() - t0) * 1000}
        if self._head is not None:
            self._head_panel()
        with self.hold_sync():
            self._push()
            self._status()

    # -- what the page gets ----------------------------------------------------------------------------------------

    def _info(self) -> dict:
        cfg, task = self.model.cfg, self.task
        return {
            "name": self._name,
            "task": task.name,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "d_model": cfg.d_model,
            "d_head": cfg.d_head,
            "attn_only": bool(cfg.attn_only),
            "normalization": cfg.normalization_type,
            "n_ctx": cfg.n_ctx,
            "d_vocab": cfg.d_vocab,
            "splits": list(task.splits),
            "corruptions": list(corruption_kinds(task)),
            "typed": task.name in _TYPED,
            "heads": [self._label(h) for h in self._all_heads()],
            "fast": self._fast(),
            "shapley_exact": cfg.n_layers * cfg.n_heads <= SHAPLEY_EXACT_MAX,
            "shapley_cost": self._shapley_cost(),
        }

    def _shapley_cost(self) -> str:
        """What the Shapley button will compute, in words (the page shows it before the click)."""
        n = self._L * self._H
        if n > SHAPLEY_EXACT_MAX:
            return f"sampled from {SHAPLEY_SAMPLES} permutations of the {n} heads"
        if self._fast():
            return f"exact over {2**n:,} coalitions, recombined from cached head outputs"
        return f"exact over {2**n:,} coalitions, each a forward pass of the batch (slow for deep models)"

    def _input_view(self) -> dict:
        toks = self.tokens
        targets = self._clean.targets[0].tolist()
        return {
            "tokens": toks,
            "answer_pos": int(self._clean.answer_pos[0]),
            "label": self.task.vocab.tokens[int(self._clean.labels[0])],
            "targets": [int(i) for i, t in enumerate(targets) if t >= 0],
            "source": self._source,
            "split": self._split,
            "index": self._index,
            "size": len(self._dataset(self._split)),
            "typed": self._typed,
            "pair": self._corruption if self._source == "pair" else None,
        }

    def _patterns_view(self) -> dict:
        """Patterns quantised to uint16 (weight x 65535) for the page, cut to the last ``max_positions`` positions
        and to a total of ``CELL_BUDGET`` entries."""
        p = self._fwd["patterns"]  # [L, H, T, T]
        L, H, T, _ = p.shape
        w = min(T, self._max_positions, max(2, int((CELL_BUDGET / (L * H)) ** 0.5)))
        off = T - w
        q = (p[:, :, off:, off:].float().clamp(0, 1) * 65535).round().to(torch.int32)
        data = q.numpy().astype("<u2").tobytes()
        return {"n_layers": L, "n_heads": H, "T": T, "window": w, "offset": off, "data": data}

    def _accuracy_view(self) -> dict:
        b = self._batch()
        n = b["key"][1]
        acc, full = float(self._acc.accuracy[0]), self.full_accuracy
        return {
            "accuracy": acc,
            "correct": round(acc * n),
            "n": n,
            "split": self._split,
            "full": full,
            "full_correct": round(full * n),
            "mask": self.mask,
            "ablation": self._ablation,
            "metrics": None if self._metrics is None else {k: _num(v) for k, v in self._metrics.items()},
        }

    def _patch_view(self) -> dict:
        if self._corruption is None or self._patch is None:
            return {"kind": self._corruption, "error": self._patch_error}
        p, names = self._patch, self.task.vocab.tokens
        corr = self._corrupted
        view = {
            "kind": self._corruption,
            "tokens": self.corrupted_tokens,
            "diff": [int(i) for i in (corr.tokens[0] != self._clean.tokens[0]).nonzero().flatten().tolist()],
            "clean_label": names[int(self._clean.labels[0])],
            "corrupted_label": names[int(corr.labels[0])],
            "clean": _num(p.clean),
            "corrupted": _num(p.corrupted),
            "values": [[_num(v) for v in row] for row in p.values.tolist()],
            "normalized": [[_num(v) for v in row] for row in p.normalized.tolist()],
            "resampled": self._resampled if self._corruption == "resample" else None,
            "error": "",
            "sender": self.sender,
            "path": None,
        }
        if self._path is not None:
            view["path"] = {
                "rows": self._path.rows(),
                "clean": _num(self._path.clean),
                "corrupted": _num(self._path.corrupted),
            }
        return view

    def _push(self, input: bool = True) -> None:
        if self._fwd:
            self.input_view = self._input_view()
            pred = self._fwd["prediction"]
            self.prediction_view = {
                "rows": pred.rows()[:MAX_ROWS],
                "n_rows": len(pred.positions),
                "answer_pos": pred.answer_pos,
            }
            p = self._fwd["patterns"]
            if (
                self._sent_patterns is None
                or self._sent_patterns.shape != p.shape
                or not torch.equal(self._sent_patterns, p)
            ):
                self.patterns_view = self._patterns_view()
                self._sent_patterns = p
        if self._acc is not None:
            self.accuracy_view = self._accuracy_view()
        self.patch_view = self._patch_view()
        if self._head is not None and self.head_view:
            self.head_view = {**self.head_view, "off": self._head in self._off}
        self.export_view = {"snippet": self._snippet()}

    # -- events from the page ------------------------------------------------------------------------------------

    def _on_msg(self, _widget, content, _buffers) -> None:
        """One event from the page; a bad value shows as one line in the widget (never a traceback in the output)."""
        errors = _errors()
        try:
            self._handle(content if isinstance(content, dict) else {})
        except errors.InterpError as e:
            self._status(_one_line(e))
        except Exception as e:
            self.last_traceback = traceback.format_exc()
            self._status(f"internal error ({type(e).__name__}: {_one_line(e)}); the traceback is in w.last_traceback")

    def _handle(self, msg: dict) -> None:
        errors = _errors()
        kind = msg.get("type")
        if kind == "example":
            try:
                index = int(msg.get("index"))
            except (TypeError, ValueError):
                raise errors.InterpError(f"the index must be a whole number, got {msg.get('index')!r}") from None
            self.example = (msg.get("split", self._split), index)
        elif kind == "random":
            split = msg.get("split", self._split)
            self._check_split(split)
            self.example = (split, self._rng.randrange(len(self._dataset(split))))
        elif kind == "typed":
            self.tokens = str(msg.get("text", ""))
        elif kind == "toggle":
            h = self._parse_head(msg.get("head"))
            self.mask = sorted(self._off ^ {h})
        elif kind == "only":
            h = self._parse_head(msg.get("head"))
            self.mask = [x for x in self._all_heads() if x != h]
        elif kind == "mask":
            self.mask = msg.get("heads") or []
        elif kind == "ablation":
            self.ablation = msg.get("value")
        elif kind == "batch_size":
            try:
                value = int(msg.get("value"))
            except (TypeError, ValueError):
                raise errors.InterpError(f"the batch size must be a whole number, got {msg.get('value')!r}") from None
            self.batch_size = value
        elif kind == "select":
            self.head = msg.get("head") or None
        elif kind == "corruption":
            self._set_corruption(msg.get("kind"), str(msg.get("text", "")))
        elif kind == "sender":
            self.sender = msg.get("head") or None
        elif kind == "compute":
            self._compute(str(msg.get("what")))
        elif kind == "export_state":
            self.export_view = {**self.export_view, "state": json.dumps(self.state().to_dict(), indent=1)}
            self._status()
        else:
            raise errors.InterpError(f"unknown event {kind!r}")

    # -- export --------------------------------------------------------------------------------------------------

    def _state_dict(self) -> dict:
        acc = self._accuracy_view()
        return {
            "model": self._name,
            "task": self.task.name,
            "task_params": self.task.params(),
            "input": {
                "source": self._source,
                "split": self._split,
                "index": self._index if self._source != "typed" else None,
                "typed": self._typed if self._source == "typed" else None,
                "tokens": self.tokens,
                "answer_pos": int(self._clean.answer_pos[0]),
            },
            "mask": self.mask,
            "ablation": self._ablation,
            "batch_size": self._batch_size,
            "prediction": self.prediction.to_dict(),
            "accuracy": {k: acc[k] for k in ("accuracy", "correct", "n", "split", "full")},
            "head": self.head_panel or None,
            "patching": None
            if self._patch is None
            else {"corruption": self._corruption, "corrupted": self.corrupted_tokens, **self._patch.to_dict()},
            "path_patching": None if self._path is None else self._path.to_dict(),
        }

    def _snippet(self) -> str:
        """The Python calls behind the current numbers."""
        task = self.task
        lines = ["import interp, analyses", ""]
        if self._checkpoint is not None:
            lines += [f"ckpt = interp.load_checkpoint({self._checkpoint!r})", "model, task = ckpt.model, ckpt.task"]
        else:
            lines += [
                "# model: the HookedTransformer you passed to interp.explore",
                f"task = interp.get_task({task.name!r}, **{task.params()!r})",
            ]
        lines += [
            f"data = task.dataset({self._split!r})",
            f"batch = data.select(slice(0, {self._batch()['key'][1]}))  # the accuracy batch",
        ]
        if self._source == "example":
            lines.append(f"example = data.select([{self._index}])  # the input shown")
        elif self._source == "typed":
            lines += [
                "from interp.app.explorer import typed_example",
                f"example = typed_example(task, {self._typed!r})  # the typed input",
            ]
        else:
            lines += [
                "import analyses.repeated_tokens",
                (
                    f"example, corrupted = analyses.repeated_tokens.corrupted_pair(task, n_seqs=1, "
                    f"kind={self._corruption!r}, seed={self._index})"
                ),
            ]
        lines += [
            "L, H = model.cfg.n_layers, model.cfg.n_heads",
            f"off = {self.mask!r}  # heads switched off",
            "kept = [(l, h) for l in range(L) for h in range(H) if interp.head_label(l, h) not in off]",
            f"acc = analyses.learned_accuracy(model, batch, [kept], ablation={self._ablation!r})",
            (
                f"print(acc.accuracy[0])  # the accuracy shown: {self.accuracy:.6g} "
                f"({self._accuracy_view()['correct']}/{self._batch()['key'][1]})"
            ),
            "from interp.app.explorer import keep_mask, mask_hooks, masked_forward",
            "z_ref = analyses.mean_head_outputs(model, batch)" if self._ablation == "mean" else "z_ref = None",
            "out = masked_forward(model, example.tokens, keep_mask(model, off), z_ref)  # logits and patterns",
            "probs = out['logits'][0, example.answer_pos[0]].softmax(-1)",
            f"print(probs.topk({TOP_K}))  # top tokens at the answer position",
        ]
        if self._corruption is not None:
            if self._corruption == "flip":
                lines.append("corrupted = analyses.flip_answer(example, seed=0)")
            elif self._corruption == "resample":
                lines.append(f"corrupted = data.select([{self._resampled}])  # same length, another answer")
            elif self._corruption == "typed":
                lines += [
                    "from interp.app.explorer import typed_example",
                    f"corrupted = typed_example(task, {self._corrupt_text!r})",
                ]
            lines.append(
                "patching = analyses.activation_patching(model, example, corrupted, metric='logit_diff', "
                "where='z', per='head')"
            )
            if self._sender is not None:
                lines.append(
                    f"paths = analyses.path_patching(model, example, corrupted, metric='logit_diff', "
                    f"senders=[{self.sender!r}])"
                )
        if self._head is not None:
            lines += [
                f"qk = analyses.full_qk_circuit(model, {self.head!r}, task.vocab)",
                f"ov = analyses.full_ov_circuit(model, {self.head!r}, task.vocab)",
            ]
        return "\n".join(lines) + "\n"

    def _snapshot_html(self) -> str:
        """Static HTML of the view: the input, the prediction table, the mask and accuracy, and the attention patterns
        as PNG images (small multiples), plus the patching's largest effects."""
        esc = _html.escape
        acc = self._accuracy_view()
        pv = self._patterns_view()
        p = self._fwd["patterns"]
        off = pv["offset"]
        toks = self.tokens
        pngs = _pattern_images(p[:, :, off:, off:].reshape(-1, pv["window"], pv["window"]))
        imgs = []
        for i, png in enumerate(pngs):
            layer, h = divmod(i, self._H)
            lab = self._label((layer, h))
            state = " (off)" if (layer, h) in self._off else ""
            imgs.append(
                f"<figure style='display:inline-block;margin:2px;text-align:center'>"
                f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}' width='84' height='84' "
                f"style='image-rendering:pixelated;border:1px solid #ccc' alt='attention of {lab}'>"
                f"<figcaption style='font-size:11px'>{lab}{state}</figcaption></figure>"
            )
        shown = " ".join(esc(t) for t in toks[:MAX_POSITIONS]) + (" ..." if len(toks) > MAX_POSITIONS else "")
        src = {
            "example": f"{self._split} #{self._index}",
            "typed": "typed",
            "pair": f"{self._corruption} pair, seed {self._index}",
        }[self._source]
        parts = [
            "<div class='interp-explorer-snapshot' style='font-family:sans-serif;font-size:13px;line-height:1.4'>",
            (
                f"<p><b>interp explorer</b>: {esc(self._name)} (task {esc(self.task.name)}, {self._L} layer(s) x "
                f"{self._H} heads). <i>Static snapshot of the state when this output was made; with a running kernel "
                "the widget is live.</i></p>"
            ),
            f"<p>Input ({esc(src)}, {len(toks)} tokens): <code>{shown}</code></p>",
            _prediction_table(self.prediction.rows()),
            (
                f"<p>Heads off: {esc(', '.join(self.mask) or 'none')} ({self._ablation} ablation). Learned accuracy on "
                f"the first {acc['n']} {esc(self._split)} examples: <b class='interp-explorer-accuracy'>"
                f"{acc['accuracy']:.4f}</b> ({acc['correct']}/{acc['n']}); all heads on: {acc['full']:.4f}.</p>"
            ),
            (
                "<p>Attention patterns (rows: queries, columns: keys; colour: square root of the weight"
                + (f"; positions {off}..{pv['T'] - 1}" if off else "")
                + "):</p>"
            ),
            "<div>" + "".join(imgs) + "</div>",
        ]
        if self._patch is not None:
            top = ", ".join(f"{r['head']} {r['normalized']:.2f}" for r in self._patch.top(5))
            parts.append(
                f"<p>Activation patching ({esc(self._corruption)}): largest effects (normalized logit "
                f"difference, 1 = clean) {esc(top)}.</p>"
            )
        parts.append("</div>")
        return "".join(parts)


def _num(x) -> float | None:
    """A finite float, or None (NaN and infinities have no JSON)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _predictions_and_loss(model, data, fwd_hooks=()):
    """The toolkit's batched evaluation (per-position argmax and loss), reached in one place only."""
    from interp.evaluation import predictions_and_loss

    return predictions_and_loss(model, data, fwd_hooks=fwd_hooks)


def explore(
    model_or_checkpoint,
    task=None,
    *,
    split: str | None = None,
    index: int = 0,
    batch_size: int = DEFAULT_BATCH,
    ablation: str = "zero",
    device: str | None = None,
    max_positions: int = MAX_POSITIONS,
    seed: int = 0,
) -> Explorer:
    """The interactive explorer of a model: ``interp.explore("noisy-majority")`` (a shipped name or a checkpoint
    path, loaded on ``device``), ``interp.explore(checkpoint)`` or ``interp.explore(model, task)`` (any
    ``HookedTransformer`` and its task, or the task's name). Starts on example ``index`` of ``split`` (default: the
    test split), the accuracy measured on the first ``batch_size`` examples of the split, heads switched off by
    ``ablation`` (``"zero"`` or ``"mean"``); at most ``max_positions`` positions of each attention pattern are
    drawn; ``seed`` drives the "random example" button."""
    import interp

    errors = _errors()
    checkpoint = None
    if isinstance(model_or_checkpoint, (str, Path)):
        if task is not None:
            raise errors.InterpError("give a checkpoint (name or path) alone, or a model and its task")
        ckpt = interp.load_checkpoint(model_or_checkpoint, device=device)
        checkpoint = str(model_or_checkpoint)
        model, task = ckpt.model, ckpt.task
    elif isinstance(model_or_checkpoint, interp.Checkpoint):
        ckpt = model_or_checkpoint
        model, task = ckpt.model, task or ckpt.task
        checkpoint = None if ckpt.path is None else str(ckpt.path)
    else:
        model = model_or_checkpoint
        if task is None:
            raise errors.TaskError("a model needs its task: interp.explore(model, task) (a task object or name)")
        if not hasattr(model, "cfg") or not hasattr(model, "run_with_hooks"):
            raise errors.InterpError(
                f"expected a HookedTransformer, a Checkpoint or a checkpoint name; got {type(model).__name__}"
            )
    if isinstance(task, str):
        task = interp.get_task(task)
    name = checkpoint if checkpoint is not None else None
    return Explorer(
        model,
        task,
        name=name,
        checkpoint=checkpoint,
        split=split,
        index=index,
        batch_size=batch_size,
        ablation=ablation,
        max_positions=max_positions,
        seed=seed,
    )
