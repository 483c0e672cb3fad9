"""flyship's loader: run a bundle's kernels as torch ops in a Python that has torch and ninja only.

    import flyship
    ops = flyship.load("artifacts/examples")
    y = ops.softmax(x)                          # fresh output
    ops.softmax.out(x, out=y)                   # out variant
    torch.ops.<namespace>.softmax(x)            # the same op, traceable by torch.compile
    ops.softmax.stats()                         # launches per specialization, fallbacks per reason

Never imports flydsl or triton. ``docs/loader.md`` (user guide) and ``docs/loader-internals.md`` describe the design. The C++ extension is
``flyship.loader.extension`` (``extension.extension()`` builds or finds it).
"""

from __future__ import annotations

from flyship.loader.extension import ExtensionBuildError
from flyship.loader.core import load
from flyship.loader.handles import OpHandle, Ops
from flyship.loader.selection import Decision

# The integrations (flyship.loader.tools) are not the call path: imported on first use, so a load imports only
# what it needs.
_TOOLS = {"Report": "verify", "VerificationError": "verify", "verify": "verify"}


def __getattr__(name: str):
    if name in _TOOLS:
        import importlib

        return getattr(importlib.import_module(f"flyship.loader.tools.{_TOOLS[name]}"), name)
    raise AttributeError(f"module 'flyship.loader' has no attribute {name!r}")

__all__ = [
    "Decision", "ExtensionBuildError", "OpHandle", "Ops", "Report", "VerificationError", "load", "verify",
]
