"""The C attention of the per-position forward (interp/attention_native.py) against independent computations: a
float64 reference of causal softmax attention (masked scores, softmax, weighted sum; autograd for the gradients) and
torch's float32 products, on one query of 8 heads, the benchmark's 2 queries of 16 heads at d_model 32, 64 rows and
an odd d_model; the kernel compiled inside ``torch.compile``; and populations trained through it against the same
populations trained by torch's products and against each model trained alone."""

from __future__ import annotations

import inspect
import os
from dataclasses import replace

import pytest
import torch

import interp.population_paths as pp
from interp import attention_native as an
from interp.errors import InterpError
from interp.population import seed_population, train_population

# Tolerances (measured, not widened): the kernel sums in another order than torch's products and its exp is within 2
# ulp of expf, so its results agree with float64 to float32 rounding. Largest gap over the shapes below, as a share
# of the largest entry: 1.5e-6 against float64 (torch's float32 products: 1.4e-6).
RTOL = 1e-5


def _needs_c():
    """Skip where the kernel does not build here, or fail where INTERP_REQUIRE_C=1 (as CI sets it), so these tests
    cannot pass by skipping."""
    why = an.shape_status(8, 8, 2)
    if why != "c":
        if os.environ.get("INTERP_REQUIRE_C") == "1":
            pytest.fail(f"the C attention is not used here ({why}), but INTERP_REQUIRE_C=1 requires it")
        pytest.skip(f"the C attention is not used here: {why}")


SHAPES = {  # rows = queries x heads, d_model
    "1 query of 8 heads, d8": (8, 8, 1),
    "2 queries of 16 heads, d32": (32, 32, 2),
    "4 queries of 16 heads, d16 (64 rows)": (64, 16, 4),
    "2 queries of 4 heads, d24": (8, 24, 2),
}


def _problem(R, D, KQ, n, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, R, D, generator=g) * 0.5
    x = torch.randn(n, T, D, generator=g)
    qpos = torch.randint(0, T, (n, KQ), generator=g)
    qpos[0] = 0  # one key only
    qpos[-1] = T - 1  # every key
    return u, x, qpos, torch.randn(n, R, D, generator=g)


def _results(fn, u, x, qpos, gy, dtype):
    leaves = [v.to(dtype).clone().requires_grad_() for v in (u, x)]
    y = fn(*leaves, qpos)
    y.backward(gy.to(dtype))
    return [y.detach().double(), leaves[0].grad.double(), leaves[1].grad.double()]


@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_kernel_equals_a_float64_reference(shape, T):
    """The weighted inputs and the gradients of ``u`` and ``x`` for a random upstream gradient, every row seeing its
    own keys (one, some, all), against float64 and against torch's float32 products."""
    _needs_c()
    R, D, KQ = SHAPES[shape]
    u, x, qpos, gy = _problem(R, D, KQ, n=9, T=T)
    ours = _results(an.weighted_inputs, u, x, qpos, gy, torch.float32)
    exact = _results(an._reference, u, x, qpos, gy, torch.float64)
    torch32 = _results(an._reference, u, x, qpos, gy, torch.float32)
    for name, a, b, c in zip(("y", "grad u", "grad x"), ours, exact, torch32):
        scale = b.abs().max().clamp_min(1e-30)  # one key: the gradient of u is exactly zero
        assert float((a - b).abs().max() / scale) <= RTOL, name
        assert float((a - c).abs().max() / scale) <= RTOL, name


def test_a_row_sees_no_key_past_its_query():
    """Changing the inputs at positions after every query changes neither the result nor the gradient of what
    the queries see; the gradient there is exactly zero."""
    _needs_c()
    u, x, qpos, gy = _problem(32, 32, 2, n=4, T=20)
    qpos = torch.tensor([[3, 5], [0, 9], [10, 10], [2, 11]])
    first = _results(an.weighted_inputs, u, x, qpos, gy, torch.float32)
    x2 = x.clone()
    x2[:, 12:] = 1e3
    second = _results(an.weighted_inputs, u, x2, qpos, gy, torch.float32)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert torch.equal(first[2][:, :12], second[2][:, :12]) and not first[2][:, 12:].any()
    assert not first[2][2, 11:].any()  # sentence 2 sees positions 0..10 only
    x3 = x.clone()
    x3[:, 12:] = float("nan")  # never read (torch's masked product would give 0 x NaN = NaN)
    third = _results(an.weighted_inputs, u, x3, qpos, gy, torch.float32)
    assert all(
        torch.equal(a[:, :12] if i == 2 else a, b[:, :12] if i == 2 else b)
        for i, (a, b) in enumerate(zip(first, third))
    )


