"""Regression tests for what a researcher's trial of the newest features broke (attention variants, the explorer,
the seed-regime options, the shipped Table 1), one test (or more) per item, each failing before its fix:
thresholds compared as counts of correct sentences, output paths that are not regular files refused before any
work, typed tokens never split silently, one canonical spelling per attention variant, circuits of low-rank Q/K/V
from the current factors, the spectrum's causal test on the allowed keys, w01/w02 under sparse masks, the explorer
on linear attention, the language-model objective on tasks with input-only tokens, signals at start-up, the fast
path under hooks, and messages. The tampered-metadata item is tests/test_checkpoint_format.py's."""

from __future__ import annotations

import functools
import json
import os
import signal
import stat
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
import torch

import interp
from interp.errors import ConfigError, InterpError, TaskError, TokenError
from interp.model import ModelSpec, build_model
from interp.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_TABLES = ["examples/results/table1", "examples/results/seed_regime/table1"]


@functools.cache
def shipped_frame(directory: str):
    """The results frame of a shipped sweep directory (read once per test session)."""
    from interp.sweep_directory import load_results

    return load_results(ROOT / directory)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``interp ARGV`` in this process: (exit code, stderr); an argparse refusal (SystemExit with its one line) reads
    as exit code 2 with that line."""
    from interp.app.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc, message = 2, str(e.code)
        return rc, capsys.readouterr().err + message
    return rc, capsys.readouterr().err


# -- thresholds: counts of correct sentences --------------------------------------------------------------------------
def _independent_counts(directory: str, threshold: float) -> dict[tuple, int]:
    """Per (d_model, n_heads, strategy): runs whose test sentences answered right are at least ``threshold`` of the
    test split, counted in integers from the rows (a failed halving run counts 0), the threshold read as the decimal
    written."""
    t = Fraction(str(threshold))
    hits: dict[tuple, int] = {}
    for line in (ROOT / directory / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        n = row["task_params"]["test_size"]
        correct = round(row["accuracy"]["test"] * n)
        failed = (row.get("halving_result") or {}).get("success") is False
        key = (row["d_model"], row["n_heads"], row["strategy"])
        hits[key] = hits.get(key, 0) + int(not failed and Fraction(correct, n) >= t)
    return hits


@pytest.mark.parametrize("threshold", [0.977, 0.978, 0.983, 0.98, 1.0])
@pytest.mark.parametrize("directory", SHIPPED_TABLES)
def test_table_thresholds_count_correct_sentences(directory, threshold):
    """Before: accuracies stored as float32 (977/1000 reads 0.97699999...) were compared with a float64 threshold,
    so runs exactly at 0.977, 0.978 or 0.983 were missed (9 cells' counts of the Adam-with-L2 Table 1)."""
    from interp.analyses.populations import population_table

    table = population_table(shipped_frame(directory), thresholds=(threshold,))
    expected = _independent_counts(directory, threshold)
    got = {
        (r["d_model"], r["n_heads"], r["strategy"]): round(r[f"share_test_at_{threshold:g}"] * r["runs"]) for r in table
    }
    assert got == expected


def test_compare_counts_at_the_threshold_too():
    from interp.analyses.populations import strategy_differences

    directory = SHIPPED_TABLES[1]
    expected = _independent_counts(directory, 0.978)
    for d in strategy_differences(shipped_frame(directory), threshold=0.978):
        key = (d["d_model"], d["n_heads"])
        assert round(d["share"] * d["runs"]) == expected[(*key, d["strategy"])]
        assert round(d["baseline_share"] * d["baseline_runs"]) == expected[(*key, "normal")]


def test_the_halving_trigger_counts_correct_sentences():
    """Before: 1,425 of 1,500 validation sentences (float32 accuracy 0.94999999) did not trigger a halving step at
    the threshold 0.95."""
    from interp.halving import Halving

    spec = ModelSpec(d_vocab=9, n_ctx=16, d_model=8, n_heads=4, d_head=2, d_vocab_out=8)
    model = build_model(spec, device="cpu")
    acc = float(torch.tensor([1.0] * 1425 + [0.0] * 75).mean())  # as a task's metrics compute it
    assert acc < 0.95
    h = Halving("random", 0.95, 1, 4, seed=0)
    step = h.after_validation(model, None, 1, acc, examples=1500)
    assert step is not None and len(h.active) == 2
    h2 = Halving("random", 0.95, 1, 4, seed=0)
    acc_below = float(torch.tensor([1.0] * 1424 + [0.0] * 76).mean())
    assert h2.after_validation(model, None, 1, acc_below, examples=1500) is None


# -- --out: regular files or new names only, checked before any work -------------------------------------------------
def _kinds(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a symlink to a file, a directory, a regular file and (where this process may create one) a character
    device node made in the temp folder (major/minor of /dev/null: nothing is ever written to it)."""
    kinds = {}
    os.mkfifo(tmp_path / "fifo")
    kinds["fifo"] = tmp_path / "fifo"
    (tmp_path / "target.txt").write_text("keep me\n")
    os.symlink(tmp_path / "target.txt", tmp_path / "link")
    kinds["symlink"] = tmp_path / "link"
    (tmp_path / "dir").mkdir()
    kinds["directory"] = tmp_path / "dir"
    try:
        os.mknod(tmp_path / "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        kinds["device"] = tmp_path / "dev"
    except (PermissionError, OSError):
        pass
    return kinds


def _unchanged(path: Path, kind: str) -> bool:
    mode = os.lstat(path).st_mode
    return {
        "fifo": stat.S_ISFIFO,
        "symlink": stat.S_ISLNK,
        "directory": stat.S_ISDIR,
        "device": stat.S_ISCHR,
        "file": stat.S_ISREG,
    }[kind](mode)


WHAT = {
    "fifo": "a FIFO",
    "symlink": "a symbolic link",
    "directory": "a directory",
    "device": "a device",
    "file": "a file",
}
TINY = ["--set", "train_size=64", "--set", "val_size=32", "--set", "test_size=32", "--set", "train_lengths=[0,10]"]
TINY += ["--set", "val_lengths=[11,12]", "--set", "test_lengths=[13,14]", "--epochs", "1", "--d-model", "8"]
TINY += ["--n-heads", "4", "--d-head", "2", "--quiet"]
MISSING = "no-such-checkpoint.safetensors"  # model-reading commands would fail on it only after the --out check
WRITERS = {
    "train": ["train", "noisy-majority", *TINY],
    "sweep": ["sweep", "noisy-majority", "--seeds", "0", *TINY],
    "report": ["report", MISSING, "--quiet"],
    "analyze": ["analyze", MISSING],
    "eval": ["eval", MISSING],
    "shapley": ["shapley", MISSING, "--quiet"],
    "table": ["table", str(ROOT / "examples/results/table1")],
}


@pytest.mark.parametrize("command", list(WRITERS))
def test_every_writer_refuses_what_is_not_a_regular_file_before_any_work(tmp_path, monkeypatch, capsys, command):
    """Before: the atomic rename turned a FIFO and a symlink into regular files (and, as root, the device node
    /dev/full), exit 0; ``--out ""`` was read as the default path. Now one line naming the path and what it is,
    before any work (the model-reading commands get a missing checkpoint: refusing it would mean the model was read
    first), and the path is left as it was."""
    monkeypatch.chdir(tmp_path)
    kinds = _kinds(tmp_path)
    if command == "sweep":  # a sweep's --out is a directory: a regular file is the wrong kind there
        (tmp_path / "file").write_text("x")
        kinds["file"] = tmp_path / "file"
        kinds.pop("directory")
    created = sorted(p.name for p in tmp_path.iterdir())
    for kind, path in kinds.items():
        rc, err = run_cli([*WRITERS[command], "--out", str(path)], capsys)
        assert rc != 0, (command, kind)
        assert str(path) in err and WHAT[kind] in err, (command, kind, err)
        assert MISSING not in err and err.strip().count("\n") == 0, (command, kind, err)
        assert _unchanged(path, kind), (command, kind)
    assert (tmp_path / "target.txt").read_text() == "keep me\n"
    rc, err = run_cli([*WRITERS[command], "--out", ""], capsys)
    assert rc != 0 and "--out" in err and MISSING not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == created  # nothing written, not even a default path


def test_the_core_refuses_device_nodes_and_symlinks(tmp_path):
    """One mechanism (interp.files) for every writer, from Python too: a device, a FIFO or a symlink is refused
    before a temp file is made beside it."""
    from interp.files import AtomicFile, atomic_write_text

    for kind, path in _kinds(tmp_path).items():
        with pytest.raises(InterpError, match="cannot write"):
            atomic_write_text(path, "x")
        with pytest.raises(InterpError, match="cannot write"):
            AtomicFile(path)
        assert _unchanged(path, kind)
    with pytest.raises(InterpError, match="empty"):
        AtomicFile("")
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_existing_checkpoint_is_not_overwritten_by_another_run(tmp_path, capsys, tiny_task, tiny_spec, tiny_cfg):
    from interp.training import train

    out = tmp_path / "run.safetensors"
    out.write_bytes(b"an earlier run")
    with pytest.raises(ConfigError, match="overwrite=True"):
        train(tiny_task, tiny_spec, tiny_cfg(epochs=1), out, device="cpu", progress=False)
    assert out.read_bytes() == b"an earlier run"
    rc, err = run_cli(["train", "noisy-majority", *TINY, "--out", str(out)], capsys)
    assert rc == 1 and "--overwrite" in err and out.read_bytes() == b"an earlier run"
    rc, err = run_cli(["train", "noisy-majority", *TINY, "--out", str(out), "--overwrite"], capsys)
    assert rc == 0, err
    assert interp.load_checkpoint(out, device="cpu").training["epochs"] == 1


# -- the explorer's typed input ---------------------------------------------------------------------------------------
def test_an_unknown_typed_token_is_one_line_never_split_into_characters():
    """Before: on repeated tokens (symbols 0..63), '64' was split into the tokens 6 and 4."""
    from interp.typed_input import token_strings

    vocab = get_task("repeated-tokens").vocab
    with pytest.raises(TokenError) as e:
        token_strings(vocab, "5 64 5 64")
    assert "unknown token '64'" in str(e.value) and "\n" not in str(e.value)
    assert token_strings(vocab, "5 63 5 63") == ["5", "63", "5", "63"]
    nm = get_task("noisy-majority").vocab  # one-character digits only: a run typed without spaces is unambiguous
    assert token_strings(nm, "0112 = 4") == ["0", "1", "1", "2", "=", "4"]


# -- attention spellings ----------------------------------------------------------------------------------------------
BASE = dict(d_vocab=9, n_ctx=32, d_model=8, n_heads=4, d_head=2)
SHORT = dict(train_lengths=[0, 10], val_lengths=[11, 15], test_lengths=[16, 20])  # noisy majority, n_ctx 24


@pytest.mark.parametrize(
    "typed, canonical",
    [
        (" window:4 ", "window:4"),
        ("window: 4", "window:4"),
        ("window:04", "window:4"),
        ("softmax+window:4", "window:4"),
        ("global:2+window:4", "window:4+global:2"),
        ("bigbird:4,1,2", "window:4+global:1+random:2"),
        (" linear:elu + window:8 ", "linear:elu+window:8"),
        ("window:8+linear:elu", "linear:elu+window:8"),
        ("softmax", "softmax"),
    ],
)
def test_one_canonical_spelling_per_attention_variant(typed, canonical):
    """Before: each spelling was stored as typed and became its own configuration (one cell, several rows)."""
    spec = ModelSpec(**BASE, attention=typed)
    assert spec.attention == canonical
    assert ModelSpec(**BASE, attention=canonical) == spec


@pytest.mark.parametrize(
    "typed, canonical", [(" lowrank:02", "lowrank:2"), ("sparse:.5", "sparse:0.5"), ("full ", "full")]
)
def test_one_canonical_spelling_per_qkv_shape(typed, canonical):
    assert ModelSpec(**BASE, qkv=typed).qkv == canonical


@pytest.mark.parametrize("typed", ["window:\u0664", "window:４", "sparse:\u0660.5", "window:4\u00a0"])
def test_non_ascii_spellings_are_refused(typed):
    key = "qkv" if typed.startswith("sparse") else "attention"
    with pytest.raises(ConfigError, match="ASCII"):
        ModelSpec(**BASE, **{key: typed})


def test_a_sweep_grid_with_two_spellings_of_one_variant_is_refused():
    from interp.app.sweeps import parse_grid

    with pytest.raises(ConfigError, match="more than once"):
        parse_grid(["attention=window:4,window:04"])
    with pytest.raises(ConfigError, match="more than once"):
        parse_grid(["attention=softmax+window:4,window:4"])
    with pytest.raises(ConfigError, match="more than once"):
        parse_grid(["qkv=lowrank:1,lowrank:01"])
    assert parse_grid(["attention=window: 4,softmax"]) == {"attention": ["window:4", "softmax"]}


def test_variant_refusals_name_the_flag_given(capsys):
    rc, err = run_cli(["train", "noisy-majority", *TINY, "--qkv", "lowrank:8", "--out", "x.safetensors"], capsys)
    assert rc != 0 and "--qkv lowrank:8" in err, err
    rc, err = run_cli(["train", "noisy-majority", *TINY, "--attention", "window:0", "--out", "x.safetensors"], capsys)
    assert rc != 0 and "--attention" in err, err
    rc, err = run_cli(["sweep", "noisy-majority", *TINY, "--grid", "qkv=full,lowrank:8", "--out", "sweep-dir"], capsys)
    assert rc != 0 and "--grid qkv=lowrank:8" in err, err


# -- circuits of low-rank Q/K/V ---------------------------------------------------------------------------------------
def test_circuits_of_a_low_rank_model_read_the_current_factors():
    """Before: full_ov_circuit returned the product of the factors as the last forward left it."""
    from interp.analyses import composition_scores, full_ov_circuit, full_qk_circuit
    from interp.attention import lowrank_names

    spec = ModelSpec(**{**BASE, "d_vocab_out": 8, "qkv": "lowrank:2", "n_layers": 2, "init_seed": 1})
    model = build_model(spec, device="cpu")
    attn = model.blocks[0].attn
    with torch.no_grad():
        for which in "QKV":
            getattr(attn, lowrank_names(which)[0]).mul_(3.0)
    products = {}
    for which in "QKV":
        a, b = (getattr(attn, n) for n in lowrank_names(which))
        products[which] = (a @ b).detach().view(8, 4, 2).transpose(0, 1)  # [head, d_model, d_head]
    ov = full_ov_circuit(model, heads="L0H1").dense()
    expected_ov = model.W_E @ products["V"][1] @ model.W_O[0, 1] @ model.W_U
    torch.testing.assert_close(ov, expected_ov.detach(), rtol=1e-5, atol=1e-5)
    qk = full_qk_circuit(model, heads="L0H2").dense()
    expected_qk = model.W_E @ products["Q"][2] @ products["K"][2].T @ model.W_E.T
    torch.testing.assert_close(qk, expected_qk.detach(), rtol=1e-5, atol=1e-5)
    scores = composition_scores(model, n_baseline=4)
    assert torch.isfinite(scores.scores("V")).all()
    torch.testing.assert_close(model.blocks[0].attn.W_V.detach(), products["V"])


# -- the attention spectrum's causal test -----------------------------------------------------------------------------
def test_the_spectrums_projected_patterns_stay_on_the_mask():
    """Before: a rank-k approximation of a masked pattern put up to 0.9 of a row's weight on keys the mask hides (and
    on future keys). Now each rank-k row is projected onto the allowed keys (negative and hidden entries zeroed) and
    renormalised to the original row's total."""
    from interp.analyses.spectrum import _rank_hooks
    from interp.attention import layer_attention

    task = get_task("repeated-tokens")
    spec = ModelSpec(**{**task.default_spec(), "n_layers": 1, "attention": "window:16+random:4", "init_seed": 2})
    model = build_model(spec, device="cpu")
    data = task.dataset("test").select(slice(0, 4))
    seen = {}

    def keep(p, hook):
        seen[hook.layer()] = p.detach().clone()

    for k in (1, 2, 8):
        hooks = _rank_hooks(model, None, k)(data) + [("blocks.0.attn.hook_pattern", keep)]
        with torch.no_grad():
            _, cache = model.run_with_cache(data.tokens, names_filter="blocks.0.attn.hook_pattern")
            original = cache["blocks.0.attn.hook_pattern"]
            model.run_with_hooks(data.tokens, fwd_hooks=hooks)
        p = seen[0]
        t = p.shape[-1]
        allowed = layer_attention(model, 0).allowed(t)
        real = torch.arange(t)[None, :] < data.lengths[:, None]
        off = p.masked_fill(allowed, 0.0).abs().sum(-1)  # weight off the mask, per row
        assert float(off.max()) == 0.0, k
        assert float(p.min()) >= 0.0
        rows = real[:, None, :]
        torch.testing.assert_close(p.sum(-1)[rows.expand_as(p.sum(-1))], original.sum(-1)[rows.expand_as(p.sum(-1))])


# -- w01 / w02 under sparse masks -------------------------------------------------------------------------------------
def test_w01_w02_under_a_sparse_mask_are_defined_over_the_sequences_that_show_both_classes():
    """Before: every head's w01/w02 was NaN under window:W (a sequence whose window hides a class gave log 0)."""
    from interp.analyses.noisy_majority.attention_ratios import measured_attention_ratios
    from interp.attention import layer_attention

    task = get_task("noisy-majority", test_size=64, test_lengths=[10, 30])
    spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2, "attention": "window:8"})
    spec = ModelSpec(**{**spec.to_dict(), "init_seed": 5})
    model = build_model(spec, device="cpu")
    data = task.dataset("test")
    r = measured_attention_ratios(model, data)
    assert torch.isfinite(r.w01).all() and torch.isfinite(r.w02).all()
    # an independent loop: per sequence, the tokens the '=' query sees, mean attention per token of each class
    _, cache = model.run_with_cache(data.tokens)
    pattern = cache["blocks.0.attn.hook_pattern"]  # [b, head, q, k]
    allowed = layer_attention(model, 0).allowed(data.tokens.shape[1])
    ids = [task.vocab.index[c] for c in "012"]
    logs01, logs02 = [], []
    for b in range(len(data)):
        q = int(data.answer_pos[b])
        seen = allowed[q, : q + 1]
        toks = data.tokens[b, : q + 1]
        mean = []
        for c in ids:
            where = (toks == c) & seen
            mean.append(pattern[b, :, q, : q + 1][:, where].mean(-1) if where.any() else None)
        if mean[0] is not None and mean[1] is not None:
            logs01.append((mean[0] / mean[1]).log())
        if mean[0] is not None and mean[2] is not None:
            logs02.append((mean[0] / mean[2]).log())
    torch.testing.assert_close(r.w01[0], torch.stack(logs01).mean(0).exp(), rtol=1e-4, atol=0)
    torch.testing.assert_close(r.w02[0], torch.stack(logs02).mean(0).exp(), rtol=1e-4, atol=0)
    assert r.n01.tolist() == [[len(logs01)] * 4] and r.n02.tolist() == [[len(logs02)] * 4]
    assert len(logs01) < len(data)  # the window hides a class in some sequences: they are left out, and counted
    assert f"{len(logs01)} of {len(data)}" in r.text()
    assert r.from_dict(r.to_dict()).to_dict() == r.to_dict()


