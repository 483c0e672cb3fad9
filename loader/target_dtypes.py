"""Outputs whose dtype differs per target (manifest 1.6 ``outputs[].target_dtypes``, written as 6.0): an fp8 output
that is ``float8_e4m3fnuz`` on gfx942 and ``float8_e4m3fn`` on gfx950.

A process's ops are registered once, and torch's fake kernels (torch.compile) see no device target, so the dtype
is fixed per process at load by the target of its devices (:func:`resolve`): each such output's rule becomes the
one :func:`flyship.bundle.targets.output_dtype` gives for that target, and everything downstream (the C++ output
rules and ``out=`` checks, the fake kernels, the CPU path) reads that one rule. A process with no GPU (the host)
keeps the output's ``dtype``; a dry run (:func:`flyship.dry_run`) takes its ``target``'s. A process whose GPUs
need different dtypes for one output is refused at load. The reference computes in the output's ``dtype``;
where the device's differs, its result is converted (:func:`convert_reference`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

from flyship.bundle import model as _m
from flyship.bundle import targets as _targets
from flyship.errors import ConfigError
from flyship.loader import extension as _extension
from flyship.loader import plancache as _plancache


def device_targets(ext: Any) -> list[str]:
    """The target IDs of the devices this process's ops run on: the recorded or emulated device (host flavors),
    else every GPU torch sees; ``[]`` on a machine without a GPU."""
    if ext.flavor() in _extension.HOST_FLAVORS:
        return [ext.device_info(0)["target"]]
    import torch

    try:
        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - a torch without a GPU runtime: the host
        count = 0
    return [ext.device_info(i)["target"] for i in range(count)]


def resolve(plan: _plancache.BundlePlan, targets_of: Callable[[], list[str]]
            ) -> tuple[_plancache.BundlePlan, Optional[str]]:
    """``plan`` with each output's per-target dtype written as its one rule for the process's devices' targets
    (``targets_of()``, asked only when some output has per-target dtypes), and the target chosen (None: the
    host, or no output has per-target dtypes: ``plan`` itself).

    Raises:
        ConfigError: two of ``targets`` need different dtypes for one output.
    """
    if not any(o.target_dtypes for op in plan.head.ops for o in op.outputs):
        return plan, None
    targets = targets_of()
    ops = []
    for op in plan.head.ops:
        outputs = []
        for o in op.outputs:
            rules = {t: _targets.output_dtype(o, t) for t in targets}
            if len(set(rules.values())) > 1:
                listed = ", ".join(f"{t}: {r}" for t, r in rules.items())
                raise ConfigError(f"load bundle: op {op.name} output {o.name}: expected one dtype on every GPU of the "
                                  f"process, got {listed} (the output's dtype differs per target and an op's dtype "
                                  "is fixed per process); make GPUs of one target visible (HIP_VISIBLE_DEVICES / "
                                  "CUDA_VISIBLE_DEVICES), one process per target")
            rule = next(iter(rules.values()), o.dtype)
            outputs.append(dataclasses.replace(o, dtype=rule, target_dtypes={}))
        ops.append(dataclasses.replace(op, outputs=tuple(outputs)))
    return plan.with_head(dataclasses.replace(plan.head, ops=tuple(ops))), (targets[0] if targets else None)


def convert_reference(ref: Optional[Callable[..., Any]], declared: _m.Op, resolved: _m.Op
                      ) -> Optional[Callable[..., Any]]:
    """The reference of ``declared`` as the op runs it once resolved for the device (``resolved``): a result whose
    output's dtype rule changed (a torch dtype name, e.g. float8_e4m3fn -> float8_e4m3fnuz) is converted with
    ``.to`` (values keep their meaning; one out of the new format's range becomes what ``.to`` makes of it);
    ``ref`` itself when no rule changed."""
    changed = {j: r.dtype for j, (o, r) in enumerate(zip(declared.outputs, resolved.outputs)) if o.dtype != r.dtype}
    if ref is None or not changed:
        return ref
    import torch

    to = {j: getattr(torch, d) for j, d in changed.items() if d in _m.DTYPES}
    inputs = {a.name: i for i, a in enumerate(declared.args)}
    from_input = {j: inputs[d] for j, d in changed.items() if d not in _m.DTYPES}

    @functools.wraps(ref)
    def converted(*args: Any, **kwargs: Any) -> Any:
        out = ref(*args, **kwargs)
        single = isinstance(out, torch.Tensor)
        outs = [out] if single else list(out) if isinstance(out, (tuple, list)) else None
        if outs is None or len(outs) != len(declared.outputs):
            return out  # the caller's checks name what is wrong
        for j in changed:
            want = to.get(j)
            if want is None:  # the rule names an input: its dtype at this call
                k = from_input[j]
                src = args[k] if k < len(args) else kwargs.get(declared.args[k].name)
                want = getattr(src, "dtype", None)
            if isinstance(outs[j], torch.Tensor) and want is not None and outs[j].dtype != want:
                outs[j] = outs[j].to(want)
        return outs[0] if single else type(out)(outs)

    return converted


def check_dispatch_out(qualname: str, declared: _m.Op, resolved: _m.Op, target: str) -> None:
    """``dispatch(..., target=, out=)``: out= tensors are checked against the dtype of this process's devices
    (:func:`resolve`), so deciding ``.out`` for a target whose per-target dtype differs would judge them by the
    wrong one; refused.

    Raises:
        ConfigError: naming the output, both dtypes and what to do.
    """
    for o, r in zip(declared.outputs, resolved.outputs):
        want = _targets.output_dtype(o, target)
        if want != r.dtype:
            raise ConfigError(f"{qualname}.dispatch: output {o.name}'s dtype is {want} on {target} and {r.dtype} on "
                              "this process's devices (it differs per target, and out= tensors are checked against "
                              f"this process's); dispatch without out= for {target}, or use "
                              f"flyship.dry_run(bundle, target={target!r}) to run .out as on such a device")
