"""Integer addition (Ibrahimli 2024, Compositional Generalization in Transformers; Fraknói 2024, §4, Quirke & Barez):
``a + b = c`` on digit tokens.

A sentence is ``[BOS] a + b = c [EOS]``. Both operands of one sentence have the same digit count ``n`` (drawn
per sentence from a range), written with leading zeros, so digit ``i`` of ``a`` and of ``b`` have the same place
value (Quirke's fixed-width format); the answer always has ``n + 1`` digits (its leading digit is the final carry,
0 or 1). Operands are written most-significant digit first unless ``reverse_operands``; the answer is written
least-significant digit first when ``reverse_answer`` (the default: the model then meets the units digit first,
as a carry ripples), else most-significant first. The model predicts every answer digit and then ``[EOS]``; the
loss is on those positions only. Sequences are right-padded with ``[PAD]`` (input-only).

Digit tokens have ids 0..9 (id == value). Every example carries its carry structure, per answer digit ``i``
(place value ``10**i``, units first) with digit-pair sum ``s_i = a_i + b_i``:

- ``pair_kind[i]``: 0 = base add (``s_i < 9``), 1 = make sum 9 (``s_i == 9``, MS9), 2 = make carry 1
  (``s_i >= 10``, MC1);
- ``digit_case[i]`` (what answer digit ``i`` needs): 0 = base add only (no carry in, BA), 1 = use carry 1 (the
  carry comes straight from an MC1 pair ``i-1``, UC1), ``1 + k`` = use sum-9 cascade of length ``k`` (the carry
  made at ``i-k-1`` ripples through ``k`` sum-9 pairs, US9);
- ``complexity`` per example (Quirke's S classes): 0 = no carry at all (S0), 1 = carries but no cascade (S1),
  ``1 + k`` = the longest sum-9 cascade has length ``k`` (S2, S3, ...).

Uniform random digits make cascades rare (P(sum 9) = 0.1 per pair, peers.md R13); ``enrich`` is the fraction of
training examples built to hold one cascade of random length, and the ``cascades`` split holds only such
examples (the rare-case test set). ``test`` is uniform random sums.

Two formats change what the model reads and writes (both off by default; the vocabulary grows only where one is on,
so every token keeps its id):

- ``random_spaces = p`` (Shen et al. 2023, *Positional Description Matters for Transformers Arithmetic*): in the
  ``train`` and ``val`` sentences each of the ``2n + 1`` gaps between two tokens of ``a + b =`` holds a blank token
  ``_`` with probability ``p`` (input-only: never predicted), so a digit's absolute position no longer tells its
  place value. ``test`` and ``cascades`` have no blanks. The sums are the ones drawn without blanks.
- ``scratchpad`` (Lee et al. 2023, *Teaching Arithmetic to Small Transformers*; Ibrahimli 2024, RQ3): the answer is
  preceded by intermediate steps the model writes and is trained on, ``= s_0 .. s_{n-1} + c_1 .. c_n = r [EOS]``:
  the digit-wise sums without carries ``s_i = (a_i + b_i) mod 10`` and the carries ``c_{i+1}`` out of each place,
  both units first (so with units-first operands a step's index within its run is its place, as Abacus positions
  read it), then the answer ``r`` as usual. ``+`` and ``=`` become outputs (``n_out = 13``). ``accuracy`` then
  requires every written token right (the steps and the answer); the answer alone, decoded greedily after the
  model's own steps, is :func:`interp.analyses.integer_addition.greedy_exact_match`.

Every sentence also carries ``aux_targets``: at the position of the second operand's digit of place ``i`` the carry
out of place ``i`` (as the digit token 0 or 1), the auxiliary loss of ``TrainConfig.aux_loss`` (Ibrahimli 2024's
multi-task item). That digit is the last one the carry depends on only where operands are written units first, so
the targets are there only with ``reverse_operands``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.errors import TaskError
from interp.registry import TaskPlugin
from interp.task import IGNORE, TaskData, Vocab

TOKENS = tuple(str(d) for d in range(10)) + ("[EOS]", "+", "=", "[BOS]", "[PAD]")
EOS, PLUS, EQ, BOS, PAD = range(10, 15)
BLANK = 15  # random spaces: the blank token "_" (input-only), in the vocabulary only where random_spaces > 0
VOCAB = Vocab(tokens=TOKENS, bos=BOS, eos=EOS, pad=PAD, n_out=11)  # predicts digits and [EOS]
DIGIT_TOKENS = tuple(range(10))


def vocabulary(*, blanks: bool = False, scratchpad: bool = False) -> Vocab:
    """The task's vocabulary: :data:`VOCAB`, plus the blank token ``_`` (id 15, input-only) with random spaces; with a
    scratchpad ``+`` and ``=`` are outputs too (the model writes them between its steps: ``n_out = 13``)."""
    return Vocab(
        tokens=TOKENS + (("_",) if blanks else ()), bos=BOS, eos=EOS, pad=PAD, n_out=EQ + 1 if scratchpad else EOS + 1
    )


CASE_NAMES = ("BA", "UC1")  # digit_case 0, 1; then "US9-k" for 1 + k
PAIR_NAMES = ("base", "MS9", "MC1")


def case_name(code: int) -> str:
    """``digit_case`` code -> ``BA``, ``UC1`` or ``US9-k``."""
    return CASE_NAMES[code] if code < 2 else f"US9-{code - 1}"


def complexity_name(code: int) -> str:
    """``complexity`` code -> Quirke's ``S0``, ``S1``, ``S2`` (cascade of 1), ..."""
    return f"S{code}"


