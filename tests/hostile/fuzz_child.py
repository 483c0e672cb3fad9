"""One batch of the reader fuzz, run in a fresh process with a memory limit (tests/hostile/test_reader_fuzz.py).

    python -m tests.hostile.fuzz_child READER SEED START COUNT MEMORY_MB CASE_SECONDS

READER is ``manifest``, ``tuning``, ``patches``, ``pack`` or ``zip`` (the pack reader under zip-level damage,
tests/hostile/zipmutate.py). Cases START .. START+COUNT-1 of the stream that
SEED gives (case i always uses ``random.Random(f"{SEED}:{READER}:{i}")``, so a batch can restart after any case).
Each case is read through the reader's public entry and classified; one line per case goes to stdout, flushed
before the next case starts, so the parent knows which case a crash or a hang happened in:

    <i> <kind> <outcome> [<detail>]

outcome: ``refused`` (a flyship error), ``accepted`` (the oracle agrees with what was read), ``raw`` (any other
exception), ``wrong`` (accepted, but what was read is not what the document says, or not a valid value),
``wrongly-refused`` (a re-serialized base document refused), ``hang`` (over CASE_SECONDS). A crash is the parent's
to see (the process ends mid-case).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import traceback
import zipfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "loader" / "data" / "tiny"
# The target grammar, written out independently of flyship.bundle.targets: canonical text only.
CANON_TARGET = re.compile(r"gfx[0-9a-f]{2,6}(:sramecc[+-])?(:xnack[+-])?|sm_[1-9][0-9]{1,3}a?")
INT64 = (-(1 << 63), (1 << 63) - 1)


class Hang(BaseException):
    """Raised by the per-case alarm (a BaseException: no reader's ``except Exception`` swallows it)."""


class Wrong(Exception):
    """The oracle disagrees with what the reader accepted."""


def need(cond: bool, what: str) -> None:
    if not cond:
        raise Wrong(what)


def same_json(a: Any, b: Any) -> bool:
    """JSON equality that tells bools from ints (Python says ``True == 1``)."""
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(
            same_json(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same_json(x, y) for x, y in zip(a, b)))
    return (type(a) is bool) == (type(b) is bool) and a == b


def plain(raw: bytes) -> Any:
    """The document as the standard library reads it (the oracle's own reading)."""
    return json.loads(raw.decode("utf-8"))


# -- tuning tables -------------------------------------------------------------------------------------------

TUNING = {"format": "flyship-tuning", "version": "1.0", "namespace": "ns",
          "keys": {"gemm": ["a.shape[0]", "b.shape[1]"], "add": ["x.numel"]},
          "entries": [{"op": "gemm", "target": "gfx942:sramecc+:xnack-", "cus": 304, "key": [16, 4096],
                       "spec": "cfg3", "us": {"cfg0": 12.5, "cfg3": 9.1}},
                      {"op": "gemm", "target": "gfx942", "cus": None, "key": [1, 1], "spec": "cfg0", "us": {}},
                      {"op": "add", "target": "sm_90a", "cus": 132, "key": [1024], "spec": "s", "us": {"s": 1}},
                      {"op": "add", "target": "gfx950", "key": [65536], "spec": "t"}]}


def tuning_reader(tmp: Path) -> tuple[Any, Callable[[bytes], Any], Callable[[bytes, Any], None]]:
    from flyship.bundle import tuning as tt

    path = tmp / "tuning.json"

    def read(raw: bytes) -> Any:
        path.write_bytes(raw)
        return tt.read(path)

    def check(raw: bytes, t: Any) -> None:
        doc = plain(raw)
        need(type(doc) is dict and doc.get("format") == "flyship-tuning", "format")
        need(type(doc["version"]) is str and doc["version"].split(".")[0] == "1" and t.version == doc["version"],
             "version")
        lenient = int(doc["version"].split(".")[1]) > 0
        need(lenient or set(doc) <= {"format", "version", "namespace", "keys", "entries"}, "unknown top key")
        need(same_json(t.namespace, doc["namespace"]) and type(doc["namespace"]) is str, "namespace")
        need(same_json({k: list(v) for k, v in t.keys.items()}, doc["keys"]), "keys")
        need(all(type(x) is str and x for v in doc["keys"].values() for x in v), "key expressions")
        need(len(t.entries) == len(doc["entries"]), "entry count")
        for e, d in zip(t.entries, doc["entries"]):
            need(lenient or set(d) <= {"op", "target", "cus", "key", "spec", "us"}, "unknown entry key")
            need(same_json([e.op, e.target, e.cus, list(e.key), e.spec],
                           [d["op"], d["target"], d.get("cus"), d["key"], d["spec"]]), "entry values")
            need(CANON_TARGET.fullmatch(d["target"]) is not None, f"target {d['target']!r}")
            need(d.get("cus") is None or (type(d["cus"]) is int and d["cus"] > 0), "cus")
            need(all(type(x) is int and INT64[0] <= x <= INT64[1] for x in d["key"]), "key values")
            us = d.get("us", {})
            need(e.us == us and all(type(v) in (int, float) and math.isfinite(v) for v in us.values()), "us")

    return TUNING, read, check


# -- the hook's patches file ---------------------------------------------------------------------------------

PATCHES = {"bundle": "artifacts/triton", "namespace": None,
           "patches": [{"target": "mymodel.layers:RMSNorm.forward", "op": "rmsnorm",
                        "args": {"x": "hidden", "w": "self.weight", "eps": {"const": 1e-6}},
                        "inplace": None, "ignore": ["residual"], "cpu_target": "gfx942"},
                       {"target": "mymodel:gelu", "op": "gelu"}]}


def patches_reader(tmp: Path) -> tuple[Any, Callable[[bytes], Any], Callable[[bytes, Any], None]]:
    from flyship.loader.tools import hook

    path = tmp / "patches.json"

    def dotted(x: Any) -> bool:
        return type(x) is str and bool(x) and all(p.isidentifier() for p in x.split("."))

    def read(raw: bytes) -> Any:
        path.write_bytes(raw)
        return hook.read_patches(path)

    def check(raw: bytes, pf: Any) -> None:
        doc = plain(raw)
        need(type(doc) is dict and set(doc) <= {"bundle", "namespace", "patches"}, "top keys")
        need(type(doc["bundle"]) is str and pf.bundle == path.parent.resolve() / doc["bundle"], "bundle")
        need(same_json(pf.namespace, doc.get("namespace")), "namespace")
        need(len(pf.patches) == len(doc["patches"]), "patch count")
        for s, d in zip(pf.patches, doc["patches"]):
            need(set(d) <= {"target", "op", "args", "inplace", "ignore", "cpu_target"}, "patch keys")
            module, _, qual = d["target"].partition(":")
            need(dotted(module) and dotted(qual) and d["op"].isidentifier(), f"target {d['target']!r}")
            need(same_json([s.target, s.op, s.args, s.inplace, list(s.ignore), s.cpu_target],
                           [d["target"], d["op"], d.get("args") or {}, d.get("inplace"), d.get("ignore") or [],
                            d.get("cpu_target")]), "patch values")
            need(all(dotted(v) or (type(v) is dict and set(v) == {"const"}) for v in s.args.values()), "args")
            need(s.cpu_target is None or CANON_TARGET.fullmatch(s.cpu_target) is not None, "cpu_target")

    return PATCHES, read, check


# -- manifests -----------------------------------------------------------------------------------------------

def small_manifest() -> dict:
    """The tiny bundle's manifest cut to its first op, specialization and variant (a parse costs ~2 ms)."""
    d = json.loads((TINY / "manifest.json").read_text())
    op = d["ops"][0]
    op["specializations"] = op["specializations"][:1]
    op["specializations"][0]["variants"] = op["specializations"][0]["variants"][:1]
    d["ops"] = [op]
    return d


def manifest_reader(tmp: Path) -> tuple[Any, Callable[[bytes], Any], Callable[[bytes, Any], None]]:
    from flyship.bundle import manifest as M

    def read(raw: bytes) -> Any:
        return M.parse(raw, "fuzz/manifest.json")

    def covers(doc: Any, out: Any, lenient: bool, where: str) -> None:
        """Every value of the document is what was read (the reader may add defaults, never change a value)."""
        if isinstance(doc, dict):
            need(isinstance(out, dict), f"{where}: object")
            for k, v in doc.items():
                if k in out:
                    covers(v, out[k], lenient, f"{where}.{k}")
                else:
                    need(lenient, f"{where}.{k}: unknown key accepted")
        elif isinstance(doc, list):
            need(isinstance(out, (list, tuple)) and len(out) == len(doc), f"{where}: list")
            for i, (a, b) in enumerate(zip(doc, out)):
                covers(a, b, lenient, f"{where}[{i}]")
        else:
            need(same_json(doc, out) or (type(doc) is int and type(out) is float and doc == out), f"{where}: value")

    def check(raw: bytes, m: Any) -> None:
        doc = plain(raw)
        minor = int(str(doc.get("schema_version", "0.0")).split(".")[1])
        covers(doc, M.to_json_data(m), minor > M.NEWEST_MINOR.get(int(m.schema_version.split(".")[0]), 99), "")
        for op in m.ops:
            for s in op.specializations:
                for v in s.variants:
                    need(CANON_TARGET.fullmatch(v.target) is not None, f"target {v.target!r}")

    return small_manifest(), read, check


# -- the pack index ------------------------------------------------------------------------------------------

def pack_reader(tmp: Path) -> tuple[Any, Callable[[bytes], Any], Callable[[bytes, Any], None]]:
    from flyship.bundle import pack as P

    # A real pack's index and members, cut to three members (building the zip is most of a case's cost; the
    # reader under test is the index: its parse, its types, its agreement with the members).
    blob = P.pack_bytes(TINY)
    keep = ("manifest.json", "references.py", "add.f32.gfx942.hsaco")
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        members = {n: z.read(n) for n in keep}
        index = json.loads(z.read(P.INDEX_NAME))
    index["members"] = {n: index["members"][n] for n in keep}
    cache, path = tmp / "cache", tmp / "t.flyship"

    def read(raw: bytes) -> Any:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
            z.writestr(P.INDEX_NAME, raw)
            for n, b in members.items():
                z.writestr(n, b)
        path.write_bytes(buf.getvalue())
        return P.open_pack(path, cache=cache, trusted_keys=None)

    def check(raw: bytes, folder: Any) -> None:
        try:
            doc = plain(raw)
            need(type(doc) is dict and set(doc) == {"format", "version", "members"}, "index keys")
            need(doc["format"] == "flyship-pack" and type(doc["version"]) is int and doc["version"] == 1, "version")
            need(same_json(doc["members"], {n: hashlib.sha256(b).hexdigest() for n, b in members.items()}),
                 "members")
            got = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.name != P.INDEX_NAME}
            need(got == members, "extracted files")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return index, read, check


