"""The C replay of torch's CPU dropout draws (interp.generator_replay) against torch's own ``bernoulli_``: the same
numbers, bit for bit, and the generators left in the same states, whatever their phase, the drop probability and
the mask's size."""

import os
import threading

import pytest
import torch

from interp.dropout_masks import REPLAY_MIN, generator_mask
from interp.generator_replay import DropoutGenerators, replay_status

# words of the generator's current 624-word block used before the draws: fresh, mid-block, the block's last word
# and first word (a draw's two words then straddle two blocks), several blocks in
USED_WORDS = (0, 1, 311, 622, 623, 624, 1247, 2000)
PROBABILITIES = (1e-12, 1e-9, 0.1, 1 / 3, 0.5, 0.7, 0.9, 0.999999, 1 - 2**-30)


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
        if os.environ.get("INTERP_REQUIRE_C") == "1":
            pytest.fail(f"the C replay is not used here ({status}), but INTERP_REQUIRE_C=1 requires it")
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


def test_no_draw_where_dropout_draws_none():
    """p = 0 gives ones and p = 1 zeros, and an empty shape nothing, all without a draw, as ``F.dropout`` does on
    the CPU (it draws only for 0 < p < 1 and a non-empty input)."""
    for p, value in ((0, 1.0), (0.0, 1.0), (1, 0.0)):
        g, h = _used(5, 100), _used(5, 100)
        bank = DropoutGenerators([g])
        assert torch.equal(bank.masks((300, 20), p), torch.full((1, 300, 20), value))
        assert torch.equal(generator_mask((300, 20), p, g), torch.nn.functional.dropout(torch.ones(300, 20), p))
        assert torch.equal(bank.states()[0], h.get_state())
    fresh, h = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert DropoutGenerators([fresh]).masks((4, 0), 0.3).shape == (1, 4, 0)
    assert torch.equal(fresh.get_state(), h.get_state())


@pytest.mark.parametrize(
    "shape, p, message",
    [
        ((10,), -0.1, "must be in [0, 1], got -0.1"),
        ((10,), 1.5, "must be in [0, 1], got 1.5"),
        ((10,), float("nan"), "must be in [0, 1], got nan"),
        ((-1, -5000), 0.3, "shape must be sizes >= 0, got (-1, -5000)"),
    ],
)
def test_bad_probabilities_and_shapes_are_refused_before_any_draw(shape, p, message):
    g, h = _used(1, 9), _used(1, 9)
    for call in (lambda: DropoutGenerators([g]).masks(shape, p), lambda: generator_mask(shape, p, g)):
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value)
    assert torch.equal(g.get_state(), h.get_state())


def test_a_tensor_probability_is_the_double_dropout_takes():
    """``p`` as a float32 one-number tensor is ``float(p)``, as ``F.dropout`` converts it, on both paths."""
    p = torch.tensor(0.3)
    for n in (100, 5000):
        g, h = _used(2, 3), _used(2, 3)
        want = torch.empty(n).bernoulli_(1 - float(p), generator=h).div_(1 - float(p))
        assert torch.equal(generator_mask((n,), p, g), want)


def test_float64_default_dtype_falls_back_to_torchs_own_draws():
    """The replay writes float32: under a float64 default the masks are ``bernoulli_``'s own, in float64."""
    replay_status()  # computed under float32 first, as a process would
    g, h = _used(4, 7), _used(4, 7)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = generator_mask((5000,), 0.1, g)
        want = torch.empty(5000).bernoulli_(0.9, generator=h).div_(0.9)
    finally:
        torch.set_default_dtype(old)
    assert got.dtype == torch.float64 and torch.equal(got, want)


def test_one_generator_twice_and_bad_states_are_refused():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="the same generator twice"):
        DropoutGenerators([g, g])
    bank = DropoutGenerators([_used(s, s) for s in range(3)])
    saved = bank.states()
    with pytest.raises(ValueError, match="got 2 generator states for 3 generators"):
        bank.load(saved[:2])
    with pytest.raises(ValueError, match=r"must be a \[K, bytes\] uint8 tensor, got a torch.int64 tensor"):
        bank.load(saved.long())
    broken = saved.clone()
    broken[2] = 0  # torch refuses an all-zero engine state
    with pytest.raises(ValueError, match="none loaded"):
        bank.load(broken)
    assert torch.equal(bank.states(), saved)
    empty = DropoutGenerators([])
    assert empty.masks((3, 4), 0.5).shape == (0, 3, 4) and empty.states().shape[0] == 0


