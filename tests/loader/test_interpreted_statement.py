"""What ``flyship verify --emulate`` says of sm_* cubins in the workload Python (no Triton, no NVIDIA GPU): not
executed, and why the Triton interpreter did not run them either."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.cpu


def test_the_report_says_sm_cubins_were_not_executed_and_why() -> None:
    from flyship.loader.tools.verify_emulated import Report, Run

    if importlib.util.find_spec("triton") is not None:
        pytest.skip("this Python has Triton; the workload tier (no Triton) checks the statement for its absence")
    report = Report((Run("add", "f32", "gfx942", "8 rows", "ok"), Run("add", "f32", "sm_90a", "-", "not executed")))
    lines = report.summary().splitlines()
    assert lines[-1] == "sm_* cubins: not executed (no NVIDIA GPU; Triton not installed here for its interpreter)"
    assert "1 sm_* code objects NOT executed" in lines[0]
    assert "sm_* cubins" not in Report((Run("add", "f32", "gfx942", "8 rows", "ok"),)).summary()
