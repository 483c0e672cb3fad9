"""The bundle contract between the compile stage and the loader.

Imported by both halves; depends only on the standard library plus msgpack and pyelftools (for
reading code objects). Never imports flydsl, triton or torch. The manifest names below are imported on
first use, so a light submodule (:mod:`flyship.bundle.files`, which the start-up hook reads its patches file
with) costs no manifest import.
"""

from flyship.bundle.errors import BundleError, CodeObjectError, ExprError, ManifestVersionError

_LAZY = ("MANIFEST_NAME", "SCHEMA_VERSION", "Manifest", "read")


def __getattr__(name: str):
    if name in _LAZY:
        from flyship.bundle import manifest

        return getattr(manifest, name)
    raise AttributeError(f"module 'flyship.bundle' has no attribute {name!r}")


__all__ = [
    "BundleError", "CodeObjectError", "ExprError", "ManifestVersionError",
    "MANIFEST_NAME", "SCHEMA_VERSION", "Manifest", "read",
]
