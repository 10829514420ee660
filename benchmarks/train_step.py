"""Training-step time of the noisy-majority model: TransformerLens' full forward vs the exact
query-restricted forward (interp/query_forward.py), measured in the same run on the same batches.

    .venv/bin/python benchmarks/train_step.py [--steps 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from interp.device import model_device, pick_device
from interp.model import ModelSpec, build_model, trainable_parameters
from interp.tasks import get_task
from interp.training import batch_loss, dropout_hooks, task_loss


def time_steps(model, batches, fast: bool) -> float:
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-3)
    hooks = dropout_hooks(model, 0.1)
    start = time.perf_counter()
    for batch in batches:
        if fast:
            loss = batch_loss(model, batch, hooks, 0.1)
        else:
            with model.hooks(fwd_hooks=hooks):
                loss = task_loss(model(batch.tokens), batch.targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if model_device(model).type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    device = pick_device(args.device)
    task = get_task("noisy-majority")
    data = task.dataset("train").to(device)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).to(device)
    batches = [data.select(perm[i * 128 : (i + 1) * 128]) for i in range(args.steps)]
    spec = ModelSpec(**task.default_spec())
    slow = time_steps(build_model(spec, device), batches, fast=False)
    fast = time_steps(build_model(spec, device), batches, fast=True)
    print(f"device {device}, {args.steps} steps of batch 128 (train lengths 0-100)")
    print(f"TransformerLens full forward:   {slow * 1000:8.1f} ms/step")
    print(f"query-restricted forward:       {fast * 1000:8.1f} ms/step")
    print(f"speed-up: {slow / fast:.1f}x")


if __name__ == "__main__":
    main()
