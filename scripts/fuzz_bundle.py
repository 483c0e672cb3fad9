"""Fuzz the bundle readers and report every exception outside flyship's own error types.

    python scripts/fuzz_bundle.py [--cases 10000] [--seed 0] [--target manifest|hsaco|cubin|all]

Targets (each gets ``--cases`` cases):

* ``manifest``: random edits of the tiny bundle's real manifest (replace / delete / insert a value at a
  random JSON path, with values of every JSON type and edge values) and random byte-level damage of the
  file, read with :func:`flyship.bundle.manifest.parse`; every outcome must be a manifest or a BundleError.
* ``hsaco`` / ``cubin``: the tiny bundle's and tests/compiler/data's code objects, truncated and
  bit-flipped, checked with :func:`flyship.bundle.rules.check_code_object` against their real variants;
  every outcome must be a pass or a BundleError.

Prints one line per target (cases, refused, accepted, escaped) and the first escapes with their
tracebacks; exits 1 if anything escaped. Needs only the bundle tier (stdlib, msgpack, pyelftools).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from flyship.bundle import manifest as M
from flyship.bundle import rules
from flyship.errors import FlyshipError

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "tests" / "loader" / "data" / "tiny"
COMPILER_DATA = REPO / "tests" / "compiler" / "data"

EDGE_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 3, 2**31, 2**32, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 0.5, -0.0, 1e308, 1e-308,
    "", "x", "float32", "aten", "../x", "/etc/passwd", "\ud800", "a" * 5000, "x.shape[0]", "1" * 50, "cdiv(x, 0)",
    [], [0], [1, 1, 1], [0, 0, 0], [-1, 1, 1], [2048, 1, 1], ["1", "1", "1"], {}, {"a": 1}, [[[[]]]],
]


def json_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += json_paths(v, prefix + (i,))
    return out


def random_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if r < 0.6 or depth > 2:
        return rng.choice(EDGE_VALUES)
    if r < 0.8:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["name", "kind", "x", "rank", "offset"]): random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def edit_manifest(base: dict, rng: random.Random) -> bytes:
    """One random edit of the manifest, as the bytes a reader would see."""
    data = copy.deepcopy(base)
    paths = json_paths(data)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        if not path:
            continue
        parent = data
        try:
            for p in path[:-1]:
                parent = parent[p]
            key = path[-1]
            op = rng.random()
            if op < 0.7:
                parent[key] = random_value(rng)
            elif op < 0.85:
                del parent[key]
            elif isinstance(parent, list):
                parent.insert(key, copy.deepcopy(rng.choice(parent)) if parent and rng.random() < 0.5
                              else random_value(rng))
            else:
                parent[rng.choice(["extra", "name", "format"])] = random_value(rng)
        except (KeyError, IndexError, TypeError):
            pass  # the path went away with an earlier edit
    text = json.dumps(data, sort_keys=True, indent=1, ensure_ascii=rng.random() < 0.5)
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.15:  # byte-level damage: flips, truncation, a stray invalid UTF-8 byte
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] = rng.choice([0xFF, 0xC3, 0x00, b[i] ^ (1 << rng.randrange(8))])
        if rng.random() < 0.3:
            b = b[:rng.randrange(len(b))]
        raw = bytes(b)
    return raw


def damage(data: bytes, rng: random.Random) -> bytes:
    """Truncate, flip bits or overwrite words of an ELF image."""
    b = bytearray(data)
    r = rng.random()
    if r < 0.25:
        return bytes(b[:rng.randrange(len(b))])
    n = rng.choice([1, 1, 2, 4, 16])
    for _ in range(n):
        i = rng.randrange(len(b))
        if rng.random() < 0.7:
            b[i] ^= 1 << rng.randrange(8)
        else:
            word = rng.choice([0, 0xFF, 0x7F, 0x80])
            for j in range(i, min(i + rng.choice([1, 2, 4, 8]), len(b))):
                b[j] = word
    if r > 0.9:
        b = b[:rng.randrange(len(b))]
    return bytes(b)


def code_object_cases(fmt: str) -> list[tuple[M.Variant, bytes, str]]:
    """(variant, file bytes, label) of every real code object of format ``fmt`` the tests carry."""
    out = []
    m = M.read(TINY)
    for where, v in rules.iter_variants(m):
        if v.code_object.format == fmt:
            out.append((v, (TINY / v.code_object.file).read_bytes(), where))
    if fmt == "hsaco":
        for path in sorted(COMPILER_DATA.glob("*.hsaco")):
            # No manifest entry: check it against itself (facts read from the undamaged file).
            data = path.read_bytes()
            from flyship.bundle.codeobject import CodeObjectFile

            co = CodeObjectFile(data, str(path))
            k = co.kernel()
            symbol = str(k[".name"])
            meta = co.kernel_metadata(symbol)
            v = m.ops[0].specializations[0].variants[0]
            v = M.Variant(target=co.target or "gfx942", code_object=M.CodeObject(
                file=path.name, sha256="0" * 64, format="hsaco", target=co.target, symbol=symbol),
                metadata=meta, kernargs=v.kernargs, launch=M.Launch(grid=("1", "1", "1"), block=(64, 1, 1)),
                proof=v.proof, toolchain={})
            out.append((v, data, path.name))
    return out


def run(target: str, cases: int, seed: int, on_escape: Callable[[str, BaseException], None]) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"cases": 0, "refused": 0, "accepted": 0, "escaped": 0}
    if target == "manifest":
        base = json.loads((TINY / M.MANIFEST_NAME).read_text())

        def one() -> None:
            M.parse(edit_manifest(base, rng), "fuzz/manifest.json")
    else:
        pool = code_object_cases(target)

        def one() -> None:
            v, data, label = rng.choice(pool)
            rules.check_code_object(v, damage(data, rng), label)
    for _ in range(cases):
        counts["cases"] += 1
        try:
            one()
            counts["accepted"] += 1
        except FlyshipError:
            counts["refused"] += 1
        except BaseException as e:  # noqa: BLE001 - what we are looking for
            if isinstance(e, KeyboardInterrupt):
                raise
            counts["escaped"] += 1
            on_escape(target, e)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", choices=["manifest", "hsaco", "cubin", "all"], default="all")
    args = ap.parse_args(argv)
    shown: list[str] = []

    def on_escape(target: str, e: BaseException) -> None:
        if len(shown) < 5:
            shown.append(f"--- {target}: {type(e).__name__}: {e}\n{''.join(traceback.format_exception(e))[-2000:]}")

    escaped = 0
    for t in (["manifest", "hsaco", "cubin"] if args.target == "all" else [args.target]):
        t0 = time.monotonic()
        c = run(t, args.cases, args.seed, on_escape)
        escaped += c["escaped"]
        print(f"{t:9} cases {c['cases']:6}  refused {c['refused']:6}  accepted {c['accepted']:6}  "
              f"escaped {c['escaped']:4}  ({time.monotonic() - t0:.1f} s)")
    for s in shown:
        print(s, file=sys.stderr)
    return 1 if escaped else 0


if __name__ == "__main__":
    sys.exit(main())