# -- the explorer on linear and additive attention --------------------------------------------------------------------
@pytest.mark.parametrize("pooling", ["linear:elu", "additive"])
def test_the_explorer_on_a_non_bilinear_pooling_never_sticks(pooling):
    """Before: opening a head's panel raised the "QK circuit is a bilinear score" error, and so did every later
    action (each still applying its change)."""
    task = get_task("noisy-majority", train_size=64, val_size=32, test_size=64, **SHORT)
    spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2, "attention": pooling})
    w = interp.explore(build_model(spec, device="cpu"), task, batch_size=32)
    w._on_msg(w, {"type": "select", "head": "L0H1"}, [])
    assert w.status["error"] == ""
    names = [c["name"] for c in w.head_view["circuits"]]
    assert any("OV" in n for n in names)
    qk = [c for c in w.head_view["circuits"] if "QK" in c["name"]]
    assert qk and all("undefined" in c for c in qk) and pooling in qk[0]["undefined"]
    for msg in (
        {"type": "toggle", "head": "L0H2"},
        {"type": "example", "index": 3},
        {"type": "select", "head": "L0H0"},
    ):
        w._on_msg(w, msg, [])
        assert w.status["error"] == "", msg
    assert w.ablated == ["L0H2"] and w.head == "L0H0"
    assert "full_qk_circuit" not in w.snippet()


