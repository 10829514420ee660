"""The shipped induction checkpoints (2-layer and 1-layer contrast) and the repeated-tokens analysis suite:
the issue's facts about the trained model, the ``interp analyze`` output, and the report sections."""

from __future__ import annotations

import json

import pytest
import torch

from interp.analyses import suite_for
from interp.analyses.composition import composition_scores
from interp.analyses.pattern_scores import ablation_induction_test, head_scores
from interp.analyses.repeated_tokens import PROBE_SEED, probe_tokens
from interp.tasks import load_checkpoint


@pytest.fixture(scope="module")
def ckpt():
    return load_checkpoint("induction", device="cpu")


@pytest.fixture(scope="module")
def ckpt1():
    return load_checkpoint("induction-1layer", device="cpu")


@pytest.fixture(scope="module")
def probe(ckpt):
    return probe_tokens(ckpt.task, n_seqs=48, seed=7)


@pytest.fixture(scope="module")
def scores(ckpt, probe):
    return head_scores(ckpt.model, probe)


def test_shipped_files_are_small_and_of_the_task(ckpt, ckpt1):
    for c, layers in ((ckpt, 2), (ckpt1, 1)):
        assert c.task.name == "repeated-tokens" and c.model.cfg.n_layers == layers
        assert c.path.stat().st_size < 1_000_000
        assert c.training["accuracy"]["test"] == pytest.approx(c.metadata["training"]["metrics"]["test"]["accuracy"])


def test_two_layer_model_learned_in_context_copying(ckpt, ckpt1):
    m2, m1 = ckpt.training["metrics"]["test"], ckpt1.training["metrics"]["test"]
    assert m2["accuracy"] > 0.9 and m2["loss"] < 0.5  # repeats: predictable in context
    # first occurrences: chance is 1/64; guessing "R restarts here" (the token after BOS) is right only at p = len(R)
    assert m2["first_accuracy"] < 0.2
    assert m1["accuracy"] < 0.6  # no induction head in one layer


def test_previous_token_head_feeds_an_induction_head(ckpt, probe, scores):
    prev = scores.best("prev_token", layer=0)
    ind = scores.best("induction", layer=1)
    assert float(scores.prev_token[prev]) > 0.6
    assert float(scores.induction[ind]) > 0.8
    comp = composition_scores(ckpt.model, n_baseline=300)
    k = float(comp.K[prev + ind])
    assert k > comp.baseline_mean + 5 * comp.baseline_std and k > 1.5 * comp.baseline_mean
    test = ablation_induction_test(ckpt.model, probe, layers=[0])
    assert float(test.base[ind]) == pytest.approx(float(scores.induction[ind]), abs=1e-5)
    assert float(test.ablated[prev[1]][ind]) < 0.4  # ablating the previous-token head collapses induction
    assert int(test.drop[:, ind[0], ind[1]].argmax()) == prev[1]  # and it is the head whose ablation matters most


def test_one_layer_contrast_has_no_induction_head(ckpt1):
    s = head_scores(ckpt1.model, probe_tokens(ckpt1.task, n_seqs=48, seed=7))
    assert float(s.induction.max()) < 0.3


def test_analyze_json_shape(ckpt):
    suite = suite_for("repeated-tokens")
    result = suite.analyze(ckpt)
    summary = json.loads(result.to_json())  # strict JSON
    heads = summary["heads"]
    assert [h["head"] for h in heads] == [f"L{l}H{h}" for l in range(2) for h in range(2)]
    assert {"induction_score", "prev_token_score", "duplicate_score", "bos_score", "copying_score"} <= set(heads[0])
    K = summary["composition"]["K"]
    assert len(K) == 4 and len(K[0]) == 4
    assert torch.allclose(torch.tensor(K).reshape(2, 2, 2, 2), ckpt.model.all_composition_scores("K"), atol=1e-6)
    assert summary["composition"]["top_K"][0]["score"] == pytest.approx(max(max(r) for r in K))
    assert set(summary["ablation"]) == {"all", "query", "key", "value"}
    assert all(len(summary["ablation"][p]["rows"]) == 2 * 2 for p in summary["ablation"])
    text = result.text()
    assert "L1H" in text and "top K-composition pairs" in text and "causal test" in text


