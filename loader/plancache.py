"""What ``flyship.load`` keeps of a checked manifest, and the per-user cache that makes a load independent of
how many variants a bundle holds.

A :class:`BundlePlan` is a manifest that passed the rule book, split the way load uses it:

* the *head*: the manifest with every op's specializations left out (op names, arguments, outputs, backward,
  references): all that op registration (schemas, fake and CPU kernels, autograd) and the references need;
* per op, its specialization names and each one's variant targets (the C++ core's target selection);
* per op, read on first use: the full :class:`~flyship.bundle.manifest.Op` (a variant's code-object check,
  ``OpHandle.manifest``) and its lowered specializations (:func:`flyship.loader.plan.lower_specs`, what the
  core parses when the op is first called).

The plan cache (``FLYSHIP_PLAN_CACHE``, default ``~/.cache/flyship/plans``) holds one file per bundle: the
:class:`BundlePlan` of a manifest that passed :func:`flyship.bundle.manifest.parse` (every rule of the rule book)
and was lowered, as msgpack, keyed by the sha256 of the manifest's bytes, flyship's version, the plan version and
the sha256 of the Python code that checks and lowers (the ``flyship.bundle`` modules, ``plan.py``, this file). A
load with a warm cache reads the file's header only (the head, the per-op names and targets); each op's blobs (its
JSON data, its lowered specializations) are read when the op is first used, so a load costs about the same for 20
variants or 2,000. The header and each blob carry their sha256, and the header the key it was written under: a file
that is truncated, damaged, written for another key or owned by another user but root (the digests detect damage,
not intent) is ignored and rewritten; it is never an authority (everything in it is derived from bytes the
manifest's sha256 covers). Writes are atomic (:func:`flyship.bundle.files.atomic_write`), so concurrent loads of
one bundle (torchrun ranks) never read half a file; a folder that cannot be written only costs the next load the
cold path.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import functools
import hashlib
import itertools
import os
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Optional

import msgpack

from flyship import env
from flyship.bundle import manifest as _m
from flyship.bundle.errors import BundleError
from flyship.bundle.files import atomic_write
from flyship.loader import plan as _plan

CACHE_FORMAT = 1
_MAGIC = b"flyship-plan\n"
_DIGEST = 32  # bytes of a sha256
_MAX_HEADER = 1 << 30


class _Corrupt(Exception):
    """A cache file that cannot be trusted (truncated, damaged, another key): ignored and rebuilt."""


def _light(op: _m.Op) -> _m.Op:
    return dataclasses.replace(op, specializations=())


class BundlePlan:
    """A checked manifest as :func:`flyship.load` uses it: the head now, each op's details on first use.

    Attributes:
        head: the manifest with every op's ``specializations`` empty.
        spec_names: per op, its specialization names in manifest order.
        spec_targets: per op, per specialization, its variants' targets in manifest order.
        spec_ids: per op, per specialization, the variant ids it takes: one per variant and one per following
            launch (``then``, schema 1.2), in :func:`flyship.bundle.rules.iter_variants` order.
    """

    def __init__(self, head: _m.Manifest, spec_names: list[tuple[str, ...]],
                 spec_targets: list[list[tuple[str, ...]]], read_spec: Callable[[int, int], _m.Specialization],
                 read_specs: Callable[[int], list[dict[str, Any]]], spec_ids: list[list[int]],
                 op_data: Optional[list[Any]] = None) -> None:
        self.head = head
        self._op_data = op_data  # each op's JSON data as the manifest holds it, when at hand (for to_bytes)
        self.spec_names = spec_names
        self.spec_targets = spec_targets
        self._read_spec = read_spec
        self._read_specs = read_specs
        self._specs: dict[tuple[int, int], _m.Specialization] = {}
        self._ops: dict[int, _m.Op] = {}
        self._lock = threading.Lock()
        self._manifest: Optional[_m.Manifest] = None
        self.spec_ids = spec_ids
        counts = [sum(per_op) for per_op in spec_ids]
        self._first = [0, *itertools.accumulate(counts)][:-1]  # bundle-wide id of each op's first variant
        self.n_variants = sum(counts)

    @classmethod
    def of(cls, m: _m.Manifest, data: Optional[dict] = None) -> "BundlePlan":
        """The plan of a manifest in memory (already checked by the rule book), and optionally the JSON object it
        was read from; specializations are lowered on first use."""
        head = dataclasses.replace(m, ops=tuple(_light(op) for op in m.ops))
        return cls(head, [tuple(s.name for s in op.specializations) for op in m.ops],
                   [[tuple(v.target for v in s.variants) for s in op.specializations] for op in m.ops],
                   lambda k, s: m.ops[k].specializations[s], lambda k: _plan.lower_specs(m.ops[k]),
                   [[sum(1 + len(v.then) for v in s.variants) for s in op.specializations] for op in m.ops],
                   None if data is None else data["ops"])

    def with_head(self, head: _m.Manifest) -> "BundlePlan":
        """This plan with another head of the same ops and specializations (outputs resolved for the device's
        target, :mod:`flyship.loader.target_dtypes`); the plan itself is unchanged (a cached plan is shared)."""
        new = copy.copy(self)
        new.head, new._op_data, new._manifest = head, None, None
        new._ops, new._lock = {}, threading.Lock()
        return new

    # -- what load reads lazily ----------------------------------------------------------------------------

    def spec(self, k: int, s: int) -> _m.Specialization:
        """Specialization ``s`` of op ``k`` (read on first use)."""
        sp = self._specs.get((k, s))
        if sp is None:
            with self._lock:
                sp = self._specs.get((k, s))
                if sp is None:
                    sp = self._specs[(k, s)] = self._read_spec(k, s)
        return sp

    def op(self, k: int) -> _m.Op:
        """Op ``k`` with its specializations (each read on first use)."""
        op = self._ops.get(k)
        if op is None:
            op = dataclasses.replace(self.head.ops[k],
                                     specializations=tuple(self.spec(k, s) for s in range(len(self.spec_names[k]))))
            self._ops[k] = op
        return op

    def specs(self, k: int) -> list[dict[str, Any]]:
        """Op ``k``'s specializations as :func:`flyship.loader.plan.lower_specs` gives them (the core's
        ``specs`` callable; the core keeps what it parsed, so this is asked once per op)."""
        return self._read_specs(k)

    @property
    def manifest(self) -> _m.Manifest:
        """The whole manifest (every op read)."""
        if self._manifest is None:
            self._manifest = dataclasses.replace(self.head, ops=tuple(self.op(k) for k in range(len(self.head.ops))))
        return self._manifest

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(sorted({t for per_op in self.spec_targets for ts in per_op for t in ts}))

    def variant(self, variant_id: int) -> tuple[str, _m.Variant]:
        """``(where, variant)`` of a bundle-wide variant id (manifest order: ops, specializations, variants), with
        ``where`` as :func:`flyship.bundle.rules.iter_variants` names it."""
        if not 0 <= variant_id < self.n_variants:
            raise IndexError(f"variant id {variant_id} out of range 0..{self.n_variants - 1}")
        k = bisect.bisect_right(self._first, variant_id) - 1
        i = variant_id - self._first[k]
        for si, n in enumerate(self.spec_ids[k]):
            if i < n:
                s = self.spec(k, si)  # only this specialization is read
                where = f"op {self.head.ops[k].name} specialization {s.name} target"
                for v in s.variants:  # each variant, then its following launches (rules.iter_variants)
                    if i == 0:
                        return f"{where} {v.target} ({v.code_object.file})", v
                    if i <= len(v.then):
                        t = v.then[i - 1]
                        return f"{where} {v.target} launch {i + 1} ({t.code_object.file})", t
                    i -= 1 + len(v.then)
                break
            i -= n
        raise IndexError(f"variant id {variant_id}: the op's specializations hold fewer than its head says")

    # -- the cache file -----------------------------------------------------------------------------------
    #
    # MAGIC | u64 little-endian header length | sha256 of the header | header (msgpack) | blobs.
    # header: {"format", "key", "head": the head manifest's JSON data, "ops": [{"specs": names, "targets": per spec
    # the variant targets, "op": [offset, length, sha256], "plan": [offset, length, sha256]}]}; offsets count from
    # the first blob. "op" is the op's JSON data (msgpack), "plan" its lowered specializations (msgpack). A load
    # reads and checks the header only; a blob is read, and checked against its sha256, on the op's first use.

    def to_bytes(self, key: str) -> bytes:
        """The cache file's bytes (lowers every op now)."""
        blobs: list[bytes] = []
        ops = []

        def blob(data: bytes) -> list[Any]:
            offset = sum(len(b) for b in blobs)
            blobs.append(data)
            return [offset, len(data), hashlib.sha256(data).digest()]

        for k in range(len(self.head.ops)):
            ops.append({
                "specs": list(self.spec_names[k]),
                "targets": [list(t) for t in self.spec_targets[k]],
                "ids": list(self.spec_ids[k]),
                "op": blob(msgpack.packb(_m.to_json_obj(self.op(k)) if self._op_data is None else self._op_data[k])),
                "plan": blob(msgpack.packb(self.specs(k))),
            })
        header = msgpack.packb({"format": CACHE_FORMAT, "key": key, "head": _m.to_json_data(self.head), "ops": ops})
        return b"".join([_MAGIC, struct.pack("<Q", len(header)), hashlib.sha256(header).digest(), header, *blobs])

    @classmethod
    def from_file(cls, path: Path, key: str, rebuild: Callable[[], "BundlePlan"]) -> "BundlePlan":
        """A plan from a cache file, reading its header only; each op's blobs are read when first used. A blob
        that no longer matches its sha256 (the file was damaged or replaced meanwhile) is not used: the plan is
        rebuilt from the manifest (``rebuild()``) and answers from there.

        Raises:
            _Corrupt: the file is not a good cache file of ``key`` (damaged, truncated, another key or format).
            OSError: it cannot be read.
        """
        with open(path, "rb") as fh:
            if hasattr(os, "getuid") and os.fstat(fh.fileno()).st_uid not in (os.getuid(), 0):
                # its digests show damage, not intent: only the user's own files (or root's: a cache baked into an
                # image) are trusted; a shared folder could hold another user's plan with other kernarg offsets
                raise _Corrupt("written by another user")
            intro = fh.read(len(_MAGIC) + 8 + _DIGEST)
            if len(intro) != len(_MAGIC) + 8 + _DIGEST or not intro.startswith(_MAGIC):
                raise _Corrupt("not a plan cache file")
            (n,) = struct.unpack_from("<Q", intro, len(_MAGIC))
            header = fh.read(min(n, _MAX_HEADER))
        if len(header) != n or hashlib.sha256(header).digest() != intro[-_DIGEST:]:
            raise _Corrupt("the header's sha256 differs")
        base = len(intro) + n
        try:
            obj = msgpack.unpackb(header)
            if obj["format"] != CACHE_FORMAT or obj["key"] != key:
                raise _Corrupt("another key or format")
            head = _m.from_json_obj(obj["head"])
            ops = obj["ops"]
            if len(ops) != len(head.ops):
                raise _Corrupt("op count")
            names = [tuple(o["specs"]) for o in ops]
            targets = [[tuple(t) for t in o["targets"]] for o in ops]
            ids = [[int(n) for n in o["ids"]] for o in ops]
            where = {(k, part): (int(o[part][0]), int(o[part][1]), bytes(o[part][2]))
                     for k, o in enumerate(ops) for part in ("op", "plan")}
        except _Corrupt:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a damaged or foreign file makes msgpack or the reader raise
            raise _Corrupt(f"{type(e).__name__}: {e}") from None
        rebuilt: list[BundlePlan] = []

        def blob(k: int, part: str) -> Optional[Any]:
            offset, length, digest = where[(k, part)]
            try:
                with open(path, "rb") as fh:
                    fh.seek(base + offset)
                    data = fh.read(length)
                if hashlib.sha256(data).digest() == digest:
                    return msgpack.unpackb(data)
            except (OSError, ValueError, msgpack.UnpackException):
                pass
            return None

        def fallback() -> "BundlePlan":
            if not rebuilt:
                rebuilt.append(rebuild())
            return rebuilt[0]

        op_data: dict[int, Any] = {}  # each op's JSON data, decoded once (the reader then runs per specialization)

        def read_spec(k: int, s: int) -> _m.Specialization:
            if k not in op_data:
                op_data[k] = blob(k, "op")
            data = op_data[k]
            if data is None:
                return fallback().spec(k, s)
            return _m.part_from_json_obj(_m.Specialization, data["specializations"][s], head.schema_version,
                                         f"plan cache {path.name} ops[{k}].specializations[{s}]")

        def read_specs(k: int) -> list[dict[str, Any]]:
            data = blob(k, "plan")
            return fallback().specs(k) if data is None else data

        return cls(head, names, targets, read_spec, read_specs, ids)


