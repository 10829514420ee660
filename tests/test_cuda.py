"""Every analysis on CUDA gives the CPU's numbers: the shipped checkpoints' suites, exact Shapley values, patching,
circuit discovery, the report, the architectures a user brings, and batched training against the solo run.

Skipped where no CUDA device is present (CI has none); they run on a machine with a GPU. Each test computes the same
thing on the CPU and on the GPU and compares the results' plain dicts (``to_dict()``) leaf by leaf. Tolerance: float32
on two devices sums in different orders, so a number agrees to ``ATOL + RTOL * |cpu|`` (below); a discrete outcome
(an accuracy, a ranking) may flip only where the CPU's own margin is within that rounding, which these tests count
and report rather than tolerate silently. ``INTERP_DEVICE_LOG=FILE`` appends every comparison's largest differences
to FILE as JSON lines (what a GPU session brings back)."""

from __future__ import annotations

import copy
import json
import math
import os
import re

import pytest
import torch

CUDA = os.environ.get("INTERP_TEST_DEVICE", "cuda")  # "cpu" compares the CPU with itself: a dry run of these tests
if CUDA.startswith("cuda") and not torch.cuda.is_available():
    pytestmark = pytest.mark.skip(reason="no CUDA device here: these tests compare CUDA with the CPU")

# float32 rounding of the same sums in another order, over a few layers: measured differences are ~1e-6 relative
ATOL = 1e-4
RTOL = 1e-4
# A separation accuracy is the test accuracy of a linear SVC solved to a tolerance: on two devices its features differ
# by float rounding, the solver stops at another point within its tolerance, and test sequences within that distance
# of the boundary may land on the other side. Measured on an H100: at most 2 of 1,000. Allowed: FLIPS of n_test per
# accuracy (and per ROC AUC, the probe's ranking), 2x that for a Shapley value of such accuracies (a weighted mean
# of differences of two values) and 4x for a pair interaction (of four).
FLIPS = 3
SVC_LEAVES = ("separation_accuracy", "roc_auc")
# provenance, not results: where and how long, which differ by construction
PROVENANCE = {"seconds", "device", "wall_seconds", "elapsed", "engine", "time"}


def _leaves(a, b, path=""):
    """(path, cpu, gpu) for every leaf of two plain-JSON structures, and ("shape", ...) where they differ in shape."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            yield (path + " keys", sorted(map(str, a)), sorted(map(str, b)))
        for k in a.keys() & b.keys():
            if str(k) not in PROVENANCE:
                yield from _leaves(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            yield (path + " length", len(a), len(b))
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                yield from _leaves(x, y, f"{path}[{i}]")
    else:
        yield (path, a, b)


NUMBER = re.compile(r"-?\d+(\.\d+)?(e-?\d+)?")


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _svc_tolerance(path: str, n_test: int | None, separation_values: bool) -> float:
    """The allowance for a leaf that counts test sequences on either side of an SVC (0 for any other leaf)."""
    if n_test is None:
        return 0.0
    flip = FLIPS / n_test
    if separation_values:  # a Shapley result whose coalition values are separation accuracies
        return 4 * flip if ".interactions" in path else 2 * flip
    return flip if path.rsplit(".", 1)[-1].split("[", maxsplit=1)[0] in SVC_LEAVES else 0.0


def compare(name, cpu, gpu, n_test: int | None = None):
    """Compare two results' dicts; log the largest differences; return the leaves outside the tolerance. Numbers
    inside strings (a verdict quoting an accuracy) are compared as numbers, the rest of the string exactly."""
    separation_values = isinstance(cpu, dict) and cpu.get("value") == "separation"
    bad, worst, n, flips = [], 0.0, 0, 0
    for path, a, b in _leaves(cpu, gpu):
        n += 1
        if isinstance(a, str) and isinstance(b, str) and a != b:
            if NUMBER.sub("#", a) != NUMBER.sub("#", b):
                bad.append((path, a, b))
            continue
        if _number(a) and _number(b):
            if math.isnan(a) and math.isnan(b):
                continue
            d = abs(a - b)
            tol = max(ATOL + RTOL * abs(a), _svc_tolerance(path, n_test, separation_values))
            flips += d > ATOL + RTOL * abs(a)
            if math.isfinite(d):
                worst = max(worst, d / tol)
            if not d <= tol:
                bad.append((path, a, b))
        elif a != b:
            bad.append((path, a, b))
    log = os.environ.get("INTERP_DEVICE_LOG")
    if log:
        with open(log, "a") as f:
            outside = [list(map(str, x)) for x in bad[:50]]
            row = {"test": name, "device": CUDA, "leaves": n, "beyond_rounding": flips, "worst_over_tolerance": worst}
            row["outside"] = outside
            f.write(json.dumps({**row, "n_outside": len(bad)}) + "\n")
    return bad


def _dict(result):
    return json.loads(json.dumps(result.to_dict(), default=str))


@pytest.fixture(scope="module")
def shipped():
    from interp.tasks import shipped_checkpoints

    return shipped_checkpoints()


@pytest.mark.parametrize("name", ["noisy-majority", "repeated-tokens", "modular-addition", "integer-addition"])
def test_each_shipped_suite_on_cuda_equals_cpu(name, shipped):
    """The task's whole analysis suite (per-head learned and separation accuracy, attention ratios, circuits,
    induction and composition scores, Fourier measures, carry cases: whatever the task's suite runs)."""
    from interp.analyses import suite_for
    from interp.tasks import load_checkpoint

    if name not in shipped:
        pytest.skip(f"no shipped checkpoint {name!r}")
    cpu = load_checkpoint(name, device="cpu")
    gpu = load_checkpoint(name, device=CUDA)
    assert next(gpu.model.parameters()).device.type == CUDA.split(":")[0]
    suite = suite_for(cpu.task)
    n_test = len(cpu.task.dataset("test").tokens)
    bad = compare(f"suite {name}", _dict(suite.analyze(cpu)), _dict(suite.analyze(gpu)), n_test)
    assert not bad, bad[:10]


