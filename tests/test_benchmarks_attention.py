"""Smoke tests of benchmarks/attention.py at tiny sizes, in this process: every path is measured and written to the
JSON with finite positive numbers, the fast paths are checked against the hooked ones, the budget skips longer
lengths, and the slope and crossover summaries say what they should. Behaviour only: no timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_attention", ROOT / "benchmarks" / "attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    yield module
    torch.set_num_threads(threads)  # main() sets --threads for the whole process


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_every_path_measured_and_written(bench, tmp_path):
    # 256 and 512 tokens: peaks at 128 tokens and fewer are within the resident-set counter's noise (about 0.5 MiB)
    out_file = tmp_path / "attention.json"
    argv = ["--min-len", "256", "--max-len", "512", "--repeats", "1", "--fit-from", "256", "--device", "cpu"]
    out = bench.main([*argv, "--json", str(out_file)])
    written = json.loads(out_file.read_text())
    assert written["paths"].keys() == out["paths"].keys()
    names = {name for name, _, _ in bench.paths(32)}
    assert (
        set(written["paths"])
        == names
        == {
            "softmax hooked",
            "window:32 hooked",
            "window:32 fast",
            "linear:elu hooked",
            "linear:elu fast",
        }
    )
    for name, r in written["paths"].items():
        assert [p["n"] for p in r["points"]] == [256, 512], name
        assert r["skipped"] == {}, name
        for p in r["points"]:
            assert _finite_positive(p["seconds"]) and _finite_positive(p["peak_mib"]), (name, p)
            assert _finite_positive(p["baseline_mib"]), (name, p)
        # the slopes are what the points say (two points: the log-log line through them); no sign is asserted,
        # since a timing under load can fall with n (a loaded CI run measured a negative slope)
        t, m = ([p[k] for p in r["points"]] for k in ("seconds", "peak_mib"))
        assert r["time_slope"] == pytest.approx(math.log(t[1] / t[0]) / math.log(2), rel=1e-9, abs=1e-12), name
        assert r["memory_slope"] == pytest.approx(math.log(m[1] / m[0]) / math.log(2), rel=1e-9, abs=1e-12), name
    assert set(written["checks"]) == {"window:32 fast", "linear:elu fast"}
    for c in written["checks"].values():
        assert c["n"] == 256
        assert 0 <= c["max_abs_diff_logits"] <= 1e-4 and 0 <= c["max_abs_diff_grads"] <= 1e-4
    assert set(written["comparisons"]) == {"window:32", "linear:elu"}
    for comp in written["comparisons"].values():
        assert [r["n"] for r in comp["ratios"]] == [256, 512]
        for r in comp["ratios"]:
            assert _finite_positive(r["time_ratio"]) and _finite_positive(r["memory_ratio"])
        assert comp["crossover"] in (None, 256, 512)


@pytest.mark.slow
def test_budget_skips_longer_lengths(bench):
    out = bench.main(["--min-len", "64", "--max-len", "128", "--repeats", "1", "--budget-s", "0", "--device", "cpu"])
    for name, r in out["paths"].items():
        assert [p["n"] for p in r["points"]] == [64], name
        assert list(r["skipped"]) == ["128"] and "--budget-s" in r["skipped"]["128"], name
        assert r["time_slope"] is None and r["memory_slope"] is None


def test_slope_and_crossover(bench):
    points = [{"n": n, "seconds": 3e-9 * n**2, "peak_mib": 0.5 * n} for n in (256, 512, 1024, 2048)]
    assert bench.slope(points, "seconds", 512) == pytest.approx(2.0)
    assert bench.slope(points, "peak_mib", 512) == pytest.approx(1.0)
    assert bench.slope(points, "seconds", 2048) is None  # one point: no fit
    ratios = [{"n": n, "time_ratio": t} for n, t in ((64, 2.0), (128, 0.9), (256, 1.1), (512, 0.5), (1024, 0.2))]
    assert bench.crossover(ratios) == 512  # faster at every length from 512 on, not from 128
    assert bench.crossover([*ratios, {"n": 2048, "time_ratio": 1.2}]) is None
    assert bench.lengths(64, 300) == [64, 128, 256]
