"""Tuning tables: which specialization of an op wins for which key value on which device.

A tuning table is a JSON file written by ``flyship tune`` (or an importer, :mod:`flyship.compiler.tuning`)
and shipped beside a bundle; ``flyship.load(bundle, tuning=PATH)`` dispatches through it. This module is
the one reader, writer and dispatch policy, used by both halves (stdlib only). The format is documented
in ``docs/tuning.md``::

    {"format": "flyship-tuning", "version": "1.1", "namespace": "ns",
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
import functools
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError, ExprError

FORMAT_NAME = "flyship-tuning"
VERSION_MAJOR, VERSION_MINOR = 1, 1
# The winner name that says "the op's reference (for a patched site, the original function) wins for this key"
# (1.1): parentheses keep it apart from every specialization name.
ORIGINAL = "(original)"
VERSION = f"{VERSION_MAJOR}.{VERSION_MINOR}"
TUNED_SUFFIX = "__t"  # tuned guard names: <winner>__t<bucket index>
_TOP_KEYS = frozenset({"format", "version", "namespace", "keys", "entries"})
_ENTRY_KEYS = frozenset({"op", "target", "cus", "key", "spec", "us"})
_MAX_ENTRIES = 1 << 16
_MAX_US = 1e12  # microseconds per call: 11 days; also keeps an integer exact as the float it is read as


@dataclasses.dataclass(frozen=True)
class Entry:
    """The winner for one key value of one op on one device.

    Attributes:
        op: op name.
        target: the device's target ID as the runtime reports it (``gfx942:sramecc+:xnack-``, ``sm_90``).
        cus: compute units (AMD) / streaming multiprocessors (NVIDIA) of the device, or None if unknown.
        key: the key's values, one per key expression of the op.
        spec: the winning specialization's name, or :data:`ORIGINAL` (1.1): the op's reference wins.
        us: candidate specialization (or :data:`ORIGINAL`) -> measured microseconds per call (median), as
            raced; may be empty (an imported entry).
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


@functools.lru_cache(maxsize=256)
def _processor(target: str) -> str:
    """The processor a target ID names (``gfx942`` for ``gfx942:sramecc+:xnack-``, ``sm_90`` for ``sm_90a``), read
    by the one target parser (:func:`flyship.bundle.targets.parse_target`)."""
    return _targets.parse_target(target).processor


