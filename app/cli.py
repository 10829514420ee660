"""The ``interp`` command line. Heavy imports happen inside the commands, so ``--help`` is instant.

The model and training flags of ``interp train`` and ``interp sweep`` are read off the config dataclasses' option
descriptions (:mod:`interp.options`): a new option there is a new flag here.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

from interp.errors import CheckpointWarning, ConfigError, InterpError, TaskError

from .signals import INTERRUPTED, announce, handled, interrupted


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


def _add_common(p, threads: bool = True) -> None:
    p.add_argument("--device", default=None, help="auto (default: cuda if available, else cpu), cpu, cuda, cuda:N")
    if threads:
        p.add_argument(
            "--threads",
            type=_positive_int,
            default=None,
            help="CPU threads for torch (default: torch's own choice); results can differ in the last bits "
            "between thread counts, and on a loaded machine fewer threads can be much faster",
        )


def _option_type(opt):
    """An argparse type for an option (:class:`interp.options.Option`): its text parsed as the option's type,
    errors as argparse errors (one line)."""

    def parse(text: str):
        try:
            return opt.parse(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = opt.type.__name__
    return parse


def _add_option(p, opt, *, help_default: str = "") -> None:
    """One model or training option as a flag (default None: the task's default, then the dataclass's)."""
    text = opt.help + (f" (default: {help_default})" if help_default else "")
    if opt.type is bool:
        p.add_argument(opt.flag, dest=opt.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        return
    choices = None
    if opt.choices is not None:
        choices = list(opt.choices) + ([opt.none] if opt.optional else [])
    p.add_argument(
        opt.flag,
        dest=opt.name,
        type=_option_type(opt) if choices is None else str,
        choices=choices,
        default=None,
        metavar=None if choices else opt.name.upper(),
        help=text,
    )


def _model_and_training_options(p) -> None:
    """The task, model and training options shared by ``train`` and ``sweep``, from the config dataclasses."""
    from interp.configs import ModelSpec, TrainConfig
    from interp.options import options

    p.add_argument("task", help="a registered task's name (interp list shows them)")
    p.add_argument(
        "--set",
        dest="task_params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task parameter, e.g. --set train_size=2000 --set 'test_lengths=[151,300]' (repeatable)",
    )
    for opt in options(ModelSpec).values():
        _add_option(p, opt, help_default="the task's")
    for opt in options(TrainConfig).values():
        if opt.name not in ("halving", "save_every"):  # train and sweep take these differently
            _add_option(p, opt, help_default="the task's")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="interp", description="Train, evaluate and take apart small transformers on algorithmic tasks.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _train_parser(sub)

    e = sub.add_parser("eval", help="accuracy of a checkpoint on every split")
    e.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    e.add_argument(
        "--set",
        dest="task_params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a task parameter, e.g. --set 'test_lengths=[201,400]' (length generalisation; a model "
        "without positional embedding takes sequences longer than its training context)",
    )
    e.add_argument(
        "--splits",
        default=None,
        metavar="S1,S2",
        help="only these splits, e.g. --splits test,val (default: every split of the task)",
    )
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--out", default=None, help="also save the JSON to this file")
    e.add_argument("--quiet", action="store_true", help="only the table (or the JSON): no header line")
    _add_common(e)

    a = sub.add_parser("analyze", help="analysis summary of a checkpoint (the task's analysis suite)")
    a.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--out", default=None, help="also save the JSON to this file")
    _add_common(a)

    r = sub.add_parser("report", help="write one self-contained HTML report of a checkpoint, or of a sweep directory")
    r.add_argument(
        "checkpoint",
        help="a .safetensors path, the name of a shipped checkpoint, or a sweep directory "
        "(Table 1, accuracy figures, the head census)",
    )
    r.add_argument("--out", default="report.html", help="output HTML file (default: report.html)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(r)

    _sweep_parser(sub)

    tb = sub.add_parser(
        "table",
        help="Table 1 of a sweep directory: per configuration and strategy, the share of runs "
        "at 100%% and >= 98%% test accuracy with Wilson 95%% intervals, and the mean",
    )
    tb.add_argument("directory", help="a sweep directory (written by interp sweep)")
    tb.add_argument("--split", default="test")
    tb.add_argument(
        "--threshold",
        dest="thresholds",
        type=_checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        action="append",
        default=None,
        help="accuracy counted as reached (repeatable; default: 1.0 and 0.98)",
    )
    tb.add_argument(
        "--metric",
        default="accuracy",
        help="the task's metric to score (the rows' column <split>_<metric>), e.g. integer addition's accuracy_len4 "
        "(exact match on sums of 4-digit operands); default: accuracy",
    )
    tb.add_argument(
        "--count",
        default=None,
        help="the metric counting the examples each run's value is a share of (e.g. n_len4): adds the value pooled "
        "over all runs' examples with its Wilson 95%% interval",
    )
    tb.add_argument("--json", action="store_true", help="print JSON rows")
    tb.add_argument("--out", default=None, help="also save the JSON (as --json prints it) to this file")
    tb.add_argument(
        "--compare",
        action="store_true",
        help="also each halving strategy against the normal runs of the same configuration: the difference of "
        "the shares at the first threshold with its Newcombe 95%% interval, and whether it excludes 0 (with "
        '--json: {"table": [...], "differences": [...]}); the same as --compare-by strategy',
    )
    tb.add_argument(
        "--compare-by",
        default=None,
        metavar="KEY",
        help="also each cell against the cell that differs from it only in KEY, a configuration column (strategy, "
        "attention, qkv, d_model, lr, ...), at KEY's default value (normal, softmax, full, ...; else its first "
        "value in the table), with Newcombe 95%% intervals as --compare",
    )

    sub.add_parser("list", help="list the registered tasks (and where each comes from) and the named checkpoints")
    _shapley_parser(sub)
    _hypothesis_parser(sub)
    _circuit_parser(sub)
    return p


def _train_parser(sub) -> None:
    from interp.configs import STRATEGIES

    t = sub.add_parser("train", help="train a model on a task and write a .safetensors checkpoint")
    _model_and_training_options(t)
    t.add_argument(
        "--halving",
        choices=STRATEGIES,
        default=None,
        help="halving heads (Fraknói 2024, §5.5): when validation accuracy reaches the threshold, mask half "
        "of the active heads, keeping the best by this strategy; repeat until one head is left "
        "(mask-all-but-one: a-1 heads masked from the start)",
    )
    t.add_argument("--save-every", type=_positive_int, default=None, help="epochs between resume files (default 5)")
    t.add_argument("--seed", type=_nonneg_int, default=None, help="default 0")
    t.add_argument(
        "--snapshots",
        type=_positive_int,
        default=None,
        metavar="N",
        help="also write a checkpoint every N epochs into OUT.snapshots/ (a task suite may then compute "
        "progress measures from them into the checkpoint's history)",
    )
    t.add_argument(
        "--out",
        default=None,
        help="checkpoint path, a new name or (with --overwrite) a regular file (default: runs/TASK-seedN.safetensors)",
    )
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run from its resume file (its options are read from that file)",
    )
    t.add_argument("--restart", action="store_true", help="delete an interrupted run's resume file and start over")
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the file at --out (another run's checkpoint); without it an existing file is refused",
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(t)


def _sweep_parser(sub) -> None:
    sw = sub.add_parser(
        "sweep",
        help="train many seeds x a grid of configurations into one directory (resumable)",
        description="interp sweep TASK [options] --out DIR trains the sweep into DIR; "
        "interp sweep DIR --status says what is done, interp sweep DIR --resume continues it.",
    )
    _model_and_training_options(sw)
    sw.add_argument("--seeds", default="0..9", help="'A..B' (inclusive) or a comma-separated list (default 0..9)")
    sw.add_argument(
        "--grid",
        nargs="*",
        default=[],
        metavar="KEY=V1,V2",
        help="options to vary (any model or training option above, e.g. --grid d_model=8,32 n_heads=4,16 "
        "lr=1e-3,3e-3 normalization=none,LN)",
    )
    sw.add_argument(
        "--out",
        default=None,
        help="the sweep directory (runs/, results.jsonl, results.csv, sweep.json); rerun to resume",
    )
    sw.add_argument(
        "--batch",
        dest="group",
        type=_positive_int,
        default=100,
        metavar="K",
        help="models trained together as one batched computation (one-layer attention-only; default 100)",
    )
    sw.add_argument("--group", dest="group", type=_positive_int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sw.add_argument(
        "--halving",
        default=None,
        metavar="S1,S2",
        help="halving strategies, comma-separated, each a row of Table 1: none (normal runs), random, svc, "
        "learned, shapley-svc, shapley-learned, mask-all-but-one (e.g. --halving none,svc,shapley-svc)",
    )
    sw.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: batches one after another here; ray: each batch a Ray task (local Ray instance, or "
        "--address of a running cluster)",
    )
    sw.add_argument(
        "--address",
        dest="ray_address",
        default=None,
        metavar="ADDR",
        help="a Ray cluster, e.g. auto, or ray://host:10001 (default: start a local one)",
    )
    sw.add_argument("--ray-address", dest="ray_address", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sw.add_argument(
        "--status",
        action="store_true",
        help="train nothing: per configuration, the runs done and to do (interp sweep DIR --status reads "
        "DIR/sweep.json; with the sweep's own arguments and --out it plans them)",
    )
    sw.add_argument(
        "--resume",
        action="store_true",
        help="interp sweep DIR --resume: continue the sweep saved in DIR/sweep.json (a rerun of the "
        "original command resumes too), rebuilding missing or damaged rows from the checkpoints",
    )
    sw.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each population's training step (~1.5x faster token-count steps, --dropout-at "
        "attention; the per-position step gains little) after 10-20 s of compilation per graph: for long runs; "
        "needs a C++ compiler",
    )
    sw.add_argument(
        "--snapshots",
        type=_positive_int,
        default=None,
        metavar="N",
        help="also write every run's checkpoint every N epochs into runs/NAME.snapshots/ (as interp train "
        "--snapshots; recorded in sweep.json, so --resume keeps writing them; the sweep report then shows the "
        "task's analyses over training)",
    )
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(sw)


def _parse_task_params(items: list[str]) -> dict:
    """``["train_size=2000", "test_lengths=[151,300]"]`` -> dict; values are JSON, else strings."""
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


def _given(args, cls) -> dict[str, Any]:
    """The options of ``cls`` given on the command line (None: not given), typed as the dataclass has them."""
    from interp.options import options

    out = {}
    for name, opt in options(cls).items():
        value = getattr(args, name, None)
        if value is not None:
            out[name] = opt.parse(value) if isinstance(value, str) and opt.choices is not None else value
    return out


def _set_threads(args) -> None:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def _new_run(args, seed: int, grid_only: tuple[str, ...] = ()):
    """(task, spec, config) of a new run from the options given and the task's defaults; ``grid_only`` names options
    whose flag is a sweep grid (``--halving S1,S2``), left at their defaults here."""
    from interp.model import ModelSpec
    from interp.registry import get_task
    from interp.training import TrainConfig

    task = get_task(args.task, **_parse_task_params(args.task_params))
    spec = ModelSpec(**{**task.default_spec(), **_given(args, ModelSpec), "init_seed": seed})
    given = {k: v for k, v in _given(args, TrainConfig).items() if k not in grid_only}
    cfg = TrainConfig(**{**task.default_train(), **given, "seed": seed})
    return task, spec, cfg


def _resumed_run(args):
    """(task, spec, config) of an interrupted run, from its resume file; options given on the command line must
    agree with it, except the resumable ones (epochs, patience, save-every, keep), which change it."""
    from interp.model import ModelSpec
    from interp.options import options
    from interp.registry import get_task
    from interp.training import TrainConfig, resume_options

    if not args.out:
        raise ConfigError("--resume needs --out: the checkpoint path of the interrupted run")
    saved = resume_options(args.out)
    conflicts = []
    if args.task != saved["task"]["name"]:
        conflicts.append(f"task {args.task} (the run trains {saved['task']['name']})")
    for key, value in _parse_task_params(args.task_params).items():
        if saved["task"]["params"].get(key) != value:
            conflicts.append(
                f"--set {key}={json.dumps(value)} (the run has {json.dumps(saved['task']['params'].get(key))})"
            )
    spec = ModelSpec.from_dict(saved["spec"])
    for key, given in _given(args, ModelSpec).items():
        if getattr(spec, key) != given and not (key == "output_matrix" and spec.w_o == given):
            conflicts.append(f"--{key.replace('_', '-')} {given} (the run has {getattr(spec, key)})")
    config = dict(saved["config"])
    resumable = {k for k, o in options(TrainConfig).items() if o.resumable}
    given_cfg = {**_given(args, TrainConfig), **({"seed": args.seed} if args.seed is not None else {})}
    for key, given in given_cfg.items():
        if key in resumable:
            config[key] = given
        elif config.get(key) != given:
            conflicts.append(f"--{key.replace('_', '-')} {given} (the run has {config.get(key)})")
    if conflicts:
        raise ConfigError(
            "--resume: options contradict the interrupted run: "
            + "; ".join(conflicts)
            + " (leave them out to continue it, or --restart to start over)"
        )
    task = get_task(saved["task"]["name"], **saved["task"]["params"])
    return task, spec, TrainConfig(**config)


def _flagged(error: ConfigError, args) -> ConfigError:
    """``error`` (a refusal of options, e.g. ``qkv='lowrank:8': a rank-8 factorisation ...``) with the command-line
    flags the user gave for the options it names put first (``--qkv lowrank:8: ...``, ``--grid qkv=lowrank:8:
    ...``), so the refusal names what was typed; unchanged where it names none of them."""
    import re

    from interp.configs import ModelSpec, TrainConfig
    from interp.options import options

    text = str(error)
    names = lambda key: re.search(rf"(?<![\w-]){re.escape(key)}=", text) is not None  # noqa: E731
    given = []
    for opts in (options(ModelSpec), options(TrainConfig)):
        for key, opt in opts.items():
            value = getattr(args, key, None)
            if value is not None and names(key):
                given.append(f"{opt.flag} {value}")
    for item in getattr(args, "grid", None) or []:
        key, _, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if names(key):
            shown = [v for v in values.split(",") if v.strip() and v.strip() in text] or [values]
            given.append(f"--grid {key}={','.join(v.strip() for v in shown)}")
    halving = getattr(args, "halving", None)
    if args.command == "sweep" and halving and names("halving"):
        given.append(f"--halving {halving}")
    return ConfigError(f"{'; '.join(given)}: {text}") if given else error


def cmd_train(args) -> int:
    """Train one model, in the deterministic mode (with ``--threads`` as its thread count, recorded in the
    checkpoint); a refusal of the options names the flags given (:func:`_flagged`)."""
    from interp.determinism import deterministic

    try:
        with deterministic(threads=args.threads):
            return _train_one(args)
    except ConfigError as e:
        raise _flagged(e, args) from None


def _train_one(args) -> int:
    from interp.analyses import suite_for
    from interp.analyses.halving import scorer
    from interp.training import snapshot_directory, train

    if args.resume:
        task, spec, cfg = _resumed_run(args)
        out = Path(args.out)
    else:
        seed = 0 if args.seed is None else args.seed
        task, spec, cfg = _new_run(args, seed)
        out = Path(args.out) if args.out else Path("runs") / f"{task.name}-seed{seed}.safetensors"
        if not args.out:
            out.parent.mkdir(parents=True, exist_ok=True)
    if args.snapshots and args.snapshots > cfg.epochs:
        raise ConfigError(
            f"--snapshots {args.snapshots}: a snapshot every {args.snapshots} epochs in a run of "
            f"{cfg.epochs} epochs writes none; give N <= {cfg.epochs}"
        )
    suite = suite_for(task) if args.snapshots else None  # a task without a suite fails before training
    prov = train(
        task,
        spec,
        cfg,
        out,
        device=args.device,
        resume=args.resume,
        restart=args.restart,
        progress=not args.quiet,
        snapshot_every=args.snapshots,
        head_scorer=scorer(cfg.halving) if cfg.halving is not None else None,
        overwrite=args.overwrite,
    )
    if suite is not None:
        done = suite.finish_run(out, snapshot_directory(out), device=args.device)
        if done is not None:
            print(f"{task.name}: {done}")
    acc = prov["accuracy"]
    print(
        f"wrote {out}: kept epoch {prov['kept_epoch']}/{prov['epochs_run']} ({prov['kept']}), accuracy "
        + ", ".join(f"{k} {v:.4f}" for k, v in acc.items())
    )
    if "halving" in prov:
        h = prov["halving"]
        print(
            f"halving ({h['strategy']}): {h['n_steps']} step(s) at epoch(s) {[s['epoch'] for s in h['steps']]}, "
            f"active heads {', '.join(h['active'])}; "
            + ("one head left" if h["success"] else "FAILED (more than one head left): scored 0")
        )
    return 0


def cmd_eval(args) -> int:
    from interp.evaluation import evaluate_splits
    from interp.loading import load_checkpoint

    _set_threads(args)
    params = _parse_task_params(args.task_params)
    ckpt = load_checkpoint(args.checkpoint, device=args.device, task_params=params or None)
    splits = None
    if args.splits:
        splits = [x.strip() for x in args.splits.split(",") if x.strip()]
        unknown = [x for x in splits if x not in ckpt.task.splits]
        if unknown or not splits:
            raise TaskError(f"--splits {args.splits!r}: {ckpt.task.name} has the splits {', '.join(ckpt.task.splits)}")
    metrics = evaluate_splits(ckpt.model, ckpt.task, splits)
    text = json.dumps(
        {
            "task": ckpt.task.name,
            "checkpoint": str(ckpt.path),
            "task_params": ckpt.task.params(),
            "accuracy": {s: m["accuracy"] for s, m in metrics.items()},
            "metrics": metrics,
        }
    )
    _save_json(args.out, text, "the evaluation JSON")
    if args.json:
        print(text)
        return 0
    if not args.quiet:
        print(f"{ckpt.path} ({ckpt.task.name})" + (f", task parameters changed: {params}" if params else ""))
    keys = list(next(iter(metrics.values())).keys())
    print(f"{'split':<8}" + "".join(f"{k:>14}" for k in keys))
    for split, m in metrics.items():
        print(f"{split:<8}" + "".join(f"{m[k]:>14.4f}" for k in keys))
    return 0


def _save_json(path: str | None, text: str, what: str) -> None:
    """Write ``text`` (one JSON document) to ``path`` atomically, where a path was given."""
    if path:
        from interp.files import atomic_write_text

        atomic_write_text(path, text + "\n", what)


def _output(path: str | None, what: str):
    """The checked, reserved output file ``path`` (a bad path fails before any work), or a no-op without one."""
    from contextlib import nullcontext

    from interp.files import AtomicFile

    return AtomicFile(path, what) if path else nullcontext()


def cmd_analyze(args) -> int:
    from interp.analyses import suite_for
    from interp.loading import load_checkpoint

    _set_threads(args)
    with _output(args.out, "the analysis JSON") as output:
        ckpt = load_checkpoint(args.checkpoint, device=args.device)
        result = suite_for(ckpt.task).analyze(ckpt)
        text = result.to_json()
        if output is not None:
            output.commit(lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    print(text if args.json else result.text())
    return 0


def cmd_report(args) -> int:
    from interp.app.report import write_report, write_sweep_report

    _set_threads(args)
    if Path(args.checkpoint).is_dir():  # a sweep directory: its population report
        path = write_sweep_report(args.checkpoint, args.out, progress=not args.quiet)
    else:
        path = write_report(args.checkpoint, args.out, device=args.device, progress=not args.quiet)
    print(f"wrote {path}")
    return 0


def cmd_list(args) -> int:
    from interp.loading import checkpoint_aliases, checkpoint_names
    from interp.registry import GROUP, task_names, task_source

    names = task_names()
    width = max((len(n) for n in names), default=0) + 2
    print(f"tasks (registered by an entry point in the group '{GROUP}' of an installed package, or in Python):")
    for name in names:
        print(f"  {name:<{width}}{task_source(name)}")
    broken: list[str] = []
    checkpoints = checkpoint_names(broken=broken)
    print("checkpoints (by name; interp eval/analyze/report/explore take a name or a path):")
    for name, path in checkpoints.items():
        print(f"  {name:<24} {path}")
    aliases = checkpoint_aliases(broken=[])
    if aliases:
        print("old names still accepted: " + ", ".join(f"{a} -> {b}" for a, b in aliases.items()))
    for message in broken:
        print(f"broken: {message}")
    return 0


def cmd_sweep(args) -> int:
    """``interp sweep``; a refusal of the options names the flags given (:func:`_flagged`)."""
    try:
        return _sweep(args)
    except ConfigError as e:
        raise _flagged(e, args) from None


def _sweep(args) -> int:
    from interp.registry import task_names

    directory = Path(args.task) if Path(args.task).is_dir() else None  # interp sweep DIR --status|--resume
    if directory is None and args.task not in task_names():
        names = ", ".join(task_names())
        raise ConfigError(f"{args.task!r} is neither a registered task ({names}) nor a sweep directory")
    if directory is None and args.out is None:
        raise ConfigError("interp sweep TASK ... needs --out DIR (or: interp sweep DIR --status / --resume)")
    if args.status:
        return _sweep_status(args, directory)
    _set_threads(args)
    from interp.app.sweeps import parse_grid, parse_seeds, parse_strategies, resume_sweeps, run_sweep

    run_kw = dict(
        group=args.group,
        device=args.device,
        progress=not args.quiet,
        backend=args.backend,
        ray_address=args.ray_address,
        threads=args.threads,
        compile=args.compile,
    )
    if directory is not None:
        if not args.resume:
            raise ConfigError(
                f"{directory} is a directory: interp sweep DIR takes --status or --resume; a new sweep "
                "is interp sweep TASK ... --out DIR"
            )
        resume_sweeps(directory, snapshot_every=args.snapshots, **run_kw)
        print(f"{directory}: resumed; `interp table {directory}` summarises it")
        return 0
    seeds, grid = parse_seeds(args.seeds), _sweep_grid(args, parse_grid, parse_strategies)
    task, spec, cfg = _new_run(args, seeds[0], grid_only=("halving",))
    if args.snapshots and args.snapshots > min(grid.get("epochs", [cfg.epochs])):
        raise ConfigError(
            f"--snapshots {args.snapshots}: a snapshot every {args.snapshots} epochs in runs of "
            f"{min(grid.get('epochs', [cfg.epochs]))} epochs writes none; give a smaller N"
        )
    rows = run_sweep(task, spec, cfg, seeds, grid, args.out, snapshot_every=args.snapshots, **run_kw)
    print(f"{args.out}: {len(rows)} runs; `interp table {args.out}` summarises them")
    return 0


def _sweep_grid(args, parse_grid, parse_strategies) -> dict[str, list]:
    """The sweep's grid: ``--grid``, with ``--halving S1,S2`` as the grid's halving strategies."""
    grid = parse_grid(args.grid)
    if args.halving is not None:
        if "halving" in grid:
            raise ConfigError("give the halving strategies once: --halving S1,S2 or --grid halving=S1,S2")
        strategies = parse_strategies(args.halving)
        if strategies != [None]:
            grid["halving"] = strategies
    return grid


def _sweep_status(args, directory: Path | None) -> int:
    """``interp sweep DIR --status`` (the saved plans) or ``interp sweep TASK ... --out DIR --status`` (this
    sweep's plan): per configuration, the runs done and to do, with every key that differs between them."""
    from interp.app.sweeps import parse_grid, parse_seeds, parse_strategies
    from interp.sweep_directory import plan, planned_runs, sweep_status
    from interp.visualize import aligned

    if directory is not None:
        runs = planned_runs(directory)
    else:
        directory = Path(args.out)
        seeds = parse_seeds(args.seeds)
        task, spec, cfg = _new_run(args, seeds[0], grid_only=("halving",))
        runs = plan(task.name, task.params(), spec, cfg, seeds, _sweep_grid(args, parse_grid, parse_strategies))
    status = sweep_status(directory, runs)
    keys = [k for k in status[0] if k not in ("runs", "done", "rows", "todo")] if status else []
    cols = keys + ["runs", "done", "rows", "todo"]
    print(aligned(cols, [[str(e[k]) for k in cols] for e in status]))
    done, total = sum(e["done"] for e in status), sum(e["runs"] for e in status)
    print(f"{directory}: {done} of {total} runs done, {total - done} to do")
    results_only = sum(max(0, e["rows"] - e["done"]) for e in status)
    if results_only:  # e.g. a shipped results table: rows without their checkpoints
        print(
            f"{directory} holds {results_only} result rows without their checkpoints (a results table shipped "
            "without checkpoints?): interp table / interp report read them; --resume would train them again"
        )
    return 0


def cmd_table(args) -> int:
    from interp.analyses.populations import config_differences, format_differences, format_table, population_table
    from interp.sweep_directory import load_results

    if args.compare and args.compare_by not in (None, "strategy"):
        raise ConfigError(
            f"--compare is --compare-by strategy; give one of --compare and --compare-by {args.compare_by}"
        )
    key = "strategy" if args.compare else args.compare_by
    frame = load_results(args.directory)
    if frame.empty:
        raise ConfigError(f"{args.directory} holds no finished runs (no results.jsonl rows)")
    if f"{args.split}_accuracy" not in frame:
        raise ConfigError(
            f"--split {args.split!r}: the rows have no {args.split}_accuracy; splits: "
            + ", ".join(c[:-9] for c in frame.columns if c.endswith("_accuracy") and "_" not in c[:-9])
        )
    for flag, metric in (("--metric", args.metric), ("--count", args.count)):
        if metric is not None and f"{args.split}_{metric}" not in frame:
            known = sorted(c[len(args.split) + 1 :] for c in frame.columns if c.startswith(f"{args.split}_"))
            raise ConfigError(
                f"{flag} {metric!r}: the rows have no {args.split}_{metric}; the {args.split} metrics are "
                + ", ".join(known)
            )
    if key is not None and args.metric != "accuracy":
        raise ConfigError(f"--compare-by {key} compares the cells' accuracy; give it without --metric")
    thresholds = tuple(args.thresholds or (1.0, 0.98))
    table = population_table(frame, split=args.split, thresholds=thresholds, metric=args.metric, count=args.count)
    if key is None:
        _save_json(args.out, json.dumps(table), "the table JSON")
        print(json.dumps(table) if args.json else format_table(table))
        return 0
    try:
        differences = config_differences(frame, key=key, split=args.split, threshold=thresholds[0])
    except ConfigError as e:
        raise ConfigError(f"--compare-by {key}: {e}") from None
    _save_json(args.out, json.dumps({"table": table, "differences": differences}), "the table JSON")
    if args.json:
        print(json.dumps({"table": table, "differences": differences}))
    else:
        baseline = differences[0]["baseline"] if differences else None
        print(format_table(table))
        print(f"\n{key} - {baseline}, share of runs at {args.split} accuracy >= {thresholds[0]:g}:")
        print(format_differences(differences, baseline))
    return 0


# ---- interp shapley: Shapley values of heads ------------------------------------------------------------------------
def _shapley_parser(sub) -> None:
    s = sub.add_parser("shapley", help="Shapley values, Banzhaf values and pairwise interactions of heads")
    s.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    s.add_argument(
        "--value",
        default="learned-accuracy",
        metavar="VALUE",
        help="v(S) on the test split: learned-accuracy (heads outside S ablated), separation (linear SVC "
        "on the outputs of S, fitted on the train split), answer-loss (cross-entropy at the answer "
        "position; lower is better), or logit-diff (default: learned-accuracy)",
    )
    s.add_argument(
        "--heads",
        nargs="+",
        default=None,
        metavar="HEAD",
        help="the players, e.g. --heads L0H1 L0H8 0.9 (default: every head; exact values take at most 24)",
    )
    s.add_argument("--ablation", choices=["zero", "mean"], default="zero", help="how heads outside S are removed")
    s.add_argument(
        "--samples",
        type=_checked(int, lambda v: v >= 2, "at least 2 permutations (a standard error needs two)"),
        default=None,
        help="estimate from this many random permutations (at least 2; with a standard error per head) "
        "instead of all 2^n coalitions",
    )
    s.add_argument("--seed", type=_nonneg_int, default=0, help="permutation seed for --samples (default 0)")
    s.add_argument(
        "--solver",
        choices=["torch", "sklearn"],
        default="torch",
        help="separation value: batched torch solver (default) or one scikit-learn LinearSVC per coalition",
    )
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--out", default=None, help="also save the JSON to this file")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(s)


def cmd_shapley(args) -> int:
    import time

    from interp.analyses.shapley import shapley_values
    from interp.loading import load_checkpoint

    _set_threads(args)
    with _output(args.out, "the Shapley JSON") as output:
        ckpt = load_checkpoint(args.checkpoint, device=args.device)
        task = ckpt.task
        kw = dict(
            value=args.value,
            heads=args.heads,
            ablation=args.ablation,
            task=task,
            solver=args.solver,
            progress=not args.quiet and not args.json,
        )
        _check_players(ckpt.model, args)
        if args.value == "separation":
            kw["train"] = task.dataset("train")
        test = task.dataset("test")
        if args.samples:  # without --samples: all 2^n coalitions (at most 24 heads), as before
            kw.update(method="sampled", samples=args.samples, seed=args.seed)
        else:
            kw.update(method="exact")
        t0 = time.perf_counter()
        result = shapley_values(ckpt.model, test, **kw)
        result.info["seconds"] = round(time.perf_counter() - t0, 3)
        result.info["checkpoint"] = str(ckpt.path)
        text = result.to_json()
        if output is not None:
            output.commit(lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    print(text if args.json else result.text() + f"\n({result.info['seconds']:.2f} s)")
    return 0


# ---- interp hypothesis: a causal model tested by interchange interventions ----------------------------------------
def _hypothesis_parser(sub) -> None:
    h = sub.add_parser(
        "hypothesis",
        help="test one of the task's hypotheses (a causal model's variable) by interchange interventions: its "
        "accuracy (IIA) at each site, and with --das K distributed alignment search",
    )
    h.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    h.add_argument("name", nargs="?", default=None, help="the hypothesis (without it: list the task's hypotheses)")
    h.add_argument(
        "--site",
        action="append",
        default=None,
        metavar="SITE",
        help="where to look (repeatable): L0H3, L0H1+L0H3, L0H*, resid_pre.1, resid_post.0, attn_out.1, mlp_out.0, "
        "each with an optional @POSITION (answer, answer-1, last, an integer, or a position the hypothesis names); "
        "default: the hypothesis's sites",
    )
    h.add_argument(
        "--das",
        type=_positive_int,
        default=None,
        metavar="K",
        help="also learn a K-dimensional subspace by distributed alignment search (at the hypothesis's DAS site, or "
        "at each --site), trained on half of the split's examples and scored on the other half with the other rows",
    )
    h.add_argument("--pairs", type=_positive_int, default=1000, help="(base, source) pairs (default 1000)")
    h.add_argument(
        "--changed",
        type=_checked(float, lambda v: 0 <= v <= 1, "a share in [0, 1]"),
        default=0.5,
        help="share of drawn pairs whose counterfactual answer differs from the base answer (default 0.5)",
    )
    h.add_argument("--split", default="test", help="the task split the pairs come from (default: test)")
    h.add_argument("--steps", type=_positive_int, default=300, help="DAS training steps (default 300)")
    h.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the pairs and of DAS (default 0)")
    h.add_argument("--json", action="store_true", help="print one JSON object")
    h.add_argument("--out", default=None, help="also save the JSON to this file")
    _add_common(h)


def cmd_hypothesis(args) -> int:
    from interp.analyses import suite_for
    from interp.analyses.hypotheses import evaluate_hypothesis
    from interp.loading import load_checkpoint

    _set_threads(args)
    with _output(args.out, "the hypothesis JSON") as output:
        ckpt = load_checkpoint(args.checkpoint, device=args.device)
        task = ckpt.task
        found = suite_for(task).hypotheses(task)
        listing = "; ".join(f"{k} ({h.about})" if h.about else k for k, h in found.items()) or "none"
        if args.name is None:
            if args.json:
                print(json.dumps({"task": task.name, "hypotheses": {k: h.about for k, h in found.items()}}))
            else:
                print(f"hypotheses of {task.name}: {listing}")
            return 0
        if args.name not in found:
            raise ConfigError(f"unknown hypothesis {args.name!r} for task {task.name}; its hypotheses: {listing}")
        if args.split not in task.splits:
            raise ConfigError(f"unknown split {args.split!r}; task {task.name} has {list(task.splits)}")
        result = evaluate_hypothesis(
            ckpt.model,
            task.dataset(args.split),
            hypothesis=found[args.name],
            sites=args.site,
            das=args.das,
            pairs=args.pairs,
            changed=args.changed,
            seed=args.seed,
            steps=args.steps,
        )
        result.info.update({"checkpoint": str(ckpt.path or args.checkpoint), "split": args.split, "name": args.name})
        text = result.to_json()
        if output is not None:
            output.commit(lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    print(text if args.json else result.text())
    return 0


def _circuit_parser(sub) -> None:
    c = sub.add_parser("circuit", help="discover the circuit of a checkpoint: edge scores, pruning, faithfulness")
    c.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    c.add_argument("--method", choices=["eap", "eap-ig", "patching", "acdc"], default="eap")
    c.add_argument(
        "--ablation",
        choices=["patch", "mean", "zero"],
        default=None,
        help="what a removed edge carries: the corrupted run's sender output (patch; default where the task has a "
        "corruption of its own), its mean over the examples (mean; the default otherwise) or zero",
    )
    c.add_argument(
        "--corruption", default=None, help="which of the task's corruptions to patch from (default: its first)"
    )
    c.add_argument("--metric", choices=["logit_diff", "loss"], default="logit_diff")
    c.add_argument("--examples", type=_positive_int, default=128, help="clean examples / pairs (default 128)")
    c.add_argument("--steps", type=_positive_int, default=None, help="EAP-IG interpolation steps (default 5)")
    c.add_argument("--top-n", type=_nonneg_int, default=None, help="keep the top N edges by |score|")
    c.add_argument("--threshold", type=float, default=None, help="keep the edges with |score| >= this")
    c.add_argument("--tau", type=float, default=None, help="ACDC's tolerance (default 1%% of |M(full) - M(empty)|)")
    c.add_argument(
        "--target",
        type=_checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        default=0.9,
        help="without --top-n/--threshold: the smallest top-k circuit with this faithfulness (default 0.9)",
    )
    c.add_argument(
        "--curve-points",
        type=_nonneg_int,
        default=24,
        help="circuit sizes on the faithfulness-against-size curve (default 24; 0 = none, unless the target rule "
        "needs it)",
    )
    c.add_argument("--batch-size", type=_positive_int, default=None, help="sequences per stacked forward")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--out", default=None, help="also save the circuit's JSON to this file (Circuit.load reads it)")
    _add_common(c)


def cmd_circuit(args) -> int:
    from interp.analyses.circuit_discovery import discover_circuit
    from interp.app.circuit_inputs import circuit_inputs
    from interp.device import model_device
    from interp.loading import load_checkpoint

    _set_threads(args)
    with _output(args.out, "the circuit JSON") as output:
        ckpt = load_checkpoint(args.checkpoint, device=args.device)
        clean, corrupted, what = circuit_inputs(
            ckpt.task, args.examples, args.corruption, args.ablation, device=model_device(ckpt.model)
        )
        result = discover_circuit(
            ckpt.model,
            clean,
            corrupted=corrupted,
            ablation=args.ablation,
            metric=args.metric,
            method=args.method,
            steps=args.steps,
            top_n=args.top_n,
            threshold=args.threshold,
            tau=args.tau,
            target=args.target,
            curve_points=args.curve_points,
            batch_size=args.batch_size,
        )
        result.info.update(checkpoint=str(ckpt.path), inputs=what)
        text = result.to_json()
        if output is not None:
            output.commit(lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    print(text if args.json else f"{ckpt.path} ({ckpt.task.name}): {what}\n" + result.text())
    return 0


OUTPUTS = {  # what each command's --out holds (a sweep's is a directory)
    "train": "the checkpoint",
    "sweep": "the sweep",
    "report": "the report",
    "analyze": "the analysis JSON",
    "eval": "the evaluation JSON",
    "table": "the table JSON",
    "shapley": "the Shapley JSON",
    "hypothesis": "the hypothesis JSON",
    "circuit": "the circuit JSON",
}


def check_out(args) -> None:
    """The command's ``--out``, checked before any work by the one check every writer uses
    (:func:`interp.files.check_output_path`): a regular file or a new name (a sweep's: a directory or a new name);
    an empty ``--out`` is refused, not read as the default."""
    from interp.files import check_output_path

    out = getattr(args, "out", None)
    if args.command not in OUTPUTS or out is None:
        return
    if not out.strip():
        raise ConfigError("--out is empty: give a path (or leave --out out for the default)")
    check_output_path(out, OUTPUTS[args.command], directory=args.command == "sweep")


def _check_players(model, args) -> None:
    """The limits of exact values and of the batched SVC, in the command line's words (before any work): too many
    players names ``--heads`` and ``--samples`` (or ``--solver sklearn``)."""
    from interp.analyses.coalitions import MAX_BITMASK, MAX_PLAYERS
    from interp.heads import one_set

    cfg = model.cfg
    n = cfg.n_layers * cfg.n_heads if args.heads is None else len(one_set(args.heads, cfg.n_layers, cfg.n_heads))
    if not args.samples and n > MAX_PLAYERS:
        raise ConfigError(
            f"{n} heads give 2**{n} coalitions; exact values take at most {MAX_PLAYERS} heads: choose the players "
            f"with --heads HEAD [HEAD ...], or estimate the values from random permutations with --samples N"
        )
    if args.value == "separation" and args.solver == "torch" and n > MAX_BITMASK:
        raise ConfigError(
            f"--value separation with the batched SVC (--solver torch) takes at most {MAX_BITMASK} heads, got {n}: "
            "choose the players with --heads HEAD [HEAD ...], or fit one scikit-learn SVC per coalition with "
            "--solver sklearn"
        )


COMMANDS = {
    "train": cmd_train,
    "eval": cmd_eval,
    "analyze": cmd_analyze,
    "report": cmd_report,
    "sweep": cmd_sweep,
    "table": cmd_table,
    "shapley": cmd_shapley,
    "list": cmd_list,
    "hypothesis": cmd_hypothesis,
    "circuit": cmd_circuit,
}


def _one_line_warnings(show):
    """``warnings.showwarning`` that prints the toolkit's own warnings as one line, ``interp: warning: ...``, and
    hands the others to ``show``."""

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, CheckpointWarning):
            print(f"interp: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return showwarning


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named with the subcommand's help, where argparse would point at the top level's
        where = f"interp {args.command}" if args.command else "interp"
        raise SystemExit(f"interp: error: unrecognized arguments: {' '.join(unknown)} (see '{where} --help')")
    if not args.command:
        parser.print_help()
        return 2
    handler = COMMANDS[args.command]

    previous = None
    try:  # SIGTERM: unwind like Ctrl-C, so half-written temp files are removed (unless interp.app.entry set it)
        if not handled(signal.getsignal(signal.SIGTERM)):
            previous = signal.signal(signal.SIGTERM, interrupted)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", CheckpointWarning)
            warnings.showwarning = _one_line_warnings(warnings.showwarning)
            check_out(args)
            return int(handler(args) or 0)
    except InterpError as e:
        print(f"interp: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        announce()
        return INTERRUPTED
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        print(f"interp: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
