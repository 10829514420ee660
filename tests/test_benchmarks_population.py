"""benchmarks/population.py (and the SVC A/B, benchmarks/batched_svc_step.py) refuse bad arguments on their
command line (argparse's exit 2 and one line naming the argument), before any training: no statistics over zero
repeats, no population of no models."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--repeats", "0"], "argument --repeats: expected a positive integer, got 0"),
        (["--models", "-3"], "argument --models: expected a positive integer, got -3"),
        (["--epochs", "two"], "argument --epochs: expected a positive integer, got 'two'"),
        (["--position-models", "0"], "argument --position-models: expected a positive integer, got 0"),
    ],
)
def test_bad_counts_are_a_usage_error_before_any_training(argv, message):
    _assert_usage_error("population.py", argv, message)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--runs", "counts-32:0:eager"], "argument --runs: K must be a positive integer (1 for solo)"),
        (["--runs", "counts-32:2:solo"], "argument --runs: K must be a positive integer (1 for solo)"),
        (["--runs", "counts-33:1:eager"], "argument --runs: unknown configuration 'counts-33'"),
        (["--runs", "counts-32:4:fast"], "argument --runs: unknown side 'fast'"),
        (["--runs", "counts-32:4"], "argument --runs: expected CONFIG:K:SIDE"),
        (["--epochs", "0"], "argument --epochs: expected a positive integer, got 0"),
        (["--device", "cuda:-1"], "argument --device: "),
    ],
)
def test_the_device_benchmark_refuses_bad_runs_before_any_training(argv, message):
    _assert_usage_error("population_device.py", argv, message)


@pytest.mark.slow
def test_the_device_benchmark_times_a_population_and_its_solo_run(tmp_path):
    """One tiny run of each side on the CPU: each is measured and written, and the ratio is the solo rate over the
    side's. Behaviour only: no timing is asserted."""
    out = tmp_path / "rates.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "population_device.py"),
            "--device",
            "cpu",
            "--runs",
            "counts-2:2:eager,counts-2:1:solo",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    eager, solo = json.loads(out.read_text())
    assert (eager["side"], eager["K"], solo["side"], solo["K"]) == ("eager", 2, "solo", 1)
    # rates are differences of two wall times (3E and E epochs): finite, with no sign asserted (load can flip it)
    assert all(math.isfinite(r["s_per_model_epoch"]) and r["warmup_s"] > 0 for r in (eager, solo))
    assert eager["solo_over_side"] == pytest.approx(solo["s_per_model_epoch"] / eager["s_per_model_epoch"])
    assert "solo / side" in done.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--skip", "6"], "argument --skip: must be below --epochs (6); got 6"),
        (["--models", "0"], "argument --models: expected a positive integer, got 0"),
        (["--config", "counts-33"], "argument --config: invalid choice: 'counts-33'"),
    ],
)
def test_the_epoch_timer_refuses_bad_arguments_before_any_training(argv, message):
    _assert_usage_error("population_epochs.py", argv, message)


def _assert_usage_error(script: str, argv: list[str], message: str) -> None:
    """``benchmarks/<script> argv`` exits 2 with argparse's one line naming ``message``, no traceback, no output."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert f"{script}: error: {message}" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("population_bench", ROOT / "benchmarks" / "population.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_torch_masks_floor_counts_the_solo_runs_draws():
    """The masks' floor counts what a solo run of seed 0 draws from its generator per epoch: the attention output
    ``[batch, 2, d_model]`` of every sentence, and under embedding dropout each batch padded to its longest sentence
    (counted here from the batches of seed 0's order, as the training loop cuts them); counter masks draw nothing
    from a generator."""
    import torch

    from interp.tasks import get_task

    bench = _bench()
    data = get_task("noisy-majority").dataset("train")
    n = len(data)
    assert bench.torch_mask_draws("counts-32") == n * 2 * 32
    assert bench.torch_mask_draws("counts-8") == n * 2 * 8
    assert bench.torch_mask_draws("counts-32-counter") == 0
    assert bench.torch_mask_draws("positions-counter") == 0
    assert bench.torch_mask_draws("prefix-counts") == 0
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    padded = sum(len(rows) * int(data.lengths[rows].max()) for rows in perm.split(128))
    assert bench.torch_mask_draws("positions") == n * 2 * 32 + padded * 32


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--before", ".", "--rounds", "0"], "argument --rounds: expected a positive integer, got 0"),
        (["--before", "no/such/checkout"], "argument --before: no analyses/batched_svc.py in no/such/checkout"),
    ],
)
def test_the_svc_ab_refuses_bad_arguments_before_any_work(argv, message):
    """benchmarks/batched_svc_step.py: the same usage errors, before it loads a model or fits a separator."""
    _assert_usage_error("batched_svc_step.py", argv, message)
