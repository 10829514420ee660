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
_nonneg_float = _checked(float, lambda v: v >= 0, "a non-negative number")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="interp", description="Train, evaluate and take apart small transformers on algorithmic tasks.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    t = sub.add_parser("train", help="train a model on a task and write a .safetensors checkpoint")
    t.add_argument("task", help="task name, e.g. noisy-majority")
    t.add_argument("--set", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help="task parameter, e.g. --set train_size=2000 --set 'test_lengths=[151,300]' (repeatable)")
    t.add_argument("--d-model", type=_positive_int)
    t.add_argument("--n-heads", type=_positive_int)
    t.add_argument("--d-head", type=_positive_int)
    t.add_argument("--n-layers", type=_positive_int)
    t.add_argument("--positional", choices=["none", "standard", "shortformer"],
                   help="positional embedding: none (zeroed, frozen), standard (added to the residual stream), "
                        "shortformer (into queries and keys only); default: the task's")
    t.add_argument("--output-matrix", choices=["identity", "learned"],
                   help="default: the task's (identity when n_heads*d_head == d_model, else learned)")
    t.add_argument("--epochs", type=_positive_int, default=None, help="default: the task's (900 for noisy-majority)")
    t.add_argument("--batch-size", type=_positive_int, default=None, help="default: the task's (128)")
    t.add_argument("--lr", type=_positive_float, default=None, help="default: the task's (1e-3)")
    t.add_argument("--weight-decay", type=_nonneg_float, default=None, help="default: the task's (0.01)")
    t.add_argument("--dropout", type=_fraction, default=None, help="default: the task's (0.1)")
    t.add_argument("--patience", type=_positive_int, default=None, help="stop after this many epochs without a better validation accuracy")
    t.add_argument("--save-every", type=_positive_int, default=5, help="epochs between resume files")
    t.add_argument("--seed", type=_nonneg_int, default=0)
    t.add_argument("--device", default=None, help="auto (default: cuda if available, else cpu), cpu, cuda, cuda:N")
    t.add_argument("--out", default=None, help="checkpoint path (default: runs/TASK-seedN.safetensors)")
    t.add_argument("--resume", action="store_true", help="continue an interrupted run from its resume file")
    t.add_argument("--quiet", action="store_true", help="no progress bar")

    e = sub.add_parser("eval", help="accuracy of a checkpoint on every split")
    e.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--device", default=None)

    a = sub.add_parser("analyze", help="per-head analysis summary of a checkpoint (the task's analysis suite)")
    a.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--device", default=None)

    r = sub.add_parser("report", help="write one self-contained HTML report of a checkpoint")
    r.add_argument("checkpoint", help="a .safetensors path or the name of a shipped checkpoint")
    r.add_argument("--out", default="report.html", help="output HTML file (default: report.html)")
    r.add_argument("--device", default=None)
    r.add_argument("--quiet", action="store_true", help="no progress bar")

    sub.add_parser("list", help="list tasks and shipped checkpoints")
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


def cmd_train(args) -> int:
    from interp.model import ModelSpec
    from interp.training import TrainConfig, train
    from tasks import get_task

    task = get_task(args.task, **_parse_task_params(args.task_params))
    spec_kw = task.default_spec()
    for opt, key in (("d_model", "d_model"), ("n_heads", "n_heads"), ("d_head", "d_head"), ("n_layers", "n_layers")):
        if getattr(args, opt) is not None:
            spec_kw[key] = getattr(args, opt)
    if args.positional:
        spec_kw["positional"] = args.positional
    if args.output_matrix:
        spec_kw["output_matrix"] = args.output_matrix
    elif spec_kw.get("output_matrix") == "identity" and spec_kw["n_heads"] * spec_kw["d_head"] != spec_kw["d_model"]:
        spec_kw["output_matrix"] = "learned"  # the seed's 64-head d=2 model: a trained W_O
    spec = ModelSpec(**{**spec_kw, "init_seed": args.seed})
    train_kw = dict(task.default_train()) if hasattr(task, "default_train") else {}
    for key in ("epochs", "batch_size", "lr", "weight_decay", "dropout", "patience"):
        if getattr(args, key) is not None:
            train_kw[key] = getattr(args, key)
    cfg = TrainConfig(**{**train_kw, "seed": args.seed, "save_every": args.save_every})
    out = Path(args.out) if args.out else Path("runs") / f"{task.name}-seed{args.seed}.safetensors"
    if not args.out:
        out.parent.mkdir(parents=True, exist_ok=True)
    prov = train(task, spec, cfg, out, device=args.device, resume=args.resume, progress=not args.quiet)
    acc = prov["accuracy"]
    print(f"wrote {out}: best epoch {prov['best_epoch']}/{prov['epochs_run']}, accuracy "
          + ", ".join(f"{k} {v:.4f}" for k, v in acc.items()))
    return 0


def cmd_eval(args) -> int:
    from interp.checkpoint import load_checkpoint
    from interp.evaluate import evaluate_splits

    ckpt = load_checkpoint(args.checkpoint, device=args.device)
    metrics = evaluate_splits(ckpt.model, ckpt.task)
    if args.json:
        print(json.dumps({
            "task": ckpt.task.name, "checkpoint": str(ckpt.path),
            "accuracy": {s: m["accuracy"] for s, m in metrics.items()}, "metrics": metrics,
        }))
    else:
        print(f"{ckpt.path} ({ckpt.task.name})")
        keys = list(next(iter(metrics.values())).keys())
        print(f"{'split':<8}" + "".join(f"{k:>14}" for k in keys))
        for split, m in metrics.items():
            print(f"{split:<8}" + "".join(f"{m[k]:>14.4f}" for k in keys))
    return 0


def cmd_analyze(args) -> int:
    from analyses.suites import get_suite
    from interp.checkpoint import load_checkpoint

    ckpt = load_checkpoint(args.checkpoint, device=args.device)
    suite = get_suite(ckpt.task.name)
    summary = suite.analyze(ckpt, device=args.device)
    print(json.dumps(summary) if args.json else suite.format_summary(summary))
    return 0


def cmd_report(args) -> int:
    from interp.report import write_report

    path = write_report(args.checkpoint, args.out, device=args.device, progress=not args.quiet)
    print(f"wrote {path}")
    return 0


def cmd_list(args) -> int:
    from tasks import shipped_checkpoints, task_names

    print("tasks: " + ", ".join(task_names()))
    print("shipped checkpoints:")
    for name, path in shipped_checkpoints().items():
        print(f"  {name:<24} {path}")
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "analyze": cmd_analyze, "report": cmd_report, "list": cmd_list}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    from interp.errors import InterpError

    handler = COMMANDS[args.command]
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


if __name__ == "__main__":
    raise SystemExit(main())
