"""Which kernel parameters a kernel stores through, read from its IR (issue 9, pattern 7).

A spec says which tensors a kernel writes: its ``Output``s and the inputs it declares ``mutable``. A kernel that
also stores through another input would mutate the caller's tensor behind torch's back (a schema without
``Tensor(a!)`` lets torch.compile reorder, share or drop it), so flyc-build refuses it, naming the parameter.

Both readers follow pointers from the kernel's parameters through the ops that compute addresses, and report
the parameters whose pointers reach a store or an atomic:

* :func:`llvm_written_params` reads LLVM IR (the module FlyDSL's ROCDL serializer compiles, kept by
  :mod:`.flydsl.capture`): ``store``, ``atomicrmw``, ``cmpxchg``, ``llvm.mem{cpy,move,set}`` destinations and
  AMDGPU store/atomic intrinsics (buffer resources made from a parameter's pointer included).
* :func:`ttir_written_params` reads Triton's TTIR: ``tt.store``, ``tt.atomic_rmw``, ``tt.atomic_cas`` and
  ``tt.descriptor_store`` / ``tt.descriptor_reduce`` / ``tt.descriptor_scatter``.

:func:`llvm_accumulated_params` and :func:`ttir_accumulated_params` follow the same dataflow to the writes that
read the old value back (an atomic add, a CAS loop, a reduce-store; not an exchange): a kernel that accumulates
into an ``Output`` needs it zero-filled (``Output(..., zero=True)``), since the loader allocates outputs
uninitialised otherwise.

The dataflow is conservative in one direction only: a value computed from a parameter's pointer carries that
parameter, except what is *loaded* from memory (an index read from a tensor is data, not an address of the
tensor). Loop-carried values (``phi``, ``iter_args``) are followed to a fixed point. A pointer chosen between
parameters carries each of them: ``select`` / ``arith.select`` its two values (not the condition), ``phi`` its
incoming values, a TTIR ``scf.if`` result what its branches ``scf.yield`` at that position, and an ``scf.for`` /
``scf.while`` result and loop-carried argument what the loop yields or passes on (``scf.condition``).
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    from flyship.bundle.manifest import KernargLayout, KernelMetadata

_LLVM_NAME = r"%[-\w.$]+"
_LLVM_PTR_OPERAND = re.compile(r"\bptr(?:\s+addrspace\(\d+\))?(?:\s+(?:noundef|nonnull|align\s+\d+|"
                               r"nocapture|readonly|writeonly|noalias))*\s+(" + _LLVM_NAME + ")")
_LLVM_REF = re.compile(_LLVM_NAME)
_LLVM_DEF = re.compile(r"^\s*(" + _LLVM_NAME + r")\s*=\s*(.*)$")
# Results that are data read from memory, not addresses derived from their operands.
_LLVM_LOADS = re.compile(r"^(?:load\b|atomicrmw\b|cmpxchg\b|"
                         r"(?:tail\s+|notail\s+|musttail\s+)?call\b.*@llvm\.[\w.]*load)")


def _split_top_level(text: str) -> list[str]:
    """``text`` split at commas outside brackets (LLVM struct types hold commas)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "({[<":
            depth += 1
        elif ch in ")}]>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


