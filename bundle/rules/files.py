"""Rules on files: containment in the bundle, size limits and sha256; every file a manifest names, read once."""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Iterator, Optional

from flyship.bundle import files as _files
from flyship.bundle import limits as L
from flyship.bundle import model as _m
from flyship.bundle.rules.codeobjects import check_code_object
from flyship.bundle.rules.common import fail as _fail


def check_relative_path(rel: str, where: str) -> None:
    """A path the manifest names: relative, inside the bundle lexically (no ``..``, no drive, no NUL)."""
    p = Path(rel)
    if (not rel or "\x00" in rel or "\\" in rel or p.is_absolute() or ".." in p.parts or len(rel) > L.MAX_STRING
            or p.drive):
        raise _fail(where, f"expected a path inside the bundle, got {rel[:80]!r}")


def contained_path(root: Path, rel: str, where: str) -> Path:
    """``root / rel`` resolved (links followed), refused unless it stays inside the resolved ``root``."""
    check_relative_path(rel, where)
    base = Path(root).resolve()
    try:
        path = (base / rel).resolve()
    except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13, OSError (ELOOP) since
        raise _fail(where, f"expected a file inside the bundle at {base / rel}, found "
                           f"{_files.found_at(base / rel)}; re-copy the bundle without links") from None
    if path != base and base not in path.parents:
        raise _fail(where, f"expected a file inside the bundle {base}, but {rel!r} resolves to {path} (a link "
                           "leads out); re-copy the bundle without links")
    return path


def read_bundle_file(root: Path, rel: str, sha256: Optional[str], limit: int, where: str,
                     what: str = "file") -> bytes:
    """A file the manifest names (``what``: "code object", "references module"...): contained in the
    bundle, a regular file of at most ``limit`` bytes (checked before reading), whose sha256 is the
    manifest's (``None``: not checked, for 1.0 bundles).

    Raises:
        BundleError: escape, missing file, oversize file, digest mismatch.
    """
    path = contained_path(root, rel, where)
    if not path.is_file():
        raise _fail(where, f"expected the {what} at {path}, found {_files.found_at(path)}; the bundle is incomplete, "
                           "rebuild or re-copy it")
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise _fail(where, f"expected at most {limit} bytes in {path}, the file has {size}; the bundle is "
                                   "damaged or not a flyship bundle")
            data = fh.read(limit + 1)
    except OSError as e:
        raise _fail(where, f"cannot read {path}: {e}") from None
    if len(data) > limit:
        raise _fail(where, f"expected at most {limit} bytes in {path}, it grew while being read")
    if sha256 is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise _fail(where, f"sha256 mismatch: the manifest says {sha256}, the file has {digest}; the file "
                               "was changed after the build, rebuild the bundle")
    return data


def iter_variants(m: _m.Manifest) -> Iterator[tuple[str, _m.Variant]]:
    """``(where, variant)`` for every variant, ``where`` naming op, specialization, target and file."""
    for op in m.ops:
        for s in op.specializations:
            for v in s.variants:
                yield f"op {op.name} specialization {s.name} target {v.target} ({v.code_object.file})", v
                for k, t in enumerate(v.then):  # the core numbers following launches right after their variant
                    yield (f"op {op.name} specialization {s.name} target {v.target} launch {k + 2} "
                           f"({t.code_object.file})"), t


def check_variant_file(root: Path, v: _m.Variant, where: str, data: Optional[bytes] = None) -> bytes:
    """Read (unless ``data``, bytes already read and sha256 checked for the same file, is given) and check one
    variant's code object: contained, bounded, sha256 checked, and its facts against the variant
    (:func:`check_code_object`). The loader calls it when a variant is first selected or preloaded, so a
    load costs nothing per variant and no byte reaches a driver unchecked.

    Returns:
        The code object's bytes.

    Raises:
        BundleError: see :func:`read_bundle_file` and :func:`check_code_object`.
    """
    if data is None:
        data = read_bundle_file(root, v.code_object.file, v.code_object.sha256, L.MAX_CODE_OBJECT_BYTES, where,
                                "code object")
    check_code_object(v, data, where)
    return data


def check_bundle_files(root: Path, m: _m.Manifest) -> dict[str, bytes]:
    """Read and check the code objects (against their variants) and offload bundles a manifest names:
    contained, bounded, sha256 checked. The references module is checked when it is imported
    (:func:`references_source`), so the bytes checked are the bytes run.

    Returns:
        code-object file (as in the manifest) -> bytes.

    Raises:
        BundleError: see :func:`read_bundle_file` and :func:`check_code_object`.
    """
    images: dict[str, bytes] = {}
    for where, v in iter_variants(m):
        images[v.code_object.file] = check_variant_file(root, v, where, images.get(v.code_object.file))
    for key, f in m.offload_bundles.items():
        read_bundle_file(root, f, m.offload_bundles_sha256.get(f), L.MAX_CODE_OBJECT_BYTES,
                         f"offload bundle {key} ({f})", "offload bundle")
    return images


def check_bundle(root: Path, m: _m.Manifest) -> dict[str, bytes]:
    """Every file a manifest names, as a load would find it: :func:`check_bundle_files` and the references module
    (:func:`references_source`). What ``flyship list``, ``flyship pack`` and ``flyc-build`` run before they
    vouch for a bundle.

    Returns:
        code-object file (as in the manifest) -> bytes.

    Raises:
        BundleError: see :func:`check_bundle_files` and :func:`references_source`.
    """
    images = check_bundle_files(root, m)
    if m.references:
        references_source(root, m)
    return images


def references_source(root: Path, m: _m.Manifest) -> bytes:
    """The bytes of the references module, contained, bounded and checked against ``references_sha256``.

    Raises:
        BundleError: escape, missing file, oversize, digest mismatch.
    """
    assert m.references
    if m.references_sha256 is None:
        warnings.warn(f"bundle {root}: the manifest (schema {m.schema_version}) records no sha256 for "
                      f"{m.references}, so a change to it goes unnoticed; rebuild the bundle with flyc-build",
                      stacklevel=3)
    return read_bundle_file(root, m.references, m.references_sha256, L.MAX_REFERENCES_BYTES,
                            f"load bundle {root}: references {m.references!r}", "references module")
