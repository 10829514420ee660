"""The C token-count step (interp/count_native.py) against independent computations: the population's torch step
(the weights form, :func:`interp.population._count_losses`, autograd for the gradients; its tables,
:func:`interp.population._native_tables`, for the C tables) and a float64 reference of the same arithmetic, on
one head, 16 and 64 heads, identity and learned W_O, with and without dropout's mask, with upstream gradients
other than 1; and a population trained through it against the same population trained by the
torch step, and against each model trained alone."""

from __future__ import annotations

import functools
import os
from dataclasses import replace

import pytest
import torch

import interp.population as ip
from interp import count_native as cn
from interp.errors import InterpError
from interp.population import seed_population, train_population

# Tolerances (measured, not widened): the kernel sums each row and each gradient in another order than torch's
# products, so losses and gradients agree to float32 rounding. Largest gap over the shapes below, as a share of the
# largest entry (measured with the tables in C and in torch): 1.6e-6 against the torch step, 2.4e-6 against float64;
# the C tables alone 4.5e-7 against the torch tables and 8.2e-7 against float64.
RTOL = 1e-5


def _needs_c():
    """Skip where the kernel is not used (the torch step runs there), or fail where INTERP_REQUIRE_C=1 (as CI sets
    it), so these tests cannot pass by skipping."""
    if cn.status() != "c":
        if os.environ.get("INTERP_REQUIRE_C") == "1":
            pytest.fail(f"the C token-count step is not used here ({cn.status()}), but INTERP_REQUIRE_C=1 requires it")
        pytest.skip(f"the C token-count step is not used here: {cn.status()}")


def test_the_kernel_is_what_runs_here():
    """On this project's machines the kernel builds and passes its self-check, so populations train through it."""
    _needs_c()
    assert cn.status() == "c"


SHAPES = {
    "1 head, d32, learned W_O": dict(K=3, H=1, e=2, d=32, Vo=8, identity=False),
    "16 heads, d32, identity W_O": dict(K=2, H=16, e=2, d=32, Vo=8, identity=True),
    "64 heads, d8, learned W_O": dict(K=2, H=64, e=2, d=8, Vo=8, identity=False),
    "4 heads of 4, d16, 16 outputs, K=1": dict(K=1, H=4, e=4, d=16, Vo=16, identity=True),
}


def _problem(K, H, e, d, Vo, identity, with_mask, b=37, k=2, V=9):
    """Random stacked parameters of K one-layer attention-only models (no LayerNorm) and random token-count rows."""
    g = torch.Generator().manual_seed(H * 100 + d)
    P = {
        "embed.W_E": torch.randn(K, V, d, generator=g),
        "blocks.0.attn.W_Q": torch.randn(K, H, d, e, generator=g) * 0.3,
        "blocks.0.attn.W_K": torch.randn(K, H, d, e, generator=g) * 0.3,
        "blocks.0.attn.W_V": torch.randn(K, H, d, e, generator=g),
        "blocks.0.attn.b_Q": torch.randn(K, H, e, generator=g),
        "blocks.0.attn.b_K": torch.randn(K, H, e, generator=g),
        "blocks.0.attn.b_V": torch.randn(K, H, e, generator=g),
        "blocks.0.attn.W_O": torch.randn(K, H, e, d, generator=g) * 0.3,
        "blocks.0.attn.b_O": torch.randn(K, d, generator=g),
        "unembed.W_U": torch.randn(K, d, Vo, generator=g) * 0.5,
        "unembed.b_U": torch.randn(K, Vo, generator=g),
    }
    present = torch.tensor([0, 2, 3, 5, 6, 8])
    queries = torch.tensor([2, 3, 5])
    counts = torch.randint(0, 6, (K, b, k, len(present)), generator=g).float()
    counts[..., 0] = 1.0  # a token counted at every query (a BOS)
    always = torch.zeros(len(present), dtype=torch.bool)
    always[0] = True
    rows = dict(
        query_idx=torch.randint(0, len(queries), (K, b, k), generator=g),
        counts=counts,
        out_mask=(torch.rand(K, b, k, d, generator=g) > 0.2).float() / 0.8 if with_mask else None,
        targets=torch.randint(0, Vo, (K, b, k), generator=g),
    )
    up = torch.rand(K, generator=g) + 0.5  # each model's upstream gradient
    return P, queries, present, always, rows, up


