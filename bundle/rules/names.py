"""Rules on names: namespace, op, argument, output and specialization names; output dtype rules."""

from __future__ import annotations

import re

from flyship.bundle import expr as _expr
from flyship.bundle import limits as L
from flyship.bundle import model as _m
from flyship.bundle import targets as _targets
from flyship.bundle.errors import BundleError
from flyship.bundle.rules.common import fail as _fail

# torch's own operator namespaces (torch/_ops.py, torch/library.py, torch/_refs, torch/_prims, c10d and
# the compiler's higher-order ops); a bundle registering there would shadow or clash with torch's ops.
RESERVED_NAMESPACES = frozenset({
    "aten", "prim", "prims", "_prims", "_refs", "refs", "quantized", "_quantized", "torch", "_torch", "c10",
    "c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional", "_dtensor", "profiler",
    "mkldnn", "mkl", "onednn", "xnnpack", "cudnn", "miopen", "_inductor", "inductor", "higher_order",
    "_higher_order_ops", "_export", "export", "debugprims", "rngprims", "_nested", "sparse", "fft", "linalg",
    "special", "nested", "_test", "ops", "_library", "autograd", "functorch", "torchvision", "torchaudio",
    "debug_mode_ops",
})
# Attributes of torch.ops itself (torch/_ops.py _Ops: its methods and module attributes): torch.ops.<ns> for one of
# these is that attribute, not an op namespace, so ops registered there cannot be reached. Dunder names
# (__init__, __class__...) are refused as a family.
TORCH_OPS_ATTRIBUTES = frozenset({"load_library", "import_module", "loaded_libraries", "_dir", "_native"})
# A name (check_name): what torch schemas and C++ identifiers take; the JSON Schema states it for open names.
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_IDENT = re.compile(IDENTIFIER + r"\Z")


def check_name(name: object, where: str) -> None:
    """A namespace, op, argument, output or specialization name: an ASCII identifier of at most
    ``MAX_NAME`` characters (torch schemas and C++ identifiers take nothing else)."""
    if not isinstance(name, str) or len(name) > L.MAX_NAME or not _IDENT.match(name):
        shown = name[:40] + "..." if isinstance(name, str) and len(name) > 40 else name
        raise _fail(where, f"expected an ASCII identifier of at most {L.MAX_NAME} characters, got {shown!r}")


def check_namespace(ns: object, where: str) -> None:
    """A torch namespace a bundle may register ops under: an identifier, not one of torch's own.

    Raises:
        BundleError: naming the namespace; says to load under another one.
    """
    check_name(ns, where)
    what = None
    if ns in RESERVED_NAMESPACES or str(ns).startswith("_torch"):
        what = "is one of torch's own operator namespaces; a bundle cannot register ops there"
    elif ns == "_":
        what = "is torch's wildcard namespace (TORCH_LIBRARY_IMPL(_, ...)); no op can be defined in it"
    elif ns in TORCH_OPS_ATTRIBUTES or (ns.startswith("__") and ns.endswith("__")):
        what = f"names an attribute of torch.ops itself (torch.ops.{ns}), so ops registered there cannot be reached"
    if what:
        raise _fail(where, f"expected a namespace of your own, got {ns!r}, which {what}; rebuild with another "
                           "namespace or load(..., namespace='...')")


def check_names(op: _m.Op, where: str) -> None:
    """Argument and output names are identifiers, unique, and every output ``dtype`` rule means one thing:
    an input tensor's name (same dtype as that input) or a dtype name, never both, never a scalar or an
    output (the C++ core would read a tensor that is not there)."""
    names = [a.name for a in op.args] + [o.name for o in op.outputs]
    for i, a in enumerate(op.args):
        check_name(a.name, f"{where}.args[{i}].name")
    for i, o in enumerate(op.outputs):
        check_name(o.name, f"{where}.outputs[{i}].name")
    if len(set(names)) != len(names):
        raise _fail(where, f"argument names repeat: {names}; give every input and output its own name")
    if _expr.DEVICE in names:
        raise _fail(where, f"argument name {_expr.DEVICE!r} is reserved: expressions read the device's properties "
                           f"through it ({_expr.DEVICE}.cu_count); rename the argument")
    tensor_in = {a.name for a in op.args if a.kind == "tensor"}
    for i, o in enumerate(op.outputs):
        check_dtype_rule(o.name, o.dtype, names, tensor_in, f"{where}.outputs[{i}].dtype")
        check_target_dtypes(o, names, tensor_in, f"{where}.outputs[{i}].target_dtypes")


def check_dtype_rule(output: str, rule: str, names: list[str], tensor_in: set[str], ow: str) -> None:
    """One output dtype rule: an input tensor's name or a dtype name, never both, never a scalar or an output."""
    if rule in names and rule not in tensor_in:
        raise _fail(ow, f"output {output} takes its dtype from {rule!r}, which is a scalar or an output, "
                        "expected an input tensor's name or a dtype name")
    if rule in tensor_in and rule in _m.DTYPES:
        raise _fail(ow, f"output {output} dtype rule {rule!r} is ambiguous: it is both an input tensor and a "
                        "dtype name; rename the input")
    if rule not in _m.DTYPES and rule not in tensor_in:
        raise _fail(ow, f"output {output} dtype {rule!r} is neither a dtype nor an input tensor "
                        f"({', '.join(sorted(tensor_in)) or 'none'})")


def check_target_dtypes(o: _m.Output, names: list[str], tensor_in: set[str], ow: str) -> None:
    """(1.6) An output's per-target dtypes: at most ``MAX_TARGET_DTYPES`` entries, each keyed by a target flyship
    knows (a processor or a full target ID, as a code object's target) and each a dtype rule as ``dtype`` is
    (:func:`check_dtype_rule`); an entry must differ from ``dtype`` (else it says nothing, and an older loader
    would be refused for no reason)."""
    if len(o.target_dtypes) > L.MAX_TARGET_DTYPES:
        raise _fail(ow, f"expected at most {L.MAX_TARGET_DTYPES} targets, got {len(o.target_dtypes)}")
    for key, rule in o.target_dtypes.items():
        try:
            _targets.check_known(key)
        except BundleError as e:
            raise _fail(f"{ow}.{key[:40]}", f"expected a known target ID or processor as the key, got {key[:40]!r}: "
                                            f"{e}") from None
        check_dtype_rule(o.name, rule, names, tensor_in, f"{ow}.{key}")
        if rule == o.dtype:
            raise _fail(f"{ow}.{key}", f"output {o.name}'s dtype on {key} is {rule!r}, its dtype everywhere "
                                       "(dtype) too; expected only the targets where it differs")


# ---------------------------------------------------------------------------------------------
# Values


def check_out_names(op: _m.Op, where: str) -> None:
    """The ``.out`` variant's keyword names (``out`` for one output, else the outputs' names) are not input names
    (torch refuses a schema with two arguments of one name)."""
    names = ["out"] if len(op.outputs) == 1 else [o.name for o in op.outputs]
    clash = set(names) & {a.name for a in op.args}
    if clash:
        raise _fail(where, f"input names {sorted(clash)} collide with the out= argument names of the out variant; "
                           "rename the inputs")
