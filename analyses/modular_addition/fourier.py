"""The Fourier view of a modular-addition model (Nanda et al. 2023): the basis of functions on Z_p, the embedding's
norm per frequency, the key frequencies, each MLP neuron's frequency, and the neuron-logit map in that basis.

The model computes ``(a + b) mod p`` by rotations on circles: the embedding keeps a few *key frequencies* ``k``
(``cos(w a)``, ``sin(w a)`` with ``w = 2 pi k / p``), the MLP neurons form products of them, and ``W_out W_U`` reads
``cos(w (a + b - c))`` off into the logit of ``c``. Everything here works on any model of the task (the Fourier
basis and the key-frequency finder are plain functions of tensors, tested on synthetic embeddings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import InterpError, TaskError
from interp.results import Result, floats, jsonable

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task


def n_frequencies(p: int) -> int:
    """Frequencies 1 .. p // 2 (for even p the last has only a cosine)."""
    return p // 2


def fourier_basis(p: int, device=None, dtype=torch.float64) -> tuple[Float[Tensor, "component p"], list[str]]:
    """The orthonormal Fourier basis of functions on Z_p: rows ``const, cos 1, sin 1, cos 2, sin 2, ...``
    (``cos k`` is ``cos(2 pi k x / p)`` scaled to unit norm; for even ``p`` the last row is ``cos p/2``). Returns
    ``(basis [p, p], names)``; ``basis @ basis.T`` is the identity."""
    if not isinstance(p, int) or p < 2:
        raise InterpError(f"p must be an integer >= 2, got {p!r}")
    x = torch.arange(p, dtype=dtype, device=device)
    rows, names = [torch.ones(p, dtype=dtype, device=device)], ["const"]
    for k in range(1, n_frequencies(p) + 1):
        rows.append(torch.cos(2 * math.pi * k * x / p))
        names.append(f"cos {k}")
        if 2 * k != p:
            rows.append(torch.sin(2 * math.pi * k * x / p))
            names.append(f"sin {k}")
    basis = torch.stack(rows)
    return basis / basis.norm(dim=1, keepdim=True), names


def component_frequency(p: int) -> Tensor:
    """The frequency of each basis row (0 for ``const``)."""
    _, names = fourier_basis(p)
    return torch.tensor([0 if n == "const" else int(n.split()[1]) for n in names])


def frequency_energy(coeffs: Float[Tensor, "component ..."], p: int) -> Float[Tensor, " freq"]:
    """Squared coefficients summed per frequency ``0 .. p // 2`` (cos and sin together; all other dims summed)."""
    freq = component_frequency(p).to(coeffs.device)
    sq = coeffs.pow(2).reshape(coeffs.shape[0], -1).sum(-1)
    return torch.zeros(n_frequencies(p) + 1, dtype=sq.dtype, device=sq.device).index_add_(0, freq, sq)


