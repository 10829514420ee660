"""The explorer's kernel side (``interp.explore``): what it shows equals what the toolkit's analyses give.

No browser here (tests/test_explorer_browser.py drives a real one): the widget is built without a front end and the
page's events are sent to it as the page sends them (``_on_msg``). Models: a 1-head, a 64-head (trained-shape W_O,
``output_matrix="learned"``) and a 2-layer model with MLPs and LayerNorm, all randomly initialised on a small
noisy-majority task, and every shipped checkpoint.
"""

from __future__ import annotations

import base64
import json

import pytest
import torch

import interp
from interp import analyses
from interp.analyses.reference import learned_accuracy_loop
from interp.analyses.repeated_tokens.corrupt import corrupted_pair
from interp.errors import HeadError, InterpError, TaskError, TokenError
from interp.tasks import get_task, shipped_checkpoints

SHAPES = {
    "1 head": {"n_layers": 1, "d_model": 2, "n_heads": 1, "d_head": 2},
    "64 heads, learned W_O": {"n_layers": 1, "d_model": 8, "n_heads": 64, "d_head": 2, "output_matrix": "learned"},
    "2 layers with MLP": {
        "n_layers": 2,
        "d_model": 16,
        "n_heads": 4,
        "d_head": 4,
        "attn_only": False,
        "d_mlp": 32,
        "normalization": "LN",
        "positional": "standard",
        "output_matrix": "learned",
        "attn_bias": True,
    },
}
OFF = {
    "1 head": ["L0H0"],
    "64 heads, learned W_O": [f"L0H{h}" for h in range(0, 64, 3)],
    "2 layers with MLP": ["L0H1", "L1H2"],
}
BATCH = 64


@pytest.fixture(scope="module")
def small_task():
    return get_task(
        "noisy-majority",
        train_size=256,
        val_size=64,
        test_size=128,
        train_lengths=[0, 20],
        val_lengths=[21, 30],
        test_lengths=[31, 40],
    )


@pytest.fixture(scope="module", params=list(SHAPES))
def shaped(request, small_task):
    """``(model, task, heads switched off)`` for each model shape."""
    spec = interp.ModelSpec(**{**small_task.default_spec(), **SHAPES[request.param], "init_seed": 3})
    torch.manual_seed(0)
    model = interp.build_model(spec, device="cpu")
    return model, small_task, OFF[request.param]


@pytest.fixture(scope="module")
def nm():
    """The shipped noisy-majority checkpoint (shared; tests reset the explorer they build)."""
    return interp.load_checkpoint("noisy-majority", device="cpu")


def send(w, **msg) -> str:
    """An event as the page sends it; the widget's error line after it."""
    w._on_msg(w, msg, [])
    return w.status["error"]


