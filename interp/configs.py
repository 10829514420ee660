"""The configuration of a run, as plain data: the model spec (:class:`ModelSpec`: everything that rebuilds a
model's architecture) and the training recipe (:class:`TrainConfig`).

Both are frozen dataclasses that check their values on construction (one ConfigError naming the bad ones) and
describe their user options on their fields (:mod:`interp.options`), from which the command line, sweep grids and
results tables are built. This module imports no torch, so ``interp --help`` is instant; the model is built by
:mod:`interp.model` and trained by :mod:`interp.training`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .curriculum import parse_curriculum
from .errors import ConfigError
from .options import option
from .variants import ATTENTION_SPELLINGS, QKV_SPELLINGS, canonical_attention, canonical_qkv, parse_attention, parse_qkv

POSITIONAL = ("none", "standard", "shortformer", "rotary", "random", "abacus", "alibi")  # see interp.positions
TL_POSITIONAL = ("shortformer", "rotary", "alibi")  # TransformerLens' own positional_embedding_type
OUTPUT_MATRIX = ("identity", "learned")
NORMALIZATION = (None, "LN", "LNPre", "RMS", "RMSPre")


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a model's architecture (weights come from training or a file)."""

    d_vocab: int
    n_ctx: int
    n_layers: int = field(default=1, metadata=option("layers"))
    d_model: int = field(default=32, metadata=option("width of the residual stream (the thesis's d)"))
    n_heads: int = field(default=16, metadata=option("attention heads per layer (the thesis's a)"))
    d_head: int = field(default=2, metadata=option("dimension of each head's queries, keys and values"))
    d_vocab_out: int | None = None
    attn_only: bool = field(default=True, metadata=option("attention-only blocks (no MLP)"))
    d_mlp: int | None = field(default=None, metadata=option("MLP width where attn_only is off (default 4 x d_model)"))
    positional: str = field(
        default="none",
        metadata=option(
            "positional embedding: none (zeroed, frozen), standard (added to the residual stream), shortformer (into "
            "queries and keys only), rotary, random (randomised positions in training), abacus (index of a digit "
            "within its number), alibi (linear biases of the attention scores by distance, Press et al. 2022; no "
            "W_pos: it is zeroed and frozen); see interp.positions",
            choices=POSITIONAL,
        ),
    )
    output_matrix: str | None = field(
        default=None,
        metadata=option(
            "identity (no output matrix: head h writes residual dimensions h*d_head ..) or learned; auto (the "
            "default): identity where n_heads * d_head == d_model, else learned",
            choices=OUTPUT_MATRIX,
            none="auto",
        ),
    )
    attn_bias: bool = field(default=False, metadata=option("trainable attention biases b_Q, b_K, b_V, b_O"))
    unembed_bias: bool = field(default=True, metadata=option("trainable unembedding bias b_U (the thesis's b_H)"))
    normalization: str | None = field(
        default=None,
        metadata=option(
            "TransformerLens normalization_type (LN: pre-LN and a final LN; LNPre: without weights; RMS, RMSPre); "
            "default none",
            choices=NORMALIZATION[1:],
        ),
    )
    act_fn: str = field(default="relu", metadata=option("MLP activation (TransformerLens act_fn)"))
    attention: str = field(
        default="softmax",
        metadata=option(
            f"attention variant (see interp.variants): {ATTENTION_SPELLINGS}; stored in one canonical spelling",
            canonical=canonical_attention,
        ),
    )
    qkv: str = field(
        default="full",
        metadata=option(f"shape of W_Q, W_K, W_V (see interp.variants): {QKV_SPELLINGS}", canonical=canonical_qkv),
    )
    attention_seed: int = field(
        default=0, metadata=option("seed of the random keys (random:R) and of the sparse:F pattern of Q/K/V")
    )
    init_seed: int = 0
    digit_tokens: tuple[int, ...] | list[int] | None = None  # positional="abacus": the token ids that form numbers
    max_position_offset: int = field(
        default=0,
        metadata=option(
            "positional=abacus: each training sequence's digit positions are shifted by an offset drawn from 0 .. "
            "this (McLeish et al. 2024), so the rows of numbers longer than the training ones are trained too"
        ),
    )
    loops: int = field(
        default=1,
        metadata=option(
            "a looped transformer (Yang et al. 2023; Fan et al. 2024): the n_layers layers form a block applied "
            "this many times with shared weights; the HookedTransformer has n_layers x loops blocks, each "
            "iteration's hooks named as layers (see interp.looping); 1: not looped"
        ),
    )
    input_injection: bool = field(
        default=True,
        metadata=option(
            "looped models: add the embedded input to the input of every iteration after the first (Fan et al. "
            "2024's input injection)"
        ),
    )

    def __post_init__(self):
        for name in ("d_vocab", "n_ctx", "n_layers", "d_model", "n_heads", "d_head"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.d_vocab_out is not None and (not isinstance(self.d_vocab_out, int) or self.d_vocab_out < 1):
            raise ConfigError(f"d_vocab_out must be a positive integer or None, got {self.d_vocab_out!r}")
        if self.positional not in POSITIONAL:
            raise ConfigError(f"positional must be one of {POSITIONAL}, got {self.positional!r}")
        if self.output_matrix is not None and self.output_matrix not in OUTPUT_MATRIX:
            raise ConfigError(
                f"output_matrix must be one of {OUTPUT_MATRIX} (or None: identity where n_heads * d_head "
                f"== d_model, else learned), got {self.output_matrix!r}"
            )
        if self.digit_tokens is not None:
            object.__setattr__(self, "digit_tokens", tuple(int(t) for t in self.digit_tokens))
        if self.positional == "abacus" and not self.digit_tokens:
            raise ConfigError("positional='abacus' needs digit_tokens (the token ids whose runs are numbers)")
        if not isinstance(self.max_position_offset, int) or not 0 <= self.max_position_offset < self.n_ctx:
            raise ConfigError(f"max_position_offset must be an integer in [0, n_ctx), got {self.max_position_offset!r}")
        if self.normalization not in NORMALIZATION:
            raise ConfigError(f"normalization must be one of {NORMALIZATION}, got {self.normalization!r}")
        if not isinstance(self.loops, int) or isinstance(self.loops, bool) or self.loops < 1:
            raise ConfigError(f"loops must be a positive integer (1: not looped), got {self.loops!r}")
        if not isinstance(self.input_injection, bool):
            raise ConfigError(f"input_injection must be true or false, got {self.input_injection!r}")
        if self.loops > 1 and (self.attention != "softmax" or self.qkv != "full"):
            raise ConfigError(
                f"a looped model (loops={self.loops}) has softmax attention with full Q/K/V: the attention variants "
                f"install per-layer constraints that are not shared between iterations; got attention="
                f"{self.attention!r}, qkv={self.qkv!r}"
            )
        self._check_attention()
        if self.output_matrix == "identity" and self.n_heads * self.d_head != self.d_model:
            raise ConfigError(
                f"output_matrix='identity' needs n_heads * d_head == d_model, got {self.n_heads} * {self.d_head} "
                f"!= {self.d_model}; use output_matrix='learned'"
            )

    def _check_attention(self) -> None:
        """The attention variant's spellings (one line naming the valid ones; stored in their canonical spelling,
        :mod:`interp.variants`, so two spellings of one variant are one spec) and what they need of the shape."""
        object.__setattr__(self, "attention", canonical_attention(self.attention))
        object.__setattr__(self, "qkv", canonical_qkv(self.qkv))
        qkv = parse_qkv(self.qkv)
        width = min(self.d_model, self.n_heads * self.d_head)
        if qkv.kind == "lowrank" and qkv.rank >= width:
            raise ConfigError(
                f"qkv={self.qkv!r}: a rank-{qkv.rank} factorisation does not constrain a [d_model, n_heads * d_head] "
                f"= [{self.d_model}, {self.n_heads * self.d_head}] matrix; use lowrank:R with R < {width}"
            )
        if not isinstance(self.attention_seed, int) or isinstance(self.attention_seed, bool) or self.attention_seed < 0:
            raise ConfigError(f"attention_seed must be a non-negative integer, got {self.attention_seed!r}")

    @property
    def w_o(self) -> str:
        """The output matrix this spec builds: ``output_matrix``, or where it is unset, ``"identity"`` when the
        heads fill the residual stream exactly (``n_heads * d_head == d_model``) and ``"learned"`` otherwise."""
        if self.output_matrix is not None:
            return self.output_matrix
        return "identity" if self.n_heads * self.d_head == self.d_model else "learned"

    def to_dict(self) -> dict[str, Any]:
        """The spec as saved in checkpoints: JSON types, every field as given (an unset output matrix stays None:
        :attr:`w_o` resolves it, and the checkpoint's ``tl_config`` and weights show the matrix itself)."""
        d = asdict(self)
        if d["digit_tokens"] is not None:
            d["digit_tokens"] = list(d["digit_tokens"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown model spec field(s) {sorted(unknown)}; known fields: {sorted(known)}")
        return cls(**d)

    @property
    def blocks(self) -> int:
        """The HookedTransformer's blocks: ``n_layers`` layers, ``loops`` times (the layers of a looped model's
        iterations share their weights)."""
        return self.n_layers * self.loops

    def tl_config_kwargs(self, device: str | None) -> dict[str, Any]:
        """The HookedTransformerConfig keyword arguments for this spec (TransformerLens' own field names; JSON
        types only apart from ``device``): ``HookedTransformer(HookedTransformerConfig(**kw))`` builds it. A looped
        model has ``n_layers * loops`` blocks (:attr:`blocks`)."""
        return dict(
            n_layers=self.blocks,
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_head=self.d_head,
            d_vocab=self.d_vocab,
            d_vocab_out=self.d_vocab_out or self.d_vocab,
            n_ctx=self.n_ctx,
            attn_only=self.attn_only,
            d_mlp=None if self.attn_only else (self.d_mlp or 4 * self.d_model),
            act_fn=self.act_fn,
            normalization_type=self.normalization,
            positional_embedding_type=self.positional if self.positional in TL_POSITIONAL else "standard",
            seed=self.init_seed,
            device=device,
            **({"rotary_dim": self.d_head} if self.positional == "rotary" else {}),
            **self._local_attention_kwargs(),
        )

    def _local_attention_kwargs(self) -> dict[str, Any]:
        """TransformerLens' own local attention, where the variant is one sliding window (``window:W``)."""
        w = parse_attention(self.attention).tl_window
        if w is None:
            return {}
        return dict(use_local_attn=True, window_size=w, attn_types=["local"] * self.blocks)


STRATEGIES = ("random", "svc", "learned", "shapley-svc", "shapley-learned", "mask-all-but-one")
SELF_SCORED = ("random", "mask-all-but-one")  # strategies that need no scorer from analyses


def check_strategy(strategy: str | None, threshold: float) -> None:
    if strategy is not None and strategy not in STRATEGIES:
        raise ConfigError(f"unknown halving strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
        raise ConfigError(f"halving threshold must be in (0, 1], got {threshold!r}")


KEEP = ("best", "first-best", "last")
# Where dropout goes (the thesis does not say): "embedding+attention" (after the embedding, per position, and after
# the attention output: the default, as trained so far) or "attention" (after the attention output only). With
# "attention" a one-layer attention-only model without positions depends, at a query, only on the query token and
# the counts of the tokens before it, which interp.population exploits for an O(vocab) forward per sequence.
DROPOUT_AT = ("embedding+attention", "attention", "attention+pattern", "embedding+attention+pattern")
LOSS_DTYPE_NAMES = ("float32", "float64")
# The recipe's other choices, each a recorded option whose default is the behaviour before it existed (see
# docs/seed-regime.md): the training objective (interp.objectives), the warmup's shape (interp.schedules), how a
# batch is padded (interp.objectives), the initialisation (interp.initialisation) and how dropout masks are drawn
# (interp.dropout_masks).
OBJECTIVES = ("answer", "lm")
WARMUP_SHAPES = ("linear", "exp")
PADDING = ("right", "left")
INITS = ("tl", "torch", "thesis")
DROPOUT_RNGS = ("torch", "counter")
OPTIMIZERS = ("adamw", "adam")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = field(default=900, metadata=option("epochs (the kept model is chosen by keep)", resumable=True))
    batch_size: int = field(default=128, metadata=option("sequences per step"))
    lr: float = field(default=1e-3, metadata=option("learning rate of the optimizer (--optimizer: AdamW or Adam)"))
    weight_decay: float = field(
        default=0.01,
        metadata=option(
            "weight decay: decoupled, applied to the weights (AdamW, the default), or L2, added to the gradient "
            "(--optimizer adam)"
        ),
    )
    beta1: float = field(default=0.9, metadata=option("beta1 of the optimizer (AdamW or Adam: --optimizer)"))
    beta2: float = field(
        default=0.999,
        metadata=option("beta2 of the optimizer (AdamW or Adam: --optimizer; the warmup lasts 2 / (1 - beta2) steps)"),
    )
    dropout: float = field(default=0.1, metadata=option("dropout probability"))
    warmup_steps: int | None = field(
        default=None, metadata=option("linear warmup steps; default 2 / (1 - beta2), Ma and Yarats' untuned warmup")
    )
    seed: int = 0
    save_every: int = field(default=5, metadata=option("epochs between resume files", resumable=True, config=False))
    patience: int | None = field(
        default=None,
        metadata=option("stop after this many epochs without a better validation accuracy", resumable=True),
    )
    keep: str = field(
        default="best",
        metadata=option(
            "the model written: best (highest validation accuracy, ties by lower validation loss), first-best (the "
            "first epoch at the highest validation accuracy) or last (the final epoch)",
            choices=KEEP,
            resumable=True,
        ),
    )
    dropout_at: str = field(
        default="embedding+attention",
        metadata=option(
            "where dropout goes: after the embedding and the attention output, or after the attention output only "
            "(which allows the token-count batched forward of interp.population); +pattern also on the attention "
            "probabilities, as torch.nn.MultiheadAttention does",
            choices=DROPOUT_AT,
        ),
    )
    loss_dtype: str = field(
        default="float32",
        metadata=option("precision of the cross-entropy (float64: the grokking recipe)", choices=LOSS_DTYPE_NAMES),
    )
    halving: str | None = field(
        default=None,
        metadata=option(
            "halving heads (Fraknói 2024): when validation accuracy reaches the threshold, mask half of the active "
            "heads, keeping the best by this strategy, until one is left (mask-all-but-one: a - 1 heads masked from "
            "the start)",
            choices=STRATEGIES,
        ),
    )
    halving_threshold: float = field(default=0.95, metadata=option("validation accuracy that triggers a halving step"))
    objective: str = field(
        default="answer",
        metadata=option(
            "the training loss: answer (the task's target positions: on noisy majority the answer and [EOS]) or lm "
            "(next-token cross-entropy at every position of the sentence, prompt digits included: a generative "
            "transformer trained as a language model, as Fraknói 2024 §2.5-2.6 describes)",
            choices=OBJECTIVES,
        ),
    )
    warmup_shape: str = field(
        default="linear",
        metadata=option(
            "the warmup: linear (the factor rises to 1 over warmup_steps) or exp (1 - exp(-2 t / warmup_steps), "
            "Ma and Yarats' untuned exponential warmup 1 - exp(-(1 - beta2) t) at the default length)",
            choices=WARMUP_SHAPES,
        ),
    )
    padding: str = field(
        default="right",
        metadata=option(
            "how a batch's sentences are padded to its longest: right (pads after the sentence, never attended by a "
            "causal model) or left (pads before [BOS], attended: no padding mask, as a hand-written pipeline might; "
            "validation and test are padded the same way, in batches of batch_size)",
            choices=PADDING,
        ),
    )
    init: str = field(
        default="tl",
        metadata=option(
            "the initialisation: tl (TransformerLens: N(0, 0.8 / sqrt(d_model))), torch (PyTorch's defaults for a "
            "hand-written transformer: embedding N(0, 1), linear layers uniform in +-1/sqrt(fan_in)) or thesis "
            "(Fraknói 2024 §2.7: W_E ~ N(0, 1/d), W_Q, W_K, W_V, W_O ~ N(0, 2/(3d)), W_U ~ N(0, 1/d))",
            choices=INITS,
        ),
    )
    init_scale: float = field(default=1.0, metadata=option("multiplies every initial weight matrix (not biases)"))
    dropout_rng: str = field(
        default="torch",
        metadata=option(
            "how dropout masks are drawn: torch (torch's generator, in the order the forward applies dropout) or "
            "counter (a hash of the run's seed, the epoch, the sentence, the position and the unit: the same masks "
            "whether a model trains alone or in a population, drawn for every model of a step at once)",
            choices=DROPOUT_RNGS,
        ),
    )
    curriculum: str | None = field(
        default=None,
        metadata=option(
            "curriculum learning: FIELD:LEVEL@STEP,... (e.g. n_digits:1@0,2@300,3@600): from each step on, batches "
            "are drawn from the training examples whose per-example field is at most the level (see "
            "interp.curriculum); none: every example from the start"
        ),
    )
    aux_loss: float = field(
        default=0.0,
        metadata=option(
            "weight of an auxiliary loss on the task data's aux_targets, added to the task's loss (integer addition: "
            "the carry out of each place, predicted at the second operand's digit of that place); 0: none"
        ),
    )
    optimizer: str = field(
        default="adamw",
        metadata=option(
            "adamw (torch.optim.AdamW: weight decay applied to the weights, decoupled from the gradient; Loshchilov "
            "and Hutter, Decoupled weight decay regularization) or adam (torch.optim.Adam with the weight decay added "
            "to the gradient before the moments, L2 regularisation: the update Fraknói 2024 §2.3 describes in words)",
            choices=OPTIMIZERS,
        ),
    )

    def __post_init__(self):
        positive, fraction = "a positive integer", "a number in [0, 1)"
        checks = {
            "epochs": (_int(self.epochs) and self.epochs >= 1, positive),
            "batch_size": (_int(self.batch_size) and self.batch_size >= 1, positive),
            "lr": (_number(self.lr) and self.lr > 0, "a positive number"),
            "weight_decay": (_number(self.weight_decay) and self.weight_decay >= 0, "a non-negative number"),
            "beta1": (_number(self.beta1) and 0 <= self.beta1 < 1, fraction),
            "beta2": (_number(self.beta2) and 0 <= self.beta2 < 1, fraction),
            "dropout": (_number(self.dropout) and 0 <= self.dropout < 1, fraction),
            "save_every": (_int(self.save_every) and self.save_every >= 1, positive),
            "warmup_steps": (
                self.warmup_steps is None or (_int(self.warmup_steps) and self.warmup_steps >= 0),
                "a non-negative integer or None (2 / (1 - beta2))",
            ),
            "patience": (
                self.patience is None or (_int(self.patience) and self.patience >= 1),
                "a positive integer or None",
            ),
            "keep": (self.keep in KEEP, f"one of {', '.join(KEEP)}"),
            "dropout_at": (self.dropout_at in DROPOUT_AT, f"one of {', '.join(DROPOUT_AT)}"),
            "loss_dtype": (self.loss_dtype in LOSS_DTYPE_NAMES, f"one of {', '.join(LOSS_DTYPE_NAMES)}"),
            "objective": (self.objective in OBJECTIVES, f"one of {', '.join(OBJECTIVES)}"),
            "warmup_shape": (self.warmup_shape in WARMUP_SHAPES, f"one of {', '.join(WARMUP_SHAPES)}"),
            "padding": (self.padding in PADDING, f"one of {', '.join(PADDING)}"),
            "init": (self.init in INITS, f"one of {', '.join(INITS)}"),
            "init_scale": (_number(self.init_scale) and self.init_scale > 0, "a positive number"),
            "dropout_rng": (self.dropout_rng in DROPOUT_RNGS, f"one of {', '.join(DROPOUT_RNGS)}"),
            "optimizer": (self.optimizer in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}"),
            "aux_loss": (_number(self.aux_loss) and self.aux_loss >= 0, "a non-negative number"),
        }
        bad = [f"{k}={getattr(self, k)!r} (expected {what})" for k, (ok, what) in checks.items() if not ok]
        if bad:
            raise ConfigError("invalid training option(s): " + "; ".join(bad))
        check_strategy(self.halving, self.halving_threshold)
        if self.curriculum is not None:
            parse_curriculum(self.curriculum)

    @property
    def warmup(self) -> int:
        return round(2 / (1 - self.beta2)) if self.warmup_steps is None else self.warmup_steps

    @property
    def dropout_sites(self) -> frozenset[str]:
        """Where dropout acts (``embedding``, ``attention``, ``pattern``): none when ``dropout`` is 0."""
        return frozenset(self.dropout_at.split("+")) if self.dropout else frozenset()


def check_snapshot_every(snapshot_every: Any, epochs: int) -> None:
    """``snapshot_every`` (epochs between snapshots) as training, populations and sweeps take it, checked before
    anything is written: None (no snapshots) or a positive integer (not a bool) of at most ``epochs`` (the shortest
    run's: a larger one writes no snapshot). A ConfigError naming the value and what was expected otherwise."""
    if snapshot_every is None:
        return
    if not (_int(snapshot_every) and snapshot_every >= 1):
        raise ConfigError(
            f"snapshot_every must be None or a positive integer (epochs between snapshots), got {snapshot_every!r}"
        )
    if snapshot_every > epochs:
        raise ConfigError(
            f"snapshot_every={snapshot_every}: a snapshot every {snapshot_every} epochs in a run of {epochs} epochs "
            f"writes none; expected at most {epochs}"
        )
