"""Time and peak memory of one training step (forward + cross-entropy + backward through the parameters) against the
sequence length ``n``, for the attention variants' two ways of computing the same thing: TransformerLens' hooked
forward, which builds the ``[query, key]`` score matrix (``O(n²)``), and the fast forwards of
:mod:`interp.fast_attention`, which never do.

    .venv/bin/python benchmarks/attention.py [--max-len 16384] [--budget-s 30] [--window 32] [--threads 1]
        [--device auto] [--malloc mmap|default] [--json OUT]

Paths, each on its own freshly built model (2 attention-only layers, d_model 64, 4 heads of d_head 16, no
positional embedding, ``n_ctx`` = ``--max-len``, one sequence of random tokens):

- ``softmax hooked``: dense causal softmax, TransformerLens' forward (no fast form: every key matters);
- ``window:W hooked`` / ``window:W fast``: a causal sliding window of ``W`` keys (Beltagy et al. 2020, *Longformer:
  The Long-Document Transformer*), TransformerLens' local attention that masks the full ``n x n`` scores, against
  the gathered ``O(n W)`` form;
- ``linear:elu hooked`` / ``linear:elu fast``: linear attention with ``φ = elu + 1`` (Katharopoulos et al. 2020,
  *Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention*), the hooked ``log(φ(q)·φ(k))``
  scores through the softmax against the ``O(n)`` causal prefix sums.

Lengths are the powers of two from ``--min-len`` to ``--max-len``. A path stops at the first length whose step
takes longer than ``--budget-s``, or whose process fails, or whose predicted peak (the baseline plus the last peak
times 4 for a doubling, the worst case of any path here) would pass ``--max-mem-mib``; the longer lengths are
skipped, each saying why.

Time: the best of ``--repeats`` steps (fewer once one passes the budget). Peak memory, on CPU: every point runs in
a fresh process forked from this one (which has only imported and run the checks at the smallest length); it builds
the model and the tokens, runs one step at 8 tokens (code pages and autograd's set-up), resets its resident-set
peak (``/proc/self/clear_refs``), runs the steps and reads the peak (``VmHWM``) back. The peak minus the resident
set just before the steps (the baseline: the same process with the model built, having run nothing at length
``n``) is what the step itself needed. Before the reset the free pages of the heap, many inherited from this
process, go back to the system (``malloc_trim``), so a step that reuses them is charged for them. With
``--malloc mmap`` (the default) every allocation of 128 KiB and more is its own ``mmap`` (``mallopt``), so the
peak follows the live tensors at every length; with ``--malloc default`` glibc moves tensors of up to 32 MiB into
its heap once one that size is freed, and the peak includes the heap's fragmentation (a change of regime in the
middle of the sweep, where the pattern passes 32 MiB, that bends both slopes). Peaks under 1 MiB
are within the resident-set counter's noise (about 0.5 MiB either way): no memory ratio is formed from them. On
CUDA: ``torch.cuda.max_memory_allocated`` minus the memory allocated before the steps, in this process.

Before timing, each fast path is checked against its hooked path on the same weights at the smallest length
(logits and parameter gradients, max abs difference printed, 1e-4 asserted), so the benchmark never times a wrong
computation. Printed: a table per path, the fast/hooked time and memory ratios at each length, the log-log slopes
of time and memory against ``n`` (least squares over the lengths ``>= --fit-from``) and the crossover length from
which the fast path is faster than the hooked one.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from interp.device import pick_device
from interp.fast_attention import fast_attention
from interp.model import ModelSpec, build_model

TOLERANCE = 1e-4
MIN_MIB = 1.0  # peaks below this are within the resident-set counter's noise (about +-0.5 MiB): no memory ratio


def paths(window: int) -> list[tuple[str, str, bool]]:
    """``(name, attention spelling, fast)`` of every timed path."""
    w = f"window:{window}"
    return [
        ("softmax hooked", "softmax", False),
        (f"{w} hooked", w, False),
        (f"{w} fast", w, True),
        ("linear:elu hooked", "linear:elu", False),
        ("linear:elu fast", "linear:elu", True),
    ]


def lengths(min_len: int, max_len: int) -> list[int]:
    out, n = [], min_len
    while n <= max_len:
        out.append(n)
        n *= 2
    return out


def spec_for(attention: str, args) -> ModelSpec:
    return ModelSpec(
        d_vocab=args.vocab,
        n_ctx=args.max_len,
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        d_head=args.d_model // args.heads,
        attention=attention,
    )


def tokens_for(n: int, args, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    return torch.randint(args.vocab, (args.batch, n), generator=g).to(device)


def loss_and_grads(model, tokens: torch.Tensor, fast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One training step's work: logits, next-token cross-entropy, backward through the trainable parameters."""
    for p in model.parameters():
        p.grad = None
    with fast_attention(model) if fast else contextlib.nullcontext():
        logits = model(tokens)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    return logits, loss


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- memory ------------------------------------------------------------------------------------------------------------
def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


