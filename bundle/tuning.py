"""Tuning tables: which specialization of an op wins for which key value on which device.

A tuning table is a JSON file written by ``flyship tune`` (or an importer, :mod:`flyship.compiler.tuning`)
and shipped beside a bundle; ``flyship.load(bundle, tuning=PATH)`` dispatches through it. This module is
the one reader, writer and dispatch policy, used by both halves (stdlib only). The format is documented
in ``docs/tuning.md``::

    {"format": "flyship-tuning", "version": "1.0", "namespace": "ns",
     "keys": {"gemm": ["a.shape[0]", "b.shape[1]"]},
     "entries": [{"op": "gemm", "target": "gfx942", "cus": 304, "key": [16, 4096],
                  "spec": "cfg3", "us": {"cfg0": 12.5, "cfg3": 9.1}}]}

Dispatch policy (:func:`dispatch_plan`): the entries for the device's processor (and CU count, when both
sides know it) become an ordered list of guards, one per key bucket, placed before the bundle's own
specializations; the C++ core evaluates them per call like any guard, so no Python runs on the hot path.
A key value not in the table goes to the *nearest bucket*, dimension by dimension in key order, nearness
measured on a log2 scale (the boundary between key values ``a < b`` is ``floor(sqrt(a * b))``: values up
to it go to ``a``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

from flyship.bundle.errors import BundleError

FORMAT_NAME = "flyship-tuning"
VERSION_MAJOR, VERSION_MINOR = 1, 0
VERSION = f"{VERSION_MAJOR}.{VERSION_MINOR}"
TUNED_SUFFIX = "__t"  # tuned guard names: <winner>__t<bucket index>


@dataclasses.dataclass(frozen=True)
class Entry:
    """The winner for one key value of one op on one device.

    Attributes:
        op: op name.
        target: the device's target ID as the runtime reports it (``gfx942:sramecc+:xnack-``, ``sm_90``).
        cus: compute units (AMD) / streaming multiprocessors (NVIDIA) of the device, or None if unknown.
        key: the key's values, one per key expression of the op.
        spec: the winning specialization's name.
        us: candidate specialization -> measured microseconds per call (median), as raced; may be empty
            (an imported entry).
    """

    op: str
    target: str
    cus: Optional[int]
    key: tuple[int, ...]
    spec: str
    us: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Table:
    """A whole tuning table: per op its key expressions, and the entries."""

    namespace: str
    keys: dict[str, tuple[str, ...]]
    entries: tuple[Entry, ...]
    version: str = VERSION


def _processor(target: str) -> str:
    return target.split(":")[0].rstrip("a") if target.startswith("sm_") else target.split(":")[0]


def to_json_obj(table: Table) -> dict:
    return {
        "format": FORMAT_NAME, "version": table.version, "namespace": table.namespace,
        "keys": {k: list(v) for k, v in sorted(table.keys.items())},
        "entries": [{"op": e.op, "target": e.target, "cus": e.cus, "key": list(e.key), "spec": e.spec,
                     "us": {k: round(float(v), 3) for k, v in sorted(e.us.items())}}
                    for e in sorted(table.entries, key=lambda e: (e.op, e.target, e.cus or 0, e.key))],
    }


def write(table: Table, path: Path | str) -> None:
    """Write ``table`` as sorted, indented JSON."""
    Path(path).write_text(json.dumps(to_json_obj(table), indent=1, sort_keys=True) + "\n")


def _need(cond: bool, where: str, expected: str, got: Any) -> None:
    if not cond:
        raise BundleError(f"tuning table {where}: expected {expected}, got {got!r}; regenerate it with "
                          "`flyship tune` or fix the file (docs/tuning.md)")


def from_json_obj(data: Any, where: str = "") -> Table:
    """Parse and check a table's JSON data.

    Raises:
        BundleError: naming the first bad key or value.
    """
    _need(isinstance(data, dict), where, "an object", type(data).__name__)
    _need(data.get("format") == FORMAT_NAME, f"{where} format", repr(FORMAT_NAME), data.get("format"))
    ver = data.get("version")
    _need(isinstance(ver, str) and ver.split(".")[0] == str(VERSION_MAJOR), f"{where} version",
          f"major version {VERSION_MAJOR}", ver)
    ns = data.get("namespace")
    _need(isinstance(ns, str), f"{where} namespace", "a string", ns)
    keys_raw = data.get("keys")
    _need(isinstance(keys_raw, dict), f"{where} keys", "an object op -> [key expressions]", keys_raw)
    keys: dict[str, tuple[str, ...]] = {}
    for op, k in keys_raw.items():
        _need(isinstance(k, list) and k and all(isinstance(x, str) for x in k), f"{where} keys.{op}",
              "a non-empty list of expressions", k)
        keys[op] = tuple(k)
    entries = []
    raw = data.get("entries")
    _need(isinstance(raw, list), f"{where} entries", "a list", type(raw).__name__)
    for i, e in enumerate(raw):
        w = f"{where} entries[{i}]"
        _need(isinstance(e, dict), w, "an object", type(e).__name__)
        _need(e.get("op") in keys, f"{w}.op", f"an op named in keys ({sorted(keys)})", e.get("op"))
        _need(isinstance(e.get("target"), str) and e["target"], f"{w}.target", "a target ID", e.get("target"))
        cus = e.get("cus")
        _need(cus is None or (isinstance(cus, int) and not isinstance(cus, bool) and cus > 0), f"{w}.cus",
              "a positive integer or null", cus)
        key = e.get("key")
        _need(isinstance(key, list) and len(key) == len(keys[e["op"]])
              and all(isinstance(x, int) and not isinstance(x, bool) for x in key), f"{w}.key",
              f"{len(keys[e['op']])} integers (one per key expression of {e['op']})", key)
        _need(isinstance(e.get("spec"), str) and e["spec"], f"{w}.spec", "a specialization name", e.get("spec"))
        us = e.get("us", {})
        _need(isinstance(us, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           and math.isfinite(v) for v in us.values()),
              f"{w}.us", "an object spec -> finite microseconds", us)
        entries.append(Entry(e["op"], e["target"], cus, tuple(key), e["spec"], {k: float(v) for k, v in us.items()}))
    seen: dict[tuple, str] = {}
    for e in entries:
        k = (e.op, _processor(e.target), e.cus, e.key)
        if k in seen and seen[k] != e.spec:
            raise BundleError(f"tuning table {where}: two winners ({seen[k]!r}, {e.spec!r}) for op {e.op} key "
                              f"{list(e.key)} on {e.target}; keep one")
        seen[k] = e.spec
    return Table(ns, keys, tuple(entries), ver)


def read(path: Path | str) -> Table:
    """Read a tuning table file.

    Raises:
        BundleError: unreadable, not JSON, or malformed.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BundleError(f"tuning table {path}: expected a readable JSON file, got {type(e).__name__}: {e}") from None
    return from_json_obj(data, str(path))


