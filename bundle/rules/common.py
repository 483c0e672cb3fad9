"""What every subject of the rule book shares: the refusal's form and the small value tests."""

from __future__ import annotations

import re

from flyship.bundle.errors import BundleError

SHA256 = re.compile(r"[0-9a-f]{64}\Z")


def is_pow2(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


def fail(where: str, what: str) -> BundleError:
    """The refusal of a rule: ``<where>: <what>``."""
    return BundleError(f"{where}: {what}")


def count(items: object, limit: int, what: str, where: str) -> None:
    """At most ``limit`` items."""
    if len(items) > limit:  # type: ignore[arg-type]
        raise fail(where, f"expected at most {limit} {what}, got {len(items)}")  # type: ignore[arg-type]
