"""(base, source) pairs for interchange interventions, drawn so that the intervention is informative.

An interchange that leaves the causal model's output unchanged cannot tell a site that carries the variable from one
that carries nothing: the network keeps its base answer either way. Uniformly drawn pairs can be mostly of that kind
(two random noisy-majority sentences agree on the answer half the time; a carry into one digit is the same for most
random pairs of sums). :func:`sample_pairs` therefore stratifies: it draws candidate pairs uniformly (base and
source distinct, and equal in the fields named by ``same``), computes each candidate's counterfactual output with the
causal model, and keeps ``round(n * changed)`` pairs whose counterfactual differs from the base output and the rest
from those where it does not, in the order drawn. Where too few changing pairs exist it keeps all it found and says
so (:attr:`Pairs.changed_share` is the share actually reached). The same seed gives the same pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp.errors import ConfigError, TaskError
from interp.task import TaskData

from .causal_model import CausalModel
from .sites import resolve_positions

MAX_ROUNDS = 16


@dataclass
class Pairs:
    """Indices into one :class:`TaskData`: pair ``i`` runs example ``base[i]`` with sites from example
    ``source[i]``. ``changed[i]``: the causal model's output changes under the interchange of ``variable``."""

    base: Int[Tensor, " pair"]
    source: Int[Tensor, " pair"]
    changed: Bool[Tensor, " pair"]
    variable: str
    target: float  # the share of changing pairs asked for
    seed: int

    def __len__(self) -> int:
        return len(self.base)

    @property
    def changed_share(self) -> float:
        return float(self.changed.float().mean()) if len(self) else float("nan")

    def select(self, data: TaskData) -> tuple[TaskData, TaskData]:
        """The base and source examples, row by row."""
        return data.select(self.base.to(data.device)), data.select(self.source.to(data.device))


def sample_pairs(
    data: TaskData,
    *,
    causal_model: CausalModel,
    variable: str,
    n: int = 1000,
    changed: float = 0.5,
    seed: int = 0,
    same: Sequence[str] = (),
    positions=None,
) -> Pairs:
    """``n`` pairs of distinct examples of ``data`` (see the module docstring): a share ``changed`` of them change
    the output when ``variable`` is interchanged. ``same``: fields the two examples of a pair must share (operand
    lengths, ...). ``positions``: where a positional variable is interchanged (a site position)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"the number of pairs must be a positive integer, got {n!r}")
    if not 0 <= changed <= 1:
        raise ConfigError(f"changed must be a share in [0, 1], got {changed!r}")
    if len(data) < 2:
        raise TaskError(f"pairs need at least two examples; the data has {len(data)}")
    var = causal_model.check_variable(variable)
    if var.positional and positions is None:
        raise ConfigError(f"variable {variable!r} is positional: give the positions it is interchanged at")
    for f in same:
        if f not in data.fields:
            raise TaskError(f"same={f!r} is not a field of the data; it has {sorted(data.fields)}")
    gen = torch.Generator().manual_seed(int(seed))
    want_changed = round(n * changed)
    want_same = n - want_changed
    got_changed: list[Tensor] = []
    got_same: list[Tensor] = []
    n_changed = n_same = 0
    size = len(data)
    keys = [data.fields[f].cpu() for f in same]
    for _ in range(MAX_ROUNDS):
        if n_changed >= want_changed and n_same >= want_same:
            break
        m = 4 * n
        b = torch.randint(0, size, (m,), generator=gen)
        s = torch.randint(0, size, (m,), generator=gen)
        ok = b != s
        for k in keys:
            ok &= k[b] == k[s]
        b, s = b[ok], s[ok]
        if not len(b):
            continue
        base, source = data.select(b.to(data.device)), data.select(s.to(data.device))
        bp = sp = None
        if var.positional:
            bp = resolve_positions(positions, base, causal_model.positions)
            sp = resolve_positions(positions, source, causal_model.positions)
        cf = causal_model.interchange(base, source, variable, bp, sp)
        ch = (cf != causal_model.output_of(base)).cpu()
        pb, ps = torch.stack([b, s], 1), ch
        if n_changed < want_changed:
            take = pb[ps][: want_changed - n_changed]
            got_changed.append(take)
            n_changed += len(take)
        if n_same < want_same:
            take = pb[~ps][: want_same - n_same]
            got_same.append(take)
            n_same += len(take)
    pairs_c = torch.cat(got_changed) if got_changed else torch.zeros(0, 2, dtype=torch.long)
    pairs_s = torch.cat(got_same) if got_same else torch.zeros(0, 2, dtype=torch.long)
    if len(pairs_c) + len(pairs_s) == 0:
        raise TaskError(
            "no pair of examples could be drawn"
            + (f" with equal {list(same)}" if same else "")
            + f" in {size} examples"
        )
    flags = torch.cat([torch.ones(len(pairs_c), dtype=torch.bool), torch.zeros(len(pairs_s), dtype=torch.bool)])
    both = torch.cat([pairs_c, pairs_s])
    order = torch.randperm(len(both), generator=gen)  # interleave the strata, reproducibly
    both, flags = both[order], flags[order]
    return Pairs(both[:, 0], both[:, 1], flags, variable, float(changed), int(seed))
