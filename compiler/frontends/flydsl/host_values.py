"""SSA values of a FlyDSL launcher's host function, read two independent ways: as integer expressions over the
op's arguments (:meth:`HostValues.expr`, what the manifest stores) and as numbers at the example shapes
(:meth:`HostValues.value`, interpreting the same ops); :mod:`.host_ir` checks that the two agree. Also the
kernarg fields one kernel operand becomes (:meth:`HostValues.kernel_arg`).
"""

from __future__ import annotations

from flyship.bundle import expr as _expr
from flyship.bundle.manifest import FIELD_TYPES
from flyship.compiler.frontends.base import FrontendError
from flyship.compiler.frontends.flydsl.host_types import INT_WIDTHS, SCALAR_FIELDS, FieldPlan, struct_members


class HostValues:
    """Turns SSA values of the host function into expressions (and example values)."""

    _BIN = {"arith.addi": ("+", lambda a, b: a + b), "arith.subi": ("-", lambda a, b: a - b),
            "arith.muli": ("*", lambda a, b: a * b)}

    def __init__(self, binding, layouts, shapes, scalars, where, ir):
        self.binding, self.layouts, self.shapes, self.scalars, self.where, self.ir = (
            binding, layouts, shapes, scalars, where, ir)
        self.width_constraints: list[str] = []
        self.float_values: dict[str, float] = {}

    # -- helpers -----------------------------------------------------------------------------
    def _block_arg(self, v) -> tuple[str, str] | None:
        # FlyDSL registers value casters (e.g. f32 values come back as its ArithValue), so test the owner.
        if isinstance(v.owner, self.ir.Block):
            return self.binding.get(self.ir.BlockArgument(v).arg_number)
        return None

    def _layout_entry(self, tensor: str, pos: list[int]) -> tuple[str, int, str]:
        """(``shape``/``stride``, dim, width) of struct position ``pos`` in ``tensor``'s layout struct."""
        lay = self.layouts[tensor]
        groups = []
        if any(e.static is None for e in lay.shape):
            groups.append(("shape", lay.shape))
        if any(e.static is None for e in lay.stride):
            groups.append(("stride", lay.stride))
        if len(pos) != 2 or pos[0] >= len(groups):
            raise FrontendError(f"{self.where}: unexpected layout struct position {pos} for {tensor}")
        what, entries = groups[pos[0]]
        dyn = [d for d, e in enumerate(entries) if e.static is None]
        d = dyn[pos[1]]
        return what, d, entries[d].width

    def _owner(self, v):
        if isinstance(v.owner, self.ir.Block):
            return None
        return v.owner

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, v) -> str:
        return _expr.canonical(self._expr(v))

    def _expr(self, v) -> str:
        b = self._block_arg(v)
        if b is not None:
            name, comp = b
            if comp == "scalar":
                return name
            if comp == "value":
                return f"({self.values[name]})"
            raise FrontendError(f"{self.where}: a {comp} argument of {name} is used as an integer in the grid")
        o = self._owner(v)
        if o is None:
            raise FrontendError(f"{self.where}: grid uses an unbound block argument")
        n = o.name
        if n == "arith.constant":
            return str(self.ir.IntegerAttr(o.attributes["value"]).value)
        if n in ("arith.index_cast", "arith.extsi", "arith.extui", "arith.trunci", "arith.index_castui"):
            return self._expr(o.operands[0])
        if n == "llvm.extractvalue":
            src = self._block_arg(o.operands[0])
            if src is None or src[1] != "layout":
                raise FrontendError(f"{self.where}: extractvalue from something other than a tensor layout struct")
            what, d, _w = self._layout_entry(src[0], list(self.ir.DenseI64ArrayAttr(o.attributes["position"])))
            return f"{src[0]}.{what}[{d}]"
        a = lambda k: self._expr(o.operands[k])  # noqa: E731
        if n in self._BIN:
            e = f"({a(0)} {self._BIN[n][0]} {a(1)})"
            self._note_width(o, e)
            return e
        if n == "arith.floordivsi":
            return f"({a(0)} // {a(1)})"
        if n in ("arith.divsi", "arith.remsi"):
            # Truncating division: equal to the expressions' floor only for a non-negative dividend, so write it
            # exactly (``(n - 1) // 8`` at n = 0 is 0 truncated, -1 floored): bundle.expr.trunc_div.
            q, guard = _expr.trunc_div(a(0), a(1))
            self._note_guard(guard)
            return f"({q})" if n == "arith.divsi" else f"({a(0)} - ({a(1)}) * ({q}))"
        if n in ("arith.divui", "arith.remui", "arith.ceildivui"):
            # Unsigned: a negative dividend reads as a huge number the expressions cannot follow; guard it out.
            if not _expr.nonnegative(a(0)):
                self._note_guard((_expr.canonical(f"{a(0)} >= 0"),))
            self._note_guard(_expr.trunc_div(a(0), a(1))[1])
            return {"arith.divui": f"({a(0)} // {a(1)})", "arith.remui": f"({a(0)} % {a(1)})",
                    "arith.ceildivui": f"cdiv({a(0)}, {a(1)})"}[n]
        if n == "arith.ceildivsi":
            return f"cdiv({a(0)}, {a(1)})"
        if n in ("arith.minsi", "arith.minui"):
            return f"min({a(0)}, {a(1)})"
        if n in ("arith.maxsi", "arith.maxui"):
            return f"max({a(0)}, {a(1)})"
        raise FrontendError(f"{self.where}: host launcher computes a launch value with {n}, which flyship cannot "
                            "express; keep grid arithmetic to + - * // % min max over tensor sizes")

    def _note_guard(self, constraints: tuple[str, ...]) -> None:
        """Add guard constraints a launch value's arithmetic needs (kept with the width constraints)."""
        for c in constraints:
            if c not in self.width_constraints:
                self.width_constraints.append(c)

    def _note_width(self, o, e: str) -> None:
        """A sum or product the launcher computes in a fixed-width integer wraps past its maximum; the guard
        keeps the inputs where it does not (FlyDSL computes ``(M + 7) // 8`` in i32: it wraps within a few
        hundred of 2**31)."""
        t = str(o.results[0].type)
        bits = {"i32": 32, "i64": 64, "i16": 16}.get(t)
        if bits is not None:
            c = _expr.canonical(f"{e} <= {2 ** (bits - 1) - 1}")
            if c not in self.width_constraints:
                self.width_constraints.append(c)

    def value(self, v) -> int:
        """Interpret the ops at the example shapes (independent of :meth:`expr`)."""
        b = self._block_arg(v)
        if b is not None:
            return int(self.scalars[b[0]])
        o = self._owner(v)
        n = o.name
        if n == "arith.constant":
            return int(self.ir.IntegerAttr(o.attributes["value"]).value)
        if n in ("arith.index_cast", "arith.extsi", "arith.extui", "arith.trunci", "arith.index_castui"):
            return self.value(o.operands[0])
        if n == "llvm.extractvalue":
            src = self._block_arg(o.operands[0])
            what, d, _w = self._layout_entry(src[0], list(self.ir.DenseI64ArrayAttr(o.attributes["position"])))
            if what == "shape":
                return int(self.shapes[src[0]][d])
            return int(self.strides[src[0]][d])
        x, y = self.value(o.operands[0]), self.value(o.operands[1])
        if n in self._BIN:
            return self._BIN[n][1](x, y)
        if n == "arith.floordivsi":
            return x // y
        if n in ("arith.divsi", "arith.divui"):
            return abs(x) // abs(y) * (1 if (x >= 0) == (y > 0) else -1)  # toward zero, exact for big ints
        if n in ("arith.ceildivsi", "arith.ceildivui"):
            return -(-x // y)
        if n in ("arith.remsi", "arith.remui"):
            return x - y * (abs(x) // abs(y) * (1 if (x >= 0) == (y > 0) else -1))
        if n in ("arith.minsi", "arith.minui"):
            return min(x, y)
        if n in ("arith.maxsi", "arith.maxui"):
            return max(x, y)
        raise FrontendError(f"{self.where}: cannot interpret {n}")

    # -- kernel arguments -----------------------------------------------------------------------
    def kernel_arg(self, v) -> tuple[list[FieldPlan], int]:
        """Fields of one kernel operand and its size in bytes."""
        b = self._block_arg(v)
        t = str(v.type)
        if b is not None:
            name, comp = b
            if comp == "pointer":
                return [FieldPlan(0, "pointer", "ptr", arg=name)], 8
            if comp == "value":
                const = self.float_values.get(name)
                if const is not None and t == "f32":  # Value("eps", "1e-6", type="f32"): an f32 constant
                    return [FieldPlan(0, "constant", "f32", value=const)], 4
                if t not in INT_WIDTHS:
                    raise FrontendError(f"{self.where}: Value {name} lowered to {t}; a Value is an integer parameter")
                e = _expr.canonical(self.values[name])
                bits = 8 * INT_WIDTHS[t]
                c = _expr.canonical(f"{e} <= {2 ** (bits - 1) - 1}")  # packed at that width: it must fit
                if c not in self.width_constraints:
                    self.width_constraints.append(c)
                return [FieldPlan(0, "expr", t, expr=e)], INT_WIDTHS[t]
            if comp == "layout":
                members = struct_members(t)
                fields, off = [], 0
                for gi, group in enumerate(members):
                    for ei, width in enumerate(group):
                        if width not in INT_WIDTHS:
                            raise FrontendError(f"{self.where}: layout struct member {width} of {name} is not an "
                                                "integer")
                        what, d, _ = self._layout_entry(name, [gi, ei])
                        fields.append(FieldPlan(off, what, width, arg=name, dim=d))
                        off += INT_WIDTHS[width]
                return fields, off
            if t not in SCALAR_FIELDS:
                raise FrontendError(f"{self.where}: scalar {name} lowered to {t}, which flyship cannot pack")
            ft = SCALAR_FIELDS[t]
            return [FieldPlan(0, "scalar", ft, arg=name)], FIELD_TYPES[ft]
        o = self._owner(v)  # fx.Int64(fx.ptrtoint(p)), upstream's MXFP4 GEMM: the kernel gets p's data pointer
        src = self._block_arg(o.operands[0]) if o is not None and o.name == "llvm.ptrtoint" and t == "i64" else None
        if src is not None and src[1] == "pointer":
            return [FieldPlan(0, "pointer", "ptr", arg=src[0])], 8
        if t in INT_WIDTHS:
            return [FieldPlan(0, "expr", t, expr=self.expr(v))], INT_WIDTHS[t]
        raise FrontendError(f"{self.where}: kernel argument of type {t} is computed in the launcher; flyship binds "
                            "only launcher arguments and integer arithmetic on tensor sizes")
