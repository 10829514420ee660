"""The computational graph of a HookedTransformer, as circuit discovery sees it (Conmy et al. 2023, *Towards
Automated Circuit Discovery for Mechanistic Interpretability*; Syed, Rager and Conmy 2023, *Attribution Patching
Outperforms Automated Circuit Discovery*).

**Senders** are what writes into the residual stream: the input (token and positional embedding together: the
residual stream entering layer 0, ``blocks.0.hook_resid_pre``), every attention head (its output ``z_h W_O[h]``)
and every MLP (``hook_mlp_out``). **Receivers** are what reads it: each head's query, key and value input
(TransformerLens' split inputs ``hook_q_input``, ``hook_k_input``, ``hook_v_input``, before ``ln1``), each MLP's
input (``hook_mlp_in``) and the logits (the residual stream leaving the last layer, before ``ln_final``). An **edge**
is a sender-to-receiver path through the residual stream: every sender that writes before the receiver reads (an
earlier layer; an MLP also reads its own layer's heads unless attention and MLP run in parallel).

Because the residual stream entering a receiver is the sum of its senders' outputs plus constant biases (``b_O``,
``b_out``), patching one edge is adding ``ref_s - out_s`` (the sender's reference output minus its output in this
run) to that receiver's input alone; this is exact for pre-norm blocks (LayerNorm, RMSNorm or none). Blocks whose
normalisation sits after the attention or MLP (post-norm, ``use_normalization_before_and_after``) do not write a
sum of per-node outputs, and are refused.

**Grouped-query attention**: the heads of a group share one key and one value input (TransformerLens'
``hook_k_input`` / ``hook_v_input`` have one slot per key/value head), so the key and value receivers are per
key/value head, named ``L1KV0.k`` and ``L1KV0.v``; queries stay per head (``L1H3.q``). **Attention variants** of
:mod:`interp.attention` (sparse masks, linear and additive pooling, Q/K/V constraints) all compute queries, keys
and values through TransformerLens' projection, so every variant has the same q, k and v receivers (the pooling
only changes how q and k meet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import ConfigError, InterpError
from interp.results import Result

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

INPUT, LOGITS = "input", "logits"


def _post_norm(model: HookedTransformer) -> bool:
    try:
        from transformer_lens.components.transformer_block import POST_NORM_ARCHITECTURES
    except ImportError:  # pragma: no cover - older TransformerLens
        return False
    return getattr(model.cfg, "original_architecture", None) in tuple(POST_NORM_ARCHITECTURES)


def check_graph_model(model: HookedTransformer) -> None:
    """Refuse a model whose residual stream is not the sum of its nodes' outputs (post-norm blocks)."""
    if model.cfg.use_normalization_before_and_after or _post_norm(model):
        raise ConfigError(
            "circuit discovery needs pre-norm blocks (the residual stream is the sum of the input, the heads' and the "
            "MLPs' outputs); this model normalises after attention / MLP (use_normalization_before_and_after or a "
            "post-norm architecture), so an edge is not a separable term"
        )