def all_heads(model):
    return [(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]


def kept_of(model, off):
    off = {interp.parse_head(s, model.cfg.n_layers, model.cfg.n_heads) for s in off}
    return [h for h in all_heads(model) if h not in off]


def reference_hooks(model, kept, z_ref=None):
    """hook_z hooks written here, as learned_accuracy_loop (the reference) writes them (one mask, zero or mean)."""
    mask = interp.head_mask([kept], model.cfg.n_layers, model.cfg.n_heads)[0]

    def hook(z, hook):
        m = mask[hook.layer()][None, None, :, None]
        return z * m if z_ref is None else z * m + z_ref[hook.layer()][None, None] * (1 - m)

    return [(f"blocks.{l}.attn.hook_z", hook) for l in range(model.cfg.n_layers)]


def check_view(w, model, task, split, index, off, ablation, batch_size):
    """The explorer's prediction, logits, patterns and accuracy against the toolkit's own calls."""
    data = task.dataset(split)
    batch = data.select(slice(0, batch_size))
    ex = data.select([index])
    kept = kept_of(model, off)
    z_ref = analyses.mean_head_outputs(model, batch) if ablation == "mean" else None
    hooks = reference_hooks(model, kept, z_ref)
    with torch.inference_mode():
        logits = model.run_with_hooks(ex.tokens, fwd_hooks=hooks)[0]
    torch.testing.assert_close(w.logits, logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        w.patterns, interp.attention_patterns(model, ex.tokens, fwd_hooks=hooks)[0], rtol=0, atol=1e-7
    )
    # the answer position: the learned-accuracy path's logits (hooks, and the fast path where it applies)
    pred = w.prediction
    row = pred.positions.index(pred.answer_pos)
    fast = analyses.subset_answer_logits(model, ex, heads=[kept], ablation=ablation, reference=batch, method="auto")[
        0, 0
    ]
    la = analyses.subset_answer_logits(model, ex, heads=[kept], ablation=ablation, reference=batch, method="hooks")[
        0, 0
    ]
    torch.testing.assert_close(pred.logits[row], la, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pred.logits[row], fast, rtol=1e-5, atol=1e-5)
    assert pred.answer["correct"] == bool(la.argmax() == ex.labels[0])
    top = la.softmax(-1).topk(pred.top_ids.shape[1])
    assert pred.top_ids[row].tolist() == top.indices.tolist()
    torch.testing.assert_close(pred.top_probs[row], top.values, rtol=1e-5, atol=1e-6)
    # accuracy: learned_accuracy on the same batch, exactly (and its slow one-forward-per-subset reference)
    assert w.accuracy == float(analyses.learned_accuracy(model, batch, heads=[kept], ablation=ablation).accuracy[0])
    assert w.accuracy == float(learned_accuracy_loop(model, batch, heads=[kept], ablation=ablation).accuracy[0])
    assert w.full_accuracy == float(
        analyses.learned_accuracy(model, batch, heads=[all_heads(model)], ablation=ablation).accuracy[0]
    )
    view = w.accuracy_view
    assert (
        view["correct"] == round(w.accuracy * batch_size)
        and view["n"] == batch_size
        and view["ablated"] == (w.ablated)
        and view["split"] == split
    )


# -- 1 head, 64 heads, 2 layers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_prediction_patterns_and_accuracy_equal_the_toolkit(shaped, ablation):
    model, task, off = shaped
    w = interp.explore(model, task, batch_size=BATCH, ablation=ablation)
    w.ablated = off
    w.example = ("test", 5)
    check_view(w, model, task, "test", 5, off, ablation, BATCH)
    w.example = ("val", 3)  # another split: the accuracy batch follows it
    w.batch_size = 32
    check_view(w, model, task, "val", 3, off, ablation, 32)


def test_each_example_of_the_batch_agrees_with_the_batched_accuracy(shaped):
    """An example's 'correct' under the mask is its row of the batched learned-accuracy logits."""
    model, task, off = shaped
    w = interp.explore(model, task, batch_size=BATCH, ablation="mean")
    w.ablated = off
    batch = task.dataset("test").select(slice(0, BATCH))
    logits = analyses.subset_answer_logits(model, batch, heads=[kept_of(model, off)], ablation="mean")[0]
    ok = (logits.argmax(-1) == batch.labels).tolist()
    for i in range(12):
        w.example = ("test", i)
        assert w.prediction.answer["correct"] == ok[i], i
    assert w.accuracy == sum(ok) / len(ok)


def test_patching_equals_activation_and_path_patching(shaped):
    model, task, _ = shaped
    w = interp.explore(model, task, batch_size=BATCH)
    w.example = ("test", 2)
    clean = task.dataset("test").select([2])
    w.corruption = "flip"
    ref = analyses.activation_patching(
        model, clean, corrupted=analyses.flip_answer(clean, seed=0), metric="logit_diff", where="z", per="head"
    )
    assert torch.equal(w.patching.values, ref.values) and w.patching.clean == ref.clean
    assert w.corrupted_tokens == task.vocab.decode(analyses.flip_answer(clean, seed=0).tokens[0])
    w.corruption = "resample"
    j = w.patch_view["resampled"]
    corrupted = task.dataset("test").select([j])
    assert j > 2 and corrupted.tokens.shape == clean.tokens.shape and int(corrupted.labels[0]) != int(clean.labels[0])
    ref = analyses.activation_patching(model, clean, corrupted=corrupted, metric="logit_diff", where="z", per="head")
    assert torch.equal(w.patching.values, ref.values)
    if model.cfg.n_layers > 1:
        w.sender = "L0H1"
        path = analyses.path_patching(model, clean, corrupted=corrupted, metric="logit_diff", senders=["L0H1"])
        torch.testing.assert_close(w.path_patching.values, path.values, rtol=0, atol=0, equal_nan=True)
        assert [r["receiver"] for r in w.patch_view["path"]["rows"]] == [r["receiver"] for r in path.rows()]
    else:
        with pytest.raises(HeadError, match="one layer"):
            w.sender = "L0H0"
    w.corruption = None
    assert w.patching is None and w.patch_view["kind"] is None


def test_task_metrics_under_the_mask(shaped):
    """``w.metrics``: the task's own metrics from one hooked forward of the batch, as the batched evaluation gives."""
    from interp.evaluation import predictions_and_loss

    model, task, off = shaped
    w = interp.explore(model, task, batch_size=BATCH)
    w.ablated = off
    batch = task.dataset("test").select(slice(0, BATCH))
    out = predictions_and_loss(model, batch, fwd_hooks=reference_hooks(model, kept_of(model, off)))
    assert w.metrics == task.metrics(out["preds"], out["loss"], batch)
    assert w.metrics["accuracy"] == w.accuracy  # noisy majority: the answer position is the task's accuracy


def test_drawn_patterns_and_their_caps(shaped):
    """The page gets the last ``max_positions`` positions of every pattern as uint16 (weight x 65535), and at most
    CELL_BUDGET entries in all."""
    from interp.app.explorer.compute import CELL_BUDGET

    model, task, _ = shaped
    w = interp.explore(model, task, batch_size=BATCH, max_positions=16)
    v = w.patterns_view
    L, H, T = model.cfg.n_layers, model.cfg.n_heads, w.patterns.shape[-1]
    assert v["T"] == T > 16 and v["window"] == 16 and v["offset"] == T - 16
    got = torch.frombuffer(bytearray(v["data"]), dtype=torch.int16).view(L, H, 16, 16).to(torch.int32) & 0xFFFF
    assert torch.equal(got, (w.patterns[:, :, -16:, -16:].clamp(0, 1) * 65535).round().to(torch.int32))
    wide = interp.explore(model, task, batch_size=BATCH, max_positions=10_000)
    assert L * H * wide.patterns_view["window"] ** 2 <= CELL_BUDGET


# -- every shipped checkpoint ----------------------------------------------------------------------------------------

SHIPPED = sorted(shipped_checkpoints())


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_checkpoint(name):
    ckpt = interp.load_checkpoint(name, device="cpu")
    model, task = ckpt.model, ckpt.task
    w = interp.explore(ckpt, batch_size=BATCH)
    off = [interp.head_label(model.cfg.n_layers - 1, 0)]
    w.ablated = off
    w.example = ("test", 7)
    check_view(w, model, task, "test", 7, off, "zero", BATCH)  # (mean ablation: the 1-head, 64-head and 2-layer tests)
    clean = task.dataset("test").select([7])
    for kind in w.info["corruptions"]:
        if kind == "typed":
            continue
        w.corruption = kind
        assert w.status["error"] == "" and w.patch_view["error"] == "", (kind, w.patch_view["error"])
        if kind in ("key", "query", "answer"):  # the task's helper draws the pair (seed = index)
            c, corrupted = corrupted_pair(task, n_seqs=1, kind=kind, seed=7)
            assert w.tokens == task.vocab.decode(c.tokens[0]) and w.example is None
        elif kind == "flip":
            c, corrupted = clean, analyses.flip_answer(clean, seed=0)
        else:
            c, corrupted = clean, task.dataset("test").select([w.patch_view["resampled"]])
        ref = analyses.activation_patching(model, c, corrupted=corrupted, metric="logit_diff", where="z", per="head")
        assert torch.equal(w.patching.values, ref.values), kind
        assert w.patching.corrupted == ref.corrupted
    w.corruption = None
    assert w.example == ("test", 7)
    w.head = interp.head_label(0, 0)
    qk = analyses.full_qk_circuit(model, heads="L0H0", vocab=task.vocab).dense()
    c = w.head_view["circuits"][0]
    got = torch.frombuffer(bytearray(c["data"]), dtype=torch.float32).view(*c["shape"])
    assert torch.equal(got, qk[: c["shape"][0], : c["shape"][1]].float())


@pytest.mark.parametrize("name", ["noisy-majority", "repeated-tokens", "modular-addition", "integer-addition"])
def test_typed_input_is_the_tasks_own_example(name):
    """Typing an example of the test split gives that very example (tokens, targets, answer, label) and prediction."""
    ckpt = interp.load_checkpoint(name, device="cpu")
    task = ckpt.task
    w = interp.explore(ckpt, batch_size=16)
    ex = task.dataset("test").select([4])
    toks = task.vocab.decode(ex.tokens[0])
    if name == "noisy-majority":
        typed = " ".join(toks[1 : toks.index("=")])  # the digits; the answer is computed
    elif name == "repeated-tokens":
        typed = " ".join(toks)
    elif name == "modular-addition":
        typed = " ".join(toks[:2])
    else:  # "12345 + 00678": compact digits
        plus, eq = toks.index("+"), toks.index("=")
        typed = "".join(toks[1:plus]) + " + " + "".join(toks[plus + 1 : eq])
    w.example = ("test", 4)
    before = w.prediction
    w.tokens = typed
    assert w.tokens == toks and w.example is None and w.controls["source"] == "typed"
    clean = w.input_data
    for f in ("tokens", "targets", "answer_pos", "labels", "lengths"):
        assert torch.equal(getattr(clean, f), getattr(ex, f)), f
    torch.testing.assert_close(w.prediction.logits, before.logits, rtol=0, atol=1e-6)
    assert w.prediction.correct == before.correct


def test_typed_input_forms():
    from interp.app.explorer import typed_example

    nm = get_task("noisy-majority")
    assert typed_example(nm, "0112").tokens.tolist() == typed_example(nm, "[BOS] 0 1 1 2 = 4 [EOS]").tokens.tolist()
    assert nm.vocab.decode(typed_example(nm, ["0", "1", "1"]).tokens[0]) == ["[BOS]", "0", "1", "1", "=", "5", "[EOS]"]
    assert nm.vocab.decode(typed_example(nm, "[BOS] =").tokens[0]) == ["[BOS]", "=", "4", "[EOS]"]  # no digits: a tie
    ia = get_task("integer-addition")
    d = typed_example(ia, "99 + 1")  # 2-digit operands (1 -> 01), the answer units first
    assert ia.vocab.decode(d.tokens[0]) == ["[BOS]", "9", "9", "+", "0", "1", "=", "0", "0", "1", "[EOS]"]
    ma = get_task("modular-addition")
    assert int(typed_example(ma, "100 20 =").labels[0]) == 7
    rt = get_task("repeated-tokens")
    d = typed_example(rt, "5 6 7 5 6 7 5")
    assert d.tokens[0, 0] == rt.bos and int(d.fields["repeat_len"][0]) == 3 and int(d.labels[0]) == 5
    assert int(d.answer_pos[0]) == 6 and d.targets[0, -1] == interp.IGNORE


def test_explore_arguments(nm, small_task):
    model = nm.model
    assert interp.explore(nm).info["name"].endswith("noisy-majority.safetensors")
    assert interp.explore(model, "noisy-majority").task.name == "noisy-majority"
    with pytest.raises(TaskError, match="needs its task"):
        interp.explore(model)
    with pytest.raises(TaskError, match="another task"):
        interp.explore(model, get_task("modular-addition"))
    with pytest.raises(TaskError, match="unknown split"):
        interp.explore(model, small_task, split="nope")
    with pytest.raises(InterpError, match="out of range"):
        interp.explore(model, small_task, index=10_000)
    with pytest.raises(InterpError, match="batch_size"):
        interp.explore(model, small_task, batch_size=0)
    with pytest.raises(InterpError, match="ablation"):
        interp.explore(model, small_task, ablation="half")
    assert interp.explore(model, small_task, batch_size=10_000).batch_size == 128  # the split's size


# -- the page's events ---------------------------------------------------------------------------------------------


def test_bad_input_from_the_page_is_one_line_and_changes_nothing(nm):
    w = interp.explore(nm, batch_size=BATCH)
    w.ablated = ["L0H2"]
    before = (w.tokens, w.ablated, w.accuracy, w.example, w.ablation, w.batch_size)
    cases = [
        ({"type": "typed", "text": "0 1 x"}, "unknown token 'x'"),
        ({"type": "typed", "text": "0 1 5"}, "digits 0, 1, 2"),
        ({"type": "typed", "text": "0" * 300}, "n_ctx=204"),
        ({"type": "typed", "text": "   "}, "no tokens"),
        ({"type": "toggle", "head": "L3H0"}, "out of range"),
        ({"type": "toggle", "head": "banana"}, "cannot parse head"),
        ({"type": "example", "split": "nope", "index": 0}, "unknown split"),
        ({"type": "example", "split": "test", "index": 99999}, "out of range"),
        ({"type": "example", "split": "test", "index": "abc"}, "whole number"),
        ({"type": "batch_size", "value": 0}, "positive integer"),
        ({"type": "batch_size", "value": "x"}, "whole number"),
        ({"type": "ablation", "value": "half"}, "unknown ablation"),
        ({"type": "corruption", "kind": "zzz"}, "unknown corruption"),
        ({"type": "corruption", "kind": "typed", "text": "0 1"}, "line up"),
        ({"type": "corruption", "kind": "typed", "text": "0 q"}, "unknown token"),
        ({"type": "sender", "head": "L0H0"}, "one layer"),
        ({"type": "select", "head": "L0H99"}, "out of range"),
        ({"type": "compute", "what": "nothing"}, "unknown computation"),
        ({"type": "nope"}, "unknown event"),
    ]
    for msg, expect in cases:
        err = send(w, **msg)
        assert expect in err, (msg, err)
        assert "\n" not in err and "Traceback" not in err and len(err) <= 300, err
        assert (w.tokens, w.ablated, w.accuracy, w.example, w.ablation, w.batch_size) == before, msg
        assert w.corruption is None
    assert w.last_traceback is None
    assert send(w, type="example", split="test", index=1) == ""  # the next good event clears the line


def test_python_setters_raise_the_toolkits_errors(nm):
    w = interp.explore(nm, batch_size=BATCH)
    with pytest.raises(TokenError, match="unknown token"):
        w.tokens = "0 1 x"
    with pytest.raises(HeadError):
        w.ablated = ["L0H99"]
    with pytest.raises(TaskError):
        w.example = ("nope", 0)
    with pytest.raises(InterpError):
        w.example = "test"
    with pytest.raises(InterpError):
        w.batch_size = -1
    with pytest.raises(InterpError):
        w.corruption = "key"  # a repeated-tokens corruption


def test_page_events_drive_the_state(nm):
    model, task = nm.model, nm.task
    w = interp.explore(nm, batch_size=BATCH, seed=5)
    batch = task.dataset("test").select(slice(0, BATCH))
    assert send(w, type="toggle", head="L0H3") == "" and w.ablated == ["L0H3"] == w.controls["ablated"]
    assert send(w, type="toggle", head="L0H3") == "" and w.ablated == []
    assert send(w, type="only", head="L0H5") == ""
    assert w.ablated == [interp.head_label(0, h) for h in range(16) if h != 5]
    assert w.accuracy == analyses.learned_accuracy_of(model, batch, heads=["L0H5"])
    assert send(w, type="ablated", heads=["L0H1", "L0H7"]) == "" and w.ablated == ["L0H1", "L0H7"]
    assert send(w, type="ablation", value="mean") == "" and w.ablation == "mean"
    assert w.accuracy == analyses.learned_accuracy_of(
        model, batch, heads=kept_of(model, ["L0H1", "L0H7"]), ablation="mean"
    )
    assert send(w, type="batch_size", value="32") == "" and w.batch_size == 32 and w.accuracy_view["n"] == 32
    assert send(w, type="example", split="val", index=4) == "" and w.example == ("val", 4)
    assert send(w, type="random", split="test") == ""
    split, index = w.example
    import random

    assert split == "test" and index == random.Random(5).randrange(len(task.dataset("test")))
    assert send(w, type="typed", text="0 1 1") == "" and w.tokens[:4] == ["[BOS]", "0", "1", "1"]
    assert send(w, type="select", head="L0H2") == "" and w.head == "L0H2" == w.head_view["head"]
    assert send(w, type="select", head=None) == "" and w.head is None and w.head_view == {}
    assert send(w, type="corruption", kind="flip") == "" and w.corruption == "flip" and w.patching is not None
    assert send(w, type="corruption", kind="typed", text="1 1 1") == "" and w.corruption == "typed"
    assert w.corrupted_tokens[:4] == ["[BOS]", "1", "1", "1"]
    assert send(w, type="compute", what="metrics") == "" and w.accuracy_view["metrics"]["accuracy"] == w.accuracy
    assert send(w, type="export_state") == ""
    state = json.loads(w.export_view["state"])
    assert state["ablated"] == ["L0H1", "L0H7"] and state["input"]["source"] == "typed"


@pytest.mark.slow
def test_head_panel_numbers(nm):
    model, task = nm.model, nm.task
    w = interp.explore(nm, batch_size=BATCH)
    w.example = ("test", 3)
    w.head = "L0H8"
    batch = task.dataset("test").select(slice(0, BATCH))
    ex = task.dataset("test").select([3])
    p = w.head_panel
    singles = analyses.learned_accuracy(model, batch, heads=[[h] for h in all_heads(model)])
    assert p["learned_alone"] == singles["L0H8"]
    assert p["toggled_accuracy"] == analyses.learned_accuracy_of(model, batch, heads=kept_of(model, ["L0H8"]))
    # direct logit contribution: the head's term of the toolkit's logit decomposition (no LayerNorm here)
    dec = analyses.logit_decomposition(model, ex)
    ap, label = int(ex.answer_pos[0]), int(ex.labels[0])
    other = task.vocab.index["5" if task.vocab.tokens[label] == "4" else "4"]
    assert p["dla_tokens"] == [task.vocab.tokens[label], task.vocab.tokens[other]]
    assert p["dla"] == pytest.approx(float(dec.heads[0, 8, 0, ap, label]), abs=1e-4)
    assert p["dla_diff"] == pytest.approx(
        float(dec.heads[0, 8, 0, ap, label] - dec.heads[0, 8, 0, ap, other]), abs=1e-4
    )
    # induction / previous-token scores: head_scores on the same repeated random tokens
    make = analyses.repeated_random_tokens
    scores = analyses.head_scores(model, make(32, 32, task.vocab.n_out, bos=task.vocab.bos, seed=0), n_boot=200)
    assert p["scores"]["induction"] == float(scores.induction[0, 8])
    assert p["scores"]["prev_token"] == float(scores.prev_token[0, 8])
    # on request: separation accuracy and Shapley values of every head
    assert p["separation"] is None and p["shapley"] is None
    assert send(w, type="compute", what="separation") == ""
    sep = analyses.separation_accuracy(model, batch, train=task.dataset("train").select(slice(0, 2000)))
    assert w.head_panel["separation"]["accuracy"] == float(sep.accuracy[8])
    assert send(w, type="compute", what="shapley") == ""
    shap = analyses.coalition_values(model, batch, value="learned-accuracy").shapley()
    assert w.head_panel["shapley"]["value"] == shap["L0H8"] and w.head_panel["shapley"]["exact"]
    # switching the open head off: the panel and the toggled accuracy follow
    assert send(w, type="toggle", head="L0H8") == ""
    assert w.head_panel["off"] and w.head_panel["toggled_accuracy"] == w.full_accuracy


def test_direct_logit_attribution_of_a_layernorm_model_is_the_frozen_scale_linearisation(small_task):
    """With a final LayerNorm each head's term is (c - mean c) / scale * w @ W_U, c = z W_O, at the run's scale; the
    terms of every part of the residual stream then add up to the logits (less the LayerNorm and unembedding
    biases)."""
    from interp.app.explorer import direct_logit_attribution

    spec = interp.ModelSpec(**{**small_task.default_spec(), **SHAPES["2 layers with MLP"], "init_seed": 4})
    model = interp.build_model(spec, device="cpu")
    ex = small_task.dataset("test").select([0])
    with torch.inference_mode():
        logits, cache = model.run_with_cache(ex.tokens)
    z = torch.stack([cache["z", l][0] for l in range(2)])
    scale = cache["ln_final.hook_scale"][0]
    ap, good, bad = int(ex.answer_pos[0]), 4, 5
    heads, _ = direct_logit_attribution(model, z, scale, ap, good, bad)
    parts = [cache["hook_embed"][0, ap] + cache["hook_pos_embed"][0, ap]] + [
        cache[f"blocks.{l}.hook_mlp_out"][0, ap] for l in range(2)
    ]
    parts += [model.b_O[l] for l in range(2)]
    with torch.inference_mode():
        rest = sum(((c - c.mean()) / scale[ap] * model.ln_final.w) @ model.W_U[:, good] for c in parts)
        total = heads.sum() + rest + model.ln_final.b @ model.W_U[:, good] + model.b_U[good]
    assert float(total) == pytest.approx(float(logits[0, ap, good]), abs=1e-4)


# -- export, snapshot --------------------------------------------------------------------------------------------------


def test_snippet_reproduces_the_view(nm):
    w = interp.explore("noisy-majority", batch_size=BATCH, device="cpu")
    w.example = ("test", 9)
    w.ablated = ["L0H1", "L0H8"]
    w.ablation = "mean"
    w.corruption = "flip"
    w.head = "L0H3"
    ns: dict = {}
    exec(w.snippet(), ns)
    assert float(ns["acc"].accuracy[0]) == w.accuracy
    probs = w.prediction.top_probs[w.prediction.positions.index(w.prediction.answer_pos)]
    torch.testing.assert_close(ns["probs"].topk(3).values, probs, rtol=1e-5, atol=1e-6)
    assert torch.equal(ns["patching"].values, w.patching.values)
    w.tokens = "0 0 1 2 1"
    ns = {}
    exec(w.snippet(), ns)
    assert ns["example"].tokens.tolist() == w.input_data.tokens.tolist()


def test_snippet_of_a_helper_pair_and_a_model_without_checkpoint():
    ckpt = interp.load_checkpoint("repeated-tokens", device="cpu")
    w = interp.explore(ckpt.model, ckpt.task, batch_size=BATCH)
    w.example = ("test", 2)
    w.corruption = "query"
    w.sender = "L0H1"
    ns = {"model": ckpt.model}
    exec(w.snippet(), ns)
    assert float(ns["acc"].accuracy[0]) == w.accuracy
    torch.testing.assert_close(ns["paths"].values, w.path_patching.values, rtol=0, atol=0, equal_nan=True)


def test_state_is_a_result_with_plain_json(nm):
    w = interp.explore(nm, batch_size=BATCH)
    w.ablated = ["L0H4"]
    w.head = "L0H4"
    w.corruption = "resample"
    state = w.state()
    assert isinstance(state, interp.Result)
    d = json.loads(state.to_json())
    assert d["ablated"] == ["L0H4"] and d["accuracy"]["accuracy"] == w.accuracy and d["head"]["head"] == "L0H4"
    assert d["patching"]["corruption"] == "resample" and len(d["prediction"]["rows"]) == 2
    assert "L0H4" in state._repr_html_()
    assert isinstance(w.prediction, interp.Result) and "correct" in repr(w.prediction)


def test_display_bundle_carries_a_static_snapshot(nm):
    """A saved notebook shows the text/html snapshot where no kernel runs: the input, the prediction, the mask, the
    accuracy and every head's pattern as a PNG."""
    w = interp.explore(nm, batch_size=BATCH)
    w.ablated = ["L0H3"]
    data, _ = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data and "text/plain" in data
    html = data["text/html"]
    assert f"{w.accuracy:.4f}" in html and "L0H3 (off)" in html and "Static snapshot" in html
    pngs = html.split("data:image/png;base64,")[1:]
    assert len(pngs) == 16
    raw = base64.b64decode(pngs[0].split("'")[0])
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<script" not in html  # nothing to run: GitHub's viewer and nbconvert show it as it is


# -- the head mask, a task of the user's own, grouped-query attention ----------------------------------------------


def test_mask_is_one_for_kept_heads_and_ablated_lists_the_heads_off(nm):
    """The toolkit's one meaning of a head mask: ``w.mask`` is ``[layer, head]`` with 1 = kept; the heads switched
    off, as a list, are ``w.ablated``."""
    model, task = nm.model, nm.task
    w = interp.explore(nm, batch_size=BATCH)
    w.ablated = ["L0H1", "L0H7"]
    assert w.mask.shape == (1, 16) and w.mask.sum() == 14 and w.mask[0, 1] == 0 and w.mask[0, 7] == 0
    keep = torch.ones(1, 16)
    keep[0, 3] = 0
    w.mask = keep
    assert w.ablated == ["L0H3"] and torch.equal(w.mask, keep)
    batch = task.dataset("test").select(slice(0, BATCH))
    assert w.accuracy == analyses.learned_accuracy(model, batch, heads=[kept_of(model, ["L0H3"])]).accuracy[0]
    with pytest.raises(HeadError, match="use ablated="):
        w.mask = ["L0H1"]  # a list of heads to switch off is not a mask
    with pytest.raises(HeadError, match=r"\[1, 16\] tensor of 1 \(kept\) and 0 \(ablated\)"):
        w.mask = torch.ones(2, 16)
    assert w.ablated == ["L0H3"]


@pytest.fixture
def own_task():
    """The example task of docs/own-task.md registered with no suite (the generic suite serves it), small; a model
    of its default shape, randomly initialised."""
    import sys
    from pathlib import Path

    from interp import registry

    folder = str(Path(__file__).resolve().parents[1] / "examples" / "own_task")
    sys.path.insert(0, folder)
    try:
        from parens_task import BalancedParens
    finally:
        sys.path.remove(folder)
    interp.register_task(BalancedParens)
    task = interp.get_task("balanced-parens", train_size=128, val_size=32, test_size=96, max_len=8)
    torch.manual_seed(0)
    model = interp.build_model(interp.ModelSpec(**task.default_spec()), device="cpu")
    yield model, task
    registry.unregister_task("balanced-parens")
    sys.modules.pop("parens_task", None)


def test_a_task_without_a_suite_of_its_own(own_task):
    """The generic suite: typed tokens read as typed with the answer the last one, the corruptions every task has,
    head scores on repeated random tokens; and the snippet reproduces the view."""
    model, task = own_task
    w = interp.explore(model, task, batch_size=BATCH)
    assert w.info["corruptions"] == ["resample", "typed"] and w.info["typed"]
    w.tokens = "( ( ) ) = yes"  # [BOS] is put first
    ex = w.input_data
    assert w.tokens == ["[BOS]", "(", "(", ")", ")", "=", "yes"] and int(ex.answer_pos[0]) == 5
    assert int(ex.labels[0]) == task.vocab.index["yes"] and ex.targets[0].tolist().count(interp.IGNORE) == 6
    assert w.prediction.answer["target"] == "yes"
    with pytest.raises(TokenError, match="input-only"):
        w.tokens = "( ) [PAD]"
    w.example = ("test", 1)
    w.corruption = "resample"
    clean, corrupted = task.dataset("test").select([1]), task.dataset("test").select([w.patch_view["resampled"]])
    ref = analyses.activation_patching(model, clean, corrupted=corrupted, metric="logit_diff", where="z", per="head")
    assert torch.equal(w.patching.values, ref.values)
    w.head = "L1H2"
    assert "random output tokens" in w.head_panel["scores_on"]
    ns = {"model": model}
    exec(w.snippet(), ns)
    assert float(ns["acc"].accuracy[0]) == w.accuracy and torch.equal(ns["patching"].values, w.patching.values)


def test_grouped_query_attention_with_a_sender(small_task):
    """A HookedTransformer with grouped-query attention (2 key/value heads for 4 query heads) paired with a task:
    the view, the patching and the path patching from a sender equal the toolkit's own calls."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=16,
        n_heads=4,
        d_head=4,
        n_key_value_heads=2,
        n_ctx=small_task.n_ctx,
        d_vocab=len(small_task.vocab),
        d_vocab_out=small_task.vocab.n_out,
        attn_only=True,
        seed=0,
        device="cpu",
    )
    model = HookedTransformer(cfg)
    w = interp.explore(model, small_task, batch_size=BATCH)
    w.ablated = ["L0H2"]
    w.example = ("test", 2)
    check_view(w, model, small_task, "test", 2, ["L0H2"], "zero", BATCH)
    w.corruption = "flip"
    w.sender = "L0H1"
    assert w.status["error"] == "" and w.patch_view["error"] == ""
    clean = small_task.dataset("test").select([2])
    corrupted = analyses.flip_answer(clean, seed=0)
    path = analyses.path_patching(model, clean, corrupted=corrupted, metric="logit_diff", senders=["L0H1"])
    torch.testing.assert_close(w.path_patching.values, path.values, rtol=0, atol=0, equal_nan=True)
    w.head = "L1H3"
    assert w.head_panel["head"] == "L1H3" and len(w.head_view["circuits"]) >= 2
