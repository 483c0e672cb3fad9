"""Trust for prebuilt extensions: a loader dlopens only a library it built itself or one ``flyship prebuild``
installed and recorded.

``flyship prebuild`` writes ``<name>.so.json`` beside the library: the module name (which encodes the C++
sources, the flavor, torch's version and commit, the Python ABI and the flags: ``extension.extension_name``) and the
library's sha256. A candidate found by the search (``FLYSHIP_EXTENSION_PATH``, the bundle's folder, the
environment) is imported only when the library, its record and their folder are owned by the user or root and
writable by no one else, and the library's bytes hash to the recorded sha256. Any other ``.so`` of the right name
(planted in ``/tmp`` beside a bundle, in a ``.`` entry of the path) is refused with the reason and never opened:
dlopen runs a library's constructors, so a check after opening would come too late. See docs/security.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flyship.bundle import files, trust

RECORD_SUFFIX = ".json"
RECORD_FORMAT = "flyship-prebuilt"
_MAX_LIBRARY = 1 << 30  # a flyship extension is a few MB; a bigger file is not one
_MAX_RECORD = 1 << 16


def record_path(library: Path) -> Path:
    return library.with_name(library.name + RECORD_SUFFIX)


def record(library: Path, name: str) -> dict[str, object]:
    """The record ``flyship prebuild`` writes for ``library`` (the module ``name``)."""
    data = Path(library).read_bytes()
    return {"format": RECORD_FORMAT, "version": 1, "name": name, "sha256": trust.sha256(data)}


def write_record(library: Path, name: str) -> None:
    """Write ``library``'s record beside it (a temporary file, then a rename), as ``flyship prebuild`` and the build
    cache do."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{library.name}.", dir=library.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record(library, name), f, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, record_path(library))
    finally:
        Path(tmp).unlink(missing_ok=True)


def refusal(library: Path, name: str, group_ok: bool = False) -> str | None:
    """Why the prebuilt ``library`` (module ``name``) must not be imported, or None when it may be (``group_ok``:
    the build cache's own library, in a folder a team may share, as :func:`flyship.bundle.trust.untrusted_reason`
    says)."""
    if not os.path.lexists(record_path(library)):
        return f"no record {record_path(library).name} beside it (install it with `flyship prebuild -o DIR`)"
    try:
        blob = trust.read_trusted(record_path(library), _MAX_RECORD, what="prebuilt extension record",
                                  group_ok=group_ok)
        rec = files.parse_json(blob, what="its record")
        data = trust.read_trusted(library, _MAX_LIBRARY, what="prebuilt extension", group_ok=group_ok)
    except (OSError, ValueError) as e:  # BundleError is a ValueError
        return str(e)
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        return f"its record is not a {RECORD_FORMAT} record"
    if rec.get("name") != name:
        return f"its record names {rec.get('name')!r}, expected {name!r} (built for another torch or Python)"
    got = trust.sha256(data)
    if rec.get("sha256") != got:
        return f"its sha256 {got} differs from the recorded {rec.get('sha256')!r}"
    return None