# -- the language-model objective -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["integer-addition", "modular-addition"])
def test_the_lm_objective_on_a_task_with_input_only_tokens_is_refused_before_training(tmp_path, name):
    """Before: IndexError (Target 11 is out of bounds) at the first batch."""
    from interp.training import TrainConfig, train

    params = {"integer-addition": {"train_size": 64}, "modular-addition": {"p": 7}}[name]
    task = get_task(name, **params)
    spec = ModelSpec(**task.default_spec())
    cfg = TrainConfig(**{**task.default_train(), "epochs": 1, "objective": "lm"})
    with pytest.raises(ConfigError, match="objective='lm'") as e:
        train(task, spec, cfg, tmp_path / "lm.safetensors", device="cpu", progress=False)
    assert "'='" in str(e.value)
    assert list(tmp_path.iterdir()) == []


# -- signals at start-up ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_signal_in_the_first_half_second_is_one_line(tmp_path):
    """Before: SIGINT while the command line was still importing printed a traceback (exit 1), and SIGTERM killed
    the process before its handler was installed. Now from the first line of the toolkit's entry point on, both give
    "interp: interrupted" and exit 130, without a traceback. The interpreter's own start-up (before any line of the
    toolkit runs) is timed first and waited out. The later delays land in ``import torch`` (where an exception raised
    into torch's C++ start-up aborted the process, exit 134) and in the first work of the command."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    python = [sys.executable, "-c", "pass"]
    t0 = time.perf_counter()
    subprocess.run(python, env=env, check=True)
    startup = time.perf_counter() - t0
    failures = []
    for delay in (0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.1, 1.5, 2.0):
        for sig in (signal.SIGINT, signal.SIGTERM):
            proc = subprocess.Popen(
                [sys.executable, "-m", "interp.app", "eval", "noisy-majority", "--quiet"],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(1.5 * startup + delay)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
            if proc.returncode != 130 or "Traceback" in err or "interp: interrupted" not in err:
                failures.append((sig.name, delay, proc.returncode, err[-300:]))
    assert not failures, failures


SWALLOWING_COMMAND = """
import os, signal, sys, time
import interp.app.cli as cli
from interp.app.entry import main

