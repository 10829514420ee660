"""``interp circuit``: every shipped checkpoint, a user's own HookedTransformer saved with its task, the JSON it
writes read back as a Circuit, and bad arguments as one line."""

from __future__ import annotations

import json

import pytest

from interp.analyses.circuit_discovery import Circuit
from interp.app.cli import main

SHIPPED = ["noisy-majority", "repeated-tokens", "repeated-tokens-1layer", "integer-addition", "modular-addition"]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_checkpoint(name, capsys):
    # noisy majority's test sequences are ~200 tokens: the top 10 edges and no curve keep the test fast
    fast = ["--top-n", "10", "--curve-points", "0"] if name == "noisy-majority" else []
    assert main(["circuit", name, "--examples", "4", "--threads", "1", "--json", *fast]) == 0
    d = json.loads(capsys.readouterr().out)
    c = Circuit.from_dict(d)
    assert c.method == "eap" and c.size == d["size"] and d["info"]["checkpoint"].endswith(f"{name}.safetensors")
    if not fast:  # the default rule: the smallest top-k circuit with faithfulness 0.9
        assert c.faithfulness >= 0.9 or c.size == c.graph.n_edges
    else:
        assert c.size == 10 and not c.curve


def test_out_file_round_trip_and_text(tmp_path, capsys):
    out = tmp_path / "c.json"
    argv = ["circuit", "repeated-tokens", "--method", "patching", "--examples", "6", "--top-n", "5", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "circuit (patching, patch ablation" in text and "5 of 29 edges" in text
    c = Circuit.load(out)
    assert c.size == 5 and Circuit.from_dict(c.to_dict()).to_dict() == c.to_dict()


def test_a_users_model_paired_with_its_task(tmp_path, capsys):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from interp.checkpoint import save_checkpoint
    from interp.registry import get_task

    task = get_task("repeated-tokens")
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=len(task.vocab),
        d_vocab_out=task.vocab.n_out, n_ctx=64, act_fn="gelu", normalization_type="LN", seed=1,
    )  # fmt: skip
    path = save_checkpoint(HookedTransformer(cfg), task, tmp_path / "mine.safetensors")
    assert main(["circuit", str(path), "--method", "acdc", "--examples", "4", "--ablation", "mean", "--json"]) == 0
    c = Circuit.from_dict(json.loads(capsys.readouterr().out))
    assert c.method == "acdc" and c.ablation == "mean" and "MLP1->logits" in c.graph.edge_names


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "acdc", "--top-n", "3"], "ACDC keeps the edges its pass keeps"),
        (["--corruption", "nope"], "unknown corruption 'nope'"),
        (["--method", "eap", "--tau", "0.1"], "tau is ACDC's tolerance"),
    ],
)
def test_bad_arguments_one_line(args, message, capsys):
    assert main(["circuit", "repeated-tokens", "--examples", "2", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
