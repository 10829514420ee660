"""Defects a researcher found in sweeps, Shapley and eval; each test failed before its fix.

A1 runs identified by their whole configuration; A2 non-finite weights refused on every path; A3 a task parameter
override carried to the splits it implies; B2 --snapshots checked before training; C1 Shapley pairs read by sign
and the value's direction; C2/C3 bad or duplicate grid values refused before anything is written; C5 a damaged
results line; C6 the answer loss named apart from evaluate's loss; C7 an estimate before long Shapley work and a
clean exit on SIGTERM; C8 clear messages (layers=[], --samples 1, eval --quiet, --out /proc/x).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from interp.analyses.populations import population_table
from interp.app.cli import main
from interp.app.sweeps import parse_grid, run_sweep
from interp.errors import ConfigError, HeadError, InterpError
from interp.model import ModelSpec
from interp.native import COMPILERS
from interp.sweep_directory import RESULTS, load_results, read_results
from interp.tasks import get_task, load_checkpoint
from interp.training import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
PARAMS = dict(
    train_size=64, val_size=16, test_size=16, train_lengths=[0, 8], val_lengths=[9, 12], test_lengths=[13, 16]
)
SET = [x for k, v in PARAMS.items() for x in ("--set", f"{k}={json.dumps(v)}")]


@pytest.fixture
def task():
    return get_task("noisy-majority", **PARAMS)


def _spec(task, **kw):
    return ModelSpec(**{**task.default_spec(), "d_model": 4, "n_heads": 2, "d_head": 2, **kw})


def _cfg(**kw):
    return TrainConfig(**{"epochs": 1, "batch_size": 32, "lr": 1e-2, "warmup_steps": 2, **kw})


# -- A1 ---------------------------------------------------------------------------------------------------------------
def test_a_second_sweep_with_other_base_options_trains_its_own_runs(tmp_path, task, capsys):
    first = run_sweep(task, _spec(task), _cfg(), [0, 1], {}, tmp_path, device="cpu", progress=False)
    second = run_sweep(
        task, _spec(task, d_model=6, n_heads=3), _cfg(), [0, 1], {}, tmp_path, device="cpu", progress=False
    )
    assert {r["name"] for r in first}.isdisjoint(r["name"] for r in second)
    assert [r["d_model"] for r in second] == [6, 6] and len(load_results(tmp_path)) == 4
    third = run_sweep(task, _spec(task), _cfg(lr=3e-3), [0], {}, tmp_path, device="cpu", progress=False)
    assert third[0]["lr"] == 3e-3 and len(load_results(tmp_path)) == 5
    table = population_table(load_results(tmp_path))
    assert sorted((r["d_model"], r["lr"], r["runs"]) for r in table) == [(4, 0.003, 1), (4, 0.01, 2), (6, 0.01, 2)]
    capsys.readouterr()
    assert main(["sweep", str(tmp_path), "--status"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert {"d_model", "n_heads", "lr", "strategy"} <= set(header)  # every key that differs between the plans
    assert "5 of 5 runs done" in out
    # another task's sweep into this directory is refused before anything is written
    other = get_task("repeated-tokens", train_size=8, val_size=4, test_size=4)
    with pytest.raises(ConfigError, match="holds sweeps of noisy-majority"):
        run_sweep(other, ModelSpec(**other.default_spec()), _cfg(), [0], {}, tmp_path, device="cpu", progress=False)
    assert len(load_results(tmp_path)) == 5


# -- A2 ---------------------------------------------------------------------------------------------------------------
def test_a_nan_weight_is_refused_by_every_accuracy_path():
    from interp.analyses import coalition_values, learned_accuracy
    from interp.evaluation import evaluate

    ckpt = load_checkpoint("noisy-majority", device="cpu")
    model, test = ckpt.model, ckpt.task.dataset("test").select(slice(0, 64))
    with torch.no_grad():
        model.blocks[0].attn.W_Q[3, 0, 0] = float("nan")
    calls = [
        lambda: learned_accuracy(model, test, heads=[["L0H1"], []]),
        lambda: coalition_values(model, test, heads=["L0H1", "L0H3"]),  # the fast linear path
        lambda: coalition_values(model, test, heads=["L0H1", "L0H3"], method="hooks"),
        lambda: coalition_values(model, test, heads=["L0H1", "L0H3"], value="logit-diff"),
        lambda: evaluate(model, ckpt.task, test),
    ]
    for call in calls:
        with pytest.raises(InterpError, match=r"blocks\.0\.attn\.W_Q holds NaN"):
            call()


# -- A3 ---------------------------------------------------------------------------------------------------------------
def test_overriding_digits_carries_to_the_test_splits(capsys):
    assert (
        main(
            [
                "eval",
                "integer-addition",
                "--set",
                "digits=6",
                "--splits",
                "test",
                "--set",
                "test_size=50",
                "--json",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["task_params"]["digits"] == [6, 6] and out["task_params"]["test_digits"] is None
    task = get_task("integer-addition", **out["task_params"])
    assert task.split_digits("test") == (6, 6) == task.split_digits("cascades")
    data = task.dataset("test")
    assert int(data.fields["n_digits"].min()) == 6  # the test sums have 6 digits, not the 5 the model was trained on


# -- B2 ---------------------------------------------------------------------------------------------------------------
def test_snapshots_beyond_the_run_are_refused_before_training(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    rc = main(["train", "modular-addition", "--epochs", "2", "--snapshots", "10", "--out", str(out), "--quiet"])
    assert rc == 1 and "--snapshots 10" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []


# -- C1, C6 -----------------------------------------------------------------------------------------------------------
def test_shapley_pairs_are_read_by_sign_and_direction():
    from interp.analyses import CoalitionValues

    # v(S) of 3 heads: heads 0 and 1 are redundant (either alone is worth 1, both together 1), head 2 adds 0.5 alone
    v = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.5, 1.5, 1.5, 1.5], dtype=torch.float64)
    heads = [(0, 0), (0, 1), (0, 2)]
    res = CoalitionValues(heads, v, "learned-accuracy").shapley()
    text = res.text()
    assert "higher is better" in text
    assert "most synergistic pairs: none" in text  # every interaction is <= 0: no pair listed as synergy
    assert "most redundant pairs: L0H0+L0H1 I = -1.0000" in text
    loss = CoalitionValues(heads, -v, "answer-loss").shapley().text()  # the same game as a loss: lower is better
    assert "lower is better" in loss and "most synergistic pairs: none" in loss
    assert "most redundant pairs: L0H0+L0H1 I = +1.0000" in loss


@pytest.mark.slow
def test_the_answer_loss_is_named_apart_from_evaluates_loss():
    from interp.analyses import coalition_values
    from interp.evaluation import evaluate

    ckpt = load_checkpoint("noisy-majority", device="cpu")
    test = ckpt.task.dataset("test").select(slice(0, 128))
    with pytest.raises(InterpError, match="'answer-loss'"):
        coalition_values(ckpt.model, test, heads=["L0H1"], value="loss")
    cv = coalition_values(ckpt.model, test, heads=["L0H1"], value="answer-loss")
    with torch.no_grad():
        logits = ckpt.model(test.tokens)
    rows = torch.arange(len(test))
    answer_ce = torch.nn.functional.cross_entropy(logits[rows, test.answer_pos].double(), test.labels)
    # heads other than L0H1 ablated in every coalition: only v(all players) = the full model is comparable
    full = coalition_values(ckpt.model, test, value="answer-loss")
    assert full.v_all == pytest.approx(float(answer_ce), abs=1e-5)
    both = evaluate(ckpt.model, ckpt.task, test)["loss"]  # the answer and [EOS] positions, averaged
    eos_ce = torch.nn.functional.cross_entropy(
        logits[rows, test.answer_pos + 1].double(), torch.full_like(test.labels, 7)
    )
    assert both == pytest.approx(float(answer_ce + eos_ce) / 2, abs=1e-5)
    assert cv.value == "answer-loss"


# -- C2, C3, C5 -------------------------------------------------------------------------------------------------------
def test_bad_or_duplicate_grid_values_are_refused_before_anything_is_written(tmp_path, task):
    with pytest.raises(ConfigError, match="given more than once"):
        parse_grid(["lr=1e-3,0.001"])
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(["lr=1e-3", "lr=3e-3"])
    with pytest.raises(ConfigError, match="d_model: expected int"):
        parse_grid(["d_model=eight"])
    with pytest.raises(ConfigError, match="n_heads \\* d_head == d_model"):  # a grid point that cannot be built
        run_sweep(
            task,
            _spec(task, output_matrix="identity"),
            _cfg(),
            [0],
            {"n_heads": [2, 3]},
            tmp_path / "s",
            device="cpu",
            progress=False,
        )
    with pytest.raises(ConfigError, match="dropout"):
        run_sweep(task, _spec(task), _cfg(), [0], {"dropout": [0.1, 1.5]}, tmp_path / "t", device="cpu", progress=False)
    assert not (tmp_path / "s").exists() and not (tmp_path / "t").exists()
    rc = main(["sweep", "noisy-majority", *SET, "--grid", "lr=0.01,0.01", "--out", str(tmp_path / "u"), "--quiet"])
    assert rc == 1 and not (tmp_path / "u").exists()


def test_a_damaged_results_line_is_named_and_rebuilt_by_resume(tmp_path, task, capsys):
    run_sweep(task, _spec(task), _cfg(), [0, 1, 2], {}, tmp_path, device="cpu", progress=False)
    lines = (tmp_path / RESULTS).read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # a half-written line (an editor, a full disk)
    (tmp_path / RESULTS).write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["table", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "line 2 of 3 is not a JSON row" in err and "--resume` rebuilds the rows" in err
    assert main(["sweep", str(tmp_path), "--status"]) == 0  # status still reads the checkpoints
    assert "3 of 3 runs done" in capsys.readouterr().out
    with pytest.warns(UserWarning, match="left out, and rebuilt"):
        assert main(["sweep", str(tmp_path), "--resume", "--quiet", "--device", "cpu"]) == 0
    assert len(read_results(tmp_path)) == 3 and len(load_results(tmp_path)) == 3


# -- C7 ---------------------------------------------------------------------------------------------------------------
def test_long_shapley_work_says_how_long_first(capsys):
    from interp.analyses import coalition_values

    ckpt = load_checkpoint("noisy-majority", device="cpu")
    test = ckpt.task.dataset("test").select(slice(0, 64))
    coalition_values(ckpt.model, test, heads=[f"L0H{i}" for i in range(13)], progress=True)
    err = capsys.readouterr().err
    assert "learned-accuracy of all 8,192 coalitions of 13 heads: about" in err


def _in_own_session(argv: list[str], temp: Path) -> subprocess.Popen:
    """``argv`` started from the repository in a session of its own (its id is the pid: :func:`_live_processes`
    lists what is left of it), with ``temp`` as its TMPDIR and its output captured as text."""
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(temp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _live_processes(session: int, grace: float = 10.0) -> list[str]:
    """The processes of ``session`` still running after up to ``grace`` seconds (a SIGKILLed one takes a moment to
    go). Zombies are not counted: they have ended, and reaping an orphan's is the init process's job, not ours
    (this machine's init reaps them late)."""
    deadline = time.time() + grace
    while True:
        ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-s", str(session)], capture_output=True, text=True)
        alive = [line.strip() for line in ps.stdout.splitlines() if line.split()[1:2] and "Z" not in line.split()[1]]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.1)