@dataclass(eq=False)
class ComputationalGraph(Result):
    """Nodes and edges of a model (see the module doc). ``senders`` / ``receivers`` are names (``input``, ``L0H3``,
    ``MLP0``; ``L1H0.q``, ``L1KV0.k``, ``MLP1``, ``logits``), ``sender_layer`` / ``receiver_layer`` their layers
    (input -1, logits ``n_layers``), ``edges`` the ``(receiver, sender)`` index pairs, in receiver order."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    has_mlp: bool
    parallel: bool
    senders: list[str] = field(default_factory=list)
    sender_layer: list[int] = field(default_factory=list)
    receivers: list[str] = field(default_factory=list)
    receiver_layer: list[int] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def build(cls, n_layers: int, n_heads: int, n_kv_heads: int, has_mlp: bool, parallel: bool) -> ComputationalGraph:
        g = cls(n_layers, n_heads, n_kv_heads, has_mlp, parallel)
        g.senders, g.sender_layer = [INPUT], [-1]
        for l in range(n_layers):
            g.senders += [f"L{l}H{h}" for h in range(n_heads)]
            g.sender_layer += [l] * n_heads
            if has_mlp:
                g.senders.append(f"MLP{l}")
                g.sender_layer.append(l)
        kv = "H" if n_kv_heads == n_heads else "KV"
        for l in range(n_layers):
            g.receivers += [f"L{l}H{h}.q" for h in range(n_heads)]
            g.receivers += [f"L{l}{kv}{h}.k" for h in range(n_kv_heads)]
            g.receivers += [f"L{l}{kv}{h}.v" for h in range(n_kv_heads)]
            g.receiver_layer += [l] * (n_heads + 2 * n_kv_heads)
            if has_mlp:
                g.receivers.append(f"MLP{l}")
                g.receiver_layer.append(l)
        g.receivers.append(LOGITS)
        g.receiver_layer.append(n_layers)
        for r, rl in enumerate(g.receiver_layer):
            r_mlp = g.receivers[r].startswith("MLP")
            for s, sl in enumerate(g.sender_layer):
                same_layer_head = sl == rl and r_mlp and not g.senders[s].startswith("MLP") and not parallel
                if sl < rl or same_layer_head:
                    g.edges.append((r, s))
        return g

    # -- views --------------------------------------------------------------------------------------------------
    @property
    def n_senders(self) -> int:
        return len(self.senders)

    @property
    def n_receivers(self) -> int:
        return len(self.receivers)

    @property
    def n_edges(self) -> int:
        return len(self.edges)

    @property
    def edge_names(self) -> list[str]:
        return [f"{self.senders[s]}->{self.receivers[r]}" for r, s in self.edges]

    def edge_index(self, name: str) -> int:
        """The index of an edge named ``"L0H1->L1H0.k"`` (spaces ignored)."""
        want = name.replace(" ", "")
        try:
            return self.edge_names.index(want)
        except ValueError:
            raise InterpError(
                f"no edge {name!r} in this graph; edges are named sender->receiver, e.g. {self.edge_names[0]!r} "
                f"(senders {self.senders[:4]}..., receivers {self.receivers[:4]}...)"
            ) from None

    def edge_tensor(self, device=None) -> tuple[Tensor, Tensor]:
        """``(receiver, sender)`` index tensors of the edges."""
        e = torch.tensor(self.edges, dtype=torch.long, device=device).reshape(-1, 2)
        return e[:, 0], e[:, 1]

    def matrix(self, per_edge: Float[Tensor, "*n edge"]) -> Float[Tensor, "*n receiver sender"]:
        """Per-edge values laid out as ``[..., receiver, sender]`` (0 where there is no edge)."""
        r, s = self.edge_tensor(per_edge.device)
        out = per_edge.new_zeros(*per_edge.shape[:-1], self.n_receivers, self.n_senders)
        out[..., r, s] = per_edge
        return out

    def sender_index(self, layer: int, head: int | None = None) -> int:
        """A head's (``head`` given) or an MLP's sender index."""
        per = self.n_heads + int(self.has_mlp)
        return 1 + layer * per + (self.n_heads if head is None else head)

    def receiver_slots(self, layer: int) -> dict[str, list[int]]:
        """The receiver indices of ``layer`` by input: ``q`` (per head), ``k``/``v`` (per key/value head), ``mlp``."""
        per = self.n_heads + 2 * self.n_kv_heads + int(self.has_mlp)
        base = layer * per
        H, K = self.n_heads, self.n_kv_heads
        out = {
            "q": list(range(base, base + H)),
            "k": list(range(base + H, base + H + K)),
            "v": list(range(base + H + K, base + H + 2 * K)),
        }
        out["mlp"] = [base + H + 2 * K] if self.has_mlp else []
        return out

    def node_of_receiver(self, r: int) -> str:
        """The node a receiver belongs to (``L1H0.q -> L1H0``; ``L1KV0.k`` -> ``L1KV0``)."""
        return self.receivers[r].split(".")[0]

    # -- protocol -----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "has_mlp": self.has_mlp,
            "parallel": self.parallel,
            "senders": list(self.senders),
            "receivers": list(self.receivers),
            "n_edges": self.n_edges,
        }

    @classmethod
    def from_dict(cls, d: dict) -> ComputationalGraph:
        g = cls.build(d["n_layers"], d["n_heads"], d["n_kv_heads"], d["has_mlp"], d["parallel"])
        if g.senders != d["senders"] or g.receivers != d["receivers"]:
            raise InterpError("the saved graph's nodes do not match the graph of its configuration")
        return g

    def text(self) -> str:
        kinds = "attention-only" if not self.has_mlp else "attention + MLP" + (" (parallel)" if self.parallel else "")
        gqa = f", {self.n_kv_heads} key/value heads (grouped-query)" if self.n_kv_heads != self.n_heads else ""
        return (
            f"computational graph: {self.n_layers} layer(s) x {self.n_heads} head(s){gqa}, {kinds}: "
            f"{self.n_senders} senders, {self.n_receivers} receivers, {self.n_edges} edges"
        )


def computational_graph(model: HookedTransformer, *, device: str | None = None) -> ComputationalGraph:
    """The graph of ``model`` (see the module doc): senders, receivers and every edge between them. ``device``: None
    (the model's) or the model's device (another is refused, as by every analysis)."""
    from interp.device import check_device

    check_device(model, device)
    check_graph_model(model)
    cfg = model.cfg
    kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    if getattr(cfg, "ungroup_grouped_query_attention", False):
        kv = cfg.n_heads
    return ComputationalGraph.build(
        cfg.n_layers, cfg.n_heads, kv, not cfg.attn_only, bool(getattr(cfg, "parallel_attn_mlp", False))
    )
