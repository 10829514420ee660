"""Circuit discovery against circuits known by construction: the tracr-compiled programs shipped in
``tests/fixtures/circuits/`` (their true edges read off the weights), the minimal noisy-majority transformer, and the
shipped induction model (previous-token head feeding an induction head's key).

Thresholds are the edge ROC AUCs measured by ``examples/circuits/ground_truth.py`` (64 inputs; ``examples/results/
circuits/ground_truth.csv``) rounded down, not widened: with zero ablation every method ranks the true edges first
(AUC >= 0.9; the lowest measured is 0.9375); with patching from resampled inputs the edges that carry the same value
on every input (positions into a previous-token query, tracr's constant ``one`` direction) have no effect and tie with
the false edges, so the AUC is lower (>= 0.75 measured), as ACDC's paper found for random ablation (0.600 on
tracr-proportion). The slow test recompiles the programs with tracr (the ``groundtruth`` extra) and checks them equal
to the fixtures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from interp.analyses.circuit_discovery import discover_circuit, edge_roc_auc
from interp.analyses.circuit_graph import computational_graph
from interp.analyses.circuit_groundtruth import (
    TRACR_PROGRAMS,
    groundtruth_inputs,
    load_groundtruth,
    save_groundtruth,
    weight_edges,
)
from interp.errors import CheckpointError

FIXTURES = Path(__file__).parent / "fixtures" / "circuits"
AUC_ZERO, AUC_PATCH = 0.9, 0.75


@pytest.fixture(scope="module", params=TRACR_PROGRAMS)
def tracr_model(request):
    return load_groundtruth(FIXTURES / f"tracr-{request.param}.safetensors")


def test_fixture_edges_are_the_weights_edges(tracr_model):
    model, meta = tracr_model
    assert weight_edges(model) == meta["true_edges"]
    n_edges = computational_graph(model).n_edges
    assert 0 < len(meta["true_edges"]) < n_edges  # some edges are false: an AUC is defined


@pytest.mark.parametrize("ablation", ["zero", "patch"])
def test_tracr_auc(tracr_model, ablation):
    model, meta = tracr_model
    clean, corrupted, metric = groundtruth_inputs(model, meta, 32, ablation=ablation)
    methods = ("eap", "patching") if meta["program"] in ("shift", "sort") else ("eap", "eap-ig", "patching", "acdc")
    for method in methods:
        c = discover_circuit(model, clean, corrupted=corrupted, ablation=ablation, metric=metric, method=method)
        auc = edge_roc_auc(c, meta["true_edges"])
        assert auc >= (AUC_ZERO if ablation == "zero" else AUC_PATCH), (meta["program"], method, auc)
        assert c.faithfulness == pytest.approx(1.0, abs=0.05) or c.faithfulness > 1.0
        assert set(c.edges) <= set(meta["true_edges"]) or ablation == "zero"  # patching keeps only true edges


def test_minimal_majority_transformer_auc(nm_task):
    from interp.analyses.noisy_majority.corrupt import corrupted_pair
    from interp.analyses.noisy_majority.handbuilt import minimal_majority_transformer

    model = minimal_majority_transformer(nm_task)
    truth = ["input->L0H0.q", "input->L0H0.k", "input->L0H0.v", "L0H0->logits"]
    clean, corr = corrupted_pair(nm_task, 32, n_digits=20)
    # zero ablation: the four true edges rank above the input's direct path (AUC 1)
    for method in ("eap", "patching"):
        c = discover_circuit(model, clean, ablation="zero", method=method, curve_points=0, top_n=4)
        assert edge_roc_auc(c, truth) == 1.0
    # patching from flipped inputs: the query at '=' is the same token in both runs, so input->q ties with the
    # false edge (AUC 3.5 / 4); the key and value paths and the head's output are the circuit
    c = discover_circuit(model, clean, corrupted=corr, method="patching", curve_points=0, top_n=3)
    assert edge_roc_auc(c, truth) == 0.875
    assert set(c.edges) == {"input->L0H0.k", "input->L0H0.v", "L0H0->logits"}


def test_induction_circuit_found_in_the_shipped_model():
    """The shipped two-layer model: the previous-token head (layer 0) -> induction head's key edge is kept."""
    import interp
    from interp.analyses.pattern_scores import head_scores
    from interp.analyses.repeated_tokens.corrupt import corrupted_pair
    from interp.analyses.repeated_tokens.probe import probe_tokens

    ck = interp.load_checkpoint("repeated-tokens")
    scores = head_scores(ck.model, probe_tokens(ck.task, 32))
    p, i = scores.best("prev_token", 0), scores.best("induction", 1)
    edge = f"L{p[0]}H{p[1]}->L{i[0]}H{i[1]}.k"
    clean, corr = corrupted_pair(ck.task, 16, kind="key")
    for method in ("eap", "patching"):
        c = discover_circuit(ck.model, clean, corrupted=corr, method=method, curve_points=8)
        assert edge in c.edges, (method, c.edges)
        assert c.faithfulness >= 0.9


def test_groundtruth_file_round_trip_and_bad_file(tmp_path, tracr_model):
    model, meta = tracr_model
    path = save_groundtruth(model, tmp_path / "m.safetensors", meta)
    again, meta2 = load_groundtruth(path)
    assert meta2 == meta
    ids = torch.tensor([[0, 1, 2, 1]]) % model.cfg.d_vocab
    torch.testing.assert_close(again(ids), model(ids))
    (tmp_path / "bad.safetensors").write_bytes(b"not a file")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_groundtruth(tmp_path / "bad.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("name", TRACR_PROGRAMS)
def test_tracr_recompiles_to_the_fixtures(name):
    pytest.importorskip("tracr", reason="tracr is not installed: pip install -e '.[groundtruth]'")
    from interp.analyses.circuit_groundtruth import compile_tracr

    model, meta = compile_tracr(name)  # also checks the converted model's outputs equal tracr's own
    shipped, shipped_meta = load_groundtruth(FIXTURES / f"tracr-{name}.safetensors")
    assert meta == shipped_meta
    for k, v in shipped.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v, atol=1e-6, rtol=0)
