"""Rules on inputs written in place (schema 1.2): an op has an effect, only tensors are written, and the in-place
inputs and outputs fit torch's alias letters. (Since schema 5.0 an op that writes an input may be the forward of an
autograd pair: :func:`flyship.bundle.rules.backward.check_backward`.)"""

from __future__ import annotations

from flyship.bundle import model as _m
from flyship.bundle.errors import BundleError
from flyship.bundle.rules.common import fail as _fail


def check_effects(op: _m.Op, where: str) -> None:
    """An op has an effect: a fresh output or an input it writes in place (schema 1.2), or both. The one rule for
    the spec API (flyc-build), the manifest reader and the loader's schema builder."""
    if not op.outputs and not op.mutable:
        raise _fail(f"{where}.outputs", "expected at least one output or one input the kernel writes in place "
                                        "(mutable), got neither; declare Output(...) or Tensor(..., mutable=True)")


def check_mutable_arg(a: _m.Arg, where: str) -> None:
    """Only a tensor can be written in place (``where``: the argument's JSON path)."""
    if a.mutable and a.kind != "tensor":
        raise _fail(f"{where}.mutable", f"only a tensor can be written in place, got a mutable {a.kind} {a.name!r}")


# torch's alias annotations (Tensor(a!)) take one letter each: the in-place inputs, then the out= tensors.
ALIAS_LETTERS = 26


def check_alias_letters(op: _m.Op, where: str) -> None:
    """The in-place inputs and the outputs together fit torch's alias letters (one each in the schema)."""
    n = len(op.mutable) + len(op.outputs)
    if n > ALIAS_LETTERS:
        raise _fail(where, f"expected at most {ALIAS_LETTERS} outputs and in-place inputs together (one alias letter "
                           f"each), got {n}")
