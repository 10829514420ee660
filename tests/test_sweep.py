"""Sweeps (interp.sweeps, `interp sweep`, `interp table`): one checkpoint and one row per run, batched groups equal to
solo runs, a rerun skips finished runs, a sweep killed with SIGKILL ends, when rerun, with the same table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from interp.analyses.populations import population_table, wilson_interval
from interp.app.sweeps import parse_grid, parse_seeds, run_sweep
from interp.errors import ConfigError
from interp.sweep_directory import read_results
from interp.training import train

ROOT = Path(__file__).resolve().parents[1]


def test_parsing():
    assert parse_seeds("0..3") == [0, 1, 2, 3] and parse_seeds("5,1,5") == [1, 5]
    assert parse_grid(["d_model=8,32", "lr=1e-3,3e-3", "dropout_at=attention"]) == {
        "d_model": [8, 32],
        "lr": [0.001, 0.003],
        "dropout_at": ["attention"],
    }
    for bad in ("a..b", "", "-1"):
        with pytest.raises(ConfigError, match="seeds"):
            parse_seeds(bad)
    with pytest.raises(ConfigError, match="not a model or training option"):
        parse_grid(["colour=red"])


def test_wilson_interval_known_values():
    # Wilson 95% intervals, from the closed form (e.g. Brown, Cai & DasGupta 2001): 0/10 and 10/10 and 5/10
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(10, 10)
    assert lo == pytest.approx(0.7225, abs=1e-4) and hi == 1.0
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)


@pytest.mark.slow
def test_sweep_rows_equal_solo_runs_and_rerun_skips(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    cfg = tiny_cfg(epochs=2)
    rows = run_sweep(
        tiny_task, tiny_spec, cfg, [0, 1], {"lr": [1e-2, 3e-3]}, tmp_path, group=2, device="cpu", progress=False
    )
    names = [r["name"] for r in rows]  # task, grid values, seed, then the hash of the whole configuration
    assert [n.rsplit("-", 1)[0] for n in names] == [
        "noisy-majority-lr0.01-seed0",
        "noisy-majority-lr0.01-seed1",
        "noisy-majority-lr0.003-seed0",
        "noisy-majority-lr0.003-seed1",
    ]
    assert names[0][-8:] == names[1][-8:] != names[2][-8:] == names[3][-8:]  # one configuration, one hash
    assert read_results(tmp_path) == rows
    assert all(r["population"]["size"] == 2 for r in rows)  # lr varies within a batch: 4 runs in 2 groups of 2
    solo = train(
        tiny_task,
        tiny_spec.__class__(**{**tiny_spec.to_dict(), "init_seed": 1}),
        tiny_cfg(epochs=2, lr=3e-3, seed=1),
        tmp_path / "solo.safetensors",
        device="cpu",
        progress=False,
    )
    got = load_file(tmp_path / rows[3]["checkpoint"])
    want = load_file(tmp_path / "solo.safetensors")
    for k in got:
        if got[k].is_floating_point():
            torch.testing.assert_close(got[k], want[k], atol=2e-5, rtol=0, equal_nan=True)
    assert rows[3]["accuracy"] == solo["accuracy"]
    # a rerun trains nothing; a lost row is recovered from its checkpoint; a missing checkpoint is retrained
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").iterdir()}
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    (tmp_path / rows[0]["checkpoint"]).unlink()
    again = run_sweep(
        tiny_task, tiny_spec, cfg, [0, 1], {"lr": [1e-2, 3e-3]}, tmp_path, group=2, device="cpu", progress=False
    )
    assert [r["name"] for r in again] == [r["name"] for r in rows]
    assert [r["accuracy"] for r in again] == [r["accuracy"] for r in rows]
    for p, t in stamp.items():
        if p.name != Path(rows[0]["checkpoint"]).name:
            assert p.stat().st_mtime_ns == t, f"{p.name} was trained again"
    table = population_table(again)
    assert [t["lr"] for t in table] == [0.01, 0.003] and all(t["runs"] == 2 for t in table)


@pytest.mark.slow
def test_sweep_killed_with_sigkill_resumes_to_the_same_table(tmp_path, tiny_task, capsys):
    # 8 runs of 4 epochs, killed as soon as the first row is written: the other 7 cannot finish within one poll
    args = [
        sys.executable,
        "-m",
        "interp.app",
        "sweep",
        "noisy-majority",
        "--seeds",
        "0..7",
        "--group",
        "1",
        "--d-model",
        "8",
        "--n-heads",
        "4",
        "--d-head",
        "2",
        "--epochs",
        "4",
        "--batch-size",
        "64",
        "--lr",
        "0.01",
        "--threads",
        "1",
        "--quiet",
    ]
    for k in ("train_size", "val_size", "test_size", "train_lengths", "val_lengths", "test_lengths"):
        args += ["--set", f"{k}={json.dumps(tiny_task.params()[k]).replace(' ', '')}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    killed = tmp_path / "killed"
    proc = subprocess.Popen(args + ["--out", str(killed)], env=env, cwd=tmp_path, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and len(read_results(killed) if (killed / "results.jsonl").exists() else []) < 1:
        assert proc.poll() is None, proc.stderr.read().decode()[-800:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    done_before = len(read_results(killed))
    assert 1 <= done_before < 8
    assert subprocess.run(args + ["--out", str(killed)], env=env, cwd=tmp_path).returncode == 0
    from interp.app.cli import main
    from interp.model import ModelSpec
    from interp.training import TrainConfig

    whole = tmp_path / "whole"  # the same sweep, uninterrupted, in this process
    spec = ModelSpec(**{**tiny_task.default_spec(), "d_model": 8, "n_heads": 4, "d_head": 2})
    run_sweep(
        tiny_task,
        spec,
        TrainConfig(epochs=4, batch_size=64, lr=0.01),
        list(range(8)),
        {},
        whole,
        group=1,
        device="cpu",
        progress=False,
    )
    a, b = read_results(killed), read_results(whole)

    def strip(rows):  # wall times: the row's, and the population's by part of the run
        return [
            {
                **{k: v for k, v in r.items() if k not in ("checkpoint", "wall_seconds")},
                "population": r["population"] and {k: v for k, v in r["population"].items() if k != "seconds"},
            }
            for r in rows
        ]

    assert strip(a) == strip(b)
    capsys.readouterr()
    assert main(["table", str(killed), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table[0]["runs"] == 8 and 0 <= table[0]["share_test_at_1_low"] <= table[0]["share_test_at_1_high"] <= 1


@pytest.mark.slow
def test_ray_backend_on_a_real_local_cluster_equals_local(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """Groups as Ray tasks on a real local Ray instance (2 CPUs): the same rows and weights as the local backend."""
    ray = pytest.importorskip("ray")
    cfg = tiny_cfg(epochs=2)
    local = run_sweep(
        tiny_task,
        tiny_spec,
        cfg,
        [0, 1],
        {"lr": [1e-2, 3e-3]},
        tmp_path / "local",
        group=1,
        device="cpu",
        progress=False,
        threads=1,
    )
    before = torch.get_num_threads()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_sweep(
            tiny_task,
            tiny_spec,
            cfg,
            [0, 1],
            {"lr": [1e-2, 3e-3]},
            tmp_path / "ray",
            group=1,
            device="cpu",
            progress=False,
            backend="ray",
            threads=1,
        )
    finally:
        ray.shutdown()
        torch.set_num_threads(before)
    assert [r["name"] for r in remote] == [r["name"] for r in local]
    assert [r["accuracy"] for r in remote] == [r["accuracy"] for r in local]
    assert read_results(tmp_path / "ray") == remote
    for a, b in zip(local, remote):
        wa, wb = load_file(tmp_path / "local" / a["checkpoint"]), load_file(tmp_path / "ray" / b["checkpoint"])
        for k in wa:
            if wa[k].is_floating_point():
                torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=0, equal_nan=True)


@pytest.mark.slow
def test_halving_runs_in_a_sweep_and_failures_score_zero(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    from interp.analyses.halving import scorer

    cfg = tiny_cfg(epochs=3, halving="random", halving_threshold=0.01)
    rows = run_sweep(
        tiny_task,
        tiny_spec,
        cfg,
        [0],
        {"halving": ["random", "learned"]},
        tmp_path,
        group=4,
        device="cpu",
        progress=False,
        scorer_for=scorer,
    )
    assert [r["halving"] for r in rows] == ["random", "learned"]
    assert all(r["halving_result"]["success"] for r in rows)  # 4 heads -> 2 -> 1 in three epochs
    assert [r["strategy"] for r in rows] == ["random", "learned"] and [r["final_active_heads"] for r in rows] == [1, 1]
    from interp.analyses.noisy_majority.census import census

    heads = census(tmp_path, train_size=100, test_size=50, progress=False).heads()
    assert [sum(h["active"] for h in heads if h["name"] == r["name"]) for r in rows] == [1, 1]
    assert all(h["separation_accuracy"] <= 0.75 for h in heads if not h["active"])  # masked heads output exactly 0
    from interp.app.report import build_sweep_report

    page = build_sweep_report(tmp_path, progress=False).html()  # Figure 11: the strategies of one shape together
    assert "the halving strategies on [0.98, 1]" in page and "random" in page and "learned" in page
    failed = [
        {
            **rows[0],
            "halving_result": {**rows[0]["halving_result"], "success": False},
            "accuracy": {"test": 1.0},
            "metrics": {"test": {"accuracy": 1.0}},
        }
    ]
    assert population_table(failed)[0]["mean_test_accuracy"] == 0.0  # the seed: a run left with > 1 head scores 0
    from interp.population import seed_population, train_population

    specs, cfgs = seed_population(tiny_task, tiny_spec, cfg.__class__(**{**cfg.__dict__, "halving": "svc"}), [1])
    with pytest.raises(ConfigError, match="head scorer"):  # the core trainer cannot score heads by itself
        train_population(tiny_task, specs, cfgs, [tmp_path / "x.safetensors"], device="cpu", progress=False)


@pytest.mark.slow
def test_sigterm_stops_a_ray_sweep_and_its_cluster(tmp_path):
    """Before: Ray's own SIGTERM handler (installed by ``ray.init``) replaced the command's, so SIGTERM printed a
    stack dump and exit 1. Now the command keeps its handler: one line, exit 130, and the local cluster it started
    (GCS, raylet, workers) is stopped with it. (While ``ray.init`` itself runs, Ray's handler is in charge: the
    signal is sent once a worker runs a group.)"""
    pytest.importorskip("ray")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "interp.app", "sweep", "noisy-majority", "--seeds", "0..3", "--batch", "1"]
    command += ["--epochs", "400", "--backend", "ray", "--quiet", "--out", str(tmp_path / "sweep")]
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)

    def session(name: str, *flags: str) -> list[str]:
        found = subprocess.run(["pgrep", *flags, "-s", str(proc.pid), name], capture_output=True, text=True)
        return found.stdout.split()

    try:
        # signalled once a worker runs a group: tasks are submitted only after ray.init has returned and the
        # command's handler is back ("Started a local Ray instance" is printed inside ray.init, which on a loaded
        # machine went on for seconds after it, Ray's handler in charge: an abort, exit -6)
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None and not session("ray::_ray_train_group", "-f"):
            time.sleep(0.5)
        assert proc.poll() is None and session("ray::_ray_train_group", "-f"), log.read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        err = log.read_text()
        time.sleep(3)
        left = session(".")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interp: interrupted" and "SIGTERM received" not in err
    assert not left, f"processes of the sweep still alive: {left}"
