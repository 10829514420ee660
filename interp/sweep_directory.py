"""The results directory of a sweep: what it holds, how its runs are named, and how its rows are read back.

A sweep directory holds ``runs/<name>.safetensors`` (ordinary checkpoints), ``results.jsonl`` (one JSON row per
finished run, rewritten atomically as runs finish) with ``results.csv`` beside it (the same rows, flat), and
``sweep.json`` (one plan per ``interp sweep`` into the directory: its task, base model and training options, seeds
and grid). Several sweeps may share a directory (Table 1's normal rows, then its halving rows), as long as they
train one task: each keeps the others' rows.

A run is identified by its whole configuration, not only by the grid values: its name is the task, the grid
values and the seed, readable, then a short hash of everything else that makes it what it is (the task's
parameters and every model and training option that differs from its default). So a second sweep with another
``--d-model`` or ``--set train_size=...`` into the same directory trains its own runs instead of taking the
first sweep's for its own. Options added to the toolkit later, with defaults that keep the old behaviour, do not
change the names of existing runs.

:func:`load_results` reads the rows as one pandas DataFrame, one flat row per run; the statistics over them
(Table 1) are an analysis (``interp.analyses.populations``). The training itself is the app's (``interp.app.sweeps``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .files import atomic_write, atomic_write_text
from .model import ModelSpec
from .options import Option, changed, options
from .training import TrainConfig

if TYPE_CHECKING:
    import pandas as pd

RESULTS = "results.jsonl"
RESULTS_CSV = "results.csv"
PLAN = "sweep.json"
RUNS = "runs"
NESTED = ("accuracy", "metrics", "examples", "population", "halving_result")


def grid_options() -> dict[str, Option]:
    """The options a sweep grid may vary: every model and training option that is part of a run's configuration."""
    return {
        **{k: o for k, o in options(ModelSpec).items() if o.config},
        **{k: o for k, o in options(TrainConfig).items() if o.config},
    }


def config_columns_all() -> tuple[str, ...]:
    """The configuration columns of a results table, in order: the task's parameters (as JSON text), every grid
    option (the halving strategy as ``strategy``, "normal" without one)."""
    return ("task_params", *(k for k in grid_options() if k != "halving"), "strategy")


# -- the runs of a plan ---------------------------------------------------------------------------------------------
def run_identity(task_name: str, task_params: dict[str, Any], spec: ModelSpec, cfg: TrainConfig) -> dict[str, Any]:
    """What makes a run what it is, apart from its seed: the task and its parameters, and every model and training
    option that differs from its default (``init_seed`` and ``seed`` left out; ``save_every`` is bookkeeping; the
    output matrix as the spec resolves it, so leaving it unset and naming the same one are the same run)."""
    train_opts = options(TrainConfig)
    spec_kw = {k: v for k, v in changed(replace(spec, output_matrix=spec.w_o)).items() if k != "init_seed"}
    cfg_kw = {k: v for k, v in changed(cfg).items() if k != "seed" and (k not in train_opts or train_opts[k].config)}
    return json.loads(json.dumps({"task": task_name, "task_params": task_params, "spec": spec_kw, "cfg": cfg_kw}))


def config_hash(identity: dict[str, Any]) -> str:
    """Eight hex digits of the SHA-1 of a run identity (:func:`run_identity`)."""
    return hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]


def run_name(task_name: str, point: dict[str, Any], seed: int, digest: str) -> str:
    """``<task>-<grid key><value>...-seed<S>-<config hash>``: readable, and unique for the whole configuration."""
    parts = [task_name] + [f"{k}{'none' if v is None else v}" for k, v in point.items()] + [f"seed{seed}", digest]
    return "-".join(str(p).replace("/", "_").replace(" ", "") for p in parts)


def plan(
    task_name: str,
    task_params: dict[str, Any],
    base_spec: ModelSpec,
    base_cfg: TrainConfig,
    seeds: Sequence[int],
    grid: dict[str, list],
) -> list[dict[str, Any]]:
    """Every run of a sweep: ``{"name", "point" (grid values), "seed", "spec", "cfg", "identity"}``. Each grid point's
    spec and config are built here, so an invalid combination is a ConfigError before anything is trained or
    written. A spec whose output matrix is left unset gets the identity where the grid point's heads fill the
    residual stream, else a learned one (:attr:`interp.model.ModelSpec.w_o`)."""
    known = grid_options()
    bad = [k for k in grid if k not in known]
    if bad:
        raise ConfigError(f"grid key(s) {bad} are not model or training options; expected one of {', '.join(known)}")
    spec_keys = set(options(ModelSpec))
    keys = list(grid)
    runs = []
    for values in itertools.product(*(grid[k] for k in keys)) if keys else [()]:
        point = dict(zip(keys, values))
        spec0 = replace(base_spec, **{k: v for k, v in point.items() if k in spec_keys})
        cfg0 = replace(base_cfg, **{k: v for k, v in point.items() if k not in spec_keys})
        identity = run_identity(task_name, task_params, spec0, cfg0)
        digest = config_hash(identity)
        for seed in seeds:
            runs.append(
                {
                    "name": run_name(task_name, point, seed, digest),
                    "point": point,
                    "seed": seed,
                    "spec": replace(spec0, init_seed=seed),
                    "cfg": replace(cfg0, seed=seed),
                    "identity": identity,
                }
            )
    return runs