def zip_reader(tmp: Path) -> tuple[Any, Callable[[bytes], Any], Callable[[bytes, Any], None]]:
    """The pack reader under zip-level damage (tests/hostile/zipmutate.py): the base is a whole pack's bytes."""
    from flyship.bundle import pack as P

    blob = P.pack_bytes(TINY)
    keep = ("manifest.json", "references.py", "add.f32.gfx942.hsaco")
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        members = {n: z.read(n) for n in keep}
        index = json.loads(z.read(P.INDEX_NAME))
    index["members"] = {n: index["members"][n] for n in keep}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(P._info(P.INDEX_NAME), json.dumps(index, sort_keys=True))
        for n in keep:
            z.writestr(P._info(n), members[n])
    cache, path = tmp / "cache", tmp / "t.flyship"

    def read(raw: bytes) -> Any:
        path.write_bytes(raw)
        return P.open_pack(path, cache=cache, trusted_keys=None)

    def check(raw: bytes, folder: Any) -> None:
        try:
            got = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.name != P.INDEX_NAME}
            need(got == members, "extracted files")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return buf.getvalue(), read, check


READERS = {"tuning": tuning_reader, "patches": patches_reader, "manifest": manifest_reader, "pack": pack_reader,
           "zip": zip_reader}


def run_case(read: Callable, check: Callable, kind: str, raw: bytes, base_value: Any) -> tuple[str, str]:
    from flyship.errors import FlyshipError

    try:
        value = read(raw)
    except FlyshipError as e:
        if kind == "same":
            return "wrongly-refused", f"{type(e).__name__}: {e}"[:300]
        return "refused", ""
    except Hang:
        raise
    except BaseException as e:  # noqa: BLE001 - what this fuzz looks for
        return "raw", "".join(traceback.format_exception_only(type(e), e)).strip()[:300]
    try:
        check(raw, value)
        if kind == "same" and base_value is not None and not isinstance(value, Path):
            need(value == base_value, "a re-serialized base document reads differently")
    except Hang:
        raise
    except BaseException as e:  # noqa: BLE001 - the oracle's own failure is a finding too
        return "wrong", f"{type(e).__name__}: {e}"[:300]
    return "accepted", ""


