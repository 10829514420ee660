"""The shipped integer-addition experiment (examples/results/addition/, docs/addition.md): every cell of its tables is
a recount of the shipped rows (a plain loop here, with the Wilson interval written out), and `interp table` rebuilds
the pooled exact match per operand length from the same rows."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "examples" / "results" / "addition"
LENGTHS = range(1, 7)
Z = 1.959963984540054  # the 95% normal quantile


def _rows(part: str) -> list[dict]:
    path = RESULTS / part / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tables() -> dict:
    return json.loads((RESULTS / "tables.json").read_text())


def _arm(row: dict) -> tuple[str, str, str]:
    """Architecture, positional scheme and option of a row, read from its recorded configuration."""
    params = row["task_params"]
    arch = "looped" if (row.get("loops") or 1) > 1 else f"plain{row['n_layers']}"
    option = "none"
    if params.get("random_spaces"):
        option = "spaces"
    elif params.get("scratchpad"):
        option = "scratchpad"
    elif row.get("curriculum"):
        option = "curriculum"
    elif row.get("aux_loss"):
        option = "aux"
    return arch, row["positional"], option


def _wilson(right: int, n: int) -> tuple[float, float]:
    p = right / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _table_rows(part: str) -> list[dict]:
    rows = _rows(part)
    if part == "lengths":  # the 1-layer control trained beside the ablations belongs to the lengths table
        rows += [r for r in _rows("ablations") if _arm(r)[2] == "none"]
    return rows


@pytest.mark.parametrize("part", ["lengths", "ablations"])
def test_every_cell_of_the_shipped_tables_is_a_recount_of_the_rows(part):
    rows = _table_rows(part)
    table = _tables()[part]
    arms = {_arm(r) for r in rows if part == "lengths" or _arm(r)[2] != "none"}
    assert {(t["arch"], t["scheme"], t["ablation"]) for t in table} == arms
    for t in table:
        members = [r for r in rows if _arm(r) == (t["arch"], t["scheme"], t["ablation"])]
        assert t["seeds"] == sorted(r["seed"] for r in members)
        for n in LENGTHS:
            test = [r["metrics"]["test"] for r in members]
            values = [m[f"accuracy_len{n}"] for m in test]
            counts = [m[f"n_len{n}"] for m in test]
            right = sum(round(v * c) for v, c in zip(values, counts))
            cell = t[str(n)]
            assert cell["runs"] == len(members) and cell["n"] == sum(counts)
            assert cell["mean"] == pytest.approx(sum(values) / len(values), abs=1e-12)
            assert (cell["min"], cell["max"]) == (min(values), max(values))
            assert cell["pooled"] == pytest.approx(right / sum(counts), abs=1e-12)
            low, high = _wilson(right, sum(counts))
            assert (cell["low"], cell["high"]) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))


def _entries(name: str) -> list[dict]:
    path = RESULTS / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_adaptive_loop_table_is_a_recount_of_the_loop_evaluations():
    """Fan et al.'s more iterations for longer inputs, at evaluation: 2 iterations up to the 3 trained digits, then
    2n/3 rounded up (3 at 4 digits, 4 at 5 and 6), read from each looped run's evaluation at 1..4 iterations."""
    rule = {1: 2, 2: 2, 3: 2, 4: 3, 5: 4, 6: 4}
    entries = _entries("loops")
    table = _tables()["adaptive"]
    assert {(t["arch"], t["scheme"], t["ablation"]) for t in table} == {
        (e["arch"], e["scheme"], e["ablation"]) for e in entries
    }
    for t in table:
        members = [
            e for e in entries if (e["arch"], e["scheme"], e["ablation"]) == (t["arch"], t["scheme"], t["ablation"])
        ]
        assert t["seeds"] == sorted(e["seed"] for e in members)
        for n in LENGTHS:
            values = [e["exact_match"][str(rule[n])][str(n)] for e in members]
            counts = [e["n"][str(n)] for e in members]
            right = sum(round(v * c) for v, c in zip(values, counts))
            cell = t[str(n)]
            assert cell["mean"] == pytest.approx(sum(values) / len(values), abs=1e-12)
            assert cell["n"] == sum(counts) and cell["pooled"] == pytest.approx(right / sum(counts), abs=1e-12)
            low, high = _wilson(right, sum(counts))
            assert (cell["low"], cell["high"]) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))


