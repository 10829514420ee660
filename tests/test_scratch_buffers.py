"""Buffers kept from step to step (interp.position_forward.scratch): contiguous views of one flat buffer per name,
of the dtype asked, reused while they fit and grown when not."""

import torch

from interp.position_forward import scratch


def test_a_scratch_view_is_contiguous_of_its_dtype_and_reused_while_it_fits():
    buffers = {}
    a = scratch(buffers, "x", (4, 3, 2), "cpu")
    assert a.shape == (4, 3, 2) and a.is_contiguous() and a.dtype == torch.get_default_dtype()
    smaller = scratch(buffers, "x", (2, 5), "cpu")  # another shape that fits: the same memory, still contiguous
    assert smaller.is_contiguous() and smaller.data_ptr() == a.data_ptr()
    grown = scratch(buffers, "x", (5, 7), "cpu")
    assert grown.shape == (5, 7) and buffers["x"].numel() == 35
    again = scratch(buffers, "x", (4, 3, 2), "cpu")
    assert again.data_ptr() == grown.data_ptr()
    longs = scratch(buffers, "x", (6,), "cpu", torch.long)  # another dtype: a buffer of its own
    assert longs.dtype == torch.long and buffers["x"].dtype == torch.long
    ints = scratch(buffers, "y", (3,), "cpu", torch.int32)
    assert ints.dtype == torch.int32 and set(buffers) == {"x", "y"}


def test_without_buffers_each_call_is_a_new_tensor():
    a, b = scratch(None, "x", (3,), "cpu", torch.long), scratch(None, "x", (3,), "cpu", torch.long)
    assert a.dtype == torch.long and a.data_ptr() != b.data_ptr()
