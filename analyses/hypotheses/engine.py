"""The interchange-intervention engine: a network's prediction on each base input with sites patched from a source.

An interchange intervention (Geiger et al. 2021, *Causal Abstractions of Neural Networks*) runs the network on a
*base* input while every site of an alignment takes the value it has on the *source* input's run (the whole site,
or only its projection on a subspace: ``x_base + B Bᵀ (x_source - x_base)``, Geiger et al. 2024's distributed
interchange). Each site's position is resolved per example, on the base (where it is written) and on the source
(where it is read), so examples of different lengths pair up by role (the answer position, ...).

Many alignments run at once: the source run is cached once (only the sites' vectors at their positions), and every
alignment's copy of a chunk of base inputs is stacked along the batch axis, one forward per chunk, starting at the
earliest patched layer from the base run's cached residual stream. Sites in the last layer at the readout position
(``z``, ``attn_out``, ``resid_mid``, ``mlp_out``, ``resid_post``) change nothing but that position's residual, so
their effect is recomputed there alone from the base run's cached activations (``method="fast"``; the chain is
checked against the base run's own logits before it is used, and ``method="auto"`` falls back to hooks where it does
not reproduce them). Both ways are tested equal to a plain loop of one ``run_with_hooks`` per pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.device import model_device
from interp.errors import ConfigError
from interp.evaluation import DEFAULT_BUDGET, check_finite_logits
from interp.query_forward import logits_at, query_attention, supports_query_forward
from interp.task import TaskData

from .sites import Site

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

LAST_LAYER_LOCAL = ("z", "attn_out", "resid_mid", "mlp_out", "resid_post")
HOOK_ORDER = {"resid_pre": 0, "z": 1, "attn_out": 2, "resid_mid": 3, "mlp_out": 4, "resid_post": 5}
METHODS = ("auto", "fast", "hooks")


@dataclass
class Patch:
    """One site of one alignment on ``P`` pairs: ``base_pos`` / ``source_pos`` ``[pair, m]``; ``source``
    ``[pair, m, dim]`` the site's vectors on the source run (filled by the engine)."""

    site: Site
    base_pos: Tensor
    source_pos: Tensor
    source: Tensor | None = None


def read_site(act: Tensor, site: Site, rows: Tensor, pos: Tensor) -> Tensor:
    """``[len(rows), m, dim]``: the site's vectors in ``act`` (``[row, pos, head, d_head]`` or ``[row, pos,
    d_model]``) at ``pos[r]`` of each row ``rows[r]``."""
    if site.hook == "z":
        heads = torch.tensor(site.heads, device=act.device)
        x = act[rows[:, None, None], pos[:, :, None], heads[None, None, :]]  # [n, m, k, d_head]
        return x.reshape(x.shape[0], x.shape[1], -1)
    return act[rows[:, None], pos]


def write_site(act: Tensor, site: Site, rows: Tensor, pos: Tensor, source: Tensor, basis: Tensor | None) -> Tensor:
    """``act`` with the site's vectors at (``rows``, ``pos``) replaced by ``source`` (``[n, m, dim]``), or, with
    ``basis`` ``[dim, k]``, only their projection on its span; out of place (gradients flow into ``basis``)."""
    cur = read_site(act, site, rows, pos)
    src = source.to(cur.dtype)
    new = src if basis is None else cur + ((src - cur) @ basis.to(cur.dtype)) @ basis.to(cur.dtype).T
    if site.hook == "z":
        heads = torch.tensor(site.heads, device=act.device)
        new = new.reshape(*new.shape[:2], len(site.heads), -1)
        return act.index_put((rows[:, None, None], pos[:, :, None], heads[None, None, :]), new)
    return act.index_put((rows[:, None], pos), new)


def firing_hooks(model: HookedTransformer) -> set[str]:
    """The hook points that fire in a forward of this model (``resid_mid`` and ``mlp_out`` do not in an
    attention-only or parallel block)."""
    fired: set[str] = set()
    with torch.no_grad():
        model.run_with_hooks(
            torch.zeros((1, 1), dtype=torch.long, device=model_device(model)),
            fwd_hooks=[(lambda name: True, lambda act, hook: fired.add(hook.name))],
        )
    return fired


