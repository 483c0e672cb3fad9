"""Integer expressions over an op's arguments: launch grids, output shapes, kernarg values, guards.

The manifest stores every quantity that depends on a call's inputs as a small expression in a
Python subset, e.g. ``cdiv(x.shape[0], 128)`` or ``x.shape[1] % 8 == 0``. Grammar:

* integer literals, and the names of ``int`` scalar arguments;
* ``device.cu_count``: the number of compute units (AMD CUs, NVIDIA SMs) of the device the call runs on,
  read once per device by the loader (grids and guards only: an output's shape never depends on the device);
* ``<tensor>.shape[i]``, ``<tensor>.stride[i]`` (in elements, as torch reports them) and
  ``<tensor>.numel``; ``i`` is an integer literal, negative counts from the end;
* ``+ - * // %`` (``//`` and ``%`` with Python's floor semantics), unary ``-``;
  ``cdiv(a, b)``, ``min(a, b)``, ``max(a, b)``;
* comparisons ``== != < <= > >=`` (one operator each), ``and``, ``or``, ``not``; booleans are 0 / 1.

Semantics, the same in this module's evaluator and the C++ core's (``csrc/expr.h``; a differential test
runs both): signed 64-bit integers; every operation gives its mathematical result and a result outside
int64 is an error (an :class:`ExprError` of ``kind`` :data:`OVERFLOW`), never a silent wrap; ``//`` and ``%``
floor, ``cdiv`` is the ceiling; a zero divisor is an error (``kind`` :data:`DIVISION`); every operand is
evaluated (``and``/``or`` do not short-circuit), so the first error in postfix order is the one reported.

Limits, enforced by :func:`parse` so that an expression the compile stage accepts never fails at load:
``MAX_EXPR_CHARS`` characters, literals within int64, and a postfix program of at most
``MAX_PROGRAM_WORDS`` words needing at most ``MAX_PROGRAM_DEPTH`` stack entries.

The loader compiles each expression into a postfix program (:func:`compile_program`) that the C++ core
evaluates per call; opcodes travel by mnemonic (``"shape"``, ``"cdiv"``), which the core maps once.
"""

from __future__ import annotations

# One module per job: the grammar's parser (grammar), the evaluator (evaluate), questions and rewrites (forms),
# the C++ core's postfix program (program). Every public name is asked as flyship.bundle.expr.<name>.
from flyship.bundle.errors import ExprError
from flyship.bundle.expr.evaluate import Symbolic, contiguous_strides, evaluate, evaluate_with_shapes
from flyship.bundle.expr.forms import (canonical, comparison, dimension, int_literal, is_constant, names_device,
                                       nonnegative, pinned, reads, substitute, substitute_tensors, trunc_div)
from flyship.bundle.expr.grammar import (DEVICE, DEVICE_PROPERTIES, DIVISION, INT64_MAX, INT64_MIN, MAX_EXPR_CHARS,
                                         MAX_PROGRAM_DEPTH, MAX_PROGRAM_WORDS, OPCODES, OVERFLOW, parse)
from flyship.bundle.expr.program import Slot, compile_program

__all__ = ["DEVICE", "DEVICE_PROPERTIES", "DIVISION", "INT64_MAX", "INT64_MIN", "MAX_EXPR_CHARS", "MAX_PROGRAM_DEPTH",
           "MAX_PROGRAM_WORDS", "OPCODES", "OVERFLOW", "ExprError", "Slot", "Symbolic", "canonical", "comparison",
           "compile_program", "contiguous_strides", "dimension", "evaluate", "evaluate_with_shapes", "int_literal",
           "is_constant", "names_device", "nonnegative", "parse", "pinned", "reads", "substitute",
           "substitute_tensors", "trunc_div"]