def merge(old: Table, new: Table) -> Table:
    """``new``'s entries replace ``old``'s for the same (op, processor, CU count, key)."""
    keys = dict(old.keys)
    for op, k in new.keys.items():
        if op in keys and keys[op] != k:
            raise BundleError(f"tuning table merge: op {op} is keyed by {list(keys[op])} in one table and "
                              f"{list(k)} in the other; tune into a new file")
        keys[op] = k
    idx = {(e.op, _processor(e.target), e.cus, e.key): e for e in old.entries}
    for e in new.entries:
        idx[(e.op, _processor(e.target), e.cus, e.key)] = e
    return Table(new.namespace or old.namespace, keys, tuple(idx.values()))


def entries_for(table: Table, target: str, cus: Optional[int], note: Callable[[str], None]) -> list[Entry]:
    """The entries that apply to a device of ``target`` with ``cus`` compute units; the others are
    ignored, each (op, target, CU count) group said once through ``note``."""
    proc = _processor(target)
    out, skipped = [], set()
    for e in table.entries:
        if _processor(e.target) != proc:
            skipped.add((e.op, e.target, e.cus, f"tuned for {e.target}, the device is {target}"))
        elif cus is not None and e.cus is not None and e.cus != cus:
            skipped.add((e.op, e.target, e.cus, f"tuned on {e.cus} CUs, the device has {cus}"))
        else:
            out.append(e)
    for op, _t, _c, why in sorted(skipped, key=str):
        note(f"flyship tuning: ignoring the entries of op {op} {why}")
    return out


def _boundaries(values: list[int]) -> list[int]:
    """Upper bounds of each sorted distinct value's bucket (the last is open): nearest on a log2 scale."""
    out = []
    for a, b in zip(values, values[1:]):
        out.append(math.isqrt(a * b) if a > 0 and b > 0 else (a + b) // 2)
    return out


def nearest(values: list[int], x: int) -> int:
    """The bucket of ``x`` among sorted distinct ``values`` (the same rule the guards encode)."""
    for v, hi in zip(values, _boundaries(values)):
        if x <= hi:
            return v
    return values[-1]


def dispatch_plan(key: tuple[str, ...], entries: list[Entry]) -> list[tuple[str, tuple[str, ...]]]:
    """The ordered (winner spec, extra guard constraints) pairs that implement the nearest-bucket policy
    for one op's ``entries`` (all for one device): a decision tree over the key dimensions in order, each
    leaf a conjunction of interval bounds on the key expressions. Every key value falls in exactly one
    leaf."""
    out: list[tuple[str, tuple[str, ...]]] = []

    def walk(dim: int, group: list[Entry], cons: tuple[str, ...]) -> None:
        if dim == len(key):
            out.append((group[0].spec, cons))
            return
        values = sorted({e.key[dim] for e in group})
        bounds = _boundaries(values)
        for i, v in enumerate(values):
            c = list(cons)
            if i > 0:
                c.append(f"({key[dim]}) > {bounds[i - 1]}")
            if i < len(bounds):
                c.append(f"({key[dim]}) <= {bounds[i]}")
            walk(dim + 1, [e for e in group if e.key[dim] == v], tuple(c))

    if entries:
        walk(0, entries, ())
    return out
