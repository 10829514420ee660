"""The cache of compiled steps (``interp.compiled``): a process that compiles one step for many shapes keeps
compiling it, instead of silently running the plain function past torch's default limit of 8 graphs."""

from __future__ import annotations

import shutil
import types

import pytest
import torch


def fresh_code(fn):
    """``fn`` with its own code object: torch.compile keeps its graphs (and its recompile count) per code object, so
    a copy starts with none, whatever the process compiled before."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def graphs() -> int:
    """Graphs torch.compile has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _scaled_sum(x):
    return (x * 2).sin().sum(-1)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("g++"), reason="torch.compile on the CPU needs a C++ compiler")
def test_a_compiled_step_keeps_compiling_past_torchs_default_limit():
    """Twelve shapes through one cached compiled function: twelve graphs (torch's default stops at 8 and runs the
    rest plain), each equal to the plain function."""
    from interp.compiled import RECOMPILE_LIMIT, compiled_step

    fn = fresh_code(_scaled_sum)
    step = compiled_step(fn, dynamic=False, device="cpu")
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT
    before = graphs()
    for n in range(1, 13):
        x = torch.linspace(-1, 1, 3 * n).view(3, n)
        torch.testing.assert_close(step(x), _scaled_sum(x), rtol=1e-6, atol=1e-6)
    assert graphs() - before == 12


def test_the_limit_is_raised_never_lowered():
    """A limit the user raised further stays; the default is raised to RECOMPILE_LIMIT (no compilation runs here:
    ``torch.compile`` only wraps)."""
    import torch._dynamo

    from interp.compiled import RECOMPILE_LIMIT, _compiled

    cfg = torch._dynamo.config
    with cfg.patch(recompile_limit=8):
        _compiled(fresh_code(_scaled_sum), False)
        assert cfg.recompile_limit == RECOMPILE_LIMIT
    with cfg.patch(recompile_limit=500):
        _compiled(fresh_code(_scaled_sum), False)
        assert cfg.recompile_limit == 500


@pytest.mark.skipif(not shutil.which("g++"), reason="torch.compile on the CPU needs a C++ compiler")
def test_counter_masks_compile_once_for_every_dropout_rate():
    """A new dropout rate compiles no new graph of the counter masks' multiplier (the scale ``1 / (1 - p)`` is a
    float argument, which this torch traces as a symbol instead of specialising on it:
    ``torch._dynamo.config.specialize_float`` is False), and the masks equal the plain function's bit for bit."""
    from interp.dropout_masks import _keep_mask, _mask

    h = torch.arange(5 * 3 * 4 * 7, dtype=torch.int64).view(5, 3, 4, 7) * 7919
    _mask(h, 0.3)  # compiles (or finds) the graph for masks of this rank
    before = graphs()
    for p in (0.1, 0.25, 0.5):
        got = _mask(h + 11, p)
        assert torch.equal(got, _keep_mask(h + 11, round(p * (1 << 24)), 1.0 / (1.0 - p))), p
        assert set(got.unique().tolist()) <= {0.0, torch.tensor(1.0 / (1.0 - p)).item()}
    assert graphs() == before
    # the unit axis formed inside the compiled loop (what position masks use): the same hash inputs, bit for bit
    base = h[..., 0] * 1024
    _mask(base, 0.3, 16)
    before = graphs()
    for p, units in ((0.1, 16), (0.5, 32), (0.25, 3)):
        got = _mask(base + 11, p, units)
        want = _keep_mask(base[..., None] + 11 + torch.arange(units), round(p * (1 << 24)), 1.0 / (1.0 - p))
        assert got.shape == (*base.shape, units) and torch.equal(got, want), (p, units)
    assert graphs() == before


def _embedded_sum(P, tokens, mask):
    return (P["W_E"][tokens] * mask[..., None]).sum((1, 2, 3))  # [K]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("g++"), reason="torch.compile on the CPU needs a C++ compiler")
def test_a_dynamic_step_compiles_once_for_views_of_every_width_and_offset():
    """A ``dynamic=True`` step called, as the per-position step is, with views cut out of a bigger batch (rows
    ``start:stop``, positions ``:w``: new strides and storage offsets every call) whose sizes sometimes coincide (a
    width equal to the number of models): one graph for twelve calls, each equal to the plain function. Plain
    ``torch.compile(dynamic=True)`` compiles 3 graphs for these calls, and in a population a graph for nearly
    every new combination, seconds each (a 3-epoch population of two tiny models: 610 s against ~1 s eager)."""
    from interp.compiled import compiled_step

    fn = fresh_code(_embedded_sum)
    step = compiled_step(fn, dynamic=True, device="cpu", cut_views=True)
    g = torch.Generator().manual_seed(0)
    # the parameters as views at an offset into one flat buffer, as a population's are (float64: sums in another
    # order agree to 1e-12)
    flat = torch.randn(50, generator=g, dtype=torch.float64)
    P = {"W_E": flat[7:40].view(11, 3)}
    tokens = torch.randint(0, 11, (4, 40, 24), generator=g)
    mask = torch.rand(4, 40, 24, generator=g, dtype=torch.float64)
    before = graphs()
    for start, stop, w in [
        (0, 5, 9),
        (5, 9, 4),
        (9, 20, 13),
        (20, 24, 4),
        (24, 31, 7),
        (31, 40, 24),
        (3, 7, 4),
        (0, 40, 11),
        (12, 14, 2),
        (14, 17, 3),
        (17, 23, 6),
        (2, 6, 4),
    ]:
        args = tokens[:, start:stop, :w], mask[:, start:stop, :w]
        torch.testing.assert_close(step(P, *args), _embedded_sum(P, *args), rtol=1e-12, atol=1e-10)
    assert graphs() - before == 1