def test_the_kernel_refuses_what_it_cannot_read():
    u, x, qpos = torch.randn(2, 8, 8), torch.randn(2, 5, 8), torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(InterpError, match=r"must lie in 0\.\.4"):
        an.weighted_inputs(u, x, qpos + 5)
    with pytest.raises(InterpError, match=r"must lie in 0\.\.4"):
        an.weighted_inputs(u, x, qpos - 1)
    with pytest.raises(InterpError, match="float32 CPU tensor"):
        an.weighted_inputs(u.double(), x, qpos)
    with pytest.raises(InterpError, match="int64"):
        an.weighted_inputs(u, x, qpos.int())
    with pytest.raises(InterpError, match="multiples of 8"):
        an.weighted_inputs(torch.randn(2, 6, 8), x, qpos)
    with pytest.raises(InterpError, match="disagree"):  # the op itself (the annotations catch these in tests)
        an._weighted(u, torch.randn(3, 5, 8), qpos)
    with pytest.raises(InterpError, match=r"u \[n, rows, d_model\]"):
        an._weighted(u[0], x, qpos)
    with pytest.raises(InterpError, match="at least one position"):
        an.weighted_inputs(u, x[:, :0], qpos)
    y, P = an._attend(u.requires_grad_(), x, qpos)
    assert y.requires_grad and not P.requires_grad  # the kept pattern is not a differentiable result
    assert not an.usable(8, 8, 2, "meta", torch.float32) and not an.usable(8, 8, 2, "cpu", torch.float64)
    assert not an.usable(2, 8, 2, "cpu", torch.float32) and not an.usable(128, 8, 2, "cpu", torch.float32)


def test_the_backward_op_refuses_what_it_cannot_read():
    """``interp::attend_backward`` is a public op: called directly with a pattern or gradient of another shape or
    dtype, or inputs the forward refuses, it names the problem (C would read past them or misread them)."""
    u, x, qpos = torch.randn(2, 16, 8), torch.randn(2, 5, 8), torch.zeros(2, 4, dtype=torch.long)
    gy = torch.randn(2, 16, 8)
    _, P = torch.ops.interp.attend(u, x, qpos)
    with pytest.raises(InterpError, match=r"takes P as a float32 CPU tensor of shape \[2, 5, 16\]"):
        torch.ops.interp.attend_backward(u, x, qpos, P[:1], gy)
    with pytest.raises(InterpError, match="takes gy as a float32 CPU tensor"):
        torch.ops.interp.attend_backward(u, x, qpos, P, gy.double())
    with pytest.raises(InterpError, match="int64"):
        torch.ops.interp.attend_backward(u, x, qpos.int(), P, gy)
    with pytest.raises(InterpError, match="multiples of 8"):
        torch.ops.interp.attend_backward(u[:, :12], x, qpos, P[..., :12], gy[:, :12])


def test_the_ops_pass_torchs_own_checks_on_any_layout():
    """``torch.library.opcheck`` (schema, fake implementations against the real ones, autograd registration) on
    contiguous and on transposed inputs: the fake implementations give the kernel's contiguous outputs."""
    _needs_c()
    u, x, qpos, gy = _problem(16, 8, 4, n=3, T=6)
    _, P = torch.ops.interp.attend(u, x, qpos)
    ut = u.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, strided
    for args in ((u, x, qpos), (ut, x, qpos)):
        torch.library.opcheck(torch.ops.interp.attend.default, args)
    for uu in (u, ut):
        torch.library.opcheck(torch.ops.interp.attend_backward.default, (uu, x, qpos, P, gy))


