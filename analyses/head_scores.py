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

from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.device import model_device
from interp.errors import HeadError, InterpError, TokenError
from interp.evaluate import check_tokens
from interp.heads import head_label, parse_heads
from interp.visualize import render_table

SCORES = ("induction", "prev_token", "duplicate", "bos")


def repeated_tokens(n_seqs: int, rep_len: int, n_symbols: int, *, n_repeats: int = 2, bos: int | None = None,
                    seed: int = 0, unique: bool = False, device=None) -> Int[Tensor, "batch pos"]:
    """``[BOS] R R ...`` (``n_repeats`` copies of ``R``, ``len(R) = rep_len``), R uniform over
    ``[0, n_symbols)``; ``unique=True`` draws R without replacement (no repeats inside R)."""
    if n_seqs < 1 or rep_len < 1 or n_repeats < 1 or n_symbols < 1:
        raise InterpError(f"need n_seqs, rep_len, n_repeats, n_symbols >= 1, got {n_seqs}, {rep_len}, {n_repeats}, {n_symbols}")
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


def task_repeated_tokens(model, n_seqs: int = 64, rep_len: int | None = None, seed: int = 0, unique: bool = False):
    """Repeated random tokens suited to ``model``: its task's symbols and [BOS] when it has a
    ``repeated-tokens`` task, else symbols ``[0, d_vocab_out)`` without BOS; ``rep_len`` defaults to
    the longest R that fits twice in the context."""
    task = getattr(model, "interp_task", None)
    if task is not None and getattr(task, "name", None) == "repeated-tokens":
        n_symbols, bos = task.n_symbols, task.bos
    else:
        n_symbols, bos = min(model.cfg.d_vocab, model.cfg.d_vocab_out), None
    room = model.cfg.n_ctx - (bos is not None)
    rep_len = rep_len or room // 2
    if 2 * rep_len > room:
        raise TokenError(f"two copies of R with len(R) = {rep_len} do not fit in the context n_ctx={model.cfg.n_ctx}")
    return repeated_tokens(n_seqs, rep_len, n_symbols, bos=bos, seed=seed, unique=unique, device=model_device(model))


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


def scores_from_patterns(patterns: Float[Tensor, "batch layer head q k"], masks: dict[str, Tensor]) -> dict[str, Tensor]:
    """Mean attention mass on each score's target keys over the queries that have a target: ``[layer, head]``."""
    out = {}
    for name, m in masks.items():
        valid = m.sum(-1) > 0  # [b, q]
        mass = torch.einsum("blhqk,bqk->blhq", patterns, m)
        out[name] = (mass * valid[:, None, None, :]).sum((0, 3)) / valid.sum().clamp(min=1)
    return out


@dataclass
class HeadScores:
    """Per-head scores ``[n_layers, n_heads]`` on the given tokens, with the tokens kept for reference."""

    induction: Float[Tensor, "layer head"]
    prev_token: Float[Tensor, "layer head"]
    duplicate: Float[Tensor, "layer head"]
    bos: Float[Tensor, "layer head"]
    tokens: Int[Tensor, "batch pos"] = field(repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.induction.shape)

    def best(self, score: str, layer: int | None = None) -> tuple[int, int]:
        """The (layer, head) with the highest ``score``, optionally within one layer."""
        s = getattr(self, score).clone()
        if layer is not None:
            keep = torch.zeros_like(s, dtype=torch.bool)
            keep[layer] = True
            s[~keep] = -1
        i = int(s.flatten().argmax())
        return divmod(i, s.shape[1])

    def rows(self) -> list[dict]:
        n_layers, n_heads = self.shape
        return [{"head": head_label(l, h), **{f"{s}_score": float(getattr(self, s)[l, h]) for s in SCORES}}
                for l in range(n_layers) for h in range(n_heads)]

    def figure(self):
        """Heatmap: scores (rows) by head (columns)."""
        from interp.visualize import heatmap

        n_layers, n_heads = self.shape
        z = torch.stack([getattr(self, s).flatten() for s in SCORES]).cpu()
        labels = [head_label(l, h) for l in range(n_layers) for h in range(n_heads)]
        return heatmap(z, labels, list(SCORES), title="Head scores on repeated random tokens", colorscale="Blues",
                       zmid=None, zmin=0, zmax=1, text_fmt=".2f")

    def _repr_html_(self) -> str:
        return render_table(self.rows(), ["head", *[f"{s}_score" for s in SCORES]], float_format=".3f")


def head_scores(model, tokens: Int[Tensor, "batch pos"] | None = None, chunk: int = 256) -> HeadScores:
    """Induction / previous-token / duplicate / BOS scores of every head, from one cached forward pass
    per chunk of ``tokens`` (default: 64 repeated-token sequences from :func:`task_repeated_tokens`)."""
    if tokens is None:
        tokens = task_repeated_tokens(model)
    tokens = torch.as_tensor(tokens).to(model_device(model))
    check_tokens(model, tokens)
    totals = None
    n_valid = None
    for start in range(0, tokens.shape[0], chunk):
        part = tokens[start:start + chunk]
        pats = attention_patterns(model, part)
        masks = target_masks(part)
        # accumulate sums, not means, so chunks weigh by their number of valid queries
        valid = {k: (m.sum(-1) > 0).sum() for k, m in masks.items()}
        sc = scores_from_patterns(pats, masks)
        sums = {k: sc[k] * valid[k] for k in sc}
        totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
        n_valid = valid if n_valid is None else {k: n_valid[k] + valid[k] for k in valid}
    res = {k: totals[k] / n_valid[k].clamp(min=1) for k in totals}
    return HeadScores(tokens=tokens, **res)


