"""The bundle contract between the compile stage and the loader.

Imported by both halves; depends only on the standard library plus msgpack and pyelftools (for
reading code objects). Never imports flydsl, triton or torch.
"""

from flyship.bundle.errors import BundleError, CodeObjectError, ExprError, ManifestVersionError
from flyship.bundle.manifest import MANIFEST_NAME, SCHEMA_VERSION, Manifest, read

__all__ = [
    "BundleError", "CodeObjectError", "ExprError", "ManifestVersionError",
    "MANIFEST_NAME", "SCHEMA_VERSION", "Manifest", "read",
]
