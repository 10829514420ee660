"""The C SVC solver (analyses/svc_native.py) against independent computations: the objective's own Newton step by
plain formulas (the minimiser's certificate), the torch solver (the same minimiser within the stopping rule),
scikit-learn's LinearSVC, and a coalition solved alone; its order and parents against plain loops."""

from __future__ import annotations

import os
import re

import pytest
import torch

from interp.analyses import batched_svc as bs
from interp.analyses import svc_native as sn
from interp.errors import InterpError
from tests.test_shapley import _blobs, _lattice_data, _newton_step


def _needs_c():
    """Skip where the C solver is not used (the torch tests hold there), or fail where INTERP_REQUIRE_C=1 (as CI
    sets it), so the C engine's tests cannot pass by skipping."""
    if bs.engine_status() != "c":
        if os.environ.get("INTERP_REQUIRE_C") == "1":
            pytest.fail(f"the C solver is not used here ({bs.engine_status()}), but INTERP_REQUIRE_C=1 requires it")
        pytest.skip(f"the C solver is not used here: {bs.engine_status()}")


def test_the_c_solver_is_what_runs_here():
    """On this project's machines the C solver is built and passes its self-check, so halving's Shapley scores use
    it; where it is not, the torch solver runs and the status says why."""
    _needs_c()
    assert bs.engine_status() == "c"


def test_depth_first_order_and_parents_equal_plain_loops():
    """The order: the players of each coalition in increasing order, compared as sequences (Python's own tuple
    order); the parents: the coalition without its highest player, looked up by a dict; on the full lattice of 5
    players and on a random part of 8 players' (parents missing)."""
    g = torch.Generator().manual_seed(0)
    for n, index in ((5, torch.arange(32)), (8, torch.randperm(256, generator=g)[:90])):
        order = sn.depth_first(index, n)
        want = sorted(range(len(index)), key=lambda r: [i for i in range(n) if int(index[r]) >> i & 1])
        assert order.tolist() == want
        masks = index[order]
        par = sn.parents(masks).tolist()
        row = {int(m): r for r, m in enumerate(masks)}
        for r, m in enumerate(masks.tolist()):
            parent = m - (1 << (m.bit_length() - 1)) if m else None
            assert par[r] == (row.get(parent, -1) if m else -1), m
            if par[r] >= 0:  # visited before, with no other coalition of the parent's size in between
                between = [int(x).bit_count() for x in masks[par[r] + 1 : r]]
                assert par[r] < r and all(b > m.bit_count() - 1 for b in between)


@pytest.mark.parametrize("C", [1.0, 1000.0, 1e6])
def test_every_coalition_is_the_exact_minimiser_and_the_torch_solvers(C):
    """Every coalition of 6 players, from near-separable to hopeless (all samples violate: the all-sample path):
    each weight vector's Newton step by the plain formulas within the stopping rule (1e-9 of max(1, |w|), times 1.01
    for the recomputation's rounding), zero off the coalition, and the torch solver's weights within 2e-9 of their
    norm (each is within 1e-9 of the minimiser)."""
    _needs_c()
    x, y = _lattice_data()
    W, iters = bs.svc_weights(x, y, torch.arange(64), C=C, engine="c")
    ref, _ = bs.svc_weights(x, y, torch.arange(64), C=C, engine="torch")
    assert int(iters.max()) <= 100
    for mask in range(64):
        size = max(1.0, float(W[mask].norm()))
        assert float(torch.linalg.vector_norm(_newton_step(x, y, W[mask], mask, C))) <= 1.01e-9 * size, mask
        off = [1 + i * 2 + j for i in range(6) if not mask >> i & 1 for j in range(2)]
        assert bool((W[mask, off] == 0).all())
        assert float((W[mask] - ref[mask]).norm()) <= 2e-9 * size, mask


