"""Rules on autograd pairs: an op's declared backward against the bundle's ops, including a backward that writes
gradients into buffers it consumes (schema 1.4) and a forward that writes inputs in place (schema 5.0)."""

from __future__ import annotations

from flyship.bundle import model as _m
from flyship.bundle.errors import BundleError


def check_backward(m: _m.Manifest, op: _m.Op, b: _m.Backward) -> None:
    """Check an op's :class:`Backward` against the bundle: the backward op exists, each of its inputs is fed
    from a forward input, output or output gradient of the right kind, and gradients go to tensor inputs. A forward
    that writes inputs in place (schema 5.0, ``mutable``) is allowed: each such input is also an output of the pair
    for autograd (``ctx.mark_dirty``), so ``"grad:<input>"`` may feed the backward.

    Raises:
        BundleError: naming the op, the backward op and the argument.
    """
    where = f"op {op.name} backward {b.op}"
    names = [o.name for o in m.ops] + [c.name for c in m.composites]
    if b.op not in names:
        raise BundleError(f"{where}: expected an op of this bundle, got {b.op!r}, which is neither an op nor a "
                          f"composite; it has {', '.join(names)}")
    bwd = m.backward_op(b.op)
    composite = b.op not in {o.name for o in m.ops}
    fwd_kind = {a.name: a.kind for a in op.args} | {o.name: "tensor" for o in op.outputs}
    outs = [o.name for o in op.outputs]
    graded = outs + list(_m.Backward.dirty(op))  # what a gradient flows into: the outputs and the inputs written
    bwd_kind = {a.name: a.kind for a in bwd.args}
    missing = [a.name for a in bwd.args
               if a.name not in b.inputs and not (a.kind != "tensor" and a.default is not None)]
    if missing:
        raise BundleError(f"{where}: backward inputs {missing} have no source; map each to a forward input or output "
                          f"or to 'grad:<output>' ({', '.join(graded)})")
    for k, src in b.inputs.items():
        if k not in bwd_kind:
            raise BundleError(f"{where}: expected inputs of {b.op} ({', '.join(bwd_kind)}), got {k!r}")
        if src.startswith(_m.GRAD_PREFIX):
            o = src[len(_m.GRAD_PREFIX):]
            if o not in graded:
                raise BundleError(f"{where}: input {k} = {src!r}: expected 'grad:' of an output or of an input "
                                  f"{op.name} writes in place ({', '.join(graded)})")
            kind = "tensor"
        elif src in fwd_kind:
            kind = fwd_kind[src]
        else:
            raise BundleError(f"{where}: input {k} = {src!r}: expected a forward input or output "
                              f"({', '.join(fwd_kind)}) or 'grad:<output>'")
        if (kind == "tensor") != (bwd_kind[k] == "tensor"):
            raise BundleError(f"{where}: input {k} is a {bwd_kind[k]} but its source {src!r} is a {kind}")
    bwd_outs = [o.name for o in bwd.outputs]
    for x, g in b.grads.items():
        if fwd_kind.get(x) != "tensor" or x in outs:
            tensors = [a.name for a in op.args if a.kind == "tensor"]
            raise BundleError(f"{where}: grads: expected a tensor input of {op.name} "
                              f"({', '.join(tensors) or 'it has none'}), got {x!r}")
        if g not in bwd_outs and g not in bwd.mutable:
            givers = [f"output {n}" for n in bwd_outs] + [f"{n} (written in place)" for n in bwd.mutable]
            raise BundleError(f"{where}: grads[{x!r}] = {g!r}: expected a buffer {b.op} gives: "
                              f"{', '.join(givers) or 'it has no output and writes no input'}")
    if not b.grads:
        raise BundleError(f"{where}: grads is empty; name the inputs that get gradients")
    check_consumed(op, bwd, b, where)
    _check_batch_kept(op, bwd, b, where, composite)


def _check_batch_kept(op: _m.Op, bwd: _m.Op, b: _m.Backward, where: str, composite: bool) -> None:
    """Leading batch dims flow through training: what the forward saw batched, the backward op sees batched (a
    composite backward passes tensors to its ops as they are, and those ops own batching)."""
    if composite:
        return
    fwd_batch = {a.name for a in op.args if a.batch} | {o.name for o in op.outputs if o.batch}
    bwd_batch = {a.name for a in bwd.args if a.batch} | {o.name for o in bwd.outputs if o.batch}
    for k, src in b.inputs.items():
        tensor = src[len(_m.GRAD_PREFIX):] if src.startswith(_m.GRAD_PREFIX) else src
        if tensor in fwd_batch and k not in bwd_batch:
            raise BundleError(f"{where}: input {k} = {src!r} comes from a batched tensor of {op.name} (leading batch "
                              f"dimensions), but {b.op}'s {k!r} is not batched; declare it batched too")
    for x, g in b.grads.items():
        if x in fwd_batch and g not in bwd_batch:
            raise BundleError(f"{where}: grads[{x!r}] = {g!r}: {x!r} is batched, so its gradient must be a batched "
                              f"output of {b.op}; declare {g!r} batched too")


def check_consumed(op: _m.Op, bwd: _m.Op, b: _m.Backward, where: str) -> None:
    """A backward op that writes inputs in place (schema 1.4) consumes each: one backward input per source (two
    inputs fed the same tensor would alias within one launch), a gradient written into a buffer has the rank of the
    forward input it is the gradient of, and one buffer is the gradient of one input.

    Raises:
        BundleError: naming the op, the backward op and the buffer.
    """
    consumed = b.consumed(bwd)
    for k, src in consumed.items():
        others = sorted(j for j, s in b.inputs.items() if s == src and j != k)
        if others:
            raise BundleError(f"{where}: input {k} = {src!r} is written in place by {b.op}, but {src!r} also feeds "
                              f"{', '.join(others)}; a consumed buffer feeds one input (the others would read memory "
                              "the launch overwrites): save a separate tensor, or let the kernel read it from "
                              f"{k} before writing")
    rank = {a.name: a.rank for a in op.args}
    seen: dict[str, str] = {}
    for x, g in b.grads.items():
        if g not in consumed:
            continue
        if g in seen:
            raise BundleError(f"{where}: grads[{x!r}] and grads[{seen[g]!r}] both name buffer {g!r}; one buffer "
                              "holds one gradient")
        seen[g] = x
        bwd_rank = next(a.rank for a in bwd.args if a.name == g)
        if rank[x] != bwd_rank:
            raise BundleError(f"{where}: grads[{x!r}] = {g!r}: {x!r} has rank {rank[x]} but the buffer {g!r} has rank "
                              f"{bwd_rank}; a gradient written in place has the shape of its input")