# ---------------------------------------------------------------------------------------------------------
# The cache


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the Python code whose output the cache keeps: the rule book and manifest reader (every module of
    ``flyship.bundle``), the lowering (``plan.py``) and this file, each by its path, size and modification time
    (``stat``: a load does not read 30-odd source files, ~2-4 ms of a first load). Editing, reinstalling or checking
    out another version of any of them changes its size or time, so a changed rule invalidates every entry; two
    copies of the same code get separate entries (a cold load each, never a wrong plan)."""
    h = hashlib.sha256()
    files = sorted(Path(_m.__file__).parent.rglob("*.py")) + [Path(_plan.__file__), Path(__file__)]
    for f in files:
        st = f.stat()
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def cache_key(manifest_sha256: str) -> str:
    """The cache key of a manifest: its sha256, flyship's version, the plan and cache formats, the code."""
    from flyship import version

    text = (f"manifest {manifest_sha256}\nflyship {version.__version__}\nplan {_plan.PLAN_VERSION}\n"
            f"cache {CACHE_FORMAT}\ncode {code_fingerprint()}\n")
    return hashlib.sha256(text.encode()).hexdigest()


def _write(path: Path, data: bytes) -> bool:
    """Write a cache file atomically (:func:`flyship.bundle.files.atomic_write`); False when the folder cannot be
    written (left alone: the cache is an optimisation)."""
    try:
        atomic_write(path, data)
        return True
    except OSError:
        return False


