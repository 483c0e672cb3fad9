"""The emulator's one error: a ``LoadError`` whose kind is ``EmulationError`` (flyship/errors.py's policy: a finer
failure told apart by words is its parent class raised with a kind)."""

from __future__ import annotations

from flyship.errors import LoadError

# `except EmulationError` catches what the emulator refuses; `err.kind == "EmulationError"` tells it apart from
# another LoadError.
EmulationError = LoadError
KIND = "EmulationError"


def refuse(message: str) -> LoadError:
    """An emulator refusal (the caller raises it): ``emulate: <message>``."""
    return LoadError(f"emulate: {message}", kind=KIND)