def swallowing(argv):  # a library that catches everything around the moment the signal lands
    try:
        os.kill(os.getpid(), signal.SIG{sig})
        time.sleep(2)
    except BaseException:
        pass
    print("finished", flush=True)
    return 0

cli.main = swallowing
{call}
"""


@pytest.mark.parametrize("sig", ["TERM", "INT"])
@pytest.mark.parametrize("call", ["main()", "raise SystemExit(main(['eval', 'noisy-majority']))"])
def test_an_interrupt_a_library_swallows_still_ends_the_command(sig, call):
    """Before: SIGTERM during an import inside a ``try: ... except BaseException`` (CI saw it once, 0.3 s into
    ``interp eval``) was swallowed with the KeyboardInterrupt the handler raised, and the command finished with exit 0
    as if never signalled. As the process's command the handler now exits at once (the command never resumes); called
    as ``main(argv)`` inside a caller's process, a handled signal makes the result 130 even if the interrupt was
    swallowed on its way up."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = SWALLOWING_COMMAND.format(sig=sig, call=call)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-500:])
    assert proc.stderr.strip().splitlines()[-1] == "interp: interrupted"
    assert "Traceback" not in proc.stderr
    if call == "main()":  # ended by the signal itself: the swallowing command did not go on
        assert "finished" not in proc.stdout


