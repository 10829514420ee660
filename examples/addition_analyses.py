"""The analyses and tables of ``examples/addition_experiments.py``'s runs (see its docstring).

For every trained model (its checkpoint in the sweep directories): the sub-task probes of the compositionality gap
(:func:`interp.analyses.integer_addition.subtask_probes`, fitted on 2,000 of its training sums, scored on the 6,000
test sums of 1..6 digits); for every looped model, exact match per operand length with 1..4 iterations (Fan et al.
2024 choose more for longer inputs; the ``adaptive`` table reads their rule from these); for every scratchpad model,
the final answer after greedy decoding; for seed 0 of the standard and Abacus models of the lengths part, the
interchange interventions of the carries (see :func:`interchange`). Each is appended, one JSON line per run, to
``subtasks.jsonl``, ``loops.jsonl``, ``greedy.jsonl`` and ``interchange.jsonl`` in the results directory (a run
already there is skipped). Then the tables: ``tables.json`` (every cell, recounted by
``tests/test_addition_results.py``) and ``tables.md`` (the Markdown of docs/addition.md).

    OMP_NUM_THREADS=1 PYTHONPATH=examples python examples/addition_experiments.py --analyse --out runs/addition
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from interp.analyses.integer_addition import decoding, subtasks
from interp.analyses.populations import wilson_interval
from interp.evaluation import evaluate
from interp.files import atomic_write_text
from interp.looping import iterations
from interp.sweep_directory import checkpoint_path, read_results
from interp.tasks import load_checkpoint

LENGTHS = range(1, 7)
TRAINED = (1, 3)
PROBE_TRAIN = 2000
LOOPS = (1, 2, 3, 4)
# Fan et al. 2024 give a looped model more iterations for longer inputs; these models trained with 2 iterations on
# 1..3 digits, so the rule keeps 2 up to 3 digits and grows in proportion to the length beyond: 3 at 4, 4 at 5 and 6
ADAPTIVE = {n: max(2, math.ceil(2 * n / 3)) for n in LENGTHS}
# the interchange interventions (the hypotheses of interp.analyses.integer_addition.hypotheses): on these runs of the
# lengths part, DAS (k = 1) of the carry into each answer digit but the leading one (which is the carry itself) at
# two sites between the blocks, on 3- and 6-digit sums
INTERCHANGE = {"schemes": ("standard", "abacus"), "seeds": (0,), "lengths": (3, 6), "pairs": 400, "steps": 200}
INTERCHANGE_SITES = ("resid_post.0", "resid_mid.1")


def arm(row: dict) -> dict:
    """What a run is, from its row: architecture, positional scheme and ablation."""
    params = json.loads(row["task_params"]) if isinstance(row["task_params"], str) else row["task_params"]
    loops = row.get("loops", 1) or 1
    arch = "looped" if loops > 1 else f"plain{row['n_layers']}"
    ablation = "none"
    if params.get("random_spaces"):
        ablation = "spaces"
    elif params.get("scratchpad"):
        ablation = "scratchpad"
    elif row.get("curriculum"):
        ablation = "curriculum"
    elif row.get("aux_loss"):
        ablation = "aux"
    return {"arch": arch, "scheme": row["positional"], "ablation": ablation}


def _flat(directory: Path) -> list[dict]:
    from interp.sweep_directory import flat_row

    return [flat_row(r) for r in read_results(directory)]


def _done(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    return {json.loads(line)["name"] for line in path.read_text().splitlines() if line.strip()}


def _append(path: Path, entry: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def per_run(out: Path, results: Path) -> None:
    """The per-run analyses of every finished run (resumable)."""
    results.mkdir(parents=True, exist_ok=True)
    files = {k: results / f"{k}.jsonl" for k in ("subtasks", "loops", "greedy", "interchange")}
    done = {k: _done(p) for k, p in files.items()}
    for part in ("lengths", "ablations"):
        directory = out / part
        if not (directory / "results.jsonl").is_file():
            continue
        for row in _flat(directory):
            path = checkpoint_path(directory, row)
            what = arm(row)
            base = {"name": row["name"], "part": part, "seed": row["seed"], **what}
            todo = {
                "subtasks": row["name"] not in done["subtasks"],
                "loops": what["arch"] == "looped" and row["name"] not in done["loops"],
                "greedy": what["ablation"] == "scratchpad" and row["name"] not in done["greedy"],
                "interchange": part == "lengths"
                and what["ablation"] == "none"
                and what["scheme"] in INTERCHANGE["schemes"]
                and row["seed"] in INTERCHANGE["seeds"]
                and row["name"] not in done["interchange"],
            }
            if not any(todo.values()):
                continue
            ckpt = load_checkpoint(path, device="cpu")
            model, task = ckpt.model, ckpt.task
            test = task.dataset("test")
            if todo["subtasks"]:
                cpu = time.process_time()
                train = task.dataset("train").select(slice(0, PROBE_TRAIN))
                res = subtasks.subtask_probes(model, test, train=train)
                entry = {**base, **res.to_dict(), "cpu_seconds": round(time.process_time() - cpu, 1)}
                _append(files["subtasks"], entry)
            if todo["loops"]:
                by = {}
                for loops in LOOPS:
                    with iterations(model, loops):
                        m = evaluate(model, task, test)
                    by[str(loops)] = {str(n): m[f"accuracy_len{n}"] for n in LENGTHS}
                _append(files["loops"], {**base, "exact_match": by, "n": {str(n): m[f"n_len{n}"] for n in LENGTHS}})
            if todo["greedy"]:
                res = decoding.greedy_exact_match(model, test, batch_size=1000)
                _append(files["greedy"], {**base, **res.to_dict()})
            if todo["interchange"]:
                _append(files["interchange"], {**base, **interchange(model, task, test)})
            print(f"{part} {row['name']}: analysed", flush=True)


def interchange(model, task, test) -> dict:
    """DAS (k = 1, Geiger et al. 2024, *Finding Alignments Between Interpretable Causal Variables and Distributed
    Neural Representations*) of the carry into each answer digit ``k`` but the leading one, whose digit is the carry
    itself (the shipped hypothesis ``carry{k}``, ``k = 1 .. n - 1``), at the residual stream after block 0 and after
    block 1's attention where digit ``k`` is predicted, on ``n``-digit test sums: held-out IIA of the learned
    direction, on the pairs whose answer should change, and the mean of random directions (the control), beside the
    model's own accuracy on that digit."""
    from interp.analyses import suite_for
    from interp.analyses.hypotheses import evaluate_hypothesis
    from interp.analyses.integer_addition.hypotheses import data_of_length

    hyps = suite_for(task).hypotheses(task)
    cpu = time.process_time()
    out: dict = {}
    for n in INTERCHANGE["lengths"]:
        data = data_of_length(test, n)
        for k in range(1, n):
            sites = [f"{s}@out{k}" for s in INTERCHANGE_SITES]
            res = evaluate_hypothesis(
                model, data, hypothesis=hyps[f"carry{k}"], sites=sites, das=1,
                pairs=INTERCHANGE["pairs"], steps=INTERCHANGE["steps"],
            )  # fmt: skip
            rows = res.to_dict()["rows"]
            entry = {"base_accuracy": res.base_accuracy}
            for site in INTERCHANGE_SITES:
                das = next(r for r in rows if r["kind"] == "das" and r["site"].startswith(f"{site}@"))
                rand = [r["iia"] for r in rows if r["kind"] == "random" and r["site"].startswith(f"{site}@")]
                entry[site] = {
                    "das": das["iia"],
                    "das_changed": das["iia_changed"],
                    "random": sum(rand) / len(rand),
                    "no_patch": das["null_iia"],
                }
            out[f"{n}:{k}"] = entry
    return {"interchange": out, **{k: v for k, v in INTERCHANGE.items() if k in ("pairs", "steps")},
            "cpu_seconds": round(time.process_time() - cpu, 1)}  # fmt: skip


