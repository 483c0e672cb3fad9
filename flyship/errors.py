"""flyship's one exception tree.

Every error flyship raises on purpose is a :class:`FlyshipError`; the CLIs print its message (no
traceback), while any other exception is a bug and keeps its traceback reachable (below). Branches:

    FlyshipError
      ConfigError (ValueError)        a FLYSHIP_* environment option or an API argument is malformed
                                      (flyship.PatchError is this class)
      BundleError (ValueError)        a bundle, manifest, target ID, tuning table or expression is malformed or
                                      does not fit
        ManifestVersionError          the manifest's major schema version is not one this flyship reads
        CodeObjectError               a code object is malformed or disagrees with its manifest entry
        ExprError                     a grid / shape / constraint expression is malformed or cannot be evaluated
      CompileError (RuntimeError)     the compile stage (flyc-build) could not build what was asked
        SpecError (ValueError)        the spec file declares something inconsistent
      LoadError (RuntimeError)        the workload side could not load or run a bundle
                                      (flyship.loader.ExtensionBuildError is this class)
        CallError                     a call of a loaded op was refused or could not run (its message says why)
          CallTypeError (TypeError)   an op argument of the wrong type

Policy: a class exists only where some code catches it (``except X``, or tells it apart with ``isinstance``) or a
user must tell it apart (exported, named in docs/); tests/test_structure.py counts them (at most 20). The other
stage-specific classes (``ToolchainError``, ``FrontendError``, ``VerificationError``...) live beside the code that
catches them and derive from one of these branches. A finer failure that nobody catches by class but that people
tell apart by words (a failure reason starting ``ProofError:``, a next step chosen by it, an expression that
overflows rather than divides by zero) is its parent class raised with a ``kind`` (``CodeObjectError(msg,
kind="ProofError")``): :attr:`FlyshipError.kind` is that word, or the class name when none is given, and the
compile stage's failure reasons read ``<kind>: <message>``.

Messages follow ``<operation>: expected <X>, got <Y> [where]; <what to do>``; keep the cause chain (``raise ...
from e``). A deliberate error is one line. An unexpected exception (a bug) is never flattened into one: where it is
reported as a flyship error, it is wrapped ``from e`` with its traceback text as ``details`` (text crosses a
process boundary, a compile worker's, where the cause chain would not); ``flyc-build`` prints that traceback under
``--verbose`` or writes it to a file its message names (:func:`bug_details`).
"""

from __future__ import annotations

import traceback as _traceback


class FlyshipError(Exception):
    """Root of every error flyship raises on purpose.

    Args:
        *args: the message (one line, or a few for a list of failures).
        kind: the failure's name where people tell failures of one class apart by words (module docstring);
            default: the class name.
        details: the traceback text of the bug (an unexpected exception) this error reports, when it reports one;
            it crosses process boundaries as text, where a ``__cause__`` would not.
    """

    def __init__(self, *args: object, kind: str = "", details: str = "") -> None:
        super().__init__(*args)
        if kind:
            self._kind = kind
        if details:
            self.details = details

    _kind = ""
    details = ""

    @property
    def kind(self) -> str:
        """The failure's name in words (``ProofError``, ``ExprOverflowError``), else the class name."""
        return self._kind or type(self).__name__


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


class CompileError(FlyshipError, RuntimeError):
    """The compile stage could not build what the spec file asked for."""


class SpecError(CompileError, ValueError):
    """A spec file declares something inconsistent (checked before any compile)."""


class LoadError(FlyshipError, RuntimeError):
    """The workload side could not load or run a bundle (extension, device, verification)."""


class CallError(LoadError):
    """A call of a loaded op was refused or could not run: an argument does not fit the op (rank, device, leading
    dims, out tensor), nothing fits and the fallback is off, or the reference failed. The C++ core's refusals reach
    Python as this class (csrc/python_calls.cpp, ``raise_as_flyship``); it is a RuntimeError, as torch's own are."""


class CallTypeError(CallError, TypeError):
    """An argument of an op call has the wrong type (a tensor where a float goes)."""


def headline(e: BaseException) -> str:
    """``<kind>: <message>`` of a flyship error, ``<class>: <message>`` of any other exception: how the compile
    stage's failure reasons name a failure."""
    return f"{e.kind if isinstance(e, FlyshipError) else type(e).__name__}: {e}"


def traceback_text(e: BaseException) -> str:
    """The full traceback of ``e`` (its cause chain included), as Python prints it."""
    return "".join(_traceback.format_exception(type(e), e, e.__traceback__))


def bug_details(e: BaseException) -> str:
    """The traceback text of the bug behind ``e``, or "" when ``e`` is a deliberate error alone: ``e``'s own when
    it is not a :class:`FlyshipError`, else the ``details`` it was given where it wrapped a bug (in this process,
    or as text from a worker)."""
    return e.details if isinstance(e, FlyshipError) else traceback_text(e)


__all__ = [
    "FlyshipError", "ConfigError", "BundleError", "ManifestVersionError", "CodeObjectError", "ExprError",
    "CompileError", "SpecError", "LoadError",
    "CallError", "CallTypeError", "bug_details", "headline", "traceback_text",
]
