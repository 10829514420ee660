"""The C replay of torch's CPU dropout draws (interp.generator_replay) against torch's own ``bernoulli_``: the same
numbers, bit for bit, and the generators left in the same states, whatever their phase, the drop probability and
the mask's size."""

import pytest
import torch

from interp.dropout_masks import REPLAY_MIN, generator_mask
from interp.generator_replay import DropoutGenerators, replay_status

# words of the generator's current 624-word block used before the draws: fresh, mid-block, the block's last word
# and first word (a draw's two words then straddle two blocks), several blocks in
USED_WORDS = (0, 1, 311, 622, 623, 624, 1247, 2000)
PROBABILITIES = (0.0, 1e-9, 0.1, 1 / 3, 0.5, 0.7, 0.9, 0.999999)


def _used(seed: int, words: int) -> torch.Generator:
    """A generator that has given ``words`` 32-bit outputs (a float32 ``uniform_`` takes one each)."""
    g = torch.Generator().manual_seed(seed)
    torch.empty(words).uniform_(generator=g)
    return g


def _reference(gens, shape, p):
    return torch.stack([torch.empty(shape).bernoulli_(1 - p, generator=g).div_(1 - p) for g in gens])


def test_the_replay_is_what_runs_here():
    """On this project's machines the replay is built and passes its self-check; where it is not, the masks come
    from bernoulli_ and the status says why (the other tests hold either way)."""
    status = replay_status()
    if status != "replay":
        pytest.skip(f"the C replay is not used here: {status}")
    assert status == "replay"


@pytest.mark.parametrize("p", PROBABILITIES)
def test_masks_equal_bernoulli_for_generators_in_every_phase(p):
    """K generators, each at another point of its stream, draw masks of several sizes in turn (sizes around the
    block's 624 words and the pair's 2): every mask equal to bernoulli_'s and every state equal after each."""
    ours = [_used(s, w) for s, w in enumerate(USED_WORDS)]
    theirs = [_used(s, w) for s, w in enumerate(USED_WORDS)]
    bank = DropoutGenerators(ours)
    for shape in ((1,), (311,), (312,), (313,), (3, 104, 2), (625,), (128, 2, 32), (1,)):
        assert torch.equal(bank.masks(shape, p), _reference(theirs, shape, p)), shape
    states = bank.states()
    for g, st in zip(theirs, states):
        assert torch.equal(g.get_state(), st)
    # the torch generators themselves are where bernoulli_ left theirs: their next draws agree
    assert torch.equal(_reference(bank.generators(), (700,), p), _reference(theirs, (700,), p))


def test_states_round_trip_and_interleave_with_torch_draws():
    """A resume file's states (``states``/``load``) restore the draws; a draw through the torch generators between
    two replayed draws sees the replay's state."""
    bank = DropoutGenerators([_used(s, 5 * s) for s in range(4)])
    ref = [_used(s, 5 * s) for s in range(4)]
    first = bank.masks((50, 40), 0.2)
    saved = bank.states()
    second = bank.masks((50, 40), 0.2)
    assert torch.equal(first, _reference(ref, (50, 40), 0.2))
    assert torch.equal(second, _reference(ref, (50, 40), 0.2))
    bank.load(saved)
    assert torch.equal(bank.masks((50, 40), 0.2), second)
    between = torch.stack([torch.rand(9, generator=g) for g in bank.generators()])
    assert torch.equal(between, torch.stack([torch.rand(9, generator=g) for g in ref]))
    assert torch.equal(bank.masks((7000,), 0.5), _reference(ref, (7000,), 0.5))


@pytest.mark.parametrize("numbers", [REPLAY_MIN - 1, REPLAY_MIN, 3 * REPLAY_MIN + 17])
def test_generator_mask_equals_dropouts_own_draws(numbers):
    """``generator_mask`` (below the replay's size by bernoulli_, from it by the replay) is what ``F.dropout``
    multiplies by on the CPU, from a given generator and from torch's default one."""
    g, h = _used(3, 101), _used(3, 101)
    assert torch.equal(generator_mask((numbers,), 0.25, g), torch.empty(numbers).bernoulli_(0.75, generator=h) / 0.75)
    assert torch.equal(g.get_state(), h.get_state())
    x = torch.ones(numbers)
    with torch.random.fork_rng():
        torch.manual_seed(11)
        mask = generator_mask((numbers,), 0.25)
        after = torch.rand(3)
        torch.manual_seed(11)
        want = torch.nn.functional.dropout(x, 0.25)
        assert torch.equal(mask, want)
        assert torch.equal(after, torch.rand(3))