def to_json_obj(table: Table) -> dict:
    return {
        "format": FORMAT_NAME, "version": VERSION, "namespace": table.namespace,
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
        shown = repr(got) if isinstance(got, (str, int, float, type(None))) else type(got).__name__
        raise BundleError(f"tuning table {where}: expected {expected}, got {shown[:120]}; regenerate it with "
                          "`flyship tune` or fix the file (docs/tuning.md)")


def _is_int(x: Any) -> bool:
    return type(x) is int and _limits.INT64_MIN <= x <= _limits.INT64_MAX


def _is_name(x: Any) -> bool:
    return type(x) is str and 0 < len(x) <= _limits.MAX_NAME


def _known_keys(data: dict, known: frozenset[str], where: str, lenient: bool) -> None:
    """Unknown keys are refused in a table of this minor version or older (a newer minor may add some)."""
    unknown = sorted(set(data) - known)
    if unknown and not lenient:
        _need(False, where, f"only the keys {', '.join(sorted(known))}", f"also {', '.join(k[:40] for k in unknown)}")


def _read_keys(raw: Any, where: str) -> dict[str, tuple[str, ...]]:
    """``keys``: op name -> its key expressions, each a valid expression (:mod:`flyship.bundle.expr`)."""
    _need(type(raw) is dict and len(raw) <= _limits.MAX_OPS, f"{where} keys",
          f"an object op -> [key expressions] (at most {_limits.MAX_OPS} ops)", raw)
    keys: dict[str, tuple[str, ...]] = {}
    for op, k in raw.items():
        w = f"{where} keys.{op[:40]}"
        _need(_is_name(op), w, f"an op name of 1 to {_limits.MAX_NAME} characters", op)
        _need(type(k) is list and 0 < len(k) <= _limits.MAX_RANK, w,
              f"a list of 1 to {_limits.MAX_RANK} key expressions", k)
        for j, x in enumerate(k):
            _need(type(x) is str and len(x) <= _limits.MAX_STRING, f"{w}[{j}]", "an expression string", x)
            try:
                _expr.parse(x)
            except ExprError as e:
                raise BundleError(f"tuning table {w}[{j}]: {e}; fix the file (docs/tuning.md)") from None
        keys[op] = tuple(k)
    return keys


def _read_entry(e: Any, keys: dict[str, tuple[str, ...]], w: str, lenient: bool, minor: int) -> Entry:
    """One entry of ``entries``, every value checked before it is used."""
    _need(type(e) is dict, w, "an object", e)
    _known_keys(e, _ENTRY_KEYS, w, lenient)
    op = e.get("op")
    _need(type(op) is str and op in keys, f"{w}.op", f"an op named in keys ({', '.join(sorted(keys)[:20])})", op)
    target = e.get("target")
    try:
        # (cached: a table repeats a few targets over thousands of entries; a non-string goes to the parser's refusal)
        _processor(target) if type(target) is str else _targets.parse_target(target)
    except BundleError as err:
        raise BundleError(f"tuning table {w}.target: {err}; fix the file (docs/tuning.md)") from None
    cus = e.get("cus")
    _need(cus is None or (_is_int(cus) and 0 < cus <= _limits.MAX_RESOURCE), f"{w}.cus",
          "a positive integer or null", cus)
    key = e.get("key")
    n = len(keys[op])
    _need(type(key) is list and len(key) == n and all(_is_int(x) for x in key), f"{w}.key",
          f"{n} integers within int64 (one per key expression of {op})", key)
    spec = e.get("spec")
    _need(_is_name(spec), f"{w}.spec", f"a specialization name of 1 to {_limits.MAX_NAME} characters", spec)
    _need(spec != ORIGINAL or minor >= 1, f"{w}.spec", f"a specialization name (a version 1.0 table cannot name "
          f"{ORIGINAL}; it is version 1.1)", spec)
    us = e.get("us", {})
    _need(type(us) is dict
          and all(_is_name(k) and type(v) in (int, float) and 0 <= v <= _MAX_US for k, v in us.items()),
          f"{w}.us", f"an object spec -> finite microseconds (0 to {_MAX_US:.0e})", us)
    return Entry(op, target, cus, tuple(key), spec, {k: float(v) for k, v in us.items()})


def from_json_obj(data: Any, where: str = "") -> Table:
    """Parse and check a table's JSON data: every key and value typed and bounded, targets read by the one target
    parser, key expressions by the expression parser; unknown keys refused (ignored in a newer minor version).

    Raises:
        BundleError: naming the first bad key or value.
    """
    _need(type(data) is dict, where, "an object", data)
    _need(data.get("format") == FORMAT_NAME, f"{where} format", repr(FORMAT_NAME), data.get("format"))
    ver = data.get("version")
    m = re.fullmatch(r"([0-9]{1,6})\.([0-9]{1,6})", ver) if type(ver) is str else None
    _need(m is not None and int(m[1]) == VERSION_MAJOR, f"{where} version",
          f"major version {VERSION_MAJOR} as 'MAJOR.MINOR' (this flyship reads {VERSION})", ver)
    minor = int(m[2])
    lenient = minor > VERSION_MINOR
    _known_keys(data, _TOP_KEYS, where, lenient)
    ns = data.get("namespace")
    _need(type(ns) is str and len(ns) <= _limits.MAX_NAME, f"{where} namespace", "a string", ns)
    keys = _read_keys(data.get("keys"), where)
    raw = data.get("entries")
    _need(type(raw) is list and len(raw) <= _MAX_ENTRIES, f"{where} entries", f"a list of at most {_MAX_ENTRIES}",
          raw)
    entries = [_read_entry(e, keys, f"{where} entries[{i}]", lenient, minor) for i, e in enumerate(raw)]
    seen: dict[tuple, str] = {}
    for e in entries:
        k = (e.op, _processor(e.target), e.cus, e.key)
        if k in seen and seen[k] != e.spec:
            raise BundleError(f"tuning table {where}: two winners ({seen[k]!r}, {e.spec!r}) for op {e.op} key "
                              f"{list(e.key)} on {e.target}; keep one")
        seen[k] = e.spec
    return Table(ns, keys, tuple(entries), ver)


def read(path: Path | str) -> Table:
    """Read a tuning table file: a regular file of at most ``MAX_TUNING_BYTES``, read once and bounded, strict
    JSON (:func:`flyship.bundle.files.read_json`), then checked (:func:`from_json_obj`).

    Raises:
        BundleError: missing, not a regular file (a FIFO, a device), too large, not JSON, nested too deep, or
            malformed.
    """
    data = _files.read_json(path, _limits.MAX_TUNING_BYTES, what="tuning table", error=BundleError,
                            hint="pass the file `flyship tune` wrote (docs/tuning.md)")
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
        by: dict[int, list[Entry]] = {}  # one pass: each entry is looked at once per dimension (linear, not
        for e in group:  # one scan of the group per value, which made 20,000 entries take seconds)
            by.setdefault(e.key[dim], []).append(e)
        values = sorted(by)
        bounds = _boundaries(values)
        last = dim == len(key) - 1
        i = 0
        while i < len(values):
            j = i  # on the last dimension, neighbouring buckets with one winner are one interval (one guard)
            while last and j + 1 < len(values) and by[values[j + 1]][0].spec == by[values[i]][0].spec:
                j += 1
            c = list(cons)
            if i > 0:
                c.append(f"({key[dim]}) > {bounds[i - 1]}")
            if j < len(bounds):
                c.append(f"({key[dim]}) <= {bounds[j]}")
            walk(dim + 1, by[values[i]], tuple(c))
            i = j + 1

    if entries:
        walk(0, entries, ())
    return out
