"""The snippet: the Python that reproduces the numbers of the explorer's current view with the toolkit's own calls
(the model and data, the input, the heads ablated with the accuracy and prediction under them, the patching and the
open head's circuits). It names no task: typed input and the task's own corruptions are reached through the task's
suite (``interp.analyses.suite_for(task)``), as the explorer reaches them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .compute import TOP_K

if TYPE_CHECKING:
    from .state import Session
    from .views import Views


def snippet(s: Session, v: Views, checkpoint: str | None) -> str:
    """The Python calls behind the current numbers (``checkpoint``: how to load the model again, a registered name
    or a path; None for a model passed in)."""
    lines = ["import interp", "from interp import analyses", "", *_data(s, checkpoint), *_input(s), *_mask(s, v)]
    if s.corruption is not None:
        lines += _patching(s)
        if v.circuit_result is not None:
            lines += _circuit(s, v)
    if s.head is not None:
        head = v.head_view.get("head") or _label(s.head)
        defined = all("undefined" not in c for c in v.head_view.get("circuits", []) if "QK" in c.get("name", ""))
        if defined:
            lines.append(f"qk = analyses.full_qk_circuit(model, heads={head!r}, vocab=task.vocab)")
        else:
            lines.append(f"# no QK circuit: {head}'s layer pools with linear or additive scores, not q·k")
        lines.append(f"ov = analyses.full_ov_circuit(model, heads={head!r}, vocab=task.vocab)")
    return "\n".join(lines) + "\n"


def _label(head: tuple[int, int]) -> str:
    return f"L{head[0]}H{head[1]}"


def _data(s: Session, checkpoint: str | None) -> list[str]:
    """The model (loaded again from its checkpoint where there is one), task, split and batch."""
    task = s.task
    if checkpoint is not None:
        lines = [f"ckpt = interp.load_checkpoint({checkpoint!r})", "model, task = ckpt.model, ckpt.task"]
    else:
        lines = [
            "# model: the HookedTransformer you passed to interp.explore",
            f"task = interp.get_task({task.name!r}, **{task.params()!r})",
        ]
    return [
        *lines,
        f"data = task.dataset({s.split!r})",
        f"batch = data.select(slice(0, {s.batch()['key'][1]}))  # the accuracy batch",
    ]


def _input(s: Session) -> list[str]:
    """The input: the example of the split, the typed tokens (read by the task's suite), or the pair drawn by the
    task's own corruption."""
    if s.source == "example":
        return [f"example = data.select([{s.index}])  # the input shown"]
    if s.source == "typed":
        return [
            "from interp.app.explorer import typed_example",
            f"example = typed_example(task, {s.typed!r})  # the typed input",
        ]
    return [
        f"corruption = analyses.suite_for(task).corruptions(task)[{s.corruption!r}]  # the task's own",
        f"example, corrupted = corruption.make(task, {s.index})  # a clean input drawn with its corruption",
    ]


def _mask(s: Session, v: Views) -> list[str]:
    """The learned accuracy with the heads ablated, and the masked forward pass of the input."""
    n = s.batch()["key"][1]
    acc = float(v.acc.accuracy[0])
    return [
        "L, H = model.cfg.n_layers, model.cfg.n_heads",
        f"ablated = {s.ablated_names()!r}  # heads switched off",
        "kept = [(l, h) for l in range(L) for h in range(H) if interp.head_label(l, h) not in ablated]",
        f"acc = analyses.learned_accuracy(model, batch, heads=[kept], ablation={s.ablation!r})",
        f"print(acc.accuracy[0])  # the accuracy shown: {acc:.6g} ({round(acc * n)}/{n})",
        "from interp.app.explorer import keep_mask, mask_hooks, masked_forward",
        "z_ref = analyses.mean_head_outputs(model, batch)" if s.ablation == "mean" else "z_ref = None",
        "out = masked_forward(model, example.tokens, keep_mask(model, ablated), z_ref)  # logits and patterns",
        "probs = out['logits'][0, example.answer_pos[0]].softmax(-1)",
        f"print(probs.topk({TOP_K}))  # top tokens at the answer position",
    ]


def _patching(s: Session) -> list[str]:
    """The corrupted input (a pair was drawn with the input), activation patching and path patching from the
    sender."""
    lines = []
    if s.corruption == "resample":
        lines.append(f"corrupted = data.select([{s.resampled}])  # same length, another answer")
    elif s.corruption == "typed":
        lines += [
            "from interp.app.explorer import typed_example",
            f"corrupted = typed_example(task, {s.corrupt_text!r})",
        ]
    elif not s.is_pair(s.corruption):
        lines.append(f"corrupted = analyses.suite_for(task).corruptions(task)[{s.corruption!r}].make(example, 0)")
    lines.append(
        "patching = analyses.activation_patching(model, example, corrupted=corrupted, metric='logit_diff', "
        "where='z', per='head')"
    )
    if s.sender is not None:
        lines.append(
            f"paths = analyses.path_patching(model, example, corrupted=corrupted, metric='logit_diff', "
            f"senders=[{_label(s.sender)!r}])"
        )
    return lines


def _circuit(s: Session, v: Views) -> list[str]:
    """The circuit view: every edge's EAP score on the input pair, and the logit difference with the edges off."""
    return [
        "import torch",
        "from interp.analyses.circuit_scores import circuit_metrics, edge_attribution, prepare",
        "ctx = prepare(model, example, corrupted=corrupted, ablation='patch', metric='logit_diff')",
        "scores = edge_attribution(ctx)  # every edge's EAP score, as analyses.discover_circuit(method='eap') gives",
        f"edges_off = {s.edges_off_names()!r}",
        "keep = torch.ones(ctx.graph.n_edges, dtype=torch.bool)",
        "keep[[ctx.graph.edge_index(e) for e in edges_off]] = False",
        f"print(circuit_metrics(ctx, keep[None]))  # the logit difference shown: {v.circuit_result.circuit:.6g}",
    ]