def _torch_step(P, queries, present, always, rows, identity):
    losses, exact = ip._count_losses(
        P,
        rows["query_idx"],
        rows["counts"],
        queries,
        present,
        1.0,
        rows["out_mask"],
        rows["targets"],
        identity_w_o=identity,
        always=always,
    )
    assert bool(exact)
    return losses


def _native_step(P, queries, present, always, rows, identity, c_tables=False):
    if c_tables:
        tables = [P[n] for n in ip.TABLE_PARAMETERS]
        table, TE, exact = cn.count_tables_native(*tables, queries, present, always, 1.0, ip.WEIGHT_GAP)
    else:
        table, TE, exact = ip._native_tables(P, queries, present, 1.0, ip.NO_NORM, "softmax", always)
    assert bool(exact)
    K, H, d = P["blocks.0.attn.W_Q"].shape[:3]
    mask = rows["out_mask"]
    return cn.count_losses_native(
        table,
        None if identity else P["blocks.0.attn.W_O"].reshape(K, -1, d),
        P["blocks.0.attn.b_O"],
        TE,
        P["unembed.W_U"],
        P["unembed.b_U"],
        rows["query_idx"].reshape(K, -1),
        rows["counts"].reshape(K, -1, rows["counts"].shape[-1]),
        None if mask is None else mask.reshape(K, -1, d),
        rows["targets"].reshape(K, -1),
        H,
    )


def _losses_and_grads(step, P, *args, up, dtype=torch.float32):
    leaves = {n: v.to(dtype).clone().requires_grad_() for n, v in P.items()}
    queries, present, always, rows, identity = args
    rows = {n: (v.to(dtype) if v is not None and v.is_floating_point() else v) for n, v in rows.items()}
    losses = step(leaves, queries, present, always, rows, identity)
    (losses * up.to(dtype)).sum().backward()
    grads = {n: torch.zeros_like(v) if v.grad is None else v.grad for n, v in leaves.items()}
    return losses.detach().double(), {n: g.double() for n, g in grads.items()}


def _assert_close(got, want, what):
    scale = want.abs().max().clamp_min(1e-30)
    gap = float((got - want).abs().max() / scale)
    assert gap <= RTOL, f"{what}: {gap:.2e} of the largest entry apart"


