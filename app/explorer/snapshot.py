"""The explorer's static snapshot: the view as plain HTML with the attention patterns as PNG images, which a saved
notebook shows where no kernel runs (nbconvert, GitHub's viewer). No script, no imaging package: the PNG files are
written with the standard library's zlib."""

from __future__ import annotations

import base64
import html
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, UInt8
from torch import Tensor

from interp.heads import head_label

from .compute import MAX_POSITIONS, pattern_window
from .results import Prediction, prediction_table

if TYPE_CHECKING:
    from interp.analyses.patching import ActivationPatching

IMAGE_SIZE = 96  # pixels a side of a pattern's image at most (longer patterns are max-pooled)
WHITE, DARK_BLUE, LIGHT_GREY = (255.0, 255.0, 255.0), (8.0, 48.0, 107.0), (240.0, 240.0, 240.0)


def png(rgb: UInt8[np.ndarray, "height width 3"]) -> bytes:
    """A PNG file of an RGB image."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def pattern_images(p: Float[Tensor, "n query key"], size: int = IMAGE_SIZE) -> list[bytes]:
    """Attention patterns as PNG images (white to dark blue on the square root of the weight, as the live view draws
    them; keys after the query light grey), max-pooled to at most ``size`` pixels a side so that peaks stay visible."""
    t = p.shape[-1]
    x = p.float().clamp(0, 1).sqrt().masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -1.0)
    if t > size:
        x = F.adaptive_max_pool2d(x[:, None], size)[:, 0]
    lo, hi = torch.tensor(WHITE), torch.tensor(DARK_BLUE)
    rgb = lo + (hi - lo) * x.clamp(min=0)[..., None]
    rgb = torch.where((x < 0)[..., None], torch.tensor(LIGHT_GREY), rgb)
    return [png(a) for a in rgb.round().to(torch.uint8).numpy()]


def pattern_figures(patterns: Float[Tensor, "layer head query key"], ablated: Sequence[str]) -> str:
    """Every head's pattern as a small captioned image (small multiples), the heads in ``ablated`` marked off."""
    n_heads = patterns.shape[1]
    figures = []
    for i, image in enumerate(pattern_images(patterns.flatten(0, 1))):
        label = head_label(*divmod(i, n_heads))
        state = " (off)" if label in ablated else ""
        figures.append(
            f"<figure style='display:inline-block;margin:2px;text-align:center'>"
            f"<img src='data:image/png;base64,{base64.b64encode(image).decode()}' width='84' height='84' "
            f"style='image-rendering:pixelated;border:1px solid #ccc' alt='attention of {label}'>"
            f"<figcaption style='font-size:11px'>{label}{state}</figcaption></figure>"
        )
    return "<div>" + "".join(figures) + "</div>"


def snapshot_html(
    *,
    model_name: str,
    task_name: str,
    source: str,
    tokens: Sequence[str],
    prediction: Prediction,
    ablated: Sequence[str],
    ablation: str,
    accuracy: Mapping[str, Any],
    patterns: Float[Tensor, "layer head query key"],
    max_positions: int,
    patching: ActivationPatching | None,
    corruption: str | None,
) -> str:
    """Static HTML of the view: the model, the input (``source`` says where it came from), the prediction table, the
    heads off and the accuracy (``accuracy``: the accuracy panel's numbers), every head's attention pattern as a PNG
    image (the positions the live view draws, at most ``max_positions``), and the patching's largest effects."""
    esc = html.escape
    n_layers, n_heads, n_pos, _ = patterns.shape
    off = n_pos - pattern_window(n_layers, n_heads, n_pos, max_positions)
    shown = " ".join(esc(t) for t in tokens[:MAX_POSITIONS]) + (" ..." if len(tokens) > MAX_POSITIONS else "")
    parts = [
        "<div class='interp-explorer-snapshot' style='font-family:sans-serif;font-size:13px;line-height:1.4'>",
        (
            f"<p><b>interp explorer</b>: {esc(model_name)} (task {esc(task_name)}, {n_layers} layer(s) x "
            f"{n_heads} heads). <i>Static snapshot of the state when this output was made; with a running kernel "
            "the widget is live.</i></p>"
        ),
        f"<p>Input ({esc(source)}, {len(tokens)} tokens): <code>{shown}</code></p>",
        prediction_table(prediction.rows()),
        (
            f"<p>Heads off: {esc(', '.join(ablated) or 'none')} ({ablation} ablation). Learned accuracy on "
            f"the first {accuracy['n']} {esc(accuracy['split'])} examples: <b class='interp-explorer-accuracy'>"
            f"{accuracy['accuracy']:.4f}</b> ({accuracy['correct']}/{accuracy['n']}); all heads on: "
            f"{accuracy['full']:.4f}.</p>"
        ),
        (
            "<p>Attention patterns (rows: queries, columns: keys; colour: square root of the weight"
            + (f"; positions {off}..{n_pos - 1}" if off else "")
            + "):</p>"
        ),
        pattern_figures(patterns[:, :, off:, off:], ablated),
    ]
    if patching is not None:
        top = ", ".join(f"{r['head']} {r['normalized']:.2f}" for r in patching.top(5))
        parts.append(
            f"<p>Activation patching ({esc(str(corruption))}): largest effects (normalized logit "
            f"difference, 1 = clean) {esc(top)}.</p>"
        )
    parts.append("</div>")
    return "".join(parts)