# -- rows -----------------------------------------------------------------------------------------------------------
def checkpoint_path(directory, row: Mapping[str, Any] | pd.Series) -> Path:
    """The checkpoint of a results row. Rows name it relative to the sweep directory (``runs/NAME.safetensors``),
    so a directory can be moved or shipped; rows of older sweeps hold an absolute path, used if it still exists."""
    path = Path(row["checkpoint"])
    if path.is_absolute() and path.is_file():
        return path
    return Path(directory) / RUNS / path.name


def run_row(run: dict[str, Any], prov: dict[str, Any], path: Path) -> dict[str, Any]:
    """One run's row: its task and whole configuration, seed, epochs, every metric of every split the task reports
    (as recorded in the provenance, ``prov["metrics"][split]``) and the number of examples of each split (so
    thresholds are compared on counts of correct examples, :mod:`interp.thresholds`), the heads left active, wall
    time and population."""
    spec, cfg = asdict(run["spec"]), asdict(run["cfg"])
    spec["output_matrix"] = run["spec"].w_o
    halving = prov.get("halving")
    identity = run["identity"]
    return {
        "name": run["name"],
        "task": identity["task"],
        "task_params": identity["task_params"],
        "config_hash": config_hash(identity),
        **{k: spec[k] for k in grid_options() if k in spec},
        **{k: cfg[k] for k in grid_options() if k in cfg},
        "strategy": cfg["halving"] or "normal",
        "seed": run["seed"],
        "checkpoint": f"{RUNS}/{Path(path).name}",
        "best_epoch": prov.get("best_epoch"),
        "kept_epoch": prov["kept_epoch"],
        "epochs_run": prov["epochs_run"],
        "accuracy": prov["accuracy"],
        "metrics": prov.get("metrics"),
        "examples": prov.get("examples"),
        "final_active_heads": len(halving["active"]) if halving else spec["n_layers"] * spec["n_heads"],
        "wall_seconds": prov.get("wall_seconds_this_run"),
        "population": prov.get("population"),
        "halving_result": halving,
    }


class CorruptRows(ConfigError):
    """``results.jsonl`` holds lines that are not JSON rows."""


def read_results(directory, *, skip_corrupt: bool = False) -> list[dict[str, Any]]:
    """The rows of ``results.jsonl`` (none if there is no such file). A line that is not a JSON row is a
    :class:`CorruptRows` error naming it and the way out (``interp sweep DIR --resume`` rebuilds every row whose
    checkpoint is in ``runs/``), or with ``skip_corrupt`` a warning, and the line is left out."""
    path = Path(directory) / RESULTS
    if not path.is_file():
        return []
    rows, bad = [], []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and "name" in row:
            rows.append(row)
        else:
            bad.append(i)
    if bad:
        lines = f"line{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad[:10]))}" + (" ..." if len(bad) > 10 else "")
        verb = "are not JSON rows" if len(bad) > 1 else "is not a JSON row"
        message = f"{path}: {lines} of {len(rows) + len(bad)} {verb} (the file is written atomically: was it edited?)"
        if not skip_corrupt:
            raise CorruptRows(
                f"{message}; `interp sweep {directory} --resume` rebuilds the rows from the checkpoints in "
                f"{Path(directory) / RUNS} (rows without a checkpoint there cannot be rebuilt)"
            )
        warnings.warn(f"{message}; left out, and rebuilt from their checkpoints where these exist", stacklevel=2)
    return rows


def write_results(directory: Path, rows: list[dict[str, Any]]) -> None:
    """``results.jsonl`` and, beside it, ``results.csv`` (the flat rows of :func:`load_results`), each atomically."""
    atomic_write(
        directory / RESULTS,
        lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in rows)),
        "the sweep's results table",
    )
    frame = results_frame(rows)
    atomic_write(directory / RESULTS_CSV, lambda tmp: frame.to_csv(tmp, index=False), "the sweep's results CSV")


