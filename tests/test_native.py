"""interp.native's helpers for the C kernels: the address a kernel reads (refusing what it cannot read as one dense
block) and the window in which deterministic mode does not fill new tensors."""

from __future__ import annotations

import pytest
import torch

from interp.native import pointer, unfilled


def test_pointer_is_the_first_elements_address_and_refuses_what_c_cannot_read():
    t = torch.arange(12.0).view(3, 4)
    assert pointer(t).value == t.data_ptr()
    assert pointer(t[1:]).value == t.data_ptr() + 4 * 4  # a contiguous slice: its own first element
    assert pointer(None).value is None and pointer(t[:0]).value is None  # NULL: nothing to read
    with pytest.raises(ValueError, match="contiguous CPU tensor"):
        pointer(t.T)  # a copy made for it would be freed before the call
    with pytest.raises(ValueError, match="contiguous CPU tensor"):
        pointer(t[:, ::2])
    with pytest.raises(ValueError, match="on meta"):
        pointer(torch.empty(3, device="meta"))
    with pytest.raises(ValueError, match="negated or conjugated view"):
        pointer(torch._neg_view(t))  # torch applies the sign lazily: C would read the un-negated memory
    with pytest.raises(ValueError, match="negated or conjugated view"):
        pointer(torch.ones(3, dtype=torch.complex64).conj())
    with pytest.raises(ValueError, match=r"layout torch\.sparse_coo"):
        pointer(t.to_sparse())
    assert pointer(t, torch.float32).value == t.data_ptr()
    with pytest.raises(ValueError, match=r"reads torch\.int64 here; got torch\.int32"):
        pointer(t.int(), torch.int64)  # C would read the int32 buffer as int64
    # strided=True: the C function reads the view at the strides its caller passes, so a view of a wider buffer is
    # taken (its first element's address), and the rest is still refused
    assert pointer(t[:, 1:], torch.float32, strided=True).value == t.data_ptr() + 4
    assert pointer(t.T, strided=True).value == t.data_ptr()
    with pytest.raises(ValueError, match="negated or conjugated view"):
        pointer(torch._neg_view(t), strided=True)
    with pytest.raises(ValueError, match="on meta"):
        pointer(torch.empty(3, device="meta"), strided=True)
    with pytest.raises(ValueError, match=r"reads torch\.float32 here; got torch\.float64"):
        pointer(t.double()[:, 1:], torch.float32, strided=True)


def test_unfilled_skips_deterministic_modes_fill_only_within_and_restores_it():
    """Within the block the fill is off; after it, on, also after an exception and after blocks that overlap."""
    flag = torch.utils.deterministic
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert flag.fill_uninitialized_memory
        with unfilled():
            assert not flag.fill_uninitialized_memory
        assert flag.fill_uninitialized_memory and torch.empty(64).isnan().all()  # filled again outside
        with pytest.raises(RuntimeError, match="inside"), unfilled():
            raise RuntimeError("inside")
        assert flag.fill_uninitialized_memory  # restored on an exception too
        # blocks that overlap (two threads: A enters, B enters, A leaves, B leaves): cleared until the last leaves
        a, b = unfilled(), unfilled()
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert not flag.fill_uninitialized_memory  # B is still inside
        b.__exit__(None, None, None)
        assert flag.fill_uninitialized_memory
    finally:
        torch.use_deterministic_algorithms(before)