@pytest.mark.skipif(not any(shutil.which(c) for c in COMPILERS), reason="no C compiler on the PATH")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_c_build_stops_the_compiler_and_removes_its_folder(tmp_path, sig):
    """Before: the command line ends on a signal with ``os._exit`` (nothing unwinds), so a C function being built
    at that moment (the SVC solver, the count kernel) left its compiler running after the process and its folder in
    the temp directory (CI saw the compiler still alive once)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    # a real compile long enough to be caught in the middle: many functions the optimizer works on
    source = "".join(
        f"double f{i}(double x) {{ for (int k = 0; k < {i}; k++) x = x * 1.0001 + k; return x; }}\n"
        for i in range(3000)
    )
    script = (
        "import signal, sys\n"
        "from interp.app.signals import exit_now\n"
        "for s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, exit_now)\n"
        "from interp.native import build\n"
        f"build({source!r}, 'slow')\n"
        "print('built', flush=True)\n"
    )
    (tmp_path / "build.py").write_text(script)
    proc = _in_own_session([sys.executable, str(tmp_path / "build.py")], temp)
    try:
        started = time.time()
        stages = []  # the compiler driver's stages (cc1, as, collect2, ld): the processes of the session below it
        while time.time() - started < 60 and proc.poll() is None and not stages:
            ps = subprocess.run(["ps", "-o", "pid=,ppid=", "-s", str(proc.pid)], capture_output=True, text=True)
            rows = [line.split() for line in ps.stdout.splitlines() if line.strip()]
            stages = [pid for pid, ppid in rows if ppid != str(proc.pid) and pid != str(proc.pid)]
            time.sleep(0.02)
        assert proc.poll() is None, "the build ended before a compiler stage was seen: make the source longer"
        assert list(temp.iterdir()), "the build's folder is not in TMPDIR"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in err and "built" not in out, (proc.returncode, err[-2000:])
    assert list(temp.iterdir()) == []  # the build's folder removed
    alive = _live_processes(proc.pid)
    assert not alive, f"processes of the build still running: {alive}"


# An interrupt put at one exact moment of a build (found by a researcher's trial, which forced them the same way):
# the script patches what interp.native calls to send the signal itself, right after that step.
_MOMENT = """
import json, os, signal, subprocess, sys, types
import interp.native as native
from interp.app.signals import exit_now

