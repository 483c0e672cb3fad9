"""Every size a bundle may state, in one table (``docs/bundle-format.md``, "Limits", is the prose).

The reader (:mod:`flyship.bundle.manifest`) and the rule book (:mod:`flyship.bundle.rules`) refuse
anything beyond these with a :class:`~flyship.errors.BundleError`, before any work grows with the size:
a manifest cannot make the loader read a huge file, build a huge string or recurse deeply. The numbers
are far above what a real kernel library needs (the largest shipped bundle has 3 ops, rank 2 tensors
and 8 kernarg fields) and far below what would cost noticeable time or memory.
"""

from __future__ import annotations

MIB = 1 << 20

# Files.
MAX_MANIFEST_BYTES = 16 * MIB
"""``manifest.json``, read whole before parsing."""
MAX_CODE_OBJECT_BYTES = 256 * MIB
"""One code object (hsaco / cubin) or offload bundle; checked on the file's size before it is read and hashed."""
MAX_REFERENCES_BYTES = 4 * MIB
"""The references module (``references.py``)."""

# JSON shape.
MAX_JSON_DEPTH = 32
"""Nesting of JSON arrays / objects (the schema itself nests 7 deep)."""
MAX_ITEMS = 4096
"""Items in any one JSON array or object."""
MAX_STRING = 4096
"""Characters in any one JSON string (expressions included)."""
MAX_NAME = 128
"""Characters in a namespace, op, argument, output or specialization name."""
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
"""Every integer in a manifest fits a signed 64-bit integer (the C++ core's type)."""

# Counts.
MAX_OPS = 1024
MAX_ARGS = 64
"""Inputs of one op."""
MAX_OUTPUTS = 16
MAX_SPECIALIZATIONS = 256
"""Specializations of one op."""
MAX_VARIANTS = 64
"""Variants (targets) of one specialization."""
MAX_LAUNCHES = 16
"""Kernel launches of one call (a variant and its ``then``; schema 1.2)."""
MAX_WORKSPACES = 16
"""Workspaces of one multi-launch variant (schema 1.2)."""
MAX_CONSTRAINTS = 256
"""Guard constraints of one specialization."""
MAX_KERNARG_FIELDS = 1024
MAX_METADATA_ARGS = 1024
"""Kernel arguments in a code object's metadata, hidden ones included."""
MAX_RANK = 16
"""Dimensions of a tensor argument or output (torch allows 64; kernels use a handful)."""

# Values.
MAX_KERNARG_BYTES = 1 << 16
"""Kernarg segment (AMD) / parameter buffer (NVIDIA: 4 KiB, 32 KiB from sm_70 with CUDA 12.1)."""
MAX_ALIGNMENT = 1 << 12
"""Largest alignment (bytes) a guard, a kernarg buffer or a scratch field may ask for; each is a power of two."""
MAX_BLOCK = 1024
"""Work-items per workgroup (every AMD and NVIDIA target flyship knows); each block dimension is 1..1024."""
MAX_GRID = (1 << 31) - 1
"""A literal grid dimension (CUDA's x limit; HIP's 32-bit work-item count is checked per call)."""
MAX_SCRATCH_BYTES_PER_PROGRAM = 1 << 30
"""``bytes_per_program`` of a scratch field."""
MAX_RESOURCE = 1 << 32
"""Any resource count in kernel metadata (LDS, scratch, registers, kernarg segment)."""
