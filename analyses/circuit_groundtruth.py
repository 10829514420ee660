"""Models whose circuit is known by construction, for checking circuit discovery against ground truth.

**tracr** (Lindner et al. 2023, *Tracr: Compiled Transformers as a Laboratory for Interpretability*) compiles a RASP
program (Weiss, Goldberg and Yahav 2021, *Thinking Like Transformers*) into transformer weights whose residual stream
is a direct sum of labelled subspaces (``tokens:a``, ``indices:3``, ``one``, one per intermediate value).
:func:`hooked_from_tracr` turns a compiled model into a plain ``HookedTransformer`` (each tracr layer is one block:
attention, then MLP; no normalisation; bidirectional attention as tracr compiles it; the unembedding reads the output
subspace), and :func:`weight_edges` reads the true edges off the weights: a sender feeds a receiver when a residual
direction the sender writes (nonzero columns of ``W_E``/``W_pos``, ``W_O[h]``, ``W_out``) is one the receiver reads
(nonzero rows of ``W_Q[h]``, ``W_K[h]``, ``W_V[h]``, ``W_in``, ``W_U``). In a tracr model every written subspace
belongs to one RASP value, so these are the edges of the program's computational graph (the ground truth ACDC's
authors used, Conmy et al. 2023, §4.1). The rule is exact about *what is wired*; an edge that carries a constant on
every input (the ``one`` direction) is wired but has no effect under patching or mean ablation.

:func:`save_groundtruth` / :func:`load_groundtruth` store such a model as a ``.safetensors`` file (the weights, the
TransformerLens configuration and the metadata: vocabulary, true edges) that loads without tracr or jax.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from interp.errors import CheckpointError, ConfigError

from .circuit_graph import computational_graph

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

NONZERO = 1e-6  # a weight entry this small writes or reads nothing


def _rows(w: torch.Tensor) -> set[int]:
    """Residual directions a ``[d_model, ...]`` matrix reads (nonzero rows)."""
    return set((w.abs().flatten(1).amax(1) > NONZERO).nonzero().flatten().tolist())


def weight_edges(model: HookedTransformer, *, device: str | None = None) -> list[str]:
    """The edges of ``model``'s graph along which some residual direction is both written and read (see the module
    doc). For any model with sparse residual use (tracr's, hand-built ones); a dense trained model wires every
    edge. ``device``: None (the model's) or the model's own."""
    g = computational_graph(model, device=device)
    writes: list[set[int]] = []
    with torch.no_grad():
        writes.append(_rows(model.W_E.T) | _rows(model.W_pos.T))
        for l in range(g.n_layers):
            for h in range(g.n_heads):
                writes.append(_rows(model.W_O[l, h].T))
            if g.has_mlp:
                writes.append(_rows(model.W_out[l].T))
        reads: list[set[int]] = []
        group = g.n_heads // g.n_kv_heads
        for l in range(g.n_layers):
            reads += [_rows(model.W_Q[l, h]) for h in range(g.n_heads)]
            W_K = model.W_K[l] if model.W_K.shape[1] == g.n_heads else model.W_K[l].repeat_interleave(group, 0)
            W_V = model.W_V[l] if model.W_V.shape[1] == g.n_heads else model.W_V[l].repeat_interleave(group, 0)
            reads += [_rows(W_K[h * group]) for h in range(g.n_kv_heads)]
            reads += [_rows(W_V[h * group]) for h in range(g.n_kv_heads)]
            if g.has_mlp:
                reads.append(_rows(model.W_in[l]))
        reads.append(_rows(model.W_U))
    return [g.edge_names[e] for e, (r, s) in enumerate(g.edges) if writes[s] & reads[r]]


def hooked_from_tracr(assembled: Any, output: str | None = None, device: str | None = None) -> HookedTransformer:
    """A ``HookedTransformer`` computing what a tracr ``AssembledTransformerModel`` computes (its residual stream
    and outputs, to float tolerance), from its parameters alone (numpy arrays; no jax call). ``output``: the label of
    the program's output (``program.label``; found from the residual labels when None)."""
    import numpy as np
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    p = {k: {kk: np.asarray(v) for kk, v in d.items()} for k, d in assembled.params.items()}
    mc = assembled.model_config
    if mc.layer_norm:
        raise ConfigError("this tracr model uses layer norm; hooked_from_tracr converts models compiled without it")
    D = p["token_embed"]["embeddings"].shape[1]
    H, dh = mc.num_heads, mc.key_size
    labels = list(assembled.residual_labels)
    out_enc = assembled.output_encoder
    if out_enc is not None and hasattr(out_enc, "encoding_map"):
        values = sorted(out_enc.encoding_map, key=out_enc.encoding_map.get)  # categorical: a direction per value
        out_label = output or _output_label(labels, values)
        W_U = np.zeros((D, len(values)), dtype=np.float32)
        for v in values:
            W_U[labels.index(f"{out_label}:{v}"), out_enc.encoding_map[v]] = 1.0
    else:  # numerical: one direction
        out_label = output or _numerical_label(labels)
        W_U = np.zeros((D, 1), dtype=np.float32)
        W_U[labels.index(out_label), 0] = 1.0
    cfg = HookedTransformerConfig(
        n_layers=mc.num_layers,
        d_model=D,
        d_head=dh,
        n_heads=H,
        d_mlp=mc.mlp_hidden_size,
        d_vocab=p["token_embed"]["embeddings"].shape[0],
        d_vocab_out=W_U.shape[1],
        n_ctx=p["pos_embed"]["embeddings"].shape[0],
        act_fn="relu",
        normalization_type=None,
        attention_dir="causal" if mc.causal else "bidirectional",
        device=device or "cpu",
        default_prepend_bos=False,
    )
    model = HookedTransformer(cfg)
    sd = {k: v.clone() for k, v in model.state_dict().items()}

    def t(x):
        return torch.tensor(np.asarray(x, dtype=np.float32))

    sd["embed.W_E"] = t(p["token_embed"]["embeddings"])
    sd["pos_embed.W_pos"] = t(p["pos_embed"]["embeddings"])
    for l in range(mc.num_layers):
        a, m = f"transformer/layer_{l}/attn", f"transformer/layer_{l}/mlp"
        for tl, tr in (("Q", "query"), ("K", "key"), ("V", "value")):
            sd[f"blocks.{l}.attn.W_{tl}"] = t(p[f"{a}/{tr}"]["w"]).reshape(D, H, dh).permute(1, 0, 2).contiguous()
            sd[f"blocks.{l}.attn.b_{tl}"] = t(p[f"{a}/{tr}"]["b"]).reshape(H, dh)
        sd[f"blocks.{l}.attn.W_O"] = t(p[f"{a}/linear"]["w"]).reshape(H, dh, D)
        sd[f"blocks.{l}.attn.b_O"] = t(p[f"{a}/linear"]["b"])
        sd[f"blocks.{l}.mlp.W_in"] = t(p[f"{m}/linear_1"]["w"])
        sd[f"blocks.{l}.mlp.b_in"] = t(p[f"{m}/linear_1"]["b"])
        sd[f"blocks.{l}.mlp.W_out"] = t(p[f"{m}/linear_2"]["w"])
        sd[f"blocks.{l}.mlp.b_out"] = t(p[f"{m}/linear_2"]["b"])
    sd["unembed.W_U"] = t(W_U)
    sd["unembed.b_U"] = torch.zeros(W_U.shape[1])
    model.load_state_dict(sd, strict=False)
    return model.eval()


def _output_label(labels: list[str], values: list) -> str:
    names = {lab.rsplit(":", 1)[0] for lab in labels if ":" in lab}
    for n in sorted(names - {"tokens", "indices"}):
        if all(f"{n}:{v}" in labels for v in values):
            return n
    raise ConfigError("cannot find the tracr model's categorical output subspace in its residual labels")


def _numerical_label(labels: list[str]) -> str:
    plain = [lab for lab in labels if ":" not in lab and lab != "one"]
    if len(plain) != 1:
        raise ConfigError(f"cannot tell the numerical output direction among {plain}; expected exactly one")
    return plain[0]


def save_groundtruth(model: HookedTransformer, path, meta: dict) -> Path:
    """Write ``model``'s weights with its TransformerLens configuration and ``meta`` (JSON: vocabulary, true edges,
    how it was made) to a ``.safetensors`` file, atomically."""
    from safetensors.torch import save_file

    from interp.files import AtomicFile

    cfg = {k: v for k, v in model.cfg.to_dict().items() if _json_ok(v)}
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if not k.endswith(("IGNORE",
               "mask"))}  # fmt: skip
    header = {"tl_config": json.dumps(cfg), "groundtruth": json.dumps(meta)}
    with AtomicFile(path, "the ground-truth model") as out:
        out.commit(lambda tmp: save_file(tensors, tmp, metadata=header))
    return Path(path)


def _json_ok(v) -> bool:
    try:
        json.dumps(v)
    except TypeError:
        return False
    return True


def load_groundtruth(path, device: str | None = None) -> tuple[HookedTransformer, dict]:
    """``(model, meta)`` from :func:`save_groundtruth`'s file (no tracr or jax needed)."""
    from safetensors import safe_open
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    try:
        with safe_open(str(path), "pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (OSError, Exception) as e:  # safetensors raises its own error type for a corrupt header
        raise CheckpointError(f"cannot read the ground-truth model {path}: {e}") from None
    if "tl_config" not in header or "groundtruth" not in header:
        raise CheckpointError(f"{path} is not a ground-truth model file (no tl_config / groundtruth metadata)")
    cfg = json.loads(header["tl_config"])
    cfg["device"] = device or "cpu"
    keep = set(HookedTransformerConfig.__dataclass_fields__)
    model = HookedTransformer(HookedTransformerConfig(**{k: v for k, v in cfg.items() if k in keep}))
    model.load_state_dict(tensors, strict=False)
    return model.eval(), json.loads(header["groundtruth"])


# -- the RASP programs ---------------------------------------------------------------------------------------------

TRACR_PROGRAMS = ("shift", "frac_prevs", "induction", "sort")


def tracr_program(name: str):
    """``(program, vocab, max_seq_len)`` of a RASP program (needs ``tracr``: the ``groundtruth`` extra):

    - ``shift``: each position's previous token (one attention head: a previous-token head);
    - ``frac_prevs``: the fraction of earlier tokens equal to ``"x"`` (an MLP computing ``tokens == "x"``, then a
      mean-aggregating head; Lindner et al. 2023's example, ACDC's second tracr case);
    - ``induction``: the token after the previous occurrence of the current token (a previous-token head, then a
      head whose key reads its output: the induction circuit; inputs without repeats in the prefix);
    - ``sort``: the tokens sorted (``make_sort_unique`` of tracr's library: an MLP-computed rank, then a head that
      gathers by it)."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    if name == "shift":
        prog = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, lambda k, q: q == k + 1), rasp.tokens)
        return rasp.categorical(prog).named("shift"), {"a", "b", "c", "d"}, 6
    if name == "frac_prevs":
        return lib.make_frac_prevs(rasp.tokens == "x").named("frac_prevs"), {"x", "y", "z"}, 6
    if name == "induction":
        prev = rasp.categorical(
            rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, lambda k, q: q == k + 1), rasp.tokens)
        ).named("prev_token")
        nxt = rasp.Aggregate(rasp.Select(prev, rasp.tokens, lambda k, q: k == q), rasp.tokens)
        return rasp.categorical(nxt).named("induction"), {"a", "b", "c", "d", "e"}, 6
    if name == "sort":
        return lib.make_sort_unique(rasp.tokens, rasp.tokens).named("sort"), set(range(1, 9)), 5
    raise ConfigError(f"unknown tracr program {name!r}; expected one of {TRACR_PROGRAMS}")


def tracr_input(name: str, symbols: list, max_len: int, rng) -> list:
    """One input (without BOS) on which the program's answer at the last position is defined: for ``induction``
    ``R R[:k]`` (the last token occurred once before), for ``sort`` distinct tokens, else any tokens."""
    n = len(symbols)
    if name == "induction":
        half = (max_len + 1) // 2
        r = list(rng.choice(n, size=half, replace=False))
        return [symbols[i] for i in r + r[: max_len - half]]
    return [symbols[i] for i in rng.choice(n, size=max_len, replace=name != "sort")]


def compile_tracr(name: str) -> tuple[HookedTransformer, dict]:
    """Compile :func:`tracr_program` ``name`` with tracr, convert it (:func:`hooked_from_tracr`), check the converted
    model's outputs equal tracr's on every input of a sample, and return ``(model, meta)`` (meta: the input
    encoding, the output values, the true edges of :func:`weight_edges`)."""
    import numpy as np
    from tracr.compiler import compiling

    prog, vocab, max_len = tracr_program(name)
    assembled = compiling.compile_rasp_to_model(prog, vocab=vocab, max_seq_len=max_len, compiler_bos="BOS")
    model = hooked_from_tracr(assembled, output=prog.label)
    enc = assembled.input_encoder.encoding_map
    categorical = hasattr(assembled.output_encoder, "encoding_map") if assembled.output_encoder else False
    rng = np.random.default_rng(0)
    symbols = sorted(vocab, key=str)
    for _ in range(8):
        words = ["BOS"] + tracr_input(name, symbols, max_len, rng)
        want = assembled.apply(words)
        ids = torch.tensor([[enc[w] for w in words]])
        with torch.no_grad():
            logits = model(ids)[0]
        if categorical:
            dec = {i: v for v, i in assembled.output_encoder.encoding_map.items()}
            got = [dec[int(i)] for i in logits.argmax(-1)[1:]]
            ok = (
                [g == w for g, w in zip(got, want.decoded[1:]) if w is not None][-1:]
                if name == "induction"
                else [g == w for g, w in zip(got, want.decoded[1:]) if w is not None]
            )
        else:
            ok = [abs(float(g) - float(w)) < 1e-4 for g, w in zip(logits[1:, 0], want.decoded[1:])]
        if not all(ok):
            raise ConfigError(f"the converted {name} model disagrees with tracr on {words}")
    meta = {
        "program": name,
        "encoding": {str(k): int(v) for k, v in enc.items()},
        "symbols": [str(s) for s in symbols],
        "max_seq_len": max_len,
        "categorical": categorical,
        "outputs": (
            [
                str(v)
                for v in sorted(assembled.output_encoder.encoding_map, key=assembled.output_encoder.encoding_map.get)
            ]
            if categorical
            else None
        ),
        "true_edges": weight_edges(model),
        "made_by": "interp.analyses.circuit_groundtruth.compile_tracr (tracr-pypi)",
    }
    return model, meta


def groundtruth_inputs(model: HookedTransformer, meta: dict, n: int = 64, seed: int = 0, ablation: str = "patch"):
    """``(clean, corrupted, metric)`` for a tracr model of :func:`compile_tracr`: ``n`` inputs (:func:`tracr_input`)
    and ``n`` independently drawn ones (resample ablation: ACDC's "random ablation"), the answer read at the last
    position. Categorical programs: task data whose labels are the model's own outputs there (metric
    ``"logit_diff"``); numerical ones (``frac_prevs``): tokens and a callable metric, the output at the last position
    signed by the direction clean minus corrupted (so examples do not cancel). With ``ablation="zero"`` the
    corrupted data is None and the metrics are the answer's margin over the best other logit (categorical) or the
    output itself (numerical: a fraction, which zero ablation can only lower or keep)."""
    import numpy as np

    from interp.task import IGNORE, TaskData

    rng = np.random.default_rng(seed)
    enc, symbols, T = meta["encoding"], meta["symbols"], meta["max_seq_len"]
    symbols = [int(s) if s.isdigit() else s for s in symbols]

    def batch():
        rows = [["BOS"] + tracr_input(meta["program"], symbols, T, rng) for _ in range(n)]
        return torch.tensor([[enc[str(w)] for w in r] for r in rows])

    clean, corrupted = batch(), batch()
    with torch.no_grad():
        out_c, out_k = model(clean)[:, -1], model(corrupted)[:, -1]
    if not meta["categorical"]:
        sign = torch.sign(out_c[:, 0] - out_k[:, 0]) if ablation == "patch" else torch.ones(n)

        def signed_output(logits):
            return (logits[:, -1, 0] * sign.to(logits.device)).mean()

        return clean, corrupted if ablation == "patch" else None, signed_output

    def data(tokens, labels):
        b = len(tokens)
        return TaskData(
            f"tracr-{meta['program']}", tokens, torch.full_like(tokens, IGNORE), torch.full((b,), T), labels,
            torch.full((b,), T + 1),
        )  # fmt: skip

    corr = data(corrupted, out_k.argmax(-1)) if ablation == "patch" else None
    return data(clean, out_c.argmax(-1)), corr, "logit_diff"