def attention_patterns(model, tokens: Int[Tensor, "batch pos"], fwd_hooks=()) -> Float[Tensor, "batch layer head q k"]:
    """Every layer's attention pattern from one forward pass (optionally with intervention hooks)."""
    store: dict[int, Tensor] = {}

    def keep(pattern, hook):
        store[hook.layer()] = pattern

    names = [(f"blocks.{l}.attn.hook_pattern", keep) for l in range(model.cfg.n_layers)]
    with torch.inference_mode():
        model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks) + names, return_type=None)
    return torch.stack([store[l] for l in range(model.cfg.n_layers)], dim=1)


@dataclass
class AblationTest:
    """K-composition causal test: induction scores ``[layer, head]`` with nothing ablated (``base``) and with
    each source head zero-ablated (``ablated[i]`` for ``sources[i]``)."""

    sources: list[tuple[int, int]]
    base: Float[Tensor, "layer head"]
    ablated: Float[Tensor, "source layer head"]
    layer: int

    @property
    def drop(self) -> Float[Tensor, "source layer head"]:
        return self.base[None] - self.ablated

    def targets(self) -> list[tuple[int, int]]:
        n_layers, n_heads = self.base.shape
        return [(l, h) for l in range(self.layer + 1, n_layers) for h in range(n_heads)]

    def rows(self) -> list[dict]:
        """One row per (ablated head, later head): the later head's induction score before and after."""
        return [{"ablated": head_label(*s), "head": head_label(l, h), "induction_score": float(self.base[l, h]),
                 "ablated_score": float(self.ablated[i, l, h]), "drop": float(self.drop[i, l, h])}
                for i, s in enumerate(self.sources) for l, h in self.targets()]

    def figure(self):
        """Heatmap: ablated head (rows) by later head (columns), value = later head's induction score."""
        from interp.visualize import heatmap

        tg = self.targets()
        z = torch.stack([torch.stack([self.ablated[i, l, h] for l, h in tg]) for i in range(len(self.sources))]).cpu()
        base = " / ".join(f"{head_label(l, h)} {float(self.base[l, h]):.2f}" for l, h in tg)
        return heatmap(z, [head_label(*t) for t in tg], [head_label(*s) for s in self.sources],
                       title=f"Induction score after zero-ablating each head (unablated: {base})", colorscale="Blues",
                       zmid=None, zmin=0, zmax=1, text_fmt=".2f", x_title="measured head", y_title="ablated head")

    def _repr_html_(self) -> str:
        return render_table(self.rows(), ["ablated", "head", "induction_score", "ablated_score", "drop"], float_format=".3f")


def ablation_induction_test(model, tokens: Int[Tensor, "batch pos"] | None = None, layer: int = 0,
                            sources=None) -> AblationTest:
    """Zero-ablate each head of ``layer`` (or the given ``sources``, all in that layer) and measure every
    later head's induction score, all in one batched forward pass (a mask with a subset axis on ``hook_z``)."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if not 0 <= layer < n_layers - 1:
        raise HeadError(f"the ablated layer must have a later layer to measure; this model has layers 0..{n_layers - 1}, "
                        f"got layer {layer}")
    heads = [(layer, h) for h in range(n_heads)] if sources is None else parse_heads(sources, n_layers, n_heads)
    if any(l != layer for l, _ in heads):
        raise HeadError(f"all ablated heads must be in layer {layer}, got {[head_label(*h) for h in heads]}")
    if tokens is None:
        tokens = task_repeated_tokens(model)
    dev = model_device(model)
    tokens = torch.as_tensor(tokens).to(dev)
    check_tokens(model, tokens)
    n_sub = len(heads) + 1  # subset 0: nothing ablated
    keep = torch.ones(n_sub, n_heads, device=dev)
    for i, (_, h) in enumerate(heads):
        keep[i + 1, h] = 0.0
    b = tokens.shape[0]
    row_keep = keep.repeat_interleave(b, 0)  # [n_sub * b, n_heads], subset-major

    def ablate(z, hook):
        return z * row_keep[:, None, :, None]

    big = tokens.repeat(n_sub, 1)
    pats = attention_patterns(model, big, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate)])
    masks = target_masks(tokens)
    scores = torch.stack([scores_from_patterns(pats[i * b:(i + 1) * b], {"induction": masks["induction"]})["induction"]
                          for i in range(n_sub)])
    return AblationTest(sources=heads, base=scores[0], ablated=scores[1:], layer=layer)


def attention_view(model, tokens: Int[Tensor, "pos"], heads=None, token_strs=None, title: str = ""):
    """A circuitsvis view (:class:`interp.visualize.AttentionView`) of ``heads`` (default: all) on one sequence;
    displays inline in Jupyter and ``.save(path)`` writes an offline HTML file."""
    from interp.visualize import AttentionView

    tokens = torch.as_tensor(tokens)
    if tokens.ndim == 2 and tokens.shape[0] == 1:
        tokens = tokens[0]
    if tokens.ndim != 1:
        raise TokenError(f"attention_view takes one sequence [pos], got shape {tuple(tokens.shape)}")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)] if heads is None else parse_heads(heads, n_layers, n_heads)
    tokens = tokens.to(model_device(model))
    check_tokens(model, tokens[None])
    pats = attention_patterns(model, tokens[None])[0]  # [layer, head, q, k]
    pattern = torch.stack([pats[l, h] for l, h in heads])
    if token_strs is None:
        task = getattr(model, "interp_task", None)
        token_strs = task.vocab.decode(tokens) if task is not None else [str(int(t)) for t in tokens]
    return AttentionView(token_strs, pattern, [head_label(*h) for h in heads], title=title)