@pytest.mark.parametrize("C", [1000.0, 1e6])
def test_separable_data_reach_the_minimiser_from_any_start(C):
    """Well separated classes (few active samples: a full Newton step overshoots), every coalition along the lattice
    (warm starts from parents) against the same coalition solved alone (a cold start), within 1e-7 of the weights'
    norm, and each one's Newton step within the stopping rule. These take many Newton steps, as the active samples
    change a few at a time (up to 88 for the torch solver and 101 for this one on the 5 x 8 features, each choosing
    its working sets its own way), so max_iter is 300 here."""
    _needs_c()
    n, e = (5, 8) if C == 1000.0 else (4, 2)
    x, y = _blobs(2000 if C == 1000.0 else 100, n, e, 6.0, 0)
    W, iters = bs.svc_weights(x, y, torch.arange(1 << n), C=C, engine="c", max_iter=300)
    assert int(iters.max()) <= 300
    for mask in range(1, 1 << n):
        size = max(1.0, float(W[mask].norm()))
        assert float(_newton_step(x, y, W[mask], mask, C).norm()) <= 1.01e-9 * size, mask
        alone, _ = bs.svc_weights(x, y, torch.tensor([mask]), C=C, engine="c", max_iter=300)
        assert float((alone[0] - W[mask]).norm()) <= 1e-7 * size, mask


def test_a_part_of_the_lattice_in_any_order_with_repeats():
    """Coalitions asked for in any order, repeated, their parents often absent: each row the weights of its own
    coalition (the full lattice's), the iterations too."""
    _needs_c()
    x, y = _lattice_data(N=1500)
    full, _ = bs.svc_weights(x, y, torch.arange(64), engine="c")
    g = torch.Generator().manual_seed(1)
    index = torch.randint(0, 64, (40,), generator=g)
    W, iters = bs.svc_weights(x, y, index, engine="c")
    assert W.shape == (40, 13) and iters.shape == (40,)
    for r, m in enumerate(index.tolist()):
        assert float((W[r] - full[m]).norm()) <= 1e-7 * max(1.0, float(full[m].norm())), m


def test_the_lattice_solver_reads_any_integer_index():
    """The C solver reads int64 bitmasks: an int32 index (the low-level entry point, which the public functions
    call after their own cast) gives the same weights, not its buffer misread as int64."""
    _needs_c()
    x, labels = _lattice_data(N=300)
    y = torch.where(labels == 1, 1.0, -1.0).double()  # the signs the public functions pass
    want = sn.solve_lattice_native(x, y, torch.arange(64), 1000.0, False, 1e-9, 100)
    got = sn.solve_lattice_native(x, y, torch.arange(64).int(), 1000.0, False, 1e-9, 100)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_test_accuracies_equal_the_torch_solvers_and_one_vs_rest():
    """Binary and three-class problems: the same test accuracy as the torch solver on every coalition (the
    separators agree within 1e-9; no test point lies that close to a boundary here)."""
    _needs_c()
    x, y = _lattice_data(N=1200)
    xt, yt = _lattice_data(N=400)
    for labels, test in ((y, yt), (y + (x[:, 1, 0] > 0.5).long(), yt + (xt[:, 1, 0] > 0.5).long())):
        a = bs.svc_test_accuracy(x, labels, xt, test, torch.arange(64), engine="c")
        b = bs.svc_test_accuracy(x, labels, xt, test, torch.arange(64), engine="torch")
        assert torch.equal(a, b)


def test_a_fit_stopped_by_max_iter_is_reported_like_the_torch_solvers():
    """max_iter = 1: the fits that need more steps come back as max_iter + 1 with a RuntimeWarning, as the torch
    solver reports them."""
    _needs_c()
    x, y = _lattice_data(N=1000)
    with pytest.warns(RuntimeWarning, match=r"did not converge in max_iter=1 Newton steps"):
        _, iters = bs.svc_weights(x, y, torch.arange(64), max_iter=1, engine="c")
    assert int(iters.max()) == 2 and set(iters.tolist()) <= {0, 1, 2}


def test_overflowing_margins_are_an_error_not_a_number():
    """Finite features so large, or so far from centred (an outside trial's case: an offset of 1e8, nearly collinear
    with the intercept), that the Newton steps overflow float64: a clear error naming the likely causes, not
    weights of infinities."""
    _needs_c()
    x, y = _blobs(200, 2, 2, 1.0, 3)
    with pytest.raises(InterpError, match=r"non-finite margins: their Newton steps overflowed float64 at C=1000"):
        bs.svc_weights(x * 1e300, y, torch.arange(4), engine="c")


