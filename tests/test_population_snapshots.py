"""Snapshots of populations and sweeps: a population writes each model's snapshots as its solo run does (same files,
same weights to float tolerance, same metadata), a population interrupted mid-snapshot and resumed writes every
snapshot of the uninterrupted one, and a sweep records its snapshots so that a resume keeps writing them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from interp.checkpoint import read_metadata
from interp.population import seed_population, train_population
from interp.tasks import load_checkpoint
from interp.training import snapshot_directory, train


def _snapshots(out: Path) -> list[Path]:
    return sorted(snapshot_directory(out).glob("epoch-*.safetensors"))


def _same_snapshots(a: Path, b: Path, atol: float) -> None:
    """The snapshots of checkpoints ``a`` and ``b``: the same epochs, weights within ``atol`` (exactly equal for
    0), the same epoch, seed and config, history records within 1e-5."""
    sa, sb = _snapshots(a), _snapshots(b)
    assert [p.name for p in sa] == [p.name for p in sb] and sa
    for pa, pb in zip(sa, sb):
        wa, wb = load_file(pa), load_file(pb)
        assert set(wa) == set(wb)
        for name in wa:
            if atol == 0:
                assert torch.equal(wa[name], wb[name]), (pa.name, name)
            else:
                torch.testing.assert_close(wa[name], wb[name], atol=atol, rtol=0, msg=f"{pa.name} {name}")
        ma, mb = read_metadata(pa)["training"], read_metadata(pb)["training"]
        assert {k: ma[k] for k in ("epoch", "seed", "config")} == {k: mb[k] for k in ("epoch", "seed", "config")}
        assert set(ma["record"]) == set(mb["record"])
        for k, v in ma["record"].items():
            assert v == pytest.approx(mb["record"][k], abs=1e-5), k
        load_checkpoint(pa, device="cpu")  # an ordinary checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("dropout_at", ["attention", "embedding+attention"])
def test_population_snapshots_equal_the_solo_runs(tmp_path, tiny_task, tiny_spec, tiny_cfg, dropout_at):
    """Each model of a population writes the snapshots its solo run writes: weights within 2e-5 (the tolerance of
    the populations-equal-solo-runs tests), metadata equal (history within 1e-5)."""
    cfg = tiny_cfg(epochs=4, dropout_at=dropout_at)
    specs, cfgs = seed_population(tiny_task, tiny_spec, cfg, [0, 1])
    outs = [tmp_path / f"pop{s}.safetensors" for s in (0, 1)]
    train_population(tiny_task, specs, cfgs, outs, device="cpu", progress=False, snapshot_every=2)
    for sp, c, out in zip(specs, cfgs, outs):
        solo = tmp_path / f"solo{c.seed}.safetensors"
        train(tiny_task, sp, c, solo, device="cpu", progress=False, snapshot_every=2)
        assert [p.name for p in _snapshots(out)] == ["epoch-000002.safetensors", "epoch-000004.safetensors"]
        _same_snapshots(out, solo, atol=2e-5)


def test_population_interrupted_mid_snapshot_resumes_to_the_same_snapshots(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """Stopped after writing one model's snapshot of epoch 4 (its resume file is from epoch 3), the population
    continues from epoch 3, replays epoch 4 and rewrites that snapshot: every snapshot equals, bit for bit, those of
    an uninterrupted population."""
    from interp.population import _Population

    cfg = tiny_cfg(epochs=6, dropout_at="attention", save_every=3)
    specs, cfgs = seed_population(tiny_task, tiny_spec, cfg, [0, 1])
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    kw = dict(device="cpu", progress=False, snapshot_every=2)
    train_population(tiny_task, specs, cfgs, [whole / f"m{s}.safetensors" for s in (0, 1)], **kw)

    class Stop(Exception):
        pass

    real = _Population.write_snapshot

    def stop_after_first_of_epoch_4(self, k, path):
        real(self, k, path)
        if self.epoch == 4:
            raise Stop

    outs = [cut / f"m{s}.safetensors" for s in (0, 1)]
    resume = cut / "pop.resume"
    _Population.write_snapshot = stop_after_first_of_epoch_4
    try:
        with pytest.raises(Stop):
            train_population(tiny_task, specs, cfgs, outs, resume_file=resume, **kw)
    finally:
        _Population.write_snapshot = real
    assert resume.is_file() and [len(_snapshots(o)) for o in outs] == [2, 1]
    train_population(tiny_task, specs, cfgs, outs, resume_file=resume, **kw)
    for s in (0, 1):
        _same_snapshots(cut / f"m{s}.safetensors", whole / f"m{s}.safetensors", atol=0)


def test_sweep_records_snapshots_and_a_resume_keeps_writing_them(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    from interp.app.sweeps import resume_sweeps, run_sweep
    from interp.sweep_directory import read_plans

    cfg = tiny_cfg(epochs=2, dropout_at="attention")
    run_sweep(tiny_task, tiny_spec, cfg, [0, 1], {}, tmp_path, device="cpu", progress=False, snapshot_every=1)
    (plan,) = read_plans(tmp_path)
    assert plan["snapshot_every"] == 1
    runs = sorted((tmp_path / "runs").glob("*.safetensors"))
    assert len(runs) == 2 and all(len(_snapshots(r)) == 2 for r in runs)
    first = {p.name: load_file(p) for p in _snapshots(runs[0])}
    for p in _snapshots(runs[0]):  # a run lost with its snapshots: the resume trains it again, with snapshots
        p.unlink()
    runs[0].unlink()
    resume_sweeps(tmp_path, device="cpu", progress=False)
    again = {p.name: load_file(p) for p in _snapshots(runs[0])}
    assert list(again) == list(first)
    for name, weights in first.items():
        for k, w in weights.items():
            torch.testing.assert_close(again[name][k], w, atol=2e-5, rtol=0)
    # the same sweep without snapshots replaces the plan's entry (one plan per set of runs)
    run_sweep(tiny_task, tiny_spec, cfg, [0, 1], {}, tmp_path, device="cpu", progress=False)
    (plan,) = read_plans(tmp_path)
    assert "snapshot_every" not in plan


def test_cli_sweep_snapshots_beyond_the_runs_are_refused_before_training(tmp_path, capsys):
    from interp.app.cli import main

    out = tmp_path / "s"
    rc = main(["sweep", "noisy-majority", "--seeds", "0", "--epochs", "2", "--snapshots", "10", "--out", str(out)])
    assert rc == 1 and "--snapshots 10" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("bad", [0, True, 3])
def test_a_bad_snapshot_every_is_refused_before_anything_is_written(tmp_path, tiny_task, tiny_spec, tiny_cfg, bad):
    """One check for the solo run, the population and the sweep (the library, not only the CLI): 0, a bool or more
    than the 2 epochs is a ConfigError before a checkpoint, a snapshot folder, a sweep directory or a change to
    sweep.json is written; a resume asked for 0 snapshots is refused too, not read as "the plan's". (A str is the
    same check's error; the test run's type checker refuses it at these functions' annotations first.)"""
    from interp.app.sweeps import resume_sweeps, run_sweep
    from interp.configs import check_snapshot_every
    from interp.errors import ConfigError
    from interp.sweep_directory import PLAN

    with pytest.raises(ConfigError, match=r"positive integer \(epochs between snapshots\), got '2'"):
        check_snapshot_every("2", 2)

    cfg = tiny_cfg(epochs=2, dropout_at="attention")
    kw = dict(device="cpu", progress=False, snapshot_every=bad)
    expected = "at most 2" if bad == 3 else r"snapshot_every must be None or a positive integer"
    out = tmp_path / "solo.safetensors"
    with pytest.raises(ConfigError, match=expected):
        train(tiny_task, tiny_spec, cfg, out, **kw)
    specs, cfgs = seed_population(tiny_task, tiny_spec, cfg, [0, 1])
    outs = [tmp_path / f"pop{s}.safetensors" for s in (0, 1)]
    with pytest.raises(ConfigError, match=expected):
        train_population(tiny_task, specs, cfgs, outs, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    fresh = tmp_path / "fresh"
    with pytest.raises(ConfigError, match=expected):
        run_sweep(tiny_task, tiny_spec, cfg, [0], {}, fresh, **kw)
    assert not fresh.exists()
    swept = tmp_path / "swept"
    run_sweep(tiny_task, tiny_spec, cfg, [0], {}, swept, device="cpu", progress=False)
    plan = (swept / PLAN).read_text()
    with pytest.raises(ConfigError, match=expected):
        run_sweep(tiny_task, tiny_spec, cfg, [0, 1], {}, swept, **kw)
    if bad == 0:
        with pytest.raises(ConfigError, match=expected):
            resume_sweeps(swept, snapshot_every=0, device="cpu", progress=False)
    assert (swept / PLAN).read_text() == plan and len(list((swept / "runs").glob("*.safetensors"))) == 1
