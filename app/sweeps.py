"""Sweeps: many seeds x a grid of configurations, trained into one results directory
(:mod:`interp.sweep_directory`), one checkpoint and one result row per run.

Runs that can be batched (one shape and recipe up to seed and learning rate, a one-layer attention-only model,
halving or not) are trained together by :func:`interp.population.train_population`, in groups of ``group`` models;
others one at a time by :func:`interp.training.train`. Groups can also run as Ray tasks (``backend="ray"``: a local
Ray instance, or a cluster's address), each writing its own checkpoints; the driver writes the rows as groups
finish.

Nothing is lost: a sweep started again with the same arguments skips every run whose checkpoint exists (and adds
its row if the table lacks it, or if its line in ``results.jsonl`` was damaged), and the group in flight at a
``kill -9`` continues from its last resume file (a population's every ``save_every`` epochs,
``runs/.group-HASH.resume``; a run trained alone, its own), to the same weights as an uninterrupted sweep. Nothing
of the user's is deleted (a group's resume file goes once its checkpoints are written).
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from interp.analyses.halving import scorer as halving_scorer
from interp.configs import STRATEGIES, check_snapshot_every
from interp.errors import ConfigError
from interp.model import ModelSpec
from interp.population import VARYING_CONFIG, check_population, train_population
from interp.registry import GROUP, entry_point_only, get_task, task_plugin
from interp.sweep_directory import (
    PLAN,
    RUNS,
    add_plan,
    check_task,
    grid_options,
    plan,
    plan_entry,
    plan_runs,
    read_plans,
    read_results,
    run_row,
    write_results,
)
from interp.task import Task
from interp.training import TrainConfig, resume_path, train

from .signals import cleanups

ScorerFor = Callable[[str], Any]


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
    """``["d_model=8,32", "lr=1e-3,3e-3"]`` -> ``{"d_model": [8, 32], "lr": [0.001, 0.003]}``: keys are model or
    training options (:func:`interp.sweep_directory.grid_options`), values typed as the option is; ``halving``
    takes ``none`` (or ``normal``) for runs without halving. A value given twice is refused."""
    known = grid_options()
    grid: dict[str, list] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not values:
            raise ConfigError(f"--grid takes KEY=V1,V2,..., got {item!r}")
        if key not in known:
            raise ConfigError(
                f"--grid key {key!r} is not a model or training option; expected one of {', '.join(known)}"
            )
        if key in grid:
            raise ConfigError(f"--grid {key} is given twice; give its values once: {key}=V1,V2,...")
        texts = [v.strip() for v in values.split(",")]
        if key == "attention":  # dilated:W,D and bigbird:W,G,R have commas of their own: rejoin their arguments
            texts = _rejoin_arguments(texts)
        if key == "halving":
            texts = ["none" if t == "normal" else t for t in texts]
        parsed = [known[key].parse(t) for t in texts]
        choices = known[key].choices
        bad = [v for v in parsed if choices is not None and v is not None and v not in choices]
        if bad:
            raise ConfigError(
                f"--grid {key}: {', '.join(map(str, bad))} not among {', '.join(map(str, choices))}"
                + (" (or none)" if known[key].optional else "")
            )
        seen = [json.dumps(v) for v in parsed]
        dups = sorted({t for t, s in zip(texts, seen) if seen.count(s) > 1})
        if dups:
            raise ConfigError(f"--grid {key}: the value(s) {', '.join(dups)} are given more than once")
        grid[key] = parsed
    return grid


def _rejoin_arguments(texts: list[str]) -> list[str]:
    """``["dilated:2", "2", "window:4"]`` -> ``["dilated:2,2", "window:4"]``: no attention spelling starts with a
    digit, so a piece that does is the next argument of the term before it."""
    out: list[str] = []
    for t in texts:
        if t[:1].isdigit() and out:
            out[-1] += f",{t}"
        else:
            out.append(t)
    return out


def parse_strategies(text: str) -> list[str | None]:
    """``--halving none,svc,shapley-svc`` -> ``[None, "svc", "shapley-svc"]``: each a row of Table 1."""
    values = parse_grid([f"halving={text}"])["halving"]
    bad = [v for v in values if v is not None and v not in STRATEGIES]
    if bad:
        raise ConfigError(f"unknown halving strategies {bad}; expected none or one of {', '.join(STRATEGIES)}")
    return values


def _batch_key(run: dict[str, Any]) -> tuple[str, str]:
    """Runs with equal keys may share a population (what :func:`interp.population.check_population` allows to
    differ: the seeds and the learning rate)."""
    spec = {k: v for k, v in asdict(run["spec"]).items() if k != "init_seed"}
    cfg = {k: v for k, v in asdict(run["cfg"]).items() if k not in VARYING_CONFIG}
    return json.dumps(spec, sort_keys=True), json.dumps(cfg, sort_keys=True)


def train_group(
    task: Task,
    specs: Sequence[ModelSpec],
    cfgs: Sequence[TrainConfig],
    paths: Sequence[Path],
    *,
    device: str | None = None,
    threads: int | None = None,
    scorer_for: ScorerFor = halving_scorer,
    progress: bool = False,
    compile: bool = False,
    snapshot_every: int | None = None,
) -> list[dict[str, Any]]:
    """Train one group of runs: as one population where they can be batched, else one at a time (halving runs get
    ``scorer_for(strategy)`` as their head scorer). What a sweep runs locally, or as one Ray task. ``snapshot_every``:
    each run's snapshots beside its checkpoint (``runs/NAME.snapshots/``), as ``interp train --snapshots`` writes
    them. Runs in :func:`interp.determinism.deterministic` with ``threads`` as the thread count (restored after)."""
    from interp.determinism import deterministic

    with deterministic(threads=threads):
        return _train_group(task, specs, cfgs, paths, device, scorer_for, progress, compile, snapshot_every)


def _train_group(task, specs, cfgs, paths, device, scorer_for, progress, compile, snapshot_every):
    try:
        check_population(specs, cfgs)
        batchable = True
    except ConfigError:  # another shape or recipe: one at a time
        batchable = False
    if batchable:  # halving included: each model of the population keeps its own head mask
        strategy = cfgs[0].halving
        scorer = scorer_for(strategy) if strategy is not None else None
        return train_population(
            task,
            specs,
            cfgs,
            paths,
            device=device,
            progress=progress,
            compile=compile,
            head_scorer=scorer,
            resume_file=group_resume_file(paths),
            snapshot_every=snapshot_every,
        )
    provs = []
    for s, c, p in zip(specs, cfgs, paths):
        scorer = scorer_for(c.halving) if c.halving is not None else None
        # a run killed mid-training left its resume file: continue it
        provs.append(
            train(
                task,
                s,
                c,
                p,
                device=device,
                progress=False,
                head_scorer=scorer,
                resume=resume_path(Path(p)).is_file(),
                snapshot_every=snapshot_every,
            )
        )
    return provs


def group_resume_file(paths: Sequence) -> Path:
    """Where a population trained for ``paths`` keeps its resume file: beside the checkpoints, named for the group
    (a hash of its checkpoint names), so a killed sweep continues each group from its last save."""
    names = "\n".join(Path(p).name for p in paths)
    return Path(paths[0]).parent / f".group-{hashlib.sha1(names.encode()).hexdigest()[:16]}.resume"


def _ray_train_group(
    task_name, task_params, specs, cfgs, paths, device, threads, scorer_for, compile=False, snapshot_every=None
):
    """:func:`train_group` in a Ray worker (the task is rebuilt there from its name and parameters, by the registry
    of the worker's process: an entry point)."""
    return train_group(
        get_task(task_name, **task_params),
        specs,
        cfgs,
        paths,
        device=device,
        threads=threads,
        scorer_for=scorer_for,
        compile=compile,
        snapshot_every=snapshot_every,
    )


def run_sweep(
    task: Task,
    base_spec: ModelSpec,
    base_cfg: TrainConfig,
    seeds: Sequence[int],
    grid: dict[str, list],
    directory,
    *,
    group: int = 100,
    device: str | None = None,
    progress: bool = True,
    backend: str = "local",
    ray_address: str | None = None,
    threads: int | None = None,
    scorer_for: ScorerFor = halving_scorer,
    compile: bool = False,
    snapshot_every: int | None = None,
) -> list[dict[str, Any]]:
    """Train every run of the sweep not yet in ``directory``; return the results table (one row per run).

    Every run's configuration is built and checked first (a bad grid value fails before anything is written),
    and a directory holding another task's sweeps is refused. ``backend="local"`` trains the groups one after
    another in this process; ``"ray"`` submits each group as one Ray task (to the cluster at ``ray_address``, or to
    a local one started here) and writes each group's rows as it finishes. Either way a rerun resumes: finished
    runs are skipped, and rows missing from ``results.jsonl`` (or damaged there) are rebuilt from their checkpoints.

    ``snapshot_every=N`` also writes every run's snapshots every N epochs (``runs/NAME.snapshots/``); it is recorded
    in the sweep's plan, so ``interp sweep DIR --resume`` keeps writing them. It is checked, against the shortest
    run's epochs, before anything is written (:func:`interp.configs.check_snapshot_every`)."""
    if group < 1:
        raise ConfigError(f"group must be at least 1, got {group}")
    if backend not in ("local", "ray"):
        raise ConfigError(f"unknown sweep backend {backend!r}; expected 'local' or 'ray'")
    if backend == "ray":
        check_ray_task(task)
    directory = Path(directory)
    runs = plan(task.name, task.params(), base_spec, base_cfg, seeds, grid)  # checks every run's configuration
    check_snapshot_every(snapshot_every, min((r["cfg"].epochs for r in runs), default=base_cfg.epochs))
    check_task(directory, task.name)
    (directory / RUNS).mkdir(parents=True, exist_ok=True)
    add_plan(directory, plan_entry(task.name, task.params(), base_spec, base_cfg, seeds, grid, snapshot_every))
    rows, todo = _rows_and_todo(directory, runs)
    planned = {r["name"] for r in runs}
    others = [name for name in rows if name not in planned]  # rows of earlier sweeps into this directory: kept

    def all_rows() -> list[dict[str, Any]]:
        return [rows[n] for n in others] + [rows[r["name"]] for r in runs if r["name"] in rows]

    write_results(directory, all_rows())
    bar = tqdm(
        total=len(runs), initial=len(runs) - len(todo), desc=f"sweep {task.name}", unit="run", disable=not progress
    )
    by_key: dict[tuple, list] = {}
    for run in todo:
        by_key.setdefault(_batch_key(run), []).append(run)
    chunks = [members[i : i + group] for members in by_key.values() for i in range(0, len(members), group)]

    def finished(chunk, provs) -> None:
        for run, prov in zip(chunk, provs):
            rows[run["name"]] = run_row(run, prov, directory / RUNS / f"{run['name']}.safetensors")
        write_results(directory, all_rows())
        bar.update(len(chunk))

    def args_of(chunk):
        return (
            [r["spec"] for r in chunk],
            [r["cfg"] for r in chunk],
            [directory / RUNS / f"{r['name']}.safetensors" for r in chunk],
        )

    if backend == "local":
        for chunk in chunks:
            finished(
                chunk,
                train_group(
                    task,
                    *args_of(chunk),
                    device=device,
                    threads=threads,
                    scorer_for=scorer_for,
                    progress=progress,
                    compile=compile,
                    snapshot_every=snapshot_every,
                ),
            )
    elif chunks:
        _run_on_ray(task, chunks, args_of, finished, device, threads, scorer_for, ray_address, compile, snapshot_every)
    bar.close()
    return [rows[r["name"]] for r in runs]


def check_ray_task(task: Task) -> None:
    """A ConfigError unless a Ray worker can rebuild ``task`` from its name: only a task registered by an entry
    point is seen by every process (one registered with ``interp.register_task`` lives in this process alone)."""
    if not entry_point_only(task.name):
        raise ConfigError(
            f"task {task.name!r} is registered in this Python process only (interp.register_task, or not at all), so a "
            f"Ray worker cannot build it: register it by an entry point in the group '{GROUP}' of an installed "
            "package (docs/own-task.md), or use backend='local'"
        )
    make = task_plugin(task.name).make
    if isinstance(make, type) and type(task) is not make:
        raise ConfigError(
            f"the task is a {type(task).__qualname__}, but a Ray worker would build task {task.name!r} from its entry "
            f"point as a {make.__qualname__}: register your class under its own name"
        )


def _rows_and_todo(directory: Path, runs: list[dict[str, Any]]) -> tuple[dict[str, dict], list[dict[str, Any]]]:
    """The rows the directory holds (damaged lines left out with a warning), with a row added for every run of any
    of its plans whose checkpoint exists but whose row is missing (killed before the row was written, or a damaged
    line); and the runs of this sweep still to train."""
    from interp.checkpoint import read_metadata

    rows = {r["name"]: r for r in read_results(directory, skip_corrupt=True)}
    known = {r["name"]: r for p in read_plans(directory) for r in plan_runs(p)} if (directory / PLAN).is_file() else {}
    known.update({r["name"]: r for r in runs})
    for name, run in known.items():
        path = directory / RUNS / f"{name}.safetensors"
        if name not in rows and path.is_file():
            rows[name] = run_row(run, read_metadata(path)["training"], path)
    todo = [r for r in runs if not (directory / RUNS / f"{r['name']}.safetensors").is_file()]
    return rows, todo


def resume_sweeps(directory, snapshot_every: int | None = None, **kw: Any) -> None:
    """``interp sweep DIR --resume``: continue every sweep saved in ``DIR/sweep.json``, in order, with the snapshots
    its plan recorded (``snapshot_every`` given: that instead)."""
    for p in read_plans(directory):
        run_sweep(
            get_task(p["task"], **p["task_params"]),
            ModelSpec(**p["spec"]),
            TrainConfig(**p["cfg"]),
            p["seeds"],
            p["grid"],
            directory,
            snapshot_every=p.get("snapshot_every") if snapshot_every is None else snapshot_every,
            **kw,
        )


def _run_on_ray(
    task: Task, chunks, args_of, finished, device, threads, scorer_for, address, compile=False, snapshot_every=None
) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install 'ray>=2.9'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ours = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        if ours is not None:  # Ray installs its own SIGTERM handler (a stack dump, exit 1): keep the command's
            signal.signal(signal.SIGTERM, ours)
        cleanups.append(ray.shutdown)  # an interrupted process stops the cluster it started
    try:
        remote = ray.remote(num_cpus=1)(_ray_train_group)
        pending = {
            remote.remote(
                task.name, task.params(), *args_of(chunk), device, threads or 1, scorer_for, compile, snapshot_every
            ): chunk
            for chunk in chunks
        }
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                finished(pending.pop(ref), ray.get(ref))
    finally:
        if started_here:
            ray.shutdown()
            if ray.shutdown in cleanups:
                cleanups.remove(ray.shutdown)
