"""The bundle manifest: a closed, versioned schema shared by the compile stage and the loader.

``docs/bundle-format.md`` is the prose contract and ``schema.json`` beside this file the JSON Schema. The
manifest has three parts, each with one job: :mod:`flyship.bundle.model` (the dataclasses and vocabularies),
:mod:`flyship.bundle.manifest_json` (the one JSON reader and writer) and :mod:`flyship.bundle.rules` (the rule
book). This module is the entry that reads a manifest: :func:`read` / :func:`parse` decode the JSON, build the
dataclasses and run every rule; it re-exports the model and the writer so ``M.Manifest``, ``M.write`` ... keep
one import.
"""

from __future__ import annotations

from pathlib import Path

from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle import rules as _rules
from flyship.bundle.errors import BundleError
from flyship.bundle.manifest_json import (  # noqa: F401  (re-exported)
    decode,
    from_json_obj,
    part_from_json_obj,
    to_json_data,
    to_json_obj,
    write,
)
from flyship.bundle.model import (  # noqa: F401  (re-exported)
    CODE_OBJECT_FORMATS,
    DTYPES,
    FIELD_KINDS,
    FIELD_TYPES,
    FORMAT_NAME,
    GRAD_PREFIX,
    MANIFEST_NAME,
    MUST_UNDERSTAND,
    NEWEST_MINOR,
    SCALAR_TYPES,
    SCHEMA_MAJOR,
    SCHEMA_MINOR,
    SCHEMA_VERSION,
    TENSOR_ABIS,
    Arg,
    Backward,
    BuildInfo,
    CodeObject,
    Example,
    Failure,
    Guard,
    KernargField,
    KernargLayout,
    KernelMetadata,
    Launch,
    Manifest,
    MetadataArg,
    Op,
    Output,
    Proof,
    Specialization,
    Variant,
    Workspace,
    must_understand,
    slots,
    version_for,
)


def parse(data: bytes, where: str) -> Manifest:
    """Parse manifest bytes (UTF-8 JSON) and check every rule of :mod:`flyship.bundle.rules`.

    Raises:
        BundleError: naming ``where`` and the JSON path of the first bad value.
    """
    return parse_json(data, where)[0]


def parse_json(data: bytes, where: str) -> tuple[Manifest, dict]:
    """:func:`parse`, also returning the JSON object the manifest was read from (the plan cache keeps each op's
    part of it as it is, instead of writing the dataclasses back out).

    Raises:
        BundleError: naming ``where`` and the JSON path of the first bad value.
    """
    obj = decode(data, where)
    try:
        m = from_json_obj(obj)
        _rules.check_manifest(m)
    except BundleError as e:
        raise type(e)(f"{where}: {e}") from None
    except RecursionError:
        raise BundleError(f"{where}: the manifest nests too deeply; the bundle is damaged, rebuild it") from None
    return m, obj


def read_bytes(path: Path | str) -> tuple[bytes, str]:
    """The bytes of a manifest file (or of a bundle directory's ``manifest.json``), at most the size limit, and
    the path as error messages name it; :func:`parse` checks them.

    Raises:
        BundleError: the file is missing or cannot be read.
    """
    p = Path(path)
    if p.is_dir() and (p.name != MANIFEST_NAME or (p / MANIFEST_NAME).exists() or (p / MANIFEST_NAME).is_symlink()):
        p = p / MANIFEST_NAME  # (a folder named manifest.json with none inside was meant as the manifest: say so)
    if not p.is_file():
        raise BundleError(f"read bundle: expected a manifest at {p}, found {_files.found_at(p)}; pass a bundle "
                          f"directory built by flyc-build (it holds {MANIFEST_NAME})")
    try:
        with open(p, "rb") as fh:
            return fh.read(_limits.MAX_MANIFEST_BYTES + 1), str(p)
    except OSError as e:
        raise BundleError(f"read bundle: cannot read {p}: {e}") from None


def read(path: Path | str) -> Manifest:
    """Read and check a manifest file (or a bundle directory holding ``manifest.json``).

    Raises:
        BundleError: the file is missing, too large, not UTF-8 JSON, or not a valid manifest; the message
            names the path and the JSON path of the bad value.
    """
    return parse(*read_bytes(path))
