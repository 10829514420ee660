"""Looped transformers: a block of layers applied several times with shared weights, with input injection.

Yang et al. 2023 (*Looped Transformers are Better at Learning Learning Algorithms*) and Fan et al. 2024 (*Looped
Transformers for Length Generalization*) apply one block of ``b`` layers ``L`` times, the block's weights shared by
every iteration, and add the embedded input to the input of every iteration (*input injection*: iteration ``k``
reads ``h_k + e`` where ``h_k`` is the previous iteration's output and ``e`` the embedding), so that the number of
iterations can be chosen at evaluation time too (more for longer inputs).

Here a looped model is still a plain ``HookedTransformer`` with ``b * L`` blocks (``cfg.n_layers = b * L``): block
``i`` is its own module, with its own hook points (``blocks.{i}.hook_resid_pre``, ``blocks.{i}.attn.hook_z``, ...),
whose parameters *are* block ``i mod b``'s (the same ``Parameter`` objects). So every analysis, activation and path
patching and the explorer see every iteration as a layer (head ``L3H1`` is head 1 of the block's layer ``3 mod b``
in iteration ``3 // b``), ``model.parameters()`` holds each shared weight once (the optimizer updates it once, with
the gradient summed over the iterations), and moving the model keeps the ties.

Input injection is done by PyTorch hooks on the block modules (not TransformerLens hooks: ``reset_hooks`` keeps
them, and every TransformerLens hook still fires): block 0's input, the embedding (after ``hook_embed`` and
``hook_pos_embed``; their sum where positions are added to the residual stream), is kept by a forward pre-hook,
and a forward hook on the last block of every iteration but the last adds it to that block's output, the next
iteration's input. So ``blocks.{kb}.hook_resid_pre`` is what block ``kb`` reads, ``h_k + e``, as in any
HookedTransformer (patching it replaces the injected input; a forward started there with ``start_at_layer`` takes
it as it is), and it differs from ``blocks.{kb-1}.hook_resid_post`` by ``e``: a decomposition of the residual stream
into components counts the embedding once per iteration. Patching ``blocks.0.hook_resid_pre`` changes the first
iteration's input only; patching ``hook_embed`` or ``hook_pos_embed`` changes what every iteration reads. Why hooks
on the blocks rather than a TransformerLens hook on ``hook_resid_pre`` adding a cached ``hook_embed`` +
``hook_pos_embed``: the injection then survives ``model.reset_hooks()``, runs before any user hook at the same
point (so a cache or a patch sees the block's real input), and the embedding it adds is the one after a user's
patch of ``hook_embed``. A forward that starts at a block (TransformerLens' ``start_at_layer``) has no embedding to
inject: give it with :func:`injected_input` (activation and path patching do), otherwise it is refused where an
iteration would need it.

The checkpoint stores one copy of the shared weights: the model's ``state_dict()`` holds blocks ``0 .. b-1`` only (a
state-dict hook drops the copies) and ``load_state_dict`` fills the copies from them (a load pre-hook), so the file,
the trainers' best states and the resume files hold each weight once, and loading rebuilds the ties.

:func:`iterations` runs a looped model with another number of iterations (``with iterations(model, 6): ...``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from .errors import ConfigError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


class Loop:
    """A looped model's record (found with :func:`loop_of`): the block size ``block`` (layers with their own
    weights), whether the input is injected, and the embedding of the forward being run. It is the model's
    state-dict hook that drops the shared copies."""

    def __init__(self, block: int, injection: bool):
        self.block, self.injection = int(block), bool(injection)
        self.embedded: Tensor | None = None  # the embedding of the forward being run
        self.given: Tensor | None = None  # set by injected_input() for forwards that start at a block
        self.pending = False  # an embedding was computed and block 0 has not run since
        self.live = False  # the forward being run started from the tokens: ``embedded`` is its own

    def loops(self, model: HookedTransformer) -> int:
        return model.cfg.n_layers // self.block

    def copies(self, key: str) -> bool:
        """Whether state-dict entry ``key`` belongs to a block that shares another block's weights."""
        if not key.startswith("blocks."):
            return False
        return int(key.split(".", 2)[1]) >= self.block

    def __call__(self, module, state_dict, prefix, local_metadata) -> None:
        """The state-dict post-hook: drop the copies (blocks ``b ..``), keeping one copy of each shared weight."""
        for key in [k for k in state_dict if k.startswith(prefix) and self.copies(k[len(prefix) :])]:
            del state_dict[key]


