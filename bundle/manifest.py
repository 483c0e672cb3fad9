"""The bundle manifest: a closed, versioned schema shared by the compile stage and the loader.

``docs/bundle-format.md`` is the prose contract and ``schema.json`` beside this file the JSON Schema. The
manifest has three parts, each with one job: :mod:`flyship.bundle.model` (the dataclasses and vocabularies),
:mod:`flyship.bundle.manifest_json` (the one JSON reader and writer) and :mod:`flyship.bundle.rules` (the rule
book). This module is the entry that reads a manifest: :func:`read` / :func:`parse` decode the JSON, build the
dataclasses and run every rule; it re-exports the model and the writer so ``M.Manifest``, ``M.write`` ... keep
one import.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle import rules as _rules
from flyship.bundle.errors import BundleError, ManifestVersionError
from flyship.bundle.manifest_json import (  # noqa: F401  (re-exported)
    from_data,
    decode,
    to_json_data,
    to_json_obj,
    write,
)
from flyship.bundle.targets import output_dtype  # noqa: F401  (re-exported)
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
    Composite,
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
    composite_head,
    must_understand,
    slots,
    version_for,
)


def _readable() -> str:
    return " and ".join(f"{major}.x (up to {major}.{minor})" for major, minor in NEWEST_MINOR.items())



def from_json_obj(data: Any) -> Manifest:
    """Build a :class:`Manifest` from parsed JSON, checking the format and schema version.

    Raises:
        ManifestVersionError: a major version not in :data:`NEWEST_MINOR`.
        BundleError: a key is missing, unknown (for the same or an older minor version), or mistyped.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise BundleError(
            f"manifest: expected a JSON object with \"format\": {FORMAT_NAME!r}, got {str(got)[:60]!r}; "
            "is this a flyship bundle?"
        )
    version = data.get("schema_version", "")
    match = re.fullmatch(r"([0-9]{1,6})\.([0-9]{1,6})", version) if isinstance(version, str) else None
    if match is None:
        raise BundleError(f"manifest: expected schema_version 'MAJOR.MINOR', got {str(version)[:60]!r}")
    major, minor = int(match[1]), int(match[2])
    if major not in NEWEST_MINOR:
        raise ManifestVersionError(
            f"manifest: bundle schema version {version} is not readable by this flyship, which reads "
            f"{_readable()}; rebuild the bundle with a matching flyc-build, "
            "or install the flyship version that wrote it"
        )
    body = {k: v for k, v in data.items() if k != "format"}
    return from_data(Manifest, body, "", lenient=minor > NEWEST_MINOR[major])


def part_from_json_obj(cls: Any, data: Any, schema_version: str, where: str) -> Any:
    """One part of a manifest (an :class:`Op`, a :class:`Specialization`...) from its JSON data, read as
    :func:`from_json_obj` reads it in a manifest of ``schema_version`` (unknown keys are ignored for a newer minor
    version). Checks types and limits, not the rule book: for data taken from a manifest that passed it (the plan
    cache).

    Raises:
        BundleError: a key is missing, unknown or mistyped.
    """
    major, minor = (int(x) for x in schema_version.split("."))
    return from_data(cls, data, where, lenient=minor > NEWEST_MINOR[major])


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
    data = _files.read_regular(p, _limits.MAX_MANIFEST_BYTES, what="read bundle", expected="a manifest",
                               hint=f"pass a bundle directory built by flyc-build (it holds {MANIFEST_NAME})")
    return data, str(p)


def read(path: Path | str) -> Manifest:
    """Read and check a manifest file (or a bundle directory holding ``manifest.json``).

    Raises:
        BundleError: the file is missing, too large, not UTF-8 JSON, or not a valid manifest; the message
            names the path and the JSON path of the bad value.
    """
    return parse(*read_bytes(path))
