"""Many models of one shape trained as one batched computation (issue 11, first part).

``train_population(task, specs, cfgs, outs)`` trains K one-layer attention-only models (the seed's shape) with
stacked parameters ``[K, ...]``: one batched forward, one backward and one AdamW step for all K per training
step. Each model gets exactly what :func:`interp.training.train` would give it alone:

- its own initialisation (``build_model(spec_k)``, seeded by ``spec_k.init_seed``),
- its own data order (``torch.randperm`` from a generator seeded by ``cfg_k.seed``, one permutation per epoch),
- its own dropout masks: the solo run draws them from the global RNG in the state ``build_model`` leaves it in;
  here each model has a generator in that same state and draws masks of the same shapes in the same order
  (``bernoulli_(1 - p) / (1 - p)``, which is what ``F.dropout`` computes on the CPU),
- its own learning rate (a ``[K]`` tensor), warmup, AdamW (the same update as ``torch.optim.AdamW``), best-epoch
  selection (higher validation accuracy, ties to lower validation loss), ``keep`` and ``patience``.

So each batched model equals the same seed trained alone to float tolerance (tests/test_population.py checks
weights and history for K = 1, 3 and 8). Each model is saved as an ordinary checkpoint (loads in plain
TransformerLens) whose provenance says it was trained in a population of K.

Only the shape the exact query-restricted forward covers is batched (one layer, attention only, no LayerNorm):
the seed's models. On CUDA the masks are still drawn by per-model CPU generators (so the numbers match a CPU run
of the same seed up to float error, not a solo CUDA run, whose dropout uses the CUDA generator).
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from .checkpoint import save_checkpoint
from .device import pick_device
from .errors import ConfigError
from .evaluate import target_positions
from .files import AtomicFile
from .model import ModelSpec, build_model
from .query_forward import supports_query_forward
from .training import TrainConfig

# the parameters of a one-layer attention-only HookedTransformer, in state-dict names
PARAMS = ("embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q", "blocks.0.attn.b_Q", "blocks.0.attn.W_K",
          "blocks.0.attn.b_K", "blocks.0.attn.W_V", "blocks.0.attn.b_V", "blocks.0.attn.W_O", "blocks.0.attn.b_O",
          "unembed.W_U", "unembed.b_U")
# what may differ between the models of one population
VARYING_CONFIG = ("seed", "lr")


def check_population(specs: Sequence[ModelSpec], cfgs: Sequence[TrainConfig]) -> None:
    """Refuse populations that are not one shape and one recipe (up to seeds and learning rates)."""
    if not specs or len(specs) != len(cfgs):
        raise ConfigError(f"a population needs one spec and one training config per model, got {len(specs)} specs "
                          f"and {len(cfgs)} configs")
    shape = {k: v for k, v in asdict(specs[0]).items() if k != "init_seed"}
    for i, s in enumerate(specs):
        diff = [k for k, v in asdict(s).items() if k != "init_seed" and shape[k] != v]
        if diff:
            raise ConfigError(f"model {i} differs from model 0 in {diff}: a population is one shape")
    recipe = {k: v for k, v in asdict(cfgs[0]).items() if k not in VARYING_CONFIG}
    for i, c in enumerate(cfgs):
        diff = [k for k, v in asdict(c).items() if k not in VARYING_CONFIG and recipe[k] != v]
        if diff:
            raise ConfigError(f"training config {i} differs from config 0 in {diff}: only {VARYING_CONFIG} may vary")
    if cfgs[0].halving is not None:
        raise ConfigError("batched training does not do halving heads yet; train halving runs with `interp train`")
    if cfgs[0].loss_dtype != "float32":
        raise ConfigError(f"batched training computes the loss in float32; got loss_dtype={cfgs[0].loss_dtype!r}")
    s = specs[0]
    if not (s.n_layers == 1 and s.attn_only and s.normalization is None):
        raise ConfigError("batched training covers one-layer attention-only models without LayerNorm (the seed's "
                          f"shape); got n_layers={s.n_layers}, attn_only={s.attn_only}, normalization="
                          f"{s.normalization!r}: train these one at a time with `interp train`")


def stacked_logits_at(P: dict[str, Tensor], tokens: Int[Tensor, "K batch pos"], query_pos: Int[Tensor, "K batch k"],
                      attn_scale: float, emb_mask: Float[Tensor, "K batch pos d_model"] | None = None,
                      out_mask: Float[Tensor, "K batch k d_model"] | None = None) -> Float[Tensor, "K batch k vocab_out"]:
    """Logits at ``query_pos`` of K one-layer attention-only models at once (``P[name]`` is ``[K, ...]``): the
    query-restricted forward of :func:`interp.query_forward.logits_at` with a model axis. ``emb_mask`` /
    ``out_mask`` are dropout multipliers (0 or 1/(1-p)) for the embedding and the attention output."""
    K, b, t = tokens.shape
    ks = torch.arange(K, device=tokens.device)[:, None, None]
    x = P["embed.W_E"][ks, tokens] + P["pos_embed.W_pos"][:, None, :t]  # [K, b, t, d]
    if emb_mask is not None:
        x = x * emb_mask
    rows = torch.arange(b, device=tokens.device)[None, :, None]
    xq = x[ks, rows, query_pos]  # [K, b, k, d]
    q = torch.einsum("Kbkd,Khde->Kbhke", xq, P["blocks.0.attn.W_Q"]) + P["blocks.0.attn.b_Q"][:, None, :, None]
    keys = torch.einsum("Kbtd,Khde->Kbhte", x, P["blocks.0.attn.W_K"]) + P["blocks.0.attn.b_K"][:, None, :, None]
    vals = torch.einsum("Kbtd,Khde->Kbhte", x, P["blocks.0.attn.W_V"]) + P["blocks.0.attn.b_V"][:, None, :, None]
    scores = torch.einsum("Kbhke,Kbhte->Kbhkt", q, keys) / attn_scale
    future = torch.arange(t, device=tokens.device)[None, None, None, :] > query_pos[..., None]  # [K, b, k, t]
    scores = scores.masked_fill(future[:, :, None], float("-inf"))
    z = torch.einsum("Kbhkt,Kbhte->Kbkhe", scores.softmax(-1), vals)
    out = torch.einsum("Kbkhe,Khed->Kbkd", z, P["blocks.0.attn.W_O"]) + P["blocks.0.attn.b_O"][:, None, None]
    if out_mask is not None:
        out = out * out_mask
    resid = xq + out
    return torch.einsum("Kbkd,Kdv->Kbkv", resid, P["unembed.W_U"]) + P["unembed.b_U"][:, None, None]


def token_counts(data, d_vocab: int) -> tuple[Int[Tensor, "batch k"], Float[Tensor, "batch k vocab"]]:
    """For every target position of ``data``: the token there (the query) and how often each token occurs at or
    before it (the keys it sees). A one-layer attention-only model without positions, with no dropout before its
    attention, computes its logits there from these alone."""
    qpos = target_positions(data)
    if qpos is None:
        raise ConfigError("batched training needs tasks whose targets sit at the same few positions per row")
    cum = F.one_hot(data.tokens, d_vocab).cumsum(1)  # [batch, pos, vocab]
    rows = torch.arange(len(data), device=data.tokens.device)[:, None]
    return data.tokens.gather(1, qpos), cum[rows, qpos].float()


def stacked_count_logits(P: dict[str, Tensor], query_tok: Int[Tensor, "K batch k"],
                         counts: Float[Tensor, "K batch k vocab"], attn_scale: float,
                         out_mask: Float[Tensor, "K batch k d_model"] | None = None) -> Float[Tensor, "K batch k vocab_out"]:
    """The same logits as :func:`stacked_logits_at` for models without positional embedding and without dropout
    before attention, from token counts: attention to a token is shared by all its occurrences, so the softmax
    over positions is a softmax over the vocabulary with ``log(count)`` added to the scores. Cost per query
    ``O(vocab x heads x d_head)`` instead of ``O(pos x heads x d_head)``; equal up to float rounding."""
    K, b, k = query_tok.shape
    W_E, W_Q, W_K, W_V, W_O = (P[n] for n in ("embed.W_E", "blocks.0.attn.W_Q", "blocks.0.attn.W_K",
                                               "blocks.0.attn.W_V", "blocks.0.attn.W_O"))
    H, d, e = W_Q.shape[1:]
    V = W_E.shape[1]
    # laid out for batched matmuls: heads outside, then vocabulary / queries; the softmax runs over the vocabulary
    # as the second-to-last axis (PyTorch's CPU softmax is ~10x slower over a short last axis)
    ks = torch.arange(K, device=query_tok.device)[:, None]
    xq = W_E[ks, query_tok.reshape(K, b * k)]  # [K, bk, d]
    q = torch.matmul(xq[:, None], W_Q) + P["blocks.0.attn.b_Q"][:, :, None]  # [K, H, bk, e]
    keys = torch.matmul(W_E[:, None], W_K) + P["blocks.0.attn.b_K"][:, :, None]  # [K, H, V, e]
    vals = torch.matmul(W_E[:, None], W_V) + P["blocks.0.attn.b_V"][:, :, None]  # [K, H, V, e]
    scores = torch.matmul(keys, q.transpose(-1, -2)) / attn_scale  # [K, H, V, bk]
    scores = scores + counts.reshape(K, b * k, V).log().transpose(1, 2)[:, None]
    z = torch.matmul(vals.transpose(-1, -2), scores.softmax(-2))  # [K, H, e, bk]
    out = torch.matmul(z.permute(0, 3, 1, 2).reshape(K, b * k, H * e), W_O.reshape(K, H * e, d))
    out = (out + P["blocks.0.attn.b_O"][:, None]).view(K, b, k, d)
    if out_mask is not None:
        out = out * out_mask
    resid = xq.view(K, b, k, d) + out
    return torch.matmul(resid.view(K, b * k, d), P["unembed.W_U"]).view(K, b, k, -1) + P["unembed.b_U"][:, None, None]


def _dropout_mask(shape, p: float, gen: torch.Generator, device) -> Tensor:
    """What ``F.dropout(x, p)`` multiplies ``x`` by on the CPU: ``bernoulli(1 - p) / (1 - p)``."""
    noise = torch.empty(shape).bernoulli_(1 - p, generator=gen)
    return noise.div_(1 - p).to(device)


class _AdamW:
    """``torch.optim.AdamW`` (amsgrad off) on stacked parameters with a learning rate per model."""

    def __init__(self, params: dict[str, Tensor], lr: Tensor, betas: tuple[float, float], weight_decay: float,
                 eps: float = 1e-8):
        self.params, self.lr, self.betas, self.wd, self.eps = params, lr, betas, weight_decay, eps
        self.exp_avg = {k: torch.zeros_like(v) for k, v in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(v) for k, v in params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self, lr_scale: float) -> None:
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2_sqrt = 1 - b1 ** self.t, math.sqrt(1 - b2 ** self.t)
        for k, p in self.params.items():
            lr = (self.lr * lr_scale).view(-1, *[1] * (p.ndim - 1))
            p.mul_(1 - lr * self.wd)
            self.exp_avg[k].lerp_(p.grad, 1 - b1)
            self.exp_avg_sq[k].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (self.exp_avg_sq[k].sqrt() / bc2_sqrt).add_(self.eps)
            p.sub_(lr / bc1 * self.exp_avg[k] / denom)
            p.grad = None


def _val_metrics(task, P, data, attn_scale: float, counted=None, budget: int = 1 << 24) -> list[dict[str, float]]:
    """The task's validation metrics of each model, as :func:`interp.evaluate.evaluate` computes them (from token
    counts when ``counted`` = :func:`token_counts` of ``data`` is given)."""
    K = next(iter(P.values())).shape[0]
    if counted is not None:
        qtok, counts = counted
        qpos = target_positions(data)
        with torch.no_grad():
            logits = stacked_count_logits(P, qtok.expand(K, -1, -1), counts.expand(K, -1, -1, -1), attn_scale)
        preds = torch.full((K, *data.tokens.shape), -1, device=data.device, dtype=torch.long)
        loss = torch.zeros((K, *data.tokens.shape), device=data.device)
        r = torch.arange(len(data), device=data.device)[None, :, None]
        kk = torch.arange(K, device=data.device)[:, None, None]
        tgt = data.targets.gather(1, qpos)
        preds[kk, r, qpos[None]] = logits.argmax(-1)
        loss[kk, r, qpos[None]] = F.cross_entropy(logits.flatten(0, 2).float(), tgt.expand(K, -1, -1).flatten(),
                                                  reduction="none").view(K, *tgt.shape)
        return [task.metrics(preds[k], loss[k], data) for k in range(K)]
    d = P["embed.W_E"].shape[-1]
    preds = torch.full((K, *data.tokens.shape), -1, device=data.device, dtype=torch.long)
    loss = torch.zeros((K, *data.tokens.shape), device=data.device)
    rows_per_chunk = max(1, budget // max(1, K * data.tokens.shape[1] * d))
    with torch.no_grad():
        for start in range(0, len(data), rows_per_chunk):
            idx = torch.arange(start, min(start + rows_per_chunk, len(data)), device=data.device)
            chunk = data.select(idx)
            qpos = target_positions(chunk)
            if qpos is None:
                raise ConfigError("batched training needs tasks whose targets sit at the same few positions per row")
            logits = stacked_logits_at(P, chunk.tokens.expand(K, -1, -1), qpos.expand(K, -1, -1), attn_scale)
            r = idx[None, :, None]
            kk = torch.arange(K, device=data.device)[:, None, None]
            preds[kk, r, qpos[None]] = logits.argmax(-1)
            tgt = chunk.targets.gather(1, qpos)
            loss[kk, r, qpos[None]] = F.cross_entropy(logits.flatten(0, 2).float(), tgt.expand(K, -1, -1).flatten(),
                                                      reduction="none").view(K, *tgt.shape)
    return [task.metrics(preds[k], loss[k], data) for k in range(K)]


def train_population(task, specs: Sequence[ModelSpec], cfgs: Sequence[TrainConfig], outs: Sequence, *,
                     device: str | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Train ``len(specs)`` models as one batched computation; write model k to ``outs[k]`` as an ordinary
    checkpoint; return each model's provenance (the keys :func:`interp.training.train` returns, plus
    ``population``). Only ``init_seed`` (specs) and ``seed`` / ``lr`` (configs) may differ between models.
    Runs with deterministic algorithms, as :func:`interp.training.train` does (same seed, torch and thread count:
    same weights)."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _train_population(task, specs, cfgs, outs, device=device, progress=progress)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def _train_population(task, specs, cfgs, outs, *, device, progress) -> list[dict[str, Any]]:
    check_population(specs, cfgs)
    device = pick_device(device)
    outs = [Path(o) for o in outs]
    if len(outs) != len(specs) or len(set(outs)) != len(outs):
        raise ConfigError("a population needs one distinct output path per model")
    for o in outs:
        with AtomicFile(o, "the checkpoint"):  # every output path checked before any training
            pass
    cfg0, K = cfgs[0], len(specs)
    models, drop_gens = [], []
    for spec, cfg in zip(specs, cfgs):
        torch.manual_seed(cfg.seed)  # as train() does; build_model then seeds by spec.init_seed
        models.append(build_model(spec, device=device))
        g = torch.Generator()
        g.set_state(torch.get_rng_state())  # the state the solo run's dropout draws from
        drop_gens.append(g)
    if not supports_query_forward(models[0]):
        raise ConfigError("batched training needs a model the exact query-restricted forward covers")
    trainable = {n for n, p in models[0].named_parameters() if p.requires_grad}
    sd = [m.state_dict() for m in models]
    P = {n: torch.stack([s[n] for s in sd]).detach().clone().requires_grad_(n in trainable) for n in PARAMS}
    attn_scale = float(models[0].blocks[0].attn.attn_scale)
    opt = _AdamW({n: P[n] for n in PARAMS if n in trainable}, torch.tensor([c.lr for c in cfgs], device=device),
                 (cfg0.beta1, cfg0.beta2), cfg0.weight_decay)
    data_gens = [torch.Generator().manual_seed(c.seed) for c in cfgs]
    train_data, val_data = task.dataset("train").to(device), task.dataset("val").to(device)
    n, p_drop = len(train_data), cfg0.dropout
    # the O(vocab) forward where nothing position-dependent comes before attention
    use_counts = specs[0].positional == "none" and (p_drop == 0 or cfg0.dropout_at == "attention")
    d_vocab = models[0].cfg.d_vocab
    eval_counts = specs[0].positional == "none"  # evaluation has no dropout: counts suffice without positions
    train_counted = token_counts(train_data, d_vocab) if use_counts else None
    val_counted = token_counts(val_data, d_vocab) if eval_counts else None
    history: list[list[dict]] = [[] for _ in range(K)]
    best = [(-1.0, math.inf, -1)] * K  # (val accuracy, val loss, epoch)
    best_state = {n_: P[n_].detach().clone() for n_ in PARAMS}
    last_state = {n_: P[n_].detach().clone() for n_ in PARAMS}
    active = [True] * K
    epochs_run, steps = [0] * K, [0] * K
    step, started = 0, time.time()
    bar = tqdm(total=cfg0.epochs, desc=f"train {K} x {task.name}", unit="epoch", disable=not progress)
    for epoch in range(1, cfg0.epochs + 1):
        if not any(active):
            break
        perms = [torch.randperm(n, generator=g).to(device) for g in data_gens]
        totals = torch.zeros(K, dtype=torch.float64)
        count = 0
        d = P["embed.W_E"].shape[-1]
        for start in range(0, n, cfg0.batch_size):
            idx = torch.stack([perm[start:start + cfg0.batch_size] for perm in perms])  # [K, b]
            bsz = idx.shape[1]
            if use_counts:
                qtok, counts = train_counted[0][idx], train_counted[1][idx]
                targets = train_data.targets.gather(1, target_positions(train_data))[idx]
                out_mask = None
                if p_drop:  # per model, as the solo run draws it: the attention output [b, k, d]
                    out_mask = torch.stack([_dropout_mask((bsz, qtok.shape[-1], d), p_drop, g, device)
                                            for g in drop_gens])
                logits = stacked_count_logits(P, qtok, counts, attn_scale, out_mask)
            else:
                batches = [train_data.select(i) for i in idx]
                t = max(b.tokens.shape[1] for b in batches)
                tokens = torch.stack([F.pad(b.tokens, (0, t - b.tokens.shape[1])) for b in batches])
                qpos = torch.stack([target_positions(b) for b in batches])
                targets = torch.stack([b.targets.gather(1, q) for b, q in zip(batches, qpos)])
                emb_mask = out_mask = None
                if p_drop:  # per model, in the solo order: embedding [b, t_k, d] (unless "attention"), then output
                    emb_mask = torch.zeros(K, bsz, t, d, device=device) if cfg0.dropout_at != "attention" else None
                    out_mask = torch.empty(K, *qpos.shape[1:], d, device=device)
                    for k, (b, g) in enumerate(zip(batches, drop_gens)):
                        if emb_mask is not None:
                            emb_mask[k, :, :b.tokens.shape[1]] = _dropout_mask((bsz, b.tokens.shape[1], d), p_drop, g,
                                                                                device)
                        out_mask[k] = _dropout_mask((*qpos.shape[1:], d), p_drop, g, device)
                logits = stacked_logits_at(P, tokens, qpos, attn_scale, emb_mask, out_mask)
            losses = F.cross_entropy(logits.flatten(0, 2).float(), targets.flatten(), reduction="none")
            losses = losses.view(K, -1).mean(1)  # each model's own mean loss
            losses.sum().backward()
            opt.step(min(1.0, (step + 1) / max(cfg0.warmup, 1)))
            step += 1
            totals += losses.detach().double().cpu() * bsz
            count += bsz
        val = _val_metrics(task, {k_: v.detach() for k_, v in P.items()}, val_data, attn_scale, val_counted)
        for k in range(K):
            if not active[k]:
                continue
            epochs_run[k], steps[k] = epoch, step
            history[k].append({"epoch": epoch, "train_loss": float(totals[k] / count),
                               "val_accuracy": val[k]["accuracy"], "val_loss": val[k]["loss"]})
            acc, loss = val[k]["accuracy"], val[k]["loss"]
            if acc > best[k][0] or (acc == best[k][0] and loss < best[k][1]):
                best[k] = (acc, loss, epoch)
                for n_ in PARAMS:
                    best_state[n_][k] = P[n_].detach()[k]
            if cfg0.patience is not None and epoch - best[k][2] >= cfg0.patience or epoch == cfg0.epochs:
                active[k] = False
                for n_ in PARAMS:
                    last_state[n_][k] = P[n_].detach()[k]
        bar.update(1)
        bar.set_postfix(active=sum(active), best=f"{min(b[0] for b in best):.3f}-{max(b[0] for b in best):.3f}")
    bar.close()
    for k in range(K):
        if active[k]:
            for n_ in PARAMS:
                last_state[n_][k] = P[n_].detach()[k]

    # the kept models, evaluated on every split as one batched computation (what evaluate_splits gives each)
    keep_best = torch.tensor([c.keep == "best" for c in cfgs], device=device)
    final = {n_: torch.where(keep_best.view(-1, *[1] * (best_state[n_].ndim - 1)), best_state[n_], last_state[n_])
             for n_ in PARAMS}
    split_metrics = {}
    for split in task.splits:
        data = task.dataset(split).to(device)
        split_metrics[split] = _val_metrics(task, final, data, attn_scale,
                                            token_counts(data, d_vocab) if eval_counts else None)
    results = []
    wall = round(time.time() - started, 1)
    for k, (spec, cfg, model, out) in enumerate(zip(specs, cfgs, models, outs)):
        model.load_state_dict({**model.state_dict(), **{n_: final[n_][k].clone() for n_ in PARAMS}})
        model.eval()
        metrics = {split: split_metrics[split][k] for split in task.splits}
        prov = {
            "seed": cfg.seed, "epochs": cfg.epochs, "epochs_run": epochs_run[k], "steps": steps[k],
            "best_epoch": best[k][2], "kept": cfg.keep,
            "kept_epoch": best[k][2] if cfg.keep == "best" else epochs_run[k], "config": asdict(cfg),
            "accuracy": {s: m["accuracy"] for s, m in metrics.items()}, "metrics": metrics, "history": history[k],
            "device": device, "wall_seconds_this_run": wall, "torch": torch.__version__,
            "cpu_threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(),
            "population": {"size": K, "index": k, "forward": "token counts" if use_counts else "positions"},
        }
        save_checkpoint(out, model, spec, task, prov)
        results.append(prov)
    return results


def seed_population(task, spec: ModelSpec, cfg: TrainConfig, seeds: Sequence[int]):
    """Specs and configs for one model per seed, as ``interp train --seed S`` builds them (init seed = seed)."""
    return [replace(spec, init_seed=s) for s in seeds], [replace(cfg, seed=s) for s in seeds]
