"""The manifest's data model: frozen dataclasses and the closed vocabularies (the schema version: :mod:`.versions`).

The data only: :mod:`flyship.bundle.manifest_json` reads and writes it as JSON, :mod:`flyship.bundle.rules`
judges it and :mod:`flyship.bundle.manifest` is the one entry that reads a manifest file (JSON, then every rule).
``schema.json`` is generated from these dataclasses (:mod:`flyship.bundle.schema`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from flyship.bundle import expr as _expr
from flyship.bundle.errors import BundleError
from flyship.bundle.frozen import frozen
# The schema version and the must-understand keys, re-exported: readers and writers ask them as model.X.
from flyship.bundle.versions import (MUST_UNDERSTAND, NEWEST_MINOR, OMITTED_WHEN_EMPTY, SCHEMA_MAJOR,  # noqa: F401
                                     SCHEMA_MINOR, SCHEMA_VERSION, must_understand, version_for)

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
CODE_OBJECT_FORMATS = ("hsaco", "cubin")
# How a tensor reaches the kernel (FlyDSL): a bare pointer (static layout: shape and strides compiled in) or
# a pointer + a by-value struct of its dynamic shape/stride values (dynamic layout).
TENSOR_ABIS = ("static", "dynamic", "pointer")


@frozen
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


@frozen
class Output:
    """One output of an op, allocated fresh by the loader (or passed to the ``out`` variant).

    Attributes:
        name: output name.
        shape: one expression per dimension over the inputs (see :mod:`flyship.bundle.expr`).
        dtype: an input tensor's name (same dtype as that input) or a torch dtype name.
        batch: (1.2) the batched inputs' leading dims come back: ``shape[0]`` is a batched input's flattened first
            dimension (``"<input>.shape[0]"``) and the call returns the output viewed as ``(B, S, ...)``.
        zero: (1.3, must-understand) the kernel accumulates into it (atomic adds): allocated zero-filled, out= too.
        target_dtypes: (6.0) target -> dtype rule there (:func:`flyship.bundle.targets.output_dtype`); ``{}``.
    """

    name: str
    shape: tuple[str, ...]
    dtype: str
    batch: bool = False
    zero: bool = False
    target_dtypes: dict[str, str] = dataclasses.field(default_factory=dict)


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
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


@frozen
class Specialization:
    """A compiled form of an op for some inputs: a guard, and one variant per target."""

    name: str
    guard: Guard
    example: Example
    variants: tuple[Variant, ...]


GRAD_PREFIX = "grad:"


@frozen
class Backward:
    """An op's derivative, computed by another op of the bundle (schema 1.1).

    Attributes:
        op: the backward op's name (an op of the same bundle).
        inputs: the backward op's input name -> where its value comes from: a forward input or output
            name (saved for backward when it is a tensor; an input the forward writes in place is saved as the
            forward left it) or ``"grad:<output>"``, the gradient flowing into that forward output, or (schema 5.0)
            ``"grad:<input>"`` of an input the forward writes in place (``mutable``): the gradient flowing into
            its new value, as ``torch.autograd.Function`` + ``ctx.mark_dirty`` gives it.
        grads: forward input name -> the backward op's output that is its gradient, or (schema 1.4) one of its
            ``mutable`` inputs: the buffer the backward overwrites with the gradient (SwiGLU's backward writes da
            into a). Such a buffer is *consumed*: it is fed from a saved forward tensor or an incoming gradient,
            which the loader hands over only when nothing else holds its memory, else it hands over a copy
            (docs/training.md). Inputs not named get no gradient.
    """

    op: str
    inputs: dict[str, str]
    grads: dict[str, str]

    def saved(self, fwd: "Op") -> tuple[str, ...]:
        """The forward tensors (inputs, then outputs) the backward reads, in forward order."""
        used = set(self.inputs.values())
        tensors = [a.name for a in fwd.args if a.kind == "tensor"] + [o.name for o in fwd.outputs]
        return tuple(n for n in tensors if n in used)

    def consumed(self, bwd: "Op") -> dict[str, str]:
        """The backward op's inputs it overwrites (its ``mutable`` inputs) -> their sources (a forward tensor or
        ``"grad:<output>"``), in the backward op's order (schema 1.4)."""
        return {a.name: self.inputs[a.name] for a in bwd.args if a.mutable and a.name in self.inputs}

    @staticmethod
    def dirty(fwd: "Op") -> tuple[str, ...]:
        """The forward's inputs it writes in place (schema 5.0): autograd treats each as an output of the pair too
        (its history is rebased onto the pair's node, as ``ctx.mark_dirty`` does), in forward order."""
        return fwd.mutable


