"""What the save-time check of interp.save_checkpoint costs: saving a model (rebuilt from what the file will hold,
compared with the model, then written with the checksums) against writing the same tensors and their checksum alone
(what the version-1 writer did), measured in the same run.

    .venv/bin/python benchmarks/checkpoint_save.py [--threads 1] [--repeats 5]

Models: the shipped noisy-majority, modular-addition and integer-addition checkpoints (saved with their spec), and a
4-layer model of TransformerLens' own (d_model 256, 8 heads, d_mlp 1024; saved from its config). Median of
``--repeats`` saves each.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from timing import timed  # benchmarks/timing.py (the script's folder is on sys.path)
from transformer_lens import HookedTransformer, HookedTransformerConfig

from interp.checkpoint import save_checkpoint, tensor_checksum
from interp.tasks import get_task, load_checkpoint


def median_seconds(fn, repeats: int) -> float:
    return statistics.median(timed(fn)[1] for _ in range(repeats))


def tensors_only(model, path: Path) -> None:
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"checksum": tensor_checksum(tensors)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp())
    cases = []
    for name in ("noisy-majority", "modular-addition", "integer-addition"):
        ck = load_checkpoint(name, device="cpu")
        cases.append((name, ck.model, ck.task, ck.spec, ck.training))
    task = get_task("modular-addition")
    cfg = HookedTransformerConfig(
        n_layers=4, d_model=256, n_heads=8, d_head=32, d_mlp=1024, d_vocab=len(task.vocab),
        d_vocab_out=task.vocab.n_out, n_ctx=256, act_fn="gelu", device="cpu", seed=0,
    )  # fmt: skip
    cases.append(("4 layers, d_model 256", HookedTransformer(cfg), task, None, {}))
    print(f"{torch.get_num_threads()} torch thread(s), median of {args.repeats}")
    for name, model, task, spec, training in cases:
        n = sum(p.numel() for p in model.parameters())
        full = median_seconds(
            lambda: save_checkpoint(model, task, folder / "a.safetensors", training=training, spec=spec), args.repeats
        )
        bare = median_seconds(lambda: tensors_only(model, folder / "b.safetensors"), args.repeats)
        print(
            f"{name} ({n / 1e6:.2f}M parameters): save_checkpoint {full * 1000:7.1f} ms, tensors and checksum alone "
            f"{bare * 1000:6.1f} ms, ratio {full / bare:4.1f}"
        )


if __name__ == "__main__":
    main()
