"""Q-, K- and V-composition scores between heads (Elhage et al.), via TransformerLens, with a random baseline.

The score of an earlier head ``A`` into a later head ``B`` is ``|W_OV^A W^B|_F / (|W_OV^A|_F |W^B|_F)`` with
``W^B`` = ``W_QK^B`` (Q), ``W_QK^B`` transposed (K) or ``W_OV^B`` (V): how much of what ``A`` writes lands in the
subspace ``B`` reads. It lies in [0, 1] and ignores the scale of either matrix. We take the numbers from
``HookedTransformer.all_composition_scores`` (raw weights: no LayerNorm folding, no biases).

Random low-rank matrices already score about ``1 / sqrt(d_model)`` (peers.md R5), so a score means
something only against that baseline: :func:`random_baseline` draws independent Gaussian factors with the
model's shapes (``d_model x d_head`` times ``d_head x d_model``) and scores them the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.attention import layer_attention, sync
from interp.device import check_device
from interp.errors import InterpError
from interp.heads import head_label
from interp.results import Result, floats, head_of, jsonable

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

MODES = ("Q", "K", "V")


def random_baseline(
    d_model: int, d_head: int, *, n_samples: int = 1000, seed: int = 0, device=None
) -> tuple[float, float]:
    """Mean and standard deviation of the composition score of independent random Gaussian factor pairs
    (``[d_model, d_head] @ [d_head, d_model]``), computed with TransformerLens' ``composition_scores``."""
    from transformer_lens import FactoredMatrix
    from transformer_lens.utilities import composition_scores

    if d_model < 1 or d_head < 1 or n_samples < 2:
        raise InterpError(
            f"random_baseline needs d_model, d_head >= 1 and n_samples >= 2, got {d_model}, {d_head}, {n_samples}"
        )
    gen = torch.Generator().manual_seed(seed)
    a1, b1, a2, b2 = (
        torch.randn(n_samples, *shape, generator=gen).to(device)  # CPU generator: same numbers everywhere
        for shape in ((d_model, d_head), (d_head, d_model)) * 2
    )
    s = composition_scores(FactoredMatrix(a1, b1), FactoredMatrix(a2, b2), broadcast_dims=False)
    return float(s.mean()), float(s.std())


