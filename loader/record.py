"""Dry runs: a bundle's ops on the recording driver, the real C++ call path with no GPU (``flyship.dry_run``).

The recording driver (``csrc/driver_record.cpp``) is the extension's third driver shim beside HIP and CUDA: it
loads no code object and launches nothing, but every call goes through the same binding, guard, kernarg packing and
launch path as on a GPU, and each launch is recorded (symbol, grid, block, dynamic LDS, stream and the kernarg bytes
the runtime would have received). CPU tensors stand in for device memory. This is how flyship's own tests check
what a call would launch, and how a user's CI can check a model's calls against a bundle on a CPU-only runner::

    import torch, flyship
    run = flyship.dry_run("artifacts/my_kernels", target="gfx942")
    run.ops.rmsnorm(torch.randn(8, 4096), torch.ones(4096), 1e-6)
    (launch,) = run.launches()
    assert launch.symbol == "rmsnorm_kernel" and launch.grid == (8, 1, 1)

The recording driver computes nothing: outputs hold what the allocator left (zeros for a fresh CPU tensor, not
the kernel's result). Check numbers through the op's reference on CPU (``flyship.load`` without a dry run).

This module is the public face of the recording driver; where the extension is built (``loader/extension.py``)
is not part of the API.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from pathlib import Path
from typing import Any, Optional

from flyship.bundle import targets as _targets
from flyship.errors import BundleError, ConfigError

# One recording device per process (the driver's device table is global): dry runs describing it are serialised.
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class RecordedLaunch:
    """One launch the recording driver received.

    Attributes:
        device: the device index (CPU tensors run on device 0).
        symbol: the kernel's symbol in its code object.
        grid: workgroups (blocks) per dimension.
        block: work-items (threads) per workgroup, per dimension.
        dynamic_lds: dynamic LDS (shared memory) bytes.
        stream: the stream handle the launch was enqueued on (0: the default stream).
        kernargs: the kernarg segment, byte for byte as the runtime would have received it.
    """

    device: int
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int
    stream: int
    kernargs: bytes


class DryRun:
    """A bundle loaded on the recording driver (:func:`dry_run`): ``ops`` to call, :meth:`launches` to read."""

    def __init__(self, ops: Any, ext: Any, target: str) -> None:
        self.ops = ops
        self.target = target
        self._ext = ext

    def launches(self, clear: bool = True) -> list[RecordedLaunch]:
        """The launches recorded since the last look (of every dry run in this process), oldest first.

        Args:
            clear: forget them once read (default), so the next look sees only later launches.
        """
        return [RecordedLaunch(device=int(d["device"]), symbol=str(d["symbol"]), grid=tuple(d["grid"]),
                               block=tuple(d["block"]), dynamic_lds=int(d["dynamic_lds"]), stream=int(d["stream"]),
                               kernargs=bytes(d["kernargs"]))
                for d in self._ext.recorded_launches(clear)]

    def __repr__(self) -> str:
        return f"DryRun({self.ops!r}, target={self.target!r})"


def dry_run(bundle: str | Path, target: str = "gfx942:sramecc+:xnack-", *, cu_count: Optional[int] = None,
            max_shared_per_block: int = 64 * 1024, max_threads_per_block: int = 1024,
            namespace: Optional[str] = None, **load_kwargs: Any) -> DryRun:
    """Load ``bundle`` on the recording driver, as a device of ``target`` would run it.

    Args:
        bundle: what :func:`flyship.load` takes (a bundle folder, its manifest.json or a packed file).
        target: the device's target ID (``"gfx942:sramecc+:xnack-"``, ``"gfx950"``, ``"sm_90"``): the
            specializations and variants a call takes are chosen for it, as on such a GPU.
        cu_count, max_shared_per_block, max_threads_per_block: the device's compute units (SMs), LDS (shared
            memory) per workgroup and work-items per workgroup, which guards and launch checks read. ``cu_count``
            defaults to the target's usual count (:func:`flyship.bundle.targets.usual_cu_count`: 304 for gfx942,
            256 for gfx950, 132 for sm_90), the one a build's example grids and ``dispatch`` assume.
        namespace: the torch namespace to register the ops under (default: a fresh one, so a dry run never
            collides with the bundle loaded for real in the same process).
        load_kwargs: passed to :func:`flyship.load` (``fallback``, ``references``, ``tuning``...).

    Returns:
        A :class:`DryRun`: ``.ops`` (the bundle's ops, calls taking CPU tensors) and ``.launches()``.

    Raises:
        ConfigError: a target that is not a string, or a namespace already loaded on another driver.
        ExtensionBuildError: the recording extension could not be built (it needs torch's headers and a C++
            compiler, no GPU SDK).
        BundleError: as :func:`flyship.load`.
    """
    from flyship.loader import core
    from flyship.loader import extension as _extension

    if not isinstance(target, str) or not target:
        raise ConfigError(f"dry_run: expected target to be a target ID string such as 'gfx942', got {target!r}")
    if cu_count is None:
        try:
            cu_count = _targets.usual_cu_count(target)
        except BundleError as e:
            raise ConfigError(f"dry_run: {e}") from None
    for name, v in (("cu_count", cu_count), ("max_shared_per_block", max_shared_per_block),
                    ("max_threads_per_block", max_threads_per_block)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"dry_run: expected {name} to be an int >= 1, got {v!r}")
    ext = _extension.extension("record")
    with _lock:
        # The device is read once per bundle, at its first call: describe it before the ops can be called.
        ext.set_recorded_device(0, target, max_shared_per_block, max_threads_per_block, cu_count)
        token = core.DRIVER.set("record")
        try:
            ops = core.load(bundle, namespace=namespace or f"flyship_dry_{uuid.uuid4().hex[:10]}", **load_kwargs)
        finally:
            core.DRIVER.reset(token)
    if ops.flavor != "record":
        raise ConfigError(f"dry_run: namespace {ops.namespace!r} is already loaded in this process on the "
                          f"{ops.flavor!r} driver; leave namespace= out (a fresh one is made) or name another")
    return DryRun(ops, ext, target)