def find_key_frequencies(
    energy: Float[Tensor, " freq"], max_keys: int | None = None, min_ratio: float = 4.0
) -> list[int]:
    """Key frequencies from energies per frequency 1 .. K (``energy[0]``, the constant, is ignored): the top ``k``
    where the largest drop between consecutive sorted energies (as a ratio) falls, if that drop is at least
    ``min_ratio``; else [] (no frequency stands out). ``max_keys`` (default K // 3) bounds ``k``."""
    e = torch.as_tensor(energy, dtype=torch.float64)[1:].clamp_min(1e-30)
    if len(e) < 2:
        return [1] if len(e) == 1 else []
    order = torch.argsort(e, descending=True)
    s = e[order]
    max_keys = max(1, min(max_keys or max(1, len(e) // 3), len(e) - 1))
    ratios = s[:max_keys] / s[1 : max_keys + 1]
    k = int(torch.argmax(ratios)) + 1
    if float(ratios[k - 1]) < min_ratio:
        return []
    return sorted(int(i) + 1 for i in order[:k])


@dataclass(eq=False)
class FrequencyNorms(Result):
    """Norm of the embedding (``W_E`` rows of the numbers) per Fourier frequency, and the key frequencies found."""

    p: int
    energy: Tensor  # [freq] squared norm per frequency 0 .. p // 2
    key_frequencies: list[int]
    what: str = "W_E"

    @property
    def norms(self) -> Tensor:
        return self.energy.sqrt()

    def fraction_in_keys(self) -> float:
        """Share of the (non-constant) squared norm that lies in the key frequencies."""
        total = float(self.energy[1:].sum())
        return float(self.energy[self.key_frequencies].sum()) / total if total > 0 and self.key_frequencies else 0.0

    def to_dict(self) -> dict:
        return jsonable(
            {
                "what": self.what,
                "p": self.p,
                "key_frequencies": self.key_frequencies,
                "fraction_in_key_frequencies": self.fraction_in_keys(),
                "norm_per_frequency": self.norms,
                "energy_per_frequency": self.energy,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> FrequencyNorms:
        return cls(d["p"], floats(d["energy_per_frequency"]), list(d["key_frequencies"]), d["what"])

    def text(self) -> str:
        """The key frequencies, their share of the norm, and the largest norms."""
        top = torch.argsort(self.norms[1:], descending=True)[:5].tolist()
        return (
            f"{self.what}: norm per Fourier frequency (p = {self.p}); key frequencies {self.key_frequencies} hold "
            f"{self.fraction_in_keys():.3f} of the squared norm; largest: "
            + ", ".join(f"k={k + 1} {float(self.norms[k + 1]):.3g}" for k in top)
        )

    def figure(self):
        import plotly.graph_objects as go

        freqs = list(range(len(self.energy)))
        colors = ["#d62728" if f in self.key_frequencies else "#7f8ea3" for f in freqs]
        fig = go.Figure(go.Bar(x=freqs, y=self.norms.tolist(), marker_color=colors))
        fig.update_layout(
            title=f"Norm of {self.what} per Fourier frequency (key frequencies in red: "
            f"{', '.join(map(str, self.key_frequencies)) or 'none'})",
            xaxis_title="frequency k (0 = constant)",
            yaxis_title="norm",
            template="plotly_white",
            height=340,
            width=820,
        )
        return fig


def number_embedding(model: HookedTransformer, p: int) -> Float[Tensor, "p d_model"]:
    """The embedding rows of the numbers 0 .. p-1 (the ``=`` row left out)."""
    return model.W_E.detach()[:p].double()


def check_model(model: HookedTransformer, task: Task, device) -> torch.device:
    """The entry checks of the modular-addition analyses: ``device`` (None follows the model) and a model that fits
    ``task``."""
    from transformer_lens import HookedTransformer

    from interp.device import check_device
    from interp.task import check_model_task

    if task is None:
        raise InterpError("the modular-addition analyses need task=... (they run every pair of the task)")
    if not isinstance(getattr(task, "p", None), int):
        raise TaskError(
            f"the modular-addition analyses need a modular-addition task (one with a modulus p), got "
            f"{getattr(task, 'name', type(task).__name__)!r}"
        )
    if not isinstance(model, HookedTransformer):
        raise InterpError(f"expected a HookedTransformer, got {type(model).__name__} ({model!r:.60})")
    dev = check_device(model, device)
    check_model_task(model, task)
    return dev


def embedding_norms(
    model: HookedTransformer, *, task: Task, key_frequencies: list[int] | None = None, device: str | None = None
) -> FrequencyNorms:
    """The embedding's norm per frequency, with the model's key frequencies (default: :func:`key_frequencies_of`)."""
    check_model(model, task, device)
    p = task.p
    basis, _ = fourier_basis(p, device=model.W_E.device)
    energy = frequency_energy(basis @ number_embedding(model, p), p).cpu()
    keys = key_frequencies_of(model, task=task) if key_frequencies is None else list(key_frequencies)
    return FrequencyNorms(p, energy, keys)


def logit_frequency_energy(
    model: HookedTransformer, *, task: Task, device: str | None = None
) -> Float[Tensor, " freq"]:
    """Squared norm of the ``=`` logits over all pairs along ``cos(w_k (a + b))`` and ``sin(w_k (a + b))``, per
    frequency ``k`` (index 0: the constant, i.e. each logit's mean). This is what the restricted loss keeps."""
    check_model(model, task, device)
    p = task.p
    logits = answer_logits(model, task)
    out = torch.zeros(n_frequencies(p) + 1, dtype=torch.float64)
    out[0] = float(logits.mean(0).pow(2).sum() * p * p)
    d = key_directions(p, list(range(1, n_frequencies(p) + 1)), logits.device)
    sq = (d @ logits).pow(2).sum(-1).cpu()
    freqs = [k for k in range(1, n_frequencies(p) + 1) for _ in range(2 if 2 * k != p else 1)]
    out.index_add_(0, torch.tensor(freqs), sq)
    return out


SOURCES = ("logits", "embedding", "w_l")


def key_frequencies_of(
    model: HookedTransformer, *, task: Task, source: str = "logits", device: str | None = None
) -> list[int]:
    """The model's key frequencies: :func:`find_key_frequencies` on the Fourier energies of its ``=`` logits over all
    pairs as functions of ``a + b`` (``"logits"``, the default: sharpest, and what the restricted loss uses), of its
    number embedding (``"embedding"``; before cleanup ends it still holds other frequencies) or of its neuron-logit
    map ``W_out W_U`` (``"w_l"``)."""
    check_model(model, task, device)
    if source == "logits":
        energy = logit_frequency_energy(model, task=task)
    elif source == "embedding":
        basis, _ = fourier_basis(task.p, device=model.W_E.device)
        energy = frequency_energy(basis @ number_embedding(model, task.p), task.p)
    elif source == "w_l":
        energy = neuron_logit_map(model, task=task, key_frequencies=[]).energy()
    else:
        raise InterpError(f"unknown key-frequency source {source!r}; expected one of {SOURCES}")
    return find_key_frequencies(energy.cpu())


def all_pairs(task: Task, device=None) -> Tensor:
    """Tokens ``a b =`` of every pair, row ``a * p + b``."""
    return task.dataset("all").tokens.to(device)


def answer_logits(model: HookedTransformer, task: Task) -> Float[Tensor, "pair p"]:
    """Logits at ``=`` for every pair (row ``a * p + b``), in float64."""
    with torch.inference_mode():
        return model(all_pairs(task, model.W_E.device))[:, -1].double()


def key_directions(p: int, freqs: list[int], device=None) -> Float[Tensor, "dirs pair"]:
    """Unit vectors ``cos(w_k (a + b))``, ``sin(w_k (a + b))`` over the ``p**2`` pairs, for ``k`` in ``freqs``
    (mutually orthogonal, and orthogonal to the constant)."""
    a = torch.arange(p, dtype=torch.float64, device=device)
    s = (a[:, None] + a[None, :]).flatten()
    rows = []
    for k in freqs:
        if not 1 <= int(k) <= p // 2:
            raise InterpError(f"key frequency {k} is outside 1 .. {p // 2}")
        w = 2 * math.pi * int(k) / p
        for v in (torch.cos(w * s), torch.sin(w * s)):
            n = v.norm()
            if n > 1e-9:
                rows.append(v / n)
    return torch.stack(rows) if rows else torch.zeros(0, p * p, dtype=torch.float64, device=device)


def mlp_activations(model: HookedTransformer, task: Task) -> Float[Tensor, "a b d_mlp"]:
    """MLP neuron activations (after ReLU) at the ``=`` position for every pair."""
    p = task.p
    store = {}

    def keep(act, hook):
        store["post"] = act[:, -1].detach()

    with torch.inference_mode():
        model.run_with_hooks(
            all_pairs(task, model.W_E.device), fwd_hooks=[("blocks.0.mlp.hook_post", keep)], return_type=None
        )
    return store["post"].double().reshape(p, p, -1)


@dataclass(eq=False)
class NeuronFrequencies(Result):
    """Each MLP neuron's dominant frequency and the fraction of its (non-constant) variance over all pairs that the
    terms of that frequency explain (``const x f``, ``f x const`` and ``f x f`` components of the 2D Fourier
    transform in ``(a, b)``)."""

    p: int
    dominant: Tensor  # [d_mlp] frequency 1 .. p // 2
    fraction: Tensor  # [d_mlp] variance fraction of the dominant frequency
    key_frequencies: list[int]
    threshold: float = 0.5

    def clusters(self) -> dict[int, int]:
        """Frequency -> number of neurons with that dominant frequency and explained fraction >= threshold."""
        ok = self.fraction >= self.threshold
        vals, counts = torch.unique(self.dominant[ok], return_counts=True)
        return {int(v): int(c) for v, c in zip(vals, counts)}

    def to_dict(self) -> dict:
        return jsonable(
            {
                "p": self.p,
                "threshold": self.threshold,
                "clusters": self.clusters(),
                "fraction_explained_by_dominant": {
                    "mean": float(self.fraction.mean()),
                    "median": float(self.fraction.median()),
                },
                "neurons_in_key_frequencies": int(sum(self.clusters().get(k, 0) for k in self.key_frequencies)),
                "key_frequencies": self.key_frequencies,
                "dominant": self.dominant,
                "fraction": self.fraction,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> NeuronFrequencies:
        return cls(
            d["p"],
            torch.tensor(d["dominant"], dtype=torch.long),
            floats(d["fraction"]),
            list(d["key_frequencies"]),
            d["threshold"],
        )

    def text(self) -> str:
        """Neurons per dominant frequency (those it explains at least ``threshold`` of)."""
        clusters = ", ".join(f"k={k}: {n}" for k, n in sorted(self.clusters().items(), key=lambda kv: -kv[1]))
        return (
            f"MLP neurons by dominant frequency (explained fraction >= {self.threshold:g}; key frequencies "
            f"{self.key_frequencies}): {clusters or 'none'}; mean explained fraction {float(self.fraction.mean()):.3f}"
        )

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure(
            go.Scatter(
                x=self.dominant.tolist(),
                y=self.fraction.tolist(),
                mode="markers",
                marker=dict(size=5, opacity=0.6),
                text=[f"neuron {i}" for i in range(len(self.dominant))],
            )
        )
        fig.update_layout(
            title="MLP neurons: dominant frequency and the variance fraction it explains",
            xaxis_title="dominant frequency",
            yaxis_title="fraction of variance",
            yaxis_range=[0, 1.02],
            template="plotly_white",
            height=360,
            width=820,
        )
        return fig


def neuron_frequencies(
    model: HookedTransformer,
    *,
    task: Task,
    key_frequencies: list[int] | None = None,
    threshold: float = 0.5,
    device: str | None = None,
) -> NeuronFrequencies:
    """Dominant frequency and explained variance fraction of every MLP neuron (over all ``p**2`` pairs)."""
    check_model(model, task, device)
    p = task.p
    acts = mlp_activations(model, task)
    basis, _ = fourier_basis(p, device=acts.device)
    tmp = torch.einsum("ia,abn->ibn", basis, acts)
    coeffs = torch.einsum("jb,ibn->ijn", basis, tmp)  # 2D Fourier transform [comp_a, comp_b, neuron]
    sq = coeffs.pow(2)
    sq[0, 0] = 0  # the mean is not variance
    K = n_frequencies(p)
    onehot = torch.nn.functional.one_hot(component_frequency(p), K + 1).to(sq)  # [component, freq]
    grid = torch.einsum("if,ijn->fjn", onehot, sq)
    grid = torch.einsum("jg,fjn->fgn", onehot, grid)  # [freq_a, freq_b, neuron] energy
    k = torch.arange(1, K + 1)
    per = torch.zeros(K + 1, sq.shape[-1], dtype=sq.dtype, device=sq.device)
    per[1:] = grid[k, k] + grid[k, 0] + grid[0, k]  # the terms k x k, k x const, const x k
    total = sq.sum((0, 1)).clamp_min(1e-30)
    frac = per[1:] / total
    best = frac.max(0)
    if key_frequencies is None:
        key_frequencies = key_frequencies_of(model, task=task)
    return NeuronFrequencies(p, (best.indices + 1).cpu(), best.values.cpu(), list(key_frequencies), threshold)


@dataclass(eq=False)
class NeuronLogitMap(Result):
    """The neuron-logit map ``W_L = W_out W_U`` [d_mlp, p] in the Fourier basis of the output ``c``: its squared norm
    per output frequency (summed over neurons)."""

    p: int
    coeffs: Tensor | None  # [d_mlp, component]; None in a result read back by from_dict
    names: list[str]
    key_frequencies: list[int]
    energy_: Tensor | None = None  # [freq]: the energy of a result read back (no coefficients)

    def energy(self) -> Tensor:
        return self.energy_ if self.coeffs is None else frequency_energy(self.coeffs.T, self.p)

    def fraction_in_keys(self) -> float:
        e = self.energy()
        total = float(e.sum())
        return float(e[self.key_frequencies].sum()) / total if total else 0.0

    def to_dict(self) -> dict:
        e = self.energy()
        return jsonable(
            {
                "p": self.p,
                "norm_per_frequency": e.sqrt(),
                "fraction_in_key_frequencies": self.fraction_in_keys(),
                "key_frequencies": self.key_frequencies,
                "energy_per_frequency": e,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> NeuronLogitMap:
        """The per-frequency energy and key frequencies ``to_dict`` wrote (not the per-neuron coefficients)."""
        return cls(d["p"], None, [], list(d["key_frequencies"]), floats(d["energy_per_frequency"]))

    def text(self) -> str:
        return (
            f"neuron-logit map W_out W_U (p = {self.p}): {self.fraction_in_keys():.3f} of its squared norm in the key "
            f"frequencies {self.key_frequencies}"
        )

    def figure(self):
        import plotly.graph_objects as go

        if self.coeffs is None:
            fig = go.Figure(go.Bar(x=list(range(len(self.energy()))), y=self.energy().sqrt().tolist()))
            fig.update_layout(title="|W_L| per output frequency", xaxis_title="frequency", template="plotly_white")
            return fig

        order = torch.argsort(self.coeffs.abs().argmax(1))  # group neurons by their strongest component
        fig = go.Figure(go.Heatmap(z=self.coeffs[order].abs().tolist(), x=self.names, colorscale="Blues"))
        fig.update_layout(
            title="|W_L| = |W_out W_U| in the Fourier basis of the output (neurons sorted)",
            xaxis_title="output component",
            yaxis_title="neuron (sorted)",
            template="plotly_white",
            height=420,
            width=900,
        )
        return fig


def neuron_logit_map(
    model: HookedTransformer, *, task: Task, key_frequencies: list[int] | None = None, device: str | None = None
) -> NeuronLogitMap:
    """The neuron-logit map ``W_out W_U`` in the Fourier basis of the answer (rows: neurons)."""
    check_model(model, task, device)
    p = task.p
    basis, names = fourier_basis(p, device=model.W_E.device)
    w_l = model.W_out[0].detach().double() @ model.W_U.detach().double()  # [d_mlp, p]
    if key_frequencies is None:
        key_frequencies = key_frequencies_of(model, task=task)
    return NeuronLogitMap(p, (w_l @ basis.T).cpu(), names, list(key_frequencies))
