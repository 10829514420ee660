"""Repeated tokens' hypotheses: induction (Elhage et al. 2021, *A Mathematical Framework for Transformer Circuits*;
Olsson et al. 2022, *In-context Learning and Induction Heads*).

The causal model: ``prev``, a positional variable, is the token before each position (what a previous-token head
writes there), and the output ``next`` at the query is the token at the latest position ``k`` whose ``prev`` equals
the query token (the token that followed the previous occurrence).

``prev``: is the previous token in layer 0's head output at the key position? Pairs are built per example
(:func:`key_swap_pairs`): the query is the last position of the second copy of ``R`` whose token occurs once before
it, the key ``k`` the position after that occurrence, and the source is the base with the tokens before two positions
exchanged: before the key and before a random decoy position whose token differs from the key's (half the pairs:
the output should become the decoy's token), or before two decoys whose previous tokens differ (the other half: the
source differs from the base, the output should not move). The sites patch both positions.

``next``: the output itself, interchanged between random sequences at the query (the data's answer position):
which site decides what is copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from interp.analyses.hypotheses import CausalModel, Hypothesis, Variable
from interp.errors import TaskError
from interp.heads import head_label

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task, TaskData


def _prev(tokens):
    return torch.cat([torch.full_like(tokens[:, :1], -1), tokens[:, :-1]], 1)


def _follows(tokens, prev, query):
    """The token at the latest position ``k <= query`` whose ``prev`` is the query token (-1 where none is)."""
    rows = torch.arange(len(tokens), device=tokens.device)
    x = tokens[rows, query]
    pos = torch.arange(tokens.shape[1], device=tokens.device)[None]
    match = (prev == x[:, None]) & (pos <= query[:, None]) & (pos >= 1)
    k = torch.where(match, pos, torch.full_like(pos, -1)).max(1).values
    return torch.where(k >= 0, tokens[rows, k.clamp(min=0)], torch.full_like(k, -1))


def prev_model() -> CausalModel:
    """``prev`` per position; ``next`` at the query ``query_pos``."""
    return CausalModel(
        {
            "prev": Variable(_prev, parents=("tokens",), positional=True),
            "next": Variable(_follows, parents=("tokens", "prev", "query_pos")),
        },
        output="next",
        readout="query",
        positions={"query": lambda d: d.fields["query_pos"], "keys": lambda d: d.fields["keys"]},
        name="prev",
        about="a layer-0 head writes the previous token at each position; the induction head copies the token whose "
        "previous token is the query's",
    )


def next_model() -> CausalModel:
    """``next`` (the token after the query token's previous occurrence) at the data's answer position."""
    return CausalModel(
        {"next": Variable(lambda tokens, answer_pos: _follows(tokens, _prev(tokens), answer_pos))},
        output="next",
        name="next",
        about="the token that followed the previous occurrence of the current token",
    )


def key_swap_pairs(data: TaskData, n: int, seed: int) -> tuple[TaskData, TaskData]:
    """``n`` (base, source) pairs for ``prev`` (see the module docstring), seeded; fields ``query_pos`` and ``keys``
    (``[batch, 2]``: the positions patched) on both."""
    tokens, rep = data.tokens.cpu(), data.fields["repeat_len"].cpu()
    q = 2 * rep - 1  # the second copy's last position but one predicts its last token
    rows = torch.arange(len(tokens))
    x = tokens[rows, q]
    once = ((tokens == x[:, None]) & (torch.arange(tokens.shape[1])[None] < q[:, None])).sum(1) == 1
    ok = once.nonzero().squeeze(1)
    if len(ok) == 0:
        raise TaskError("no example has a query token that occurs once before it; cannot build key-swap pairs")
    gen = torch.Generator().manual_seed(int(seed))
    pick = ok[torch.randint(0, len(ok), (n,), generator=gen)]
    base_tok = tokens[pick].clone()
    qp, r = q[pick], rep[pick]
    key = qp - r + 1  # after the one earlier occurrence (at q - rep)
    keys = torch.zeros(n, 2, dtype=torch.long)
    src_tok = base_tok.clone()
    for i in range(n):
        t, k = base_tok[i], int(key[i])
        cands = [p for p in range(2, int(qp[i]) + 1) if p != k]
        if i % 2 == 0:  # the key and a decoy whose token differs from the key's: the output moves
            pool = [p for p in cands if p != k - 1 and t[p] != t[k]] or cands
            first, second = k, pool[int(torch.randint(0, len(pool), (1,), generator=gen))]
        else:  # two decoys with different previous tokens: the source differs, the output stays
            first = cands[int(torch.randint(0, len(cands), (1,), generator=gen))]
            pool = [p for p in cands if p != first and t[p - 1] != t[first - 1]] or [p for p in cands if p != first]
            second = pool[int(torch.randint(0, len(pool), (1,), generator=gen))]
        keys[i] = torch.tensor([first, second])
        p0, p1 = keys[i] - 1
        src_tok[i, p0], src_tok[i, p1] = base_tok[i, p1], base_tok[i, p0]
    base = data.select(pick.to(data.device))
    source = data.select(pick.to(data.device))
    source.tokens = src_tok.to(data.device)
    for d in (base, source):
        d.fields["query_pos"] = qp.to(data.device)
        d.fields["keys"] = keys.to(data.device)
    return base, source


def _prev_sites(model: HookedTransformer) -> list[str]:
    cfg = model.cfg
    return [
        *(f"{head_label(0, h)}@keys" for h in range(cfg.n_heads)),
        "L0H*@keys",
        "attn_out.0@keys",
        "resid_pre.0@keys",
    ]


def _next_sites(model: HookedTransformer) -> list[str]:
    cfg = model.cfg
    heads = [f"{head_label(layer, h)}@answer" for layer in range(cfg.n_layers) for h in range(cfg.n_heads)]
    return [*heads, *(f"resid_post.{layer}@answer" for layer in range(cfg.n_layers))]


def hypotheses(task: Task) -> dict[str, Hypothesis]:
    return {
        "prev": Hypothesis(
            prev_model(), "prev", _prev_sites, "L0H*@keys", about=prev_model().about, pairs=key_swap_pairs
        ),
        "next": Hypothesis(
            next_model(),
            "next",
            _next_sites,
            lambda m: f"resid_post.{m.cfg.n_layers - 1}@answer",
            about=next_model().about,
        ),
    }
