"""Sweeps: many seeds x a grid of configurations, trained into one directory, one checkpoint and one result row per
run; and the population table read back from it (issue 11).

A sweep directory holds ``runs/<name>.safetensors`` (ordinary checkpoints) and ``results.jsonl`` (one JSON row per
finished run, rewritten atomically after every group of runs). Runs that can be batched (one shape and recipe up to
seed and learning rate, a one-layer attention-only model, halving or not) are trained together by :func:`interp.population.
train_population`, in groups of ``group`` models; others one at a time by :func:`interp.training.train`.

Groups can also run as Ray tasks (``backend="ray"``: a local Ray instance, or a cluster's address), each writing
its own checkpoints; the driver writes the rows as groups finish.

Nothing is lost: a sweep started again with the same arguments skips every run whose checkpoint exists (and adds
its row if the table lacks it), so after ``kill -9`` only the group in flight is trained again (to the same
weights: every run is deterministic for its seed). Nothing is deleted.
"""

from __future__ import annotations

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
        grid[key] = parsed
    return grid


def run_name(task_name: str, point: dict[str, Any], seed: int) -> str:
    parts = [task_name] + [f"{k}{v}" for k, v in point.items()] + [f"seed{seed}"]
    return "-".join(str(p).replace("/", "_").replace(" ", "") for p in parts)


def plan(task, base_spec, base_cfg, seeds: Sequence[int], grid: dict[str, list]) -> list[dict[str, Any]]:
    """Every run of the sweep: ``{"name", "point" (grid values), "seed", "spec", "cfg"}``."""
    keys = list(grid)
    runs = []
    for values in itertools.product(*(grid[k] for k in keys)) if keys else [()]:
        point = dict(zip(keys, values))
        spec_kw = {k: v for k, v in point.items() if k in SPEC_GRID}
        cfg_kw = {k: v for k, v in point.items() if k in TRAIN_GRID}
        spec0 = replace(base_spec, **spec_kw)
        if "output_matrix" not in spec_kw and spec0.output_matrix == "identity" \
                and spec0.n_heads * spec0.d_head != spec0.d_model:
            spec0 = replace(spec0, output_matrix="learned")  # as `interp train` does
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


def _row(run, prov: dict[str, Any], path: Path) -> dict[str, Any]:
    return {"name": run["name"], **run["point"], "seed": run["seed"], "checkpoint": str(path),
            "accuracy": prov["accuracy"], "kept_epoch": prov["kept_epoch"], "epochs_run": prov["epochs_run"],
            "population": prov.get("population"), "halving_result": prov.get("halving")}


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
    from .files import atomic_write

    atomic_write(directory / RESULTS, lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in rows)),
                 "the sweep's results table")


def train_group(task, specs, cfgs, paths, *, device: str | None = None, threads: int | None = None,
                scorer_for: Callable[[str], Any] | None = None, progress: bool = False,
                compile: bool = False) -> list[dict[str, Any]]:
    """Train one group of runs: as one population where they can be batched, else one at a time (halving runs get
    ``scorer_for(strategy)`` as their head scorer). What a sweep runs locally, or as one Ray task."""
    import torch

    from .population import check_population, train_population
    from .training import train

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
                                head_scorer=scorer)
    provs = []
    for s, c, p in zip(specs, cfgs, paths):
        if c.halving is not None and scorer_for is None:
            raise ConfigError("halving runs in a sweep need a head scorer (the CLI passes analyses.halving.scorer)")
        scorer = scorer_for(c.halving) if c.halving is not None else None
        provs.append(train(task, s, c, p, device=device, progress=False, head_scorer=scorer))
    return provs


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
    rows = {r["name"]: r for r in read_results(directory)}
    todo = []
    for run in runs:
        path = directory / "runs" / f"{run['name']}.safetensors"
        if path.is_file():
            if run["name"] not in rows:  # finished, but killed before its row was written
                rows[run["name"]] = _row(run, read_metadata(path)["training"], path)
        else:
            todo.append(run)
    _write_results(directory, [rows[r["name"]] for r in runs if r["name"] in rows])
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc=f"sweep {task.name}", unit="run",
               disable=not progress)
    by_key: dict[tuple, list] = {}
    for run in todo:
        by_key.setdefault(_batch_key(run), []).append(run)
    chunks = [members[i:i + group] for members in by_key.values() for i in range(0, len(members), group)]

    def finished(chunk, provs) -> None:
        for run, prov in zip(chunk, provs):
            rows[run["name"]] = _row(run, prov, directory / "runs" / f"{run['name']}.safetensors")
        _write_results(directory, [rows[r["name"]] for r in runs if r["name"] in rows])
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


def population_table(rows: Sequence[dict[str, Any]], *, split: str = "test", threshold: float = 1.0
                     ) -> list[dict[str, Any]]:
    """Table 1's statistic per configuration: the share of runs whose ``split`` accuracy reaches ``threshold``
    (the seed: 100% test accuracy; a failed halving run counts 0), with its 95% Wilson interval, and the mean."""
    configs: dict[str, list] = {}
    for r in rows:
        point = {k: v for k, v in r.items() if k not in ("name", "seed", "checkpoint", "accuracy", "kept_epoch",
                                                          "epochs_run", "population", "halving_result")}
        configs.setdefault(json.dumps(point, sort_keys=True), []).append(r)
    table = []
    for key, members in configs.items():
        # a halving run that did not end with one head is a failure and scores 0 (seed 000 §5.5)
        accs = [0.0 if (m.get("halving_result") or {}).get("success") is False else m["accuracy"][split]
                for m in members]
        hits = sum(a >= threshold for a in accs)
        lo, hi = wilson_interval(hits, len(accs))
        table.append({**json.loads(key), "runs": len(accs), f"share_{split}_at_{threshold:g}": hits / len(accs),
                      "ci_low": lo, "ci_high": hi, f"mean_{split}_accuracy": sum(accs) / len(accs)})
    return table
