"""The shipped integer-addition model (2 layers, 4 heads, MLPs; 5-digit operands, answer units first): where are the
carries? (Quirke and Barez 2024, *Understanding Addition in Transformers*: base add, make carry 1 (MC1), make sum 9
(MS9) and sum-9 cascades.)

    python examples/results/hypotheses/integer_addition.py OUT.json [--pairs=1000] [--steps=300]

For each answer digit k = 1 .. 5, the shipped hypothesis ``carry{k}`` (``interp hypothesis integer-addition
carryK --das 1``): IIA of the carry into digit k at every head and every layer's attention and MLP outputs where
digit k is predicted, at the residual stream after each layer there and after the last layer one position earlier,
and DAS (a 1-dimensional subspace of the residual stream between the layers where digit k is predicted). The pairs
come from the test split (uniform sums) and the cascades split together, so that carries passed through sum-9
cascades are common; each changing pair is also classed by how the source makes its carry into digit k (MC1: the
pair below sums to 10 or more; MS9 cascade: the pair below sums to 9 and passes a carry on) and the IIA is given per
class.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from interp.analyses import suite_for
from interp.analyses.hypotheses import evaluate_hypothesis
from interp.tasks import load_checkpoint
from interp.tasks.integer_addition import make_sums


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    opts = {a.split("=", 1)[0][2:]: a.split("=", 1)[1] for a in argv if a.startswith("--")}
    out = Path(next(a for a in argv if not a.startswith("--")))
    pairs, steps = int(opts.get("pairs", 1000)), int(opts.get("steps", 300))
    ck = load_checkpoint("integer-addition", device="cpu")
    model, task = ck.model, ck.task
    parts = [task.dataset("test"), task.dataset("cascades")]
    f = {k: torch.cat([p.fields[k] for p in parts]) for k in ("a", "b", "n_digits")}
    data = make_sums(f["a"], f["b"], f["n_digits"], reverse_answer=task.reverse_answer)
    hyps = suite_for(task).hypotheses(task)
    result = {}
    for k in range(1, task.test_range[1] + 1):
        res = evaluate_hypothesis(model, data, hypothesis=hyps[f"carry{k}"], das=1, pairs=pairs, steps=steps)
        print(res.text())
        # how the changing pairs' sources make their carry into k: the pair below (k - 1) is MC1 (2) or MS9 (1)
        kind = data.fields["pair_kind"][:, k - 1]
        src_kind = kind[res.source_index]
        base_kind = kind[res.base_index]
        by_class = {}
        for name, code in (("MC1", 2), ("MS9", 1), ("base", 0)):
            for who, kinds in (("source", src_kind), ("base", base_kind)):
                sel = res.changed[0] & (kinds == code)
                if int(sel.sum()) == 0:
                    continue
                by_class[f"{who} {name}"] = {
                    "pairs": int(sel.sum()),
                    "iia": {lab: float(res.correct[i][sel].float().mean()) for i, lab in enumerate(res.labels)},
                }
        result[f"carry{k}"] = {"result": res.to_dict(), "by_class": by_class}
        for cls, v in by_class.items():
            best = max(v["iia"].items(), key=lambda kv: kv[1])
            das = next(x for x in v["iia"].items() if "DAS" in x[0])
            print(f"  changing pairs, {cls} ({v['pairs']}): best site {best[0]} {best[1]:.3f}; {das[0]} {das[1]:.3f}")
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)


if __name__ == "__main__":
    main(sys.argv[1:])
