"""Attention-pattern scores of every head on repeated random tokens, and the K-composition causal test.

Scores (per head, averaged over sequences and query positions; each lies in [0, 1]):

- **induction**: attention from a query ``q`` to the positions ``j`` (``1 <= j <= q``) whose previous
  token equals the query's token, i.e. to the token *after* every earlier occurrence of the current
  token. Averaged over the queries that have such a position. Tokens that repeat inside ``R`` are
  handled: every earlier occurrence counts, so a perfect induction head scores exactly 1.
- **previous-token**: attention from ``q`` to ``q - 1``, averaged over ``q >= 1``.
- **duplicate-token**: attention from ``q`` to earlier positions holding the same token, averaged over the
  queries whose token occurred before.
- **BOS** (first-token): attention from ``q`` to position 0, averaged over ``q >= 1``.

Relation to TransformerLens' ``head_detector`` (which needs a tokenizer, so we call its pattern
functions instead): its ``"mul"`` score is ``sum(pattern * detection) / sum(pattern)``, the mean over
*all* query rows, where rows without a detected key count as 0. Ours is the mean over the rows that
have one, so ``TL_mul = ours * n_valid_rows / seq_len`` for each sequence (tested). On ``[BOS] R R`` with
``len(R) = n`` and no repeats inside R, a perfect induction head scores 1 here but ``n / (2n + 1)`` (< 0.5)
in TL's scale. The detection patterns themselves (duplicate tokens, shifted duplicate tokens) are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.ablation import ablation_hooks
from interp.device import check_device
from interp.errors import HeadError, InterpError
from interp.evaluation import check_batch_size, check_tokens
from interp.heads import head_label, head_mask, one_set
from interp.results import Result, head_of, jsonable
from interp.task import TaskData
from interp.visualize import attention_patterns, render_table

SCORES = ("induction", "prev_token", "duplicate", "bos")


def repeated_random_tokens(
    n_seqs: int,
    rep_len: int,
    n_symbols: int,
    *,
    n_repeats: int = 2,
    bos: int | None = None,
    seed: int = 0,
    unique: bool = False,
    device=None,
) -> Int[Tensor, "batch pos"]:
    """``[BOS] R R ...`` (``n_repeats`` copies of ``R``, ``len(R) = rep_len``), R uniform over
    ``[0, n_symbols)``; ``unique=True`` draws R without replacement (no repeats inside R)."""
    if n_seqs < 1 or rep_len < 1 or n_repeats < 1 or n_symbols < 1:
        raise InterpError(
            f"need n_seqs, rep_len, n_repeats, n_symbols >= 1, got {n_seqs}, {rep_len}, {n_repeats}, {n_symbols}"
        )
    if unique and rep_len > n_symbols:
        raise InterpError(f"unique R of length {rep_len} needs at least {rep_len} symbols, got {n_symbols}")
    gen = torch.Generator().manual_seed(seed)
    if unique:
        r = torch.stack([torch.randperm(n_symbols, generator=gen)[:rep_len] for _ in range(n_seqs)])
    else:
        r = torch.randint(0, n_symbols, (n_seqs, rep_len), generator=gen)
    toks = r.repeat(1, n_repeats)
    if bos is not None:
        toks = torch.cat([torch.full((n_seqs, 1), bos, dtype=torch.long), toks], dim=1)
    return toks.to(device) if device is not None else toks


def target_masks(tokens: Int[Tensor, "batch pos"]) -> dict[str, Float[Tensor, "batch q k"]]:
    """Per score, the 0/1 mask of the keys each query should attend to (causal, lower triangular)."""
    b, t = tokens.shape
    dev = tokens.device
    q = torch.arange(t, device=dev)[:, None]
    k = torch.arange(t, device=dev)[None, :]
    same = tokens[:, :, None] == tokens[:, None, :]  # [b, q, k]: tok[q] == tok[k]
    dup = same & (k < q)
    prev_same = torch.zeros_like(same)
    prev_same[:, :, 1:] = same[:, :, :-1]  # tok[q] == tok[k - 1]
    ind = prev_same & (k <= q) & (k >= 1)
    prev = (k == q - 1).expand(b, t, t)
    first = ((k == 0) & (q >= 1)).expand(b, t, t)
    return {"induction": ind.float(), "prev_token": prev.float(), "duplicate": dup.float(), "bos": first.float()}


def scores_from_patterns(
    patterns: Float[Tensor, "batch layer head q k"], masks: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Mean attention mass on each score's target keys over the queries that have a target: ``[layer, head]``."""
    out = {}
    for name, m in masks.items():
        valid = m.sum(-1) > 0  # [b, q]
        mass = torch.einsum("blhqk,bqk->blhq", patterns, m)
        out[name] = (mass * valid[:, None, None, :]).sum((0, 3)) / valid.sum().clamp(min=1)
    return out


