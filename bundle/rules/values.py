"""Rules on values: scalar values fit their type, launch blocks fit the limits."""

from __future__ import annotations

from flyship.bundle import limits as L
from flyship.bundle.rules.common import fail as _fail


def check_scalar_value(kind: str, value: object, where: str) -> None:
    """A scalar value (default, example value) fits the scalar's type: an int for ``int`` (within int64),
    a number for ``float``, a bool for ``bool``; a float is never silently truncated to an int."""
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool) and L.INT64_MIN <= value <= L.INT64_MAX,
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
    }.get(kind, False)
    if not ok:
        raise _fail(where, f"expected a value of scalar type {kind}, got {value!r}")


def check_block(block: tuple[int, ...], where: str) -> int:
    """Each block dimension is 1..``MAX_BLOCK`` and so is their product. Returns the work-items per block."""
    if any(not isinstance(b, int) or not 1 <= b <= L.MAX_BLOCK for b in block):
        raise _fail(where, f"expected block dimensions in 1..{L.MAX_BLOCK}, got {list(block)}")
    threads = block[0] * block[1] * block[2]
    if threads > L.MAX_BLOCK:
        raise _fail(where, f"expected at most {L.MAX_BLOCK} work-items per block, got {list(block)} = {threads}")
    return threads
