"""benchmarks/population.py refuses bad counts on its command line (argparse's exit 2 and one line naming the
argument), before any training: no statistics over zero repeats, no population of no models."""

from __future__ import annotations

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
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "population.py"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert f"population.py: error: {message}" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