@pytest.mark.parametrize("tables", ["torch", "C"], ids=["tables in torch", "tables in C"])
@pytest.mark.parametrize("with_mask", [True, False], ids=["dropout mask", "no mask"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_the_kernel_equals_the_torch_step_and_a_float64_reference(shape, with_mask, tables):
    """The rows in C, with the tables in torch (additive pooling's path) or in C too (softmax pooling's): losses
    and every parameter's gradient against the torch step and float64."""
    _needs_c()
    identity = shape["identity"]
    P, queries, present, always, rows, up = _problem(**shape, with_mask=with_mask)
    if identity:  # an identity W_O is no parameter: H x d_head = d_model columns taken as they are
        P.pop("blocks.0.attn.W_O")
    args = (queries, present, always, rows, identity)
    step = functools.partial(_native_step, c_tables=tables == "C")
    ours = _losses_and_grads(step, P, *args, up=up)
    theirs = _losses_and_grads(_torch_step, P, *args, up=up)
    exact = _losses_and_grads(_torch_step, P, *args, up=up, dtype=torch.float64)
    _assert_close(ours[0], theirs[0], "losses against the torch step")
    _assert_close(ours[0], exact[0], "losses against float64")
    for n in P:
        if n == "blocks.0.attn.b_K":  # no gradient: a key bias moves every score of a query alike
            assert ours[1][n].abs().max() <= 1e-5 * ours[1]["blocks.0.attn.b_Q"].abs().max()
            continue
        _assert_close(ours[1][n], theirs[1][n], f"{n}'s gradient against the torch step")
        _assert_close(ours[1][n], exact[1][n], f"{n}'s gradient against float64")


def test_the_kernel_refuses_what_it_cannot_read():
    """Wrong dtypes, shapes, devices and indices are clear errors, never a read outside a buffer."""
    _needs_c()
    P, queries, present, always, rows, _ = _problem(K=2, H=1, e=2, d=8, Vo=8, identity=False, with_mask=True)
    table, TE, _ = ip._native_tables(P, queries, present, 1.0, ip.NO_NORM, "softmax", always)
    K, d = 2, 8
    base = dict(
        table=table,
        W_O=P["blocks.0.attn.W_O"].reshape(K, -1, d),
        b_O=P["blocks.0.attn.b_O"],
        TE=TE,
        W_U=P["unembed.W_U"],
        b_U=P["unembed.b_U"],
        query_idx=rows["query_idx"].reshape(K, -1),
        counts=rows["counts"].reshape(K, -1, rows["counts"].shape[-1]),
        mask=rows["out_mask"].reshape(K, -1, d),
        targets=rows["targets"].reshape(K, -1),
        n_heads=1,
    )
    cn.count_losses_native(**base)  # as given: fine
    with pytest.raises(InterpError, match="float32 CPU tensor"):  # through the kernel's entry point
        cn.count_losses_native(**{**base, "table": table.double()})
    bad = {  # the check the entry point runs first (the test run's shape checker would refuse some of these sooner)
        "a query place past the queries": dict(query_idx=base["query_idx"] + 3),
        "a target past the vocabulary": dict(targets=base["targets"] + 8),
        "int32 targets": dict(targets=base["targets"].int()),
        "a mask of another width": dict(mask=base["mask"][..., :4]),
        "W_O of another shape": dict(W_O=base["W_O"][:, :1]),
        "a head count that does not divide the table": dict(n_heads=2),
        "counts as float64": dict(counts=base["counts"].double()),
    }
    for what, change in bad.items():
        with pytest.raises(InterpError):
            cn._check(**{**base, **change})
            pytest.fail(f"{what} was taken")
    with pytest.raises(InterpError, match="n_heads"):  # not a division by zero
        cn.count_losses_native(**{**base, "n_heads": 0})
    for what, change in {"2-D counts": dict(counts=base["counts"][0]), "2-D TE": dict(TE=TE[0])}.items():
        with pytest.raises(InterpError, match="dimensions"):
            cn._check(**{**base, **change})
            pytest.fail(f"{what} was taken")
    with pytest.raises(InterpError, match="at least one model"):
        cn._check(**{**base, **{n: v[:0] for n, v in base.items() if isinstance(v, torch.Tensor)}})
    with pytest.raises(InterpError, match="multiples of 8"):
        cn._check(
            torch.rand(1, 3, 3),
            None,
            torch.rand(1, 2),
            torch.rand(1, 1, 8),
            torch.rand(1, 2, 8),
            torch.rand(1, 8),
            torch.zeros(1, 1, dtype=torch.long),
            torch.ones(1, 1, 1),
            None,
            torch.zeros(1, 1, dtype=torch.long),
            1,
        )


def _flat_layout(P):
    """``P``'s table parameters laid out as a population's flat buffer keeps them: model k's numbers in one row of a
    ``[K, T]`` buffer (a model stride wider than one tensor), W_Q, W_K and W_V stored ``[d_model][head][d_head]``,
    W_U ``[vocab_out][d_model]`` (:data:`interp.count_native.TABLE_LAYOUTS`), as views of one buffer."""
    tensors = [P[n] for n in ip.TABLE_PARAMETERS]
    K = tensors[0].shape[0]
    stored = [x.permute(0, *(o + 1 for o in order)) for x, order in zip(tensors, cn.TABLE_LAYOUTS)]
    flat = torch.cat([x.reshape(K, -1) for x in stored], 1)
    out, at = {}, 0
    for n, x, order in zip(ip.TABLE_PARAMETERS, stored, cn.TABLE_LAYOUTS):
        view = flat[:, at : at + x[0].numel()].view(x.shape)
        out[n] = view.permute(0, *(order.index(j) + 1 for j in range(len(order))))
        at += x[0].numel()
    return out


@pytest.mark.parametrize("layout", ["row-major", "flat buffer"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_the_c_tables_equal_the_torch_tables_and_a_float64_reference(shape, layout):
    """:func:`count_tables_native` against the population's torch tables (:func:`interp.population._native_tables`,
    autograd for the gradients) in float32 and float64: the table, TE, the exactness flag, and every table
    parameter's gradient for random upstream gradients of the table and TE; with the parameters row-major (copied
    into the kernel's layout) and as views of a flat buffer (read in place)."""
    _needs_c()
    P, queries, present, always, _, _ = _problem(**shape, with_mask=False)
    P = {n: P[n] for n in ip.TABLE_PARAMETERS}
    g = torch.Generator().manual_seed(5)
    K, H, _, e = P["blocks.0.attn.W_Q"].shape
    g_table = torch.randn(K, len(queries) * len(present), H * e + H, generator=g)
    g_TE = torch.randn(K, len(queries), P["unembed.W_U"].shape[-1], generator=g)

    def run(fn, dtype, flat=False):
        leaves = {n: v.to(dtype).clone().requires_grad_() for n, v in P.items()}
        used = {**leaves, **_flat_layout(leaves)} if flat else leaves  # views of the leaves: gradients reach them
        table, TE, exact = fn(used)
        ((table * g_table.to(dtype)).sum() + (TE * g_TE.to(dtype)).sum()).backward()
        return [table.detach().double(), TE.detach().double(), *(v.grad.double() for v in leaves.values())], bool(exact)

    def c_tables(used):
        return cn.count_tables_native(
            *(used[n] for n in ip.TABLE_PARAMETERS), queries, present, always, 2**0.5, ip.WEIGHT_GAP
        )

    def torch_tables(used):
        return ip._native_tables(used, queries, present, 2**0.5, ip.NO_NORM, "softmax", always)

    ours, ours_exact = run(c_tables, torch.float32, flat=layout == "flat buffer")
    theirs, theirs_exact = run(torch_tables, torch.float32)
    exact, exact_exact = run(torch_tables, torch.float64)
    assert ours_exact == theirs_exact == exact_exact
    for n, a, b, c in zip(("table", "TE", *P), ours, theirs, exact):
        _assert_close(a, b, f"{n} against the torch tables")
        _assert_close(a, c, f"{n} against float64")


def test_the_c_tables_exactness_flag_is_weights_are_exact():
    """The flag the C tables return is :func:`interp.population.weights_are_exact`'s condition: over scales of the
    query and key weights that push some head's best counted score more than WEIGHT_GAP below its best, both say
    the same, and both outcomes occur."""
    _needs_c()
    P, queries, present, always, _, _ = _problem(K=2, H=4, e=2, d=8, Vo=8, identity=False, with_mask=False)
    seen = set()
    for scale in (0.1, 1.0, 3.0, 6.0, 10.0, 20.0):
        Q = {
            **P,
            "blocks.0.attn.W_Q": P["blocks.0.attn.W_Q"] * scale,
            "blocks.0.attn.W_K": P["blocks.0.attn.W_K"] * scale,
        }
        tables = [Q[n] for n in ip.TABLE_PARAMETERS]
        _, _, exact = cn.count_tables_native(*tables, queries, present, always, 1.0, ip.WEIGHT_GAP)
        assert exact == ip.weights_are_exact(Q, queries, present, always, 1.0), scale
        seen.add(exact)
    assert seen == {True, False}


def test_the_c_tables_refuse_what_they_cannot_read():
    """Wrong dtypes, shapes, devices and token ids are clear errors before the kernel reads any memory."""
    _needs_c()
    P, queries, present, always, _, _ = _problem(K=2, H=2, e=2, d=8, Vo=8, identity=False, with_mask=False)
    base = dict(zip(("W_E", "W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_U"), (P[n] for n in ip.TABLE_PARAMETERS)))
    base.update(queries=queries, present=present, always=always, attn_scale=1.0, gap=ip.WEIGHT_GAP)
    cn.count_tables_native(**base)  # as given: fine
    bad = {
        "float64 W_K": (dict(W_K=base["W_K"].double()), "W_K as a float32 CPU tensor"),
        "W_V of another d_head": (dict(W_V=base["W_V"][..., :1]), "W_V as a float32"),
        "b_Q of another head count": (dict(b_Q=base["b_Q"][:, :1]), "b_Q as a float32"),
        "W_U of another d_model": (dict(W_U=base["W_U"][:, :4]), "W_U as a float32"),
        "a query past the vocabulary": (dict(queries=queries + 9), "queries must lie in 0..8"),
        "a negative present token": (dict(present=present - 1), "present must lie in 0..8"),
        "int32 queries": (dict(queries=queries.int()), "queries must be"),
        "always as floats": (dict(always=always.float()), "always must be a bool tensor"),
        "always of another length": (dict(always=always[:2]), "always must be a bool tensor"),
        "a 2-D W_E": (dict(W_E=base["W_E"][0]), "W_E \\[K, d_vocab, d_model\\]"),
    }
    narrow = _problem(K=1, H=2, e=2, d=12, Vo=8, identity=False, with_mask=False)[0]  # d_model 12: no whole vectors
    bad["d_model 12"] = ({k: narrow[n] for k, n in zip(list(base)[:8], ip.TABLE_PARAMETERS)}, "multiples of 8")
    for what, (change, message) in bad.items():
        with pytest.raises(InterpError, match=message):
            cn._check_tables(*(({**base, **change})[n] for n in list(base)[:11]))
            pytest.fail(f"{what} was taken")


def _train(tmp_path, name, task, spec, cfg, seeds, native, monkeypatch):
    """A population trained with the kernel on or off; returns its results and how many steps went through it."""
    calls = {"rows": 0, "tables": 0}

    def counted(what, real):
        def call(*a, **kw):
            calls[what] += 1
            return real(*a, **kw)

        return call

    monkeypatch.setattr(ip, "NATIVE_ROWS", native)
    monkeypatch.setattr(ip, "count_losses_native", counted("rows", ip.count_losses_native))
    monkeypatch.setattr(ip, "count_tables_native", counted("tables", ip.count_tables_native))
    specs, cfgs = seed_population(task, spec, cfg, seeds)
    outs = [tmp_path / f"{name}{s}.safetensors" for s in seeds]
    res = train_population(task, specs, cfgs, outs, device="cpu", progress=False)
    assert calls["tables"] == calls["rows"]  # softmax pooling: the tables in C wherever the rows are
    return res, outs, calls["rows"]


@pytest.mark.parametrize(
    "shape",
    [dict(d_model=8, n_heads=4, d_head=2), dict(d_model=32, n_heads=1, d_head=2, output_matrix="learned")],
    ids=["d8, 4 heads", "d32, 1 head"],
)
def test_a_population_trained_through_the_kernel_equals_the_torch_step(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, shape, monkeypatch
):
    """Table 1's shapes (d = 8 with 4 heads; d = 32 with the one head halving leaves), dropout on the attention
    output: every step through the kernel, the weights after 3 epochs within WEIGHT_ATOL of the torch step's."""
    from safetensors.torch import load_file

    from tests.test_population import WEIGHT_ATOL

    _needs_c()
    spec = replace(tiny_spec, **shape)
    cfg = tiny_cfg(epochs=3, dropout_at="attention")
    ours, ours_out, n_native = _train(tmp_path, "c", tiny_task, spec, cfg, [0, 1], True, monkeypatch)
    theirs, theirs_out, n_torch = _train(tmp_path, "t", tiny_task, spec, cfg, [0, 1], False, monkeypatch)
    steps = ours[0]["steps"]
    assert n_native == steps and n_torch == 0  # every step through the kernel where it is on, none where off
    for a, b, ra, rb in zip(ours_out, theirs_out, ours, theirs):
        wa, wb = load_file(a), load_file(b)
        for n in wa:
            if wa[n].is_floating_point():
                torch.testing.assert_close(wa[n], wb[n], atol=WEIGHT_ATOL, rtol=0, msg=n)
        assert ra["accuracy"] == rb["accuracy"]


def test_shapes_the_kernel_does_not_take_train_by_the_torch_step(tmp_path, tiny_task, tiny_spec, tiny_cfg, monkeypatch):
    """d_model = 2 (Table 1's d = 2 cell) is not a whole vector of 8: the torch step trains it, and says so by not
    calling the kernel."""
    spec = replace(tiny_spec, d_model=2, n_heads=1, d_head=2)
    _, _, n = _train(tmp_path, "c", tiny_task, spec, tiny_cfg(epochs=1), [0, 1], True, monkeypatch)
    assert n == 0


def test_a_shape_whose_kernel_does_not_build_trains_by_the_torch_step(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, monkeypatch, refusing_compilers
):
    """Each population shape is its own build, checked before its first step (``shape_status``): where the
    compiler refuses this shape's source (a C compiler on the PATH that fails for d_model = 24 alone, as a timeout on
    a loaded machine would), the population trains it by the torch step, warns once, and equals the torch step's
    training; the other shapes keep the kernel."""
    _needs_c()
    refusing_compilers("#define d 24")
    spec = replace(tiny_spec, d_model=24, n_heads=3, d_head=2, output_matrix="learned")
    cfg = tiny_cfg(epochs=2, dropout_at="attention")
    with pytest.warns(RuntimeWarning, match="torch step"):
        _, ours_out, n = _train(tmp_path, "c", tiny_task, spec, cfg, [0, 1], True, monkeypatch)
    assert n == 0
    assert cn.shape_status(3, 7, 3, 2, 24, 8, False).startswith("torch:")
    _, theirs_out, _ = _train(tmp_path, "t", tiny_task, spec, cfg, [0, 1], False, monkeypatch)
    from safetensors.torch import load_file

    for a, b in zip(ours_out, theirs_out):
        wa, wb = load_file(a), load_file(b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)  # the same torch step: bit for bit
    assert cn.shape_status(3, 7, 2, 2, 16, 8, False) == "c"  # another shape builds through the same PATH


def test_a_two_layer_model_is_refused_before_any_kernel_call(tmp_path, tiny_task, tiny_spec, tiny_cfg, monkeypatch):
    """The token-count forward (and so the kernel) is for one-layer attention-only models: a two-layer population
    with MLPs is a clear ConfigError before any step (so none goes through the kernel)."""
    from interp.errors import ConfigError

    spec = replace(tiny_spec, n_layers=2, attn_only=False, d_mlp=32)
    with pytest.raises(ConfigError):
        _train(tmp_path, "c", tiny_task, spec, tiny_cfg(epochs=1, dropout_at="attention"), [0, 1], True, monkeypatch)
