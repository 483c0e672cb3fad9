"""The emulated device's plumbing (FLYSHIP_FLAVOR=emulate, csrc/driver_emulate.cpp, loader/emulated_device.py).

What reaches the emulator from the real C++ call path: the code object, symbol, grid, block, kernarg bytes and the
memory the launch may touch (each tensor's own extent, never its storage); an exception the emulator raises fails
the op call with its words (no crash); the described device picks the variant. The emulator itself runs in
test_emulated_verify.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cpu

GFX942 = "gfx942:sramecc+:xnack-"


@pytest.fixture(scope="module")
def emulate_ext() -> Any:
    from flyship.loader import extension

    try:
        return extension.extension("emulate")
    except extension.ExtensionBuildError as e:
        pytest.skip(f"the emulate extension cannot be built here, so the emulated call path is untested: {e}")


@pytest.fixture
def probe(emulate_ext: Any) -> Any:
    """Launches reach this test's function instead of the emulator (restored after): a list of their arguments;
    ``probe.fail`` set to a message makes the next launch raise it."""
    from flyship.loader import emulated_device

    class Probe(list):
        fail = ""

        def __call__(self, **kw: Any) -> None:
            self.append(kw)
            if self.fail:
                raise ValueError(self.fail)

    p = Probe()
    emulate_ext.set_emulator(p)
    yield p
    emulate_ext.set_emulator(emulated_device.launch)


def _load(bundle: Path, emulate_ext: Any, target: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    import flyship
    from flyship.loader import emulated_device

    emulated_device.describe(emulate_ext, target)
    with monkeypatch.context() as m:
        m.setenv("FLYSHIP_FLAVOR", "emulate")
        ops = flyship.load(bundle, namespace=f"flyship_m{uuid.uuid4().hex[:10]}")
    assert ops.flavor == "emulate"
    return ops


@pytest.mark.parametrize("target", [GFX942, "gfx950"])
def test_launch_hands_the_call_to_the_emulator(example_bundle: Path, emulate_ext: Any, probe: Any, target: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    ops = _load(example_bundle, emulate_ext, target, monkeypatch)
    x = torch.randn(300, 64)
    y = torch.empty(300, 80)[:, :64].copy_(torch.randn(300, 64))  # padded rows: storage > extent
    out = ops.add(x, y)
    assert len(probe) == 1, probe
    call = probe[0]
    assert call["target"] == target and call["device"] == 0
    assert call["image"][:4] == b"\x7fELF" or call["image"].startswith(b"__CLANG_OFFLOAD_BUNDLE__")
    assert call["symbol"] and call["symbol"].encode() in call["image"]
    kernargs = call["kernargs"]
    for t in (x, y, out):  # the kernarg pointers are the CPU tensors' own
        assert t.data_ptr().to_bytes(8, "little") in kernargs
    regions = {r[0]: r for r in call["regions"]}
    assert {r[3] for r in call["regions"]} == {"x", "y", "out"}
    assert regions[x.data_ptr()][1:3] == (x.numel() * 4, False)
    # y's extent: 299 rows of 80 plus 64, not its 300x80 storage
    assert regions[y.data_ptr()][1:3] == ((299 * 80 + 64) * 4, False)
    assert regions[out.data_ptr()][1:3] == (out.numel() * 4, True)
    grid, block = call["grid"], call["block"]
    assert all(g >= 1 for g in grid) and 1 <= block[0] * block[1] * block[2] <= 1024


def test_an_emulator_error_fails_the_call_with_its_words(example_bundle: Path, emulate_ext: Any, probe: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from flyship.errors import CallError

    ops = _load(example_bundle, emulate_ext, GFX942, monkeypatch)
    probe.fail = "emulate: v_bogus_b32 is not modelled"
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    torch_op = getattr(torch.ops, ops.namespace).add  # torch.ops.<ns>.add: its own fast entry (torch_op_call.cpp)
    for call in (lambda: ops.add(x, y), lambda: ops.add.out(x, y, out=torch.empty(8, 16)), lambda: torch_op(x, y)):
        before = len(probe)
        with pytest.raises(CallError, match=r"emulated launch: ValueError: emulate: v_bogus_b32 is not modelled"):
            call()
        assert len(probe) == before + 1  # refused once: a launch the driver refused is not run again
    probe.fail = ""
    before = len(probe)
    ops.add(torch.randn(8, 16), torch.randn(8, 16))  # the process goes on
    assert len(probe) == before + 1


def test_merged_regions() -> None:
    from flyship.loader import emulated_device

    merged = emulated_device.merge_regions([(4096, 64, False, "x"), (4096, 64, True, "x_out"), (8192, 0, True, "e"),
                                            (1000, 8, False, "s"), (4100, 100, False, "v")])
    assert merged == [(1000, 8, False, "s"), (4096, 104, True, "x+x_out+v")]


def test_describe_refuses_a_target_the_emulator_does_not_model(emulate_ext: Any) -> None:
    from flyship.errors import ConfigError
    from flyship.loader import emulated_device

    for target in ("sm_90", "gfx1100", "gfx999"):  # not AMD; RDNA (wave32, another ISA); no such processor
        with pytest.raises(ConfigError, match=f"expected a target the emulator models .*got '{target}'"):
            emulated_device.describe(emulate_ext, target)


def test_verify_emulate_defaults_to_the_bundles_own_modelled_targets(tmp_path: Any) -> None:
    import json
    import shutil

    from flyship.loader.tools import verify_emulated as ve

    tiny = Path(__file__).parent / "data" / "tiny"
    m = json.loads((tiny / "manifest.json").read_text())
    every = {v["target"].split(":")[0] for o in m["ops"] for s in o["specializations"] for v in s["variants"]}
    assert ve.bundle_targets(tiny) and set(ve.bundle_targets(tiny)) == every & {"gfx90a", "gfx942", "gfx950"}
    # a bundle of gfx90a alone is emulated as gfx90a, not as the gfx942/gfx950 it has no code objects for
    only = tmp_path / "only90a"
    shutil.copytree(tiny, only)
    for o in m["ops"]:
        for s in o["specializations"]:
            s["variants"] = [dict(v, target="gfx90a") for v in s["variants"][:1]]
    (only / "manifest.json").write_text(json.dumps(m))
    assert ve.bundle_targets(only) == ("gfx90a",)