def load_plan(raw: bytes, manifest_sha256: str, where: str, manifest_path: Optional[Path] = None) -> BundlePlan:
    """The :class:`BundlePlan` of the manifest bytes ``raw`` (whose sha256 is ``manifest_sha256``): from the plan
    cache when it holds a good file for them; else parsed and checked by the rule book
    (:func:`flyship.bundle.manifest.parse`), lowered, and written to the cache.

    Raises:
        BundleError: the manifest is invalid (only on the cold path: a cache file exists only for a manifest
            that passed every rule), naming ``where`` and the JSON path.
    """
    folder = env.plan_cache_dir()
    if folder is None:
        return BundlePlan.of(_m.parse(raw, where))
    key = cache_key(manifest_sha256)
    path = folder / f"{key}.msgpack"

    def rebuild() -> BundlePlan:
        # A blob went bad after the header was read: the manifest file is read again, and used only if it is still
        # the manifest the load hashed.
        again, _ = _m.read_bytes(manifest_path) if manifest_path is not None else (raw, where)
        if hashlib.sha256(again).hexdigest() != manifest_sha256:
            raise BundleError(f"read bundle: {where} changed after it was loaded (its sha256 differs); load the "
                              "bundle again in a new process")
        plan = BundlePlan.of(*_m.parse_json(again, where))
        _write(path, plan.to_bytes(key))
        return plan

    try:
        return BundlePlan.from_file(path, key, rebuild)
    except (OSError, _Corrupt):
        pass
    plan = BundlePlan.of(*_m.parse_json(raw, where))
    if _write(path, plan.to_bytes(key)):  # lowers every op: lowering refusals surface at this load
        try:  # the written file's blobs, each read on its op's first use, rather than lowering again then
            return BundlePlan.from_file(path, key, rebuild)
        except (OSError, _Corrupt):
            pass
    return plan