@functools.lru_cache(maxsize=4)  # read by the taint analysis and the unread-parameters pass of the same kernel
def _llvm_function(ir: str, symbol: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The parameter names and the body lines of ``define ... @symbol(...)``.

    Raises:
        ValueError: no such function in ``ir``.
    """
    lines = ir.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*define\b.*?@\"?" + re.escape(symbol) + r"\"?\(", line)
        if not m:
            continue
        depth, j = 1, m.end()
        while j < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            j += 1
        params = []
        for p in _split_top_level(line[m.end():j - 1]):
            names = _LLVM_REF.findall(p)
            params.append(names[-1] if names else "")
        body = []
        for rest in lines[i + 1:]:
            if rest.startswith("}"):
                break
            body.append(rest.split(";", 1)[0])
        return tuple(params), tuple(body)  # shared through the cache: never mutated
    raise ValueError(f"no function @{symbol} in the LLVM IR")


@functools.lru_cache(maxsize=16384)  # each line is read by the stored-through and accumulated-through passes
def _llvm_operation(inst: str) -> tuple[str, tuple[str, ...], str | None]:
    """An instruction's operation text (without ``%v =``), its pointer operands, and the callee it calls (or None)."""
    body = (inst.split("=", 1)[1] if _LLVM_DEF.match(inst) else inst).strip()
    call = re.search(r"\bcall\b.*?@([\w.$\"]+)\(", body)
    return body, tuple(_LLVM_PTR_OPERAND.findall(body)), call.group(1) if call else None


def _llvm_stored_through(inst: str) -> tuple[str, ...]:
    """The pointer operands an instruction writes through (empty for one that writes no memory)."""
    body, ptrs, callee = _llvm_operation(inst)
    if not ptrs:
        return ()
    if re.match(r"store\b", body):
        return ptrs[-1:]  # store <ty> %value, ptr %address: a stored pointer is a value, not a destination
    if re.match(r"(atomicrmw|cmpxchg)\b", body):
        return ptrs[:1]
    if callee is None:
        return ()
    if re.match(r"\"?llvm\.mem(cpy|move|set)", callee):
        return ptrs[:1]
    if re.search(r"store|atomic", callee):
        return ptrs
    return ()


def _llvm_accumulated_through(inst: str) -> tuple[str, ...]:
    """The pointer operands an instruction atomically reads, modifies and writes back (``atomicrmw`` but an
    exchange, ``cmpxchg`` (a CAS loop is how a float add without a native atomic lowers), AMDGPU atomic
    intrinsics but swaps): the memory must hold a defined value first."""
    body, ptrs, callee = _llvm_operation(inst)
    if not ptrs:
        return ()
    if re.match(r"atomicrmw\s+(?:volatile\s+)?xchg\b", body):
        return ()  # an exchange writes a value that does not depend on the old one
    if re.match(r"(atomicrmw|cmpxchg)\b", body):
        return ptrs[:1]
    if callee is None:
        return ()
    if re.search(r"atomic", callee) and not re.search(r"swap|xchg|store", callee):
        return ptrs
    return ()


def llvm_written_params(ir: str, symbol: str) -> set[int]:
    """Indices of ``@symbol``'s parameters whose pointers reach a store or an atomic in LLVM IR ``ir``.

    Raises:
        ValueError: ``ir`` defines no ``@symbol``.
    """
    return _llvm_params_reaching(ir, symbol, _llvm_stored_through)


def llvm_accumulated_params(ir: str, symbol: str) -> set[int]:
    """Indices of ``@symbol``'s parameters whose pointers reach an atomic read-modify-write in LLVM IR ``ir``
    (an atomic add into an output: the output must start from zeros).

    Raises:
        ValueError: ``ir`` defines no ``@symbol``.
    """
    return _llvm_params_reaching(ir, symbol, _llvm_accumulated_through)


def _llvm_params_reaching(ir: str, symbol: str, operands: Callable[[str], list[str]]) -> set[int]:
    """Indices of ``@symbol``'s parameters whose pointers reach a pointer operand ``operands`` picks from a line."""
    taint, body = _llvm_taint(ir, symbol)
    out: set[int] = set()
    for line in body:
        for p in operands(line):
            out |= taint.get(p, frozenset())
    return out


@functools.lru_cache(maxsize=4)  # one analysis for the written and the accumulated parameters of a kernel
def _llvm_taint(ir: str, symbol: str) -> tuple[dict[str, frozenset[int]], tuple[str, ...]]:
    """Each value of ``@symbol`` -> the parameters whose pointers it carries, and the function's body lines."""
    params, body = _llvm_function(ir, symbol)
    taint: dict[str, frozenset[int]] = {p: frozenset({i}) for i, p in enumerate(params) if p}
    defs = []
    for line in body:
        m = _LLVM_DEF.match(line)
        if m:
            rhs = m.group(2).strip()
            refs = _LLVM_REF.findall(rhs)
            if re.match(r"select\b", rhs):  # select i1 %c, <ty> %a, <ty> %b: the condition is not a value of it
                refs = refs[1:]
            defs.append((m.group(1), frozenset() if _LLVM_LOADS.match(rhs) else None, refs))
    _fixed_point(taint, ((name, fixed, refs) for name, fixed, refs in defs))
    return taint, body


_TT_REF = re.compile(r"%([\w$.-]+(?:#\d+)?)")  # a use: %v, or %r#1 for result 1 of a multi-result op
_TT_RESULTS = re.compile(r"^\s*(%[\w$.-]+(?::\d+)?(?:\s*,\s*%[\w$.-]+)*)\s*=\s*")
_TT_DEF = re.compile(r"^\s*%([\w$.-]+)(?::\d+)?(?:\s*,\s*%[\w$.-]+)*\s*=\s*([\w.]+)(.*)$")
_TT_STORES = ("tt.store", "tt.atomic_rmw", "tt.atomic_cas", "tt.descriptor_store", "tt.descriptor_reduce",
              "tt.descriptor_scatter")
# The writes that read the old value back (an atomic add, a CAS, a reduce-store): the memory must be defined first.
_TT_ACCUMULATES = ("tt.atomic_rmw", "tt.atomic_cas", "tt.descriptor_reduce")
_TT_LOADS = ("tt.load", "tt.descriptor_load", "tt.descriptor_gather", "tt.atomic_rmw", "tt.atomic_cas")


def _tt_results(line: str) -> list[str]:
    """The result names an op line defines, as its uses spell them: ``%v`` -> [v]; ``%r:2`` -> [r#0, r#1];
    ``%a, %b`` -> [a, b]; none for an op without results."""
    m = _TT_RESULTS.match(line)
    if not m:
        return []
    out = []
    for part in m.group(1).split(","):
        name, _, count = part.strip()[1:].partition(":")
        out += [f"{name}#{i}" for i in range(int(count))] if count else [name]
    return out


def _strip_locations(line: str) -> str:
    return re.sub(r"\bloc\((?:[^()]|\([^()]*\))*\)", "", line)


def _ttir_head(lines: list[str]) -> tuple[int, list[tuple[str, str]]]:
    """The line of the public ``tt.func`` and its arguments as (SSA name, type), in order."""
    head = next((i for i, x in enumerate(lines) if re.match(r"\s*tt\.func\s+public\b", x)), None)
    if head is None:
        raise ValueError("no public tt.func in the TTIR")
    start = lines[head].index("(")  # the argument list: up to its matching ")" (attributes hold braces)
    depth, end = 0, len(lines[head])
    for j in range(start, len(lines[head])):
        depth += {"(": 1, ")": -1}.get(lines[head][j], 0)
        if depth == 0:
            end = j
            break
    args = _split_top_level(lines[head][start + 1:end])
    return head, [(m.group(1), m.group(2)) for a in args
                  if (m := re.match(r"\s*%([\w$.-]+)\s*:\s*(!tt\.ptr<[^>]*>|[\w!.<>]+)", a))]


def ttir_params(ttir: str) -> list[tuple[str, str]]:
    """The kernel's runtime parameters as the TTIR declares them, in order (constexprs left out): (SSA name,
    type). The SSA names are only the printer's: Triton tags an argument with the name of the local a kernel
    last binds it to (``src = x`` names ``x``'s argument ``%src``), so a binding goes by position, never by name.

    Raises:
        ValueError: ``ttir`` holds no public ``tt.func``.
    """
    return _ttir_head([_strip_locations(x) for x in ttir.splitlines()])[1]


def ttir_written_params(ttir: str) -> tuple[list[str], set[int]]:
    """The kernel's runtime parameters (TTIR argument SSA names, constexprs left out, in order: see
    :func:`ttir_params`) and the indices of those whose pointers reach a store or an atomic.

    Raises:
        ValueError: ``ttir`` holds no public ``tt.func``.
    """
    params, taint, stores = _ttir_flow(ttir)
    written: set[int] = set()
    for _op, _kind, p in stores:
        written |= taint.get(p, frozenset())
    return params, written


def ttir_accumulated_params(ttir: str) -> set[int]:
    """Indices of the kernel's runtime parameters (as :func:`ttir_params` orders them) whose pointers reach an
    atomic read-modify-write (``tt.atomic_rmw`` but ``exch``, ``tt.atomic_cas``, ``tt.descriptor_reduce``).

    Raises:
        ValueError: ``ttir`` holds no public ``tt.func``.
    """
    _params, taint, stores = _ttir_flow(ttir)
    out: set[int] = set()
    for op, kind, p in stores:
        if op in _TT_ACCUMULATES and not (op == "tt.atomic_rmw" and kind == "exch"):
            out |= taint.get(p, frozenset())
    return out


def _ttir_flow(ttir: str) -> tuple[list[str], dict[str, frozenset[int]], list[tuple[str, str, str]]]:
    """The runtime parameters' SSA names, each value -> the parameters whose pointers it carries, and every
    write as (op, its first keyword (``fadd`` of ``tt.atomic_rmw fadd, ...``), the pointer it writes through)."""
    lines = [_strip_locations(x) for x in ttir.splitlines()]
    head, args = _ttir_head(lines)
    params = [name for name, _type in args]
    taint: dict[str, frozenset[int]] = {p: frozenset({i}) for i, p in enumerate(params)}
    defs: list[tuple[str, frozenset[int] | None, list[str]]] = []
    stores: list[tuple[str, str, str]] = []
    # The region ops (scf.if, scf.for, scf.while, ...) open around the current line: (op, its results, the values
    # its regions' yields flow into besides them: scf.for's iter_args, scf.while's "before" arguments).
    regions: list[tuple[str, list[str], list[str]]] = []
    for line in lines[head + 1:]:
        text = line.strip()
        if text.startswith("}"):
            if not text.endswith("{") and regions:  # "} else {" / "} do {" stay in the op
                regions.pop()
            continue
        carried = []
        if "iter_args(" in line or re.search(r"=\s*scf\.while\s*\(", line):
            tail = line.split("iter_args(", 1)[1] if "iter_args(" in line else line.split("scf.while", 1)[1]
            for dst, src in re.findall(r"%([\w$.-]+)\s*=\s*%([\w$.-]+(?:#\d+)?)", tail.split(")", 1)[0]):
                defs.append((dst, None, [src]))  # a loop-carried value starts as its initial value
                carried.append(dst)
        m = _TT_DEF.match(line)
        op = m.group(2) if m else text.split(" ", 1)[0].split("(", 1)[0]
        if op in _TT_STORES:
            operands = line.split(op, 1)[1]
            first = _TT_REF.search(operands)
            kind = re.match(r"\s*(\w+)", operands)
            if first:
                stores.append((op, kind.group(1) if kind else "", first.group(1)))
        results = _tt_results(line)
        if m:
            refs = [] if op == "scf.if" else _TT_REF.findall(m.group(3))  # an if's results are what it yields
            if op == "arith.select":  # the condition chooses between the two values; it is not one of them
                refs = refs[1:]
            for r in results:  # each result carries its operands' parameters (a region op's also its yields')
                defs.append((r, frozenset() if op in _TT_LOADS else None, refs))
        if op in ("scf.yield", "scf.condition") and regions:
            region_op, into_results, into_carried = regions[-1]
            values = _TT_REF.findall(line.split(":", 1)[0] if " : " in line else line)
            if op == "scf.condition":  # scf.condition(%c) %a, %b: the while's results are %a, %b
                values, into_carried = values[1:], []
            elif region_op == "scf.while":  # the "do" region's yield feeds the "before" arguments only
                into_results = []
            for i, v in enumerate(values):
                for target in (into_results, into_carried):
                    if i < len(target):
                        defs.append((target[i], None, [v]))
        block = re.match(r"\^bb\d+\((.*)\):", text)
        if block and regions and regions[-1][0] == "scf.while":  # the "do" region's arguments: the results
            for name, res in zip(re.findall(r"%([\w$.-]+)\s*:", block.group(1)), regions[-1][1]):
                defs.append((name, None, [res]))
        if text.endswith("{"):
            regions.append((op, results, carried))
    _fixed_point(taint, defs)
    return params, taint, stores


def _fixed_point(taint: dict[str, frozenset[int]],
                 defs: Iterable[tuple[str, frozenset[int] | None, list[str]]]) -> None:
    """Propagate parameter sets through ``defs`` (name, fixed set or None to take the union of the referenced
    names' sets, referenced names) until nothing changes (loop-carried values refer to later definitions)."""
    defs = list(defs)
    for _ in range(64):
        changed = False
        for name, fixed, refs in defs:
            got = fixed if fixed is not None else frozenset().union(*(taint.get(r, frozenset()) for r in refs))
            if fixed is None and name in taint:
                got = got | taint[name]
            if got and taint.get(name) != got:
                taint[name] = got
                changed = True
        if not changed:
            return


# -- parameters the kernel never reads (issue 23, item 7b) ---------------------------------------------------------
#
# A stride declared as a ``Value`` tells the loader the kernel follows that stride, so it drops the row-major guard
# of that dimension (flyship.loader.plan.implied_layout_constraints). A kernel that never reads the parameter then
# receives any view (``W[::2]``) and indexes it as if it were contiguous: a silent wrong result. The IR shows it: the
# parameter has no use in the kernel's body.


def llvm_unread_params(ir: str, symbol: str) -> set[int]:
    """Indices of ``@symbol``'s parameters that no instruction of its body names (LLVM IR ``ir``). A parameter
    the printer left without a name counts as read (nothing can be said of it).

    Raises:
        ValueError: ``ir`` defines no ``@symbol``.
    """
    params, body = _llvm_function(ir, symbol)
    used = {name for line in body for name in _LLVM_REF.findall(line)}
    return {i for i, p in enumerate(params) if p and p not in used}


def ttir_unread_params(ttir: str) -> set[int]:
    """Indices of the kernel's runtime parameters (as :func:`ttir_params` orders them) that no op of the public
    ``tt.func`` uses.

    Raises:
        ValueError: ``ttir`` holds no public ``tt.func``.
    """
    lines = [_strip_locations(x) for x in ttir.splitlines()]
    head, args = _ttir_head(lines)
    used: set[str] = set()
    for line in lines[head + 1:]:
        used.update(r.split("#", 1)[0] for r in _TT_REF.findall(line))
    return {i for i, (name, _type) in enumerate(args) if name not in used}


def unread_stride(unread: frozenset[int], meta: "KernelMetadata", layout: "KernargLayout",
                  example_strides: "dict[str, tuple[int, ...]] | None" = None) -> str | None:
    """Why to refuse a kernel that is passed a tensor's stride (a ``Value`` that is exactly ``x.stride[d]``) but never
    reads it: the declared stride lifts the loader's row-major guard of that dimension, so views the kernel cannot
    index would reach it. Only a stride that fills a whole explicit parameter is judged (a FlyDSL layout struct
    is read or not as a whole).

    Args:
        unread: explicit kernel parameters (metadata order) the kernel's IR never uses.
        example_strides: the example call's strides (tensor -> strides): the constant the refusal suggests is the
            example's own stride, so the build keeps the specialization Triton's JIT gives that call (an int equal
            to 1 compiled in, a multiple of 16 marked divisible, its int type); round 2's suggestion, ``"0"``, is
            divisible by 16 where the JIT saw a 1 and built another binary.

    Returns:
        the refusal (naming the parameter, the stride and the two fixes), or None when every declared stride is read.
    """
    explicit = [a for a in meta.args if not a.hidden]
    whole = {(a.offset, a.size): i for i, a in enumerate(explicit)}
    for f in layout.fields:
        i = whole.get((f.offset, f.size))
        if f.kind != "stride" or i is None or i not in unread:
            continue
        name = f.kernel_arg or explicit[i].name or f"#{i}"
        known = (example_strides or {}).get(f.arg)
        value = known[f.dim] if known is not None and f.dim is not None and 0 <= f.dim < len(known) else None
        constant = (f"the example call's own stride as a constant instead of the Value (Value({name!r}, "
                    f"\"{value}\")): it keeps the specialization Triton's JIT gives that call, so the binary stays "
                    f"the JIT's (another constant may not: \"0\" is divisible by 16 where a stride of 1 is compiled "
                    f"in as a constant)" if value is not None else
                    f"a constant instead of the Value (Value({name!r}, \"<the stride your calls pass>\"): a constant "
                    "other than the call's own stride changes what Triton's JIT specializes, so the binary)")
        return (
            f"expected the kernel to read parameter {i} ({name}), declared as the stride "
            f"{f.arg}.stride[{f.dim}], got a kernel that never reads it; a declared stride tells the loader the "
            f"kernel follows it, which lifts the row-major check on {f.arg} (a view like {f.arg}[::2] would reach "
            f"the kernel and be read as contiguous); make the kernel index {f.arg} with that stride, or pass "
            f"{constant}, so the loader keeps requiring a row-major {f.arg}")
    return None