# -- tables -----------------------------------------------------------------------------------------------------------
def cell(values: list[float], counts: list[int]) -> dict:
    """Mean over runs, min and max over runs, and the pooled share with its Wilson interval."""
    right = sum(round(v * c) for v, c in zip(values, counts))
    total = sum(counts)
    lo, hi = wilson_interval(right, total)
    return {
        "runs": len(values),
        "mean": sum(values) / len(values),
        "min": min(values),
        "max": max(values),
        "pooled": right / total if total else math.nan,
        "low": lo,
        "high": hi,
        "n": total,
    }


def length_rows(rows: list[dict], arms: list[tuple[str, str, str]]) -> list[dict]:
    """Per arm (architecture, scheme, ablation): exact match per operand length over its runs."""
    out = []
    for a in arms:
        members = [r for r in rows if tuple(arm(r).values()) == a]
        if not members:
            continue
        entry = {"arch": a[0], "scheme": a[1], "ablation": a[2], "seeds": sorted(r["seed"] for r in members)}
        for n in LENGTHS:
            entry[str(n)] = cell([r[f"test_accuracy_len{n}"] for r in members], [r[f"test_n_len{n}"] for r in members])
        out.append(entry)
    return out


def tables(out: Path, results: Path) -> dict:
    """Every table, from the shipped rows and the per-run analyses."""
    lengths = _flat(results / "lengths") if (results / "lengths" / "results.jsonl").is_file() else []
    ablations = _flat(results / "ablations") if (results / "ablations" / "results.jsonl").is_file() else []
    schemes = ("none", "standard", "rotary", "random", "abacus", "alibi")
    main_arms = [(arch, s, "none") for arch in ("plain2", "looped", "plain1") for s in schemes]
    abl_arms = [
        (arch, s, abl)
        for s in ("standard", "abacus")
        for abl in ("spaces", "scratchpad", "curriculum", "aux")
        for arch in ("plain2", "looped")
    ]
    controls = [r for r in ablations if arm(r)["ablation"] == "none"]  # the 1-layer control trains with the ablations
    doc = {"lengths": length_rows(lengths + controls, main_arms), "ablations": length_rows(ablations, abl_arms)}
    doc["timings"] = {part: timing(results / part / "timings.jsonl") for part in ("lengths", "ablations")}
    for part, rows in (("lengths", lengths), ("ablations", ablations)):  # each run's own training-and-scoring time
        doc["timings"][part]["rows"] = len(rows)
        doc["timings"][part]["rows_wall_seconds"] = round(sum(r.get("wall_seconds") or 0 for r in rows), 1)
    for name in ("subtasks", "loops", "greedy", "interchange"):
        path = results / f"{name}.jsonl"
        entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
        doc[name] = summarise(name, entries)
        if name == "loops":
            doc["adaptive"] = adaptive(entries)
    return doc


