"""The attention spectrum (analyses.spectrum.attention_spectrum) of the shipped checkpoints, or of seed 0 of every
setting in the sweep directories given, on the first 32 test inputs: prints one line per model and writes JSON.

    python examples/results/attention/spectra.py examples/results/attention/spectra_shipped.json
    python examples/results/attention/spectra.py spectra_q1_seed0.json sweeps/q1   # a sweep with its checkpoints
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from interp import tasks
from interp.analyses.spectrum import attention_spectrum


def _models(directories: list[str]):
    if not directories:
        yield from ((name, name) for name in sorted(tasks.shipped_checkpoints()))
    for d in directories:
        for path in sorted(Path(d, "runs").glob("*-seed0-*.safetensors")):
            yield path.name.split("-seed0")[0], str(path)


def main(out: str, directories: list[str]) -> None:
    torch.set_num_threads(1)
    rows = {}
    for name, source in _models(directories):
        model, task = tasks.load(source, device="cpu")
        split = "test" if "test" in task.splits else task.splits[-1]
        r = attention_spectrum(model, task.dataset(split), task=task, n_inputs=32)
        rows[name] = {"source": Path(source).name, "split": split, **r.to_dict()}
        fr = r.rank90_fraction.flatten()
        ranks = " ".join(f"k={k}:{a:.3f}" for k, a in zip(r.ks, r.accuracy.tolist()))
        print(
            f"{name:40s} T={r.mean_length:6.1f} heads={fr.numel():3d} rank90/T mean {fr.mean():.3f} "
            f"min {fr.min():.3f} max {fr.max():.3f} | full {r.full_accuracy:.3f} | {ranks}",
            flush=True,
        )
    Path(out).write_text(json.dumps(rows, indent=1, default=lambda x: x.tolist() if hasattr(x, "tolist") else str(x)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
