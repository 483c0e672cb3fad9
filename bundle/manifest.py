"""The bundle manifest: a closed, versioned schema shared by the compile stage and the loader.

``docs/bundle-format.md`` is the prose contract and ``schema.json`` beside this file the JSON Schema;
this module is the one reader and writer. The manifest is sorted-key JSON, so a rebuild from the same
inputs gives the same bytes. Reading refuses an unknown major version, naming both versions.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Optional

from flyship.bundle import expr as _expr
from flyship.bundle import files as _files
from flyship.bundle import limits as _limits
from flyship.bundle.errors import BundleError, ManifestVersionError

SCHEMA_MAJOR, SCHEMA_MINOR = 1, 3
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"
# Keys a reader must understand, with the first major version whose readers do (docs/bundle-format.md,
# "Must-understand keys"): later launches of a call, workspaces and inputs written in place came with 2.x, outputs
# allocated zero-filled with 3.x. A bundle is written with the lowest major that covers every such key it uses, so
# a loader that would ignore one refuses the bundle's major with its version message instead of running it wrongly.
# Every other bundle is written as 1.3.
MUST_UNDERSTAND = {"then": 2, "workspaces": 2, "mutable": 2, "zero": 3}
# major -> the newest minor this flyship knows; a newer minor of a known major is read leniently (unknown keys
# ignored), an unknown major is refused.
NEWEST_MINOR = {1: SCHEMA_MINOR, 2: 1, 3: 0}
FORMAT_NAME = "flyship-bundle"
MANIFEST_NAME = "manifest.json"

# torch dtype name -> bytes per element.
DTYPES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
# kernarg field types -> bytes.
FIELD_TYPES: dict[str, int] = {
    "ptr": 8, "i64": 8, "u64": 8, "i32": 4, "u32": 4, "i16": 2, "i8": 1,
    "f64": 8, "f32": 4, "f16": 2, "bf16": 2,
}
FIELD_KINDS = ("pointer", "shape", "stride", "scalar", "expr", "constant", "null", "scratch", "workspace")
SCALAR_TYPES = ("int", "float", "bool")
FRONTENDS = ("flydsl", "triton")
CODE_OBJECT_FORMATS = ("hsaco", "cubin")
# How a tensor reaches the kernel (FlyDSL): a bare pointer (static layout: shape and strides compiled in) or
# a pointer + a by-value struct of its dynamic shape/stride values (dynamic layout).
TENSOR_ABIS = ("static", "dynamic", "pointer")


@dataclasses.dataclass(frozen=True)
class Arg:
    """One input of an op, in the order of the op's torch schema.

    Attributes:
        name: argument name (a Python identifier).
        kind: ``"tensor"``, or a scalar type ``"int"``, ``"float"``, ``"bool"``.
        rank: number of dimensions (tensors only; 0 for scalars).
        dtypes: dtypes some specialization accepts (tensors only), torch names such as ``"bfloat16"``.
        default: default value of a scalar, or None.
        mutable: the kernel writes this input tensor in place (schema 1.2; ``Tensor(a!)`` in the torch schema,
            no fresh output is made for it). False in 1.0 / 1.1 bundles.
        batch: the tensor may carry leading batch dimensions (schema 1.2): a call's ``(B, S, H)`` reaches a
            kernel written for ``(M, H)`` as the view ``(B*S, H)`` (:mod:`flyship.bundle.batch`).
    """

    name: str
    kind: str
    rank: int = 0
    dtypes: tuple[str, ...] = ()
    default: Optional[float | int | bool] = None
    mutable: bool = False
    batch: bool = False


@dataclasses.dataclass(frozen=True)
class Output:
    """One output of an op, allocated fresh by the loader (or passed to the ``out`` variant).

    Attributes:
        name: output name.
        shape: one expression per dimension over the inputs (see :mod:`flyship.bundle.expr`).
        dtype: an input tensor's name (same dtype as that input) or a torch dtype name.
        batch: the output gets the batched inputs' leading dimensions back (schema 1.2): its first dimension
            is a batched input's flattened first dimension (``shape[0]`` is ``"<input>.shape[0]"``) and the
            call returns it viewed as ``(B, S, ...)``.
        zero: the kernel accumulates into the output (atomic adds), so the loader allocates it zero-filled and
            zero-fills an ``out=`` tensor before the launch (schema 1.3; a must-understand key).
    """

    name: str
    shape: tuple[str, ...]
    dtype: str
    batch: bool = False
    zero: bool = False


@dataclasses.dataclass(frozen=True)
class Guard:
    """What inputs a specialization accepts; the loader checks it per call.

    Attributes:
        dtypes: input tensor name -> required dtype.
        constraints: boolean expressions that must all hold (shape rules, static strides, ...).
        alignment: tensor name -> required data pointer alignment in bytes.
    """

    dtypes: dict[str, str]
    constraints: tuple[str, ...] = ()
    alignment: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class KernargField:
    """One value the loader writes into the kernarg buffer.

    Attributes:
        offset: byte offset in the kernarg segment.
        size: bytes written (``FIELD_TYPES[type]``).
        kind: one of ``FIELD_KINDS``: ``pointer`` (a tensor's data pointer), ``shape`` / ``stride``
            (``arg``'s size or stride, in elements, at ``dim``), ``scalar`` (scalar argument ``arg``),
            ``expr`` (integer expression ``expr``), ``constant`` (``value``), ``null`` (a zero pointer),
            ``scratch`` (pointer to ``bytes_per_program`` x grid programs of fresh device memory),
            ``workspace`` (schema 1.2: the data pointer of workspace ``arg`` of the variant, see
            :class:`Workspace`).
        type: value type, a key of ``FIELD_TYPES``.
        arg: the op argument (input or output name) the value comes from, if any.
        dim: dimension for ``shape`` / ``stride``.
        expr: expression for ``expr``.
        value: literal for ``constant``.
        bytes_per_program: for ``scratch``.
        align: alignment in bytes for ``scratch``.
        kernel_arg: the kernel parameter this field belongs to (metadata name or index), for people.
    """

    offset: int
    size: int
    kind: str
    type: str
    arg: Optional[str] = None
    dim: Optional[int] = None
    expr: Optional[str] = None
    value: Optional[int | float] = None
    bytes_per_program: Optional[int] = None
    align: Optional[int] = None
    kernel_arg: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class KernargLayout:
    """The explicit kernel arguments as the loader packs them.

    Attributes:
        size: extent in bytes of the explicit arguments (end of the last one); what the loader passes
            as ``HIP_LAUNCH_PARAM_BUFFER_SIZE`` / ``CU_LAUNCH_PARAM_BUFFER_SIZE``.
        alignment: required alignment of the buffer in bytes.
        fields: the values, sorted by offset, not overlapping.
    """

    size: int
    alignment: int
    fields: tuple[KernargField, ...]


@dataclasses.dataclass(frozen=True)
class Launch:
    """Launch geometry.

    Attributes:
        grid: three expressions, the number of workgroups (blocks) in x, y, z.
        block: workgroup size in work-items (threads), x, y, z.
        dynamic_lds: expression for dynamic LDS / shared memory bytes.
    """

    grid: tuple[str, str, str]
    block: tuple[int, int, int]
    dynamic_lds: str = "0"


@dataclasses.dataclass(frozen=True)
class MetadataArg:
    """One kernel argument from the code object's metadata (AMDGPU: ``amdhsa.kernels[].args[]``;
    cubin: ``EIATTR_KPARAM_INFO``).

    Attributes:
        offset: byte offset in the kernarg segment (``.offset``).
        size: bytes (``.size``).
        value_kind: ``.value_kind`` (``global_buffer``, ``by_value``, ``hidden_*``...).
        name: ``.name`` if the metadata has one.
    """

    offset: int
    size: int
    value_kind: str
    name: Optional[str] = None

    @property
    def hidden(self) -> bool:
        return self.value_kind.startswith("hidden_")


@dataclasses.dataclass(frozen=True)
class KernelMetadata:
    """Resource and ABI facts read from the code object (AMDGPU Code Object V5+ metadata, LLVM
    AMDGPUUsage "Code Object V3 Metadata" and later; for cubins, the ``.nv.info`` attributes).

    Attributes:
        kernarg_segment_size: ``.kernarg_segment_size``, bytes, hidden args included.
        kernarg_segment_align: ``.kernarg_segment_align``, bytes.
        group_segment_fixed_size: static LDS / shared memory, bytes.
        private_segment_fixed_size: scratch per work-item, bytes.
        sgpr_count: SGPRs (0 on NVIDIA).
        vgpr_count: VGPRs (registers per thread on NVIDIA).
        agpr_count: AccVGPRs (0 where the target has none).
        wavefront_size: 64 or 32.
        max_flat_workgroup_size: largest workgroup the code supports.
        reqd_workgroup_size: required workgroup size, or None.
        args: every kernel argument, hidden ones included.
    """

    kernarg_segment_size: int
    kernarg_segment_align: int
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    sgpr_count: int
    vgpr_count: int
    agpr_count: int
    wavefront_size: int
    max_flat_workgroup_size: int
    reqd_workgroup_size: Optional[tuple[int, int, int]]
    args: tuple[MetadataArg, ...]


@dataclasses.dataclass(frozen=True)
class CodeObject:
    """A code object file in the bundle.

    Attributes:
        file: path relative to the bundle root.
        sha256: hex digest of the file.
        format: ``hsaco`` (AMDGPU ELF) or ``cubin`` (NVIDIA ELF).
        target: target ID it was built for (``gfx942``, ``gfx942:sramecc+:xnack-``, ``sm_90``).
        symbol: kernel symbol (AMDGPU: the kernel descriptor is ``symbol + ".kd"``).
        code_object_version: AMDHSA code object version (5, 6), or None for cubins.
    """

    file: str
    sha256: str
    format: str
    target: str
    symbol: str
    code_object_version: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Proof:
    """How the code object was shown equal to the frontend's own binary.

    Attributes:
        method: ``flydsl-binary`` (our assembly vs FlyDSL's ``gpu.binary``) or ``frontend-binary``
            (the frontend's own binary shipped as is, e.g. Triton's cubin).
        reference_sha256: digest of the frontend's own code object.
        identical_sections: sections compared byte for byte and found identical.
        kernel_descriptor: ``"identical"`` (all 64 bytes), ``"identical-but-entry-offset"`` (entry
            offset differs but resolves to the same kernel code), or ``"n/a"``.
        metadata: ``"equal"`` or ``"n/a"``.
        differences: what differs from the frontend's own binary by design, one sentence each naming the
            field, both values and why (schema 1.2; a FlyDSL code object assembled for a target ID with features,
            ``gfx942:sramecc+:xnack-``, differs from FlyDSL's processor-only one in ``e_flags`` and
            ``amdhsa.target``); empty: nothing differs.
    """

    method: str
    reference_sha256: str
    identical_sections: tuple[str, ...]
    kernel_descriptor: str
    metadata: str
    differences: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Workspace:
    """Device memory a multi-launch variant allocates per call and passes between its launches (schema 1.2):
    a split-K partial sum, a two-pass reduction's per-block results. The loader allocates it from torch's
    caching allocator on the call's stream before the first launch; kernarg fields of kind ``workspace``
    carry its data pointer.

    Attributes:
        name: identifier, unique among the op's arguments, outputs and the variant's workspaces.
        shape: one expression per dimension over the op's inputs (like an output's shape).
        dtype: a torch dtype name; the allocation holds ``numel x element size`` bytes.
        zero: fill it with zeros (on the call's stream) before the first launch, for kernels that accumulate.
    """

    name: str
    shape: tuple[str, ...]
    dtype: str
    zero: bool = False


@dataclasses.dataclass(frozen=True)
class Variant:
    """One specialization compiled for one target.

    Attributes:
        toolchain: tool -> version for the tools that made this code object, the frontend's own included
            (``{"flydsl": "0.1.5", "llvm-mc": ...}``): the FlyDSL release a variant was built with.
        tensor_abi: tensor argument -> ``static``, ``dynamic`` or ``pointer`` (an ``fx.Pointer`` launcher
            parameter bound to the tensor's data pointer, schema 1.2) (:data:`TENSOR_ABIS`), as the frontend
            lowered it (schema 1.1; empty for Triton and in 1.0 bundles). The kernargs already say where
            each pointer and shape/stride value goes; this names the convention for people and tools.
        then: (schema 1.2) the launches that follow this one in the same call, in order, each a variant of the
            same target with its own code object (symbol), metadata, kernargs, grid, block, LDS and proof, and
            with no ``then`` or ``workspaces`` of its own. Empty for an op that launches one kernel.
        workspaces: (schema 1.2) device memory the call allocates before its first launch and that the launches'
            ``workspace`` fields point to; empty for most ops.
    """

    target: str
    code_object: CodeObject
    metadata: KernelMetadata
    kernargs: KernargLayout
    launch: Launch
    proof: Proof
    toolchain: dict[str, str]
    tensor_abi: dict[str, str] = dataclasses.field(default_factory=dict)
    then: tuple["Variant", ...] = ()
    workspaces: tuple[Workspace, ...] = ()

    @property
    def launches(self) -> tuple["Variant", ...]:
        """Every launch of one call, in order: this variant's own, then :attr:`then`."""
        return (self, *self.then)


@dataclasses.dataclass(frozen=True)
class Example:
    """The concrete call the specialization was traced with, and the geometry it gave.

    Attributes:
        shapes: tensor name -> shape.
        scalars: scalar name -> value.
        grid: the launch grid the frontend computed for these shapes (checked against ``Launch.grid``).
        strides: tensor name -> strides in elements, for the example tensors that were not row-major
            contiguous (a transposed weight); the others are contiguous (1.1; absent in 1.0: all contiguous).
    """

    shapes: dict[str, tuple[int, ...]]
    scalars: dict[str, int | float | bool]
    grid: tuple[int, int, int]
    strides: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Specialization:
    """A compiled form of an op for some inputs: a guard, and one variant per target."""

    name: str
    guard: Guard
    example: Example
    variants: tuple[Variant, ...]


GRAD_PREFIX = "grad:"


@dataclasses.dataclass(frozen=True)
class Backward:
    """An op's derivative, computed by another op of the bundle (schema 1.1).

    Attributes:
        op: the backward op's name (an op of the same bundle).
        inputs: the backward op's input name -> where its value comes from: a forward input or output
            name (saved for backward when it is a tensor) or ``"grad:<output>"``, the gradient flowing
            into that forward output.
        grads: forward input name -> the backward op's output that is its gradient; inputs not named
            get no gradient.
    """

    op: str
    inputs: dict[str, str]
    grads: dict[str, str]

    def saved(self, fwd: "Op") -> tuple[str, ...]:
        """The forward tensors (inputs, then outputs) the backward reads, in forward order."""
        used = set(self.inputs.values())
        tensors = [a.name for a in fwd.args if a.kind == "tensor"] + [o.name for o in fwd.outputs]
        return tuple(n for n in tensors if n in used)


@dataclasses.dataclass(frozen=True)
class Op:
    """A kernel exposed as one torch op.

    Attributes:
        name: op name (the torch op is ``torch.ops.<namespace>.<name>``).
        frontend: ``flydsl`` or ``triton``.
        doc: one-line description.
        args: inputs, in schema order.
        outputs: outputs, in order.
        reference: name of the PyTorch reference function in the bundle's references module, or None.
        specializations: tried in order; the first whose guard holds runs.
        backward: the op's derivative as another op of the bundle (schema 1.1), or None (no autograd:
            a backward through it raises torch's "derivative ... is not implemented").
        tuning_key: expressions over the inputs that name every tiled dimension (schema 1.1; empty when
            the op was not declared with a config space). A tuning table (docs/tuning.md) is keyed by
            their values.
    """

    name: str
    frontend: str
    doc: str
    args: tuple[Arg, ...]
    outputs: tuple[Output, ...]
    reference: Optional[str]
    specializations: tuple[Specialization, ...]
    backward: Optional[Backward] = None
    tuning_key: tuple[str, ...] = ()

    @property
    def mutable(self) -> tuple[str, ...]:
        """The input tensors the kernel writes in place, in schema order (schema 1.2)."""
        return tuple(a.name for a in self.args if a.mutable)


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """Who built the bundle. No timestamps: rebuilding from the same inputs gives the same bytes.

    Attributes:
        flyship_version: version of flyship that wrote the bundle.
        frontends: frontend name -> version (``{"flydsl": "0.5.0"}``).
        python: build Python version (``"3.11.7"``).
        tools: tool name -> ``"<version> (<path>)"`` for llvm-mc, ld.lld, clang-offload-bundler...
    """

    flyship_version: str
    frontends: dict[str, str]
    python: str
    tools: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Failure:
    """A kernel that did not build in a ``flyc-build --keep-going`` run (schema 1.2).

    Attributes:
        op: the op's name.
        spec: the specialization's name as the spec file declares it.
        target: the target ID it failed for.
        reason: the build's message (the DSL's or tool's own error), for the loader's fallback reason.
    """

    op: str
    spec: str
    target: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The whole manifest (``manifest.json`` at the bundle root).

    Attributes:
        schema_version: ``MAJOR.MINOR`` of the schema the bundle was written with.
        namespace: torch namespace of the ops (never one of torch's own).
        build: who built the bundle.
        references: path of the references module (``references.py``), or None.
        ops: the ops.
        offload_bundles: ``<op>.<specialization>`` -> path of a clang offload bundle holding every AMD target.
        references_sha256: hex digest of the references module (schema 1.1; None in 1.0 bundles).
        offload_bundles_sha256: offload-bundle path -> hex digest (schema 1.1).
        failed: kernels a ``--keep-going`` build could not build (schema 1.2); the loader falls back for
            them with their reason.
    """

    schema_version: str
    namespace: str
    build: BuildInfo
    references: Optional[str]
    ops: tuple[Op, ...]
    offload_bundles: dict[str, str] = dataclasses.field(default_factory=dict)
    references_sha256: Optional[str] = None
    offload_bundles_sha256: dict[str, str] = dataclasses.field(default_factory=dict)
    failed: tuple[Failure, ...] = ()

    def op(self, name: str) -> Op:
        for o in self.ops:
            if o.name == name:
                return o
        raise BundleError(f"manifest: no op named {name!r}; the bundle has {', '.join(o.name for o in self.ops)}")

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(sorted({v.target for o in self.ops for s in o.specializations for v in s.variants}))


# ---------------------------------------------------------------------------------------------
# JSON <-> dataclasses


def to_json_obj(obj: Any) -> Any:
    """A manifest dataclass as plain JSON data (tuples as lists, every field present)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_json_obj(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_json_obj(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_json_obj(v) for k, v in obj.items()}
    return obj


# The reader is compiled once per dataclass and type (no type reflection per object). A value's JSON path
# travels as a chain of (parent, suffix) pairs and becomes text only in an error message.
Where = Any  # str, or (Where, str): the parent's path and this value's suffix


def _w(where: Where) -> str:
    parts = []
    while isinstance(where, tuple):
        where, suffix = where
        parts.append(suffix)
    return where + "".join(reversed(parts))


def _scalar(data: Any, where: Where) -> int | float | bool:
    """A JSON scalar that stands for a kernel or argument value: a bool, an int within int64, or a finite float."""
    if isinstance(data, bool):
        return data
    if isinstance(data, int):
        if not _limits.INT64_MIN <= data <= _limits.INT64_MAX:
            raise BundleError(f"manifest {_w(where)}: expected an integer within int64, got one of "
                              f"{data.bit_length()} bits")
        return data
    if isinstance(data, float):
        if not math.isfinite(data):
            raise BundleError(f"manifest {_w(where)}: expected a finite number, got {data!r}")
        return data
    raise BundleError(f"manifest {_w(where)}: expected a number or a bool, got {type(data).__name__}")


def _too_many(data: Any, where: Where) -> None:
    if len(data) > _limits.MAX_ITEMS:
        raise BundleError(f"manifest {_w(where)}: expected at most {_limits.MAX_ITEMS} items, got {len(data)}")


def _read_str(data: Any, where: Where, lenient: bool) -> str:
    if type(data) is not str:
        raise BundleError(f"manifest {_w(where)}: expected a string, got {type(data).__name__}")
    if len(data) > _limits.MAX_STRING:
        raise BundleError(f"manifest {_w(where)}: expected at most {_limits.MAX_STRING} characters, got {len(data)}")
    if not data.isascii():
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            raise BundleError(f"manifest {_w(where)}: the string holds an unpaired surrogate escape; expected "
                              "valid Unicode text") from None
    return data


def _read_bool(data: Any, where: Where, lenient: bool) -> bool:
    if not isinstance(data, bool):
        raise BundleError(f"manifest {_w(where)}: expected a bool, got {type(data).__name__}")
    return data


def _read_int(data: Any, where: Where, lenient: bool) -> int:
    if not isinstance(data, int) or isinstance(data, bool):
        raise BundleError(f"manifest {_w(where)}: expected an integer, got {type(data).__name__}")
    if not _limits.INT64_MIN <= data <= _limits.INT64_MAX:
        return _scalar(data, where)  # raises
    return data


def _read_float(data: Any, where: Where, lenient: bool) -> float:
    if not isinstance(data, (int, float)) or isinstance(data, bool):
        raise BundleError(f"manifest {_w(where)}: expected a number, got {type(data).__name__}")
    return float(_scalar(data, where))


Reader = Callable[[Any, Where, bool], Any]


@functools.lru_cache(maxsize=None)
def _reader(cls: Any) -> Reader:
    """The function that builds ``cls`` from JSON data, checking keys, types and the sizes of
    :mod:`flyship.bundle.limits` (list and object lengths, string lengths, int64 range, finite floats);
    built once per type."""
    origin = typing.get_origin(cls)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(cls)
        members = [a for a in args if a is not type(None)]
        nullable = type(None) in args
        inner = _reader(members[0]) if len(members) == 1 else _scalar_reader

        def read_union(data: Any, where: Where, lenient: bool) -> Any:
            if data is None:
                if nullable:
                    return None
                raise BundleError(f"manifest {_w(where)}: expected a value, got null")
            return inner(data, where, lenient)

        return read_union
    if origin is tuple:
        args = typing.get_args(cls)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _reader(args[0])

            def read_seq(data: Any, where: Where, lenient: bool) -> tuple:
                if type(data) is not list:
                    if isinstance(data, dict):
                        _too_many(data, where)
                    raise BundleError(f"manifest {_w(where)}: expected a list, got {type(data).__name__}")
                _too_many(data, where)
                return tuple([item(x, (where, f"[{i}]"), lenient) for i, x in enumerate(data)])

            return read_seq
        items = [_reader(a) for a in args]

        def read_fixed(data: Any, where: Where, lenient: bool) -> tuple:
            if type(data) is not list:
                if isinstance(data, dict):
                    _too_many(data, where)
                raise BundleError(f"manifest {_w(where)}: expected a list, got {type(data).__name__}")
            _too_many(data, where)
            if len(items) != len(data):
                raise BundleError(f"manifest {_w(where)}: expected {len(items)} items, got {len(data)}")
            return tuple([r(x, (where, f"[{i}]"), lenient) for i, (r, x) in enumerate(zip(items, data))])

        return read_fixed
    if origin is dict:
        _, vt = typing.get_args(cls)
        value = _reader(vt)

        def read_dict(data: Any, where: Where, lenient: bool) -> dict:
            if type(data) is not dict:
                if isinstance(data, list):
                    _too_many(data, where)
                raise BundleError(f"manifest {_w(where)}: expected an object, got {type(data).__name__}")
            _too_many(data, where)
            out = {}
            for k, v in data.items():
                _read_str(k, (where, " key"), lenient)
                out[k] = value(v, (where, f".{k[:40]}"), lenient)
            return out

        return read_dict
    if dataclasses.is_dataclass(cls):
        return _dataclass_reader(cls)
    simple = {str: _read_str, bool: _read_bool, int: _read_int, float: _read_float}
    if cls in simple:
        return simple[cls]
    raise TypeError(f"manifest reader: no rule for type {cls!r}")  # a bug in the dataclasses


def _scalar_reader(data: Any, where: Where, lenient: bool) -> int | float | bool:
    return _scalar(data, where)


def _dataclass_reader(cls: Any) -> Reader:
    fields = dataclasses.fields(cls)
    names = frozenset(f.name for f in fields)
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    # The field plan: (name, ".name", required, reader) per field, resolved on first use (a class may refer to
    # itself through its fields). It is built whole into a local and published by one assignment: an exception
    # mid-build (a RecursionError deep in a reference) publishes nothing and the next read builds it again, and
    # another thread sees either no plan or the whole plan, never half of one.
    published: list[tuple[tuple[str, str, bool, Reader], ...] | None] = [None]

    def field_plan() -> tuple[tuple[str, str, bool, Reader], ...]:
        plan = published[0]
        if plan is None:
            hints = typing.get_type_hints(cls)
            plan = tuple([(f.name, f".{f.name}", f.name in required, _reader(hints[f.name])) for f in fields])
            published[0] = plan
        return plan

    def read_object(data: Any, where: Where, lenient: bool) -> Any:
        plan = field_plan()
        if type(data) is not dict:
            if isinstance(data, list):
                _too_many(data, where)
            raise BundleError(f"manifest {_w(where)}: expected an object for {cls.__name__}, got {type(data).__name__}")
        _too_many(data, where)
        if not lenient and not names.issuperset(data):
            unknown = set(data) - names
            raise BundleError(
                f"manifest {_w(where)}: unknown keys {sorted(k[:40] for k in unknown)} for {cls.__name__}; "
                f"expected only {sorted(names)}"
            )
        kwargs = {}
        for name, suffix, needed, read in plan:
            if name not in data:
                if needed:
                    raise BundleError(f"manifest {_w(where)}: missing key {name!r} for {cls.__name__}")
                continue
            kwargs[name] = read(data[name], (where, suffix), lenient)
        return cls(**kwargs)

    return read_object


def _from(cls: Any, data: Any, where: str, lenient: bool) -> Any:
    """Build dataclass (or type) ``cls`` from JSON ``data``; see :func:`_reader`."""
    return _reader(cls)(data, where, lenient)


def _readable() -> str:
    return " and ".join(f"{major}.x (up to {major}.{minor})" for major, minor in NEWEST_MINOR.items())


def must_understand(m: "Manifest") -> tuple[str, ...]:
    """What ``m`` uses that a 1.x loader would ignore but must not: ``then`` (it would run only a call's first
    launch), ``workspaces``, ``mutable`` (it would register an in-place op as a functional one), ``zero`` (it
    would hand an accumulating kernel uninitialised outputs)."""
    found = []
    variants = [v for op in m.ops for s in op.specializations for v in s.variants]
    if any(v.then for v in variants):
        found.append("then")
    if any(v.workspaces for v in variants):
        found.append("workspaces")
    if any(a.mutable for op in m.ops for a in op.args):
        found.append("mutable")
    if any(o.zero for op in m.ops for o in op.outputs):
        found.append("zero")
    return tuple(found)


def version_for(m: "Manifest") -> str:
    """The schema version a writer gives ``m``: the newest minor of the lowest major whose readers understand every
    must-understand key ``m`` uses (:data:`MUST_UNDERSTAND`), 1.x for a bundle that uses none."""
    major = max((MUST_UNDERSTAND[k] for k in must_understand(m)), default=SCHEMA_MAJOR)
    return f"{major}.{NEWEST_MINOR[major]}"


def from_json_obj(data: Any) -> Manifest:
    """Build a :class:`Manifest` from parsed JSON, checking the format and schema version.

    Raises:
        ManifestVersionError: a major version not in :data:`NEWEST_MINOR`.
        BundleError: a key is missing, unknown (for the same or an older minor version), or mistyped.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise BundleError(
            f"manifest: expected a JSON object with \"format\": {FORMAT_NAME!r}, got {str(got)[:60]!r}; "
            "is this a flyship bundle?"
        )
    version = data.get("schema_version", "")
    match = re.fullmatch(r"([0-9]{1,6})\.([0-9]{1,6})", version) if isinstance(version, str) else None
    if match is None:
        raise BundleError(f"manifest: expected schema_version 'MAJOR.MINOR', got {str(version)[:60]!r}")
    major, minor = int(match[1]), int(match[2])
    if major not in NEWEST_MINOR:
        raise ManifestVersionError(
            f"manifest: bundle schema version {version} is not readable by this flyship, which reads "
            f"{_readable()}; rebuild the bundle with a matching flyc-build, "
            "or install the flyship version that wrote it"
        )
    body = {k: v for k, v in data.items() if k != "format"}
    return _from(Manifest, body, "", lenient=minor > NEWEST_MINOR[major])


def to_json_data(manifest: Manifest) -> dict:
    """The manifest as the JSON object written to disk (with the ``format`` key)."""
    out = to_json_obj(manifest)
    out["format"] = FORMAT_NAME
    return out


def write(manifest: Manifest, path: Path) -> None:
    """Write ``manifest.json`` (sorted keys, trailing newline)."""
    Path(path).write_text(json.dumps(to_json_data(manifest), sort_keys=True, indent=1, allow_nan=False) + "\n")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse(data: bytes, where: str) -> Manifest:
    """Parse manifest bytes (UTF-8 JSON) and check every rule of :mod:`flyship.bundle.rules`.

    Raises:
        BundleError: naming ``where`` and the JSON path of the first bad value.
    """
    return parse_json(data, where)[0]


def parse_json(data: bytes, where: str) -> tuple[Manifest, dict]:
    """:func:`parse`, also returning the JSON object the manifest was read from (the plan cache keeps each op's
    part of it as it is, instead of writing the dataclasses back out).

    Raises:
        BundleError: naming ``where`` and the JSON path of the first bad value.
    """
    from flyship.bundle import rules as _rules

    if len(data) > _limits.MAX_MANIFEST_BYTES:
        raise BundleError(f"read bundle: expected a manifest of at most {_limits.MAX_MANIFEST_BYTES} bytes, {where} "
                          f"has {len(data)}; is this a flyship bundle?")
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise BundleError(f"read bundle: {where} is not UTF-8 text ({e}); the bundle is damaged, rebuild it") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, NaN / Infinity, an int of > 4300 digits
        raise BundleError(f"read bundle: {where} is not valid JSON ({str(e)[:200]}); the bundle is damaged, "
                          "rebuild it") from None
    try:
        m = from_json_obj(obj)
        _rules.check_manifest(m)
    except BundleError as e:
        raise type(e)(f"{where}: {e}") from None
    except RecursionError:
        raise BundleError(f"{where}: the manifest nests too deeply; the bundle is damaged, rebuild it") from None
    return m, obj


def part_from_json_obj(cls: Any, data: Any, schema_version: str, where: str) -> Any:
    """One part of a manifest (an :class:`Op`, a :class:`Specialization`...) from its JSON data, read as
    :func:`from_json_obj` reads it in a manifest of ``schema_version`` (unknown keys are ignored for a newer minor
    version). Checks types and limits, not the rule book: for data taken from a manifest that passed it (the plan
    cache).

    Raises:
        BundleError: a key is missing, unknown or mistyped.
    """
    major, minor = (int(x) for x in schema_version.split("."))
    return _from(cls, data, where, lenient=minor > NEWEST_MINOR[major])


def read_bytes(path: Path | str) -> tuple[bytes, str]:
    """The bytes of a manifest file (or of a bundle directory's ``manifest.json``), at most the size limit, and
    the path as error messages name it; :func:`parse` checks them.

    Raises:
        BundleError: the file is missing or cannot be read.
    """
    p = Path(path)
    if p.is_dir() and (p.name != MANIFEST_NAME or (p / MANIFEST_NAME).exists() or (p / MANIFEST_NAME).is_symlink()):
        p = p / MANIFEST_NAME  # (a folder named manifest.json with none inside was meant as the manifest: say so)
    if not p.is_file():
        raise BundleError(f"read bundle: expected a manifest at {p}, found {_files.found_at(p)}; pass a bundle "
                          f"directory built by flyc-build (it holds {MANIFEST_NAME})")
    try:
        with open(p, "rb") as fh:
            return fh.read(_limits.MAX_MANIFEST_BYTES + 1), str(p)
    except OSError as e:
        raise BundleError(f"read bundle: cannot read {p}: {e}") from None


def read(path: Path | str) -> Manifest:
    """Read and check a manifest file (or a bundle directory holding ``manifest.json``).

    Raises:
        BundleError: the file is missing, too large, not UTF-8 JSON, or not a valid manifest; the message
            names the path and the JSON path of the bad value.
    """
    return parse(*read_bytes(path))


# ---------------------------------------------------------------------------------------------
# Helpers shared by the rule book and the loader


def slots(op: Op) -> dict[str, _expr.Slot]:
    """Argument name -> :class:`~flyship.bundle.expr.Slot` (inputs, then outputs)."""
    out: dict[str, _expr.Slot] = {}
    for i, a in enumerate(op.args):
        out[a.name] = _expr.Slot(i, "tensor" if a.kind == "tensor" else a.kind, a.rank)
    for j, o in enumerate(op.outputs):
        out[o.name] = _expr.Slot(len(op.args) + j, "tensor", len(o.shape))
    return out