moment, ends = sys.argv[1], sys.argv[2]
if ends == "exit":  # the command line's handler: os._exit, nothing unwinds
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, exit_now)
patched = types.ModuleType("os")
patched.__dict__.update(os.__dict__)
native.os = patched
if moment == "folder made":
    patched.mkdir = lambda *a: (os.mkdir(*a), signal.raise_signal(signal.SIGTERM))[0]
if moment == "compiler started":
    class Popen(subprocess.Popen):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            signal.raise_signal(signal.SIGINT if ends == "raise" else signal.SIGTERM)
    native.subprocess = types.SimpleNamespace(**{**subprocess.__dict__, "Popen": Popen})
if moment == "second ctrl-c while stopping":
    import threading  # the first Ctrl-C half a second in, while the compiler works (the compile takes longer)

    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()

    def killpg(*a):
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C just as the first one's cleanup kills the compiler
        os.killpg(*a)
    patched.killpg = killpg
try:
    native.build(open(sys.argv[3]).read(), "slow")
    print(json.dumps({"built": True}))
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True, "registry": list(native._RUNNING)}))
"""


@pytest.mark.skipif(not any(shutil.which(c) for c in COMPILERS), reason="no C compiler on the PATH")
@pytest.mark.parametrize(
    "moment, ends",
    [
        ("folder made", "exit"),
        ("compiler started", "exit"),
        ("compiler started", "raise"),
        ("second ctrl-c while stopping", "raise"),
    ],
)
def test_an_interrupt_at_each_moment_of_a_c_build_leaves_nothing(tmp_path, moment, ends):
    """Before: a signal just after the build's folder was made, or just after its compiler started, fell before
    either was registered for the clean-up (the folder, or the running compiler, was left); and in a caller's
    process a second Ctrl-C while the first one's clean-up ran left the compiler running. ``ends``: ``exit`` is
    the command line's handler (os._exit), ``raise`` a caller's KeyboardInterrupt. The first and last cases fail on
    the code before; the "compiler started" ones guard: there the compiler, started just before its folder was
    removed, usually ended at once for want of its source."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    (tmp_path / "moment.py").write_text(_MOMENT)
    # a compile that takes a second or more: a compiler left running would still be seen below
    source = "".join(
        f"double f{i}(double x) {{ for (int k = 0; k < {i}; k++) x = x * 1.0001 + k; return x; }}\n"
        for i in range(3000)
    )
    (tmp_path / "source.c").write_text(source)
    proc = _in_own_session(
        [sys.executable, str(tmp_path / "moment.py"), moment, ends, str(tmp_path / "source.c")], temp
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if ends == "exit":
        assert proc.returncode == 130 and "interrupted" in err and "built" not in out, err[-2000:]
    else:
        assert proc.returncode == 0, err[-2000:]
        assert json.loads(out) == {"interrupted": True, "registry": []}
    assert list(temp.iterdir()) == []  # the build's folder removed
    # the script's session: its compiler, if still running, is in it (start_new_session: the session id is the pid)
    alive = _live_processes(proc.pid, grace=0.5)
    assert not alive, f"processes of the build still running: {alive}"


@pytest.mark.slow
def test_sigterm_stops_a_long_shapley_run_cleanly(tmp_path):
    out = tmp_path / "s.json"
    temp = tmp_path.parent / f"{tmp_path.name}-tmp"  # the run's TMPDIR (the C solver is built in it)
    temp.mkdir()
    proc = _in_own_session(
        [
            sys.executable,
            "-m",
            "interp.app",
            "shapley",
            "repeated-tokens",
            "--value",
            "separation",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
        temp,
    )
    try:
        started = time.time()
        while time.time() - started < 120 and proc.poll() is None and not list(tmp_path.glob(".s.json.*.tmp")):
            time.sleep(0.2)  # until the output file is reserved: the checkpoint is loaded next, then the work
        time.sleep(8)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind
    # nor a C build's folder or its compiler's temp files (torch's compile cache is torch's, kept by design)
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []
    alive = _live_processes(proc.pid)
    assert not alive, f"processes of the run still running: {alive}"


# -- C8 ---------------------------------------------------------------------------------------------------------------
def test_clear_messages_for_small_mistakes(capsys):
    from interp.analyses import activation_patching, shapley_values

    ckpt = load_checkpoint("noisy-majority", device="cpu")
    test = ckpt.task.dataset("test").select(slice(0, 8))
    with pytest.raises(HeadError, match=r"layers=\[\] names no layer"):
        activation_patching(ckpt.model, test, corrupted=test, metric="logit_diff", layers=[])
    with pytest.raises(InterpError, match="at least two permutations"):
        shapley_values(ckpt.model, test, method="sampled", samples=1)
    with pytest.raises(SystemExit, match="at least 2 permutations"):
        main(["shapley", "noisy-majority", "--samples", "1"])
    assert main(["eval", "noisy-majority", "--quiet", "--splits", "test"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "split" and len(lines) == 2


@pytest.mark.parametrize(
    "command",
    [
        ["report", "noisy-majority"],
        ["analyze", "noisy-majority"],
        ["shapley", "noisy-majority"],
        ["train", "noisy-majority", "--epochs", "1"],
    ],
)
def test_an_output_path_that_cannot_be_written_is_one_clear_line(command, capsys):
    assert main([*command, "--out", "/proc/x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot write" in err and "/proc/x" in err


def test_a_sweep_over_several_halving_strategies_from_the_command_line(tmp_path, capsys):
    """``--halving S1,S2`` is the sweep's grid of strategies, one Table 1 row each (the base run leaves it unset)."""
    out = tmp_path / "h"
    args = ["sweep", "noisy-majority", *SET, "--d-model", "4", "--n-heads", "2", "--d-head", "2", "--epochs", "1"]
    args += ["--batch-size", "32", "--seeds", "0", "--halving", "none,mask-all-but-one,random", "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    strategies = sorted(r["strategy"] for r in population_table(load_results(out)))
    assert strategies == ["mask-all-but-one", "normal", "random"]
    capsys.readouterr()
    assert main(["sweep", "noisy-majority", *args[2:], "--status"]) == 0
    assert "3 of 3 runs done" in capsys.readouterr().out
