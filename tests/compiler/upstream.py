"""Where upstream FlyDSL's kernels are, for the tests that build them as upstream calls them (they skip without)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def upstream_kernels(would_prove: str, marker: str) -> Path:
    """The folder ``FLYSHIP_UPSTREAM_FLYDSL`` names, checked to hold upstream's ``kernels/`` (``marker`` is a file
    under it); a skip saying what the test ``would_prove`` when unset, a failure when it names the wrong folder."""
    root = os.environ.get("FLYSHIP_UPSTREAM_FLYDSL")
    if not root:
        pytest.skip(f"set FLYSHIP_UPSTREAM_FLYDSL to a folder holding upstream FlyDSL's kernels/: it would prove "
                    f"{would_prove}, as upstream calls them, equal to FlyDSL's own code objects")
    path = Path(root)
    if not (path / marker).is_file():
        pytest.fail(f"FLYSHIP_UPSTREAM_FLYDSL={root}: expected {marker} under it, got none; extract upstream's "
                    "kernels/ there (git archive HEAD kernels | tar -x -C <folder>)")
    return path
