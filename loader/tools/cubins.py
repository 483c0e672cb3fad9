"""What ``flyship verify --emulate`` says of the sm_* code objects (cubins) it cannot run: no NVIDIA GPU executes
them here, and the bundle carries no kernel source for Triton's interpreter (``flyc-build --verify`` runs each Triton
kernel's source under it, from the spec: :mod:`flyship.loader.tools.verify_interpreted`)."""

from __future__ import annotations

import importlib.util


def triton_importable() -> bool:
    """Whether this Python has Triton (its interpreter), without importing it."""
    return importlib.util.find_spec("triton") is not None


def statement() -> str:
    """The report's line on sm_* cubins: not executed, and why the interpreter did not stand in for them here."""
    if not triton_importable():
        return "sm_* cubins: not executed (no NVIDIA GPU; Triton not installed here for its interpreter)"
    return ("sm_* cubins: not executed (no NVIDIA GPU; the bundle carries no kernel source for Triton's interpreter: "
            "flyc-build --verify runs each Triton kernel's source under the interpreter, from the spec)")
