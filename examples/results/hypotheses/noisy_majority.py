"""The shipped noisy-majority model (1 layer, 16 heads of d_head 2, no positions): is ``diff = n0 - n1`` (or only its
sign) carried by the heads the analyses single out, in one direction?

    python examples/results/hypotheses/noisy_majority.py OUT.json [--pairs=1000] [--steps=300]

1. The shipped hypothesis ``diff`` (``interp hypothesis noisy-majority diff --das 1``): IIA of each head's output at
   '=' alone, of all 16 together, of the residual stream after the layer, and DAS: a 1-dimensional subspace of the
   16 heads' outputs together (32 dimensions), trained on half of the test sentences, beside 10 random directions.
2. Beside each head: its separation accuracy, w01 and w02 (``head_summary``, fitted on the train split).
3. Magnitude or sign: the answer reads only the sign, so interchanging ``diff`` and interchanging ``sign`` predict the
   same counterfactual answers. An **additive interchange** tells them apart: along the learned direction ``B``, the
   base's heads get ``z_b + B Bᵀ (z_s1 - z_s2)`` from two sources. If the direction holds ``v`` linearly, the answer
   becomes that of ``v_b + v_s1 - v_s2``; scored for ``v`` = diff, the share ``diff / n`` (n the number of digits:
   attention averages) and the sign (which moves only when the two sources' signs differ). Triples drawn with seed 0
   from the test split, half of them with ``s1`` and ``s2`` of opposite signs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from interp.analyses import head_summary, suite_for
from interp.analyses.hypotheses import evaluate_hypothesis
from interp.analyses.hypotheses.engine import query_activations
from interp.tasks import load_checkpoint
from interp.tasks.noisy_majority import FIVE, FOUR


def answers_of(model, z_eq: torch.Tensor, resid_eq: torch.Tensor) -> torch.Tensor:
    """The answer (argmax) of a one-layer attention-only model from its heads' outputs at '=' ``[n, head, d_head]``."""
    attn = model.blocks[0].attn
    resid = resid_eq + torch.einsum("nhe,hed->nd", z_eq, attn.W_O) + attn.b_O
    return model.unembed(resid[:, None])[:, 0].argmax(-1)


def additive(model, data, basis: torch.Tensor, n: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        at = data.answer_pos[:, None]
        z = query_activations(model, data.tokens, at, "z")[:, 0]  # [N, head, d_head]
        x = query_activations(model, data.tokens, at, "resid_pre")[:, 0]
    f = data.fields
    diff = (f["n0"] - f["n1"]).double()
    share = diff / f["n_digits"].clamp(min=1).double()
    sign = (diff >= 0).double()
    N = len(data)
    b = torch.randint(0, N, (8 * n,), generator=gen)
    s1 = torch.randint(0, N, (8 * n,), generator=gen)
    s2 = torch.randint(0, N, (8 * n,), generator=gen)
    opposite = sign[s1] != sign[s2]
    pick = torch.cat([opposite.nonzero()[: n // 2, 0], (~opposite).nonzero()[: n - n // 2, 0]])
    b, s1, s2 = b[pick], s1[pick], s2[pick]
    B = basis.to(z.dtype)
    flat = z.flatten(1)
    delta = ((flat[s1] - flat[s2]) @ B) @ B.T
    with torch.no_grad():
        got = answers_of(model, (flat[b] + delta).view_as(z[b]), x[b])
    out = {"triples": len(b), "opposite_signs": int(opposite[pick].sum())}

    def ans(v):
        return torch.where(v >= 0, FOUR, FIVE)

    preds = {
        "diff": ans(diff[b] + diff[s1] - diff[s2]),
        "share": ans(share[b] + share[s1] - share[s2]),
        "sign": torch.where(sign[s1] != sign[s2], ans(sign[s1] - 0.5), ans(diff[b])),
    }
    moved = got != ans(diff[b])
    for name, p in preds.items():
        ok = got == p
        out[name] = {
            "iia": float(ok.float().mean()),
            "iia_where_it_predicts_a_change": float(ok[p != ans(diff[b])].float().mean()),
            "predicts_change": float((p != ans(diff[b])).float().mean()),
        }
    out["network_moved"] = float(moved.float().mean())
    coord = flat @ B[:, 0]
    for name, v in (("diff", diff), ("share", share), ("sign", sign)):
        c = torch.corrcoef(torch.stack([coord.double(), v]))[0, 1]
        out[f"r2_coordinate_{name}"] = float(c * c)
    return out


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    opts = {a.split("=", 1)[0][2:]: a.split("=", 1)[1] for a in argv if a.startswith("--")}
    out = Path(next(a for a in argv if not a.startswith("--")))
    pairs, steps = int(opts.get("pairs", 1000)), int(opts.get("steps", 300))
    ck = load_checkpoint("noisy-majority", device="cpu")
    model, task = ck.model, ck.task
    test, train = task.dataset("test"), task.dataset("train")
    hyp = suite_for(task).hypotheses(task)["diff"]
    res = evaluate_hypothesis(model, test, hypothesis=hyp, das=1, pairs=pairs, steps=steps)
    print(res.text())
    summ = head_summary(model, test, train=train)
    sd = summ.to_dict()
    heads = {h["head"]: h for h in sd["heads"]}
    rows = res.rows()
    table = []
    for h in range(model.cfg.n_heads):
        label = f"L0H{h}"
        r = next(x for x in rows if x["site"] == f"{label}@answer")
        hd = heads[label]
        table.append(
            {
                "head": label,
                "iia": r["iia"],
                "iia_changed": r["iia_changed"],
                "separation": hd["separation_accuracy"],
                "roc_auc": hd["roc_auc"],
                "learned_accuracy": hd["learned_accuracy"],
                "w01": hd["w01"],
                "w02": hd["w02"],
                "verdict": hd["verdict"],
            }
        )
    for t in table:
        print(t)
    basis = res.das[0]["basis"]
    add = additive(model, test, basis, n=pairs)
    print(json.dumps(add, indent=1))
    result = {"hypothesis": res.to_dict(), "heads": table, "additive": add}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)


if __name__ == "__main__":
    main(sys.argv[1:])
