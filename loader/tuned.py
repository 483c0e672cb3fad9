"""A tuning table applied at load (``load(tuning=)``): the winners for this device become guards the C++ core
checks per call (:func:`apply`). The race that writes tables is :mod:`flyship.loader.tools.tune`."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import limits as _limits
from flyship.bundle import manifest as _m
from flyship.bundle import tuning as _tt
from flyship.bundle.errors import BundleError


def device_cus(device: int = 0) -> Optional[int]:
    """The device's CU (AMD) / SM (NVIDIA) count as torch reports it, or None without a GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(device).multi_processor_count)
    except Exception:  # no GPU runtime: the table's CU counts are then not compared
        pass
    return None


def _note(msg: str) -> None:
    warnings.warn(msg, stacklevel=3)


def apply(manifest: _m.Manifest, table: _tt.Table, target: str, cus: Optional[int],
          note: Callable[[str], None] = _note) -> _m.Manifest:
    """The manifest with the table's winners for this device placed first, per op, as guards.

    Each bucket of the nearest-bucket policy becomes a specialization named ``<winner>__t<i>``: the
    winner's guard plus the bucket's bounds on the key expressions, and the winner's variants. The
    bundle's own specializations follow unchanged, for inputs the winner's guard does not admit.

    A bucket the original wins (winner :data:`flyship.bundle.tuning.ORIGINAL`) becomes a specialization
    named ``(original)__t<i>`` with the bucket's bounds as its only guard and no variants: the selector
    (:func:`flyship.loader.selection.make_selector`) marks it "the reference, on purpose", so such a call
    runs the op's reference without a fallback warning, even with ``fallback=False``, and ``stats()`` counts
    it under ``"original"``.

    Raises:
        BundleError: the table names an op the bundle lacks, an op whose key differs from the bundle's,
            or a winner the op does not have.
    """
    if table.namespace and table.namespace != manifest.namespace:
        note(f"flyship tuning: the table was written for namespace {table.namespace!r}, the bundle is "
             f"{manifest.namespace!r}; using it by op name")
    entries = _tt.entries_for(table, target, cus, note)
    ops = []
    for op in manifest.ops:
        mine = [e for e in entries if e.op == op.name]
        key = table.keys.get(op.name)
        if key is not None and tuple(_expr.canonical(k) for k in key) != op.tuning_key:
            raise BundleError(f"tuning table: op {op.name} is keyed by {list(key)}, the bundle's key is "
                                  f"{list(op.tuning_key)}; re-run `flyship tune` for this bundle")
        if not mine:
            ops.append(op)
            continue
        specs = {s.name: s for s in op.specializations}
        tuned = []
        plan = _tt.dispatch_plan(op.tuning_key, mine)
        room = _limits.MAX_SPECIALIZATIONS - len(op.specializations)
        if len(plan) > room:  # each bucket is a guard the core checks in order: refused before any is made
            raise BundleError(f"tuning table: op {op.name}: expected at most {room} key buckets for {target} (the "
                              f"limit of {_limits.MAX_SPECIALIZATIONS} specializations an op may have, less its "
                              f"{len(op.specializations)}), got {len(plan)} from {len(mine)} entries whose winners "
                              "alternate; tune fewer shapes, or keep the entries where the winner changes")
        for i, (winner, cons) in enumerate(plan):
            if winner == _tt.ORIGINAL:
                base = op.specializations[0]
                tuned.append(_m.Specialization(f"{winner}{_tt.TUNED_SUFFIX}{i}", _m.Guard({}, cons), base.example, ()))
                continue
            if winner not in specs:
                raise BundleError(f"tuning table: op {op.name}: winner {winner!r} is not a specialization of "
                                      f"the bundle ({', '.join(specs)}); the table belongs to another build")
            s = specs[winner]
            guard = dataclasses.replace(s.guard, constraints=tuple(s.guard.constraints) + cons)
            tuned.append(dataclasses.replace(s, name=f"{winner}{_tt.TUNED_SUFFIX}{i}", guard=guard))
        ops.append(dataclasses.replace(op, specializations=tuple(tuned) + tuple(op.specializations)))
    for name in sorted({e.op for e in entries} - {o.name for o in manifest.ops}):
        raise BundleError(f"tuning table: op {name} is not in the bundle ({', '.join(o.name for o in manifest.ops)})")
    return dataclasses.replace(manifest, ops=tuple(ops))