def test_what_an_outside_trial_broke():
    """max_iter beyond any use (2^63 - 1 looped for ever, in both engines), C or tol infinite (NaN weights and an
    accuracy reported as real), non-integer max_iter, NaN labels, an empty test set (NaN accuracies): clear errors
    before any work. return_iters gives one count per entry of index (it gave one per distinct coalition), and per
    class for one-vs-rest; a strided index gives no torch warning."""
    import warnings

    x, y = _blobs(60, 3, 2, 1.0, 4)
    idx = torch.arange(8)
    for kw, message in (
        ({"max_iter": 2**63 - 1}, "max_iter an integer from 1 to 1,000,000"),
        ({"C": float("inf")}, "C and tol must be finite positive numbers"),
        ({"tol": float("inf")}, "C and tol must be finite positive numbers"),
    ):
        for engine in ("c", "torch"):
            with pytest.raises(InterpError, match=re.escape(message)):
                bs.svc_weights(x, y, idx, engine=engine, **kw)
    import numpy as np

    assert bs._checked(x, y, idx, np.float32(10.0), np.float64(1e-9), np.int64(5))[1].shape == (8,)  # NumPy scalars
    for C, max_iter, message in ((1000.0, 1.5, "max_iter=1.5"), (1000.0, True, "max_iter=True"), ("1", 100, "C='1'")):
        with pytest.raises(InterpError, match=re.escape(message)):  # what every call checks first (the annotations
            bs._checked(x, y, idx, C, 1e-9, max_iter)  # are only enforced by the test run's type checker)
    with pytest.raises(InterpError, match="y_tr holds NaN or infinite labels"):
        bs.svc_weights(x, torch.where(y == 1, 1.0, float("nan")), idx)
    with pytest.raises(InterpError, match="the test set is empty"):
        bs.svc_test_accuracy(x, y, x[:0], y[:0], idx)
    index = torch.tensor([3, 1, 1, 0])
    acc, iters = bs.svc_test_accuracy(x, y, x, y, index, return_iters=True)
    assert acc.shape == iters.shape == (4,) and iters[1] == iters[2]
    _, alone = bs.svc_weights(x, y, index)
    assert torch.equal(iters, alone)
    three = y + (x[:, 0, 0] > 0.5).long()
    acc, iters = bs.svc_test_accuracy(x, three, x, three, index, return_iters=True)
    assert acc.shape == (4,) and iters.shape == (3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bs.svc_weights(x, y, torch.arange(16)[:8:2], engine="c")


def test_unknown_or_unavailable_engines_are_clear_errors(monkeypatch):
    """An unknown engine name, and engine="c" where the C solver is not available (its status stubbed, as on a
    machine without a compiler): a clear error before any work; "auto" then runs the torch solver."""
    x, y = _blobs(200, 2, 2, 1.0, 3)
    with pytest.raises(InterpError, match=re.escape("unknown SVC engine 'C'; expected one of auto, c, torch")):
        bs.svc_weights(x, y, torch.arange(4), engine="C")
    monkeypatch.setattr(bs, "engine_status", lambda: "torch: switched off by the test")
    with pytest.raises(InterpError, match=r"the C SVC solver is not available here \(torch: switched off"):
        bs.svc_test_accuracy(x, y, x, y, torch.arange(4), engine="c")
    called = []
    monkeypatch.setattr(sn, "solve_lattice_native", lambda *a, **k: called.append(1))
    W, _ = bs.svc_weights(x, y, torch.arange(4), engine="auto")
    assert W.shape == (4, 5) and not called


def test_no_compiler_is_a_clear_error(monkeypatch, tmp_path):
    """With no C compiler on the PATH the build says so (and the C solver's status, built on it, falls back)."""
    from interp.native import build

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(OSError, match=r"no C compiler on the PATH \(looked for cc, gcc, clang"):
        build("int f(void) { return 0; }", "probe")
    assert os.environ["PATH"] == str(tmp_path)


def _gone(pid: int) -> bool:
    """The process ``pid`` has exited (absent, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


def test_a_stopped_build_leaves_no_compiler_stage_running(tmp_path):
    """A compiler driver starts stages of its own (cc1, as, ld); a build stopped while they run (here a timeout; a
    SIGTERM or Ctrl-C in the caller goes the same way) kills them all, not only the driver."""
    import subprocess
    import time

    from interp.native import _compile

    pidfile = tmp_path / "stage.pid"
    driver = tmp_path / "cc"
    driver.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pidfile}\nwait\n")
    driver.chmod(0o755)
    with pytest.raises(subprocess.TimeoutExpired):
        _compile([str(driver)], str(tmp_path), timeout=1)
    stage = int(pidfile.read_text())
    deadline = time.time() + 5
    while not _gone(stage) and time.time() < deadline:
        time.sleep(0.05)
    assert _gone(stage), "the driver's own stage is still running"
    assert _compile(["true"], str(tmp_path)) == (0, "")