def test_threads_sharing_a_generator_draw_each_number_once():
    """Twelve masks from one generator on two threads: twelve different masks, the generator advanced by all of
    them (bernoulli_ takes the generator's lock; the replay takes its own around read, draw and write-back)."""
    g = torch.Generator().manual_seed(8)
    out = []

    def work():
        for _ in range(6):
            out.append(generator_mask((20000,), 0.5, g))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    h = torch.Generator().manual_seed(8)
    want = [torch.empty(20000).bernoulli_(0.5, generator=h).div_(0.5) for _ in range(12)]
    assert torch.equal(g.get_state(), h.get_state())
    assert sorted(m.sum().item() for m in out) == sorted(m.sum().item() for m in want)


@pytest.mark.parametrize("dropout_at", ["attention", "embedding+attention"])
def test_a_population_trains_the_same_weights_with_the_replay_as_with_bernoulli(
    tmp_path, monkeypatch, tiny_task, tiny_spec, tiny_cfg, dropout_at
):
    """A population with dropout (the token-count path, and the per-position one with the embedding's masks),
    trained with the replay and again with the replay switched off: the same weights, bit for bit."""
    import interp.generator_replay as replay
    from interp.loading import load_checkpoint
    from interp.population import seed_population, train_population

    if replay.replay_status() != "replay":
        pytest.skip(f"the C replay is not used here: {replay.replay_status()}")
    specs, cfgs = seed_population(tiny_task, tiny_spec, tiny_cfg(epochs=2, dropout=0.3, dropout_at=dropout_at), [0, 4])
    weights = []
    for way in ("replay", "bernoulli_"):
        if way == "bernoulli_":
            monkeypatch.setattr(replay, "replay_status", lambda: "bernoulli_: switched off by the test")
        outs = [tmp_path / f"{way}{k}.safetensors" for k in range(2)]
        train_population(tiny_task, specs, cfgs, outs, device="cpu", progress=False)
        weights.append([load_checkpoint(o, device="cpu").model.state_dict() for o in outs])
    for a, b in zip(*weights):
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "bernoulli_"])
def test_masks_written_into_a_kept_buffer_equal_new_ones(replay):
    """``out``: the same masks as a new tensor, written into the buffer given (and returned), from every path: the
    replay, ``bernoulli_`` and the no-draw values of p = 0 and p = 1."""
    for p in (0.1, 0.5, 0, 1):
        ours, theirs = [_used(s, 7 * s) for s in range(3)], [_used(s, 7 * s) for s in range(3)]
        bank, want_bank = DropoutGenerators(ours), DropoutGenerators(theirs)
        buf = torch.full((3, 128, 2, 32), float("nan"))
        for _ in range(2):  # the buffer written again: a second step's masks, not the first's
            got = bank.masks((128, 2, 32), p, replay=replay, out=buf)
            assert got.data_ptr() == buf.data_ptr()
            assert torch.equal(got, want_bank.masks((128, 2, 32), p, replay=replay)), p
        assert torch.equal(bank.states(), want_bank.states())


def test_a_buffer_masks_cannot_fill_is_refused_before_any_draw():
    g, h = _used(2, 11), _used(2, 11)
    bank = DropoutGenerators([g])
    bad = {
        "shape [1, 10, 4]": torch.empty(1, 10, 4),
        "float64": torch.empty(1, 10, 3, dtype=torch.float64),
        "(not contiguous)": torch.empty(1, 3, 10).transpose(1, 2),
    }
    for what, out in bad.items():
        with pytest.raises(ValueError, match="out must be a contiguous CPU") as e:
            bank.masks((10, 3), 0.3, out=out)
        assert what in str(e.value)
    assert torch.equal(bank.states()[0], h.get_state())
