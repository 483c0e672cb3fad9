"""The exceptions of the bundle contract, shared by the compile stage and the loader."""


class BundleError(ValueError):
    """A bundle, manifest, target ID or expression is malformed or does not fit.

    Messages follow ``<operation>: expected <X>, got <Y> [where]; <what to do>``.
    """


class ManifestVersionError(BundleError):
    """The manifest's schema major version is not one this flyship reads."""


class CodeObjectError(BundleError):
    """A code object (hsaco or cubin) is malformed or disagrees with its manifest entry."""


class ExprError(BundleError):
    """A grid, shape or constraint expression is malformed or cannot be evaluated."""
