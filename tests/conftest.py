"""Shared fixtures. Tests are fast by default; ``-m slow`` runs the long ones."""

from __future__ import annotations

import pytest
import torch

from interp.model import quiet_tl

quiet_tl()


@pytest.fixture(scope="session")
def nm_task():
    from tasks import get_task

    return get_task("noisy-majority")


@pytest.fixture(scope="session")
def nm_ckpt():
    """The shipped noisy-majority checkpoint, on CPU (shared: do not modify the model)."""
    from interp.checkpoint import load_checkpoint

    return load_checkpoint("noisy-majority", device="cpu")


@pytest.fixture
def cpu_generator():
    return torch.Generator().manual_seed(0)