def test_compiled_code_with_a_strided_input_equals_it_eager():
    """Inductor lays its buffers out by the fake implementations: with ``u`` transposed inside the graph, the
    compiled gradients equal the eager ones (the backward's fake once kept ``u``'s strides, and inductor failed).
    Compiled afresh: torch's compile caches do not key on an op's fake implementation, so one compiled before the
    fix would still hold the old layout."""
    _needs_c()
    base, x, qpos, _ = _problem(8, 16, 4, n=2, T=5)  # base [n, 8, 16]: u = its transpose, [n, 16 rows, d_model 8]
    x = x[..., :8].contiguous()

    def f(b, x, qpos):
        return (inspect.unwrap(an.weighted_inputs)(b.transpose(1, 2) * 1.0, x, qpos) * torch.arange(8)).sum()

    got = [v.clone().requires_grad_() for v in (base, x)]
    want = [v.clone().requires_grad_() for v in (base, x)]
    with torch._inductor.config.patch(force_disable_caches=True):
        torch.compile(f, backend="inductor", fullgraph=True)(*got, qpos).backward()
    f(*want, qpos).backward()
    for a, b in zip(got, want):
        torch.testing.assert_close(a.grad, b.grad, rtol=RTOL, atol=RTOL * float(b.grad.abs().max()))


def test_the_kernel_inside_compiled_code_equals_it_eager():
    """``torch.compile`` (dynamic shapes, two widths) runs the kernel as one opaque op with its backward."""
    _needs_c()

    def f(u, x, qpos):
        return (inspect.unwrap(an.weighted_inputs)(u * 2, x.tanh(), qpos) ** 2).sum()

    compiled = torch.compile(f, dynamic=True)
    for T in (11, 17):
        u, x, qpos, _ = _problem(32, 32, 2, n=5, T=T, seed=T)
        got = [v.clone().requires_grad_() for v in (u, x)]
        want = [v.clone().requires_grad_() for v in (u, x)]
        compiled(*got, qpos).backward()
        f(*want, qpos).backward()
        for a, b in zip(got, want):
            torch.testing.assert_close(a.grad, b.grad, rtol=RTOL, atol=RTOL * float(b.grad.abs().max()))


def _train(tmp_path, name, task, spec, cfg, seeds, native, monkeypatch, compile=False):
    """A population trained with the kernel on or off; returns its output files and how many times the kernel ran
    (counted by a spy where eager; where compiled, the op's calls as torch's profiler records them: a spy inside
    compiled code would be traced and its counter guarded, recompiling the step at each call)."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setattr(pp, "NATIVE_ATTENTION", native)
    specs, cfgs = seed_population(task, spec, cfg, seeds)
    outs = [tmp_path / f"{name}{s}.safetensors" for s in seeds]
    if compile:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train_population(task, specs, cfgs, outs, device="cpu", progress=False, compile=True)
        return outs, sum(e.count for e in prof.key_averages() if e.key == "interp::attend")
    calls = []
    real = inspect.unwrap(an.weighted_inputs)

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(an, "weighted_inputs", counted)
    train_population(task, specs, cfgs, outs, device="cpu", progress=False)
    return outs, len(calls)


def _close(a_files, b_files, atol):
    from safetensors.torch import load_file

    for a, b in zip(a_files, b_files):
        wa, wb = load_file(a), load_file(b)
        for n in wa:
            if wa[n].is_floating_point():
                torch.testing.assert_close(wa[n], wb[n], atol=atol, rtol=0, msg=n)


@pytest.mark.parametrize(
    "spec_kw, cfg_kw",
    [
        (dict(), dict(dropout_rng="torch")),
        (dict(), dict(dropout_rng="counter")),
        (dict(d_model=32, n_heads=16, attn_bias=True), dict(dropout_rng="torch")),
    ],
    ids=["4 heads, torch masks", "4 heads, counter masks", "16 heads, d32, attention biases"],
)
def test_a_population_through_the_kernel_equals_torchs_products_and_its_solo_runs(
    tmp_path, tiny_spec, tiny_cfg, spec_kw, cfg_kw, monkeypatch
):
    """Dropout on the embedding (the per-position forward): the population trained through the kernel equals the
    one trained by torch's products (weights within the population tests' WEIGHT_ATOL after 2 epochs) and each
    model's solo run (:func:`tests.test_population._population_equals_solo`), and the kernel ran."""
    from tests.test_population import WEIGHT_ATOL, _population_equals_solo, _short_task

    _needs_c()
    task, spec = _short_task(), replace(tiny_spec, **spec_kw)
    cfg = tiny_cfg(epochs=2, batch_size=12, dropout_at="embedding+attention", **cfg_kw)
    ours, n = _train(tmp_path, "c", task, spec, cfg, [0, 1], True, monkeypatch)
    theirs, none = _train(tmp_path, "t", task, spec, cfg, [0, 1], False, monkeypatch)
    assert n > 0 and none == 0
    _close(ours, theirs, WEIGHT_ATOL)
    monkeypatch.setattr(pp, "NATIVE_ATTENTION", True)
    _population_equals_solo(tmp_path, task, spec, cfg, [0, 1])


