"""A pytest plugin for tests/test_tiers.py (``-p tier_collect``, with tests/ on PYTHONPATH): during a
``--collect-only`` run it records which tests the marker expression selected and which it deselected, each with its
markers, and every file skipped while it was collected (an ``importorskip`` at module level), then writes them as
JSON to the file named by ``FLYSHIP_TIER_DUMP``."""

from __future__ import annotations

import json
import os

_deselected: dict[str, list[str]] = {}
_skipped: dict[str, str] = {}


def _markers(item) -> list[str]:
    return sorted({m.name for m in item.iter_markers()})


def pytest_deselected(items) -> None:
    for item in items:
        _deselected[item.nodeid] = _markers(item)


def pytest_collectreport(report) -> None:
    if report.skipped:
        why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        _skipped[report.nodeid] = str(why)


def pytest_collection_finish(session) -> None:
    with open(os.environ["FLYSHIP_TIER_DUMP"], "w") as f:
        json.dump({"selected": {i.nodeid: _markers(i) for i in session.items}, "deselected": _deselected,
                   "skipped": _skipped}, f)