def test_exact_shapley_values_on_cuda_equal_cpu(nm_task):
    """All 65,536 coalitions of the shipped model's 16 heads, learned accuracy and separation accuracy."""
    from interp.analyses import shapley_values
    from interp.tasks import load_checkpoint

    cpu = load_checkpoint("noisy-majority", device="cpu").model
    gpu = load_checkpoint("noisy-majority", device=CUDA).model
    test = nm_task.dataset("test")
    a, b = shapley_values(cpu, test), shapley_values(gpu, test)
    assert not compare("shapley learned-accuracy", _dict(a), _dict(b))
    sub = nm_task.dataset("train")
    heads = ["L0H0", "L0H1", "L0H2", "L0H3", "L0H8", "L0H9"]
    a = shapley_values(cpu, test, value="separation", train=sub, heads=heads)
    b = shapley_values(gpu, test, value="separation", train=sub, heads=heads)
    assert not compare("shapley separation", _dict(a), _dict(b), len(test.tokens))


def test_patching_and_circuit_discovery_on_cuda_equal_cpu():
    from interp.analyses import activation_patching, discover_circuit, path_patching
    from interp.tasks import load_checkpoint

    cpu = load_checkpoint("repeated-tokens", device="cpu")
    gpu = load_checkpoint("repeated-tokens", device=CUDA).model
    data = cpu.task.dataset("test")
    clean = data.tokens[:16]
    corrupted = data.tokens[16:32]

    def metric(logits):  # a metric on logits, as TransformerLens' patching takes one: two positions' logits
        return logits[:, -1, 0].mean() - logits[:, -3, 1].mean()

    failures = []
    for where in ("z", "resid_pre", "pattern"):
        a = activation_patching(cpu.model, clean, corrupted=corrupted, metric=metric, where=where)
        b = activation_patching(gpu, clean, corrupted=corrupted, metric=metric, where=where)
        failures += compare(f"activation_patching {where}", _dict(a), _dict(b))
    a = path_patching(cpu.model, clean, corrupted=corrupted, metric=metric)
    b = path_patching(gpu, clean, corrupted=corrupted, metric=metric)
    failures += compare("path_patching", _dict(a), _dict(b))
    for method in ("eap", "eap-ig", "patching"):
        a = discover_circuit(cpu.model, clean, corrupted=corrupted, metric=metric, method=method)
        b = discover_circuit(gpu, clean, corrupted=corrupted, metric=metric, method=method)
        failures += compare(f"discover_circuit {method}", _dict(a), _dict(b))
    assert not failures, failures[:10]


