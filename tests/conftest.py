"""Shared fixtures. Tests are fast by default; ``-m slow`` runs the long ones."""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of the default run's two workers: one thread each, so two workers on
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # two cores do not share cores between four threads (and what
    os.environ.setdefault("MKL_NUM_THREADS", "1")  # they start inherits it)

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from interp.model import quiet_tl

quiet_tl()


@pytest.fixture(scope="session")
def nm_task():
    from interp.tasks import get_task

    return get_task("noisy-majority")


@pytest.fixture(scope="session")
def nm_ckpt():
    """The shipped noisy-majority checkpoint, on CPU (shared: do not modify the model)."""
    from interp.tasks import load_checkpoint

    return load_checkpoint("noisy-majority", device="cpu")


@pytest.fixture(scope="session")
def tiny_task():
    """A small noisy-majority task for training tests (512 train sentences of up to 20 digits)."""
    from interp.tasks import get_task

    return get_task(
        "noisy-majority",
        train_size=512,
        val_size=128,
        test_size=128,
        train_lengths=[0, 20],
        val_lengths=[21, 30],
        test_lengths=[31, 40],
    )


@pytest.fixture(scope="session")
def tiny_spec(tiny_task):
    from interp.model import ModelSpec

    return ModelSpec(**{**tiny_task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2})


@pytest.fixture(scope="session")
def tiny_cfg():
    """``tiny_cfg(**overrides)``: a TrainConfig for a few fast epochs on ``tiny_task``."""
    from interp.training import TrainConfig

    def make(**kw):
        return TrainConfig(**{"epochs": 12, "batch_size": 64, "lr": 1e-2, "warmup_steps": 10, "seed": 0, **kw})

    return make


@pytest.fixture
def refusing_compilers(tmp_path, monkeypatch):
    """``refusing_compilers(line)``: every C compiler the run-time builds try (:data:`interp.native.COMPILERS`)
    wrapped, on the front of the PATH, to fail for a source holding ``line`` (e.g. ``#define D 16``) and compile
    anything else as before: one shape's build failing, as a timeout on a loaded machine would."""
    import os
    import shutil

    from interp.native import COMPILERS

    def install(line: str) -> None:
        fakebin = tmp_path / "refusing-bin"
        fakebin.mkdir(exist_ok=True)
        refuse = f'for a in "$@"; do case "$a" in *.c|*.cpp) grep -q "^{line}$" "$a" && exit 1;; esac; done\n'
        for name in COMPILERS:
            real = shutil.which(name)
            if real:
                (fakebin / name).write_text(f'#!/bin/sh\n{refuse}exec {real} "$@"\n')
                (fakebin / name).chmod(0o755)
        monkeypatch.setenv("PATH", f"{fakebin}{os.pathsep}{os.environ['PATH']}")

    return install


@pytest.fixture
def cpu_generator():
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="session")
def shipped_report(tmp_path_factory):
    """``build(name) -> (path, seconds)``: the HTML report of a shipped checkpoint, written once per session
    by ``interp report NAME`` run in-process (shared by tests/test_report.py and tests/test_browser.py)."""
    import time

    from interp.app.cli import main
    from interp.tasks import shipped_checkpoints

    built = {}

    def build(name: str):
        if name not in shipped_checkpoints():
            pytest.skip(f"no shipped checkpoint {name!r} in tasks/checkpoints/")
        if name not in built:
            out = tmp_path_factory.mktemp("report") / f"{name}.html"
            t0 = time.perf_counter()
            rc = main(["report", name, "--out", str(out), "--quiet", "--device", "cpu"])
            built[name] = (out, time.perf_counter() - t0)
            assert rc == 0 and out.is_file(), f"interp report {name} failed with exit code {rc}"
        return built[name]

    return build
