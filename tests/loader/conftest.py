"""Fixtures of the loader tests.

``tiny_bundle`` is the committed, real bundle under ``data/tiny`` (Triton code objects for gfx942,
gfx950 and sm_90a; ``data/make_tiny_bundle.py`` regenerates it). ``example_bundle`` (tests/conftest.py)
is the FlyDSL example bundle built by ``flyc-build`` once per session; the generic tests run on it.

``tiny`` and ``fresh_ops`` use the extension of this machine's torch build (the hip flavor on a CPU-only
torch; CPU calls run the reference through loader/cpu.py). ``recorded`` and ``recorded_tiny`` load on the
recording driver (``FLYSHIP_FLAVOR=record``):
calls on CPU tensors take the real C++ path up to the runtime, and ``launches()`` returns what reached it.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny"


@pytest.fixture(scope="session", autouse=True)
def session_plan_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Loads in these tests (and the CLI subprocesses they start) cache plans in a folder of the session's, not in
    the user's cache (``FLYSHIP_PLAN_CACHE``; loader/plancache.py)."""
    import os

    old = os.environ.get("FLYSHIP_PLAN_CACHE")
    os.environ["FLYSHIP_PLAN_CACHE"] = str(tmp_path_factory.mktemp("plans"))
    yield
    if old is None:
        os.environ.pop("FLYSHIP_PLAN_CACHE", None)
    else:
        os.environ["FLYSHIP_PLAN_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_bundle() -> Path:
    if not (TINY / "manifest.json").is_file():
        pytest.fail(f"{TINY} is missing; regenerate it: .venv-flydsl/bin/python tests/loader/data/make_tiny_bundle.py")
    return TINY


@pytest.fixture(scope="session")
def ext() -> Any:
    """The loader's C++ extension (built once into the user's cache; later runs import it)."""
    from flyship.loader import extension

    try:
        return extension.extension()
    except extension.ExtensionBuildError as e:
        pytest.skip(f"the loader extension cannot be built here, so C++ paths are untested: {e}")


@pytest.fixture(scope="session")
def tiny(tiny_bundle: Path, ext: Any) -> Any:
    """The tiny bundle, loaded once under its own namespace."""
    import flyship

    return flyship.load(tiny_bundle)


@pytest.fixture(scope="session")
def record_ext() -> Any:
    """The extension with the recording driver (builds without any GPU SDK)."""
    from flyship.loader import extension

    try:
        return extension.extension("record")
    except extension.ExtensionBuildError as e:
        pytest.skip(f"the recording extension cannot be built here, so the C++ call path is untested: {e}")


@pytest.fixture
def recorded(record_ext: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """``recorded(bundle, target=..., **load_kwargs)``: load a bundle on the recording driver under a new
    namespace (own counters and fallback setting), as a device of ``target`` would run it (the recording
    device reads its target once, at the bundle's first call). The launch log starts empty."""
    import flyship

    def make(bundle: Path, target: str = "gfx942:sramecc+:xnack-", **kwargs: Any) -> Any:
        ops = flyship.dry_run(bundle, target=target, **kwargs).ops  # the public API (loader/record.py)
        assert ops.flavor == "record"
        record_ext.recorded_launches(clear=True)
        return ops

    return make


@pytest.fixture
def launches(record_ext: Any) -> Callable[[], list[dict]]:
    """The launches recorded since the last look (each a dict: device, symbol, grid, block, dynamic_lds,
    stream, kernargs)."""
    return lambda: record_ext.recorded_launches(clear=True)


@pytest.fixture(params=["cpu", "record"])
def call_path(request: pytest.FixtureRequest, triton_examples_bundle: Path, ext: Any, recorded: Callable[..., Any],
              launches: Callable[[], list[dict]]) -> tuple[Any, Callable[[], bool]]:
    """The Triton example ops on one call path (``cpu``: loader/cpu.py runs the reference; ``record``: the C++ path
    on the recording driver), and a function that says whether anything ran on it (a launch on the recording
    driver; a reference call on the CPU path)."""
    import flyship

    if request.param == "record":
        ops = recorded(triton_examples_bundle)
        return ops, lambda: bool(launches())
    ops = flyship.load(triton_examples_bundle, namespace=f"flyship_a{uuid.uuid4().hex[:8]}")
    return ops, lambda: any(h.stats()["fallbacks"].get("cpu", 0) for h in ops)


@pytest.fixture
def fresh_ops(tiny_bundle: Path, ext: Any) -> Callable[..., Any]:
    """Load the tiny bundle under a new namespace (ops stay registered for the process; a fresh namespace
    gives a test its own counters and fallback setting)."""
    import flyship

    def make(**kwargs: Any) -> Any:
        return flyship.load(tiny_bundle, namespace=f"flyship_t{uuid.uuid4().hex[:10]}", **kwargs)

    return make


@pytest.fixture
def recorded_tiny(tiny_bundle: Path, recorded: Callable[..., Any]) -> Callable[..., Any]:
    """The tiny bundle on the recording driver under a new namespace; ``target=`` picks the device target."""

    def make(**kwargs: Any) -> Any:
        return recorded(tiny_bundle, **kwargs)

    return make


@pytest.fixture
def bundle_copy(tmp_path: Path, tiny_bundle: Path) -> Callable[[Callable[[dict], None] | None], Path]:
    """A copy of the tiny bundle whose manifest JSON a test may change (the function edits the dict)."""

    def make(edit: Callable[[dict], None] | None = None) -> Path:
        root = tmp_path / f"bundle_{uuid.uuid4().hex[:6]}"
        shutil.copytree(tiny_bundle, root)
        if edit is not None:
            path = root / "manifest.json"
            data = json.loads(path.read_text())
            edit(data)
            path.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
        return root

    return make

