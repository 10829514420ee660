"""The plain interchange loop the benchmark times the batched engine against: one ``run_with_cache`` of the source
and one ``run_with_hooks`` of the base per (pair, alignment), each sequence at its own length, its own hooks (none of
:mod:`.engine`'s code). Not part of the public namespace."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from torch import Tensor

from .sites import Site

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import TaskData


def interchange_loop(
    model: HookedTransformer,
    base: TaskData,
    source: TaskData,
    alignments: Sequence[Sequence[tuple[Site, Tensor, Tensor]]],
    readout: Int[Tensor, " pair"],
) -> Tensor:
    """``[alignment, pair]`` predictions: alignment ``a`` patches each ``(site, base_pos [pair], source_pos
    [pair])`` of ``alignments[a]`` from the source run of the same pair."""
    preds = torch.empty(len(alignments), len(base), dtype=torch.long)
    with torch.no_grad():
        for i in range(len(base)):
            b = base.tokens[i : i + 1, : int(base.lengths[i])]
            _, cache = model.run_with_cache(source.tokens[i : i + 1, : int(source.lengths[i])])
            for a, sites in enumerate(alignments):
                hooks = []
                for site, bpos, spos in sites:
                    src = cache[site.hook_name][0, int(spos[i])]
                    if site.hook == "z":
                        src = src[list(site.heads)]

                    def hook(act, hook, site=site, bp=int(bpos[i]), src=src):
                        act = act.clone()
                        if site.hook == "z":
                            cur = act[0, bp, list(site.heads)]
                            new = src.flatten()
                            if site.basis is not None:
                                c = cur.flatten()
                                new = c + site.basis @ (site.basis.T @ (new - c))
                            act[0, bp, list(site.heads)] = new.view_as(cur)
                        else:
                            cur = act[0, bp]
                            new = src if site.basis is None else cur + site.basis @ (site.basis.T @ (src - cur))
                            act[0, bp] = new
                        return act

                    hooks.append((site.hook_name, hook))
                logits = model.run_with_hooks(b, fwd_hooks=hooks)
                preds[a, i] = int(logits[0, int(readout[i])].argmax())
    return preds
