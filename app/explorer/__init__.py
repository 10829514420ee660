"""The explorer: one Jupyter widget to pick an input, see every head's attention, switch heads off and patch, with
every number recomputed live by the toolkit in the kernel.

``w = interp.explore("noisy-majority")`` (a shipped name, a checkpoint path or a :class:`interp.Checkpoint`) or
``w = interp.explore(model, task)`` (any ``HookedTransformer`` paired with its task) returns an ``anywidget`` widget.
Its JavaScript (``explorer.js`` in this package, shipped with it; nothing is fetched from a CDN) only draws and
sends events; the kernel computes:

- the prediction at the task's answer positions (every position with a target), under the current head mask: one
  forward pass with ``hook_z`` hooks that zero the heads switched off or replace their output by its mean over the
  accuracy batch (the ablation of Fraknói 2024, Definition 5.1, as :func:`analyses.learned_accuracy` does);
- every head's attention pattern on that input (the same forward pass);
- the learned accuracy under the mask on the first ``batch_size`` examples of the current split, by
  :func:`analyses.learned_accuracy` (its batched path; one-layer attention-only models recombine cached head
  outputs, so a new mask's accuracy costs well under a millisecond there, and deeper models one forward pass of the
  batch);
- for the head whose panel is open: its QK and OV circuits (:func:`analyses.full_qk_circuit`,
  :func:`analyses.full_ov_circuit`, and :func:`analyses.positional_qk_circuit` where positions are learned), its
  learned accuracy alone, its induction / previous-token scores (:func:`analyses.head_scores`, Olsson et al.,
  "In-context Learning and Induction Heads"), its separation accuracy (:func:`analyses.separation_accuracy`) and
  Shapley value (:func:`analyses.shapley_values`) when asked for, and its direct logit contribution;
- activation patching of every head's output between the input and a corrupted one
  (:func:`analyses.activation_patching`), and path patching from a chosen sender head
  (:func:`analyses.path_patching`; Wang et al., "Interpretability in the Wild").

The state is readable and settable from Python (``w.example = ("test", 3)``, ``w.tokens = "0 1 1"``,
``w.ablated = ["L0H1"]``: the heads switched off, ``w.mask``: the same as a ``[layer, head]`` mask, 1 = kept,
``w.ablation = "mean"``, ``w.batch_size = 512``, ``w.head = "L0H3"``, ``w.corruption = "flip"``), and so are
the numbers shown (``w.prediction``, ``w.accuracy``, ``w.patterns``, ``w.patching``, ``w.head_panel``).
``w.snippet()`` is the Python that reproduces the view, ``w.state()`` the view as a :class:`interp.Result`. A
notebook saved with the widget's output shows a static snapshot (HTML with the patterns as images) where no kernel
runs: nbconvert, GitHub's viewer.

What is task-specific comes from the task's suite (``interp.analyses.suite_for(task)``; the generic suite for a task
that registered none): how typed tokens become an example, the task's own corrupted inputs, and the probe sequences
of the head scores (:class:`interp.suite.Suite`'s explorer hooks). Nothing here names a task.

The modules: :mod:`.state` (the session state and its validation), :mod:`.views` (what is computed for the page),
:mod:`.snippet` (the Python that reproduces the view), :mod:`.widget` (the anywidget wiring and :func:`explore`),
:mod:`.inputs` (typed inputs and the corrupted inputs every task has), :mod:`.compute` (the masked forward pass,
direct logit attribution, the patterns as the page gets them, the head panel's numbers), :mod:`.results` (the
prediction and the view as results) and :mod:`.snapshot` (the static HTML and PNG snapshot).
"""

from __future__ import annotations

from .compute import direct_logit_attribution, keep_mask, mask_hooks, masked_forward
from .inputs import corruption_kinds, resample, typed_example
from .results import ExplorerState, Prediction
from .widget import Explorer, explore

__all__ = [
    "Explorer",
    "ExplorerState",
    "Prediction",
    "corruption_kinds",
    "direct_logit_attribution",
    "explore",
    "keep_mask",
    "mask_hooks",
    "masked_forward",
    "resample",
    "typed_example",
]
