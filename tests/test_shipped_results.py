"""The shipped population results (examples/results/): `interp table` prints Table 1 from them with intervals, and
its numbers are the counts of the shipped rows (recounted here by a plain loop, independently of population_table)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLE1 = ROOT / "examples" / "results" / "table1"
CELLS = (
    {(32, 16, s) for s in ("normal", "svc", "shapley-svc", "mask-all-but-one")}
    | {(8, 4, s) for s in ("normal", "svc", "shapley-svc", "mask-all-but-one")}
    | {(2, 1, "normal")}
)


def _interp_table(directory, *flags):
    """`interp table DIRECTORY FLAGS` in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "interp.app", "table", str(directory), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _rows():
    return [json.loads(line) for line in (TABLE1 / "results.jsonl").read_text().splitlines() if line.strip()]


def test_shipped_table1_has_every_cell_with_the_same_number_of_runs():
    rows = _rows()
    by_cell: dict[tuple, list] = {}
    for r in rows:
        by_cell.setdefault((r["d_model"], r["n_heads"], r["strategy"]), []).append(r)
    assert set(by_cell) == CELLS
    assert len({len(v) for v in by_cell.values()}) == 1  # the same number of runs per cell
    assert all(r["epochs"] == 900 and r["dropout_at"] == "attention" for r in rows)


def test_interp_table_prints_table1_from_the_shipped_results():
    out = _interp_table(TABLE1, "--json")
    assert out.returncode == 0, out.stderr[-800:]
    table = json.loads(out.stdout)
    assert {(t["d_model"], t["n_heads"], t["strategy"]) for t in table} == CELLS
    rows = _rows()
    for t in table:  # recount: a halving run left with more than one head scores 0 (Fraknói 2024, Table 1)
        cell = [
            r
            for r in rows
            if (r["d_model"], r["n_heads"], r["strategy"]) == (t["d_model"], t["n_heads"], t["strategy"])
        ]
        accs = [
            0.0 if r["strategy"] != "normal" and r["final_active_heads"] != 1 else r["accuracy"]["test"] for r in cell
        ]
        hits = sum(a >= 1.0 for a in accs)
        assert t["runs"] == len(cell) and t["share_test_at_1"] == pytest.approx(hits / len(cell))
        n, p, z = len(cell), hits / len(cell), 1.959963984540054  # Wilson 95%, written out
        centre, half = (
            (p + z * z / (2 * n)) / (1 + z * z / n),
            z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n),
        )
        assert t["share_test_at_1_low"] == pytest.approx(0.0 if hits == 0 else centre - half, abs=1e-12)
        assert t["share_test_at_1_high"] == pytest.approx(1.0 if hits == n else centre + half, abs=1e-12)
    text = _interp_table(TABLE1)
    assert text.returncode == 0 and "shapley-svc" in text.stdout and "[" in text.stdout


def test_status_of_the_shipped_results_says_the_checkpoints_are_not_there(capsys):
    from interp.app.cli import main

    assert main(["sweep", str(TABLE1), "--status"]) == 0
    out = capsys.readouterr().out
    assert f"{len(_rows())} result rows without their checkpoints" in out and "--resume would train them again" in out


def test_shipped_rows_name_their_checkpoints_relative_to_their_directory():
    """No path of the machine that trained them: a shipped table works in any checkout."""
    for path in sorted((ROOT / "examples" / "results").glob("*/results.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            assert row["checkpoint"] == f"runs/{row['name']}.safetensors", (path, row["checkpoint"])


STATS = {"runs", "mean_test_accuracy"}
MEASURED = sorted(
    p.parent
    for area in ("seed_regime", "attention")
    for p in (ROOT / "examples" / "results" / area).glob("*/results.jsonl")
)


@pytest.mark.parametrize("directory", MEASURED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_interp_table_of_each_shipped_measurement_is_a_recount_of_its_rows(directory):
    """Every shipped measurement (the seed-regime hypotheses, the attention-variant questions) is printed by `interp
    table` from its rows; each cell's run count, share at 100% test accuracy and mean are recounted here."""
    out = _interp_table(directory, "--json")
    assert out.returncode == 0, out.stderr[-800:]
    table = json.loads(out.stdout)
    rows = [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines() if line.strip()]
    assert sum(t["runs"] for t in table) == len(rows)
    for t in table:
        keys = [k for k in t if k not in STATS and not k.startswith("share_")]
        cell = [r for r in rows if all(_config_value(r, k) == t[k] for k in keys)]
        accs = [r["accuracy"]["test"] for r in cell]
        assert t["runs"] == len(cell) > 0
        assert t["share_test_at_1"] == pytest.approx(sum(a >= 1.0 for a in accs) / len(cell))
        assert t["mean_test_accuracy"] == pytest.approx(sum(accs) / len(accs), abs=5e-5)


def _config_value(row: dict, key: str):
    """A row's configuration value as the table prints it: task parameters as sorted JSON text, the halving strategy
    ("normal" without one); an option the row predates at its default (what the run did)."""
    from interp.model import ModelSpec
    from interp.options import options
    from interp.training import TrainConfig

    if key == "task_params":
        return json.dumps(row["task_params"], sort_keys=True)
    if key == "strategy":
        return row.get("halving") or "normal"
    if key in row:
        return row[key]
    return {**options(ModelSpec), **options(TrainConfig)}[key].default


@pytest.mark.parametrize(
    ("name", "directory"),
    [("near_misses_adam900_d8.json", "adam900"), ("near_misses_adam_d32.json", "answer")],
)
def test_shipped_near_misses_agree_with_the_rows(name, directory):
    """Each run's count of wrongly answered test sentences (near_misses.py, from its checkpoint) is what its row's
    test accuracy says: (1 - accuracy) x the test split's size."""
    base = ROOT / "examples" / "results" / "seed_regime"
    doc = json.loads((base / name).read_text())
    rows = {
        r["name"]: r
        for line in (base / directory / "results.jsonl").read_text().splitlines()
        if line.strip()
        for r in [json.loads(line)]
    }
    assert doc["runs"] and all(
        all(str(_config_value(rows[n], k)) == v for k, v in doc["where"].items()) for n in doc["runs"]
    )
    for run, margins in doc["runs"].items():
        row = rows[run]
        assert len(margins) == round((1 - row["accuracy"]["test"]) * row["task_params"]["test_size"]), run
        assert all(m <= 1 for m in margins)  # every error is a tie or a margin of one
