"""The global address space a kernel may touch (explicit regions of host memory) and the per-lane gather/scatter
the memory instructions use. Every byte read or written is first checked to lie inside one region."""

from __future__ import annotations

import bisect
import ctypes
import dataclasses

import numpy as np

from flyship.loader.emulate.errors import refuse


@dataclasses.dataclass
class Region:
    address: int
    nbytes: int
    writable: bool
    name: str
    view: np.ndarray  # uint8 view of the host bytes

    @property
    def end(self) -> int:
        return self.address + self.nbytes


class Memory:
    """The global memory a launch may touch: explicit regions of host memory, nothing else.

    Args: none; add regions with :meth:`add`.

    Example:
        >>> import numpy as np
        >>> buf = np.zeros(4, np.float32)
        >>> mem = Memory()
        >>> mem.add(buf.ctypes.data, buf.nbytes, writable=True, name="out")
    """

    def __init__(self) -> None:
        self._regions: list[Region] = []
        self._starts: list[int] = []
        self._keep: list[object] = []

    def add(self, address: int, nbytes: int, *, writable: bool, name: str = "") -> None:
        """Let the kernel read (and, if ``writable``, write) ``nbytes`` of host memory at ``address``.

        Regions that overlap or touch one already added (two views of one storage, an output aliasing an input)
        merge into one region over their union, writable when either is.

        Raises:
            LoadError (kind EmulationError): a non-positive address or a negative size.
        """
        if not isinstance(address, int) or not isinstance(nbytes, int) or address <= 0 or nbytes < 0:
            raise refuse(f"Memory.add: expected a positive address and a size >= 0, got {address!r}, {nbytes!r}")
        if nbytes == 0:
            return
        lo, hi, names = address, address + nbytes, [name or hex(address)]
        keep = []
        for r in self._regions:
            if r.address <= hi and lo <= r.end:
                lo, hi = min(lo, r.address), max(hi, r.end)
                writable = writable or r.writable
                names.append(r.name)
            else:
                keep.append(r)
        view = np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo)).from_address(lo))
        keep.append(Region(lo, hi - lo, writable, "+".join(dict.fromkeys(n for n in names if n)), view))
        keep.sort(key=lambda r: r.address)
        self._regions = keep
        self._starts = [r.address for r in keep]

    def own(self, data: np.ndarray, *, writable: bool, name: str) -> int:
        """Add an emulator-owned buffer (kept alive with this Memory) and return its address."""
        data = np.ascontiguousarray(data)
        self._keep.append(data)
        self.add(data.ctypes.data, data.nbytes, writable=writable, name=name)
        return data.ctypes.data

    @property
    def regions(self) -> list[Region]:
        return list(self._regions)

    def _nearest(self, address: int) -> str:
        if not self._regions:
            return "no regions at all"
        best = min(self._regions, key=lambda r: 0 if r.address <= address < r.end else
                   min(abs(address - r.address), abs(address - r.end)))
        where = "inside" if best.address <= address < best.end else (
            f"{address - best.end} bytes past the end of" if address >= best.end else
            f"{best.address - address} bytes before")
        return f"{where} {best.name or 'region'} [0x{best.address:x}, +{best.nbytes})"

    def _locate(self, addr: np.ndarray, nbytes: int, write: bool, where: str) -> tuple[Region, np.ndarray]:
        """The one region holding every ``[a, a + nbytes)``, and the offsets into it; refuses otherwise."""
        lo, hi = int(addr.min()), int(addr.max())
        i = bisect.bisect(self._starts, lo) - 1
        if i >= 0:
            r = self._regions[i]
            if lo >= r.address and hi + nbytes <= r.end:
                if write and not r.writable:
                    raise refuse(f"`{where}` writes read-only {r.name or 'region'} at 0x{lo:x}")
                return r, (addr - np.uint64(r.address)).astype(np.int64)
        return self._locate_each(addr, nbytes, write, where)

    def _locate_each(self, addr: np.ndarray, nbytes: int, write: bool, where: str):
        # Lanes in several regions: the first lane outside every region is refused, else the caller splits.
        for a in np.unique(addr).tolist():
            i = bisect.bisect(self._starts, a) - 1
            ok = i >= 0 and a >= self._regions[i].address and a + nbytes <= self._regions[i].end
            if not ok:
                raise refuse(f"`{where}` {'writes' if write else 'reads'} {nbytes} bytes at 0x{a:x}, outside every "
                             f"region of the launch's memory (nearest: {self._nearest(a)}); the kernel reads or "
                             "writes past its tensors")
            if write and not self._regions[i].writable:
                raise refuse(f"`{where}` writes read-only {self._regions[i].name or 'region'} at 0x{a:x}")
        return None, None

    def read(self, addr: np.ndarray, nbytes: int, where: str) -> np.ndarray:
        """``nbytes`` at each address (uint64 array) -> uint8 array [lanes, nbytes]."""
        addr = np.asarray(addr, np.uint64).reshape(-1)
        if addr.size == 0:
            return np.zeros((0, nbytes), np.uint8)
        r, off = self._locate(addr, nbytes, False, where)
        if r is not None:
            return r.view[off[:, None] + np.arange(nbytes)]
        out = np.empty((addr.size, nbytes), np.uint8)
        for k, a in enumerate(addr.tolist()):
            i = bisect.bisect(self._starts, a) - 1
            rr = self._regions[i]
            out[k] = rr.view[a - rr.address:a - rr.address + nbytes]
        return out

    def write(self, addr: np.ndarray, data: np.ndarray, where: str) -> None:
        """Write each row of ``data`` (uint8 [lanes, nbytes]) at its address, in lane order."""
        addr = np.asarray(addr, np.uint64).reshape(-1)
        if addr.size == 0:
            return
        nbytes = data.shape[1]
        r, off = self._locate(addr, nbytes, True, where)
        if r is not None:
            r.view[off[:, None] + np.arange(nbytes)] = data
            return
        for k, a in enumerate(addr.tolist()):
            i = bisect.bisect(self._starts, a) - 1
            rr = self._regions[i]
            rr.view[a - rr.address:a - rr.address + nbytes] = data[k]
