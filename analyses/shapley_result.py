"""Shapley values, Banzhaf values and pairwise Shapley interactions of heads from their coalition values (Fraknói
2024, §5.5, Definition 5.3), and their result.

For a value v on coalitions of n heads (:mod:`analyses.coalitions`), head i's Shapley value is

    phi_i = sum_{S not containing i} |S|! (n - |S| - 1)! / n!  (v(S + i) - v(S)),

its Banzhaf value the unweighted mean of the same marginal contributions, and the pairwise Shapley interaction
index of heads i, j

    I_ij = sum_{S without i, j} |S|! (n - |S| - 2)! / (n - 1)!  (v(S + i + j) - v(S + i) - v(S + j) + v(S))

(> 0: synergistic, the pair is worth more than its parts; < 0: redundant). All three are read off the Moebius
transform m of v (v(S) = sum_{T in S} m(T)), computed in place in O(n 2^n) by the fast subset-sum butterfly:
phi_i = sum_{T containing i} m(T) / |T|, beta_i = sum_{T containing i} m(T) / 2^(|T|-1),
I_ij = sum_{T containing i, j} m(T) / (|T| - 1). Efficiency holds by construction: sum_i phi_i = v(N) - v(empty).

This module holds the math and the result (no model is run here); :mod:`analyses.shapley` holds the entry that
computes them for a model, :mod:`analyses.coalitions` the coalition values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import InterpError
from interp.heads import Head, head_label
from interp.results import Result, floats, head_of, jsonable

# which direction of each built-in coalition value is better (None for a value of the caller's own)
HIGHER_IS_BETTER = {"learned-accuracy": True, "answer-loss": False, "logit-diff": True, "separation": True}


def bits_of(index: Int[Tensor, " coalition"], n: int) -> Tensor:
    """``[coalition, n]`` 0/1 matrix: bit ``i`` of each coalition index (``heads[i]`` kept)."""
    return (index[:, None] >> torch.arange(n, device=index.device)) & 1


def moebius(values: Float[Tensor, " coalition"]) -> Float[Tensor, " coalition"]:
    """The Moebius transform m of v over bitmask-indexed coalitions (``v(S) = sum_{T subset of S} m(T)``), by
    n butterflies: for each bit, subtract the value without the bit from the value with it."""
    n = _n_of(values)
    m = values.double().clone()
    for i in range(n):
        view = m.view(-1, 2, 1 << i)
        view[:, 1] -= view[:, 0]
    return m


def zeta(m: Float[Tensor, " coalition"]) -> Float[Tensor, " coalition"]:
    """The inverse of :func:`moebius`: ``v(S) = sum_{T subset of S} m(T)``."""
    n = _n_of(m)
    v = m.double().clone()
    for i in range(n):
        view = v.view(-1, 2, 1 << i)
        view[:, 1] += view[:, 0]
    return v


def _n_of(values: Tensor) -> int:
    size = values.numel()
    n = size.bit_length() - 1
    if values.dim() != 1 or size < 1 or (1 << n) != size:
        raise InterpError(f"expected v for all 2**n coalitions as one vector, got shape {tuple(values.shape)}")
    return n


def shapley_transform(values: Float[Tensor, " coalition"]) -> tuple[Tensor, Tensor, Tensor]:
    """Exact ``(shapley [n], banzhaf [n], interactions [n, n])`` from v of all 2**n coalitions (index = bitmask).
    The interaction matrix is symmetric with zeros on the diagonal."""
    n = _n_of(values)
    m = moebius(values)
    bits = bits_of(torch.arange(1 << n), n).double()  # [2^n, n]
    size = bits.sum(-1)
    safe = size.clamp_min(1)
    phi = bits.T @ (m / safe * (size > 0))
    banzhaf = bits.T @ (m / torch.pow(2.0, safe - 1) * (size > 0))
    w = torch.where(size >= 2, m / (size - 1).clamp_min(1), torch.zeros_like(m))
    inter = (bits * w[:, None]).T @ bits
    inter.fill_diagonal_(0.0)
    return phi, banzhaf, inter


@dataclass(eq=False)
class ShapleyResult(Result):
    """Shapley values of heads (exact, or sampled with a standard error), Banzhaf values and pairwise interactions
    (exact only; None when sampled). ``to_dict()`` is the JSON of ``interp shapley --json``."""

    heads: list[Head]
    shapley: Float[Tensor, " player"]
    banzhaf: Float[Tensor, " player"] | None
    interactions: Float[Tensor, "player player"] | None
    value: str
    v_all: float
    v_empty: float
    exact: bool = True
    stderr: Float[Tensor, " player"] | None = None
    samples: int | None = None
    info: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [head_label(*h) for h in self.heads]

    def __getitem__(self, head) -> float:
        """phi of one head (``'L0H3'`` or ``(0, 3)``)."""
        from interp.heads import parse_head

        h = parse_head(head, 10**6, 10**6)
        if h not in self.heads:
            raise InterpError(f"head {head_label(*h)} is not a player here; the players are {self.names}")
        return float(self.shapley[self.heads.index(h)])

    @property
    def efficiency_gap(self) -> float:
        """``sum(phi) - (v(all) - v(empty))``: 0 up to rounding when exact."""
        return float(self.shapley.sum()) - (self.v_all - self.v_empty)

    def ranking(self) -> list[str]:
        """Head names by Shapley value, most helpful first (lowest first for a value where lower is better)."""
        order = torch.argsort(self.shapley, descending=self.higher_is_better is not False, stable=True)
        return [self.names[i] for i in order.tolist()]

    def to_dict(self) -> dict:
        rows = []
        for i, name in enumerate(self.names):
            row = {"head": name, "shapley": self.shapley[i]}
            if self.banzhaf is not None:
                row["banzhaf"] = self.banzhaf[i]
            if self.stderr is not None:
                row["stderr"] = self.stderr[i]
            rows.append(row)
        out = {
            "value": self.value,
            "exact": self.exact,
            "v_all": self.v_all,
            "v_empty": self.v_empty,
            "heads": rows,
            "interactions": None if self.interactions is None else {"heads": self.names, "matrix": self.interactions},
            **self.info,
        }
        if self.samples is not None:
            out["samples"] = self.samples
        return jsonable(out)

    @classmethod
    def from_dict(cls, d: dict) -> ShapleyResult:
        rows = d["heads"]
        known = ("value", "exact", "v_all", "v_empty", "heads", "interactions", "samples")

        def column(key):
            return floats([r[key] for r in rows]) if rows and key in rows[0] else None

        inter = d["interactions"]
        return cls(
            [head_of(r["head"]) for r in rows],
            column("shapley"),
            column("banzhaf"),
            None if inter is None else floats(inter["matrix"]),
            d["value"],
            d["v_all"],
            d["v_empty"],
            exact=d["exact"],
            stderr=column("stderr"),
            samples=d.get("samples"),
            info={k: v for k, v in d.items() if k not in known},
        )

    @property
    def higher_is_better(self) -> bool | None:
        """Whether more of the value is better (None for a value of the caller's own)."""
        return HIGHER_IS_BETTER.get(self.value)

    def text(self) -> str:
        """A table: head, Shapley (± standard error), Banzhaf, most helpful first; then the pairs that help most
        together (synergy) and those that overlap most (redundancy), read in the value's direction."""
        kind = "exact" if self.exact else f"sampled, {self.samples} permutations"
        if "method_note" in self.info:
            kind += f"; {self.info['method_note']}"
        better = self.higher_is_better
        direction = {
            True: "higher is better",
            False: "lower is better: a helpful head has phi < 0",
            None: "direction unknown: phi > 0 adds to v",
        }[better]
        lines = [
            f"Shapley values of {len(self.heads)} heads, v = {self.value} ({direction}; {kind}): "
            f"v(all) = {self.v_all:.4f}, v(none) = {self.v_empty:.4f}, sum of phi = {float(self.shapley.sum()):.4f}"
        ]
        head = (
            f"{'head':<8}{'shapley':>10}"
            + (f"{'stderr':>10}" if self.stderr is not None else "")
            + (f"{'banzhaf':>10}" if self.banzhaf is not None else "")
        )
        lines.append(head)
        for i in torch.argsort(self.shapley, descending=better is not False, stable=True).tolist():
            line = f"{self.names[i]:<8}{float(self.shapley[i]):>10.4f}"
            if self.stderr is not None:
                line += f"{float(self.stderr[i]):>10.4f}"
            if self.banzhaf is not None:
                line += f"{float(self.banzhaf[i]):>10.4f}"
            lines.append(line)
        if self.interactions is not None and len(self.heads) >= 2:
            lines += self._pair_lines(better is not False)
        return "\n".join(lines)

    def _pair_lines(self, higher_is_better: bool) -> list[str]:
        """The three most synergistic pairs (together they help more than apart: I_ij > 0 where higher is better,
        I_ij < 0 for a loss) and the three most redundant (together they help less), each only where there is
        one of that sign."""
        iu = torch.triu_indices(len(self.heads), len(self.heads), 1)
        vals = self.interactions[iu[0], iu[1]]
        benefit = vals if higher_is_better else -vals
        out = []
        for label, sign in (("synergistic", 1.0), ("redundant", -1.0)):
            order = [
                k for k in torch.argsort(sign * benefit, descending=True).tolist() if sign * float(benefit[k]) > 1e-12
            ]
            pairs = ", ".join(
                f"{self.names[iu[0, k]]}+{self.names[iu[1, k]]} I = {float(vals[k]):+.4f}" for k in order[:3]
            )
            out.append(f"most {label} pairs: {pairs or 'none'}")
        return out

    def figure(self):
        """Bars of phi per head (with its standard error when sampled) and Banzhaf beside them; beside that, the
        pairwise interaction heatmap (exact results)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        both = self.interactions is not None
        fig = make_subplots(
            rows=1,
            cols=2 if both else 1,
            column_widths=[0.55, 0.45] if both else None,
            subplot_titles=["Shapley and Banzhaf values", "pairwise Shapley interaction"] if both else None,
        )
        err = None if self.stderr is None else dict(type="data", array=self.stderr.tolist())
        fig.add_trace(go.Bar(name="Shapley", x=self.names, y=self.shapley.tolist(), error_y=err), 1, 1)
        if self.banzhaf is not None:
            fig.add_trace(go.Bar(name="Banzhaf", x=self.names, y=self.banzhaf.tolist()), 1, 1)
        if both:
            lim = float(self.interactions.abs().max()) or 1.0
            fig.add_trace(
                go.Heatmap(
                    z=self.interactions.tolist(),
                    x=self.names,
                    y=self.names,
                    zmin=-lim,
                    zmax=lim,
                    colorscale="RdBu",
                    colorbar=dict(title="I_ij", x=1.02),
                    hovertemplate="%{y} + %{x}: %{z:.4f}<extra></extra>",
                ),
                1,
                2,
            )
            fig.update_yaxes(autorange="reversed", row=1, col=2)
        kind = "exact" if self.exact else f"{self.samples} sampled permutations"
        fig.update_layout(
            title=f"Heads' Shapley values, v = {self.value} ({kind}; v(all) = {self.v_all:.3f}, "
            f"v(none) = {self.v_empty:.3f})",
            barmode="group",
            template="plotly_white",
            height=420,
            width=1100 if both else 700,
        )
        return fig


def shapley_of_values(values) -> ShapleyResult:
    """Exact Shapley and Banzhaf values and pairwise interactions from v of all 2**n coalitions, a
    :class:`analyses.coalitions.CoalitionValues` (what its :meth:`~analyses.coalitions.CoalitionValues.shapley`
    returns; not imported here, so that coalitions can import this module)."""
    v = values.values.double().cpu()
    phi, banzhaf, inter = shapley_transform(v)
    if len(values.heads) != len(phi):
        raise InterpError(f"{len(values.heads)} heads were named for v over {len(phi)} players")
    info = {"ablation": values.ablation, "n_examples": values.n_examples, **values.info}
    return ShapleyResult(list(values.heads), phi, banzhaf, inter, values.value, float(v[-1]), float(v[0]), info=info)