def _trim_heap() -> None:
    """glibc: give the free pages of the heap back to the system (``malloc_trim``), so that a step reusing them (the
    forked process inherits its parent's free heap) faults them in again and they count towards the peak."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _pin_mmap_threshold() -> None:
    """glibc: every allocation of 128 KiB and more by its own ``mmap``, returned to the system when freed (no
    dynamic threshold, which would move tensors of up to 32 MiB into the heap once one of that size is freed)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD


def _memory_start(device: str) -> int:
    """Reset the peak and return the baseline (bytes in use now)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    _trim_heap()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    return _status_bytes("VmRSS")


def _memory_peak(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status_bytes("VmHWM")


# -- one point ---------------------------------------------------------------------------------------------------------
def measure(attention: str, fast: bool, n: int, args, device: str) -> dict:
    """Seconds (best of the repeats) and peak MiB above the baseline of one training step at length ``n``."""
    model = build_model(spec_for(attention, args), device)
    tokens = tokens_for(n, args, device)
    loss_and_grads(model, tokens[:, :8], fast)  # one-time costs (code pages, autograd's set-up) into the baseline
    base = _memory_start(device)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        loss_and_grads(model, tokens, fast)
        _sync(device)
        times.append(time.perf_counter() - start)
        if times[-1] > args.budget_s:
            break
    peak = _memory_peak(device) - base
    return {
        "n": n,
        "seconds": min(times),
        "repeats": len(times),
        "peak_mib": peak / 2**20,
        "baseline_mib": base / 2**20,
    }


def _child(conn, attention: str, fast: bool, n: int, args, device: str) -> None:
    try:
        torch.set_num_threads(args.threads)
        if args.malloc == "mmap":
            _pin_mmap_threshold()
        conn.send(("ok", measure(attention, fast, n, args, device)))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def run_point(attention: str, fast: bool, n: int, args, device: str) -> tuple[dict | None, str | None]:
    """``(measurement, None)`` or ``(None, why it failed)``: in a forked process on CPU, here on CUDA."""
    if device.startswith("cuda"):
        try:
            return measure(attention, fast, n, args, device), None
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return None, "out of GPU memory"
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, attention, fast, n, args, device))
    proc.start()
    send.close()
    timeout = 60 + 8 * args.budget_s  # a doubling at most quadruples a step (first step, then budget-s at most)
    try:
        if not recv.poll(timeout):
            proc.kill()
            proc.join()
            return None, f"no answer within {timeout:.0f} s"
        status, payload = recv.recv()
    except EOFError:
        status, payload = "error", None
    proc.join()
    if status == "ok":
        return payload, None
    return None, payload or f"the process died (exit code {proc.exitcode}: out of memory?)"


# -- checks and summaries ----------------------------------------------------------------------------------------------
def check_fast(attention: str, n: int, args, device: str) -> dict:
    """Max abs differences of the fast path's logits and gradients from the hooked path's, same weights and tokens."""
    model = build_model(spec_for(attention, args), device)
    tokens = tokens_for(n, args, device)
    out = {}
    for fast in (False, True):
        logits, _ = loss_and_grads(model, tokens, fast)
        out[fast] = (logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    logits_diff = float((out[True][0] - out[False][0]).abs().max())
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(out[True][1], out[False][1]))
    return {"n": n, "max_abs_diff_logits": logits_diff, "max_abs_diff_grads": grad_diff}


def slope(points: list[dict], key: str, fit_from: int) -> float | None:
    """Least-squares slope of ``log key`` against ``log n`` over the points with ``n >= fit_from``."""
    xy = [(math.log(p["n"]), math.log(p[key])) for p in points if p["n"] >= fit_from and p[key] > 0]
    if len(xy) < 2:
        return None
    mx = sum(x for x, _ in xy) / len(xy)
    my = sum(y for _, y in xy) / len(xy)
    return sum((x - mx) * (y - my) for x, y in xy) / sum((x - mx) ** 2 for x, _ in xy)


def crossover(ratios: list[dict]) -> int | None:
    """The smallest length from which the fast path is faster at every length measured on both paths (None: it is
    not faster at the longest)."""
    best = None
    for r in reversed(ratios):
        if r["time_ratio"] >= 1:
            break
        best = r["n"]
    return best


def _fmt(x: float | None, spec: str) -> str:
    return format("-", spec.rstrip("f").split(".")[0]) if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=16384, help="longest sequence (a power of two times --min-len)")
    p.add_argument("--budget-s", type=float, default=30.0, help="a path stops after a step longer than this")
    p.add_argument("--max-mem-mib", type=float, default=8192, help="skip a point predicted to need more")
    p.add_argument("--window", type=int, default=32, help="W of window:W")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="time the best of this many steps")
    p.add_argument("--fit-from", type=int, default=512, help="fit the slopes over the lengths from this one")
    p.add_argument(
        "--malloc",
        choices=["mmap", "default"],
        default="mmap",
        help="CPU: tensors of 128 KiB and more each in its own mmap (peaks follow live tensors) or glibc's default",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--json", type=Path, help="write the measurements here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    ns = lengths(args.min_len, args.max_len)
    todo = paths(args.window)
    print(
        f"{args.layers} attention-only layers, d_model {args.d_model}, {args.heads} heads, vocab {args.vocab}, batch "
        f"{args.batch}, n_ctx {args.max_len}; on {device}, {torch.get_num_threads()} thread(s); best of "
        f"{args.repeats}; budget {args.budget_s:g} s per step; malloc {args.malloc}"
    )

    checks = {}
    for name, attention, fast in todo:
        if fast:
            c = check_fast(attention, ns[0], args, device)
            checks[name] = c
            print(
                f"check {name} against hooked at n={c['n']}: max |diff| logits {c['max_abs_diff_logits']:.2e}, "
                f"gradients {c['max_abs_diff_grads']:.2e}"
            )
            assert c["max_abs_diff_logits"] <= TOLERANCE, f"{name}: the fast path's logits differ from the hooked"
            assert c["max_abs_diff_grads"] <= TOLERANCE, f"{name}: the fast path's gradients differ from the hooked"

    results = {}
    for name, attention, fast in todo:
        points, skipped, stop = [], {}, None
        for n in ns:
            if stop is None and points:
                last = points[-1]
                predicted = last["baseline_mib"] + last["peak_mib"] * (n / last["n"]) ** 2
                if predicted > args.max_mem_mib:
                    stop = f"predicted peak {predicted:.0f} MiB > --max-mem-mib"
            if stop is not None:
                skipped[n] = stop
                continue
            point, why = run_point(attention, fast, n, args, device)
            if point is None:
                skipped[n], stop = why, why
                continue
            points.append(point)
            if point["seconds"] > args.budget_s:
                stop = f"n={n} took {point['seconds']:.1f} s > --budget-s"
        results[name] = {
            "attention": attention,
            "fast": fast,
            "points": points,
            "skipped": {str(n): why for n, why in skipped.items()},
            "time_slope": slope(points, "seconds", args.fit_from),
            "memory_slope": slope(points, "peak_mib", args.fit_from),
        }
        print(f"\n{name}\n{'n':>7}{'seconds':>11}{'peak MiB':>11}")
        for pt in points:
            print(f"{pt['n']:>7}{pt['seconds']:>11.4f}{pt['peak_mib']:>11.1f}")
        for n, why in skipped.items():
            print(f"{n:>7}  skipped: {why}")

    comparisons = {}
    for name, attention, fast in todo:
        if not fast:
            continue
        hooked = {pt["n"]: pt for pt in results[name.replace(" fast", " hooked")]["points"]}
        ratios = [
            {
                "n": pt["n"],
                "time_ratio": pt["seconds"] / hooked[pt["n"]]["seconds"],
                "memory_ratio": (
                    pt["peak_mib"] / hooked[pt["n"]]["peak_mib"]
                    if min(pt["peak_mib"], hooked[pt["n"]]["peak_mib"]) >= MIN_MIB
                    else None
                ),
            }
            for pt in results[name]["points"]
            if pt["n"] in hooked
        ]
        comparisons[attention] = {"ratios": ratios, "crossover": crossover(ratios)}
        print(f"\n{attention}: fast / hooked\n{'n':>7}{'time':>9}{'memory':>9}")
        for r in ratios:
            print(f"{r['n']:>7}{r['time_ratio']:>9.3f}{_fmt(r['memory_ratio'], '>9.3f')}")
        cross = comparisons[attention]["crossover"]
        print(f"crossover: the fast path is faster from n = {cross if cross is not None else 'never (measured)'}")

    print(f"\nlog-log slopes over n >= {args.fit_from} (time, peak memory)")
    for name, r in results.items():
        print(f"{name:<22}{_fmt(r['time_slope'], '>7.2f')}{_fmt(r['memory_slope'], '>7.2f')}")

    out = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "device": device,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "checks": checks,
        "paths": results,
        "comparisons": comparisons,
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
