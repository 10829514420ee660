"""Which algorithm a modular-addition model runs, Clock or Pizza: the two diagnostics of Zhong, Liu, Tegmark and
Andreas 2023, *The Clock and the Pizza: Two Stories in Mechanistic Explanation of Neural Networks*, for one model
and for a population of same-shape models (a sweep directory).

Both algorithms embed ``a`` and ``b`` on circles ``(cos w a, sin w a)``. The **Clock** (Nanda et al. 2023) multiplies
the two rotations, so the logit of ``c`` is ``cos(w (a + b - c))`` and the correct logit does not depend on the
distance ``a - b``; the **Pizza** adds the two embeddings first (their midpoint) and reads the sum off that, so the
logit is ``|cos(w (a - b) / 2)| cos(w (a + b - c))``: a function of ``E_a + E_b`` whose correct logit does depend on
``a - b``. The two diagnostics, as Zhong et al. define them (and compute them in their code):

- **gradient symmetricity**: over input triples ``(a, b, c)`` (``c`` any class, not only the answer), the cosine
  similarity between the gradients of the logit of ``c`` with respect to the input embeddings of ``a`` and of ``b``,
  averaged. A function of ``E_a + E_b`` (the Pizza, any model with constant attention) gives exactly 1; the Clock's
  ``cos(w (a + b - c))`` gives ``cos(w (a - b))`` per triple, 0 on average over every pair.
- **distance irrelevance**: the correct logits arranged by ``(a + b) mod p`` and ``(a - b) mod p``; the standard
  deviation over the sums at each fixed difference, averaged over the differences, divided by the standard
  deviation over all pairs (population standard deviations, as numpy's default). 1 where the correct logit does not
  depend on ``a - b`` (the Clock), 0 where it depends on nothing else (the Pizza's ``|cos(w (a - b) / 2)|``).
  Undefined (NaN) where the correct logit is the same for every pair.

A model is called ``pizza`` where gradient symmetricity >= 0.5 and distance irrelevance < 0.5, ``clock`` where
gradient symmetricity < 0.5 and distance irrelevance >= 0.5, and ``neither`` otherwise: the thresholds are the
midpoints between the two pure algorithms' values (Clock 0 and 1, Pizza 1 and 0), fixed before any model was
measured, and recorded in every result.

The gradients are taken at ``blocks.0.hook_resid_pre`` of positions 0 and 1 (the sum of token and position
embeddings: its gradient is the token embedding's). Zhong et al. sample 100 triples; here every pair ``(a, b)`` is
used once, with a class ``c`` drawn per pair from ``seed`` (one backward pass for all of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import ConfigError, InterpError
from interp.results import Result, floats, jsonable

from .fourier import answer_logits, check_model, key_frequencies_of

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from interp.task import Task

ALGORITHMS = ("clock", "pizza", "neither")
THRESHOLDS = {"gradient_symmetricity": 0.5, "distance_irrelevance": 0.5}


# -- the diagnostics as functions of tensors -----------------------------------------------------------------------
def distance_irrelevance(correct: Float[Tensor, "*batch a b"]) -> Float[Tensor, "*batch"]:
    """Distance irrelevance of correct-logit tables ``correct[..., a, b]`` (the logit of ``(a + b) mod p`` for input
    ``a b``): the standard deviation over the ``p`` pairs of each difference ``d = (a - b) mod p``, averaged over the
    differences, divided by the standard deviation over all pairs (population standard deviations); NaN where the
    table is constant. Any modulus (for an odd one the pairs of a difference are its ``p`` sums). Batched over
    leading axes (runs)."""
    p = correct.shape[-1]
    if correct.ndim < 2 or correct.shape[-2] != p:
        raise InterpError(f"correct logits must be [..., p, p] (a by b), got shape {tuple(correct.shape)}")
    x = correct.double()
    a = torch.arange(p, device=x.device)
    b = (a[None, :] - a[:, None]) % p  # [d, a]: the b with (a - b) mod p = d
    by_d = x[..., a[None, :].expand(p, p), b]  # [..., d, a]
    within = by_d.std(-1, correction=0).mean(-1)
    overall = x.flatten(-2).std(-1, correction=0)
    scale = x.flatten(-2).abs().amax(-1)
    return torch.where(overall > 1e-12 * scale.clamp_min(1e-300), within / overall, torch.nan)


def gradient_symmetricity(
    grad_a: Float[Tensor, "*batch triple d_model"], grad_b: Float[Tensor, "*batch_b triple_b d_model_b"]
) -> Float[Tensor, "*batch"]:
    """The mean over triples of the cosine similarity of the two gradients (triples where either gradient is 0 are
    left out; NaN where all are)."""
    if grad_a.shape != grad_b.shape:
        raise InterpError(f"the two gradients must have one shape, got {tuple(grad_a.shape)} and {tuple(grad_b.shape)}")
    ga, gb = grad_a.double(), grad_b.double()
    na, nb = ga.norm(dim=-1), gb.norm(dim=-1)
    ok = (na > 0) & (nb > 0)
    cos = (ga * gb).sum(-1) / (na * nb).where(ok, torch.ones_like(na))
    n = ok.sum(-1)
    return torch.where(n > 0, (cos * ok).sum(-1) / n.clamp_min(1), torch.nan)


def check_thresholds(thresholds) -> dict[str, float]:
    """The default thresholds updated by ``thresholds`` (names of :data:`THRESHOLDS`, finite numbers)."""
    if thresholds is None:
        return dict(THRESHOLDS)
    if not isinstance(thresholds, dict):
        raise ConfigError(f"thresholds must be a dict of {sorted(THRESHOLDS)}, got {thresholds!r}")
    unknown = sorted(set(thresholds) - set(THRESHOLDS))
    if unknown:
        raise ConfigError(f"unknown threshold {unknown[0]!r}; expected {sorted(THRESHOLDS)}")
    for k, v in thresholds.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"threshold {k} must be a finite number, got {v!r}")
    return {**THRESHOLDS, **{k: float(v) for k, v in thresholds.items()}}


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    return seed


def classify(symmetricity: float, irrelevance: float, thresholds: dict[str, float] | None = None) -> str:
    """``pizza``, ``clock`` or ``neither`` by the thresholds (see the module doc)."""
    t = check_thresholds(thresholds)
    if not (math.isfinite(symmetricity) and math.isfinite(irrelevance)):
        return "neither"
    sym = symmetricity >= t["gradient_symmetricity"]
    irr = irrelevance >= t["distance_irrelevance"]
    if sym and not irr:
        return "pizza"
    if irr and not sym:
        return "clock"
    return "neither"


# -- on a model ----------------------------------------------------------------------------------------------------
def triples_for(p: int, seed: int = 0, device=None) -> Int[Tensor, "triple 3"]:
    """Every pair ``(a, b)`` (row ``a * p + b``) with a class ``c`` drawn uniformly per pair from ``seed``."""
    a = torch.arange(p).repeat_interleave(p)
    b = torch.arange(p).repeat(p)
    c = torch.randint(0, p, (p * p,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([a, b, c], 1).to(device)


def embedding_gradients(
    model: HookedTransformer, triples: Int[Tensor, "triple 3"], *, p: int, batch_size: int = 8192
) -> tuple[Float[Tensor, "triple d_model"], Float[Tensor, "triple d_model"]]:
    """Gradients of the logit of ``c`` at ``=`` with respect to the residual stream entering layer 0 at the
    positions of ``a`` and of ``b``, for every triple ``(a, b, c)``: one backward pass per batch of triples (the rows
    of a batch are independent, so the gradient of the summed logits is each row's own)."""
    dev = model.W_E.device
    triples = triples.to(dev)
    a, b, c = triples.unbind(1)
    tokens = torch.stack([a, b, torch.full_like(a, p)], 1)
    out_a, out_b = [], []
    for i in range(0, len(triples), batch_size):
        tok, cls = tokens[i : i + batch_size], c[i : i + batch_size]
        with torch.inference_mode(False), torch.enable_grad():
            delta = torch.zeros(len(tok), tok.shape[1], model.cfg.d_model, device=dev, dtype=model.W_E.dtype)
            delta.requires_grad_(True)

            def add(resid, hook, delta=delta):
                return resid + delta

            logits = model.run_with_hooks(tok, fwd_hooks=[("blocks.0.hook_resid_pre", add)])[:, -1]
            (g,) = torch.autograd.grad(logits.gather(1, cls[:, None]).sum(), delta)
        out_a.append(g[:, 0].detach())
        out_b.append(g[:, 1].detach())
    return torch.cat(out_a), torch.cat(out_b)


def correct_logits(model: HookedTransformer, task: Task) -> Float[Tensor, "a b"]:
    """The logit of the answer ``(a + b) mod p`` at ``=`` for every pair, as a ``[p, p]`` table (float64)."""
    p = task.p
    logits = answer_logits(model, task)
    pairs = torch.arange(p * p, device=logits.device)
    answer = (pairs // p + pairs % p) % p
    return logits.gather(1, answer[:, None]).reshape(p, p)


@dataclass(eq=False)
class AlgorithmDiagnostics(Result):
    """One model's gradient symmetricity and distance irrelevance, the algorithm they name, and the correct-logit
    table ``correct [a, b]`` they were read from (its figure is Zhong et al.'s: the correct logits by ``a + b`` and
    ``a - b``)."""

    p: int
    gradient_symmetricity: float
    distance_irrelevance: float
    correct: Tensor
    n_triples: int
    seed: int
    thresholds: dict[str, float] = field(default_factory=lambda: dict(THRESHOLDS))

    @property
    def algorithm(self) -> str:
        return classify(self.gradient_symmetricity, self.distance_irrelevance, self.thresholds)

    def to_dict(self) -> dict:
        return jsonable(
            {
                "p": self.p,
                "algorithm": self.algorithm,
                "gradient_symmetricity": self.gradient_symmetricity,
                "distance_irrelevance": self.distance_irrelevance,
                "n_triples": self.n_triples,
                "seed": self.seed,
                "thresholds": self.thresholds,
                "correct_logits": self.correct,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> AlgorithmDiagnostics:
        nan = lambda v: math.nan if v is None else float(v)  # noqa: E731
        return cls(
            p=int(d["p"]),
            gradient_symmetricity=nan(d["gradient_symmetricity"]),
            distance_irrelevance=nan(d["distance_irrelevance"]),
            correct=floats(d["correct_logits"]),
            n_triples=int(d["n_triples"]),
            seed=int(d["seed"]),
            thresholds=dict(d["thresholds"]),
        )

    def text(self) -> str:
        return (
            f"{self.algorithm} (p = {self.p}): gradient symmetricity {self.gradient_symmetricity:.3f} over "
            f"{self.n_triples} triples, distance irrelevance {self.distance_irrelevance:.3f} (Clock: ~0 and ~1; Pizza: "
            f"~1 and ~0; thresholds {self.thresholds['gradient_symmetricity']} and "
            f"{self.thresholds['distance_irrelevance']})"
        )

    def figure(self):
        from interp.visualize import heatmap

        p = self.p
        a = torch.arange(p)
        d = (a[:, None] - a[None, :]) % p
        if p % 2:  # Zhong et al.'s picture: each (difference, sum) is one pair
            column, x_title = (a[:, None] + a[None, :]) % p, "(a + b) mod p"
        else:  # an even modulus: a sum and a difference name two pairs or none, so the columns are a
            column, x_title = a[:, None].expand(p, p), "a"
        table = torch.full((p, p), torch.nan, dtype=torch.float64)
        table[d, column] = self.correct.double()
        return heatmap(
            table,
            [str(i) for i in range(p)],
            [str(i) for i in range(p)],
            title=f"Correct logits by {x_title} and (a - b) mod p: {self.algorithm} (distance irrelevance "
            f"{self.distance_irrelevance:.3f})",
            x_title=x_title,
            y_title="(a - b) mod p",
        )


def algorithm_diagnostics(
    model: object,
    *,
    task: Task,
    seed: object = 0,
    thresholds: object = None,
    device: str | None = None,
) -> AlgorithmDiagnostics:
    """Gradient symmetricity (every pair, one class each, drawn from the integer ``seed``) and distance irrelevance
    of the HookedTransformer ``model`` on ``task`` (see the module doc); ``thresholds``: a dict updating
    :data:`THRESHOLDS`. Arguments are checked by hand (one clear error each), hence their loose annotations."""
    seed = _check_seed(seed)
    thresholds = check_thresholds(thresholds)
    check_model(model, task, device)
    triples = triples_for(task.p, seed, model.W_E.device)
    ga, gb = embedding_gradients(model, triples, p=task.p)
    correct = correct_logits(model, task)
    return AlgorithmDiagnostics(
        p=task.p,
        gradient_symmetricity=float(gradient_symmetricity(ga, gb)),
        distance_irrelevance=float(distance_irrelevance(correct)),
        correct=correct.cpu(),
        n_triples=len(triples),
        seed=seed,
        thresholds=thresholds,
    )


# -- on a population -----------------------------------------------------------------------------------------------
def _interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and its Student-t interval (NaN values left out)."""
    from scipy import stats

    x = torch.tensor([v for v in values if math.isfinite(v)], dtype=torch.float64)
    if len(x) == 0:
        return (math.nan, math.nan, math.nan)
    m = float(x.mean())
    if len(x) < 2:
        return (m, math.nan, math.nan)
    half = float(stats.t.ppf((1 + level) / 2, len(x) - 1)) * float(x.std()) / math.sqrt(len(x))
    return (m, m - half, m + half)


@dataclass(eq=False)
class PopulationAlgorithms(Result):
    """Each run's diagnostics (``gradient_symmetricity [run]``, ``distance_irrelevance [run]``), its algorithm, test
    ``accuracy`` and number of Fourier key frequencies (:func:`key_frequencies_of`, from the logits; -1 where not
    computed)."""

    p: int
    names: list[str]
    seeds: list[int]
    accuracy: list[float]
    gradient_symmetricity: Tensor
    distance_irrelevance: Tensor
    key_frequencies: list[list[int]]
    thresholds: dict[str, float] = field(default_factory=lambda: dict(THRESHOLDS))
    info: dict = field(default_factory=dict)

    @property
    def algorithms(self) -> list[str]:
        return [
            classify(float(s), float(q), self.thresholds)
            for s, q in zip(self.gradient_symmetricity, self.distance_irrelevance)
        ]

    def counts(self, min_accuracy: object = None) -> dict:
        """Per algorithm, among runs with accuracy ``>= min_accuracy`` (None: every run; the accuracy is on the
        split the population was read with, ``info["split"]``, the test split by default): the count, the share and
        its 95% Wilson interval, and the means of the diagnostics and of the key-frequency count with 95% Student-t
        intervals."""
        from interp.analyses.populations import wilson_interval

        if min_accuracy is not None and (
            isinstance(min_accuracy, bool) or not isinstance(min_accuracy, (int, float)) or not 0 <= min_accuracy <= 1
        ):
            raise ConfigError(f"min_accuracy must be None or a number in [0, 1], got {min_accuracy!r}")
        keep = [i for i, a in enumerate(self.accuracy) if min_accuracy is None or a >= min_accuracy]
        algos = self.algorithms
        out = {"min_accuracy": min_accuracy, "runs": len(keep), "per_algorithm": {}}
        for name in ALGORITHMS:
            idx = [i for i in keep if algos[i] == name]
            lo, hi = wilson_interval(len(idx), len(keep))
            out["per_algorithm"][name] = {
                "runs": len(idx),
                "share": len(idx) / len(keep) if keep else math.nan,
                "share_wilson95": (lo, hi),
                "seeds": [self.seeds[i] for i in idx],
                "gradient_symmetricity_t95": _interval([float(self.gradient_symmetricity[i]) for i in idx]),
                "distance_irrelevance_t95": _interval([float(self.distance_irrelevance[i]) for i in idx]),
                "key_frequency_count_t95": _interval([float(len(self.key_frequencies[i])) for i in idx]),
            }
        return out

    def to_dict(self) -> dict:
        return jsonable(
            {
                "p": self.p,
                "names": self.names,
                "seeds": self.seeds,
                "accuracy": self.accuracy,
                "gradient_symmetricity": self.gradient_symmetricity,
                "distance_irrelevance": self.distance_irrelevance,
                "algorithm": self.algorithms,
                "key_frequencies": self.key_frequencies,
                "thresholds": self.thresholds,
                "info": self.info,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> PopulationAlgorithms:
        return cls(
            p=int(d["p"]),
            names=list(d["names"]),
            seeds=[int(s) for s in d["seeds"]],
            accuracy=[math.nan if a is None else float(a) for a in d["accuracy"]],
            gradient_symmetricity=floats(d["gradient_symmetricity"]),
            distance_irrelevance=floats(d["distance_irrelevance"]),
            key_frequencies=[list(k) for k in d["key_frequencies"]],
            thresholds=dict(d["thresholds"]),
            info=dict(d["info"]),
        )

    def text(self) -> str:
        c = self.counts()
        lines = [f"algorithms of {len(self.names)} runs (p = {self.p}; thresholds {self.thresholds}):"]
        for name, row in c["per_algorithm"].items():
            lo, hi = row["share_wilson95"]
            runs = f"{row['runs']} run" + ("" if row["runs"] == 1 else "s")
            lines.append(f"  {name}: {runs} ({row['share']:.2f}, 95% Wilson {lo:.2f}..{hi:.2f})")
        return "\n".join(lines)

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure()
        algos = self.algorithms
        for name, colour in zip(ALGORITHMS, ("#1f77b4", "#d62728", "#7f7f7f")):
            idx = [i for i, a in enumerate(algos) if a == name]
            if not idx:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[float(self.distance_irrelevance[i]) for i in idx],
                    y=[float(self.gradient_symmetricity[i]) for i in idx],
                    mode="markers",
                    name=name,
                    marker_color=colour,
                    text=[f"seed {self.seeds[i]}, accuracy {self.accuracy[i]:.3f}" for i in idx],
                )
            )
        fig.update_layout(
            title=f"Clock or Pizza: {len(self.names)} runs (p = {self.p})",
            xaxis_title="distance irrelevance",
            yaxis_title="gradient symmetricity",
            template="plotly_white",
            width=620,
            height=480,
        )
        return fig


def population_algorithms(
    source,
    *,
    task: Task | None = None,
    seed: object = 0,
    split: str = "test",
    thresholds: object = None,
    key_frequencies: bool = True,
    device: str | None = None,
    progress: bool = False,
) -> PopulationAlgorithms:
    """The diagnostics of every run of a sweep directory (``source``: its path; the runs' tasks must agree) or of a
    list of same-shape models (``task`` then required; accuracies are NaN): :func:`algorithm_diagnostics` of each run
    (the runs are separate models: each gets its own forward and backward)."""
    from tqdm import tqdm

    seed = _check_seed(seed)
    thresholds = check_thresholds(thresholds)
    models, names, seeds, acc = [], [], [], []
    if isinstance(source, (str, Path)):
        from interp.loading import load_checkpoint
        from interp.sweep_directory import checkpoint_path, read_results

        if not Path(source).is_dir():
            raise ConfigError(f"{source} is not a sweep directory (expected the folder `interp sweep --out` wrote)")
        rows = read_results(Path(source))
        if not rows:
            raise ConfigError(f"{source} has no finished runs (results.jsonl is empty)")
        for row in rows:
            if split not in row.get("accuracy", {}):
                raise ConfigError(f"unknown split {split!r}; the runs record accuracy on {sorted(row['accuracy'])}")
            models.append(checkpoint_path(source, row))
            names.append(row.get("name", ""))
            seeds.append(int(row.get("seed", len(seeds))))
            acc.append(float(row["accuracy"][split]))
    else:
        from transformer_lens import HookedTransformer

        if isinstance(source, HookedTransformer) or not hasattr(source, "__iter__"):
            raise ConfigError(f"source must be a sweep directory or a list of models, got {type(source).__name__}")
        models = list(source)
        for m in models:
            if not isinstance(m, HookedTransformer):
                raise ConfigError(f"a model of the list is a {type(m).__name__}, not a HookedTransformer")
        if task is None:
            raise ConfigError("population_algorithms of a list of models needs task=...")
        names = [f"model {i}" for i in range(len(models))]
        seeds = list(range(len(models)))
        acc = [math.nan] * len(models)
    if not models:
        raise ConfigError("population_algorithms needs at least one model")
    runs, keys = [], []
    width = None
    for m in tqdm(models, desc="algorithms", disable=not progress):
        if isinstance(m, Path):
            ck = load_checkpoint(m, device=device)
            model, t = ck.model, ck.task
            if task is not None and t.params() != task.params():
                raise ConfigError(f"run {m.name} is of task {t.params()}, not {task.params()}")
            task = task or t
        else:
            model, t = m, task
        one = algorithm_diagnostics(model, task=t, seed=seed, thresholds=thresholds, device=device)
        if runs and one.p != runs[0].p:
            raise ConfigError(
                f"the runs have different moduli ({runs[0].p} and {one.p}); compare one configuration at a time"
            )
        if width is not None and model.cfg.d_model != width:
            raise ConfigError("the models have different widths; compare one configuration at a time")
        width = model.cfg.d_model
        runs.append(one)
        keys.append(key_frequencies_of(model, task=t) if key_frequencies else [])
    p = runs[0].p
    sym = torch.tensor([r.gradient_symmetricity for r in runs], dtype=torch.float64)
    irr = torch.tensor([r.distance_irrelevance for r in runs], dtype=torch.float64)
    return PopulationAlgorithms(
        p=p,
        names=names,
        seeds=seeds,
        accuracy=acc,
        gradient_symmetricity=sym,
        distance_irrelevance=irr,
        key_frequencies=keys,
        thresholds=thresholds,
        info={"source": str(source) if isinstance(source, (str, Path)) else "models", "seed": seed, "split": split},
    )
