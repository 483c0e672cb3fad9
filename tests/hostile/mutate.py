"""Structured mutation of valid JSON inputs, shared by the reader fuzz (tests/hostile/fuzz_child.py).

A case is one of three kinds:

* ``same``: the base document re-serialized another way (indentation, separators, key order, ``\\uXXXX`` escapes):
  the same JSON data, so a reader must accept it and read exactly what it reads from the base;
* ``edit``: a JSON-level edit at a random path (a value replaced by a hostile one: wrong type, out-of-range
  number, whitespace-padded or huge string, deep nesting; a key deleted, added or given twice);
* ``bytes``: byte-level damage (a flipped, inserted or cut byte, a BOM, invalid UTF-8, 100,000 ``[``).

An edited or damaged input may be valid or not: the reader must refuse it with a flyship error, or accept it and
read what the document says (the caller's oracle checks that).
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 2, 7, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 0.5, -0.0, 1.0, 1e308,
    "", " ", "x", "gfx942", "gfx942 ", " gfx942", "gfx942:", "gfx942::xnack+", "gfx942:xnack+:xnack-",
    "gfx942:xnack-:sramecc+", "gfx942:sramecc+", "sm_90", "sm_90a", "sm_090", "GFX942", "gfx942\n", "sm_9",
    "x.shape[0]", "x.shape[-'a']", "x.shape[-True]", "cdiv(x, 0)", "__import__('os')", "m:f", "m.f", "a.b:C.d",
    "self.eps", "1", "../x", "/etc/passwd", "\x00", "\ud800", "é", "a" * 5000, "ns", "add", "f32",
    [], [0], [1, 2], ["a"], [[[]]], {}, {"a": 1}, {"const": 1}, {"const": [1, {"x": None}]},
]
_DEEP = [1, 40, 1000]


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every JSON path in ``obj`` (the root included), down to 50 levels (an inserted deep value is one target)."""
    out = [prefix]
    if len(prefix) >= 50:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, prefix + (i,))
    return out


def _at(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _value(rng: random.Random, near: Any) -> Any:
    r = rng.random()
    if r < 0.55:
        return copy.deepcopy(rng.choice(HOSTILE))
    if r < 0.7 and isinstance(near, str):  # a near miss of the value that was there
        return rng.choice([near + " ", " " + near, near.upper(), near[:-1], near + near, near + "\x00", ""])
    if r < 0.8 and isinstance(near, (int, float)) and not isinstance(near, bool):
        return rng.choice([near + 1, near - 1, -near, near * 2**40, float(near), str(near), bool(near)])
    if r < 0.9:  # nesting, as a marker that the serialized text replaces (the standard library cannot nest 1000)
        return f"@@deep:{rng.choice(_DEEP)}:{rng.choice('ao')}@@"
    return [copy.deepcopy(near)] if rng.random() < 0.5 else {"k": copy.deepcopy(near)}


def edit(base: Any, rng: random.Random) -> bytes:
    """One JSON-level edit of ``base`` (not changed), serialized."""
    doc = copy.deepcopy(base)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        path = rng.choice(paths(doc))
        r = rng.random()
        if not path:
            doc = _value(rng, doc)
            continue
        parent, key = _at(doc, path[:-1]), path[-1]
        if r < 0.6:
            parent[key] = _value(rng, parent[key])
        elif r < 0.75:
            del parent[key]
        elif r < 0.9 and isinstance(parent, dict):
            parent[rng.choice(["extra", "x", key + "_", "Op", ""])] = _value(rng, None)
        elif isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
        else:  # the key twice: only the text can say that
            text = json.dumps(doc)
            dup = json.dumps({key: _value(rng, parent[key])})[1:-1]
            pos = text.find(json.dumps(key) + ":")
            text = text[:pos] + dup + ", " + text[pos:] if pos >= 0 else text
            return _DEEP_MARK.sub(_nested, text).encode("utf-8", "surrogatepass")
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5)
    return _DEEP_MARK.sub(_nested, text).encode("utf-8", "surrogatepass")


_DEEP_MARK = re.compile(r'"@@deep:([0-9]+):([ao])@@"')


def _nested(m: re.Match) -> str:
    n = int(m[1])
    return ("[" * n + "1" + "]" * n) if m[2] == "a" else ('{"k":' * n + "1" + "}" * n)


def same(base: Any, rng: random.Random) -> bytes:
    """``base`` serialized another way: the same JSON data."""
    doc = base
    if rng.random() < 0.5:  # another key order
        def shuffle(o: Any) -> Any:
            if isinstance(o, dict):
                items = list(o.items())
                rng.shuffle(items)
                return {k: shuffle(v) for k, v in items}
            return [shuffle(v) for v in o] if isinstance(o, list) else o
        doc = shuffle(base)
    text = json.dumps(doc, indent=rng.choice([None, 0, 1, 4, "\t"]), ensure_ascii=rng.random() < 0.5,
                      separators=rng.choice([None, (",", ":"), (" , ", " : ")]))
    if rng.random() < 0.3:  # a letter inside strings as an escape (keys and values alike)
        letter = rng.choice("aeost")
        out, inside, esc, hexdigits = [], False, False, 0
        for c in text:
            if inside and not esc and not hexdigits and c == letter:
                out.append("\\u%04x" % ord(c))
                continue
            out.append(c)
            if hexdigits:
                hexdigits -= 1
            elif esc:
                esc = False
                hexdigits = 4 if c == "u" else 0
            elif c == "\\":
                esc = inside
            elif c == '"':
                inside = not inside
        text = "".join(out)
    return (("\n " if rng.random() < 0.3 else "") + text + rng.choice(["", "\n", "  \r\n"])).encode()


def damage(raw: bytes, rng: random.Random) -> bytes:
    """Byte-level damage of ``raw``."""
    b = bytearray(raw)
    r = rng.random()
    pos = rng.randrange(len(b) + 1)
    if r < 0.25 and b:
        b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
    elif r < 0.4:
        del b[pos:]
    elif r < 0.55:
        b[pos:pos] = bytes([rng.randrange(256)])
    elif r < 0.65:
        b[pos:pos] = b"[" * rng.choice([33, 1000, 100_000])
    elif r < 0.72:
        b = bytearray(b"\xef\xbb\xbf" + bytes(b))
    elif r < 0.8:
        b[pos:pos] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])
    elif r < 0.88:
        b = bytearray(rng.choice([b"[" * 100_000, b"{\"a\":" * 50_000, b"", b"null", b"NaN", b"1e999", b"[]"]))
    else:
        b[pos:pos] = rng.choice([b"NaN", b"Infinity", b"-", b'"', b"\\", b",", b"}"])
    return bytes(b)


def case(base: Any, base_raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One case: (kind, bytes)."""
    r = rng.random()
    if r < 0.15:
        return "same", same(base, rng)
    if r < 0.75:
        return "edit", edit(base, rng)
    return "bytes", damage(base_raw, rng)
