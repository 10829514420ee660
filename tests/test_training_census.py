"""The census over training (analyses.noisy_majority.training_census): at every snapshot it agrees with a plain
TransformerLens computation of w01 / w02, learned accuracy and test accuracy (1-head and 4-head models), its
run-level story (first good epoch, a good head lost) with hand-made snapshots, and the sweep report shows it only
where runs have snapshots, also from its cache without the checkpoints."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interp.checkpoint import read_metadata
from interp.tasks import load_checkpoint
from interp.training import train
from tests.test_population_snapshots import _snapshots


# -- the census over training against plain TransformerLens ---------------------------------------------------------
def _plain_snapshot(path: Path) -> dict:
    """w01, w02 per head, each head's learned accuracy and the test accuracy of a snapshot, from
    ``run_with_cache`` and hooks alone: the '=' row of each head's attention pattern, the mean attention per 0, 1
    and 2 before it, the per-sentence ratios' geometric mean; other heads' ``hook_z`` zeroed for learned accuracy."""
    ckpt = load_checkpoint(path, device="cpu")
    model, task = ckpt.model, ckpt.task
    test = task.dataset("test")
    ids = [task.vocab.index[t] for t in ("0", "1", "2")]
    rows = torch.arange(len(test))
    with torch.no_grad():
        logits, cache = model.run_with_cache(test.tokens)
    pattern = cache["pattern", 0][rows, :, test.answer_pos].double()  # [b, head, key]
    before = torch.arange(test.tokens.shape[1])[None] <= test.answer_pos[:, None]
    per_token = []
    for t in ids:
        is_t = (test.tokens == t) & before
        per_token.append((pattern * is_t[:, None]).sum(-1) / is_t.sum(-1, keepdim=True).clamp(min=1))
        per_token[-1][is_t.sum(-1) == 0] = float("nan")
    a0, a1, a2 = per_token

    def geo(r):
        return torch.nanmean(r.log(), 0).exp()

    target = test.targets[rows, test.answer_pos]
    test_acc = float((logits[rows, test.answer_pos].argmax(-1) == target).float().mean())
    H = model.cfg.n_heads
    learned = []
    for h in range(H):

        def keep_h(z, hook, h=h):
            z[:, :, [i for i in range(H) if i != h]] = 0
            return z

        with torch.no_grad():
            out = model.run_with_hooks(test.tokens, fwd_hooks=[("blocks.0.attn.hook_z", keep_h)])
        learned.append(float((out[rows, test.answer_pos].argmax(-1) == target).float().mean()))
    return {"w01": geo(a0 / a1), "w02": geo(a0 / a2), "learned": learned, "test_accuracy": test_acc}


@pytest.fixture(scope="module")
def snapshot_runs(tmp_path_factory, tiny_task, tiny_spec, tiny_cfg):
    """A 1-head d = 2 and a 4-head d = 8 run, 4 epochs, a snapshot every 2."""
    d = tmp_path_factory.mktemp("snapruns")
    cfg = tiny_cfg(epochs=4, dropout_at="attention")
    outs = []
    for spec in (replace(tiny_spec, d_model=2, n_heads=1, d_head=2), tiny_spec):
        out = d / f"h{spec.n_heads}.safetensors"
        train(tiny_task, spec, cfg, out, device="cpu", progress=False, snapshot_every=2)
        outs.append(out)
    return outs


@pytest.mark.slow
def test_census_over_training_against_plain_transformer_lens(snapshot_runs):
    from interp.analyses.noisy_majority.census import run_heads
    from interp.analyses.noisy_majority.training_census import TrainingCensus, census_over_training

    tc = census_over_training(snapshot_runs, progress=False)
    assert [len(r["snapshots"]) for r in tc.runs] == [2, 2] and [r["n_heads"] for r in tc.runs] == [1, 4]
    for run, out in zip(tc.runs, snapshot_runs):
        assert run["test_accuracy"] == read_metadata(out)["training"]["accuracy"]["test"]
        for snap, path in zip(run["snapshots"], _snapshots(out)):
            plain = _plain_snapshot(path)
            assert snap["epoch"] == int(path.stem.split("-")[1])
            assert snap["test_accuracy"] == pytest.approx(plain["test_accuracy"], abs=1e-9)
            # tiny_task's 128 test sentences are under the census's 500: learned accuracy on the whole split
            ends = run_heads(load_checkpoint(path, device="cpu"))["heads"]
            for h, head in enumerate(snap["heads"]):
                assert head["w01"] == pytest.approx(float(plain["w01"][h]), rel=1e-4)
                assert head["w02"] == pytest.approx(float(plain["w02"][h]), rel=1e-4)
                assert head["learned_accuracy"] == pytest.approx(plain["learned"][h], abs=1e-9)
                # separation accuracy and grade: those of the end-state census of the same checkpoint
                assert {k: head[k] for k in ("separation_accuracy", "grade")} == {
                    k: ends[h][k] for k in ("separation_accuracy", "grade")
                }
                assert (head["grade"] == "good") == (head["separation_accuracy"] >= 0.95)
        good = [any(h["grade"] == "good" for h in s["heads"]) for s in run["snapshots"]]
        first = next((s["epoch"] for s, g in zip(run["snapshots"], good) if g), None)
        assert run["first_good_epoch"] == first and run["lost_good"] == (any(good) and not good[-1])
        snaps = run["snapshots"]
        used = [any(h["grade"] == "good" and h["learned_accuracy"] >= 0.95 for h in s["heads"]) for s in snaps]
        assert run["first_used_epoch"] == next((s["epoch"] for s, u in zip(snaps, used) if u), None)
        assert run["outcome"] == ("success" if run["test_accuracy"] >= 1 else "failure")
    d = tc.to_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d and len(d["summary"]) >= 1
    for layout in (d, json.loads(json.dumps(tc.to_dict(series=True)))):  # both layouts read back to the same result
        again = TrainingCensus.from_dict(layout)
        assert again.summary() == tc.summary() and again.rows() == tc.rows()
    fig = tc.figure()
    assert len(fig.data) == 4 * (1 + 4)  # one path and three curves per head
    assert "census over training of 2 runs" in repr(tc)


def test_census_over_training_takes_one_checkpoint_and_refuses_what_is_not_a_source(snapshot_runs, tmp_path):
    """A checkpoint path (str or Path) is one run, as a list of it; a path that is neither a directory nor a file,
    a list holding something that is not a path, or a number is one ConfigError naming the source."""
    from interp.analyses.noisy_majority.training_census import census_over_training
    from interp.errors import ConfigError

    one = census_over_training([snapshot_runs[0]], progress=False).rows()
    assert len(one) == 1
    assert census_over_training(snapshot_runs[0], progress=False).rows() == one
    assert census_over_training(str(snapshot_runs[0]), progress=False).rows() == one
    missing = str(tmp_path / "no-such-sweep")
    with pytest.raises(ConfigError, match=rf"source '{missing}' is neither a directory nor a file; expected a sweep"):
        census_over_training(missing, progress=False)
    with pytest.raises(ConfigError, match=r"source holds 3, not a checkpoint path"):
        census_over_training([snapshot_runs[0], 3], progress=False)
    with pytest.raises(ConfigError, match=r"source 3 \(int\) is not a path; expected a sweep directory"):
        census_over_training(3, progress=False)


def test_snapshots_of_a_checkpoint_outside_runs_are_found(snapshot_runs, tmp_path):
    """A row naming its checkpoint by an absolute path outside DIR/runs (rows of older sweeps): has_snapshots sees
    its snapshots, and the census over the directory takes them, as checkpoint_path finds the checkpoint."""
    from interp.analyses.noisy_majority.training_census import census_over_training, has_snapshots
    from interp.sweep_directory import write_results

    assert not has_snapshots(tmp_path)
    accuracy = read_metadata(snapshot_runs[0])["training"]["accuracy"]
    write_results(
        tmp_path, [{"name": "elsewhere", "checkpoint": str(snapshot_runs[0].resolve()), "accuracy": accuracy}]
    )
    assert not (tmp_path / "runs").exists() and has_snapshots(tmp_path)
    tc = census_over_training(tmp_path, progress=False)
    assert [len(r["snapshots"]) for r in tc.runs] == [2] and tc.without_snapshots == []


def test_lost_good_heads_and_the_summary_by_hand():
    """The run-level story from hand-made snapshots: the first good epoch, a good head lost, medians."""
    from interp.analyses.noisy_majority.training_census import TrainingCensus, _summarise

    def snap(epoch, sep, w01, w02, acc):
        grade = "good" if sep >= 0.95 else "bad"
        head = {"head": "L0H0", "w01": w01, "w02": w02, "separation_accuracy": sep, "learned_accuracy": acc}
        return {"epoch": epoch, "test_accuracy": acc, "heads": [{**head, "grade": grade}]}

    base = {"configuration": "all runs", "d_model": 2, "n_heads": 1, "normalization": None, "kept_epoch": 30}
    lost = _summarise(
        {
            **base,
            "name": "a",
            "seed": 0,
            "test_accuracy": 0.6,
            "snapshots": [snap(20, 0.97, 1, 9, 0.9), snap(10, 0.5, 1, 1, 0.5), snap(30, 0.6, 0.1, 0.01, 0.6)],
        }
    )
    assert [s["epoch"] for s in lost["snapshots"]] == [10, 20, 30]
    assert lost["first_good_epoch"] == 20 and lost["lost_good"] and lost["outcome"] == "failure"
    assert lost["first_used_epoch"] is None and not lost["lost_used"]  # good by probe, learned accuracy 0.9
    kept = _summarise(
        {
            **base,
            "name": "b",
            "seed": 1,
            "test_accuracy": 1.0,
            "snapshots": [snap(10, 0.99, 1, 50, 1.0), snap(20, 1.0, 1, 60, 1.0)],
        }
    )
    assert kept["first_good_epoch"] == 10 and not kept["lost_good"] and kept["first_perfect_epoch"] == 10
    assert kept["first_used_epoch"] == 10
    tc = TrainingCensus([lost, kept])
    s = {e["outcome"]: e for e in tc.summary()}
    assert s["failure"]["lost_good"] == 1 and s["success"]["ever_good"] == 1
    assert s["failure"]["w02_last"] == 0.01 and s["success"]["w02_first"] == 50
    assert not math.isnan(tc.ratios_over_epochs()[0]["w01"])


def test_a_halving_run_left_with_more_than_one_head_is_a_failure_as_table_1_scores_it(tmp_path):
    """At 100% test accuracy, a halving run that did not end with one head is a failure, as
    analyses.populations.scores scores it 0; one that did, and a normal run, are successes."""
    from interp.analyses.noisy_majority.training_census import _directory_runs, _summarise
    from interp.analyses.populations import scores
    from interp.sweep_directory import load_results, write_results

    def row(name, halving=None):
        return {"name": name, "checkpoint": f"runs/{name}.safetensors", "accuracy": {"test": 1.0}, **(halving or {})}

    write_results(
        tmp_path,
        [
            row("two-heads-left", {"halving_result": {"success": False, "active": [0, 1]}}),
            row("one-head-left", {"halving_result": {"success": True, "active": [0]}}),
            row("normal"),
        ],
    )
    outcomes = [_summarise({**run, "snapshots": []})["outcome"] for run, _ in _directory_runs(tmp_path)]
    assert outcomes == ["failure", "success", "success"]
    assert outcomes == ["success" if s >= 1 else "failure" for s in scores(load_results(tmp_path))]


def test_the_training_census_docstring_names_every_key_a_run_gets():
    """Each key the run-level story adds (first_used_epoch and lost_used included) is named in TrainingCensus."""
    from interp.analyses.noisy_majority.training_census import TrainingCensus, _summarise

    run = {"test_accuracy": 1.0, "snapshots": []}
    for key in set(_summarise(run)) - set(run):
        assert f"``{key}``" in TrainingCensus.__doc__, key


@pytest.mark.slow
def test_sweep_report_shows_heads_over_training_only_with_snapshots(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    from interp.analyses.noisy_majority.training_census import CACHE
    from interp.app.report import build_sweep_report
    from interp.app.sweeps import run_sweep

    small = replace(tiny_spec, d_model=2, n_heads=1, d_head=2)
    cfg = tiny_cfg(epochs=2, dropout_at="attention")
    plain, snapped = tmp_path / "plain", tmp_path / "snapped"
    run_sweep(tiny_task, small, cfg, [0, 1], {}, plain, device="cpu", progress=False)
    assert "Heads over training" not in build_sweep_report(plain, progress=False).html()
    run_sweep(tiny_task, small, cfg, [0, 1], {}, snapped, device="cpu", progress=False, snapshot_every=1)
    page = build_sweep_report(snapped, progress=False).html()
    assert "Heads over training" in page and "2 runs with snapshots, 4 snapshots" in page
    assert (snapped / CACHE).is_file()
    # shipped without checkpoints: the cache rebuilds the section
    for p in (snapped / "runs").rglob("*.safetensors"):
        p.unlink()
    page = build_sweep_report(snapped, progress=False).html()
    assert "2 runs with snapshots, 4 snapshots" in page


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "runs", "heads", "snapshots"),
    [("census_over_training_d2.json", 80, 1, 30), ("census_over_training_adam_d8.json", 100, 4, 18)],
)
def test_the_shipped_census_over_training_reads_back_to_its_numbers(name, runs, heads, snapshots):
    """The shipped censuses over training (examples/results/seed_regime/, 4 significant digits): from_dict gives back
    each summary (medians within the rounding) and its figure, without the checkpoints."""
    from interp.analyses.noisy_majority.training_census import TrainingCensus

    path = Path(__file__).resolve().parents[1] / "examples/results/seed_regime" / name
    d = json.loads(path.read_text())
    tc = TrainingCensus.from_dict(d)
    assert len(tc.runs) == runs and all(len(r["snapshots"]) == snapshots for r in tc.runs)
    for got, want in zip(tc.summary(), d["summary"], strict=True):
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert got[k] == (pytest.approx(v, rel=2e-3) if isinstance(v, float) else v), k
    assert len(tc.figure().data) == 4 * runs * heads  # four traces per head


def test_a_damaged_census_cache_is_refused_naming_the_line(tmp_path):
    """Both censuses read their per-run caches through one reader: a line that is not JSON is one clear error."""
    from interp.analyses.noisy_majority.census import CENSUS, read_census
    from interp.errors import ConfigError

    (tmp_path / CENSUS).write_text('{"name": "a", "heads": []}\n{not json\n')
    with pytest.raises(ConfigError, match=rf"{CENSUS}:2 is not a JSON row"):
        read_census(tmp_path)
    (tmp_path / CENSUS).write_text('{"name": "a", "heads": []}\n')
    assert list(read_census(tmp_path)) == ["a"]


@pytest.mark.parametrize("line", ["[1, 2]", '{"x": 1}', '"a"', '{"name": [1]}'])
def test_a_cache_line_that_is_json_but_not_a_named_row_is_refused_naming_the_line(tmp_path, line):
    """Valid JSON that is not an object with a name is the same one clear error as a line that is not JSON."""
    from interp.errors import ConfigError
    from interp.files import read_named_rows

    path = tmp_path / "cache.jsonl"
    path.write_text(f'{{"name": "a"}}\n{line}\n')
    with pytest.raises(ConfigError, match=r'cache\.jsonl:2 is not a JSON row \(expected an object with a "name"'):
        read_named_rows(path)