def test_a_compiled_population_through_the_kernel_equals_the_eager_one(tmp_path, tiny_spec, tiny_cfg, monkeypatch):
    """``compile=True``: the compiled per-position step calls the kernel as an opaque op, and trains as the eager
    step does."""
    from tests.test_population import WEIGHT_ATOL, _short_task

    _needs_c()
    cfg = tiny_cfg(epochs=2, batch_size=12, dropout_at="embedding+attention", dropout_rng="counter")
    task = _short_task()
    compiled, n = _train(tmp_path, "c", task, tiny_spec, cfg, [0, 1], True, monkeypatch, compile=True)
    eager, m = _train(tmp_path, "e", task, tiny_spec, cfg, [0, 1], True, monkeypatch)
    assert n > 0 and m > 0
    _close(compiled, eager, WEIGHT_ATOL)


@pytest.mark.parametrize(
    "spec_kw, cfg_kw",
    [
        (dict(d_model=2, n_heads=1, d_head=2, output_matrix="identity"), dict()),  # 2 rows
        (dict(n_heads=64, output_matrix="learned"), dict()),  # 128 rows
        (dict(), dict(dropout_at="attention+pattern")),  # dropout on the pattern: torch's softmax
        (dict(), dict(padding="left")),  # left pads are keys
        (dict(), dict(objective="lm")),  # every position a query
    ],
    ids=["1 head", "64 heads, trained W_O", "pattern dropout", "left padding", "lm objective"],
)
def test_what_the_kernel_does_not_take_trains_by_torchs_products(
    tmp_path, tiny_spec, tiny_cfg, spec_kw, cfg_kw, monkeypatch
):
    """Shapes the kernel does not take and options it does not express go through torch's products, without a
    call to the kernel, and equal a population with the kernel switched off bit for bit."""
    from safetensors.torch import load_file

    from tests.test_population import _short_task

    task, spec = _short_task(), replace(tiny_spec, **spec_kw)
    kw = {"dropout_at": "embedding+attention", **cfg_kw}
    cfg = tiny_cfg(epochs=1, batch_size=12, **kw)
    ours, n = _train(tmp_path, "c", task, spec, cfg, [0, 1], True, monkeypatch)
    theirs, _ = _train(tmp_path, "t", task, spec, cfg, [0, 1], False, monkeypatch)
    assert n == 0
    for a, b in zip(ours, theirs):
        wa, wb = load_file(a), load_file(b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_shape_whose_kernel_does_not_build_trains_by_torchs_products(
    tmp_path, tiny_spec, tiny_cfg, monkeypatch, refusing_compilers
):
    """Each shape is its own build, checked before its first use (``shape_status``): where the compiler refuses
    this shape's source (d_model 16 alone), the population warns once, trains by torch's products and equals a
    population with the kernel off bit for bit; another shape still builds through the same PATH."""
    from safetensors.torch import load_file

    from tests.test_population import _short_task

    _needs_c()
    an.shape_status.cache_clear()  # built earlier in this session through the real compiler
    an.library.cache_clear()
    refusing_compilers("#define D 16")
    spec = replace(tiny_spec, d_model=16, n_heads=4, d_head=2, output_matrix="learned")
    cfg = tiny_cfg(epochs=1, batch_size=12, dropout_at="embedding+attention")
    task = _short_task()
    try:
        with pytest.warns(RuntimeWarning, match="attention by torch's products"):
            ours, n = _train(tmp_path, "c", task, spec, cfg, [0, 1], True, monkeypatch)
        assert n == 0 and an.shape_status(8, 16, 2) != "c"
        assert an.shape_status(8, 40, 2) == "c"
    finally:
        an.shape_status.cache_clear()  # later tests build d_model 16 through the real compiler
        an.library.cache_clear()
    theirs, _ = _train(tmp_path, "t", task, spec, cfg, [0, 1], False, monkeypatch)
    for a, b in zip(ours, theirs):
        wa, wb = load_file(a), load_file(b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
