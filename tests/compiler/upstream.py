"""Where upstream FlyDSL's kernels are, for the tests that build them as upstream calls them (they skip without)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flyship.bundle import rules
from flyship.bundle.codeobject import CodeObjectFile


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


def assert_proven(bundle: Path, where: str, variant) -> CodeObjectFile:
    """A one-launch variant as the upstream tests demand it: proven equal to FlyDSL's own code object (binary method,
    metadata equal, no differences, ``.text`` identical), its kernarg layout valid against its metadata, and the
    shipped file's metadata the manifest's. Returns the shipped code object."""
    (t,) = variant.launches
    co = CodeObjectFile((bundle / t.code_object.file).read_bytes())
    assert t.proof.method == "flydsl-binary" and t.proof.metadata == "equal", where
    assert t.proof.differences == () and ".text" in t.proof.identical_sections, where
    rules.check_layout(t.kernargs, t.metadata, where)
    assert co.kernel_metadata(t.code_object.symbol) == t.metadata, where
    return co
