"""Leading batch dimensions (schema 1.2): how a call's batched tensors reach a kernel written for fewer dims.

A tensor input declared batched (:attr:`flyship.bundle.manifest.Arg.batch`) of kernel rank ``r`` accepts a
tensor of rank ``r + k`` (``k >= 0``). Its first ``k + 1`` sizes are its *leading dims*; the kernel sees the
tensor with them flattened into its first dimension: ``(B, S, H)`` reaches an ``(M, H)`` kernel as
``(B*S, H)``. Every batched input of a call must have the same leading dims (``k = 0`` included: a plain
``(M, H)`` call has the leading dims ``(M,)``). Output rules, guards and launch rules are evaluated on the
flattened view; a batched output (:attr:`~flyship.bundle.manifest.Output.batch`, whose first dimension is a
batched input's first) is returned with the leading dims back: ``(B*S, N)`` -> ``(B, S, N)``.

This module is the Python statement of the rule (the fake kernels and the CPU kernels use it); the C++ core
states it once more on the hot path (``csrc/batch.cpp``), and ``tests/loader/test_batch.py`` proves the two
agree. Whether a flattening is a view (no copy) depends on strides and is decided by the C++ core only (a
fake tensor needs no memory; the CPU reference path reshapes, copying where it must).

Works on ints and on torch SymInts alike (only ``*`` and ``==`` are used).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from flyship.bundle import model as _m
from flyship.bundle.frozen import frozen
from flyship.errors import CallError


@frozen
class Batch:
    """The leading dims of one call and how many extra dims each batched input carries.

    Attributes:
        lead: the leading dims shared by the batched inputs (empty when the op has no batched input).
        extra: batched input name -> ``k``, its number of dims beyond the kernel's rank.
    """

    lead: tuple[Any, ...]
    extra: dict[str, int]

    @property
    def active(self) -> bool:
        """Whether some tensor carries extra dims (else every shape is already the kernel's)."""
        return any(self.extra.values())

    def rows(self) -> Any:
        """The flattened first dimension: the product of the leading dims."""
        n: Any = 1
        for d in self.lead:
            n = n * d
        return n

    def flat_shape(self, name: str, shape: Sequence[Any]) -> list[Any]:
        """The shape batched tensor ``name`` has for the kernel (unchanged when it carries no extra dims)."""
        k = self.extra.get(name, 0)
        return list(shape) if k == 0 else [self.rows(), *shape[k + 1:]]

    def full_shape(self, flat: Sequence[Any]) -> list[Any]:
        """A batched output's shape with the leading dims back: ``(M, ...) -> (*lead, ...)``."""
        return [*self.lead, *flat[1:]] if self.active else list(flat)


def batched_inputs(op: _m.Op) -> list[_m.Arg]:
    return [a for a in op.args if a.kind == "tensor" and a.batch]


def split(op: _m.Op, shapes: Mapping[str, Sequence[Any]], qualname: str) -> Batch:
    """The :class:`Batch` of a call whose input tensors have ``shapes`` (name -> sizes).

    Raises:
        CallError: a batched input of rank below the kernel's, or batched inputs whose leading dims differ.
    """
    lead: tuple[Any, ...] = ()
    first = ""
    extra: dict[str, int] = {}
    for a in batched_inputs(op):
        shape = tuple(shapes[a.name])
        if len(shape) < a.rank:
            raise CallError(f"flyship {qualname}: expected '{a.name}' of rank {a.rank} or more (rank {a.rank} for the "
                            f"kernel, more for leading batch dimensions), got rank {len(shape)} (shape "
                            f"{list(shape)}); pass a tensor of rank {a.rank} or more")
        k = len(shape) - a.rank
        mine = shape[:k + 1]
        if not first:
            lead, first = mine, a.name
        elif len(mine) != len(lead) or any(x != y for x, y in zip(mine, lead)):
            raise CallError(f"flyship {qualname}: expected the batched inputs to agree on their leading dimensions, "
                            f"got {list(lead)} for '{first}' and {list(mine)} for '{a.name}'; pass tensors with the "
                            "same leading (batch) dimensions")
        extra[a.name] = k
    return Batch(lead, extra)
