"""The ``interp`` command line. Heavy imports happen inside the commands, so ``--help`` is instant."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise SystemExit(f"interp: error: {message} (see '{self.prog} --help')")


def _checked(convert, ok, expected: str):
    """An argparse type: ``convert`` the text, then require ``ok(value)``; errors say what was expected."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


_positive_int = _checked(int, lambda v: v >= 1, "a positive integer")
_nonneg_int = _checked(int, lambda v: v >= 0, "a non-negative integer")
_positive_float = _checked(float, lambda v: v > 0, "a positive number")
_fraction = _checked(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
_threshold = _checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
_nonneg_float = _checked(float, lambda v: v >= 0, "a non-negative number")


def _add_common(p, threads: bool = True) -> None:
    p.add_argument("--device", default=None, help="auto (default: cuda if available, else cpu), cpu, cuda, cuda:N")
    if threads:
        p.add_argument("--threads", type=_positive_int, default=None,
                       help="CPU threads for torch (default: torch's own choice); results can differ in the last bits "
                            "between thread counts, and on a loaded machine fewer threads can be much faster")


def _add_model_and_training_options(p, TASKS) -> None:
    """The task, model and training options shared by ``train`` and ``sweep``."""
    p.add_argument("task", help="task name: " + ", ".join(sorted(TASKS)))
    p.add_argument("--set", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help="task parameter, e.g. --set train_size=2000 --set 'test_lengths=[151,300]' (repeatable)")
    p.add_argument("--d-model", type=_positive_int)
    p.add_argument("--n-heads", type=_positive_int)
    p.add_argument("--d-head", type=_positive_int)
    p.add_argument("--n-layers", type=_positive_int)
    p.add_argument("--positional", choices=["none", "standard", "shortformer", "rotary", "random", "abacus"],
                   help="positional embedding: none (zeroed, frozen), standard (added to the residual stream), "
                        "shortformer (into queries and keys only), rotary, random (randomised positions in training), "
                        "abacus (index of a digit within its number; see interp.positions); default: the task's")
    p.add_argument("--output-matrix", choices=["identity", "learned"],
                   help="default: the task's (identity when n_heads*d_head == d_model, else learned)")
    p.add_argument("--epochs", type=_positive_int, default=None, help="default: the task's")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="default: the task's (128)")
    p.add_argument("--lr", type=_positive_float, default=None, help="default: the task's (1e-3)")
    p.add_argument("--weight-decay", type=_nonneg_float, default=None, help="default: the task's (0.01)")
    p.add_argument("--dropout", type=_fraction, default=None, help="default: the task's (0.1)")
    p.add_argument("--dropout-at", choices=["embedding+attention", "attention"], default=None,
                   help="where dropout goes (default embedding+attention; 'attention' allows the O(vocab) batched "
                        "forward of interp.population)")
    p.add_argument("--patience", type=_positive_int, default=None, help="stop after this many epochs without a better validation accuracy")
    p.add_argument("--keep", choices=["best", "first-best", "last"], default=None,
                   help="the model written: best (default: highest validation accuracy, ties by lower validation loss), "
                        "first-best (the first epoch at the highest validation accuracy) or last (the final epoch)")


