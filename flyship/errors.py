"""flyship's one exception tree.

Every error flyship raises on purpose is a :class:`FlyshipError`; the CLIs print its message (no
traceback), while any other exception is a bug and shows one. Branches:

    FlyshipError
      ConfigError (ValueError)        a FLYSHIP_* environment option or an API argument is malformed
      BundleError (ValueError)        a bundle, manifest, target ID or expression is malformed or does not fit
        ManifestVersionError          the manifest's major schema version is not one this flyship reads
        CodeObjectError               a code object is malformed or disagrees with its manifest entry
        ExprError                     a grid / shape / constraint expression is malformed or cannot be evaluated
      CompileError                    the compile stage (flyc-build) could not build what was asked
        SpecError (ValueError)        the spec file declares something inconsistent
      LoadError                       the workload side could not load or run a bundle
        CallError (RuntimeError)      a call of a loaded op was refused or could not run (its message says why)
          CallTypeError (TypeError)   an op argument of the wrong type

The stage-specific classes (``ToolchainError``, ``FrontendError``, ``ExtensionBuildError``...) live
beside the code that raises them and derive from one of these branches. Messages follow
``<operation>: expected <X>, got <Y> [where]; <what to do>``; keep the cause chain (``raise ... from e``).
"""

from __future__ import annotations


class FlyshipError(Exception):
    """Root of every error flyship raises on purpose."""


class ConfigError(FlyshipError, ValueError):
    """A ``FLYSHIP_*`` environment option or an API argument has a value flyship cannot use."""


class BundleError(FlyshipError, ValueError):
    """A bundle, manifest, target ID or expression is malformed or does not fit."""


class ManifestVersionError(BundleError):
    """The manifest's schema major version is not one this flyship reads."""


class CodeObjectError(BundleError):
    """A code object (hsaco or cubin) is malformed or disagrees with its manifest entry."""


class ExprError(BundleError):
    """A grid, shape or constraint expression is malformed or cannot be evaluated."""


class CompileError(FlyshipError):
    """The compile stage could not build what the spec file asked for."""


class SpecError(CompileError, ValueError):
    """A spec file declares something inconsistent (checked before any compile)."""


class LoadError(FlyshipError):
    """The workload side could not load or run a bundle (extension, device, verification)."""


class CallError(LoadError, RuntimeError):
    """A call of a loaded op was refused or could not run: an argument does not fit the op (rank, device, leading
    dims, out tensor), nothing fits and the fallback is off, or the reference failed. The C++ core's refusals reach
    Python as this class (csrc/python_calls.cpp, ``raise_as_flyship``); it is a RuntimeError, as torch's own are."""


class CallTypeError(CallError, TypeError):
    """An argument of an op call has the wrong type (a tensor where a float goes)."""


__all__ = [
    "FlyshipError", "ConfigError", "BundleError", "ManifestVersionError", "CodeObjectError", "ExprError",
    "CompileError", "SpecError", "LoadError",
    "CallError", "CallTypeError",
]
