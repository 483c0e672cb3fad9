"""flyship's loader: run a bundle's kernels as torch ops in a Python that has torch and ninja only.

    import flyship
    ops = flyship.load("artifacts/examples")
    y = ops.softmax(x)                          # fresh output
    ops.softmax.out(x, out=y)                   # out variant
    torch.ops.<namespace>.softmax(x)            # the same op, traceable by torch.compile
    ops.softmax.stats()                         # launches per specialization, fallbacks per reason

Never imports flydsl or triton. ``docs/loader.md`` describes the design.
"""

from __future__ import annotations

from typing import Any, Optional

from flyship.loader.build import ExtensionBuildError, extension
from flyship.loader.core import Decision, DryRun, OpHandle, Ops, Packed, load
from flyship.loader.verify import Report, VerificationError, verify


def pack_kernargs(op: OpHandle, spec: str | int, *args: Any, target: Optional[str] = None) -> bytes:
    """The kernarg bytes a call of ``op`` with ``args`` would launch specialization ``spec`` with
    (no launch, no GPU needed); see :meth:`OpHandle.pack_kernargs` for the grid and outputs too."""
    return op.pack_kernargs(spec, *args, target=target).buffer


__all__ = [
    "Decision", "DryRun", "ExtensionBuildError", "OpHandle", "Ops", "Packed", "Report", "VerificationError",
    "extension", "load", "pack_kernargs", "verify",
]