# -- plans ----------------------------------------------------------------------------------------------------------
def plan_entry(
    task_name: str,
    task_params: dict[str, Any],
    base_spec: ModelSpec,
    base_cfg: TrainConfig,
    seeds: Sequence[int],
    grid: dict[str, list],
    snapshot_every: int | None = None,
) -> dict[str, Any]:
    """A sweep's arguments as ``sweep.json`` keeps them (JSON types; the spec as given, its output matrix unset
    where it was not asked for; ``snapshot_every`` only where the sweep writes snapshots, so plans of sweeps
    without them read as they did)."""
    entry = {
        "task": task_name,
        "task_params": task_params,
        "spec": asdict(base_spec),
        "cfg": asdict(base_cfg),
        "seeds": list(seeds),
        "grid": grid,
    }
    if snapshot_every is not None:
        entry["snapshot_every"] = snapshot_every
    return json.loads(json.dumps(entry))


def check_task(directory: Path, task_name: str) -> None:
    """A sweep directory holds one task's runs: a sweep of another task is refused, naming the one it holds."""
    if (Path(directory) / PLAN).is_file():
        held = {p["task"] for p in read_plans(directory)}
        if held and task_name not in held:
            raise ConfigError(
                f"{directory} holds sweeps of {', '.join(sorted(held))}; a sweep of {task_name} needs a "
                "directory of its own (one task per results table)"
            )


def add_plan(directory: Path, entry: dict[str, Any]) -> None:
    """Add a sweep's arguments (:func:`plan_entry`) to ``sweep.json`` (``{"plans": [...]}``, one entry per distinct
    ``interp sweep`` into the directory). The same sweep again with other snapshots replaces its entry (one plan per
    set of runs: a resume then writes the snapshots last asked for)."""
    check_task(directory, entry["task"])
    plans = read_plans(directory) if (directory / PLAN).is_file() else []
    runs_of = lambda p: {k: v for k, v in p.items() if k != "snapshot_every"}  # noqa: E731
    plans = [p for p in plans if p == entry or runs_of(p) != runs_of(entry)]
    if entry not in plans:
        atomic_write_text(directory / PLAN, json.dumps({"plans": plans + [entry]}, indent=1) + "\n", "the sweep's plan")


def read_plans(directory) -> list[dict[str, Any]]:
    """The plans in ``sweep.json`` (the arguments of every ``interp sweep`` into ``directory``), or a ConfigError."""
    path = Path(directory) / PLAN
    if not path.is_file():
        raise ConfigError(
            f"{directory} is not a sweep directory with a plan (no {PLAN}; sweeps written before it "
            "existed need their original command, with --status)"
        )
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ConfigError(f"{path} is not JSON (it is written atomically: was it edited?)") from None
    return d.get("plans", [d])  # a file of one plan


