"""What a checkpoint file rebuilds a model from, and the check that it rebuilds *this* model.

A checkpoint stores TransformerLens' whole configuration (every field of ``HookedTransformerConfig`` but the
placement, ``device`` and ``n_devices``), JSON-encoded by :func:`config_to_json` (numpy scalars as plain numbers;
``dtype`` by name, ``"float64"``, and left out where it is TransformerLens' default ``float32``, so the stored config
of a float32 model is ``HookedTransformerConfig(**config)`` as it stands). So every architecture TransformerLens
builds (grouped-query attention, gated MLPs, parallel attention and MLP, rotary / shortformer / ALiBi positions,
soft-capped scores and logits, every normalisation, ``attn_only``, ``d_vocab_out != d_vocab``, ...) is rebuilt by
:func:`build_from_config` with ``HookedTransformer(HookedTransformerConfig(**config))``. A model of the toolkit's own
:class:`interp.model.ModelSpec` (attention variants, hook-based positional schemes, frozen parameters) is rebuilt by
:func:`interp.model.build_model` from its spec instead, which must give the same configuration.

:func:`check_rebuilds` is run before a file is written: it rebuilds the model the file would describe, loads the
model's weights into it and refuses (one :class:`interp.errors.CheckpointError` naming what differs) a model that the
rebuilt one is not: another configuration, a module, parameter or buffer the configuration does not create, a method
replaced on an instance, a hook attached (forward, backward or state-dict), a parameter the spec fixes that holds
another value, or logits that differ on a small fixed batch of tokens (compared exactly: the same weights and the same
code give the same bits). So a model the stored configuration does not describe is refused when saving, never
discovered when loading.
"""

from __future__ import annotations

import dataclasses
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from .errors import CheckpointError, InterpError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from .configs import ModelSpec

# HookedTransformerConfig fields that say where a model lives, not what it computes: not stored, chosen at load
PLACEMENT = ("device", "n_devices")
# attributes of a HookedTransformer that are not part of what it computes from tokens, nor of the file
NOT_SAVED = ("tokenizer",)
# TransformerLens' default dtype, left out of a stored config (the only value a JSON config cannot pass to
# HookedTransformerConfig as it stands)
DEFAULT_DTYPE = "float32"
# on an accelerator, the largest difference between the logits of a model and its rebuilt copy that still counts as
# equal, relative to the logits' largest size (float32 rounding of another kernel's summation order)
ACCELERATOR_RTOL = 1e-5
# tokens of the forward that compares a model with its rebuilt copy: this many sequences of up to this many tokens
CHECK_BATCH, CHECK_LENGTH = 2, 32


def _plain(name: str, value: Any) -> Any:
    """``value`` as JSON types, or a CheckpointError naming the field that holds something a JSON file cannot
    describe (a function, a tensor, an object)."""
    import numpy as np

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    if isinstance(value, (int, float)):
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(name, v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(name, v) for k, v in value.items()}
    raise CheckpointError(
        f"cannot save this model: its TransformerLens config field {name!r} holds {type(value).__name__} "
        f"{value!r:.80}, which a checkpoint's JSON metadata cannot describe (a checkpoint rebuilds the model from its "
        "config: set the field to a plain value)"
    )