@dataclass(eq=False)
class CompositionScores(Result):
    """Scores ``[layer1, head1, layer2, head2]`` per mode (zero unless layer2 > layer1), and the random
    baseline for this model's shapes."""

    Q: Float[Tensor, "l1 h1 l2 h2"]
    K: Float[Tensor, "l1 h1 l2 h2"]
    V: Float[Tensor, "l1 h1 l2 h2"]
    baseline_mean: float
    baseline_std: float

    @property
    def n_layers(self) -> int:
        return self.K.shape[0]

    @property
    def n_heads(self) -> int:
        return self.K.shape[1]

    def scores(self, mode: str) -> Tensor:
        if mode not in MODES:
            raise InterpError(f"composition mode must be one of {MODES}, got {mode!r}")
        return getattr(self, mode)

    def pairs(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Every (earlier head, later head) pair, in layer order."""
        L, H = self.n_layers, self.n_heads
        return [
            ((l1, h1), (l2, h2)) for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L) for h2 in range(H)
        ]

    def z_score(self, mode: str) -> Tensor:
        """How many baseline standard deviations above the baseline mean each score lies."""
        return (self.scores(mode) - self.baseline_mean) / max(self.baseline_std, 1e-12)

    def top_pairs(self, mode: str = "K", k: int = 5) -> list[dict]:
        """The ``k`` highest-scoring pairs as rows ``{from, to, score, ratio_to_baseline, z}``."""
        s = self.scores(mode)
        rows = [
            {
                "from": head_label(*a),
                "to": head_label(*b),
                "mode": mode,
                "score": float(s[a + b]),
                "ratio_to_baseline": float(s[a + b]) / self.baseline_mean,
                "z": (float(s[a + b]) - self.baseline_mean) / max(self.baseline_std, 1e-12),
            }
            for a, b in self.pairs()
            if not math.isnan(float(s[a + b]))  # Q/K scores into a layer whose pooling is not q·k are undefined
        ]
        return sorted(rows, key=lambda r: -r["score"])[:k]

    def matrix(self, mode: str = "K") -> tuple[Tensor, list[str], list[str]]:
        """Scores as ``[earlier heads, later heads]`` (layers 0..L-2 by layers 1..L-1), with labels."""
        L, H = self.n_layers, self.n_heads
        rows = [(l, h) for l in range(L - 1) for h in range(H)]
        cols = [(l, h) for l in range(1, L) for h in range(H)]
        s = self.scores(mode)
        z = torch.tensor([[float(s[a + b]) for b in cols] for a in rows])
        return z, [head_label(*r) for r in rows], [head_label(*c) for c in cols]

    def mode_figure(self, mode: str = "K"):
        """Heatmap of one mode's scores, earlier heads (rows) by later heads (columns)."""
        from interp.visualize import heatmap

        if self.n_layers < 2:
            raise InterpError("a one-layer model has no head composition to draw")
        z, rows, cols = self.matrix(mode)
        return heatmap(
            z,
            cols,
            rows,
            colorscale="Blues",
            zmid=None,
            zmin=0,
            zmax=max(float(z.max()), 2 * self.baseline_mean),
            text_fmt=".2f",
            x_title="later head",
            y_title="earlier head",
            title=f"{mode}-composition scores (random baseline {self.baseline_mean:.3f} ± {self.baseline_std:.3f})",
        )

    def to_dict(self) -> dict:
        L, H = self.n_layers, self.n_heads
        return jsonable(
            {
                "head_labels": [head_label(l, h) for l in range(L) for h in range(H)],
                "baseline_mean": self.baseline_mean,
                "baseline_std": self.baseline_std,
                **{m: self.scores(m).reshape(L * H, L * H) for m in MODES},
                "top_K": self.top_pairs("K", 5),
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> CompositionScores:
        heads = [head_of(h) for h in d["head_labels"]]
        L, H = max(l for l, _ in heads) + 1, max(h for _, h in heads) + 1
        return cls(
            **{m: floats(d[m]).reshape(L, H, L, H) for m in MODES},
            baseline_mean=d["baseline_mean"],
            baseline_std=d["baseline_std"],
        )

    def text(self) -> str:
        """The random baseline and the top pairs of each mode."""
        lines = [
            f"Q/K/V composition scores of {self.n_layers} layer(s) x {self.n_heads} heads; random baseline "
            f"{self.baseline_mean:.3f} ± {self.baseline_std:.3f}"
        ]
        if self.n_layers < 2:
            return lines[0] + " (one layer: no composition)"
        for m in MODES:
            pairs = ", ".join(f"{r['from']}->{r['to']} {r['score']:.3f} (z {r['z']:.1f})" for r in self.top_pairs(m, 3))
            lines.append(f"  {m}: {pairs}")
        return "\n".join(lines)

    def figure(self, mode: str = "K"):
        return None if self.n_layers < 2 else self.mode_figure(mode)

    def table_html(self) -> str:
        from interp.visualize import render_table

        rows = [r for m in MODES for r in self.top_pairs(m, 3)]
        return render_table(
            rows,
            ["mode", "from", "to", "score", "ratio_to_baseline", "z"],
            float_format=".3f",
            caption=f"random baseline {self.baseline_mean:.3f} ± {self.baseline_std:.3f}",
        )


def composition_scores(
    model: HookedTransformer, *, n_baseline: int = 1000, seed: int = 0, device: str | None = None
) -> CompositionScores:
    """Q/K/V composition scores of every head pair (TransformerLens ``all_composition_scores``) plus the
    random baseline for ``d_model`` and ``d_head``. Q- and K-composition read the later head's bilinear score
    ``W_QK``; into a layer with linear or additive pooling (:mod:`interp.attention`), whose scores are no ``q·k``,
    they are undefined: NaN (V-composition stays defined)."""
    dev = check_device(model, device)
    sync(model)  # low-rank W_Q/W_K/W_V from their current factors
    with torch.inference_mode():
        s = {m: model.all_composition_scores(m).detach().clone() for m in MODES}
        for l in range(model.cfg.n_layers):
            if layer_attention(model, l).pooling != "softmax":  # its scores are no bilinear form q·k: Q/K undefined
                for m in ("Q", "K"):
                    s[m][:, :, l] = float("nan")
    mean, std = random_baseline(model.cfg.d_model, model.cfg.d_head, n_samples=n_baseline, seed=seed, device=dev)
    return CompositionScores(**s, baseline_mean=mean, baseline_std=std)