def _range(value, what: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    )
    if not ok or not 1 <= value[0] <= value[1]:
        raise TaskError(f"{what} must be a digit count or [lo, hi] digit counts with 1 <= lo <= hi, got {value!r}")
    return (int(value[0]), int(value[1]))


@dataclass(frozen=True)
class IntegerAddition:
    """The task: digit-count ranges per split (inclusive), answer order, enrichment, split sizes, data seed."""

    digits: Any = (5, 5)  # operand digit counts of train and val sentences
    test_digits: Any = None  # of the test and cascades splits (None: the same as ``digits``, also when it changes)
    max_digits: int | None = None  # the context is sized for operands this long (default: the longest split + 3)
    reverse_answer: bool = True
    reverse_operands: bool = False
    enrich: float = 0.1  # fraction of training / validation sentences built around a sum-9 cascade
    random_spaces: float = 0.0  # train / val: probability of a blank in each gap of "a + b =" (Shen et al. 2023)
    scratchpad: bool = False  # the answer preceded by the digit-wise sums and the carries, units first
    train_size: int = 100_000
    val_size: int = 2000
    test_size: int = 5000
    cascades_size: int = 2000
    seed: int = 0

    name = "integer-addition"
    splits = ("train", "val", "test", "cascades")

    def __post_init__(self):
        digits = _range(self.digits, "digits")
        test = digits if self.test_digits is None else _range(self.test_digits, "test_digits")
        object.__setattr__(self, "digits", digits)
        # left None, the test splits follow digits: a checkpoint's task rebuilt with --set digits=6 tests 6 digits
        object.__setattr__(self, "test_digits", None if self.test_digits is None else test)
        longest = max(digits[1], test[1])
        if self.max_digits is None:
            object.__setattr__(self, "max_digits", longest + 3)
        elif not isinstance(self.max_digits, int) or self.max_digits < longest:
            raise TaskError(
                f"max_digits must be an integer >= the longest operand of any split ({longest}), "
                f"got {self.max_digits!r}"
            )
        for k in ("reverse_answer", "reverse_operands", "scratchpad"):
            if not isinstance(getattr(self, k), bool):
                raise TaskError(f"{k} must be true or false, got {getattr(self, k)!r}")
        p = self.random_spaces
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
            raise TaskError(f"random_spaces must be a probability in [0, 1] (of a blank in each gap), got {p!r}")
        if not isinstance(self.enrich, (int, float)) or isinstance(self.enrich, bool) or not 0 <= self.enrich <= 1:
            raise TaskError(f"enrich must be a fraction in [0, 1], got {self.enrich!r}")
        for split in self.splits:
            size = getattr(self, f"{split}_size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise TaskError(f"{split}_size must be a positive integer, got {size!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise TaskError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def vocab(self) -> Vocab:
        return vocabulary(blanks=self.random_spaces > 0, scratchpad=self.scratchpad)

    @property
    def n_ctx(self) -> int:
        """Context for operands of ``max_digits``: :meth:`sentence_length` with every gap holding a blank where
        random spaces are on."""
        return self.sentence_length(self.max_digits, blanks=self.random_spaces > 0)

    def sentence_length(self, n: int, *, blanks: bool = False) -> int:
        """Tokens of a sentence with ``n``-digit operands in this task's format: [BOS], 2n digits, '+', '=', the
        scratchpad (2n digits, '+', '=') where there is one, n + 1 answer digits, [EOS]; with ``blanks``, the most
        a sentence with random spaces holds (a blank in each of the 2n + 1 gaps of ``a + b =``)."""
        return seq_len(n) + (2 * n + 2 if self.scratchpad else 0) + (2 * n + 1 if blanks else 0)

    def sums(self, a, b, n=None) -> TaskData:
        """:func:`make_sums` in this task's format (answer and operand order, scratchpad; no blanks)."""
        return make_sums(
            a,
            b,
            n,
            reverse_answer=self.reverse_answer,
            reverse_operands=self.reverse_operands,
            scratchpad=self.scratchpad,
        )

    def params(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def default_spec(self) -> dict[str, Any]:
        """Two layers with MLPs and LayerNorm, learned absolute positions (Quirke's 2-layer models solve 5 digits);
        small enough to train on one CPU thread in about 20 minutes."""
        return dict(
            n_layers=2,
            d_model=64,
            n_heads=4,
            d_head=16,
            d_mlp=256,
            attn_only=False,
            d_vocab=len(self.vocab),
            d_vocab_out=self.vocab.n_out,
            n_ctx=self.n_ctx,
            positional="standard",
            output_matrix="learned",
            attn_bias=True,
            normalization="LN",
            digit_tokens=list(DIGIT_TOKENS),
        )

    def default_train(self) -> dict[str, Any]:
        return dict(epochs=6, batch_size=128, lr=1e-3, weight_decay=0.1, dropout=0.0, beta2=0.98)

    @property
    def test_range(self) -> tuple[int, int]:
        """The operand digit counts of the test and cascades splits."""
        return self.digits if self.test_digits is None else self.test_digits

    def split_digits(self, split: str) -> tuple[int, int]:
        return self.test_range if split in ("test", "cascades") else self.digits

    def dataset(self, split: str, seed: int | None = None) -> TaskData:
        """The sums of ``split`` from ``seed`` (default: the task's data seed)."""
        if split not in self.splits:
            raise TaskError(f"unknown split {split!r} for task {self.name}; expected one of {self.splits}")
        size = getattr(self, f"{split}_size")
        base = self.seed if seed is None else seed
        gen = torch.Generator().manual_seed(int(base) * 1000 + 17 + self.splits.index(split))
        enrich = {"train": self.enrich, "val": self.enrich, "test": 0.0, "cascades": 1.0}[split]
        a, b, n = random_operands(size, self.split_digits(split), enrich, gen)
        data = self.sums(a, b, n)
        if self.random_spaces > 0:
            # the blanks are drawn after the operands: the sums are the same with and without them
            blanks = random_blanks(data, self.random_spaces if split in ("train", "val") else 0.0, gen)
            data = insert_blanks(data, blanks, self.vocab)
        else:
            data.vocab = self.vocab
        return data

    def metrics(
        self, preds: Int[Tensor, "batch pos"], loss: Float[Tensor, "batch pos"], data: TaskData
    ) -> dict[str, float]:
        """``accuracy``: exact match (every answer digit right, and with a scratchpad every step too; teacher-forced
        argmax, which equals greedy decoding's exact match of everything written); ``accuracy_len<n>`` and
        ``n_len<n>``: exact match and number of the sums with ``n``-digit operands, per ``n`` in the data;
        ``digit_i``: accuracy of the answer digit of place value ``10**i``; ``scratchpad_accuracy`` (with a
        scratchpad): every step right; ``eos_accuracy``; ``loss``: mean loss on the target positions."""
        ok = digit_correct(preds, data)
        valid = data.fields["digit_case"][:, : ok.shape[1]].to(ok.device) >= 0
        exact = (ok | ~valid).all(1)
        steps = scratchpad_correct(preds, data)
        if steps is not None:
            exact = exact & steps
        out = {"accuracy": exact.float().mean().item()}
        n_digits = data.fields["n_digits"].to(exact.device)
        for m in sorted(set(n_digits.tolist())):
            rows = n_digits == m
            out[f"accuracy_len{m}"] = exact[rows].float().mean().item()
            out[f"n_len{m}"] = int(rows.sum())
        if steps is not None:
            out["scratchpad_accuracy"] = steps.float().mean().item()
        for i in range(ok.shape[1]):
            m = valid[:, i]
            if bool(m.any()):
                out[f"digit_{i}"] = ok[m, i].float().mean().item()
        rows = torch.arange(len(data), device=preds.device)
        eos_pos = data.fields["answer_start"] + data.fields["n_digits"] + 1
        out["eos_accuracy"] = (preds[rows, eos_pos - 1] == EOS).float().mean().item()
        mask = data.targets != IGNORE
        out["loss"] = (loss[mask].sum() / mask.sum()).item()
        return out

    def check_data(self, data: TaskData) -> None:
        if data.task != self.name:
            raise TaskError(f"data of task {data.task!r} was given where {self.name!r} data is expected")
        missing = {"a", "b", "answer", "digit_case", "answer_start", "n_digits"} - set(data.fields)
        if missing:
            raise TaskError(f"integer-addition data needs the fields {sorted(missing)} (build it with make_sums)")


def seq_len(n: int | Tensor) -> int | Tensor:
    """Tokens of a sentence with ``n``-digit operands: [BOS] n '+' n '=' (n + 1) [EOS]."""
    return 3 * n + 5


def random_operands(size: int, digits: tuple[int, int], enrich: float, gen: torch.Generator):
    """``a, b [size, hi]`` (digit ``i`` = place value ``10**i``, zero beyond ``n``) and digit counts ``n [size]``;
    a fraction ``enrich`` of the rows holds a make-carry pair followed by a sum-9 cascade of random length
    ``1 .. n - 1`` at a random place (one-digit rows: just a make-carry pair)."""
    lo, hi = digits
    n = torch.randint(lo, hi + 1, (size,), generator=gen)
    a = torch.randint(0, 10, (size, hi), generator=gen)
    b = torch.randint(0, 10, (size, hi), generator=gen)
    place = torch.arange(hi)
    rich = torch.rand(size, generator=gen) < enrich
    k = (torch.rand(size, generator=gen) * (n - 1).clamp(min=0)).long() + 1  # 1 .. n-1
    k = torch.where(n > 1, k.clamp(max=n - 1), torch.zeros_like(k))
    j = (torch.rand(size, generator=gen) * (n - k)).long()  # the MC1 place: 0 .. n-k-1
    mc_a = torch.randint(1, 10, (size,), generator=gen)
    mc_b = 10 - mc_a + (torch.rand(size, generator=gen) * mc_a).long()  # s in [10, 9 + mc_a]
    nine_a = torch.randint(0, 10, (size, hi), generator=gen)
    is_mc = rich[:, None] & (place[None] == j[:, None])
    is_nine = rich[:, None] & (place[None] > j[:, None]) & (place[None] <= (j + k)[:, None])
    a = torch.where(is_mc, mc_a[:, None], torch.where(is_nine, nine_a, a))
    b = torch.where(is_mc, mc_b[:, None], torch.where(is_nine, 9 - nine_a, b))
    inside = place[None] < n[:, None]
    return a * inside, b * inside, n


def carry_structure(a: Int[Tensor, "batch digit"], b: Int[Tensor, "batch digit"], n: Int[Tensor, " batch"]):
    """Answer digits and carry labels of ``a + b`` (digits units first, zero beyond ``n``).

    Returns ``answer [batch, digit+1]``, ``pair_kind [batch, digit]`` (0 base, 1 MS9, 2 MC1; -1 beyond n),
    ``digit_case [batch, digit+1]`` (0 BA, 1 UC1, 1+k US9 cascade of k; -1 beyond the answer's n + 1 digits) and
    ``complexity [batch]`` (Quirke's S class)."""
    bsz, d = a.shape
    s = a + b
    answer = torch.zeros(bsz, d + 1, dtype=torch.long)
    case = torch.zeros(bsz, d + 1, dtype=torch.long)
    carry = torch.zeros(bsz, dtype=torch.long)
    depth = torch.zeros(bsz, dtype=torch.long)  # 0: no carry in; else 1 + number of sum-9 pairs it rippled through
    for i in range(d + 1):
        si = s[:, i] if i < d else torch.zeros(bsz, dtype=torch.long)
        total = si + carry
        answer[:, i] = total % 10
        case[:, i] = depth
        out = total >= 10
        # the carry out of i: made here (si >= 10, depth 1) or passed on by a sum-9 pair (depth + 1)
        depth = torch.where(si >= 10, torch.ones_like(depth), torch.where(out, depth + 1, torch.zeros_like(depth)))
        carry = out.long()
    kind = torch.where(s >= 10, 2, torch.where(s == 9, 1, 0))
    place = torch.arange(d + 1)
    kind = torch.where(place[None, :d] < n[:, None], kind, -1)
    case = torch.where(place[None] <= n[:, None], case, -1)
    complexity = torch.where((kind == 2).any(1), case.max(1).values.clamp(min=1), torch.zeros(bsz, dtype=torch.long))
    return answer, kind, case, complexity


def make_sums(
    a, b, n=None, *, reverse_answer: bool = True, reverse_operands: bool = False, scratchpad: bool = False
) -> TaskData:
    """Integer-addition data from operand digits ``a, b [batch, digit]`` (units first; ``n [batch]`` digit counts,
    default: all columns) or from lists of Python ints (``make_sums([99999], [1], [5])``); with ``scratchpad`` the
    answer is preceded by the digit-wise sums and the carries (see the module's docstring)."""
    if not isinstance(a, Tensor):
        a, b, n = digits_of(a, b, n)
    a, b = torch.as_tensor(a, dtype=torch.long), torch.as_tensor(b, dtype=torch.long)
    if a.ndim != 2 or a.shape != b.shape or a.shape[0] == 0:
        raise TaskError(
            f"operand digits must be two [batch, digit] tensors of one shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if int(torch.cat([a, b]).min()) < 0 or int(torch.cat([a, b]).max()) > 9:
        raise TaskError("operand digits must lie in 0..9")
    n = torch.full((a.shape[0],), a.shape[1]) if n is None else torch.as_tensor(n, dtype=torch.long)
    if int(n.min()) < 1 or int(n.max()) > a.shape[1]:
        raise TaskError(f"digit counts must lie in 1..{a.shape[1]}, got {n.tolist()[:8]}")
    answer, kind, case, complexity = carry_structure(a, b, n)
    carries = carries_of(a, b, n)
    bsz = a.shape[0]
    pad = 2 * n + 2 if scratchpad else torch.zeros_like(n)  # the scratchpad's tokens
    t = int((seq_len(n) + pad).max())
    tokens = torch.full((bsz, t), PAD, dtype=torch.long)
    targets = torch.full((bsz, t), IGNORE, dtype=torch.long)
    aux = torch.full((bsz, t), IGNORE, dtype=torch.long)
    for m in n.unique().tolist():
        rows = (n == m).nonzero().squeeze(1)
        ops = [a[rows, :m], b[rows, :m]]
        ops = [x if reverse_operands else x.flip(1) for x in ops]
        ans = answer[rows, : m + 1]
        ans = ans if reverse_answer else ans.flip(1)

        def col(v: int, k: int = len(rows)) -> Tensor:
            return torch.full((k, 1), v, dtype=torch.long)

        steps = []
        if scratchpad:  # units first: s_0 .. s_{m-1} + c_1 .. c_m =
            steps = [(a[rows, :m] + b[rows, :m]) % 10, col(PLUS), carries[rows, 1 : m + 1], col(EQ)]
        seq = torch.cat([col(BOS), ops[0], col(PLUS), ops[1], col(EQ), *steps, ans, col(EOS)], 1)
        tokens[rows, : seq.shape[1]] = seq
        first = 2 * m + 2  # the '=' whose prediction is the first token written
        targets[rows, first : seq.shape[1] - 1] = seq[:, first + 1 :]
        if reverse_operands:  # the carry out of place i, predicted at b's digit of place i
            aux[rows, m + 2 : 2 * m + 2] = carries[rows, 1 : m + 1]
    start = 2 * n + 3 + pad  # position of the first answer digit
    return TaskData(
        task=IntegerAddition.name,
        tokens=tokens,
        targets=targets,
        answer_pos=start - 1,
        labels=tokens[torch.arange(bsz), start],
        lengths=seq_len(n) + pad,
        vocab=vocabulary(scratchpad=scratchpad),
        fields={
            "a": a,
            "b": b,
            "n_digits": n,
            "answer": answer,
            "carries": carries,
            "pair_kind": kind,
            "digit_case": case,
            "complexity": complexity,
            "answer_start": start,
            "scratch_start": 2 * n + 3,  # the first step (= answer_start without a scratchpad)
            "reverse_answer": torch.full((bsz,), int(reverse_answer)),
            "reverse_operands": torch.full((bsz,), int(reverse_operands)),
            "blanks": torch.zeros(bsz, dtype=torch.long),
        },
        aux_targets=aux if reverse_operands else None,
    )


def carries_of(a: Int[Tensor, "batch digit"], b: Int[Tensor, "batch digit"], n: Int[Tensor, " batch"]) -> Tensor:
    """``[batch, digit + 1]``: the carry (0 or 1) into each place, units first (column 0 is 0; column ``n`` is the
    answer's leading digit); 0 beyond ``n``."""
    bsz, d = a.shape
    out = torch.zeros(bsz, d + 1, dtype=torch.long)
    for i in range(d):
        out[:, i + 1] = ((a[:, i] + b[:, i] + out[:, i]) >= 10).long()
    place = torch.arange(d + 1)
    return torch.where(place[None] <= n[:, None], out, torch.zeros_like(out))


def random_blanks(data: TaskData, p: float, gen: torch.Generator) -> Tensor:
    """``[batch, pos]`` bool: a blank goes after position ``q`` (for ``q`` in ``1 .. 2n + 1``, the gaps of
    ``a + b =``), each with probability ``p``."""
    bsz, t = data.tokens.shape
    draw = torch.rand(bsz, t, generator=gen) < p
    pos = torch.arange(t)[None]
    return draw & (pos >= 1) & (pos <= 2 * data.fields["n_digits"][:, None] + 1)


def insert_blanks(data: TaskData, blanks: Tensor, vocab: Vocab) -> TaskData:
    """``data`` with a blank token after every position where ``blanks [batch, pos]`` is set (only the gaps of
    ``a + b =`` may hold one): tokens, targets and auxiliary targets move right past the blanks before them, and so
    do the answer's positions."""
    bsz, t = data.tokens.shape
    blanks = blanks.to(torch.long)
    shift = torch.cumsum(blanks, 1) - blanks  # blanks before position q: those after positions < q
    count = blanks.sum(1)
    width = t + int(count.max()) if bsz else t
    new_pos = torch.arange(t)[None] + shift
    rows = torch.arange(bsz)[:, None].expand(bsz, t)

    def moved(x: Tensor | None, fill: int) -> Tensor | None:
        if x is None:
            return None
        out = torch.full((bsz, width), fill, dtype=x.dtype)
        out[rows, new_pos] = x
        return out

    tokens = moved(data.tokens, PAD)
    b_rows, b_pos = blanks.nonzero(as_tuple=True)
    tokens[b_rows, new_pos[b_rows, b_pos] + 1] = BLANK
    fields = dict(data.fields)
    fields["answer_start"] = data.fields["answer_start"] + count
    fields["scratch_start"] = data.fields["scratch_start"] + count
    fields["blanks"] = data.fields["blanks"] + count
    return TaskData(
        task=data.task,
        tokens=tokens,
        targets=moved(data.targets, IGNORE),
        answer_pos=data.answer_pos + count,
        labels=data.labels,
        lengths=data.lengths + count,
        fields=fields,
        vocab=vocab,
        aux_targets=moved(data.aux_targets, IGNORE),
    )


def read_sums(tokens: Int[Tensor, "batch pos"], *, reverse_operands: bool, reverse_answer: bool):
    """Parse sentences back into Python ints: ``[(a, b, written answer, scratchpad answer or None)]``. Blanks are
    skipped; the written answer is read from the tokens after the last ``=``; a scratchpad's answer is recomputed from
    its steps, ``sum_i ((s_i + c_i) mod 10) 10^i + c_n 10^n``. A sentence that is not of the task's form raises a
    TaskError."""
    out = []
    for row in tokens.tolist():
        toks = [x for x in row if x not in (BLANK, PAD)]
        if not toks or toks[0] != BOS or EOS not in toks:
            raise TaskError(f"not an integer-addition sentence: {row}")
        body = toks[1 : toks.index(EOS)]
        parts, cur = [], []
        for x in body:
            if x in (PLUS, EQ):
                parts.append(cur)
                cur = []
            else:
                cur.append(x)
        parts.append(cur)
        if len(parts) not in (3, 5) or any(x > 9 for part in parts for x in part):
            raise TaskError(f"not an integer-addition sentence: {row}")

        def value(ds: list[int], units_first: bool) -> int:
            ds = ds if units_first else ds[::-1]
            return sum(d * 10**i for i, d in enumerate(ds))

        a, b = value(parts[0], reverse_operands), value(parts[1], reverse_operands)
        written = value(parts[-1], reverse_answer)
        steps = None
        if len(parts) == 5:
            sums, carries = parts[2], [0] + parts[3]
            steps = sum(((s + c) % 10) * 10**i for i, (s, c) in enumerate(zip(sums, carries))) + carries[
                -1
            ] * 10 ** len(sums)
        out.append((a, b, written, steps))
    return out


def scratchpad_correct(preds: Int[Tensor, "batch pos"], data: TaskData) -> Tensor | None:
    """``[batch]`` bool: every scratchpad token predicted right (teacher-forced), or None without a scratchpad."""
    first, start = data.fields["scratch_start"], data.fields["answer_start"]
    if not bool((start > first).any()):
        return None
    width = int((start - first).max())
    cols = torch.arange(width, device=preds.device)[None]
    pos = (first.to(preds.device) - 1)[:, None] + cols  # the positions whose predictions are the steps
    inside = cols < (start - first).to(preds.device)[:, None]
    pos = torch.where(inside, pos, torch.zeros_like(pos))
    got = preds.gather(1, pos)
    want = data.tokens.to(preds.device).gather(1, pos + 1)
    return ((got == want) | ~inside).all(1)


def digits_of(a: list[int], b: list[int], n: list[int] | None = None):
    """Python ints -> units-first digit tensors ``[batch, width]`` and digit counts (default: the longer operand)."""
    a, b = [int(x) for x in a], [int(x) for x in b]
    if len(a) != len(b) or not a or min(a + b) < 0:
        raise TaskError("give two equally long, non-empty lists of non-negative integers")
    need = [max(len(str(x)), len(str(y))) for x, y in zip(a, b)]
    n = need if n is None else [int(x) for x in n]
    if any(m < k for m, k in zip(n, need)):
        raise TaskError(f"digit counts {n} are too small for the operands (need {need})")
    w = max(n)

    def to(xs: list[int]) -> Tensor:
        return torch.tensor([[(x // 10**i) % 10 for i in range(w)] for x in xs], dtype=torch.long)

    return to(a), to(b), torch.tensor(n)


def answer_positions(data: TaskData) -> Int[Tensor, "batch digit"]:
    """``[batch, max n + 1]``: the position whose prediction is the answer digit of place value ``10**i`` (column
    ``i``); columns beyond an example's ``n + 1`` digits repeat its last valid position (mask with digit_case >= 0)."""
    n = data.fields["n_digits"]
    start = data.fields["answer_start"]
    i = torch.arange(int(n.max()) + 1, device=n.device)[None]
    i = torch.minimum(i, n[:, None])
    rev = data.fields["reverse_answer"][:, None].bool()
    offset = torch.where(rev, i, n[:, None] - i)
    return start[:, None] - 1 + offset


def digit_correct(preds: Int[Tensor, "batch pos"], data: TaskData) -> Tensor:
    """``[batch, max n + 1]`` bool: the prediction of answer digit ``10**i`` is right (False beyond the answer)."""
    pos = answer_positions(data).to(preds.device)
    got = preds.gather(1, pos)
    want = data.fields["answer"][:, : pos.shape[1]].to(preds.device)
    return (got == want) & (data.fields["digit_case"][:, : pos.shape[1]].to(preds.device) >= 0)


# The registration, found through this distribution's entry point (pyproject.toml, group "interp.tasks"), as a
# user's task is found through theirs: the suite is imported only when asked for.
PLUGIN = TaskPlugin(
    name=IntegerAddition.name,
    make=IntegerAddition,
    suite="interp.analyses.integer_addition.suite:SUITE",
    checkpoints=Path(__file__).parent / "checkpoints",
)