def test_an_interrupted_process_removes_the_temp_files_of_its_outputs(tmp_path):
    """The handler that ends the ``interp`` process removes the temp file of every output still being written
    (nothing unwinds, so no ``finally`` does it), and leaves finished outputs alone."""
    code = f"""
import os, signal, time
import interp.app.cli as cli
from interp.app.entry import main
from interp.files import AtomicFile

def writing(argv):
    AtomicFile({str(tmp_path / "done.txt")!r}).commit(lambda p: open(p, "w").write("x"))
    pending = AtomicFile({str(tmp_path / "half.txt")!r})
    assert pending.tmp.exists()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    return 0

cli.main = writing
main()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr[-500:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.txt"]


# -- the fast path under hooks ----------------------------------------------------------------------------------------
def test_hooked_runs_of_a_model_with_a_fast_path_use_it():
    """Before: any forward hook (the ablation's hook_z) sent a linear:elu+window:8 model to the O(n²) hooked path.
    The fast path fires hook_z, so learned accuracy and evaluation under hooks take it, with the same numbers."""
    from interp.ablation import ablation_hooks
    from interp.analyses import learned_accuracy
    from interp.analyses.reference import learned_accuracy_loop
    from interp.evaluation import predictions_and_loss
    from interp.fast_attention import _FastForward

    task = get_task("noisy-majority", test_size=48, test_lengths=[20, 40])
    spec = ModelSpec(
        **{
            **task.default_spec(),
            "n_layers": 2,
            "d_model": 8,
            "n_heads": 4,
            "d_head": 2,
            "attention": "linear:elu+window:8",
            "attn_only": False,
            "output_matrix": "learned",
        }
    )
    model = build_model(spec, device="cpu")
    data = task.dataset("test")
    calls = {"fast": 0}
    original = _FastForward.__call__

    def counting(self, *a, **kw):
        calls["fast"] += 1
        return original(self, *a, **kw)

    _FastForward.__call__ = counting
    try:
        heads = [["L0H0", "L1H3"], ["L0H1"], []]
        got = learned_accuracy(model, data, heads=heads, task=task)
        assert calls["fast"] > 0
        keep = torch.ones(2, 4)
        keep[0, 0] = 0
        before = calls["fast"]
        out = predictions_and_loss(model, data, fwd_hooks=ablation_hooks(model, keep))
        assert calls["fast"] > before
    finally:
        _FastForward.__call__ = original
    want = learned_accuracy_loop(model, data, heads=heads, task=task).accuracy
    torch.testing.assert_close(got.accuracy, want, rtol=0, atol=1e-6)
    with torch.no_grad():
        plain = predictions_and_loss(
            model, data, fwd_hooks=ablation_hooks(model, keep) + [("blocks.0.attn.hook_pattern", lambda p, hook: p)]
        )
    assert torch.equal(out["preds"], plain["preds"])
    torch.testing.assert_close(out["loss"], plain["loss"], rtol=1e-4, atol=1e-5)


# -- messages ---------------------------------------------------------------------------------------------------------
def test_shapley_beyond_its_limits_names_command_line_flags(tmp_path, capsys):
    """Before: interp shapley on too many heads told a command-line user to pass heads=[...] or sampled_shapley."""
    task = get_task("noisy-majority", train_size=64, val_size=32, test_size=32, test_lengths=[10, 20])
    spec = ModelSpec(**{**task.default_spec(), "d_model": 8, "n_heads": 32, "d_head": 2, "output_matrix": "learned"})
    path = interp.save_checkpoint(build_model(spec, device="cpu"), task, tmp_path / "wide.safetensors")
    rc, err = run_cli(["shapley", str(path), "--quiet"], capsys)
    assert rc == 1 and "--samples" in err and "--heads" in err and "heads=[" not in err and "shapley_values" not in err
    spec = ModelSpec(**{**spec.to_dict(), "n_heads": 64})
    path = interp.save_checkpoint(build_model(spec, device="cpu"), task, tmp_path / "wider.safetensors")
    rc, err = run_cli(["shapley", str(path), "--value", "separation", "--samples", "2", "--quiet"], capsys)
    assert rc == 1 and "--solver sklearn" in err and "solver=" not in err and "heads=[" not in err, err


def test_an_unknown_task_parameter_lists_the_valid_ones(capsys):
    """Before: --set train_size=... on modular addition printed a Python __init__ TypeError."""
    with pytest.raises(TaskError) as e:
        get_task("modular-addition", train_size=100)
    msg = str(e.value)
    assert "train_size" in msg and "__init__" not in msg and "its parameters are p, fraction, seed" in msg
    rc, err = run_cli(["eval", "modular-addition", "--set", "train_size=100"], capsys)
    assert rc == 1 and "fraction" in err and "__init__" not in err


def test_train_help_describes_the_optimizer_options_of_both_optimizers():
    from interp.app.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices["train"]
    helps = {a.dest: a.help for a in sub._actions}
    for name in ("lr", "weight_decay", "beta1", "beta2"):
        assert "--optimizer" in helps[name] and not helps[name].startswith("AdamW"), helps[name]
    assert "L2" in helps["weight_decay"] and "decoupled" in helps["weight_decay"]


def test_a_model_below_chance_is_said_to_be_at_or_below_chance():
    from interp.analyses.noisy_majority.head_summary import HeadSummary

    fields = HeadSummary.__dataclass_fields__
    assert "model_accuracy" in fields
    summary = HeadSummary.__new__(HeadSummary)
    summary.model_accuracy, summary.chance = 0.2, 0.5
    assert "at or below chance" in summary.warning


# -- the sweep report and --compare-by --------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_sweep_report_names_the_recipe_and_the_differences():
    """Before: the report of the Adam-with-L2 Table 1 never said its runs used Adam, and lacked --compare's
    differences. (Its two new parts, on the shipped rows; the whole page: the slow test below.)"""
    from interp.app.report import _differences_sections, _plan_options
    from interp.report_page import Report
    from interp.sweep_directory import read_plans

    plans = read_plans(ROOT / SHIPPED_TABLES[1])
    assert all(_plan_options(p)["optimizer"] == "adam" for p in plans)
    report = Report(title="t")
    _differences_sections(report, shipped_frame(SHIPPED_TABLES[1]))
    page = report.html()
    assert "strategy against normal" in page and "minus normal" in page and "Newcombe" in page
    assert page.count("shapley-svc") == 2  # d = 8 and d = 32 (d = 2 has normal runs only)


@pytest.mark.slow
def test_the_whole_sweep_report_names_the_recipe_and_the_differences():
    from interp.app.report import build_sweep_report

    html = build_sweep_report(ROOT / SHIPPED_TABLES[1], progress=False).html()
    assert "optimizer=adam (torch.optim.Adam: the weight decay is L2" in html
    assert "minus normal" in html and "Newcombe" in html


@pytest.mark.slow
def test_compare_by_any_configuration_key(capsys):
    """interp table --compare-by KEY compares the cells that differ only in KEY (here the attention variant, against
    softmax, its default), with Newcombe intervals; an unknown KEY is refused naming it."""
    from interp.analyses.populations import config_differences, newcombe_interval

    frame = shipped_frame("examples/results/attention/q1")
    diffs = config_differences(frame, key="attention", threshold=1.0)
    assert diffs and {d["attention"] for d in diffs} == {"linear:elu", "linear:relu", "additive"}
    for d in diffs:
        hits, n = round(d["share"] * d["runs"]), d["runs"]
        hits_b, n_b = round(d["baseline_share"] * d["baseline_runs"]), d["baseline_runs"]
        assert (d["difference_low"], d["difference_high"]) == newcombe_interval(hits, n, hits_b, n_b)
        assert d["baseline"] == "softmax"
    rc, err = run_cli(["table", str(ROOT / "examples/results/attention/q1"), "--compare-by", "attention"], capsys)
    assert rc == 0, err
    rc, err = run_cli(["table", str(ROOT / "examples/results/attention/q1"), "--compare-by", "no_such_key"], capsys)
    assert rc != 0 and "no_such_key" in err


@pytest.mark.slow
def test_compare_is_compare_by_strategy():
    """--compare (strategy_differences) is --compare-by strategy, on the 900 rows of the seed-regime Table 1."""
    from interp.analyses.populations import config_differences, strategy_differences

    frame = shipped_frame(SHIPPED_TABLES[1])
    assert strategy_differences(frame) == config_differences(frame, key="strategy", baseline="normal")


def test_a_new_sweep_directory_may_have_missing_parents(tmp_path):
    """A sweep's --out is a directory made with its parents (``--out sweeps/parens`` in a fresh folder), while a
    file's folder must exist; a file on the way is refused for both, in one line."""
    from interp.errors import InterpError
    from interp.files import check_output_path

    assert check_output_path(tmp_path / "sweeps" / "a" / "b", "the sweep", directory=True) == tmp_path / "sweeps/a/b"
    with pytest.raises(InterpError, match="does not exist"):
        check_output_path(tmp_path / "runs" / "x.safetensors", "the checkpoint")
    (tmp_path / "f").write_text("")
    with pytest.raises(InterpError, match=r"f is not a directory"):
        check_output_path(tmp_path / "f" / "new" / "dir", "the sweep", directory=True)
