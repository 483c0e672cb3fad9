"""The rule book: every rule a bundle must satisfy, alone and against its code objects and files.

The one place that decides whether a manifest is acceptable: the compile stage, the spec API, the manifest reader
and the loader call these functions and restate none of them. One module per subject (``names``, ``values``,
``expressions``, ``layout``, ``resources``, ``inplace``, ``ops``, ``variants``, ``backward``, ``composites``,
``toplevel``,
``files``, ``codeobjects``); this package re-exports every rule, so ``rules.check_manifest`` ... is the import.

One owner per rule. The compile stage runs :func:`check_manifest` before it writes a bundle and
:func:`check_resources` on each kernel it builds; the loader runs :func:`check_manifest` when it reads
a manifest (:func:`flyship.bundle.manifest.read`) and :func:`check_bundle_files` before it lowers
anything to the C++ core, so whatever reaches C++ has passed every rule here (C++ keeps only cheap
internal asserts). The numbers live in :mod:`flyship.bundle.limits`.

Rules, by subject:

* names: namespace, op, argument, output and specialization names are ASCII identifiers of at most
  ``MAX_NAME`` characters, unique where they must be; the namespace is not one of torch's own;
  an output's ``dtype`` rule names either an input tensor or a dtype, never something that is both
  or a scalar; ``device`` is reserved for device properties (:func:`check_names`); an output's shape
  never reads the device (``device.cu_count``);
* values: scalar defaults and example scalars fit the scalar's type, alignments are powers of two,
  blocks are 1..``MAX_BLOCK`` per dimension, literal grids fit ``MAX_GRID``, ranks ``MAX_RANK``,
  every count its limit (:func:`check_manifest`);
* kernarg layout against the metadata: fields tile the explicit kernel arguments exactly, each field's
  kind, type, size, argument slot and dimension (0..rank-1) agree, a constant fits its type, the layout's
  alignment fits the loader's 64-byte buffer (:func:`check_layout`, :func:`check_fields`);
* resources against the target: required workgroup size equals the launch block (the HIP runtime would
  silently replace it: ROCm/clr does not check ``.reqd_workgroup_size``), the block fits the kernel's
  max flat workgroup size, static LDS fits the target (:func:`check_resources`), no scratch unless
  allowed (:func:`check_scratch`);
* leading batch dimensions (schema 1.2): a batched argument is a tensor of rank >= 1; a batched output's
  first dimension is a batched input's first (``x.shape[0]``), so the flattened rows map back to the leading
  dims; an autograd pair keeps the batch: a backward input fed from a batched tensor and a gradient of a
  batched input are batched in the backward op (:func:`check_batch`, :func:`check_backward`);
* autograd pairs that consume buffers (schema 1.4): a backward op may write inputs in place and name them as
  gradients; each such buffer feeds one backward input, holds one gradient and has its input's rank
  (:func:`check_consumed`); the forward op of a pair may write inputs in place (schema 5.0), and the gradient
  flowing into such an input's new value may feed the backward (``"grad:<input>"``);
* composites (schema 1.4): a unique name, a function of the references module, an op's kind of arguments (none in
  place, none batched), named returns and (1.5) workspaces (:func:`check_composites`);
* in-place inputs (schema 1.2): an op has an output or an input written in place, only tensors are written, and
  its in-place inputs and outputs fit torch's alias letters (:mod:`.inplace`); an op has an input tensor and at most
  64 arguments and outputs (the C++ core's slots), and its ``.out`` names do not collide with its inputs
  (:func:`check_op_head`);
* files: every path the manifest names stays inside the bundle after resolving links, is at most
  ``MAX_CODE_OBJECT_BYTES`` and has the sha256 the manifest records (:func:`read_bundle_file`);
* code objects against the manifest: the kernel and its descriptor exist, the file's target, kernarg
  segment, explicit arguments and resources are the manifest's (:func:`check_code_object`).

Every refusal is a :class:`~flyship.errors.BundleError` naming the file (where it has one), the op,
specialization and target, and the JSON path of the bad value.
"""

from flyship.bundle.rules.backward import check_backward, check_consumed
from flyship.bundle.rules.codeobjects import check_code_object, read_facts
from flyship.bundle.rules.composites import check_composite_workspaces, check_composites
from flyship.bundle.rules.expressions import check_expression
from flyship.bundle.rules.files import (
    check_bundle,
    check_bundle_files,
    check_relative_path,
    check_variant_file,
    contained_path,
    iter_variants,
    read_bundle_file,
    references_source,
)
from flyship.bundle.rules.inplace import (
    check_alias_letters,
    check_effects,
    check_mutable_arg,
)
from flyship.bundle.rules.layout import check_fields, check_layout
from flyship.bundle.rules.names import (
    RESERVED_NAMESPACES,
    TORCH_OPS_ATTRIBUTES,
    check_name,
    check_names,
    check_namespace,
    check_out_names,
)
from flyship.bundle.rules.ops import check_args, check_batch, check_op, check_op_head, check_specialization
from flyship.bundle.rules.resources import check_metadata, check_resources, check_scratch, lds_limit
from flyship.bundle.rules.toplevel import check_failures, check_manifest, check_must_understand
from flyship.bundle.rules.values import check_block, check_scalar_value
from flyship.bundle.rules.variants import (check_launch_count, check_variant, check_workspace_dtype,
                                           check_workspaces)

__all__ = [
    "RESERVED_NAMESPACES", "TORCH_OPS_ATTRIBUTES", "check_alias_letters", "check_args", "check_backward",
    "check_batch", "check_block", "check_bundle", "check_bundle_files", "check_code_object",
    "check_composite_workspaces", "check_composites", "check_consumed", "check_effects",
    "check_expression", "check_failures", "check_fields", "check_launch_count", "check_layout", "check_manifest",
    "check_metadata",
    "check_must_understand", "check_mutable_arg", "check_name", "check_names", "check_namespace",
    "check_op", "check_op_head", "check_out_names", "check_relative_path",
    "check_resources", "check_scalar_value", "check_scratch", "check_specialization", "check_variant",
    "check_variant_file", "check_workspace_dtype", "check_workspaces", "contained_path", "iter_variants", "lds_limit", "read_bundle_file",
    "read_facts", "references_source",
]
