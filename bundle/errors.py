"""The exceptions of the bundle contract (defined in :mod:`flyship.errors`, the one error tree)."""

from flyship.errors import BundleError, CodeObjectError, ExprError, ManifestVersionError

__all__ = ["BundleError", "CodeObjectError", "ExprError", "ManifestVersionError"]
