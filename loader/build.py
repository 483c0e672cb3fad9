"""The C++ extension's module as it was named before round 2 (now :mod:`flyship.loader.extension`), kept for one
minor version so a harness importing it is told where to go (:func:`flyship.deprecation.met`, "loader.build"):
every name read here warns, then comes from :mod:`flyship.loader.extension`."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from flyship import deprecation
    from flyship.loader import extension

    deprecation.met("loader.build")
    return getattr(extension, name)
