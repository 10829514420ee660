"""Training a task model: AdamW, linear warmup, dropout through hooks, best-by-validation, resumable.

Defaults follow Fraknói 2024, §5.2: batch 128, lr 1e-3, weight decay 0.01, dropout 0.1, warmup over
``2 / (1 - beta2)`` steps (Ma & Yarats' untuned linear warmup, then constant), loss on the task's
answer positions only. One-layer attention-only models train through the exact query-restricted
forward of :mod:`interp.query_forward` (tested equal to the HookedTransformer forward). HookedTransformer has no
dropout, so during training only it is added by
forward hooks after the embedding (``blocks.0.hook_resid_pre``) and after every attention / MLP output
(``blocks.L.hook_attn_out``, ``blocks.L.hook_mlp_out``); evaluation never uses them.

Which model is kept (``keep``): ``"best"`` (default) is the epoch with the highest validation accuracy, ties broken
by the lower validation loss (then the earlier epoch), so an epoch that only ties the majority-class accuracy never
beats a later, better-trained one; ``"first-best"`` is the first epoch with the highest validation accuracy (ties
to the earlier epoch: "the best model selected on validation accuracy" read literally, which is what a loop that
only keeps a strictly better accuracy does); ``"last"`` is the final epoch.

Halving heads (Fraknói 2024, §5.5, ``TrainConfig.halving``): a persistent head mask (:mod:`interp.halving`) that
masks half of the active heads each time validation accuracy reaches ``halving_threshold``; the kept model is
then the best one-head state. The mask and its steps travel in the resume file and the checkpoint's metadata.

A resume file ``<out>.resume.safetensors`` is written every ``save_every`` epochs (weights, optimizer
moments, RNG states, best model so far, history, and every option of the run; no pickle). ``resume=True``
continues from it and ends with exactly the weights an uninterrupted run gives (on CPU; CUDA kernels may be
nondeterministic). A new run never deletes another run's resume file unless told to (``restart=True``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .attention import attention_of, is_plain, layer_attention
from .configs import TrainConfig, check_snapshot_every
from .curriculum import Curriculum, parse_curriculum
from .curriculum import batches as curriculum_batches
from .determinism import deterministic
from .device import pick_device
from .dropout_masks import dropout as dropout_of
from .errors import CheckpointError, ConfigError, TokenError
from .evaluation import check_tokens, evaluate, target_positions
from .fast_attention import fast_attention, has_fast_path
from .files import AtomicFile
from .halving import Halving, Scorer
from .initialisation import initialise
from .loading import save_checkpoint
from .model import ModelSpec, build_model, trainable_parameters
from .objectives import check_lm_targets, lm_targets
from .options import options
from .position_forward import evaluate_left_padded, solo_batch_loss
from .query_forward import logits_at, supports_query_forward
from .resume_file import Encoded, check_identity, read_resume_file, read_resume_metadata, write_resume_file
from .run_record import RunRecord, validation_split
from .schedules import warmup_factor
from .task import IGNORE, Task, TaskData, check_model_task, task_dataset
from .variants import Attention

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


LOSS_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def dropout_hooks(model: HookedTransformer, p: float, at: str = "embedding+attention") -> list:
    """Forward hooks that apply dropout after the embedding (unless ``at == "attention"``) and after each attention
    (and MLP) output."""
    if p == 0:
        return []

    def drop(x, hook):
        return dropout_of(x, p)  # F.dropout, its mask drawn on the CPU on every device (the same run on CUDA)

    names = [] if at == "attention" else ["blocks.0.hook_resid_pre"]
    for layer in range(model.cfg.n_layers):
        names.append(f"blocks.{layer}.hook_attn_out")
        if not model.cfg.attn_only:
            names.append(f"blocks.{layer}.hook_mlp_out")
    return [(n, drop) for n in names]


def task_loss(logits, targets, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Mean cross-entropy over the positions that have a target, computed in ``dtype``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(dtype), targets.reshape(-1), ignore_index=IGNORE)


def batch_loss(
    model: HookedTransformer,
    batch,
    hooks,
    dropout: float,
    dtype: torch.dtype = torch.float32,
    dropout_at: str = "embedding+attention",
    query_forward: bool | None = None,
) -> torch.Tensor:
    """Training loss of one batch: the exact query-restricted forward where it applies, else TL's. The two draw
    dropout masks of different shapes, so a run decides once, from its whole training split (``query_forward``,
    :func:`uses_query_forward`), never batch by batch; None decides from this batch alone."""
    if query_forward is None:
        query_forward = uses_query_forward(model, batch)
    qpos = target_positions(batch, few=False) if query_forward else None
    if qpos is not None:
        logits = logits_at(model, batch.tokens, qpos, dropout=dropout, embed_dropout=dropout_at != "attention")
        return task_loss(logits, batch.targets.gather(1, qpos), dtype)
    with model.hooks(fwd_hooks=hooks), fast_attention_where_possible(model):
        return task_loss(model(batch.tokens), batch.targets, dtype)


def uses_query_forward(model: HookedTransformer, train_data) -> bool:
    """Whether a run trains through the query-restricted forward: the model allows it and every row of its
    training split has the same few target positions (what a population needs to batch the run)."""
    return supports_query_forward(model) and target_positions(train_data) is not None


def solo_forward(model: HookedTransformer, cfg: TrainConfig, train_data) -> str:
    """Which forward a solo run of ``cfg`` trains ``model`` through (and so in which shapes it draws torch's dropout
    masks): ``"positions"`` (:func:`interp.position_forward.solo_batch_loss`: the recipe's options),
    ``"query"`` (:func:`interp.query_forward.logits_at`) or ``"transformer-lens"`` (the model's own forward)."""
    if _recipe_path(cfg) and supports_query_forward(model):
        return "positions"
    if not cfg.aux_loss and uses_query_forward(model, train_data):
        return "query"
    return "transformer-lens"


def inert_parameters(model: HookedTransformer) -> tuple[str, ...]:
    """The trainable parameters whose exact gradient is zero, which each step sets to zero rather than leave at the
    rounding noise autograd computes for them: the key bias ``b_K`` of a softmax layer. It adds ``q . b_K``, one
    constant per query and head, to every score of that query, and a softmax ignores a constant. Adam divides each
    gradient by its own running scale (Kingma and Ba, "Adam: A Method for Stochastic Optimization"), so noise of
    1e-9 moves ``b_K`` as far as a true gradient would, and two runs that round differently (a population and its
    solo run) drift apart in it. Only in the models a population batches (one attention-only layer, softmax
    pooling, standard positions, no soft cap: :func:`interp.query_forward.supports_query_forward`): elsewhere rotary
    keys or capped scores can make ``b_K`` matter, and those models keep TransformerLens' own gradient."""
    if not supports_query_forward(model) or layer_attention(model, 0).pooling != "softmax":
        return ()
    return ("blocks.0.attn.b_K",) if model.blocks[0].attn.b_K.requires_grad else ()


def task_splits(task: Task) -> dict[str, TaskData]:
    """The task's training split and every split it names, each built once."""
    return {s: task_dataset(task, s) for s in dict.fromkeys(("train", *task.splits))}


def check_fits(model: HookedTransformer, task: Task, splits: dict[str, TaskData]) -> None:
    """Refuse, before any training, a model that cannot take the task's data: vocabulary sizes other than the
    task's (:func:`interp.task.check_model_task`) or a split's sentences longer than its context (a TaskError /
    TokenError naming the split), rather than a failure deep in torch epochs later."""
    check_model_task(model, task)
    for name, data in splits.items():
        try:
            check_tokens(model, data.tokens)
        except TokenError as e:
            raise TokenError(f"the {name!r} split of task {task.name!r}: {e}") from None


def _recipe_path(cfg: TrainConfig) -> bool:
    """Whether a run goes through :func:`interp.position_forward.solo_batch_loss` (the options the query-restricted
    forward with ``F.dropout`` does not express: the language-model objective, left padding, dropout on the
    attention probabilities, counter-drawn masks) rather than the path every earlier run took."""
    return bool(recipe_options(cfg))


def recipe_options(cfg: TrainConfig) -> list[str]:
    """The options of ``cfg`` that train through the per-position forward (:func:`_recipe_path`), as a user spells
    them; empty where none does."""
    return [
        text
        for text, is_on in (
            (f"objective={cfg.objective!r}", cfg.objective == "lm"),
            ("padding='left'", cfg.padding == "left"),
            (f"dropout_at={cfg.dropout_at!r}", "pattern" in cfg.dropout_sites),
            ("dropout_rng='counter'", cfg.dropout_rng == "counter"),
        )
        if is_on
    ]


def variant_refusal(options: list[str], attention: str, qkv: str) -> str:
    """The one line refusing ``options`` (:func:`recipe_options`) for a model whose attention is not softmax with
    full Q/K/V: the solo run's and the population's, the same words."""
    return (
        f"{', '.join(options)} train{'s' if len(options) == 1 else ''} through the per-position forward, which "
        f"covers softmax attention with full Q/K/V; this model has attention={attention!r}, qkv={qkv!r}"
    )


def _check_recipe(model: HookedTransformer, cfg: TrainConfig) -> None:
    """Refuse, before training, recipe options a model's forward cannot carry out (one line naming them)."""
    if _recipe_path(cfg) and not is_plain(model):
        variant = next(a for a in attention_of(model) if not (a.is_softmax and a.qkv == "full"))
        attention = str(Attention(variant.pooling, variant.masks))
        raise ConfigError(variant_refusal(recipe_options(cfg), attention, variant.qkv))
    if supports_query_forward(model):
        return
    other = [
        o
        for o, on in (
            ("padding='left'", cfg.padding == "left"),
            ("dropout on the attention pattern", "pattern" in cfg.dropout_sites),
            ("dropout_rng='counter'", cfg.dropout_rng == "counter"),
        )
        if on
    ]
    if other:
        raise ConfigError(f"{', '.join(other)} needs a one-layer attention-only model (the per-position forward)")


def _check_task_options(task: Task, cfg: TrainConfig, train_data: TaskData) -> None:
    """Refuse, before training, options the task's data cannot carry out: an auxiliary loss without auxiliary
    targets, a curriculum over a field the data lacks."""
    if cfg.aux_loss and train_data.aux_targets is None:
        raise ConfigError(
            f"aux_loss={cfg.aux_loss}: the data of task {task.name!r} (with these parameters) has no auxiliary "
            "targets (integer addition gives its carries with reverse_operands=true)"
        )
    if cfg.aux_loss and _recipe_path(cfg):
        raise ConfigError(
            "aux_loss trains through TransformerLens' forward; it does not combine with the options of "
            "the per-position forward (objective lm, left padding, pattern dropout, counter masks)"
        )
    if cfg.curriculum is not None:
        curriculum_levels(train_data, parse_curriculum(cfg.curriculum))


def _evaluate(model: HookedTransformer, task: Task, data: TaskData, cfg: TrainConfig) -> dict[str, float]:
    """The task's metrics, with the data left-padded in batches as in training under ``padding="left"``."""
    if cfg.padding == "left":
        return evaluate_left_padded(model, task, data, cfg.batch_size)
    return evaluate(model, task, data)


def fast_attention_where_possible(model: HookedTransformer):
    """:func:`interp.fast_attention.fast_attention` for a model whose every layer has a fast form (sparse masks,
    linear attention), else nothing: the O(n·W) / O(n) forwards train the same model as TransformerLens' forward."""
    return fast_attention(model) if has_fast_path(model) else nullcontext()


def resume_path(out: Path) -> Path:
    out = Path(out)
    return out.with_name(out.name.removesuffix(".safetensors") + ".resume.safetensors")


def snapshot_directory(out) -> Path:
    """Where a run's snapshots go by default: ``<out without .safetensors>.snapshots/`` (solo runs and populations
    alike, so a sweep's analyses find every run's snapshots beside its checkpoint)."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".safetensors") + ".snapshots")


def snapshot_name(epoch: int) -> str:
    """A snapshot's file name: ``epoch-00000N.safetensors`` (six digits: sorted by name is sorted by epoch)."""
    return f"epoch-{epoch:06d}.safetensors"


def snapshot_training(cfg: TrainConfig, epoch: int, record: dict[str, Any]) -> dict[str, Any]:
    """A snapshot checkpoint's ``training`` metadata: its epoch, seed, whole config and that epoch's history record
    (the same in a solo run and in a population)."""
    return {"epoch": epoch, "seed": cfg.seed, "config": asdict(cfg), "record": record}


class _State:
    """A solo run's mutable state: model, optimizer, data-order generator, epoch and step counters, the kept-so-far
    weights and the :class:`interp.run_record.RunRecord`; (de)serialised to a safetensors resume file."""

    def __init__(self, model: HookedTransformer, opt: torch.optim.Optimizer, gen: torch.Generator, record: RunRecord):
        self.model, self.opt, self.gen, self.record = model, opt, gen, record
        self.epoch = 0  # epochs completed
        self.step = 0
        self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def save(self, path: Path, identity: dict[str, Any], options: dict[str, Any]) -> None:
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        tensors.update({f"best.{k}": v for k, v in self.best_state.items()})
        opt_sd = self.opt.state_dict()
        for i, st in opt_sd["state"].items():
            for k, v in st.items():
                tensors[f"opt.{i}.{k}"] = torch.as_tensor(v)
        tensors["rng.torch"] = torch.random.get_rng_state()
        tensors["rng.shuffle"] = self.gen.get_state()
        if torch.cuda.is_available():
            tensors["rng.cuda"] = torch.cuda.get_rng_state()
        write_resume_file(
            path,
            tensors,
            identity,
            "the resume file",
            options=options,
            progress={"epoch": self.epoch, "step": self.step, "record": Encoded(self.record.to_json())},
            param_groups=opt_sd["param_groups"],
        )

    def load(self, path: Path, identity: dict[str, Any]) -> None:
        tensors, meta = read_resume_file(path, "resume file", required=("identity", "progress", "param_groups"))
        # options added since the file was written count as their defaults (e.g. loss_dtype)
        check_identity(
            path,
            meta["identity"],
            identity,
            what="resume file",
            owner="a different run",
            fix="use the same options or delete it",
            defaults={f.name: f.default for f in fields(TrainConfig)},
        )
        dev = next(self.model.parameters()).device
        self.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        self.best_state = {k[5:]: v.to(dev) for k, v in tensors.items() if k.startswith("best.")}
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith("opt."):
                _, i, name = k.split(".", 2)
                state.setdefault(int(i), {})[name] = v if name == "step" else v.to(dev)
        self.opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        torch.random.set_rng_state(tensors["rng.torch"])
        self.gen.set_state(tensors["rng.shuffle"])
        if "rng.cuda" in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors["rng.cuda"])
        prog = meta["progress"]
        self.epoch, self.step = prog["epoch"], prog["step"]
        keep, patience = self.record.keep, self.record.patience
        if "record" in prog:
            self.record = RunRecord.from_dict(prog["record"], keep, patience)
        else:  # a resume file written before the run record existed
            halving = Halving.from_dict(prog["halving"]) if prog.get("halving") is not None else None
            self.record = RunRecord(
                keep,
                patience,
                halving,
                prog["history"],
                prog["best_val"],
                prog.get("best_loss", float("inf")),
                prog["best_epoch"],
                self.epoch,
                self.step,
            )


def resume_options(out) -> dict[str, Any]:
    """The options of the interrupted run whose resume file belongs to ``out``: ``{"task": {"name", "params"},
    "spec": {...}, "config": {...}}`` (so that ``--resume`` needs none of them retyped)."""
    rpath = resume_path(Path(out))
    if not rpath.is_file():
        raise CheckpointError(f"--resume: no resume file {rpath} (one is written every few epochs; see --save-every)")
    meta = read_resume_metadata(rpath, "resume file", fix="start over with --restart (is it from an older version?)")
    identity, options = meta["identity"], meta.get("options", {})
    config = {**{k: v for k, v in identity.items() if k not in ("task", "spec")}, **options}
    return {"task": identity["task"], "spec": identity["spec"], "config": config}


def train(
    task: Task,
    spec: ModelSpec,
    cfg: TrainConfig,
    out,
    *,
    device: str | None = None,
    resume: bool = False,
    restart: bool = False,
    progress: bool = True,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
    history_extras: Callable[[Any, int], dict[str, Any]] | None = None,
    snapshot_every: int | None = None,
    snapshot_dir=None,
    head_scorer: Scorer | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train a model for ``task``; write the kept model (``cfg.keep``) to ``out``; return its provenance.

    ``out`` is checked before any training: a regular file or a new name (:func:`interp.files.check_output_path`),
    and an existing file there (another run's checkpoint) is replaced only with ``overwrite=True`` (``interp train
    --overwrite``). An existing resume file of ``out`` is continued with ``resume=True``, deleted to start over with
    ``restart=True`` (which also replaces what the interrupted run's path holds), and otherwise refused (a
    ConfigError saying how to do either).

    ``on_epoch_end(epoch, record)`` is called after each epoch (after the resume file is written), e.g. to
    log metrics; an exception it raises stops training like an interruption would.

    ``history_extras(model, epoch)`` (model in eval mode, no grad) returns more numbers for that epoch's history
    record (e.g. a task's progress measures); they are stored in the resume file and the checkpoint's history.
    ``snapshot_every=N`` writes a checkpoint of the current model every N epochs into ``snapshot_dir`` (default
    ``<out without .safetensors>.snapshots/``) as ``epoch-000N.safetensors``.

    The validation split is the task's ``"val"`` split, or its last split when it has none (e.g. ``"test"``).

    Training runs in :func:`interp.determinism.deterministic` (deterministic algorithms: on CPU, multi-threaded
    scatter-adds, the backward of embedding / index lookups, otherwise make runs differ in the last bits). The same
    seed, torch version and thread count then give bit-identical weights.

    ``cfg.halving`` trains with halving heads (:mod:`interp.halving`); strategies other than ``random`` and
    ``mask-all-but-one`` need ``head_scorer`` (``interp.analyses.halving.train_halving`` passes it). The kept model is
    then the best one-head state (or, if the run never got down to one head, the last state: a failure)."""
    with deterministic():
        return _train(
            task,
            spec,
            cfg,
            out,
            device=device,
            resume=resume,
            restart=restart,
            progress=progress,
            on_epoch_end=on_epoch_end,
            history_extras=history_extras,
            snapshot_every=snapshot_every,
            snapshot_dir=snapshot_dir,
            head_scorer=head_scorer,
            overwrite=overwrite,
        )


def _train(
    task: Task,
    spec,
    cfg,
    out,
    *,
    device,
    resume,
    restart,
    progress,
    on_epoch_end,
    history_extras=None,
    snapshot_every=None,
    snapshot_dir=None,
    head_scorer=None,
    overwrite=False,
) -> dict[str, Any]:
    device = pick_device(device)
    out = Path(out)
    snapshot_dir = _check_outputs(out, cfg, resume, restart, snapshot_every, snapshot_dir, overwrite)
    rpath = resume_path(out)
    state, identity, options = _start(task, spec, cfg, device, rpath if resume else None)
    record, model, opt, _gen = state.record, state.model, state.opt, state.gen
    halving = record.halving
    if halving is not None:
        halving.start(model, opt)
    splits = task_splits(task)  # built once: checked, trained on, validated on, evaluated at the end
    check_fits(model, task, splits)
    train_data = splits["train"].to(device)
    if cfg.objective == "lm":
        check_lm_targets(task, train_data)
    val_data = splits[validation_split(task)].to(device)
    forward = solo_forward(model, cfg, train_data)
    loss_dtype = LOSS_DTYPES[cfg.loss_dtype]
    hooks = dropout_hooks(model, cfg.dropout, cfg.dropout_at)
    _check_recipe(model, cfg)
    _check_task_options(task, cfg, train_data)
    started = time.time()
    if state.epoch >= cfg.epochs:
        raise ConfigError(f"the resumed run has already done {state.epoch} epochs; ask for more than that")
    bar = tqdm(total=cfg.epochs, initial=state.epoch, desc=f"train {task.name}", unit="epoch", disable=not progress)
    while state.epoch < cfg.epochs:
        train_loss, extras = _train_epoch(state, cfg, train_data, hooks, loss_dtype, forward)
        model.eval()
        val = _evaluate(model, task, val_data, cfg)
        state.epoch += 1
        if record.end_epoch(state.epoch, state.step, train_loss, val):
            state.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        record.history[-1].update(extras)
        if history_extras is not None:
            with torch.no_grad():
                record.history[-1].update(history_extras(model, state.epoch))
        if snapshot_dir is not None and state.epoch % snapshot_every == 0:
            save_checkpoint(
                model,
                task,
                snapshot_dir / snapshot_name(state.epoch),
                training=snapshot_training(cfg, state.epoch, record.history[-1]),
                spec=spec,
            )
        if halving is not None:
            record.note_halving(
                halving.after_validation(
                    model, opt, state.epoch, val["accuracy"], task, train_data, val_data, head_scorer
                )
            )
        bar.update(1)
        bar.set_postfix(
            loss=f"{train_loss:.4f}",
            val=f"{val['accuracy']:.4f}",
            best=f"{record.best_accuracy:.4f}@{record.best_epoch}",
            **({"heads": len(halving.active)} if halving is not None else {}),
        )
        if state.epoch % cfg.save_every == 0 and state.epoch < cfg.epochs:
            state.save(rpath, identity, options)
        if on_epoch_end is not None:
            on_epoch_end(state.epoch, record.history[-1])
        if record.should_stop(state.epoch):
            break
    bar.close()
    if record.kept != "last":
        model.load_state_dict(state.best_state)
    model.eval()
    final = {s: splits[s] for s in task.splits}
    metrics = {
        s: _evaluate(model, task, data.to(device), cfg) if cfg.padding == "left" else evaluate(model, task, data)
        for s, data in final.items()
    }
    examples = {s: len(data) for s, data in final.items()}
    provenance = record.provenance(cfg, metrics, device, time.time() - started, examples=examples)
    save_checkpoint(model, task, out, training=provenance, spec=spec)
    rpath.unlink(missing_ok=True)
    return provenance


def _check_outputs(
    out: Path,
    cfg: TrainConfig,
    resume: bool,
    restart: bool,
    snapshot_every: int | None,
    snapshot_dir,
    overwrite: bool = False,
) -> Path | None:
    """Everything a run will write, checked before any training: the checkpoint path (a directory, a FIFO, a device,
    a symbolic link, a missing folder or an unwritable path fails now; an existing file only with ``overwrite``, or
    as the path of the interrupted run ``resume``/``restart`` continue or start over), the resume file's state
    against ``resume`` / ``restart``, and the snapshot folder (returned, created)."""
    check_snapshot_every(snapshot_every, cfg.epochs)
    with AtomicFile(out, "the checkpoint"):
        pass
    rpath = resume_path(out)
    if out.exists() and not (overwrite or resume or (restart and rpath.is_file())):
        raise ConfigError(
            f"{out} already exists (another run's checkpoint?): a new run does not replace it unless asked; pass "
            "overwrite=True (interp train --overwrite) to replace it, or write to another path"
        )
    if resume and restart:
        raise ConfigError("--resume continues the interrupted run and --restart deletes it: give one of them")
    if resume and not rpath.is_file():
        raise CheckpointError(f"--resume: no resume file {rpath} (it is written every {cfg.save_every} epochs)")
    if not resume and rpath.is_file():
        if not restart:
            raise ConfigError(
                f"{rpath} holds an interrupted run of {out}: continue it with --resume, or start over "
                "with --restart (which deletes it)"
            )
        rpath.unlink()
    if snapshot_every is None:
        return None
    snapshot_dir = Path(snapshot_dir) if snapshot_dir else snapshot_directory(out)
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    return snapshot_dir


def _start(
    task: Task, spec: ModelSpec, cfg: TrainConfig, device: str, resume_file: Path | None
) -> tuple[_State, dict[str, Any], dict[str, Any]]:
    """A new run's state (seeded model, AdamW, data-order generator, empty record), continued from
    ``resume_file`` when given; with the run's identity (what a resume file must match) and resumable options."""
    torch.manual_seed(cfg.seed)
    model = build_model(spec, device=device)
    initialise(model, spec, cfg.init, cfg.init_scale)  # the recipe's initialisation (the global RNG untouched)
    model.train()
    optimizer = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    opt = optimizer(trainable_parameters(model), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    halving = (
        Halving(cfg.halving, cfg.halving_threshold, spec.n_layers, spec.n_heads, cfg.seed)
        if cfg.halving is not None
        else None
    )
    state = _State(model, opt, gen, RunRecord(cfg.keep, cfg.patience, halving))
    resumable = [name for name, o in options(TrainConfig).items() if o.resumable]
    identity = {
        "task": {"name": task.name, "params": task.params()},
        "spec": spec.to_dict(),
        **{k: v for k, v in asdict(cfg).items() if k not in resumable},
    }
    run_options = {k: getattr(cfg, k) for k in resumable}
    if resume_file is not None:
        state.load(resume_file, identity)
    return state, identity, run_options


def _train_epoch(
    state: _State, cfg: TrainConfig, train_data: TaskData, hooks: list, loss_dtype: torch.dtype, forward: str
) -> tuple[float, dict[str, Any]]:
    """One epoch of AdamW steps over the training data in this epoch's order (under a curriculum, the batches its
    schedule allows: :mod:`interp.curriculum`); the mean training loss and what the epoch's history record adds
    (``batch_levels`` under a curriculum)."""
    model, opt = state.model, state.opt
    halving = state.record.halving
    model.train()
    n = len(train_data)
    total = 0.0
    recipe, query_forward = forward == "positions", forward == "query"  # forward: solo_forward's, for every batch
    identity_w_o = bool(model.cfg.n_heads * model.cfg.d_head == model.cfg.d_model and not model.W_O.requires_grad)
    inert = [dict(model.named_parameters())[n] for n in inert_parameters(model)]
    levels, extras = None, {}
    if cfg.curriculum is None:
        perm = torch.randperm(n, generator=state.gen).to(train_data.device)
        order = (perm[start : start + cfg.batch_size] for start in range(0, n, cfg.batch_size))
    else:
        schedule = parse_curriculum(cfg.curriculum)
        levels = curriculum_levels(train_data, schedule)
        sizes = [min(cfg.batch_size, n - start) for start in range(0, n, cfg.batch_size)]
        order = curriculum_batches(schedule, levels, sizes, state.step, state.gen)
        extras["batch_levels"] = []
    for idx in order:
        batch = train_data.select(idx)
        if levels is not None:
            extras["batch_levels"].append(int(levels[idx].max()))
        for g in opt.param_groups:
            g["lr"] = cfg.lr * warmup_factor(cfg, state.step)
        if recipe:
            loss = solo_batch_loss(model, batch, idx, cfg, state.epoch, identity_w_o, loss_dtype)
        elif cfg.aux_loss:
            loss = aux_batch_loss(model, batch, hooks, cfg.aux_loss, loss_dtype)
        else:
            if cfg.objective == "lm":  # a model the per-position forward does not cover: TransformerLens' own
                batch.targets = lm_targets(batch)
            loss = batch_loss(model, batch, hooks, cfg.dropout, loss_dtype, cfg.dropout_at, query_forward)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in inert:  # exactly zero, not rounding noise (inert_parameters)
            if p.grad is not None:
                p.grad.zero_()
        opt.step()
        if halving is not None:
            halving.apply(model)  # masked heads stay exactly zero
        state.step += 1
        total += loss.item() * len(batch)
    return total / n, extras


def curriculum_levels(data: TaskData, schedule: Curriculum) -> torch.Tensor:
    """The per-example values of the curriculum's field in ``data`` (a ConfigError naming the fields there are)."""
    levels = data.fields.get(schedule.field)
    if levels is None or levels.ndim != 1 or levels.is_floating_point():
        raise ConfigError(
            f"curriculum {schedule}: the training data has no per-example integer field {schedule.field!r}; its "
            f"fields are {sorted(k for k, v in data.fields.items() if v.ndim == 1)}"
        )
    return levels


def aux_batch_loss(
    model: HookedTransformer, batch: TaskData, hooks, weight: float, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The task's loss plus ``weight`` times the cross-entropy on the batch's ``aux_targets`` (one forward)."""
    with model.hooks(fwd_hooks=hooks), fast_attention_where_possible(model):
        logits = model(batch.tokens)
    return task_loss(logits, batch.targets, dtype) + weight * task_loss(logits, batch.aux_targets, dtype)