def adaptive(entries: list[dict]) -> list[dict]:
    """Per looped arm: exact match per operand length ``n`` with ``ADAPTIVE[n]`` iterations (Fan et al.'s rule of more
    iterations for longer inputs, at evaluation only), as the length tables' cells (pooled Wilson interval)."""
    by_arm: dict[tuple, list[dict]] = {}
    for e in entries:
        by_arm.setdefault((e["arch"], e["scheme"], e["ablation"]), []).append(e)
    out = []
    for (arch, scheme, ablation), es in by_arm.items():
        entry = {"arch": arch, "scheme": scheme, "ablation": ablation, "seeds": sorted(e["seed"] for e in es)}
        for n in LENGTHS:
            loops = str(ADAPTIVE[n])
            entry[str(n)] = cell([e["exact_match"][loops][str(n)] for e in es], [e["n"][str(n)] for e in es])
        out.append(entry)
    return out


def timing(path: Path) -> dict:
    if not path.is_file():
        return {}
    entries: dict[str, dict] = {}  # one per sweep call: a call rerun after its runs finished only skips them
    for line in path.read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            key = json.dumps([e[k] for k in ("seed", "arch", "schemes", "task", "train")])
            if key not in entries or e["wall_seconds"] > entries[key]["wall_seconds"]:
                entries[key] = e
    calls = list(entries.values())
    return {
        "runs": sum(e["runs"] for e in calls),
        "cpu_seconds": round(sum(e["cpu_seconds"] for e in calls), 1),
        "wall_seconds": round(sum(e["wall_seconds"] for e in calls), 1),
    }