def main(argv: list[str]) -> int:
    reader, seed, start, count, memory_mb, case_s = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4]), \
        float(argv[5])
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    sys.path.insert(0, str(ROOT))
    from tests.hostile import mutate, zipmutate

    def alarm(*_: Any) -> None:
        raise Hang()

    signal.signal(signal.SIGALRM, alarm)
    # A memory file system where there is one: each case writes its input there (on this machine's disk, truncating
    # and rewriting a file costs milliseconds; in /dev/shm, microseconds).
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="flyship-fuzz-", dir=shm) as tmp:
        base, read, check = READERS[reader](Path(tmp))
        base_raw = base if isinstance(base, bytes) else json.dumps(base).encode()
        base_value = read(base_raw)
        check(base_raw, base_value)  # the base itself must read right, or the fuzz proves nothing
        if isinstance(base_value, Path):
            base_value = None
        for i in range(start, start + count):
            rng = random.Random(f"{seed}:{reader}:{i}")
            kind, raw = zipmutate.case(base, rng) if reader == "zip" else mutate.case(base, base_raw, rng)
            signal.setitimer(signal.ITIMER_REAL, case_s)
            try:
                outcome, detail = run_case(read, check, kind, raw, base_value)
            except Hang:
                outcome, detail = "hang", f"over {case_s} s"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout.write(f"{i}\t{kind}\t{outcome}\t{detail.replace(chr(10), ' ')}\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
