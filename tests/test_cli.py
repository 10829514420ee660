"""The ``interp`` command line end to end: train, eval, errors (one line, non-zero exit, no traceback)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from interp.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--set",
    "train_size=256",
    "--set",
    "val_size=64",
    "--set",
    "test_size=64",
    "--set",
    "train_lengths=[0,20]",
    "--set",
    "val_lengths=[21,30]",
    "--set",
    "test_lengths=[31,40]",
]


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "interp.app", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_help_does_not_import_torch():
    code = (
        "import sys, interp.app.cli as c\ntry:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'transformer_lens' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "train" in out.stdout and out.stdout.strip().endswith("False False")


@pytest.mark.slow
def test_train_then_eval_json_end_to_end(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    rc = main(
        [
            "train",
            "noisy-majority",
            *TINY,
            "--d-model",
            "8",
            "--n-heads",
            "4",
            "--d-head",
            "2",
            "--epochs",
            "2",
            "--seed",
            "3",
            "--out",
            str(out),
            "--quiet",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0 and out.is_file()
    assert f"wrote {out}" in capsys.readouterr().out
    proc = run_cli("eval", str(out), "--json")  # a real process: stdout must be exactly one JSON object
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["task"] == "noisy-majority"
    assert set(result["accuracy"]) == {"train", "val", "test"}
    assert all(0.0 <= v <= 1.0 for v in result["accuracy"].values())
    from interp.tasks import load_checkpoint

    ckpt = load_checkpoint(out)
    assert ckpt.model.cfg.n_heads == 4 and ckpt.training["seed"] == 3 and ckpt.training["epochs"] == 2
    assert ckpt.task.params()["train_size"] == 256
    assert result["accuracy"] == ckpt.training["accuracy"]


def test_train_options_reach_the_model_spec(tmp_path):
    out = tmp_path / "short.safetensors"
    assert (
        main(
            [
                "train",
                "noisy-majority",
                *TINY,
                "--d-model",
                "8",
                "--n-heads",
                "4",
                "--d-head",
                "2",
                "--n-layers",
                "2",
                "--positional",
                "shortformer",
                "--epochs",
                "1",
                "--out",
                str(out),
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    from interp.tasks import load_checkpoint

    model = load_checkpoint(out).model
    assert model.cfg.positional_embedding_type == "shortformer" and model.cfg.n_layers == 2
    assert load_checkpoint(out).spec.positional == "shortformer" and model.W_pos.requires_grad


def test_eval_of_the_shipped_checkpoint(capsys):
    assert main(["eval", "noisy-majority"]) == 0
    text = capsys.readouterr().out
    assert "noisy-majority" in text and "test" in text and "eos_accuracy" in text


def test_list(capsys):
    assert main(["list"]) == 0
    assert "noisy-majority" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "sorting"], "unknown task 'sorting'"),
        (["train", "noisy-majority", "--epochs", "-3"], "expected a positive integer"),
        (["train", "noisy-majority", "--dropout", "1.5"], "expected a number in [0, 1)"),
        (["train", "noisy-majority", "--set", "nonsense"], "--set expects KEY=VALUE"),
        (
            [
                "train",
                "noisy-majority",
                "--d-model",
                "30",
                "--n-heads",
                "16",
                "--d-head",
                "2",
                "--output-matrix",
                "identity",
            ],
            "n_heads * d_head == d_model",
        ),
        (["train", "noisy-majority", "--device", "tpu"], "unknown device 'tpu'"),
        (["eval", "noisy-majority", "--device", "cuda:-1"], "unknown device 'cuda:-1'"),
        (["eval", "noisy-majority", "--device", "cuda:0 "], "unknown device 'cuda:0 '"),
        (["eval", "noisy-majority", "--device", "cpu:1"], "unknown device 'cpu:1'"),
        (["train", "noisy-majority", "--out", "/nonexistent-dir/x.safetensors"], "does not exist"),
        (["eval", "/no/such/file.safetensors"], "no checkpoint file"),
        (["analyze", "/no/such/file.safetensors"], "no checkpoint file"),
        (["frobnicate"], "invalid choice"),
        (["sweep", "noisy-majority", "--compiled"], "unrecognized arguments: --compiled (see 'interp sweep --help')"),
        (["eval", "noisy-majority", "--Json"], "unrecognized arguments: --Json (see 'interp eval --help')"),
        (["--bogus"], "unrecognized arguments: --bogus (see 'interp --help')"),
    ],
)
def test_bad_input_gives_one_line_and_nonzero_exit(args, message, capsys):
    try:
        rc = main(args)
    except SystemExit as e:  # argparse errors
        rc, err = (e.code if isinstance(e.code, int) else 2), str(e.code)
    else:
        err = capsys.readouterr().err
    assert rc != 0
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
def test_errors_from_a_real_process_have_no_traceback():
    proc = run_cli("eval", "missing.safetensors")
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("interp: error: no checkpoint file") and "Traceback" not in proc.stderr
    proc = run_cli("train", "noisy-majority", "--lr", "abc")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "--lr" in proc.stderr


def test_eval_of_chosen_splits(capsys):
    from interp.app.cli import main

    assert main(["eval", "noisy-majority", "--splits", "test,val", "--json", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["accuracy"]) == ["test", "val"]
    assert main(["eval", "noisy-majority", "--splits", "tset"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train, val, test" in err