def config_to_json(cfg: HookedTransformerConfig) -> dict[str, Any]:
    """Every field of ``cfg`` but :data:`PLACEMENT`, as JSON types; ``dtype`` by name where it is not TransformerLens'
    default ``float32`` (so a float32 model's config is ``HookedTransformerConfig(**config)`` as it stands)."""
    return normalised(
        {f.name: _plain(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name not in PLACEMENT}
    )


def normalised(config: dict[str, Any]) -> dict[str, Any]:
    """A stored config as :func:`config_to_json` writes it: without the default ``dtype`` (``"float32"``)."""
    return {k: v for k, v in config.items() if not (k == "dtype" and v == DEFAULT_DTYPE)}


def config_from_json(config: dict[str, Any], device: str) -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` a checkpoint's ``tl_config`` describes, on ``device``; a CheckpointError where
    the installed TransformerLens lacks one of its fields or refuses a value."""
    from transformer_lens import HookedTransformerConfig

    known = {f.name for f in dataclasses.fields(HookedTransformerConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise CheckpointError(
            f"the checkpoint's TransformerLens config has field(s) {unknown[:5]} that the installed TransformerLens "
            "does not know: it was written with another version of TransformerLens; install that version"
        )
    kw = {k: v for k, v in config.items() if k not in PLACEMENT}
    if isinstance(kw.get("dtype"), str):
        dtype = getattr(torch, kw["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"the checkpoint's TransformerLens config has an unknown dtype {kw['dtype']!r}")
        kw["dtype"] = dtype
    # the tokenizer is not part of the file (nothing is downloaded at load): its name is restored after building
    kw["tokenizer_name"] = None
    try:
        with preserved_rng():  # HookedTransformerConfig(seed=...) reseeds torch, random and numpy
            return HookedTransformerConfig(**kw, device=device, n_devices=1)
    except (TypeError, ValueError, AssertionError) as e:
        raise CheckpointError(f"the checkpoint's TransformerLens config is not valid: {e}") from None


def build_from_config(config: dict[str, Any], device: str) -> HookedTransformer:
    """A freshly initialised ``HookedTransformer`` of the stored configuration ``config`` on ``device`` (the caller's
    random generators untouched)."""
    from transformer_lens import HookedTransformer

    from .model import quiet_tl

    quiet_tl()
    cfg = config_from_json(config, device)
    try:
        with preserved_rng(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = HookedTransformer(cfg, move_to_device=True)
    except (TypeError, ValueError, AssertionError, RuntimeError, NotImplementedError) as e:
        raise CheckpointError(f"TransformerLens cannot build the checkpoint's config: {e}") from None
    model.cfg.tokenizer_name = config.get("tokenizer_name")
    return model


def rebuild(spec: ModelSpec | None, config: dict[str, Any] | None, device: str) -> HookedTransformer:
    """The model a file describes, freshly initialised on ``device``: built from ``spec`` (the toolkit's own models)
    or from the TransformerLens ``config`` alone; the caller's random generators untouched either way."""
    if spec is None:
        if config is None:
            raise CheckpointError("neither a model spec nor a TransformerLens config describes the model")
        return build_from_config(config, device)
    from .model import build_model

    with preserved_rng():
        return build_model(spec, device=device)


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore torch's (CPU and every initialised CUDA device), Python's and numpy's global random state on exit:
    building a HookedTransformer reseeds all three, and saving or loading must not change what a run draws next."""
    import numpy as np

    py, npy = random.getstate(), np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys of two configurations whose values differ (one missing counts)."""
    return sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))


def _refuse(why: str) -> CheckpointError:
    return CheckpointError(f"cannot save this model: {why}")


def _hooks(module: torch.nn.Module) -> dict[str, int]:
    """How many hooks of each kind are registered on ``module``."""
    kinds = (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    )
    return {k.strip("_"): len(getattr(module, k, {}) or {}) for k in kinds}


def _overrides(module: torch.nn.Module) -> dict[str, str]:
    """Callables set on the instance (a method replaced, e.g. ``attn.calculate_attention_scores``), by name -> their
    type's name; the tokenizer, which maps strings to tokens and is not part of the file, aside."""
    return {
        k: type(v).__name__
        for k, v in vars(module).items()
        if callable(v)
        and not isinstance(v, (torch.nn.Module, torch.Tensor, type))
        and not k.startswith("__")
        and k not in NOT_SAVED
    }


def check_rebuilds(model: HookedTransformer, spec: ModelSpec | None, config: dict[str, Any]) -> None:
    """Refuse (one CheckpointError naming what differs) ``model`` unless the file's ``spec`` / ``config`` rebuild it
    exactly: the same configuration, modules, parameters and buffers, no hook or replaced method beyond what the spec
    installs, the spec's fixed parameters at their values, and bit-equal logits on a small fixed batch."""
    from .device import model_device

    device = model_device(model)
    if torch.device(model.cfg.device).type != device.type:
        raise _refuse(
            f"its parameters are on {device} but model.cfg.device is {str(model.cfg.device)!r} (moved with "
            f"torch.nn.Module.to?); TransformerLens' forward reads cfg.device: move it with model.to({str(device)!r}), "
            "which sets both"
        )
    how = "its ModelSpec (spec=)" if spec is not None else "its TransformerLens config"
    try:
        rebuilt = rebuild(spec, config, str(device))
    except InterpError as e:
        raise _refuse(f"{how} does not build: {e}") from None
    got = config_to_json(rebuilt.cfg)
    diff = differences(got, config)
    if diff:
        shown = ", ".join(f"{k}: model {config.get(k)!r} vs rebuilt {got.get(k)!r}" for k in diff[:4])
        raise _refuse(
            f"{how} builds a model whose TransformerLens config differs in {diff} ({shown})"
            + ("; save it without spec= to store the model's own config" if spec is not None else "")
        )
    mods, built = dict(model.named_modules()), dict(rebuilt.named_modules())
    extra, missing = sorted(set(mods) - set(built)), sorted(set(built) - set(mods))
    retyped = sorted(n for n in set(mods) & set(built) if type(mods[n]) is not type(built[n]))
    if extra or missing or retyped:
        what = "; ".join(
            s
            for s in (
                f"modules {extra[:4]} that {how} does not create" if extra else "",
                f"no modules {missing[:4]}" if missing else "",
                ", ".join(f"{n} is a {type(mods[n]).__name__}, not a {type(built[n]).__name__}" for n in retyped[:4]),
            )
            if s
        )
        raise _refuse(f"it has {what}")
    sd, sd_built = model.state_dict(), rebuilt.state_dict()
    extra, missing = sorted(set(sd) - set(sd_built)), sorted(set(sd_built) - set(sd))
    if extra or missing:
        raise _refuse(
            f"its parameters and buffers differ from those {how} creates"
            + (f": extra {extra[:5]}" if extra else "")
            + (f", missing {missing[:5]}" if missing else "")
        )
    params = {n for n, _ in model.named_parameters()}
    bad = [
        k
        for k in sd
        if sd[k].shape != sd_built[k].shape
        or (sd[k].dtype != sd_built[k].dtype and (k in params or not _survives_cast(sd[k], sd_built[k].dtype)))
    ]
    if bad:
        k = bad[0]
        raise _refuse(
            f"tensor {k} is {tuple(sd[k].shape)} {sd[k].dtype}, but {how} creates it "
            f"{tuple(sd_built[k].shape)} {sd_built[k].dtype}"
        )
    for name, module in mods.items():
        here, there = _overrides(module), _overrides(built[name])
        if here != there:
            changed = sorted(k for k in set(here) | set(there) if here.get(k) != there.get(k))
            raise _refuse(
                f"{name or 'the model'} has {changed} set on the instance (a replaced method), which {how} does not "
                "rebuild" + ("; a model built by interp.build_model needs its spec: pass spec=" if spec is None else "")
            )
        here, there = _hooks(module), _hooks(built[name])
        if here != there:
            kinds = sorted(k for k in here if here[k] != there[k])
            raise _refuse(
                f"{name or 'the model'} has {', '.join(kinds)} hook(s) attached that {how} does not install; remove "
                "them first (model.reset_hooks(including_permanent=True) removes TransformerLens hooks)"
                + ("; a model built by interp.build_model needs its spec: pass spec=" if spec is None else "")
            )
    from .integrity import verify_tensors

    verify_tensors(
        "cannot save this model",
        {k: v.detach().to("cpu") for k, v in sd.items()},
        spec,
        None,
        [n for n, _ in model.named_parameters()],
        why="the spec given does not describe the model: save it without spec= (its TransformerLens config "
        "describes it) or with the spec it was built from",
    )
    rebuilt.load_state_dict(sd, strict=True)
    _check_logits(model, rebuilt, how)


def _survives_cast(buffer: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a buffer's values are the same in ``dtype``, the dtype the rebuilt model keeps it in. TransformerLens'
    constant buffers (``IGNORE``, the masked score) keep the dtype they were created in when the config's ``dtype``
    is given, but follow ``model.to(dtype)``; loading copies the file's values into the rebuilt model's buffers, so a
    buffer is rebuilt exactly where its values survive that cast (the logits check covers the rest)."""
    back = buffer.to(dtype).to(buffer.dtype)
    if buffer.is_floating_point() or buffer.is_complex():
        return bool(torch.isclose(back, buffer, rtol=0, atol=0, equal_nan=True).all())
    return torch.equal(back, buffer)


def _check_logits(model: HookedTransformer, rebuilt: HookedTransformer, how: str) -> None:
    """Refuse unless ``model`` and ``rebuilt`` give the same logits on a fixed batch: bit for bit (NaN where NaN) on
    the CPU; on an accelerator to :data:`ACCELERATOR_RTOL` of the logits' largest size, since its libraries may pick
    another kernel for the second of two equal computations (every difference a saved model could hide, a block run
    in parallel or in sequence, another scale, a hook, is orders of magnitude larger)."""
    from .device import model_device

    cfg = model.cfg
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.d_vocab, (CHECK_BATCH, min(cfg.n_ctx, CHECK_LENGTH)), generator=gen)
    tokens = tokens.to(model_device(model))
    modes = {m: m.training for m in model.modules()}
    model.eval()
    rebuilt.eval()
    try:
        with torch.no_grad():
            a, b = model(tokens), rebuilt(tokens)
    finally:
        for m, mode in modes.items():
            m.training = mode
    close = a == b
    if a.device.type != "cpu" and a.shape == b.shape:
        close = close | ((a - b).abs() <= ACCELERATOR_RTOL * a.abs().nan_to_num(0, 0, 0).amax().clamp(min=1))
    same = a.shape == b.shape and bool((close | (torch.isnan(a) & torch.isnan(b))).all())
    if not same:
        gap = (a - b).abs().nan_to_num(float("inf")).max().item() if a.shape == b.shape else float("nan")
        raise _refuse(
            f"the model rebuilt from {how} with its weights gives other logits (largest difference {gap:.3g}): "
            "something outside its config changes what it computes"
        )
