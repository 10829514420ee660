"""Attention variants through the real command line: for every variant family, ``interp train`` (``--attention``,
``--qkv``) -> ``interp analyze`` -> ``interp report`` on a tiny noisy-majority model trained for one epoch; the
checkpoint records the variant, the report's model card shows it and a sparse mask gets its section. Bad spellings
give one line naming the valid ones and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from interp.app.cli import main
from interp.variants import canonical_attention, canonical_qkv

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--set",
    "train_size=128",
    "--set",
    "val_size=32",
    "--set",
    "test_size=32",
    "--set",
    "train_lengths=[0,12]",
    "--set",
    "val_lengths=[13,16]",
    "--set",
    "test_lengths=[17,20]",
]
SMALL = ["--d-model", "4", "--n-heads", "2", "--d-head", "2", "--epochs", "1", "--batch-size", "64"]
QUIET = ["--device", "cpu", "--threads", "1"]
MASKED = ("window", "dilated", "global", "random", "bigbird")
CASES = [
    ("softmax", "full"),
    ("window:4", "full"),
    ("dilated:2,2", "full"),
    ("global:1", "full"),
    ("random:2", "full"),
    ("bigbird:4,1,2", "full"),
    ("linear:elu", "full"),
    ("linear:relu", "full"),
    ("additive", "full"),
    ("softmax", "diagonal"),
    ("softmax", "sparse:0.5"),
    ("softmax", "lowrank:1"),
]


@pytest.mark.parametrize("attention,qkv", CASES, ids=[f"{a} qkv={q}" for a, q in CASES])
def test_train_analyze_report_of_every_variant(tmp_path, capsys, attention, qkv):
    from safetensors import safe_open

    ckpt = tmp_path / "m.safetensors"
    argv = ["train", "noisy-majority", *TINY, *SMALL, "--attention", attention, "--qkv", qkv, "--out", str(ckpt)]
    assert main([*argv, "--quiet", *QUIET]) == 0 and ckpt.is_file()
    with safe_open(str(ckpt), "pt") as f:
        spec = json.loads(f.metadata()["model_spec"])
    assert (spec["attention"], spec["qkv"]) == (canonical_attention(attention), canonical_qkv(qkv))
    capsys.readouterr()

    assert main(["analyze", str(ckpt), "--json", "--out", str(tmp_path / "a.json"), *QUIET]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "a.json").read_text())
    assert [h["head"] for h in printed["heads"]] == ["L0H0", "L0H1"]

    html_path = tmp_path / "r.html"
    assert main(["report", str(ckpt), "--out", str(html_path), "--quiet", *QUIET]) == 0
    html = html_path.read_text(encoding="utf-8")
    assert f"<td>attention</td><td>{canonical_attention(attention)}</td>" in html
    assert f"<td>qkv</td><td>{canonical_qkv(qkv)}</td>" in html
    assert "free Q/K/V entries per layer" in html and "Attention spectrum" in html
    masked = attention.split(":")[0] in MASKED
    assert ("keys each query may see" in html) == masked  # the mask section, only for a sparse mask


@pytest.mark.parametrize(
    "args, valid",
    [
        (["train", "noisy-majority", "--attention", "windw:3"], "window:W, dilated:W,D"),
        (["train", "noisy-majority", "--attention", "softmax+additive"], "window:W, dilated:W,D"),
        (["train", "noisy-majority", "--attention", "bigbird:4,1"], "bigbird:W,G,R"),
        (["train", "noisy-majority", "--qkv", "diag"], "full, diagonal, sparse:F"),
        (["train", "noisy-majority", "--qkv", "sparse:1.5"], "full, diagonal, sparse:F"),
        (["sweep", "noisy-majority", "--attention", "window:0", "--seeds", "0", "--out", "SWEEP"], "dilated:W,D"),
        (["sweep", "noisy-majority", "--grid", "attention=window:4,windw:3", "--out", "SWEEP"], "dilated:W,D"),
        (["sweep", "noisy-majority", "--qkv", "lowrank:0", "--seeds", "0", "--out", "SWEEP"], "lowrank:R"),
    ],
)
def test_a_bad_spelling_gives_one_line_naming_the_valid_ones(tmp_path, capsys, args, valid):
    args = [str(tmp_path / "sweep") if a == "SWEEP" else a for a in args]
    try:
        rc = main([*args, "--out", str(tmp_path / "m.safetensors")] if args[0] == "train" else args)
    except SystemExit as e:  # argparse errors
        rc, err = (e.code if isinstance(e.code, int) else 2), str(e.code)
    else:
        err = capsys.readouterr().err
    assert rc != 0 and valid in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_bad_spelling_from_a_real_process_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "interp.app", "train", "noisy-majority", "--attention", "linear:tanh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "linear:elu, linear:relu" in proc.stderr


def test_sweep_grids_take_the_spellings_with_commas():
    """``dilated:W,D`` and ``bigbird:W,G,R`` inside ``--grid attention=...`` keep their own commas."""
    from interp.app.sweeps import parse_grid

    grid = parse_grid(["attention=dilated:2,2,window:4,bigbird:4,1,2+linear:elu,softmax", "qkv=full,lowrank:1"])
    assert grid == {
        "attention": ["dilated:2,2", "window:4", "linear:elu+window:4+global:1+random:2", "softmax"],
        "qkv": ["full", "lowrank:1"],
    }