def plan_runs(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of one ``sweep.json`` plan."""
    return plan(
        entry["task"],
        entry["task_params"],
        ModelSpec(**entry["spec"]),
        TrainConfig(**entry["cfg"]),
        entry["seeds"],
        entry["grid"],
    )


def planned_runs(directory) -> list[dict[str, Any]]:
    """The runs of every plan ``directory`` holds (a run in two plans once)."""
    runs: dict[str, dict[str, Any]] = {}
    for p in read_plans(directory):
        for run in plan_runs(p):
            runs.setdefault(run["name"], run)
    return list(runs.values())


def run_config(run: dict[str, Any]) -> dict[str, Any]:
    """A planned run's configuration as table columns (:func:`config_columns_all`)."""
    spec, cfg = asdict(run["spec"]), asdict(run["cfg"])
    spec["output_matrix"] = run["spec"].w_o
    out = {"task_params": json.dumps(run["identity"]["task_params"], sort_keys=True)}
    for k in config_columns_all()[1:-1]:
        out[k] = spec[k] if k in spec else cfg[k]
    out["strategy"] = cfg["halving"] or "normal"
    return out


def sweep_status(directory, runs: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What is done and what is left, per configuration, without training: ``runs`` planned, ``done`` (a checkpoint
    exists), ``rows`` (in results.jsonl), ``todo``. Each entry shows every configuration key that differs between
    the planned runs (base options included, not only the grid's), and the strategy. ``runs`` defaults to the
    saved plans."""
    directory = Path(directory)
    runs = planned_runs(directory) if runs is None else runs
    named = {r["name"] for r in read_results(directory, skip_corrupt=True)}
    configs = [run_config(r) for r in runs]
    varying = [
        k
        for k in config_columns_all()
        if k == "strategy" or len({json.dumps(c[k], sort_keys=True) for c in configs}) > 1
    ]
    status: dict[str, dict[str, Any]] = {}
    for run, config in zip(runs, configs):
        shown = {k: config[k] for k in varying}
        entry = status.setdefault(
            json.dumps(run["identity"], sort_keys=True), {**shown, "runs": 0, "done": 0, "rows": 0, "todo": 0}
        )
        done = (directory / RUNS / f"{run['name']}.safetensors").is_file()
        entry["runs"] += 1
        entry["done"] += done
        entry["todo"] += not done
        entry["rows"] += run["name"] in named
    return list(status.values())


# -- the rows as a table --------------------------------------------------------------------------------------------
def plain(x):
    """numpy scalars as Python numbers, NaN as None (so values group and print alike)."""
    if hasattr(x, "item") and not isinstance(x, (list, dict, str)):
        x = x.item()
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def flat_row(row: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A results.jsonl row as flat columns: the task, the configuration (``task_params`` as JSON text, every grid
    option, ``strategy``), every metric of every split as ``<split>_<metric>`` (e.g. ``test_accuracy``),
    ``population_size`` and ``_forward``, ``halving_success``, ``final_active_heads``. Rows of older sweeps lack part
    of the configuration: ``meta`` (the run's checkpoint metadata) fills it in where given, and options the toolkit
    gained since take their defaults (which keep the old behaviour)."""
    out = {k: v for k, v in row.items() if k not in NESTED}
    if isinstance(out.get("task_params"), dict):
        out["task_params"] = json.dumps(out["task_params"], sort_keys=True)
    opts = grid_options()
    if meta is not None:
        spec, training = meta.get("model_spec") or {}, meta.get("training", {})
        cfg = training.get("config", {})
        for k in opts:
            if k in spec or k in cfg:  # an option the checkpoint predates takes its default below
                out.setdefault(k, spec[k] if k in spec else cfg[k])
        out.setdefault("task", meta.get("task", {}).get("name"))
        out.setdefault("task_params", json.dumps(meta.get("task", {}).get("params", {}), sort_keys=True))
        out.setdefault("best_epoch", training.get("best_epoch"))
        out.setdefault("wall_seconds", training.get("wall_seconds_this_run"))
        if "metrics" not in row and "metrics" in training:
            row = {**row, "metrics": training["metrics"]}
    for k, o in opts.items():
        out.setdefault(k, o.default)
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
    examples = row.get("examples") or (meta or {}).get("training", {}).get("examples") or {}
    for split, n in examples.items():
        out[f"{split}_examples"] = n
    population = row.get("population") or {}
    out["population_size"] = population.get("size", 1)
    out["population_forward"] = population.get("forward")
    out["halving_success"] = halving.get("success") if halving else None
    first = ["name", "task", *config_columns_all(), "halving", "seed"]
    return {**{k: out[k] for k in first if k in out}, **{k: v for k, v in out.items() if k not in first}}


def where_of(args: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` command-line arguments as the selection :func:`select_rows` takes; an argument without ``=`` is
    refused, naming it."""
    bad = [a for a in args if "=" not in a or a.startswith("=")]
    if bad:
        raise ConfigError(f"{bad[0]!r} is not a selection (expected KEY=VALUE, e.g. d_model=8 or strategy=normal)")
    return dict(a.split("=", 1) for a in args)


def select_rows(directory, where: Mapping[str, str]) -> list[dict[str, Any]]:
    """The rows of a sweep directory whose configuration, as the results table reads it (:func:`flat_row`: an option
    a row predates at its default, ``strategy`` "normal" without halving), matches every ``KEY=VALUE`` of ``where``,
    the value compared as text (``{"d_model": "8"}``). A key that is no column of the table is refused, naming the
    columns, so a misspelt selection cannot select nothing silently."""
    flats = [(row, flat_row(row)) for row in read_results(directory)]
    known = set().union(*(f.keys() for _, f in flats)) if flats else set(grid_options())
    unknown = sorted(set(where) - known)
    if unknown:
        raise ConfigError(
            f"no column {', '.join(map(repr, unknown))} in the results of {directory} "
            f"(expected KEY=VALUE with KEY one of: {', '.join(sorted(known))})"
        )
    return [row for row, f in flats if all(str(f.get(k)) == v for k, v in where.items())]


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
        raise ConfigError(
            f"{directory} holds no sweep results (no {RESULTS}): expected a directory written by interp sweep"
        )
    flat = []
    for row in read_results(directory):
        meta = None
        if any(k not in row for k in ("task", *grid_options())) and row.get("checkpoint"):
            path = checkpoint_path(directory, row)
            if path.is_file():
                meta = read_metadata(path)
        flat.append(flat_row(row, meta))
    return pd.DataFrame(flat)
