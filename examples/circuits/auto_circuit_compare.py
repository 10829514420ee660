"""Our EAP scores against auto-circuit's (PyPI ``auto-circuit`` 1.0.1, ``mask_gradient_prune_scores`` at mask value 0,
its edge attribution patching) on the shipped two-layer induction model, the same 32 clean/corrupted pairs (the
task's ``key`` corruption, cut after the answer position because auto-circuit reads the last position) and the same
metric (answer logit minus corrupted answer logit, averaged).

auto-circuit pins nothing incompatible but imports two names TransformerLens 3.x no longer has
(``transformer_lens.HookedTransformerKeyValueCache``, ``transformer_lens.past_key_value_caching``); this script
aliases them to 3.x's ``TransformerLensKeyValueCache`` before importing it. Install it beside the project, never
into it:

    pip install --no-deps --target /tmp/acdeps auto-circuit==1.0.1 blobfile ordered-set vscode-tqdm word2word \\
        lxml pycryptodomex
    PYTHONPATH=/tmp/acdeps OMP_NUM_THREADS=1 .venv/bin/python examples/circuits/auto_circuit_compare.py

Writes examples/results/circuits/auto_circuit.json.
"""

from __future__ import annotations

import json
import re
import sys
import time
import types
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parents[2] / "examples" / "results" / "circuits" / "auto_circuit.json"


def _alias_removed_names() -> None:
    import transformer_lens
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    transformer_lens.HookedTransformerKeyValueCache = TransformerLensKeyValueCache
    mod = types.ModuleType("transformer_lens.past_key_value_caching")
    mod.HookedTransformerKeyValueCache = TransformerLensKeyValueCache
    sys.modules[mod.__name__] = mod


def our_name(name: str) -> str:
    """auto-circuit's ``A0.1->A1.0.K`` / ``Resid Start`` / ``Resid End`` as our ``L0H1->L1H0.k`` / input / logits."""
    s, r = name.split("->")
    s = "input" if s == "Resid Start" else re.sub(r"A(\d+)\.(\d+)", r"L\1H\2", s)
    if r == "Resid End":
        return f"{s}->logits"
    m = re.fullmatch(r"A(\d+)\.(\d+)\.([QKV])", r)
    return f"{s}->L{m[1]}H{m[2]}.{m[3].lower()}"


def main() -> int:
    torch.set_num_threads(1)
    _alias_removed_names()
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    import interp
    from interp.analyses.circuit_discovery import discover_circuit
    from interp.analyses.repeated_tokens import corrupted_pair
    from interp.device import model_device

    ck = interp.load_checkpoint("repeated-tokens")
    clean, corr = corrupted_pair(ck.task, 32, kind="key")
    pos = int(clean.answer_pos[0])
    if not bool((clean.answer_pos == pos).all()):
        raise SystemExit("the pairs' answers are not at one position; auto-circuit reads the last one")
    t0 = time.perf_counter()
    ours = discover_circuit(ck.model, clean, corrupted=corr, method="eap", curve_points=0, top_n=5)
    ours_seconds = time.perf_counter() - t0
    ctoks, ktoks = clean.tokens[:, : pos + 1], corr.tokens[:, : pos + 1]
    ds = PromptDataset(list(ctoks), list(ktoks), [a.view(1) for a in clean.labels], [a.view(1) for a in corr.labels])
    dl = PromptDataLoader(ds, seq_len=None, diverge_idx=0, batch_size=len(ds), shuffle=False)
    model = ck.model
    model.cfg.use_split_qkv_input = model.cfg.use_attn_result = model.cfg.use_hook_mlp_in = True
    pm = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True, device=model_device(model))
    t0 = time.perf_counter()
    ps = mask_gradient_prune_scores(pm, dl, None, grad_function="logit", answer_function="avg_diff", mask_val=0.0)
    theirs_seconds = time.perf_counter() - t0
    theirs = {our_name(e.name): float(ps[e.dest.module_name][e.patch_idx]) for e in pm.edges}
    names = ours.graph.edge_names
    if set(theirs) != set(names):
        raise SystemExit(f"the graphs differ: {sorted(set(theirs) ^ set(names))}")
    a = ours.scores.double()
    b = torch.tensor([theirs[n] for n in names], dtype=torch.float64)
    out = {
        "model": "repeated-tokens (shipped, 2 layers x 2 heads, attention-only)",
        "inputs": "32 pairs, the task's key corruption; metric: answer minus corrupted answer logit, mean",
        "edges": len(names),
        "max_abs_ours_plus_theirs": float((a + b).abs().max()),
        "max_abs_score": float(a.abs().max()),
        "pearson": float(torch.corrcoef(torch.stack([a, b]))[0, 1]),
        "sign": "auto-circuit scores the edge's gradient x (clean - corrupted); ours the metric's change when the "
        "edge is removed (corrupted - clean): equal up to sign",
        "seconds": {"ours": round(ours_seconds, 3), "auto_circuit": round(theirs_seconds, 3)},
        "scores": {n: {"ours": float(a[i]), "auto_circuit": float(b[i])} for i, n in enumerate(names)},
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "scores"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