def build_parser() -> argparse.ArgumentParser:
    from tasks import TASKS  # the table only: no task module (and no torch) is imported

    p = _Parser(prog="interp", description="Train, evaluate and take apart small transformers on algorithmic tasks.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    t = sub.add_parser("train", help="train a model on a task and write a .safetensors checkpoint")
    _add_model_and_training_options(t, TASKS)
    t.add_argument("--halving", choices=["random", "svc", "learned", "shapley-svc", "shapley-learned", "mask-all-but-one"],
                   default=None, help="halving heads (seed 000 §5.5): when validation accuracy reaches the threshold, "
                                      "mask half of the active heads, keeping the best by this strategy; repeat until one "
                                      "head is left (mask-all-but-one: a-1 heads masked from the start)")
    t.add_argument("--halving-threshold", type=_threshold, default=None,
                   help="validation accuracy that triggers a halving step (default 0.95)")
    t.add_argument("--save-every", type=_positive_int, default=None, help="epochs between resume files (default 5)")
    t.add_argument("--seed", type=_nonneg_int, default=None, help="default 0")
    t.add_argument("--snapshots", type=_positive_int, default=None, metavar="N",
                   help="also write a checkpoint every N epochs into OUT.snapshots/ (a task suite may then compute "
                        "progress measures from them into the checkpoint's history)")
    t.add_argument("--out", default=None, help="checkpoint path (default: runs/TASK-seedN.safetensors)")
    t.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its resume file (its options are read from that file)")
    t.add_argument("--restart", action="store_true", help="delete an interrupted run's resume file and start over")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(t)

    e = sub.add_parser("eval", help="accuracy of a checkpoint on every split")
    e.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    e.add_argument("--set", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help="override a task parameter, e.g. --set 'test_lengths=[201,400]' (length generalisation; a model "
                        "without positional embedding takes sequences longer than its training context)")
    e.add_argument("--splits", default=None, metavar="S1,S2",
                   help="only these splits, e.g. --splits test,val (default: every split of the task)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    _add_common(e)

    a = sub.add_parser("analyze", help="analysis summary of a checkpoint (the task's analysis suite)")
    a.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--out", default=None, help="also save the JSON to this file")
    _add_common(a)

    r = sub.add_parser("report", help="write one self-contained HTML report of a checkpoint, or of a sweep directory")
    r.add_argument("checkpoint", help="a .safetensors path, the name of a shipped checkpoint, or a sweep directory "
                                      "(Table 1, accuracy figures, the head census)")
    r.add_argument("--out", default="report.html", help="output HTML file (default: report.html)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(r)

    sw = sub.add_parser("sweep", help="train many seeds x a grid of configurations into one directory (resumable)",
                        description="interp sweep TASK [options] --out DIR trains the sweep into DIR; "
                                    "interp sweep DIR --status says what is done, interp sweep DIR --resume continues it.")
    _add_model_and_training_options(sw, TASKS)
    sw.add_argument("--seeds", default="0..9", help="'A..B' (inclusive) or a comma-separated list (default 0..9)")
    sw.add_argument("--grid", nargs="*", default=[], metavar="KEY=V1,V2",
                    help="options to vary, e.g. --grid d_model=8,32 n_heads=4,16 lr=1e-3,3e-3")
    sw.add_argument("--out", default=None, help="the sweep directory (runs/, results.jsonl, results.csv, sweep.json); "
                                                "rerun to resume")
    sw.add_argument("--batch", dest="group", type=_positive_int, default=100, metavar="K",
                    help="models trained together as one batched computation (one-layer attention-only; default 100)")
    sw.add_argument("--group", dest="group", type=_positive_int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sw.add_argument("--halving", default=None, metavar="S1,S2",
                    help="halving strategies, comma-separated, each a row of Table 1: none (normal runs), random, svc, "
                         "learned, shapley-svc, shapley-learned, mask-all-but-one (e.g. --halving none,svc,shapley-svc)")
    sw.add_argument("--halving-threshold", type=_threshold, default=None)
    sw.add_argument("--backend", choices=["local", "ray"], default="local",
                    help="local: batches one after another here; ray: each batch a Ray task (local Ray instance, or "
                         "--address of a running cluster)")
    sw.add_argument("--address", dest="ray_address", default=None, metavar="ADDR",
                    help="a Ray cluster, e.g. auto, or ray://host:10001 (default: start a local one)")
    sw.add_argument("--ray-address", dest="ray_address", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sw.add_argument("--status", action="store_true",
                    help="train nothing: per configuration, the runs done and to do (interp sweep DIR --status reads "
                         "DIR/sweep.json; with the sweep's own arguments and --out it plans them)")
    sw.add_argument("--resume", action="store_true",
                    help="interp sweep DIR --resume: continue the sweep saved in DIR/sweep.json (a rerun of the "
                         "original command resumes too)")
    sw.add_argument("--compile", action="store_true",
                    help="torch.compile each population's token-count training step (--dropout-at attention; "
                         "~1.5x faster steps after seconds of compilation; needs a C++ compiler)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(sw)

    tb = sub.add_parser("table", help="Table 1 of a sweep directory: per configuration and strategy, the share of runs "
                                      "at 100%% and >= 98%% test accuracy with Wilson 95%% intervals, and the mean")
    tb.add_argument("directory", help="a sweep directory (written by interp sweep)")
    tb.add_argument("--split", default="test")
    tb.add_argument("--threshold", dest="thresholds", type=_threshold, action="append", default=None,
                    help="accuracy counted as reached (repeatable; default: 1.0 and 0.98)")
    tb.add_argument("--json", action="store_true", help="print JSON rows")

    sub.add_parser("list", help="list tasks and shipped checkpoints")
    _add_shapley_parser(sub)
    return p


def _parse_task_params(items: list[str]) -> dict:
    """``["train_size=2000", "test_lengths=[151,300]"]`` -> dict; values are JSON, else strings."""
    from interp.errors import TaskError

    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TaskError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value
    return params


TRAIN_KEYS = ("epochs", "batch_size", "lr", "weight_decay", "dropout", "dropout_at", "patience", "keep", "halving",
              "halving_threshold")
SPEC_KEYS = ("d_model", "n_heads", "d_head", "n_layers", "positional", "output_matrix")


def _set_threads(args) -> None:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def _train_setup(args):
    """(task, spec, config, out) of a new run from the options given and the task's defaults."""
    from interp.model import ModelSpec
    from interp.training import TrainConfig
    from tasks import get_task

    task = get_task(args.task, **_parse_task_params(args.task_params))
    seed = 0 if args.seed is None else args.seed
    spec_kw = task.default_spec()
    for key in SPEC_KEYS:
        if getattr(args, key) is not None:
            spec_kw[key] = getattr(args, key)
    if args.output_matrix is None and spec_kw.get("output_matrix") == "identity" \
            and spec_kw["n_heads"] * spec_kw["d_head"] != spec_kw["d_model"]:
        spec_kw["output_matrix"] = "learned"  # the seed's 64-head d=2 model: a trained W_O
    spec = ModelSpec(**{**spec_kw, "init_seed": seed})
    train_kw = dict(task.default_train())
    for key in TRAIN_KEYS:
        if getattr(args, key, None) is not None:
            train_kw[key] = getattr(args, key)
    cfg = TrainConfig(**{**train_kw, "seed": seed, "save_every": args.save_every or 5})
    out = Path(args.out) if args.out else Path("runs") / f"{task.name}-seed{seed}.safetensors"
    return task, spec, cfg, out


def _resume_setup(args):
    """(task, spec, config, out) of an interrupted run, from its resume file; options given on the command line
    must agree with it, except the run options that may change (epochs, patience, save-every, keep)."""
    from interp.errors import ConfigError
    from interp.model import ModelSpec
    from interp.training import RUN_OPTIONS, TrainConfig, resume_options
    from tasks import get_task

    if not args.out:
        raise ConfigError("--resume needs --out: the checkpoint path of the interrupted run")
    saved = resume_options(args.out)
    conflicts = []
    if args.task != saved["task"]["name"]:
        conflicts.append(f"task {args.task} (the run trains {saved['task']['name']})")
    for key, value in _parse_task_params(args.task_params).items():
        if saved["task"]["params"].get(key) != value:
            conflicts.append(f"--set {key}={json.dumps(value)} (the run has {json.dumps(saved['task']['params'].get(key))})")
    for key in SPEC_KEYS:
        given = getattr(args, key)
        if given is not None and saved["spec"].get(key) != given:
            conflicts.append(f"--{key.replace('_', '-')} {given} (the run has {saved['spec'].get(key)})")
    config = dict(saved["config"])
    for key in TRAIN_KEYS + ("seed", "save_every"):
        given = getattr(args, key)
        if given is None:
            continue
        if key in RUN_OPTIONS:
            config[key] = given
        elif config.get(key) != given:
            conflicts.append(f"--{key.replace('_', '-')} {given} (the run has {config.get(key)})")
    if conflicts:
        raise ConfigError("--resume: options contradict the interrupted run: " + "; ".join(conflicts)
                          + " (leave them out to continue it, or --restart to start over)")
    task = get_task(saved["task"]["name"], **saved["task"]["params"])
    return task, ModelSpec.from_dict(saved["spec"]), TrainConfig(**config), Path(args.out)


def cmd_train(args) -> int:
    from interp.training import train

    _set_threads(args)
    task, spec, cfg, out = _resume_setup(args) if args.resume else _train_setup(args)
    if not args.out:
        out.parent.mkdir(parents=True, exist_ok=True)
    scorer = None
    if cfg.halving is not None:
        from analyses.halving import scorer as halving_scorer

        scorer = halving_scorer(cfg.halving)
    prov = train(task, spec, cfg, out, device=args.device, resume=args.resume, restart=args.restart,
                 progress=not args.quiet, snapshot_every=args.snapshots, head_scorer=scorer)
    if args.snapshots:
        _finish_run(task, out, args.device)
    acc = prov["accuracy"]
    print(f"wrote {out}: kept epoch {prov['kept_epoch']}/{prov['epochs_run']} ({prov['kept']}), accuracy "
          + ", ".join(f"{k} {v:.4f}" for k, v in acc.items()))
    if "halving" in prov:
        h = prov["halving"]
        print(f"halving ({h['strategy']}): {h['n_steps']} step(s) at epoch(s) {[s['epoch'] for s in h['steps']]}, "
              f"active heads {', '.join(h['active'])}; " + ("one head left" if h["success"] else "FAILED (more than one "
              "head left): scored 0"))
    return 0


def _finish_run(task, out, device) -> None:
    """The task suite's ``finish_run(out, snapshot_dir)`` (e.g. progress measures from the snapshots), if it has one."""
    from analyses import suite_for
    from interp.errors import TaskError

    try:
        suite = suite_for(task)
    except TaskError:
        return
    finish = getattr(suite, "finish_run", None)
    if finish is not None:
        snapshot_dir = out.with_name(out.name.removesuffix(".safetensors") + ".snapshots")
        print(f"{task.name}: {finish(out, snapshot_dir, device=device)}")


def cmd_eval(args) -> int:
    from interp.checkpoint import load_checkpoint
    from interp.evaluate import evaluate_splits

    _set_threads(args)
    params = _parse_task_params(args.task_params)
    ckpt = load_checkpoint(args.checkpoint, device=args.device, task_params=params or None)
    splits = None
    if args.splits:
        from interp.errors import TaskError

        splits = [x.strip() for x in args.splits.split(",") if x.strip()]
        unknown = [x for x in splits if x not in ckpt.task.splits]
        if unknown or not splits:
            raise TaskError(f"--splits {args.splits!r}: {ckpt.task.name} has the splits {', '.join(ckpt.task.splits)}")
    metrics = evaluate_splits(ckpt.model, ckpt.task, splits)
    if args.json:
        print(json.dumps({
            "task": ckpt.task.name, "checkpoint": str(ckpt.path), "task_params": ckpt.task.params(),
            "accuracy": {s: m["accuracy"] for s, m in metrics.items()}, "metrics": metrics,
        }))
    else:
        print(f"{ckpt.path} ({ckpt.task.name})" + (f", task parameters changed: {params}" if params else ""))
        keys = list(next(iter(metrics.values())).keys())
        print(f"{'split':<8}" + "".join(f"{k:>14}" for k in keys))
        for split, m in metrics.items():
            print(f"{split:<8}" + "".join(f"{m[k]:>14.4f}" for k in keys))
    return 0


def cmd_analyze(args) -> int:
    from analyses import suite_for
    from interp.checkpoint import load_checkpoint
    from interp.files import AtomicFile

    _set_threads(args)
    with AtomicFile(args.out, "the analysis JSON") if args.out else _nothing() as output:  # bad paths fail first
        ckpt = load_checkpoint(args.checkpoint, device=args.device)
        result = suite_for(ckpt.task).analyze(ckpt)
        text = result.to_json()
        if output is not None:
            output.commit(lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    print(text if args.json else result.text())
    return 0


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def cmd_report(args) -> int:
    from interp.report import write_report, write_sweep_report

    _set_threads(args)
    if Path(args.checkpoint).is_dir():  # a sweep directory: its population report
        path = write_sweep_report(args.checkpoint, args.out, progress=not args.quiet)
    else:
        path = write_report(args.checkpoint, args.out, device=args.device, progress=not args.quiet)
    print(f"wrote {path}")
    return 0


def cmd_list(args) -> int:
    from tasks import shipped_checkpoints, task_names

    print("tasks: " + ", ".join(task_names()))
    print("shipped checkpoints:")
    for name, path in shipped_checkpoints().items():
        print(f"  {name:<24} {path}")
    from tasks import CHECKPOINT_ALIASES

    print("old names still accepted: " + ", ".join(f"{a} -> {b}" for a, b in CHECKPOINT_ALIASES.items()))
    return 0


def cmd_sweep(args) -> int:
    from interp.errors import ConfigError
    from interp.sweeps import aligned, parse_grid, parse_seeds, planned_runs, run_sweep, sweep_status

    from tasks import TASKS

    directory = Path(args.task) if Path(args.task).is_dir() else None  # interp sweep DIR --status|--resume
    if directory is None and args.task not in TASKS:
        raise ConfigError(f"{args.task!r} is neither a task ({', '.join(sorted(TASKS))}) nor a sweep directory")
    if directory is None and args.out is None:
        raise ConfigError("interp sweep TASK ... needs --out DIR (or: interp sweep DIR --status / --resume)")
    if args.status:
        if directory is not None:
            runs = planned_runs(directory)
        else:
            directory = Path(args.out)
            args.seed, args.save_every = 0, None
            task, spec, cfg, _ = _train_setup(args)
            from interp.sweeps import plan

            runs = plan(task, spec, cfg, parse_seeds(args.seeds), parse_grid(args.grid))
        status = sweep_status(directory, runs)
        keys = [k for k in status[0] if k not in ("runs", "done", "rows", "todo")] if status else []
        cols = keys + ["runs", "done", "rows", "todo"]
        print(aligned(cols, [[str(e[k]) for k in cols] for e in status]))
        done, total = sum(e["done"] for e in status), sum(e["runs"] for e in status)
        print(f"{directory}: {done} of {total} runs done, {total - done} to do")
        results_only = sum(max(0, e["rows"] - e["done"]) for e in status)
        if results_only:  # e.g. a shipped results table: rows without their checkpoints
            print(f"{directory} holds {results_only} result rows without their checkpoints (a results table shipped "
                  "without checkpoints?): interp table / interp report read them; --resume would train them again")
        return 0
    _set_threads(args)
    if directory is not None:
        if not args.resume:
            raise ConfigError(f"{directory} is a directory: interp sweep DIR takes --status or --resume; a new sweep "
                              "is interp sweep TASK ... --out DIR")
        from interp.model import ModelSpec
        from interp.sweeps import read_plans
        from tasks import get_task
        from interp.training import TrainConfig
        from analyses.halving import scorer

        for p in read_plans(directory):  # every sweep into DIR, in order
            run_sweep(get_task(p["task"], **p["task_params"]), ModelSpec(**p["spec"]), TrainConfig(**p["cfg"]),
                      p["seeds"], p["grid"], directory, group=args.group, device=args.device, progress=not args.quiet,
                      backend=args.backend, ray_address=args.ray_address, threads=args.threads, scorer_for=scorer,
                      compile=args.compile)
        print(f"{directory}: resumed; `interp table {directory}` summarises it")
        return 0
    else:
        seeds, grid, out = parse_seeds(args.seeds), parse_grid(args.grid), args.out
        if args.halving is not None:
            if "halving" in grid:
                raise ConfigError("give the halving strategies once: --halving S1,S2 or --grid halving=S1,S2")
            strategies = parse_grid([f"halving={args.halving}"])["halving"]
            args.halving = None
            if strategies != [None]:
                grid["halving"] = strategies
        args.seed, args.save_every = seeds[0], None
        task, spec, cfg, _ = _train_setup(args)
    from analyses.halving import scorer  # the CLI wires interp to analyses: halving runs score heads with it

    rows = run_sweep(task, spec, cfg, seeds, grid, out, group=args.group, device=args.device,
                     progress=not args.quiet, backend=args.backend, ray_address=args.ray_address,
                     threads=args.threads, scorer_for=scorer, compile=args.compile)
    print(f"{out}: {len(rows)} runs; `interp table {out}` summarises them")
    return 0


def cmd_table(args) -> int:
    from interp.errors import ConfigError
    from interp.sweeps import format_table, load_results, population_table

    frame = load_results(args.directory)
    if frame.empty:
        raise ConfigError(f"{args.directory} holds no finished runs (no results.jsonl rows)")
    if f"{args.split}_accuracy" not in frame:
        raise ConfigError(f"--split {args.split!r}: the rows have no {args.split}_accuracy; splits: "
                          + ", ".join(c[:-9] for c in frame.columns if c.endswith("_accuracy") and "_" not in c[:-9]))
    table = population_table(frame, split=args.split, thresholds=tuple(args.thresholds or (1.0, 0.98)))
    if args.json:
        print(json.dumps(table))
        return 0
    print(format_table(table))
    return 0


# ---- interp shapley (issue 10): Shapley values of heads -------------------------------------------------------

SHAPLEY_VALUES = ("learned-accuracy", "separation", "loss", "logit-diff")


def _add_shapley_parser(sub) -> None:
    s = sub.add_parser("shapley", help="Shapley values, Banzhaf values and pairwise interactions of heads")
    s.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    s.add_argument("--value", choices=SHAPLEY_VALUES, default="learned-accuracy",
                   help="v(S) on the test split: learned accuracy (heads outside S ablated), separation accuracy "
                        "(linear SVC on the outputs of S, fitted on the train split), answer loss, or logit "
                        "difference (default: learned-accuracy)")
    s.add_argument("--heads", nargs="+", default=None, metavar="HEAD",
                   help="the players, e.g. --heads L0H1 L0H8 0.9 (default: every head; exact values take at most 24)")
    s.add_argument("--ablation", choices=["zero", "mean"], default="zero", help="how heads outside S are removed")
    s.add_argument("--samples", type=_positive_int, default=None,
                   help="estimate from this many random permutations (with a standard error per head) instead of "
                        "all 2^n coalitions")
    s.add_argument("--seed", type=_nonneg_int, default=0, help="permutation seed for --samples (default 0)")
    s.add_argument("--solver", choices=["torch", "sklearn"], default="torch",
                   help="separation value: batched torch solver (default) or one scikit-learn LinearSVC per coalition")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--out", default=None, help="also save the JSON to this file")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(s)


def cmd_shapley(args) -> int:
    import time

    from analyses.shapley import sampled_shapley, shapley
    from analyses.coalitions import coalition_values
    from interp.checkpoint import load_checkpoint
    from interp.files import AtomicFile

    _set_threads(args)
    with AtomicFile(args.out, "the Shapley JSON") if args.out else _nothing() as output:  # bad paths fail first
        ckpt = load_checkpoint(args.checkpoint, device=args.device)
        task = ckpt.task
        kw = dict(value=args.value, heads=args.heads, ablation=args.ablation, task=task, solver=args.solver)
        if args.value == "separation":
            kw["train"] = task.dataset("train")
        test = task.dataset("test")
        t0 = time.perf_counter()
        if args.samples:
            result = sampled_shapley(ckpt.model, test, samples=args.samples, seed=args.seed, **kw)
        else:
            result = shapley(coalition_values(ckpt.model, test, progress=not args.quiet and not args.json, **kw))
        result.info["seconds"] = round(time.perf_counter() - t0, 3)
        result.info["checkpoint"] = str(ckpt.path)
        text = result.to_json()
        if output is not None:
            output.commit(lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    print(text if args.json else result.text() + f"\n({result.info['seconds']:.2f} s)")
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "analyze": cmd_analyze, "report": cmd_report, "sweep": cmd_sweep,
            "table": cmd_table, "shapley": cmd_shapley, "list": cmd_list}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    from interp.errors import InterpError

    handler = COMMANDS[args.command]
    import signal

    def terminated(signum, frame):  # SIGTERM: unwind like Ctrl-C, so half-written temp files are removed
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        return int(handler(args) or 0)
    except InterpError as e:
        print(f"interp: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print("interp: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"interp: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
