"""Which test sentences the runs of a sweep get wrong, by margin |n0 - n1| (the count of 0s minus the count of 1s).

    python examples/results/seed_regime/near_misses.py SWEEP_DIR OUT.json [KEY=VALUE ...]

KEY=VALUE pairs select rows of SWEEP_DIR/results.jsonl (e.g. ``optimizer=adam d_model=32``; a key a row lacks takes
its option's default); each selected run's checkpoint is loaded, its answers to the test split are taken from the
model's forward (TransformerLens', at the answer position) and compared with the targets. Prints, per selection, the
runs with errors, their error counts and the margins of the wrong sentences; writes them per run to OUT.json
(``runs``: each run's margins |n0 - n1|; ``wrong``: each run's wrong sentences as [n0 - n1, length in digits]).
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import torch

from interp.evaluation import predictions_and_loss
from interp.sweep_directory import checkpoint_path, select_rows, where_of
from interp.task import IGNORE
from interp.tasks import load_checkpoint


def wrong_sentences(path: Path) -> list[tuple[int, int]]:
    """``(n0 - n1, length in digits)`` of every test sentence the checkpoint answers wrongly, sorted."""
    ckpt = load_checkpoint(path, device="cpu")
    data = ckpt.task.dataset("test")
    vocab = ckpt.task.vocab
    answer = (data.targets != IGNORE).float().argmax(1)  # the first target position: the answer after '='
    rows = torch.arange(len(data.tokens))
    preds = predictions_and_loss(ckpt.model, data)["preds"][rows, answer]
    wrong = (preds != data.targets[rows, answer]).nonzero().flatten()
    n0, n1, n2 = ((data.tokens == vocab.index[t]).sum(1) for t in "012")
    return sorted(zip((n0 - n1)[wrong].tolist(), (n0 + n1 + n2)[wrong].tolist()))


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    directory, out = Path(argv[0]), Path(argv[1])
    where = where_of(argv[2:])
    wrong = {r["name"]: wrong_sentences(checkpoint_path(directory, r)) for r in select_rows(directory, where)}
    runs = {k: sorted(abs(d) for d, _ in v) for k, v in wrong.items()}
    failing = {k: v for k, v in runs.items() if v}
    margins = collections.Counter(m for v in runs.values() for m in v)
    signed = collections.Counter(d for v in wrong.values() for d, _ in v)
    counts = sorted(len(v) for v in failing.values())
    print(f"{len(runs)} runs, {len(failing)} with errors; errors per failing run {counts}")
    print("errors by margin |n0 - n1|:", dict(sorted(margins.items())))
    print("errors by n0 - n1:", dict(sorted(signed.items())))
    lengths = sorted(n for v in wrong.values() for _, n in v)
    if lengths:
        print(f"lengths of the wrong sentences: median {lengths[len(lengths) // 2]}, {lengths[0]}-{lengths[-1]}")
    out.write_text(json.dumps({"where": where, "runs": runs, "wrong": wrong}, indent=1))


if __name__ == "__main__":
    from interp.errors import ConfigError

    try:
        main(sys.argv[1:])
    except ConfigError as e:  # a misspelt selection or a directory without results: one line, no traceback
        sys.exit(f"error: {e}")