@pytest.mark.slow
def test_analyze_one_layer_and_cli(ckpt1, capsys):
    from interp.app.cli import main

    suite = suite_for("repeated-tokens")
    result = suite.analyze(ckpt1)
    summary = result.to_dict()
    assert summary["ablation"] is None and summary["composition"]["top_K"] == []
    assert "no head composition" in result.text()
    assert main(["analyze", "induction-1layer", "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["heads"][0]["head"] == "L0H0" and "induction_score" in out["heads"][0]


def test_report_sections(ckpt, ckpt1):
    from interp.report_page import Report

    for c in (ckpt, ckpt1):
        report = Report("induction")
        suite_for("repeated-tokens").add_report_sections(c, report, progress=False)
        page = report.html()
        titles = [s.title for s in report.sections]
        assert "Induction and previous-token heads" in titles
        if c.model.cfg.n_layers == 2:
            assert "K-composition causal test" in titles and report.n_attention == 1 and report.n_figures >= 8
        assert "CircuitsVis" in page or c.model.cfg.n_layers == 1


def test_path_specific_ablation_names_what_it_removed(ckpt):
    """Removing L0H1 only from the layer-1 key input (K-composition proper) is not zero-ablating it.
    The value path cannot change a layer-1 pattern at all; the key path must collapse induction far more than the
    query path."""
    toks = probe_tokens(ckpt.task)  # the one default probe (seed PROBE_SEED)
    tests = {
        p: ablation_induction_test(ckpt.model, toks, senders=["L0H1"], path=p) for p in ("all", "query", "key", "value")
    }
    base = tests["all"].base
    for p, t in tests.items():
        assert torch.allclose(t.base, base) and t.path == p and p in t.to_dict()["path"]
    assert torch.allclose(tests["value"].ablated[0], base, atol=1e-6)  # values do not move attention
    ind = [(1, 0), (1, 1)]
    for l, h in ind:
        assert float(tests["all"].ablated[0, l, h]) < 0.2
        assert float(tests["all"].ablated[0, l, h]) < float(tests["key"].ablated[0, l, h]) < 0.6
        assert float(tests["key"].ablated[0, l, h]) < float(tests["query"].ablated[0, l, h])
    assert "key input" in tests["key"].removed and "zero-ablated" in tests["all"].removed


def test_key_path_equals_a_hand_written_hook(ckpt):
    """The batched key-path ablation equals subtracting L0H1's output from blocks.1.hook_k_input by hand."""
    from interp.analyses.pattern_scores import scores_from_patterns, target_masks
    from interp.visualize import attention_patterns

    model = ckpt.model
    toks = probe_tokens(ckpt.task, n_seqs=16)
    got = ablation_induction_test(model, toks, senders=["L0H1"], path="key")
    store = {}

    def keep(z, hook):
        store["out"] = z[:, :, 1] @ model.W_O[0, 1]
        return z

    def sub(x, hook):
        return x - store["out"][:, :, None]

    model.set_use_split_qkv_input(True)
    try:
        pats = attention_patterns(
            model, toks, fwd_hooks=[("blocks.0.attn.hook_z", keep), ("blocks.1.hook_k_input", sub)]
        )
    finally:
        model.set_use_split_qkv_input(False)
    want = scores_from_patterns(pats, {"induction": target_masks(toks)["induction"]})["induction"]
    assert torch.allclose(got.ablated[0], want, atol=1e-5)
    assert not model.cfg.use_split_qkv_input  # the model is left as it was


def test_head_scores_have_one_default_probe_and_intervals(ckpt):
    """The Python API and `interp analyze` score the same probe; intervals bracket the score."""
    s = head_scores(ckpt.model, probe_tokens(ckpt.task))
    a = suite_for(ckpt.task).analyze(ckpt).scores
    assert torch.equal(s.induction, a.induction) and PROBE_SEED == 1234
    lo, hi = s.ci["induction"]
    assert bool((lo <= s.induction + 1e-6).all() and (s.induction <= hi + 1e-6).all() and (hi - lo).max() < 0.2)
    row = s.to_dict()["heads"][2]
    assert row["head"] == "L1H0" and len(row["induction_ci"]) == 2
