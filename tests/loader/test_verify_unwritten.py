"""verify's check that a kernel writes every element of a fresh output (issue 23, 7a): an early return before the
stores leaves garbage in a fresh output on the GPU. The check itself is device-independent (it runs the kernel
twice into outputs filled with two byte patterns), so it is proven here with torch functions standing in for
the kernel; verify runs it through the op's out= path on a GPU."""

import pytest
import torch

from flyship.loader.tools.verify import unwritten_counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.int8])
def test_rows_a_kernel_skips_are_counted_and_a_full_write_is_not(dtype):
    x = torch.arange(12).reshape(4, 3)
    out = torch.empty((4, 3), dtype=dtype)

    def early_return(outs):  # cross-entropy on ignored rows: rows 1 and 3 return before the store
        for r in (0, 2):
            outs[0][r] = (x[r] % 2).to(dtype)

    def full(outs):
        outs[0].copy_((x % 2).to(dtype))  # writes zeros and ones: the fill values themselves

    assert unwritten_counts(early_return, [out]) == [6]
    assert unwritten_counts(full, [out]) == [0]


def test_a_transposed_output_is_filled_and_checked_in_its_own_layout():
    out = torch.empty((3, 4)).t()  # a column-major (4, 3) output

    def first_column_only(outs):
        assert outs[0].stride() == out.stride()
        outs[0][:, 0] = 0.0

    assert unwritten_counts(first_column_only, [out, torch.empty(5)]) == [8, 5]
