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

from interp.sweep_directory import flat_row, select_rows

ROOT = Path(__file__).resolve().parents[1]
TABLE1 = ROOT / "examples" / "results" / "table1"
# Table 1 under Adam with L2 weight decay (docs/seed-regime.md): every row trained with optimizer="adam"
TABLE1_ADAM = ROOT / "examples" / "results" / "seed_regime" / "table1"
TABLES = {TABLE1: {}, TABLE1_ADAM: {"optimizer": "adam"}}
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


def _rows(directory=TABLE1):
    return [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines() if line.strip()]


def _table_id(directory: Path) -> str:
    return str(directory.relative_to(ROOT / "examples" / "results"))


@pytest.mark.parametrize("directory", list(TABLES), ids=_table_id)
def test_shipped_table1_has_every_cell_with_the_same_number_of_runs(directory):
    rows = _rows(directory)
    by_cell: dict[tuple, list] = {}
    for r in rows:
        by_cell.setdefault((r["d_model"], r["n_heads"], r["strategy"]), []).append(r)
    assert set(by_cell) == CELLS
    assert len({len(v) for v in by_cell.values()}) == 1  # the same number of runs per cell
    assert all(r["epochs"] == 900 and r["dropout_at"] == "attention" for r in rows)
    assert all(flat_row(r)[k] == v for r in rows for k, v in TABLES[directory].items())


@pytest.mark.slow
@pytest.mark.parametrize("directory", list(TABLES), ids=_table_id)
def test_interp_table_prints_table1_from_the_shipped_results(directory):
    out = _interp_table(directory, "--json")
    assert out.returncode == 0, out.stderr[-800:]
    table = json.loads(out.stdout)
    assert {(t["d_model"], t["n_heads"], t["strategy"]) for t in table} == CELLS
    rows = _rows(directory)
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
    text = _interp_table(directory)
    assert text.returncode == 0 and "shapley-svc" in text.stdout and "[" in text.stdout


@pytest.mark.slow
@pytest.mark.parametrize("directory", list(TABLES), ids=_table_id)
def test_interp_table_compare_of_the_shipped_table1_is_a_recount(directory):
    """`interp table DIR --compare`: each halving cell against the normal runs of its shape, from the recounted hits
    (the Newcombe interval itself is checked against Newcombe 1998's published values in test_sweep_summaries)."""
    from interp.analyses.populations import newcombe_interval

    out = _interp_table(directory, "--compare", "--json")
    assert out.returncode == 0, out.stderr[-800:]
    differences = json.loads(out.stdout)["differences"]
    hits: dict[tuple, list] = {}
    for r in _rows(directory):
        ok = r["accuracy"]["test"] >= 1.0 and (r["strategy"] == "normal" or r["final_active_heads"] == 1)
        hits.setdefault((r["d_model"], r["n_heads"], r["strategy"]), []).append(ok)
    expected = {cell for cell in hits if cell[2] != "normal"}
    assert {(d["d_model"], d["n_heads"], d["strategy"]) for d in differences} == expected
    for d in differences:
        a, b = hits[(d["d_model"], d["n_heads"], d["strategy"])], hits[(d["d_model"], d["n_heads"], "normal")]
        assert (d["runs"], d["baseline_runs"]) == (len(a), len(b))
        assert d["difference"] == pytest.approx(sum(a) / len(a) - sum(b) / len(b), abs=1e-12)
        low, high = newcombe_interval(sum(a), len(a), sum(b), len(b))
        assert (d["difference_low"], d["difference_high"]) == (pytest.approx(low), pytest.approx(high))
        assert d["differs"] == (low > 0 or high < 0)


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
    if p.parent not in TABLES  # recounted with Table 1's rule above
)


@pytest.mark.slow
@pytest.mark.parametrize("directory", MEASURED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_interp_table_of_each_shipped_measurement_is_a_recount_of_its_rows(directory):
    """Every shipped measurement (the seed-regime hypotheses, the attention-variant questions) is printed by `interp
    table` from its rows; each cell's run count, share at 100% test accuracy and mean are recounted here."""
    out = _interp_table(directory, "--json")
    assert out.returncode == 0, out.stderr[-800:]
    table = json.loads(out.stdout)
    rows = _rows(directory)
    assert sum(t["runs"] for t in table) == len(rows)
    flats = [flat_row(r) for r in rows]
    for t in table:
        keys = [k for k in t if k not in STATS and not k.startswith("share_")]
        cell = [r for r, f in zip(rows, flats, strict=True) if all(f[k] == t[k] for k in keys)]
        accs = [r["accuracy"]["test"] for r in cell]
        assert t["runs"] == len(cell) > 0
        assert t["share_test_at_1"] == pytest.approx(sum(a >= 1.0 for a in accs) / len(cell))
        assert t["mean_test_accuracy"] == pytest.approx(sum(accs) / len(accs), abs=5e-5)


@pytest.mark.parametrize(
    ("name", "directory"),
    [
        ("near_misses_adam900_d8.json", "adam900"),
        ("near_misses_adam_d32.json", "answer"),
        ("near_misses_table1_d8.json", "table1"),
        ("near_misses_table1_d8_svc.json", "table1"),
        ("near_misses_table1_d8_shapley-svc.json", "table1"),
    ],
)
def test_shipped_near_misses_agree_with_the_rows(name, directory):
    """Each run's count of wrongly answered test sentences (near_misses.py, from its checkpoint) is what its row's
    test accuracy says: (1 - accuracy) x the test split's size."""
    base = ROOT / "examples" / "results" / "seed_regime"
    doc = json.loads((base / name).read_text())
    rows = {r["name"]: r for r in _rows(base / directory)}
    chosen = {r["name"] for r in select_rows(base / directory, doc["where"])}
    assert doc["runs"] and set(doc["runs"]) == chosen  # every run the selection names, and only those
    for run, margins in doc["runs"].items():
        row = rows[run]
        assert len(margins) == round((1 - row["accuracy"]["test"]) * row["task_params"]["test_size"]), run
        assert all(m <= 1 for m in margins)  # every error is a tie or a margin of one
        if "wrong" in doc:  # each wrong sentence as (n0 - n1, length): the same margins, lengths of the test split
            low, high = row["task_params"]["test_lengths"]
            assert sorted(abs(d) for d, _ in doc["wrong"][run]) == margins
            assert all(low <= n <= high for _, n in doc["wrong"][run])