def summarise(name: str, entries: list[dict]) -> list[dict]:
    """Per arm: the per-run analyses' numbers, averaged over the arm's runs (with min and max)."""
    by_arm: dict[tuple, list[dict]] = {}
    for e in entries:
        by_arm.setdefault((e["arch"], e["scheme"], e["ablation"]), []).append(e)
    out = []
    for (arch, scheme, ablation), es in by_arm.items():
        entry = {"arch": arch, "scheme": scheme, "ablation": ablation, "runs": len(es)}
        if name == "subtasks":
            for key in subtasks.SUBTASKS:
                for n in LENGTHS:
                    vals = [e["subtasks"][key]["by_length"].get(str(n)) for e in es]
                    vals = [v for v in vals if v is not None]
                    entry[f"{key}_{n}"] = sum(vals) / len(vals) if vals else None
            for n in LENGTHS:
                entry[f"digit_accuracy_{n}"] = sum(e["by_length"][str(n)]["digit_accuracy"] for e in es) / len(es)
            for k in ("parts_right", "wrong_given_parts_right", "right_given_part_wrong"):
                entry[k] = sum(e["gap"][k] for e in es) / len(es)
        elif name == "interchange":
            for n in INTERCHANGE["lengths"]:
                cells = [e["interchange"][f"{n}:{k}"] for e in es for k in range(1, n)]
                for site in INTERCHANGE_SITES:
                    entry[f"{site}_{n}"] = sum(c[site]["das"] for c in cells) / len(cells)
                    entry[f"{site}_changed_{n}"] = sum(c[site]["das_changed"] for c in cells) / len(cells)
                entry[f"random_{n}"] = max(sum(c[s]["random"] for c in cells) / len(cells) for s in INTERCHANGE_SITES)
                entry[f"digit_{n}"] = sum(c["base_accuracy"] for c in cells) / len(cells)
        elif name == "loops":
            for loops in LOOPS:
                for n in LENGTHS:
                    entry[f"{loops}_{n}"] = sum(e["exact_match"][str(loops)][str(n)] for e in es) / len(es)
        else:
            for n in LENGTHS:
                entry[f"greedy_{n}"] = sum(e["by_length"][str(n)]["exact_match"] for e in es) / len(es)
                steps = [e["by_length"][str(n)]["steps_right"] for e in es]
                entry[f"steps_{n}"] = sum(steps) / len(steps)
            entry["right_after_wrong_steps"] = sum(e["right_after_wrong_steps"] for e in es)
        out.append(entry)
    return out


