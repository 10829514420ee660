"""Sweeps: many seeds x a grid of configurations, trained into one directory, one checkpoint and one result row per
run; and the population table read back from it (issue 11).

A sweep directory holds ``runs/<name>.safetensors`` (ordinary checkpoints), ``results.jsonl`` (one JSON row per
finished run, rewritten atomically after every group of runs) with ``results.csv`` beside it (the same rows, flat,
rewritten with it), and ``sweep.json`` (per ``interp sweep`` into the directory, its task, base model and training
options, seeds and grid: what ``interp sweep DIR --status`` and ``--resume`` read). Several sweeps may share a
directory (Table 1's normal rows, then its halving rows): each keeps the others' rows. :func:`load_results` reads the
rows as one pandas DataFrame; :func:`population_table` summarises them per configuration and strategy (Table 1 of
seed 000).

Runs that can be batched (one shape and recipe up to seed and learning rate, a one-layer attention-only model,
halving or not) are trained together by :func:`interp.population.train_population`, in groups of ``group`` models;
others one at a time by :func:`interp.training.train`.

Groups can also run as Ray tasks (``backend="ray"``: a local Ray instance, or a cluster's address), each writing
its own checkpoints; the driver writes the rows as groups finish.

Nothing is lost: a sweep started again with the same arguments skips every run whose checkpoint exists (and adds
its row if the table lacks it), and the group in flight at a ``kill -9`` continues from its last resume file (a
population's every ``save_every`` epochs, ``runs/.group-HASH.resume``; a run trained alone, its own), to the same
weights as an uninterrupted sweep. Nothing of the user's is deleted (a group's resume file goes once its checkpoints
are written).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tqdm.auto import tqdm

from .errors import ConfigError

SPEC_GRID = ("d_model", "n_heads", "d_head", "n_layers", "positional", "output_matrix")
TRAIN_GRID = ("lr", "weight_decay", "dropout", "dropout_at", "batch_size", "epochs", "keep", "patience", "halving",
              "halving_threshold")
RESULTS = "results.jsonl"
RESULTS_CSV = "results.csv"
PLAN = "sweep.json"
# The configuration of a run: its group in the table (``strategy`` is the halving strategy, "normal" without one)
CONFIG = ("d_model", "n_heads", "d_head", "n_layers", "positional", "output_matrix", "lr", "weight_decay", "dropout",
          "dropout_at", "batch_size", "epochs", "keep", "patience", "halving_threshold", "strategy")


def parse_seeds(text: str) -> list[int]:
    """``"0..99"`` (inclusive), ``"0,3,7"`` or ``"5"`` -> a sorted list of distinct non-negative seeds."""
    try:
        if ".." in text:
            a, b = text.split("..")
            seeds = list(range(int(a), int(b) + 1))
        else:
            seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds takes 'A..B' or a comma-separated list of integers, got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise ConfigError(f"--seeds must name at least one non-negative seed, got {text!r}")
    return sorted(set(seeds))


def parse_grid(items: Iterable[str]) -> dict[str, list]:
    """``["d_model=8,32", "lr=1e-3,3e-3"]`` -> ``{"d_model": [8, 32], "lr": [0.001, 0.003]}`` (values parsed as
    JSON, else kept as strings)."""
    grid: dict[str, list] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not values:
            raise ConfigError(f"--grid takes KEY=V1,V2,..., got {item!r}")
        if key not in SPEC_GRID + TRAIN_GRID:
            raise ConfigError(f"--grid key {key!r} is not a model or training option; expected one of "
                              f"{', '.join(SPEC_GRID + TRAIN_GRID)}")
        parsed = []
        for v in values.split(","):
            try:
                parsed.append(json.loads(v))
            except json.JSONDecodeError:
                parsed.append(v)
        if key == "halving":  # "none" (or "normal"): a run without halving, a row of Table 1 like the strategies
            from .halving import STRATEGIES

            parsed = [None if v in ("none", "normal", None) else v for v in parsed]
            bad = [v for v in parsed if v is not None and v not in STRATEGIES]
            if bad:
                raise ConfigError(f"unknown halving strateg{'y' if len(bad) == 1 else 'ies'} {bad}; expected none or "
                                  f"one of {', '.join(STRATEGIES)}")
        grid[key] = parsed
    return grid


def run_name(task_name: str, point: dict[str, Any], seed: int) -> str:
    parts = [task_name] + [f"{k}{'none' if v is None else v}" for k, v in point.items()] + [f"seed{seed}"]
    return "-".join(str(p).replace("/", "_").replace(" ", "") for p in parts)


def plan(task, base_spec, base_cfg, seeds: Sequence[int], grid: dict[str, list]) -> list[dict[str, Any]]:
    """Every run of the sweep: ``{"name", "point" (grid values), "seed", "spec", "cfg"}``."""
    keys = list(grid)
    runs = []
    for values in itertools.product(*(grid[k] for k in keys)) if keys else [()]:
        point = dict(zip(keys, values))
        spec_kw = {k: v for k, v in point.items() if k in SPEC_GRID}
        cfg_kw = {k: v for k, v in point.items() if k in TRAIN_GRID}
        shape = {k: spec_kw.get(k, getattr(base_spec, k)) for k in ("n_heads", "d_head", "d_model")}
        if "output_matrix" not in spec_kw and base_spec.output_matrix == "identity" \
                and shape["n_heads"] * shape["d_head"] != shape["d_model"]:
            spec_kw["output_matrix"] = "learned"  # as `interp train` does (before the spec is checked)
        spec0 = replace(base_spec, **spec_kw)
        for seed in seeds:
            runs.append({"name": run_name(task.name, point, seed), "point": point, "seed": seed,
                         "spec": replace(spec0, init_seed=seed), "cfg": replace(base_cfg, **cfg_kw, seed=seed)})
    return runs


def _batch_key(run) -> tuple:
    """Runs with equal keys may share a population (what interp.population.check_population allows to differ)."""
    from .population import VARYING_CONFIG

    spec = {k: v for k, v in asdict(run["spec"]).items() if k != "init_seed"}
    cfg = {k: v for k, v in asdict(run["cfg"]).items() if k not in VARYING_CONFIG}
    return json.dumps(spec, sort_keys=True), json.dumps(cfg, sort_keys=True)


def checkpoint_path(directory, row: dict[str, Any]) -> Path:
    """The checkpoint of a results row. Rows name it relative to the sweep directory (``runs/NAME.safetensors``),
    so a directory can be moved or shipped; rows of older sweeps hold an absolute path, used if it still exists."""
    path = Path(row["checkpoint"])
    if path.is_absolute() and path.is_file():
        return path
    return Path(directory) / "runs" / path.name


def _row(run, prov: dict[str, Any], path: Path) -> dict[str, Any]:
    """One run's row: its whole configuration (not only the grid's keys), seed, epochs, every metric of every split
    the task reports, the heads left active, wall time and population. Generic: the task's metrics are taken as
    recorded in the provenance (``prov["metrics"][split]``)."""
    spec, cfg = asdict(run["spec"]), asdict(run["cfg"])
    halving = prov.get("halving")
    return {"name": run["name"], **{k: spec[k] for k in SPEC_GRID}, **{k: cfg[k] for k in TRAIN_GRID},
            "strategy": cfg["halving"] or "normal", "seed": run["seed"], "checkpoint": f"runs/{Path(path).name}",
            "best_epoch": prov.get("best_epoch"), "kept_epoch": prov["kept_epoch"], "epochs_run": prov["epochs_run"],
            "accuracy": prov["accuracy"], "metrics": prov.get("metrics"),
            "final_active_heads": len(halving["active"]) if halving else spec["n_layers"] * spec["n_heads"],
            "wall_seconds": prov.get("wall_seconds_this_run"), "population": prov.get("population"),
            "halving_result": halving}


def read_results(directory) -> list[dict[str, Any]]:
    path = Path(directory) / RESULTS
    if not path.is_file():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError(f"{path}:{i} is not a JSON row (the file is written atomically: was it edited?)") from None
    return rows


def _write_results(directory: Path, rows: list[dict[str, Any]]) -> None:
    """``results.jsonl`` and, beside it, ``results.csv`` (the flat rows of :func:`load_results`), each atomically."""
    from .files import atomic_write

    atomic_write(directory / RESULTS, lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in rows)),
                 "the sweep's results table")
    frame = results_frame(rows)
    atomic_write(directory / RESULTS_CSV, lambda tmp: frame.to_csv(tmp, index=False), "the sweep's results CSV")


def train_group(task, specs, cfgs, paths, *, device: str | None = None, threads: int | None = None,
                scorer_for: Callable[[str], Any] | None = None, progress: bool = False,
                compile: bool = False) -> list[dict[str, Any]]:
    """Train one group of runs: as one population where they can be batched, else one at a time (halving runs get
    ``scorer_for(strategy)`` as their head scorer). What a sweep runs locally, or as one Ray task."""
    import torch

    from .population import check_population, train_population
    from .training import resume_path, train

    if threads:
        torch.set_num_threads(threads)
    try:
        check_population(specs, cfgs)
        batchable = True
    except ConfigError:  # another shape or recipe: one at a time
        batchable = False
    if batchable:  # halving included: each model of the population keeps its own head mask
        strategy = cfgs[0].halving
        scorer = scorer_for(strategy) if strategy is not None and scorer_for is not None else None
        return train_population(task, specs, cfgs, paths, device=device, progress=progress, compile=compile,
                                head_scorer=scorer, resume_file=group_resume_file(paths))
    provs = []
    for s, c, p in zip(specs, cfgs, paths):
        if c.halving is not None and scorer_for is None:
            raise ConfigError("halving runs in a sweep need a head scorer (the CLI passes analyses.halving.scorer)")
        scorer = scorer_for(c.halving) if c.halving is not None else None
        # a run killed mid-training left its resume file: continue it
        provs.append(train(task, s, c, p, device=device, progress=False, head_scorer=scorer,
                           resume=resume_path(Path(p)).is_file()))
    return provs


def group_resume_file(paths: Sequence) -> Path:
    """Where a population trained for ``paths`` keeps its resume file: beside the checkpoints, named for the group
    (a hash of its checkpoint names), so a killed sweep continues each group from its last save."""
    names = "\n".join(Path(p).name for p in paths)
    return Path(paths[0]).parent / f".group-{hashlib.sha1(names.encode()).hexdigest()[:16]}.resume"


def _ray_train_group(task_name, task_params, specs, cfgs, paths, device, threads, scorer_for, compile=False):
    """:func:`train_group` in a Ray worker (the task is rebuilt there from its name and parameters)."""
    from tasks import get_task

    return train_group(get_task(task_name, **task_params), specs, cfgs, paths, device=device, threads=threads,
                       scorer_for=scorer_for, compile=compile)


def run_sweep(task, base_spec, base_cfg, seeds: Sequence[int], grid: dict[str, list], directory, *,
              group: int = 100, device: str | None = None, progress: bool = True, backend: str = "local",
              ray_address: str | None = None, threads: int | None = None,
              scorer_for: Callable[[str], Any] | None = None, compile: bool = False) -> list[dict[str, Any]]:
    """Train every run of the sweep not yet in ``directory``; return the results table (one row per run).

    ``backend="local"`` trains the groups one after another in this process; ``"ray"`` submits each group as one
    Ray task (to the cluster at ``ray_address``, or to a local one started here) and writes each group's rows as
    it finishes. Either way a rerun resumes: finished runs are skipped."""
    from .checkpoint import read_metadata

    if group < 1:
        raise ConfigError(f"group must be at least 1, got {group}")
    if backend not in ("local", "ray"):
        raise ConfigError(f"unknown sweep backend {backend!r}; expected 'local' or 'ray'")
    directory = Path(directory)
    (directory / "runs").mkdir(parents=True, exist_ok=True)
    runs = plan(task, base_spec, base_cfg, seeds, grid)
    _write_plan(directory, task, base_spec, base_cfg, seeds, grid)
    rows = {r["name"]: r for r in read_results(directory)}
    todo = []
    for run in runs:
        path = directory / "runs" / f"{run['name']}.safetensors"
        if path.is_file():
            if run["name"] not in rows:  # finished, but killed before its row was written
                rows[run["name"]] = _row(run, read_metadata(path)["training"], path)
        else:
            todo.append(run)
    planned = {r["name"] for r in runs}
    others = [name for name in rows if name not in planned]  # rows of earlier sweeps into this directory: kept

    def all_rows() -> list[dict[str, Any]]:
        return [rows[n] for n in others] + [rows[r["name"]] for r in runs if r["name"] in rows]

    _write_results(directory, all_rows())
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc=f"sweep {task.name}", unit="run",
               disable=not progress)
    by_key: dict[tuple, list] = {}
    for run in todo:
        by_key.setdefault(_batch_key(run), []).append(run)
    chunks = [members[i:i + group] for members in by_key.values() for i in range(0, len(members), group)]

    def finished(chunk, provs) -> None:
        for run, prov in zip(chunk, provs):
            rows[run["name"]] = _row(run, prov, directory / "runs" / f"{run['name']}.safetensors")
        _write_results(directory, all_rows())
        bar.update(len(chunk))

    def args_of(chunk):
        return ([r["spec"] for r in chunk], [r["cfg"] for r in chunk],
                [directory / "runs" / f"{r['name']}.safetensors" for r in chunk])

    if backend == "local":
        for chunk in chunks:
            finished(chunk, train_group(task, *args_of(chunk), device=device, threads=threads, scorer_for=scorer_for,
                                        progress=progress, compile=compile))
    elif chunks:
        _run_on_ray(task, chunks, args_of, finished, device, threads, scorer_for, ray_address, compile)
    bar.close()
    return [rows[r["name"]] for r in runs]


def _run_on_ray(task, chunks, args_of, finished, device, threads, scorer_for, address, compile=False) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install 'ray>=2.9'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        remote = ray.remote(num_cpus=1)(_ray_train_group)
        pending = {remote.remote(task.name, task.params(), *args_of(chunk), device, threads or 1, scorer_for,
                                compile): chunk
                   for chunk in chunks}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                finished(pending.pop(ref), ray.get(ref))
    finally:
        if started_here:
            ray.shutdown()


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default): sensible at 0 and n successes, unlike the
    normal approximation."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if successes == 0 else max(0.0, centre - half), 1.0 if successes == n else min(1.0, centre + half))


def _write_plan(directory: Path, task, base_spec, base_cfg, seeds, grid) -> None:
    """Add this sweep's arguments to ``sweep.json`` (``{"plans": [...]}``, one entry per distinct ``interp sweep``
    into the directory, e.g. Table 1's normal rows, then its halving rows)."""
    from .files import atomic_write_text

    entry = json.loads(json.dumps({"task": task.name, "task_params": task.params(), "spec": asdict(base_spec),
                                   "cfg": asdict(base_cfg), "seeds": list(seeds), "grid": grid}))
    plans = read_plans(directory) if (directory / PLAN).is_file() else []
    if entry not in plans:
        atomic_write_text(directory / PLAN, json.dumps({"plans": plans + [entry]}, indent=1) + "\n", "the sweep's plan")


