"""The one deterministic mode of the toolkit: what makes a run reproduce its weights bit for bit.

On the CPU, multi-threaded scatter-adds (the backward of embedding and index lookups) round differently from run to
run unless PyTorch's deterministic algorithms are on, and a parallel reduction rounds differently on another number
of threads: :func:`deterministic` turns the first on and, given ``threads``, fixes the second (the count is recorded
in every checkpoint as ``cpu_threads``). On CUDA it also asks cuDNN for deterministic kernels without benchmarking and
gives cuBLAS the fixed workspace (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, set where unset) that its deterministic
matrix products need; that variable is read when CUDA first runs a matrix product in the process, so it is left set.
Operations without a deterministic implementation warn rather than fail (``warn_only``). Every trainer runs inside
it: :func:`interp.training.train`, :func:`interp.population.train_population` and the command line's ``--threads``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

CUBLAS_WORKSPACE = ":4096:8"


@contextmanager
def deterministic(threads: int | None = None) -> Iterator[None]:
    """Inside: ``torch.use_deterministic_algorithms(True, warn_only=True)``, cuDNN deterministic and not
    benchmarking, and (with ``threads``) ``torch.set_num_threads(threads)``; each restored on exit."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.get_num_threads(),
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        if threads:
            torch.set_num_threads(before[4])