ARCHITECTURES = {
    "64 heads, trained W_O": dict(n_layers=1, d_model=2, n_heads=64, d_head=2, attn_only=True),
    "2 layers with MLP": dict(n_layers=2, d_model=16, n_heads=4, d_head=4, d_mlp=24),
    "grouped-query attention": dict(n_key_value_heads=2),
    "parallel attention and MLP": dict(parallel_attn_mlp=True),
    "rotary": dict(positional_embedding_type="rotary", rotary_dim=2, rotary_base=500),
    "soft caps": dict(output_logits_soft_cap=2.0, attn_scores_soft_cap=1.5),
}


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_a_users_architecture_on_cuda_equals_cpu(arch):
    """A plain HookedTransformer a user brings, paired with a task: the generic suite (learned accuracy per head,
    head scores) and the weight-based circuits, on both devices."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from interp.analyses import composition_scores, full_ov_circuit, full_qk_circuit, learned_accuracy, suite_for
    from interp.checkpoint import Checkpoint
    from interp.tasks import get_task

    task = get_task(
        "noisy-majority", train_size=64, val_size=32, test_size=64,
        train_lengths=[0, 10], val_lengths=[11, 15], test_lengths=[16, 20],
    )  # fmt: skip
    cfg = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, d_mlp=24, d_vocab=len(task.vocab),
               d_vocab_out=task.vocab.n_out, n_ctx=32, act_fn="relu", seed=3, device="cpu")  # fmt: skip
    model = HookedTransformer(HookedTransformerConfig(**{**cfg, **ARCHITECTURES[arch]}))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    gpu = copy.deepcopy(model).to(CUDA)
    test = task.dataset("test")
    failures = []
    suite = suite_for(task)
    failures += compare(f"{arch} suite", _dict(suite.analyze(Checkpoint(model, task))),
                        _dict(suite.analyze(Checkpoint(gpu, task))))  # fmt: skip
    heads = [[h] for h in ("L0H0", "L0H1")] + [["L0H0", "L0H1"]]
    failures += compare(f"{arch} learned_accuracy", _dict(learned_accuracy(model, test, heads=heads)),
                        _dict(learned_accuracy(gpu, test, heads=heads)))  # fmt: skip
    if model.cfg.n_layers > 1:
        failures += compare(f"{arch} composition", _dict(composition_scores(model)), _dict(composition_scores(gpu)))
    if ARCHITECTURES[arch].get("positional_embedding_type") != "rotary":
        for fn in (full_qk_circuit, full_ov_circuit):
            failures += compare(f"{arch} {fn.__name__}", _dict(fn(model, heads="L0H1", vocab=task.vocab)),
                                _dict(fn(gpu, heads="L0H1", vocab=task.vocab)))  # fmt: skip
    assert not failures, failures[:10]


def _largest_difference(a: dict, b: dict) -> float:
    """The largest difference of two state dicts' floating tensors; equal entries (infinities, NaNs) count 0."""
    assert a.keys() == b.keys()
    worst = 0.0
    for k, v in a.items():
        x, y = v.float().cpu(), b[k].float().cpu()
        same = (x == y) | (x.isnan() & y.isnan())
        worst = max(worst, torch.where(same, 0.0, (x - y).abs()).max().item() if x.numel() else 0.0)
    return worst


@pytest.mark.parametrize(
    "dropout_at, rng, objective",
    [
        ("attention", "torch", "answer"),
        ("embedding+attention", "torch", "answer"),
        ("attention", "counter", "answer"),
        ("attention", "counter", "lm"),  # the prefix-count step
    ],
    ids=["attention-torch", "embedding+attention-torch", "attention-counter", "prefix counts"],
)
def test_population_on_cuda_equals_its_solo_runs_on_cuda_and_the_cpu(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, dropout_at, rng, objective
):
    """Batched training on the GPU against each seed trained alone on the GPU (the same tolerance as on the CPU,
    tests/test_population.py), and against the same population on the CPU: a run's dropout masks come from torch's
    CPU generator on every device (``interp.dropout_masks.dropout``), so the same seed trains the same model on both
    (float32 rounding of two devices over 3 epochs, measured 1.8e-7 on an H100: allowed 1e-5). Before, a solo run
    on CUDA drew its masks from the CUDA generator, and no population (which draws them on the CPU) equalled it:
    weights 0.03-0.15 apart."""
    from safetensors.torch import load_file

    from interp.population import seed_population, train_population
    from interp.training import train

    cfg = tiny_cfg(epochs=3, dropout=0.1, dropout_at=dropout_at, dropout_rng=rng, objective=objective)
    seeds = [0, 1, 2]
    specs, cfgs = seed_population(tiny_task, tiny_spec, cfg, seeds)
    on = {}
    for dev in ("cpu", CUDA):
        outs = [tmp_path / f"{dev}-pop{s}.safetensors" for s in seeds]
        on[dev] = train_population(tiny_task, specs, cfgs, outs, device=dev, progress=False)
    failures = []
    for s, sp, c in zip(seeds, specs, cfgs):
        solo_out = tmp_path / f"solo{s}.safetensors"
        train(tiny_task, sp, c, solo_out, device=CUDA, progress=False)
        pop = load_file(tmp_path / f"{CUDA}-pop{s}.safetensors")
        solo, cpu = load_file(solo_out), load_file(tmp_path / f"cpu-pop{s}.safetensors")
        worst_solo = _largest_difference(pop, solo)
        worst_cpu = _largest_difference(pop, cpu)
        log = os.environ.get("INTERP_DEVICE_LOG")
        if log:
            with open(log, "a") as f:
                row = {"test": f"population {dropout_at} {rng} {objective} seed {s}", "gpu_pop_vs_gpu_solo": worst_solo}
                f.write(json.dumps({**row, "gpu_pop_vs_cpu_pop": worst_cpu}) + "\n")
        if not worst_solo <= 2e-5:
            failures.append((s, "solo", worst_solo))
        if not worst_cpu <= 1e-5:
            failures.append((s, "cpu", worst_cpu))
    assert not failures, failures