def markdown(doc: dict) -> str:
    """The Markdown tables of docs/addition.md."""

    def length_table(rows: list[dict], with_ablation: bool) -> list[str]:
        head = ["model", "positions"] + (["option"] if with_ablation else [])
        head += [f"{n} digit{'s' if n > 1 else ''}{' (trained)' if n <= TRAINED[1] else ''}" for n in LENGTHS]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            cells = [r["arch"], r["scheme"]] + ([r["ablation"]] if with_ablation else [])
            for n in LENGTHS:
                c = r[str(n)]
                cells.append(f"{c['mean']:.3f} ({c['min']:.2f}-{c['max']:.2f}) [{c['low']:.3f}, {c['high']:.3f}]")
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    def arm_cells(r: dict) -> list[str]:
        return [r["arch"], r["scheme"], r["ablation"], str(r["runs"])]

    def number(v) -> str:
        return "-" if v is None else f"{v:.3f}"

    parts = ["<!-- lengths -->", *length_table(doc["lengths"], False), "", "<!-- ablations -->"]
    parts += length_table(doc["ablations"], True)
    parts += ["", "<!-- subtasks -->"]
    head = ["model", "positions", "option", "runs"]
    head += [f"{k} ({n} digits)" for k in subtasks.SUBTASKS for n in (3, 6)]
    head += ["model's digits (3)", "model's digits (6)", "parts readable", "wrong when readable"]
    parts += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["subtasks"]:
        cells = arm_cells(r) + [number(r[f"{k}_{n}"]) for k in subtasks.SUBTASKS for n in (3, 6)]
        cells += [number(r["digit_accuracy_3"]), number(r["digit_accuracy_6"])]
        cells += [number(r["parts_right"]), number(r["wrong_given_parts_right"])]
        parts.append("| " + " | ".join(cells) + " |")
    parts += ["", "<!-- loops -->"]
    head = ["model", "positions", "option", "runs"] + [f"{k} loops, {n} digits" for k in LOOPS for n in (3, 4, 6)]
    parts += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["loops"]:
        parts.append("| " + " | ".join(arm_cells(r) + [number(r[f"{k}_{n}"]) for k in LOOPS for n in (3, 4, 6)]) + " |")
    parts += ["", "<!-- adaptive -->"]
    head = ["model", "positions", "option"] + [f"{n} digits ({ADAPTIVE[n]} loops)" for n in LENGTHS]
    parts += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc.get("adaptive", []):
        cells = [r["arch"], r["scheme"], r["ablation"]]
        for n in LENGTHS:
            c = r[str(n)]
            cells.append(f"{c['mean']:.3f} ({c['min']:.2f}-{c['max']:.2f}) [{c['low']:.3f}, {c['high']:.3f}]")
        parts.append("| " + " | ".join(cells) + " |")
    parts += ["", "<!-- interchange -->"]
    head = ["model", "positions", "option", "runs"]
    for n in INTERCHANGE["lengths"]:
        head += [f"carry DAS after block 0 ({n})", f"carry DAS after block 1's attention ({n})"]
        head += [f"random directions ({n})", f"model's digit ({n})"]
    parts += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc.get("interchange", []):
        cells = arm_cells(r)
        for n in INTERCHANGE["lengths"]:
            cells += [number(r[f"{s}_{n}"]) for s in INTERCHANGE_SITES] + [number(r[f"random_{n}"])]
            cells.append(number(r[f"digit_{n}"]))
        parts.append("| " + " | ".join(cells) + " |")
    parts += ["", "<!-- greedy -->"]
    head = ["model", "positions", "option", "runs"] + [f"greedy exact match, {n} digits" for n in LENGTHS]
    parts += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["greedy"]:
        parts.append("| " + " | ".join(arm_cells(r) + [number(r[f"greedy_{n}"]) for n in LENGTHS]) + " |")
    return "\n".join(parts) + "\n"


def analyse(out: Path, results: Path) -> None:
    """The per-run analyses, then the tables (after the rows are shipped into ``results``)."""
    from addition_experiments import ship

    torch.set_num_threads(1)
    ship(out, results)
    per_run(out, results)
    doc = tables(out, results)
    atomic_write_text(results / "tables.json", json.dumps(doc, indent=1) + "\n", "the tables")
    atomic_write_text(results / "tables.md", markdown(doc), "the tables' Markdown")
    print(markdown(doc))