def test_the_interchange_table_is_a_recount_of_the_runs_interventions():
    """The carry's DAS IIA per arm: the mean over runs and inner carries (1 .. n - 1) of each run's held-out IIA."""
    entries = _entries("interchange")
    table = _tables()["interchange"]
    assert len(table) == len({(e["arch"], e["scheme"], e["ablation"]) for e in entries}) > 0
    for t in table:
        members = [
            e for e in entries if (e["arch"], e["scheme"], e["ablation"]) == (t["arch"], t["scheme"], t["ablation"])
        ]
        assert t["runs"] == len(members)
        for n in (3, 6):
            cells = [e["interchange"][f"{n}:{k}"] for e in members for k in range(1, n)]
            for site in ("resid_post.0", "resid_mid.1"):
                assert t[f"{site}_{n}"] == pytest.approx(sum(c[site]["das"] for c in cells) / len(cells), abs=1e-12)
            assert t[f"digit_{n}"] == pytest.approx(sum(c["base_accuracy"] for c in cells) / len(cells), abs=1e-12)


def _by_arm(entries: list[dict], t: dict) -> list[dict]:
    return [e for e in entries if (e["arch"], e["scheme"], e["ablation"]) == (t["arch"], t["scheme"], t["ablation"])]


def test_the_per_run_analysis_tables_are_means_over_each_arms_runs():
    """The sub-task, loop-count and greedy tables: one row per arm analysed, each number the plain mean over the arm's
    runs of that run's own analysis (the gap shares, the exact match at each iteration count, the greedy exact
    match); the loop and greedy analyses cover every looped and every scratchpad run of the rows."""
    tables = _tables()
    rows = _rows("lengths") + _rows("ablations")
    looped = {r["name"] for r in rows if (r.get("loops") or 1) > 1}
    scratch = {r["name"] for r in rows if r["task_params"].get("scratchpad")}
    assert {e["name"] for e in _entries("loops")} == looped
    assert {e["name"] for e in _entries("greedy")} == scratch
    assert {e["name"] for e in _entries("subtasks")} == {r["name"] for r in rows}
    for name, keys in (
        (
            "subtasks",
            {"parts_right": ("gap", "parts_right"), "wrong_given_parts_right": ("gap", "wrong_given_parts_right")},
        ),
        ("loops", {f"{k}_{n}": ("exact_match", str(k), str(n)) for k in (1, 2, 3, 4) for n in LENGTHS}),
        ("greedy", {f"greedy_{n}": ("by_length", str(n), "exact_match") for n in LENGTHS}),
    ):
        entries = _entries(name)
        table = tables[name]
        assert len(table) == len({(e["arch"], e["scheme"], e["ablation"]) for e in entries}) > 0
        for t in table:
            members = _by_arm(entries, t)
            assert t["runs"] == len(members)
            for key, path in keys.items():
                values = []
                for e in members:
                    value = e
                    for step in path:
                        value = value[step]
                    values.append(value)
                assert t[key] == pytest.approx(sum(values) / len(values), abs=1e-12), (name, t["arch"], key)


def test_the_shipped_markdown_is_the_tables_json():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from addition_analyses import markdown
    finally:
        sys.path.remove(str(ROOT / "examples"))
    assert (RESULTS / "tables.md").read_text() == markdown(_tables())
    doc = (ROOT / "docs" / "addition.md").read_text()
    assert markdown(_tables()).split("<!-- ablations -->")[0].strip().splitlines()[-1] in doc


@pytest.mark.slow  # a fresh interpreter: about 10 s on the shared CPU
def test_interp_table_rebuilds_the_pooled_exact_match_at_four_digits():
    """`interp table DIR --metric accuracy_len4 --count n_len4`: one row per positional scheme and architecture,
    whose pooled exact match and interval are the recount above."""
    out = subprocess.run(
        [sys.executable, "-m", "interp.app", "table", str(RESULTS / "lengths"), "--metric", "accuracy_len4"]
        + ["--count", "n_len4", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-800:]
    printed = json.loads(out.stdout)
    cells = {(t["arch"], t["scheme"]): t["4"] for t in _tables()["lengths"]}
    assert len(printed) == len({_arm(r) for r in _rows("lengths")})
    rows = _rows("lengths")
    for entry in printed:  # a column that does not vary in the sweep is not printed: its one value is the rows'
        p = {k: entry.get(k, rows[0][k]) for k in ("loops", "n_layers", "positional")} | entry
        arch = "looped" if (p["loops"] or 1) > 1 else f"plain{p['n_layers']}"
        cell = cells[(arch, p["positional"])]
        assert p["runs"] == cell["runs"] and p["test_n_len4"] == cell["n"]
        assert p["pooled_test_accuracy_len4"] == pytest.approx(cell["pooled"], abs=1e-12)
        assert p["pooled_test_accuracy_len4_low"] == pytest.approx(cell["low"], abs=1e-9)
        assert p["pooled_test_accuracy_len4_high"] == pytest.approx(cell["high"], abs=1e-9)