PATHS = ("all", "query", "key", "value")
PATH_NAMES = {
    "all": "zero-ablated",
    "query": "removed from later heads' query input",
    "key": "removed from later heads' key input (the K-composition path)",
    "value": "removed from later heads' value input",
}


def per_sequence_mass(
    patterns: Float[Tensor, "batch layer head q k"], masks: dict[str, Tensor]
) -> dict[str, tuple[Tensor, Tensor]]:
    """Per score: each sequence's summed attention mass on its target keys ``[batch, layer, head]`` over its
    queries that have a target, and the number of those queries ``[batch]``."""
    out = {}
    for name, m in masks.items():
        valid = (m.sum(-1) > 0).float()  # [b, q]
        mass = torch.einsum("blhqk,bqk->blhq", patterns, m)
        out[name] = ((mass * valid[:, None, None, :]).sum(-1), valid.sum(-1))
    return out


def bootstrap_interval(
    mass: Float[Tensor, "batch layer head"],
    count: Float[Tensor, " batch"],
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap over sequences of the ratio ``sum mass / sum count``: ``(low, high)`` per head."""
    gen = torch.Generator().manual_seed(seed)
    b = mass.shape[0]
    idx = torch.randint(0, b, (n_boot, b), generator=gen).to(mass.device)
    w = torch.zeros(n_boot, b, device=mass.device).scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float))
    ratios = torch.einsum("rb,blh->rlh", w, mass.float()) / (w @ count.float()).clamp(min=1)[:, None, None]
    alpha = (1 - level) / 2
    q = torch.tensor([alpha, 1 - alpha], device=mass.device)
    lo, hi = torch.quantile(ratios, q, dim=0)
    return lo, hi


@dataclass(eq=False)
class HeadScores(Result):
    """Per-head scores ``[n_layers, n_heads]`` on the given tokens, each with a 95% bootstrap interval over the
    sequences (``ci[score] = (low, high)``), with the tokens kept for reference."""

    induction: Float[Tensor, "layer head"]
    prev_token: Float[Tensor, "layer head"]
    duplicate: Float[Tensor, "layer head"]
    bos: Float[Tensor, "layer head"]
    tokens: Int[Tensor, "batch pos"] | None = field(repr=False)  # None in a result read back by from_dict
    ci: dict = field(default_factory=dict, repr=False)
    n_seqs: int = 0
    seq_len: int = 0

    def __post_init__(self):
        if self.tokens is not None:
            self.n_seqs, self.seq_len = (int(x) for x in self.tokens.shape)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.induction.shape)

    def best(self, score: str, layer: int | None = None) -> tuple[int, int]:
        """The (layer, head) with the highest ``score``, optionally within one layer."""
        if score not in SCORES:
            raise InterpError(f"unknown score {score!r}; expected one of {SCORES}")
        s = getattr(self, score).clone()
        if layer is not None:
            keep = torch.zeros_like(s, dtype=torch.bool)
            keep[layer] = True
            s[~keep] = -1
        i = int(s.flatten().argmax())
        return divmod(i, s.shape[1])

    def rows(self) -> list[dict]:
        n_layers, n_heads = self.shape
        rows = []
        for l in range(n_layers):
            for h in range(n_heads):
                row = {"head": head_label(l, h)}
                for s in SCORES:
                    row[f"{s}_score"] = float(getattr(self, s)[l, h])
                    if s in self.ci:
                        row[f"{s}_ci"] = [float(self.ci[s][0][l, h]), float(self.ci[s][1][l, h])]
                rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return jsonable({"n_seqs": self.n_seqs, "seq_len": self.seq_len, "ci_level": 0.95, "heads": self.rows()})

    @classmethod
    def from_dict(cls, d: dict) -> HeadScores:
        """The scores and intervals ``to_dict`` wrote (not the sequences they were measured on)."""
        rows = d["heads"]
        heads = [head_of(r["head"]) for r in rows]
        shape = (max(l for l, _ in heads) + 1, max(h for _, h in heads) + 1)

        def grid(values) -> Tensor:
            t = torch.full(shape, float("nan"))
            for (l, h), v in zip(heads, values):
                t[l, h] = float("nan") if v is None else v
            return t

        scores = {s: grid(r[f"{s}_score"] for r in rows) for s in SCORES}
        ci = {
            s: (grid(r[f"{s}_ci"][0] for r in rows), grid(r[f"{s}_ci"][1] for r in rows))
            for s in SCORES
            if f"{s}_ci" in rows[0]
        }
        return cls(**scores, tokens=None, ci=ci, n_seqs=d["n_seqs"], seq_len=d["seq_len"])

    def text(self) -> str:
        """Every head's four scores, best induction head first."""
        rows = sorted(self.rows(), key=lambda r: -r["induction_score"])
        lines = [f"head scores on {self.n_seqs} sequences of {self.seq_len} tokens: " + ", ".join(SCORES)]
        lines += [f"  {r['head']:<8}" + "".join(f"{r[f'{s}_score']:>10.3f}" for s in SCORES) for r in rows]
        return "\n".join(lines)

    def figure(self):
        """Heatmap: scores (rows) by head (columns)."""
        from interp.visualize import heatmap

        n_layers, n_heads = self.shape
        z = torch.stack([getattr(self, s).flatten() for s in SCORES]).cpu()
        labels = [head_label(l, h) for l in range(n_layers) for h in range(n_heads)]
        return heatmap(
            z,
            labels,
            list(SCORES),
            title="Head scores on repeated random tokens",
            colorscale="Blues",
            zmid=None,
            zmin=0,
            zmax=1,
            text_fmt=".2f",
        )

    def table_html(self) -> str:
        rows = [
            {
                "head": r["head"],
                **{
                    s: f"{r[f'{s}_score']:.3f}"
                    + (f" [{r[f'{s}_ci'][0]:.3f}, {r[f'{s}_ci'][1]:.3f}]" if f"{s}_ci" in r else "")
                    for s in SCORES
                },
            }
            for r in self.rows()
        ]
        return render_table(rows, ["head", *SCORES], caption="score [95% bootstrap interval over sequences]")


SCORE_BATCH = 256  # sequences per forward of head_scores when batch_size is None


def _tokens_of(model: HookedTransformer, data: object, device, batch_size: object = None) -> Tensor:
    """The token ids of ``data`` (task data or a token tensor) on the model's device, after the entry's checks."""
    dev = check_device(model, device)
    check_batch_size(batch_size)
    if isinstance(data, TaskData):
        from .answer_cache import check_model_data

        check_model_data(model, data)
        return data.tokens.to(dev)
    tokens = torch.as_tensor(data).to(dev)
    check_tokens(model, tokens)
    return tokens


def head_scores(
    model: HookedTransformer,
    data: TaskData | Int[Tensor, "batch pos"],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    batch_size: int | None = None,
    device: str | None = None,
) -> HeadScores:
    """Induction / previous-token / duplicate / BOS scores of every head, from one cached forward pass per
    ``batch_size`` sequences (default 256) of ``data`` (token ids, e.g. ``probe_tokens(task)`` of repeated tokens or
    :func:`repeated_random_tokens` for a model of another task, or task data), with percentile-bootstrap 95%
    intervals over the sequences (``n_boot`` resamples, ``seed``)."""
    tokens = _tokens_of(model, data, device, batch_size)
    chunk = batch_size or SCORE_BATCH
    sums: dict[str, list] = {}
    for start in range(0, tokens.shape[0], chunk):
        part = tokens[start : start + chunk]
        for name, (mass, count) in per_sequence_mass(attention_patterns(model, part), target_masks(part)).items():
            sums.setdefault(name, [[], []])
            sums[name][0].append(mass)
            sums[name][1].append(count)
    res, ci = {}, {}
    for name, (masses, counts) in sums.items():
        mass, count = torch.cat(masses), torch.cat(counts)
        res[name] = mass.sum(0) / count.sum().clamp(min=1)
        ci[name] = bootstrap_interval(mass, count, n_boot=n_boot, seed=seed)
    return HeadScores(tokens=tokens, ci=ci, **res)


@dataclass(eq=False)
class AblationTest(Result):
    """The K-composition causal test: induction scores ``[layer, head]`` with nothing removed (``base``) and with
    each sender head's output removed along ``path`` (``ablated[i]`` for ``senders[i]``): ``"all"`` zero-ablates
    the head (its effect on later queries, keys and values together); ``"query"``/``"key"``/``"value"`` remove its
    output only from that input of the later layers' heads (``"key"`` is K-composition proper)."""

    senders: list[tuple[int, int]]
    base: Float[Tensor, "layer head"]
    ablated: Float[Tensor, "sender layer head"]
    layer: int
    path: str = "all"

    @property
    def drop(self) -> Float[Tensor, "sender layer head"]:
        return self.base[None] - self.ablated

    @property
    def removed(self) -> str:
        """What was removed, in words."""
        return PATH_NAMES[self.path]

    def targets(self) -> list[tuple[int, int]]:
        n_layers, n_heads = self.base.shape
        return [(l, h) for l in range(self.layer + 1, n_layers) for h in range(n_heads)]

    def rows(self) -> list[dict]:
        """One row per (ablated head, later head): the later head's induction score before and after."""
        return [
            {
                "ablated": head_label(*s),
                "path": self.path,
                "head": head_label(l, h),
                "induction_score": float(self.base[l, h]),
                "ablated_score": float(self.ablated[i, l, h]),
                "drop": float(self.drop[i, l, h]),
            }
            for i, s in enumerate(self.senders)
            for l, h in self.targets()
        ]

    def to_dict(self) -> dict:
        return jsonable({"layer": self.layer, "path": self.path, "removed": self.removed, "rows": self.rows()})

    @classmethod
    def from_dict(cls, d: dict) -> AblationTest:
        """The scores ``to_dict`` wrote: those of the later layers' heads (the others are NaN)."""
        rows = d["rows"]
        senders = list(dict.fromkeys(head_of(r["ablated"]) for r in rows))
        measured = [head_of(r["head"]) for r in rows]
        shape = (max(l for l, _ in measured) + 1, max(h for _, h in measured) + 1)
        base = torch.full(shape, float("nan"))
        ablated = torch.full((len(senders), *shape), float("nan"))
        for r, (l, h) in zip(rows, measured):
            base[l, h] = r["induction_score"]
            ablated[senders.index(head_of(r["ablated"])), l, h] = r["ablated_score"]
        return cls(senders=senders, base=base, ablated=ablated, layer=d["layer"], path=d["path"])

    def text(self) -> str:
        """The largest drops of a later head's induction score."""
        rows = sorted(self.rows(), key=lambda r: -r["drop"])[:8]
        lines = [f"induction scores with each sender head {self.removed} (the largest drops)"]
        lines += [f"  {r['ablated']}: {r['head']} {r['induction_score']:.3f} -> {r['ablated_score']:.3f}" for r in rows]
        return "\n".join(lines)

    def figure(self):
        """Heatmap: ablated head (rows) by later head (columns), value = later head's induction score."""
        from interp.visualize import heatmap

        tg = self.targets()
        z = torch.stack([torch.stack([self.ablated[i, l, h] for l, h in tg]) for i in range(len(self.senders))]).cpu()
        base = ", ".join(f"{head_label(l, h)} {float(self.base[l, h]):.2f}" for l, h in tg)
        return heatmap(
            z,
            [head_label(*t) for t in tg],
            [head_label(*s) for s in self.senders],
            title=f"Induction score, sender head ablated ({self.path} path)<br><sup>sender head {self.removed};"
            f" unablated: {base}</sup>",
            colorscale="Blues",
            zmid=None,
            zmin=0,
            zmax=1,
            text_fmt=".2f",
            x_title="measured head",
            y_title="sender head",
        )

    def table_html(self) -> str:
        return render_table(
            self.rows(),
            ["ablated", "path", "head", "induction_score", "ablated_score", "drop"],
            float_format=".3f",
            caption=f"sender head {self.removed}",
        )


def ablation_induction_test(
    model: HookedTransformer,
    data: TaskData | Int[Tensor, "batch pos"],
    *,
    senders: object = None,
    layers: Sequence[int] | None = None,
    path: str = "all",
    device: str | None = None,
) -> AblationTest:
    """Remove each sender head (default: every head of the first of ``layers``, layer 0 by default; all senders in
    one layer) along ``path`` and measure every later head's induction score on ``data`` (token ids or task data),
    all in one batched forward pass (the batch repeated once per sender).

    ``path="all"`` zero-ablates the head (:func:`interp.ablation.ablation_hooks`). ``"query"``, ``"key"``,
    ``"value"`` subtract the head's output ``z W_O`` only from that input of every later layer's heads
    (TransformerLens' split Q/K/V inputs, ``hook_q_input`` etc., before ``ln1``), leaving its other paths intact."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if path not in PATHS:
        raise InterpError(f"unknown path {path!r}; expected one of {PATHS}")
    if senders is None:
        if layers is not None and len(layers) != 1:
            raise HeadError(f"layers= names the one layer whose heads are removed, e.g. layers=[0]; got {layers!r}")
        layer = 0 if layers is None else int(next(iter(layers)))
        heads = [(layer, h) for h in range(n_heads)] if 0 <= layer < n_layers else []
    else:
        heads = one_set(senders, n_layers, n_heads, name="senders")
        layer = heads[0][0]
        if layers is not None and [int(l) for l in layers] != [layer]:
            raise HeadError(f"the senders are in layer {layer}, but layers={layers!r} was given")
    if not 0 <= layer < n_layers - 1:
        raise HeadError(
            f"the ablated layer must have a later layer to measure; this model has layers 0..{n_layers - 1}, "
            f"got layer {layer}"
        )
    if any(l != layer for l, _ in heads):
        raise HeadError(f"all ablated heads must be in layer {layer}, got {[head_label(*h) for h in heads]}")
    tokens = _tokens_of(model, data, device)
    dev = tokens.device
    n_sub = len(heads) + 1  # subset 0: nothing removed
    b = tokens.shape[0]
    keep = 1 - head_mask([[]] + [[hd] for hd in heads], n_layers, n_heads, dev)  # [n_sub, layer, head], 1 = kept
    row_keep = keep.repeat_interleave(b, 0)  # [n_sub * b, layer, head], subset-major
    if path == "all":
        pats = attention_patterns(model, tokens.repeat(n_sub, 1), fwd_hooks=ablation_hooks(model, row_keep))
    else:
        pats = _path_ablated_patterns(model, tokens.repeat(n_sub, 1), layer, row_keep[:, layer], path)
    masks = target_masks(tokens)
    scores = torch.stack(
        [
            scores_from_patterns(pats[i * b : (i + 1) * b], {"induction": masks["induction"]})["induction"]
            for i in range(n_sub)
        ]
    )
    return AblationTest(senders=heads, base=scores[0], ablated=scores[1:], layer=layer, path=path)


def _path_ablated_patterns(model: HookedTransformer, tokens, layer: int, keep: Float[Tensor, "batch head"], path: str):
    """Attention patterns with the outputs of the heads of ``layer`` that ``keep`` (per row; 1 = kept) leaves out
    subtracted from the ``path`` input of every later layer's heads. Turns TransformerLens' split Q/K/V inputs on for
    the call."""
    store = {}
    W_O = model.W_O[layer]  # [head, d_head, d_model]

    def keep_out(z, hook):
        store["out"] = torch.einsum("bphe,bh,hed->bpd", z, (1 - keep).to(z.dtype), W_O)
        return z

    def subtract(x, hook):  # [batch, pos, head, d_model]
        return x - store["out"][:, :, None, :]

    letter = path[0]
    hooks = [(f"blocks.{layer}.attn.hook_z", keep_out)]
    hooks += [(f"blocks.{l}.hook_{letter}_input", subtract) for l in range(layer + 1, model.cfg.n_layers)]
    was = model.cfg.use_split_qkv_input
    model.set_use_split_qkv_input(True)
    try:
        return attention_patterns(model, tokens, fwd_hooks=hooks)
    finally:
        model.set_use_split_qkv_input(was)
