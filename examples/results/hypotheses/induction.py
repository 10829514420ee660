"""The shipped induction model (``repeated-tokens``: 2 attention-only layers of 2 heads): is the previous token in
layer 0's head output at the key position?

    python examples/results/hypotheses/induction.py OUT.json [--pairs=1000] [--steps=300]

1. The shipped hypothesis ``prev`` (``interp hypothesis repeated-tokens prev``): pairs built per example (the key's
   previous token exchanged with a decoy position's in the source; half the pairs exchange two decoys instead), IIA
   of the previous-token variable at each layer-0 head's output at the two exchanged positions, at both heads
   together and at the whole attention output there; DAS of a 4-, 8- and 16-dimensional subspace of L0H1's output
   (``d_head`` 16: a token among 64 needs more than one direction).
2. Where the changing pairs fail, what the network predicts instead: the base's answer (the key's token, as if
   nothing was patched), the decoy's token (success), or something else; by the decoy's place (first or second copy
   of R).
3. The shipped hypothesis ``next`` (the token after the previous occurrence, the output itself), interchanged at
   each head's output and the residual stream at the answer position between random test sequences.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from interp.analyses import suite_for
from interp.analyses.hypotheses import evaluate_hypothesis
from interp.tasks import load_checkpoint


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    opts = {a.split("=", 1)[0][2:]: a.split("=", 1)[1] for a in argv if a.startswith("--")}
    out = Path(next(a for a in argv if not a.startswith("--")))
    pairs, steps = int(opts.get("pairs", 1000)), int(opts.get("steps", 300))
    ck = load_checkpoint("repeated-tokens", device="cpu")
    model, task = ck.model, ck.task
    test = task.dataset("test")
    hyps = suite_for(task).hypotheses(task)
    prev = evaluate_hypothesis(model, test, hypothesis=hyps["prev"], pairs=pairs)
    print(prev.text())
    # what the failing changing pairs predict instead (the base / source data are rebuilt as evaluate_hypothesis did)
    base, source = hyps["prev"].pairs(test, pairs, 0)
    from interp.analyses.hypotheses.engine import Engine, Patch
    from interp.analyses.hypotheses.sites import parse_site, resolve_positions

    cm = hyps["prev"].causal_model
    keys_b = resolve_positions("keys", base, cm.positions)
    keys_s = resolve_positions("keys", source, cm.positions)
    readout = base.fields["query_pos"]
    site = parse_site("L0H1@keys", model)
    eng = Engine(model, base, source, [[Patch(site, keys_b, keys_s)]], readout, source.fields["query_pos"])
    pred = eng.all_logits()[0].argmax(-1).cpu()
    cf = cm.interchange(base, source, "prev", keys_b, keys_s).cpu()
    base_out = cm.output_of(base).cpu()
    changed = cf != base_out
    rows = torch.arange(len(base))
    decoy = keys_b[:, 1].cpu()
    first_copy = decoy <= base.fields["repeat_len"].cpu()
    breakdown = {}
    for name, sel in (("all", changed), ("decoy in the first copy", changed & first_copy),
                      ("decoy in the second copy", changed & ~first_copy)):  # fmt: skip
        n = int(sel.sum())
        if n:
            breakdown[name] = {
                "pairs": n,
                "decoy token (success)": float((pred[sel] == cf[sel]).float().mean()),
                "key token (as unpatched)": float((pred[sel] == base_out[sel]).float().mean()),
                "other": float(((pred[sel] != cf[sel]) & (pred[sel] != base_out[sel])).float().mean()),
            }
    del rows
    print(json.dumps(breakdown, indent=1))
    das = {}
    for k in (4, 8, 16):
        r = evaluate_hypothesis(
            model, test, hypothesis=hyps["prev"], sites=["L0H1@keys"], das=k, pairs=pairs, steps=steps
        )
        rec = r.das[0]
        das[k] = {
            "heldout": rec["heldout_iia"],
            "train": rec["train_iia"],
            "random_mean": sum(rec["random_iia"]) / len(rec["random_iia"]),
            "whole": rec["whole_iia"],
            "heldout_changed": float(r.iia_changed[r.labels.index(next(x for x in r.labels if "DAS" in x))]),
            "seconds": rec["seconds"],
        }
        print(k, das[k])
    nxt = evaluate_hypothesis(model, test, hypothesis=hyps["next"], pairs=pairs)
    print(nxt.text())
    result = {"prev": prev.to_dict(), "prev_failures": breakdown, "prev_das": das, "next": nxt.to_dict()}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)


if __name__ == "__main__":
    main(sys.argv[1:])