@frozen
class Composite:
    """An op composed in torch code from the bundle's ops and torch ops (schema 1.4): a host step between launches
    (``partial.sum(0)``, a count of valid rows) or a whole training op, forward and backward, as one op. Its code is a
    function of the bundle's references module (checked by ``references_sha256``), called as ``function(ops, *args)``
    with ``ops`` = ``torch.ops.<namespace>``; registered as ``torch.ops.<namespace>.<name>`` with a
    ``CompositeImplicitAutograd`` kernel (autograd runs through the ops it calls; ``torch.compile`` traces into it).

    Attributes:
        name: op name (``torch.ops.<namespace>.<name>``; unique among the bundle's ops and composites).
        doc: one-line description.
        function: the function's name in the references module.
        args: inputs in schema order (tensors and scalars with defaults; none written in place).
        returns: the names of the tensors it returns, in order (one: a Tensor; more: a tuple).
        workspaces: (1.5) buffers the loader allocates per call on the device of the first tensor argument and passes
            after ``args`` (``function(ops, *args, *workspaces)``), never part of the schema; a shape may read
            ``device.cu_count`` (a per-CU/SM partial buffer the composite hands to an op that writes it in place).
    """

    name: str
    doc: str
    function: str
    args: tuple[Arg, ...]
    returns: tuple[str, ...]
    workspaces: tuple[Workspace, ...] = ()


@frozen
class Op:
    """A kernel exposed as one torch op.

    Attributes:
        name: op name (the torch op is ``torch.ops.<namespace>.<name>``).
        frontend: the name of the frontend that built it (``flydsl``, ``triton``...): an open name, for
            people and tools; the loader runs every op alike.
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


@frozen
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


@frozen
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


@frozen
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
        composites: ops composed in torch code from the bundle's ops (schema 1.4; a must-understand key).
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
    composites: tuple[Composite, ...] = ()

    def op(self, name: str) -> Op:
        for o in self.ops:
            if o.name == name:
                return o
        raise BundleError(f"manifest: no op named {name!r}; the bundle has {', '.join(o.name for o in self.ops)}")

    def backward_op(self, name: str) -> Op:
        """The op a :class:`Backward` names: one of :attr:`ops`, or a composite (schema 1.4) as an op head with its
        returns as outputs (:func:`composite_head`), so a backward may end with host steps (``partial.sum(0)``)."""
        for c in self.composites:
            if c.name == name:
                return composite_head(c)
        return self.op(name)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(sorted({v.target for o in self.ops for s in o.specializations for v in s.variants}))


# Facts read off a manifest (shared by the rule book, the writer and the loader)

def composite_head(c: Composite) -> Op:
    """A composite as an op head (no specializations): its arguments, and its returns as outputs (their shapes and
    dtypes are the function's business: ``shape=()`` and ``dtype="float32"`` stand for "not declared")."""
    return Op(name=c.name, frontend="composite", doc=c.doc, args=c.args,
              outputs=tuple(Output(name=r, shape=(), dtype="float32") for r in c.returns), reference=None,
              specializations=())


def slots(op: Op) -> dict[str, _expr.Slot]:
    """Argument name -> :class:`~flyship.bundle.expr.Slot` (inputs, then outputs)."""
    out: dict[str, _expr.Slot] = {}
    for i, a in enumerate(op.args):
        out[a.name] = _expr.Slot(i, "tensor" if a.kind == "tensor" else a.kind, a.rank)
    for j, o in enumerate(op.outputs):
        out[o.name] = _expr.Slot(len(op.args) + j, "tensor", len(o.shape))
    return out
