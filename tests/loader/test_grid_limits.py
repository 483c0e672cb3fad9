"""Grid limits per vendor, checked against the device before a launch (recording driver, no GPU): CUDA counts
blocks (grid.x <= 2^31-1, grid.y and grid.z <= 65535), HIP counts work-items (workgroups x block <= 2^32-1 per
dimension, the AQL packet's 32-bit grid size). A grid over them raises naming the grid, the block and the limit
instead of reaching the runtime (whose own error names neither)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cpu



def test_a_grid_over_cudas_65535_blocks_in_y_is_refused_naming_the_limit(bundle_copy, recorded, launches):
    def edit(d: dict) -> None:  # scale_rows launches one block row per row (grid.y = rows); drop its guard
        for s in next(o for o in d["ops"] if o["name"] == "scale_rows")["specializations"]:
            s["guard"]["constraints"] = []

    root = bundle_copy(edit)
    ops = recorded(root, target="sm_90")
    x = torch.zeros(65536, 1)
    with pytest.raises(Exception, match=r"needs a grid of 1x65536x1 workgroups .* allows at most "
                                        r"2147483647x65535x65535 workgroups; expected inputs within it"):
        ops.scale_rows(x, 2.0, 1)
    assert launches() == []
    ops.scale_rows(torch.zeros(65535, 1), 2.0, 1)  # at the limit it launches
    assert launches()[0]["grid"][1] == 65535
    hip = recorded(root, target="gfx942")  # HIP counts work-items per dimension instead: 65536 rows fit
    hip.scale_rows(x, 2.0, 1)
    assert launches()[0]["grid"][1] == 65536


def test_a_grid_over_hips_2_32_work_items_per_dimension_is_refused(bundle_copy, recorded, launches):
    def edit(d: dict) -> None:  # 2^31 workgroups of 256 work-items: 2^39 work-items in x
        for s in next(o for o in d["ops"] if o["name"] == "add")["specializations"]:
            for v in s["variants"]:
                v["launch"]["grid"][0] = "x.shape[0] * 1024"

    ops = recorded(bundle_copy(edit), target="gfx942")
    x = torch.zeros(1 << 21)
    with pytest.raises(Exception, match=r"needs a grid of 2147483648x1x1 workgroups of 256x1x1 .* and 4294967295 "
                                        r"work-items \(workgroups x block\) per dimension"):
        ops.add(x, x)
    assert launches() == []