def query_activations(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], pos: Int[Tensor, "batch m"], hook: str
) -> Tensor:
    """Layer 0's ``hook`` (``z``, ``resid_pre``, ``attn_out`` or ``resid_post``) at ``pos`` of a one-layer
    attention-only model, from those query rows alone (``[batch, m, ...]``); equal to the hooked forward's."""
    from interp.attention import attention_pattern

    x, scores, vals = query_attention(model, tokens, pos)
    rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
    if hook == "resid_pre":
        return x[rows, pos]
    z = torch.einsum("bhkt,bhte->bkhe", attention_pattern(scores), vals)
    if hook == "z":
        return z
    attn = model.blocks[0].attn
    out = torch.einsum("bkhe,hed->bkd", z, attn.W_O) + attn.b_O
    if hook == "attn_out":
        return out
    if hook == "resid_post":
        return x[rows, pos] + out
    raise ConfigError(f"internal: no query-row activation {hook!r}")


class Engine:
    """Interchange interventions of several alignments (each a list of :class:`Patch`) on ``P`` (base, source)
    pairs of task data lined up row by row; ``readout`` ``[pair]`` is the base position whose prediction is read."""

    def __init__(
        self,
        model: HookedTransformer,
        base: TaskData,
        source: TaskData,
        plans: Sequence[Sequence[Patch]],
        readout: Int[Tensor, " pair"],
        source_readout: Int[Tensor, " pair"] | None = None,
        *,
        method: str = "auto",
        batch_size: int | None = None,
    ):
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; expected one of {METHODS}")
        self.model, self.base, self.source = model, base, source
        self.plans = [list(p) for p in plans]
        self.readout = readout
        self.source_readout = readout if source_readout is None else source_readout
        self.batch_size = batch_size
        self.n = len(base)
        # one-layer attention-only models: the caches from the query rows alone (interp.query_forward), O(pos)
        self.query = method != "hooks" and supports_query_forward(model)
        fired = firing_hooks(model)
        for plan in self.plans:
            for p in plan:
                if p.site.hook_name not in fired:
                    raise ConfigError(
                        f"site {p.site.where()}: this model has no {p.site.hook} in layer {p.site.layer} "
                        "(an attention-only or parallel block has no resid_mid or mlp_out)"
                    )
        self._prefixes: dict[int, Tensor] = {}
        self._cache_sources()
        self._base_pass()
        last = model.cfg.n_layers - 1
        local = [all(p.site.layer == last and p.site.hook in LAST_LAYER_LOCAL for p in plan) for plan in self.plans]
        if method == "fast" and not all(local):
            raise ConfigError(
                "method='fast' needs every site in the last layer (z, attn_out, resid_mid, mlp_out or resid_post); "
                "use method='hooks' or 'auto'"
            )
        ok = method != "hooks" and any(local) and self._direct_reproduces()
        if method == "fast" and not ok:
            raise ConfigError("method='fast' does not reproduce this model's logits; use method='hooks' or 'auto'")
        self.direct = [bool(ok and loc) for loc in local]
        self.method = "fast" if all(self.direct) else "hooks" if not any(self.direct) else "fast+hooks"

    # -- caches ---------------------------------------------------------------------------------------------------

    def _chunks(self, lengths: Tensor, query: bool = False, stacked: bool = False):
        """Index chunks of the pairs, sorted by length, of at most the row budget (``batch_size``, or one sized for
        the longest sequence; ``query``: for the query-restricted forward, linear in the length; ``stacked``: for the
        patched forwards)."""
        order = torch.argsort(lengths.cpu(), stable=True).to(lengths.device)
        size = self._stacked_rows() if stacked else self._rows_for(lengths, query)
        for start in range(0, len(order), size):
            yield order[start : start + size]

    def _rows_for(self, lengths: Tensor, query: bool = False) -> int:
        """Sequences per forward: ``batch_size``, else the toolkit's memory budget (``DEFAULT_BUDGET`` rows x pos x
        pos of attention per head; rows x pos for the query-restricted forward)."""
        if self.batch_size is not None:
            return self.batch_size
        t = max(int(lengths.max()), 1)
        return max(1, DEFAULT_BUDGET // (t if query else t * t))

    def _stacked_rows(self) -> int:
        """Rows of one patched forward: activation patching's rule (``batch_size``; on the CPU few enough rows that
        their activations stay in cache, measured faster per row; elsewhere the memory budget)."""
        from interp.analyses.patching import _rows_per_chunk

        return _rows_per_chunk(self.model, max(int(self.base.lengths.max()), 1), self.batch_size)

    def _cache_sources(self) -> None:
        """Each patch's source vectors ``[pair, m, dim]`` and the source run's logits at its readout, from one pass
        over the sources."""
        names = {p.site.hook_name for plan in self.plans for p in plan}
        patches = [p for plan in self.plans for p in plan]
        parts: dict[int, list[Tensor]] = {}
        logits, order = [], []
        with torch.no_grad():
            for idx in self._chunks(self.source.lengths, query=self.query):
                t = int(self.source.lengths[idx].max())
                tokens = self.source.tokens[idx, :t]
                rows = torch.arange(len(idx), device=idx.device)
                if self.query:
                    logits.append(logits_at(self.model, tokens, self.source_readout[idx][:, None])[:, 0])
                    got: dict[tuple, Tensor] = {}
                    for p in patches:
                        key = (p.site.hook, id(p.source_pos))
                        if key not in got:
                            got[key] = query_activations(self.model, tokens, p.source_pos[idx], p.site.hook)
                        act = got[key]  # [n, m, ...]: the positions are its own axis
                        m = act.shape[1]
                        parts.setdefault(id(p), []).append(
                            read_site(act, p.site, rows, torch.arange(m, device=idx.device).expand(len(idx), m))
                        )
                else:
                    out, cache = self.model.run_with_cache(tokens, names_filter=lambda n: n in names)
                    logits.append(out[rows, self.source_readout[idx]])
                    for p in patches:
                        parts.setdefault(id(p), []).append(
                            read_site(cache[p.site.hook_name], p.site, rows, p.source_pos[idx]).clone()
                        )
                order.append(idx)
        perm = torch.cat(order)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(len(inv), device=inv.device)
        self.source_logits = torch.cat(logits)[inv]
        for p in patches:
            p.source = torch.cat(parts[id(p)])[inv]

    def _base_pass(self) -> None:
        """The base run's logits at the readout and, for the last-layer shortcut, its last-layer activations
        there."""
        cfg = self.model.cfg
        last = cfg.n_layers - 1
        hooks = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")
        names = {f"blocks.{last}.hook_{h}" for h in hooks} | {f"blocks.{last}.attn.hook_z"}
        logits, acts, order = [], {}, []
        with torch.no_grad():
            for idx in self._chunks(self.base.lengths, query=self.query):
                t = int(self.base.lengths[idx].max())
                tokens = self.base.tokens[idx, :t]
                rows = torch.arange(len(idx), device=idx.device)
                at = self.readout[idx]
                if self.query:
                    logits.append(logits_at(self.model, tokens, at[:, None])[:, 0])
                    for h in ("resid_pre", "z", "attn_out", "resid_post"):
                        acts.setdefault(h, []).append(query_activations(self.model, tokens, at[:, None], h)[:, 0])
                else:
                    out, cache = self.model.run_with_cache(tokens, names_filter=lambda n: n in names)
                    logits.append(out[rows, at])
                    for k in cache:
                        acts.setdefault(k.split(".")[-1].removeprefix("hook_"), []).append(cache[k][rows, at])
                order.append(idx)
        perm = torch.cat(order)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(len(perm), device=perm.device)
        self.base_logits = torch.cat(logits)[inv]
        check_finite_logits(self.base_logits)
        self.base_last = {k: torch.cat(v)[inv] for k, v in acts.items()}

    # -- the last-layer shortcut ------------------------------------------------------------------------------------

    def _direct_reproduces(self) -> bool:
        """Whether recomputing the last layer at the readout from its cached ``z`` gives the base run's logits."""
        if "z" not in self.base_last:
            return False
        try:
            with torch.no_grad():
                got = self._direct_chain(torch.arange(self.n, device=self.readout.device), {}, force=True)
        except Exception:  # an architecture the chain does not know: hooks it is
            return False
        ref = self.base_logits
        tol = 1e-4 * max(1.0, float(ref.abs().max()))
        return bool(torch.allclose(got, ref, atol=tol, rtol=1e-4))

    def _direct_chain(self, rows: Tensor, values: dict[str, Tensor], force: bool = False) -> Tensor:
        """Logits at the readout of ``rows`` with the last layer's activations there replaced by ``values``
        (``{"z": [n, head, d_head], "attn_out": ..., ...}``), the rest recomputed from them as TransformerLens' block
        does; unreplaced activations are the base run's (``force``: recompute every step)."""
        from transformer_lens.components.transformer_block import POST_NORM_ARCHITECTURES
        from transformer_lens.utilities.activation_functions import apply_softcap

        model, cfg = self.model, self.model.cfg
        blk = model.blocks[-1]
        base = {k: v[rows] for k, v in self.base_last.items()}
        post_norm = cfg.original_architecture in POST_NORM_ARCHITECTURES
        changed = force
        if "z" in values or force:
            z = values.get("z", base["z"])
            attn = blk.attn
            w_o = attn.W_O
            attn_out = torch.einsum("nhe,hed->nd", z, w_o) + attn.b_O
            if cfg.use_normalization_before_and_after:
                attn_out = blk.ln1_post(attn_out[:, None])[:, 0]
            if post_norm:
                attn_out = blk.ln1(attn_out[:, None])[:, 0]
            changed = True
        else:
            attn_out = base["attn_out"]
        if "attn_out" in values:
            attn_out, changed = values["attn_out"], True
        resid_pre = base["resid_pre"]
        if cfg.attn_only:
            resid_post = resid_pre + attn_out if changed else base["resid_post"]
        elif cfg.parallel_attn_mlp:
            mlp_out = values.get("mlp_out", base["mlp_out"])
            changed = changed or "mlp_out" in values
            resid_post = resid_pre + attn_out + mlp_out if changed else base["resid_post"]
        else:
            resid_mid = resid_pre + attn_out if changed else base["resid_mid"]
            if "resid_mid" in values:
                resid_mid, changed = values["resid_mid"], True
            if changed:
                mlp_in = resid_mid[:, None]
                mlp_out = blk.apply_mlp(mlp_in if post_norm else blk.ln2(mlp_in))[:, 0]
            else:
                mlp_out = base["mlp_out"]
            if "mlp_out" in values:
                mlp_out, changed = values["mlp_out"], True
            resid_post = resid_mid + mlp_out if changed else base["resid_post"]
        if "resid_post" in values:
            resid_post = values["resid_post"]
        x = resid_post[:, None]
        if cfg.normalization_type is not None:
            x = model.ln_final(x)
        return apply_softcap(model.unembed(x), cfg.output_logits_soft_cap)[:, 0]

    def _direct_logits(self, j: int, rows: Tensor, bases: Sequence[Tensor | None]) -> Tensor:
        """Plan ``j``'s logits on ``rows`` by the last-layer shortcut: a patch changes the readout only where its
        base position is the readout."""
        plan = self.plans[j]
        base = {k: v[rows] for k, v in self.base_last.items()}
        values: dict[str, Tensor] = {}
        hit_any = torch.zeros(len(rows), dtype=torch.bool, device=rows.device)
        for p, basis in sorted(zip(plan, bases), key=lambda pb: HOOK_ORDER[pb[0].site.hook]):
            key = p.site.hook
            cur_full = values.get(key, base[key])
            act = cur_full[:, None]  # [n, 1, ...]: the readout as the only position
            hit = p.base_pos[rows] == self.readout[rows, None]  # [n, m]
            zero = torch.zeros(len(rows), 1, dtype=torch.long, device=rows.device)
            n_rows = torch.arange(len(rows), device=rows.device)
            for jj in range(hit.shape[1]):
                new = write_site(act, p.site, n_rows, zero, p.source[rows][:, jj : jj + 1], basis)
                sel = hit[:, jj].view(-1, *([1] * (act.dim() - 1)))
                act = torch.where(sel, new, act)
            values[key] = act[:, 0]
            hit_any |= hit.any(1)
        logits = self._direct_chain(rows, values)
        return torch.where(hit_any[:, None], logits, self.base_logits[rows].to(logits.dtype))

    # -- hooked forwards --------------------------------------------------------------------------------------------

    def _prefix(self, idx: Tensor, start: int) -> Tensor | None:
        """The base run's residual stream entering layer ``start`` for the pairs ``idx`` (None at layer 0)."""
        if start == 0:
            return None
        t = int(self.base.lengths[idx].max())
        with torch.no_grad():
            return self.model(self.base.tokens[idx, :t], stop_at_layer=start)

    def _hooked_logits(
        self,
        plan_ids: Sequence[int],
        idx: Tensor,
        bases: dict[int, Sequence[Tensor | None]],
        prefix: Tensor | None = None,
    ) -> Tensor:
        """``[len(plan_ids) * len(idx), vocab]``: the plans' copies of the base pairs ``idx`` stacked (plan-major),
        one forward from the earliest patched layer (``prefix``: the base run's residual entering it)."""
        model, cfg = self.model, self.model.cfg
        a, p = len(plan_ids), len(idx)
        t = int(self.base.lengths[idx].max())
        tokens = self.base.tokens[idx, :t]
        start = min(pp.site.layer for j in plan_ids for pp in self.plans[j])
        if prefix is None:
            prefix = self._prefix(idx, start)
        writes: dict[str, list] = {}
        for slot, j in enumerate(plan_ids):
            rows = slot * p + torch.arange(p, device=idx.device)
            for pp, basis in zip(self.plans[j], bases[j]):
                writes.setdefault(pp.site.hook_name, []).append((pp, rows, basis))

        def make_hook(ws):
            def hook(act, hook):
                for pp, rows, basis in ws:
                    act = write_site(act, pp.site, rows, pp.base_pos[idx], pp.source[idx], basis)
                return act

            return hook

        hooks = [(name, make_hook(ws)) for name, ws in writes.items()]
        if start > 0:
            kw = {}
            if cfg.positional_embedding_type == "shortformer":
                kw["shortformer_pos_embed"] = model.pos_embed(tokens).repeat(a, 1, 1)
            out = model.run_with_hooks(prefix.repeat(a, 1, 1), start_at_layer=start, fwd_hooks=hooks, **kw)
        else:
            out = model.run_with_hooks(tokens.repeat(a, 1), fwd_hooks=hooks)
        at = self.readout[idx].repeat(a)
        return out[torch.arange(a * p, device=out.device), at]

    # -- entry points -------------------------------------------------------------------------------------------------

    def logits(self, j: int, rows: Tensor, bases: Sequence[Tensor | None]) -> Float[Tensor, "row vocab"]:
        """Plan ``j``'s readout logits on the pairs ``rows`` with these subspace bases (one per patch, None = the
        whole site); differentiable in the bases (outside inference mode)."""
        if self.direct[j]:
            return self._direct_logits(j, rows, bases)
        start = min(p.site.layer for p in self.plans[j])
        prefix = None
        if start > 0:  # the base runs up to the first patched layer do not change between calls: cached once
            if start not in self._prefixes:
                t = int(self.base.lengths.max())
                full = torch.zeros(
                    self.n, t, self.model.cfg.d_model, device=self.readout.device, dtype=self.model.cfg.dtype
                )
                for idx in self._chunks(self.base.lengths):
                    got = self._prefix(idx, start)
                    full[idx, : got.shape[1]] = got.to(full.dtype)
                self._prefixes[start] = full
            prefix = self._prefixes[start][rows, : int(self.base.lengths[rows].max())]
        return self._hooked_logits([j], rows, {j: bases}, prefix)

    def all_logits(self, bases: Sequence[Sequence[Tensor | None]] | None = None) -> Float[Tensor, "plan pair vocab"]:
        """Every plan's readout logits on every pair."""
        bases = bases or [[p.site.basis for p in plan] for plan in self.plans]
        dtype = self.base_logits.dtype
        out = torch.empty(
            len(self.plans), self.n, self.base_logits.shape[-1], device=self.base_logits.device, dtype=dtype
        )
        every = torch.arange(self.n, device=self.readout.device)
        hooked = [j for j in range(len(self.plans)) if not self.direct[j]]
        with torch.no_grad():
            for j in range(len(self.plans)):
                if self.direct[j]:
                    out[j] = self._direct_logits(j, every, bases[j])
            if hooked:
                # plans grouped by their first patched layer: each stacked forward starts there, from the base run's
                # residual stream, computed once per chunk of pairs
                by_start: dict[int, list[int]] = {}
                for j in hooked:
                    by_start.setdefault(min(p.site.layer for p in self.plans[j]), []).append(j)
                bmap = {j: bases[j] for j in hooked}
                budget = self._stacked_rows()
                for idx in self._chunks(self.base.lengths, stacked=True):
                    per = max(1, budget // len(idx))  # plans per forward within the row budget
                    for start, group in by_start.items():
                        prefix = self._prefix(idx, start)
                        for g in range(0, len(group), per):
                            ids = group[g : g + per]
                            got = self._hooked_logits(ids, idx, bmap, prefix).view(len(ids), len(idx), -1)
                            for slot, j in enumerate(ids):
                                out[j, idx] = got[slot].to(dtype)
        check_finite_logits(out, "the patched runs' logits")
        return out
