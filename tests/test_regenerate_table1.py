"""The Table 1 regeneration's comparison (examples/results/seed_regime/regenerate_table1.py): the shipped rows
against themselves are all identical, and a changed row is counted and named where it differs (a hand-edited copy
of the shipped rows is the independent answer)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "results" / "seed_regime" / "regenerate_table1.py"


def _script():
    spec = importlib.util.spec_from_file_location("regenerate_table1", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_comparison_counts_identical_changed_and_missing_rows(tmp_path):
    r = _script()
    shipped = r.SHIPPED
    rows = [json.loads(line) for line in (shipped / "results.jsonl").read_text().splitlines() if line.strip()]
    seeds = [0, 1]
    same = r.compare(shipped, shipped, seeds, quiet=True)
    assert len(same) == 9 and all(c["rows"] == 2 == c["identical"] == c["same_outcome"] for c in same.values())

    picked = [row for row in rows if row["seed"] in seeds]
    target = next(row for row in picked if r.cell_of(row) == "d8-normal")
    loss_only = next(row for row in picked if r.cell_of(row) == "d32-svc")
    lacking = next(row for row in picked if r.cell_of(row) == "d8-svc")
    edited = []
    for original in picked:
        row = json.loads(json.dumps(original))
        row["wall_seconds"] = 0.0  # bookkeeping: ignored
        row["loops"] = 1  # an option added since the shipped rows were written: not a result
        if row["name"] == target["name"]:
            row["accuracy"]["test"] = -1.0  # a different outcome
        if row["name"] == loss_only["name"]:
            split = next(iter(row["metrics"]))
            row["metrics"][split]["loss"] *= 1 + 1e-7  # rounding: not identical, same outcome
        if row["name"] == lacking["name"]:
            del row["metrics"]  # a shipped field missing from the regenerated row: not identical
        if r.cell_of(row) != "d2-normal" or row["seed"] != 1:  # one row missing
            edited.append(row)
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in edited))
    cells = r.compare(shipped, tmp_path, seeds, quiet=True)
    assert cells["d8-normal"]["identical"] == 1 and cells["d8-normal"]["differ"] == [target["name"]]
    assert cells["d32-svc"]["identical"] == 1 and cells["d32-svc"]["same_outcome"] == 2
    assert cells["d2-normal"]["missing"] == 1 and cells["d2-normal"]["identical"] == 1
    assert cells["d8-svc"]["identical"] == 1 and cells["d8-svc"]["differ"] == [lacking["name"]]
    untouched = set(cells) - {"d8-normal", "d32-svc", "d2-normal", "d8-svc"}
    assert all(cells[c]["identical"] == 2 for c in untouched)


def test_split_by_cells_gives_every_cell_to_one_process_and_balances_their_cost():
    """``--split cells``: each cell goes whole to one process, every cell once, and no process costs more than the
    others by more than its dearest cell (the greedy rule's bound); one process gets every cell. The cells are the
    shipped plans' (each row's cell is one of them), and an unknown cell is refused before any work."""
    import subprocess
    import sys

    from interp.sweep_directory import read_results

    script = _script()
    assert {script.cell_of(r) for r in read_results(script.SHIPPED)} == set(script.CELLS) == set(script.CELL_COST)
    for parts in (1, 2, 3, 9, 12):
        groups = script.split_cells(list(script.CELLS), parts)
        assert sorted(c for g in groups for c in g) == sorted(script.CELLS)
        assert len(groups) == min(parts, len(script.CELLS))
        costs = [sum(script.CELL_COST[c] for c in g) for g in groups]
        assert max(costs) - min(costs) <= max(script.CELL_COST.values())
    assert script.split_cells(["d8-svc", "d2-normal"], 2) in ([["d8-svc"], ["d2-normal"]], [["d2-normal"], ["d8-svc"]])
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "/nonexistent/out", "--split", "cells", "--cells", "d8-normal,d9-svc"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "unknown cell(s) ['d9-svc']" in out.stderr
    assert not Path("/nonexistent/out").exists()
