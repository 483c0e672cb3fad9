"""Rules on expressions: each compiles against the op's slots (the grammar and its limits are
:mod:`flyship.bundle.expr`'s)."""

from __future__ import annotations

from flyship.bundle import expr as _expr
from flyship.bundle.errors import BundleError
from flyship.bundle.rules.common import fail as _fail


def check_expression(text: str, slots: dict[str, _expr.Slot], where: str) -> None:
    """An expression compiles against the op's slots: the grammar, literals within int64 (the C++ core's type) and
    the program's size limits are :func:`flyship.bundle.expr.parse`'s.

    Raises:
        BundleError: naming ``where`` and the expression.
    """
    try:
        _expr.compile_program(text, slots)
    except _expr.ExprError as e:
        raise _fail(where, str(e)) from None
    except BundleError:
        raise
    except (RecursionError, MemoryError, ValueError) as e:  # deep nesting or a huge literal
        raise _fail(where, f"expression {text[:60]!r}... cannot be compiled ({type(e).__name__}); "
                           "simplify it") from None