@pytest.mark.parametrize(
    "shape, recipe, forward",
    [
        ({}, dict(dropout_at="attention"), "token counts"),
        (
            dict(d_model=32, n_heads=16, d_head=2, output_matrix="identity"),
            dict(dropout_at="attention", dropout_rng="counter"),
            "token counts",
        ),
        ({}, dict(dropout_at="embedding+attention"), "positions"),
        ({}, dict(dropout_at="attention", objective="lm", dropout_rng="counter"), "prefix counts"),
    ],
    ids=["d8", "d32, 16 heads, counter", "d8, per position", "d8, prefix counts"],
)
def test_compiled_population_on_cuda_equals_eager_on_cuda(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, shape, recipe, forward
):
    """compile=True on CUDA (Triton kernels) trains the same models as the eager code on CUDA, for each of the three
    forwards: the token-count step, the per-position step (its length-sorted runs change width every call: one
    graph for all of them, ``interp.compiled.compiled_step(cut_views=True)``) and the prefix-count step. Tolerance:
    the solo-equality one (2e-5 in any weight after 2 epochs), as on the CPU (tests/test_population.py)."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from interp.population import seed_population, train_population

    seeds = [0, 3]
    specs, cfgs = seed_population(tiny_task, replace(tiny_spec, **shape), tiny_cfg(epochs=2, **recipe), seeds)
    runs = {}
    for compiled in (False, True):
        outs = [tmp_path / f"{compiled}-{s}.safetensors" for s in seeds]
        runs[compiled] = train_population(tiny_task, specs, cfgs, outs, device=CUDA, progress=False, compile=compiled)
    worst = []
    for s, e, c in zip(seeds, runs[False], runs[True]):
        assert c["population"]["compiled"] and not e["population"]["compiled"]
        assert c["population"]["forward"] == e["population"]["forward"] == forward
        assert c["steps"] == e["steps"] and c["kept_epoch"] == e["kept_epoch"]
        diff = _largest_difference(
            load_file(tmp_path / f"True-{s}.safetensors"), load_file(tmp_path / f"False-{s}.safetensors")
        )
        worst.append(diff)
        log = os.environ.get("INTERP_DEVICE_LOG")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"test": f"compiled population {forward} {shape} seed {s}", "worst": diff}) + "\n")
    assert max(worst) <= 2e-5, worst


def test_the_report_command_on_cuda(tmp_path):
    from interp.app.cli import main

    out = tmp_path / "report.html"
    assert main(["report", "noisy-majority", "--out", str(out), "--quiet", "--device", CUDA]) == 0
    assert out.stat().st_size > 100_000


def test_devices_this_machine_lacks_and_models_moved_by_hand(tmp_path):
    """``cuda:N`` beyond this machine's devices is one ConfigError (before: torch's 'invalid device ordinal' after
    the data was built); a torch.device loads; a model moved with plain torch.nn.Module.to is refused when saving,
    in one line, and saved once moved with ``model.to``."""
    from interp.checkpoint import save_checkpoint
    from interp.device import pick_device
    from interp.errors import CheckpointError, ConfigError
    from interp.tasks import load_checkpoint

    if CUDA == "cpu":
        pytest.skip("needs a CUDA device")
    n = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=f"this machine has {n} CUDA device"):
        pick_device(f"cuda:{n}")
    ckpt = load_checkpoint("noisy-majority", device=torch.device("cuda"))
    assert next(ckpt.model.parameters()).is_cuda
    model = load_checkpoint("noisy-majority", device="cpu").model
    torch.nn.Module.to(model, "cuda")
    with pytest.raises(CheckpointError, match=r"model\.cfg\.device is 'cpu'"):
        save_checkpoint(model, ckpt.task, tmp_path / "a.safetensors")
    model.to("cuda")
    save_checkpoint(model, ckpt.task, tmp_path / "b.safetensors")
