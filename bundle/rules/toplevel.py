"""Rules on the manifest as a whole: its namespace, files named, ops, failures and schema version."""

from __future__ import annotations

from flyship.bundle import limits as L
from flyship.bundle import model as _m
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.bundle.rules.backward import check_backward
from flyship.bundle.rules.common import SHA256 as _SHA256
from flyship.bundle.rules.common import count as _count
from flyship.bundle.rules.composites import check_composites
from flyship.bundle.rules.common import fail as _fail
from flyship.bundle.rules.files import check_relative_path
from flyship.bundle.rules.names import check_name, check_namespace
from flyship.bundle.rules.ops import check_op


def check_manifest(m: _m.Manifest) -> None:
    """Every rule a manifest must pass on its own (the JSON Schema covers the shapes of values).

    Raises:
        BundleError: naming the JSON path (``ops[0].specializations[1]...``), op, specialization and target.
    """
    check_namespace(m.namespace, "manifest namespace")
    _count(m.ops, L.MAX_OPS, "ops", "manifest ops")
    if m.references is not None:
        check_relative_path(m.references, "manifest references")
        if m.references_sha256 is not None and not _SHA256.match(m.references_sha256):
            raise _fail("manifest references_sha256", f"expected 64 lowercase hex digits, got {m.references_sha256!r}")
    for key, f in m.offload_bundles.items():
        check_relative_path(f, f"manifest offload_bundles.{key}")
    for f, digest in m.offload_bundles_sha256.items():
        if not _SHA256.match(digest):
            raise _fail(f"manifest offload_bundles_sha256.{f}", f"expected 64 lowercase hex digits, got {digest!r}")
    seen_ops: set[str] = set()
    for i, op in enumerate(m.ops):
        check_name(op.name, f"manifest ops[{i}].name")
        if op.name in seen_ops:
            raise _fail(f"manifest ops[{i}].name", f"op name {op.name!r} is duplicated")
        seen_ops.add(op.name)
        check_op(op, f"manifest ops[{i}] (op {op.name})")
    check_composites(m)
    for op in m.ops:
        if op.backward is not None:
            check_backward(m, op, op.backward)
    check_failures(m)
    check_must_understand(m)


def check_must_understand(m: _m.Manifest) -> None:
    """A manifest that uses a must-understand key says a major version whose readers understand it
    (``docs/bundle-format.md``): a loader of an older major refuses it instead of ignoring the key.

    Raises:
        BundleError: ``then``, ``workspaces`` or ``mutable`` under 1.x, ``zero`` under 1.x or 2.x, ``consumes``,
            ``composites`` or a workspace sized by the device under 1.x to 3.x, ``dirty`` (the forward of an
            autograd pair that writes an input in place) under 1.x to 4.x, ``target_dtypes`` (an output whose dtype
            differs per target) under 1.x to 5.x.
    """
    major = int(m.schema_version.split(".")[0])
    late = [k for k in _m.must_understand(m) if _m.MUST_UNDERSTAND[k] > major]
    if late:
        raise _fail("manifest schema_version",
                    f"expected {_m.version_for(m)} for a bundle that uses {', '.join(late)}, got "
                    f"{m.schema_version!r}: a {major}.x loader would ignore "
                    f"{'that key' if len(late) == 1 else 'those keys'} and run the ops wrongly; rebuild the bundle "
                    "with this flyc-build")


def check_failures(m: _m.Manifest) -> None:
    """``failed`` (a ``--keep-going`` build's kernels that did not build): each names an op of the bundle, a
    specialization name, a target ID and a reason, once per (op, spec, target).

    Raises:
        BundleError: naming the entry.
    """
    _count(m.failed, L.MAX_OPS * L.MAX_SPECIALIZATIONS, "failed kernels", "manifest failed")
    names = {o.name for o in m.ops}
    seen: set[tuple[str, str, str]] = set()
    for i, f in enumerate(m.failed):
        where = f"manifest failed[{i}]"
        if f.op not in names:
            raise _fail(f"{where}.op", f"expected an op of this bundle, got {f.op!r}")
        check_name(f.spec, f"{where}.spec")
        try:
            _targets.parse_target(f.target)
        except BundleError as e:
            raise _fail(f"{where}.target", str(e)) from None
        if not isinstance(f.reason, str) or not f.reason:
            raise _fail(f"{where}.reason", f"expected the build's message, got {f.reason!r}")
        key = (f.op, f.spec, f.target)
        if key in seen:
            raise _fail(where, f"({f.op}, {f.spec}, {f.target}) is listed twice")
        seen.add(key)