class _FillCopies:
    """Load pre-hook: a state dict of one copy fills the shared blocks too (they are the same tensors, so each is
    loaded once per iteration, with the same values)."""

    def __init__(self, loop: Loop):
        self.loop = loop

    def __call__(self, module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        b = self.loop.block
        for i in range(b, len(module.blocks)):
            source = f"{prefix}blocks.{i % b}."
            for key in [k for k in list(state_dict) if k.startswith(source)]:
                state_dict.setdefault(f"{prefix}blocks.{i}." + key[len(source) :], state_dict[key])


class _Embedded:
    """Forward hook on ``model.embed``: an embedding was computed, so the block 0 that runs next starts a forward from
    the tokens (TransformerLens' ``run_with_hooks`` calls ``forward`` itself, so no hook on the model would see the
    start of a forward; the embedding module runs in exactly the forwards that start from tokens)."""

    def __init__(self, loop: Loop):
        self.loop = loop

    def __call__(self, module, args, output):
        self.loop.pending = True


class _Capture:
    """Block 0's forward pre-hook: in a forward from the tokens, keep its input, the embedding; in one that starts at
    block 0 (``start_at_layer=0``), use the embedding :func:`injected_input` gives."""

    def __init__(self, loop: Loop):
        self.loop = loop

    def __call__(self, module, args, kwargs):
        loop = self.loop
        loop.live = loop.pending
        if loop.pending:
            loop.embedded = args[0] if args else kwargs["resid_pre"]
        loop.pending = False


class _Inject:
    """The forward hook of the last block of every iteration: add the embedding to the block's output, the next
    iteration's input (so ``blocks.{kb}.hook_resid_pre`` is what block ``kb`` reads, and a forward started there
    with ``start_at_layer`` takes that value as it is); after the last iteration, release it."""

    def __init__(self, loop: Loop, index: int, cfg):
        self.loop, self.index, self.cfg = loop, index, cfg

    def __call__(self, module, args, output):
        loop = self.loop
        if self.index + 1 >= self.cfg.n_layers:  # the last iteration: its output goes to the unembedding as it is
            loop.live, loop.embedded = False, None
            return None
        e = loop.embedded if loop.live else loop.given
        if e is None:
            raise ConfigError(
                f"a looped model with input injection adds the embedded input to block {self.index + 1}'s input, "
                "and this forward did not compute it (it starts at a block): give it with "
                "interp.looping.injected_input(model, interp.looping.embedded_input(model, tokens))"
            )
        if e.shape != output.shape:
            raise ConfigError(
                f"the embedded input given to the looped model has shape {tuple(e.shape)}, but block {self.index} "
                f"writes a residual stream of shape {tuple(output.shape)}"
            )
        return output + e


def loop_of(model: HookedTransformer) -> Loop | None:
    """The :class:`Loop` of a looped model, or None (a model whose blocks have their own weights)."""
    return next((h for h in model._state_dict_hooks.values() if isinstance(h, Loop)), None)


def injects_input(model: HookedTransformer) -> bool:
    """Whether blocks after the first iteration read more than the residual stream (a looped model with input
    injection): a forward that starts after block 0 needs :func:`injected_input`."""
    loop = loop_of(model)
    return loop is not None and loop.injection and loop.loops(model) > 1


def _tie(block: torch.nn.Module, source: torch.nn.Module) -> None:
    """Make every parameter of ``block`` the same ``Parameter`` as ``source``'s."""
    for name, param in list(source.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        setattr(block.get_submodule(owner) if owner else block, leaf, param)


def _hook_block(model: HookedTransformer, loop: Loop, index: int) -> None:
    """Block ``index``'s injection hook: block 0 keeps the embedding, the last block of every iteration but the last
    adds it to its output."""
    if not loop.injection:
        return
    if index == 0:
        model.blocks[0].register_forward_pre_hook(_Capture(loop), with_kwargs=True)
    if (index + 1) % loop.block == 0:  # acts where another iteration follows (the number may change: set_loops)
        model.blocks[index].register_forward_hook(_Inject(loop, index, model.cfg))


def install(model: HookedTransformer, block: int, injection: bool = True) -> Loop:
    """Tie ``model``'s blocks ``i -> i mod block`` and install the state-dict hooks (one stored copy) and, with
    ``injection``, the input injection. ``model.cfg.n_layers`` must be a multiple of ``block``."""
    n = model.cfg.n_layers
    if loop_of(model) is not None:
        raise ConfigError("the model is already looped")
    if block < 1 or n % block:
        raise ConfigError(f"a looped model's {n} blocks must be whole iterations of a block of {block} layers")
    loop = Loop(block, injection)
    for i in range(block, n):
        _tie(model.blocks[i], model.blocks[i % block])
    model.register_state_dict_post_hook(loop)
    model.register_load_state_dict_pre_hook(_FillCopies(loop))
    if injection:
        model.embed.register_forward_hook(_Embedded(loop))
        for i in range(n):
            _hook_block(model, loop, i)
    return loop


def set_loops(model: HookedTransformer, loops: int) -> None:
    """Run a looped model ``loops`` times from now on (in place): blocks are added (tied to the block's weights,
    with their hook points) or dropped, and ``cfg.n_layers`` follows. A model whose iterations were changed so no
    longer matches its spec: :func:`iterations` changes them for a ``with`` block only."""
    from transformer_lens.utilities.typed_module_list import TypedModuleList

    from .device import model_device

    loop = _require_loop(model)
    if not isinstance(loops, int) or isinstance(loops, bool) or loops < 1:
        raise ConfigError(f"loops must be a positive integer, got {loops!r}")
    b, have = loop.block, list(model.blocks)
    blocks = have[: b * loops]
    device, dtype = torch.device(model_device(model)), model.cfg.dtype
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    # a new block's own initialisation must not move the caller's random stream (torch's: a block draws from no other)
    with torch.random.fork_rng(devices=cuda):
        for i in range(len(blocks), b * loops):
            new = type(have[0])(model.cfg, i).to(device=device, dtype=dtype)
            _tie(new, have[i % b])
            new.train(model.training)
            blocks.append(new)
    model.blocks = TypedModuleList(blocks)
    model.cfg.n_layers = b * loops
    for i in range(len(have), b * loops):
        _hook_block(model, loop, i)
    model.setup()  # TransformerLens' names of the hook points (blocks.{i}.*) follow the blocks


@contextmanager
def iterations(model: HookedTransformer, loops: int) -> Iterator[HookedTransformer]:
    """Run a looped model ``loops`` times inside the ``with`` block (Fan et al. 2024 choose more iterations for
    longer inputs), then restore its own number of iterations and blocks."""
    from transformer_lens.utilities.typed_module_list import TypedModuleList

    _require_loop(model)
    blocks, n_layers = model.blocks, model.cfg.n_layers
    try:
        set_loops(model, loops)
        yield model
    finally:
        model.blocks = blocks if isinstance(blocks, TypedModuleList) else TypedModuleList(list(blocks))
        model.cfg.n_layers = n_layers
        model.setup()


@contextmanager
def injected_input(model: HookedTransformer, embedding: Float[Tensor, "batch pos d_model"]) -> Iterator[None]:
    """Inside the ``with`` block, forwards of a looped model that start after block 0 (``start_at_layer``) inject
    ``embedding`` (the input of block 0 of the same tokens: :func:`embedded_input`)."""
    loop = _require_loop(model)
    before = loop.given
    loop.given, loop.live, loop.pending = embedding, False, False  # nothing computed before counts in here
    try:
        yield
    finally:
        loop.given = before


def embedded_input(model: HookedTransformer, tokens) -> Float[Tensor, "batch pos d_model"]:
    """The input of block 0 for ``tokens``: what a looped model injects into every iteration (TransformerLens'
    embedding hooks fire, as in a forward)."""
    residual, *_ = model.input_to_embed(tokens)
    loop = loop_of(model)
    if loop is not None:
        loop.pending = False  # no forward follows this embedding
    return residual


def _require_loop(model: HookedTransformer) -> Loop:
    loop = loop_of(model)
    if loop is None:
        raise ConfigError("the model is not looped (build it with ModelSpec(loops=L) for a looped transformer)")
    return loop