def read_plans(directory) -> list[dict[str, Any]]:
    """The plans in ``sweep.json`` (the arguments of every ``interp sweep`` into ``directory``), or a ConfigError."""
    path = Path(directory) / PLAN
    if not path.is_file():
        raise ConfigError(f"{directory} is not a sweep directory with a plan (no {PLAN}; sweeps written before it "
                          "existed need their original command, with --status)")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ConfigError(f"{path} is not JSON (it is written atomically: was it edited?)") from None
    return d["plans"] if "plans" in d else [d]  # a single plan


def read_plan(directory) -> dict[str, Any]:
    """The latest plan of ``sweep.json``."""
    return read_plans(directory)[-1]


def planned_runs(directory) -> list[dict[str, Any]]:
    """The runs of every plan ``directory`` holds (names, grid points, specs, configs; a run in two plans once)."""
    from types import SimpleNamespace

    from .model import ModelSpec
    from .training import TrainConfig

    runs: dict[str, dict[str, Any]] = {}
    for p in read_plans(directory):
        for run in plan(SimpleNamespace(name=p["task"]), ModelSpec(**p["spec"]), TrainConfig(**p["cfg"]), p["seeds"],
                        p["grid"]):
            runs.setdefault(run["name"], run)
    return list(runs.values())


def sweep_status(directory, runs: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What is done and what is left, per configuration (grid point), without training: ``runs`` planned, ``done``
    (a checkpoint exists), ``rows`` (in results.jsonl), ``todo``. ``runs`` defaults to the saved plan."""
    directory = Path(directory)
    runs = planned_runs(directory) if runs is None else runs
    named = {r["name"] for r in read_results(directory)}
    status: dict[str, dict[str, Any]] = {}
    for run in runs:
        point = {**run["point"], "strategy": run["cfg"].halving or "normal"}
        entry = status.setdefault(json.dumps(point, sort_keys=True, default=str),
                                  {**point, "runs": 0, "done": 0, "rows": 0, "todo": 0})
        done = (directory / "runs" / f"{run['name']}.safetensors").is_file()
        entry["runs"] += 1
        entry["done"] += done
        entry["todo"] += not done
        entry["rows"] += run["name"] in named
    return list(status.values())


# ---- the rows as a table ------------------------------------------------------------------------------------------
NESTED = ("accuracy", "metrics", "population", "halving_result")


def _plain(x):
    """numpy scalars as Python numbers, NaN as None (so values group and print alike)."""
    if hasattr(x, "item") and not isinstance(x, (list, dict, str)):
        x = x.item()
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def flat_row(row: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A results.jsonl row as flat columns: the configuration, ``strategy``, every metric of every split as
    ``<split>_<metric>`` (e.g. ``test_accuracy``, ``test_eos_accuracy``), ``population_size`` and ``_forward``,
    ``halving_success``, ``final_active_heads``. Rows of older sweeps lack part of the configuration: ``meta`` (the
    run's checkpoint metadata) fills it in where given."""
    out = {k: v for k, v in row.items() if k not in NESTED}
    if meta is not None:
        spec, training = meta.get("model_spec", {}), meta.get("training", {})
        cfg = training.get("config", {})
        for k in SPEC_GRID:
            out.setdefault(k, spec.get(k))
        for k in TRAIN_GRID:
            out.setdefault(k, cfg.get(k))
        out.setdefault("best_epoch", training.get("best_epoch"))
        out.setdefault("wall_seconds", training.get("wall_seconds_this_run"))
        if "metrics" not in row and "metrics" in training:
            row = {**row, "metrics": training["metrics"]}
    halving = row.get("halving_result")
    if "strategy" not in out:
        out["strategy"] = out.get("halving") or (halving or {}).get("strategy") or "normal"
    if "final_active_heads" not in out:
        if halving:
            out["final_active_heads"] = len(halving["active"])
        elif out.get("n_heads") is not None:
            out["final_active_heads"] = out["n_heads"] * (out.get("n_layers") or 1)
    metrics = row.get("metrics") or {split: {"accuracy": a} for split, a in (row.get("accuracy") or {}).items()}
    for split, m in metrics.items():
        for name, v in m.items():
            out[f"{split}_{name}"] = v
    population = row.get("population") or {}
    out["population_size"] = population.get("size", 1)
    out["population_forward"] = population.get("forward")
    out["halving_success"] = halving.get("success") if halving else None
    first = ["name", *CONFIG, "halving", "seed"]
    return {**{k: out[k] for k in first if k in out}, **{k: v for k, v in out.items() if k not in first}}


def results_frame(rows: Sequence[dict[str, Any]]):
    """Rows (as in results.jsonl) as a pandas DataFrame of :func:`flat_row` columns, one row per run."""
    import pandas as pd

    return pd.DataFrame([flat_row(r) for r in rows])


def load_results(directory):
    """The results of a sweep directory as a pandas DataFrame, one row per finished run (see :func:`flat_row` for
    the columns). Rows written before the row carried the whole configuration get it from their checkpoint's
    metadata, when the checkpoint is still there."""
    import pandas as pd

    from .checkpoint import read_metadata

    directory = Path(directory)
    if not (directory / RESULTS).is_file():
        raise ConfigError(f"{directory} holds no sweep results (no {RESULTS}): expected a directory written by "
                          "interp sweep")
    flat = []
    for row in read_results(directory):
        meta = None
        if any(k not in row for k in (*SPEC_GRID, *TRAIN_GRID)) and row.get("checkpoint"):
            path = checkpoint_path(directory, row)
            if path.is_file():
                meta = read_metadata(path)
        flat.append(flat_row(row, meta))
    return pd.DataFrame(flat)


def scores(frame, split: str = "test"):
    """Each run's ``split`` accuracy, 0 for a halving run that did not end with one head (seed 000 §5.5)."""
    acc = frame[f"{split}_accuracy"].astype(float)
    if "halving_success" in frame:
        acc = acc.where(frame["halving_success"].map(lambda v: v is not False), 0.0)
    return acc


def config_columns(frame, always: Sequence[str] = ("d_model", "n_heads", "strategy")) -> tuple[list[str], list[str]]:
    """(every configuration column present: the grouping; the ones shown: ``always`` and those that vary)."""
    keys = [c for c in CONFIG if c in frame.columns]
    shown = [c for c in keys if c in always or frame[c].map(lambda v: json.dumps(_plain(v))).nunique() > 1]
    return keys, shown


def groups(frame, keys: Sequence[str]) -> list[tuple[dict[str, Any], Any]]:
    """``[(configuration, sub-frame)]`` in first-seen order (None and NaN group together)."""
    seen: dict[str, list] = {}
    for i, row in frame.iterrows():
        key = json.dumps([_plain(row[k]) for k in keys], default=str)
        seen.setdefault(key, []).append(i)
    return [({k: _plain(frame.loc[idx[0], k]) for k in keys}, frame.loc[idx]) for idx in seen.values()]


def population_table(rows, *, split: str = "test", thresholds: Sequence[float] = (1.0, 0.98)) -> list[dict[str, Any]]:
    """Table 1 of seed 000, per configuration and halving strategy: ``runs``; for each threshold t the share of runs
    whose ``split`` accuracy reaches t (``share_test_at_1``, ``share_test_at_0.98``; a failed halving run scores 0)
    with its 95% Wilson interval (``..._low``, ``..._high``); and the mean accuracy. ``rows``: results.jsonl rows or
    a :func:`load_results` frame. The configuration columns shown are d_model, n_heads, strategy and any other that
    varies in the sweep (runs are grouped by all of them)."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else results_frame(rows)
    if frame.empty:
        return []
    keys, shown = config_columns(frame)
    score = scores(frame, split)
    table = []
    for config, members in groups(frame, keys):
        acc = score.loc[members.index]
        entry = {k: config[k] for k in shown}
        entry["runs"] = len(acc)
        for t in thresholds:
            hits = int((acc >= t).sum())
            lo, hi = wilson_interval(hits, len(acc))
            entry.update({f"share_{split}_at_{t:g}": hits / len(acc), f"share_{split}_at_{t:g}_low": lo,
                          f"share_{split}_at_{t:g}_high": hi})
        entry[f"mean_{split}_accuracy"] = float(acc.mean())
        table.append(entry)
    return table


def format_table(table: Sequence[dict[str, Any]]) -> str:
    """The table as aligned text: each share with its interval, e.g. ``0.34 [0.25, 0.44]``."""
    if not table:
        return "(no runs)"
    cells, columns = [], []
    for k in table[0]:
        if k.endswith(("_low", "_high")):
            continue
        columns.append(k)
    for r in table:
        row = []
        for k in columns:
            v = r[k]
            if k.startswith("share_"):
                row.append(f"{v:.2f} [{r[k + '_low']:.2f}, {r[k + '_high']:.2f}]")
            elif isinstance(v, float):
                row.append(f"{v:.4f}" if k.startswith("mean_") else f"{v:g}")
            else:
                row.append(str(v))
        cells.append(row)
    heads = [k.replace("share_", "").replace("_at_", " >= ") if k.startswith("share_") else k for k in columns]
    return aligned(heads, cells)


def aligned(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows of text cells as right-aligned columns under ``headers`` (the CLI's tables)."""
    width = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(headers)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, width)) for line in [list(headers), *rows])
