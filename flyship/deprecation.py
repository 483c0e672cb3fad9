"""The one deprecation path of flyship's public surfaces (the spec API, the loader's Python API): a change that
would break what users wrote is announced for one minor version with a warning naming the migration, then refused
with the same words (CHANGELOG.md, "Spec API" and "Loader API", lists every entry of :data:`CHANGES`; a test holds
the two equal).

Usage, at the place the old form is met::

    from flyship import deprecation
    deprecation.met("loader.build")        # warns while flyship < refused_in, raises after

Versions are flyship's (``flyship.__version__``), compared as (major, minor, patch) integers.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

from flyship.errors import ConfigError, FlyshipError, SpecError


@dataclasses.dataclass(frozen=True)
class Change:
    """One announced change.

    Attributes:
        key: the change's name in :data:`CHANGES` and CHANGELOG.md.
        what: the old form, as the user wrote it.
        since: the flyship version that first warns.
        refused_in: the flyship version that refuses (one minor version later).
        migration: the one-line change that keeps working.
        surface: ``"spec"`` (refused as a :class:`SpecError` by flyc-build) or ``"loader"`` (a :class:`ConfigError`).
    """

    key: str
    what: str
    since: str
    refused_in: str
    migration: str
    surface: str


CHANGES: dict[str, Change] = {c.key: c for c in (
    Change("loader.build", "import flyship.loader.build (the C++ extension's module in round 1, renamed "
           "flyship.loader.extension)", "0.2.0", "0.3.0",
           "use flyship.dry_run(bundle, target=...) for the recording driver, or flyship.loader.extension for the "
           "extension itself (internal: it may move again)", "loader"),
)}


def version_tuple(text: str) -> tuple[int, int, int]:
    """``"0.2.0"`` -> ``(0, 2, 0)``; a pre-release tail (``0.2.0.dev1``, ``0.2.0rc1``) counts as its release.

    Raises:
        ValueError: ``text`` does not start with a version number.
    """
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    if m is None:
        raise ValueError(f"expected a version such as '0.2.0', got {text!r}")
    return int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0)


def message(c: Change, refused: bool) -> str:
    """The words of the warning and of the refusal: the change, the versions and the migration."""
    state = (f"refused since flyship {c.refused_in}" if refused
             else f"deprecated since flyship {c.since}, refused from {c.refused_in}")
    return f"{c.what}: {state}; {c.migration} (CHANGELOG.md, {c.key})"


def met(key: str, stacklevel: int = 3) -> None:
    """The old form of change ``key`` was used: warn while this flyship is older than its ``refused_in``, refuse after.

    Raises:
        SpecError | ConfigError: this flyship refuses the old form (the change's surface says which).
        KeyError: ``key`` is no entry of :data:`CHANGES` (a bug in flyship).
    """
    import flyship

    c = CHANGES[key]
    if version_tuple(flyship.__version__) >= version_tuple(c.refused_in):
        error: type[FlyshipError] = SpecError if c.surface == "spec" else ConfigError
        raise error(message(c, refused=True))
    # FutureWarning, not DeprecationWarning: Python shows it by default, to the users who wrote the old form
    warnings.warn(message(c, refused=False), FutureWarning, stacklevel=stacklevel)
