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
MAX_TUNING_BYTES = 16 * MIB
"""A tuning table (``flyship tune`` writes a few KB per op and device)."""
MAX_PATCHES_BYTES = 1 * MIB
"""The hook's patches file (read at every interpreter start of an environment with the hook installed)."""
MAX_RECORD_BYTES = 1 * MIB
"""A small JSON record: a pack's index and signature members, a prebuilt-extension record, a build-cache entry."""

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
MAX_TARGET_DTYPES = MAX_VARIANTS
"""Per-target dtypes of one output (schema 1.6, ``outputs[].target_dtypes``)."""
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
MAX_TUNE_DIM = (1 << 31) - 1
"""A dimension in ``flyship tune --shapes`` (each from 1)."""
MAX_TUNE_CALL_BYTES = 16 << 30
"""The inputs of one call ``flyship tune`` makes, estimated from the shapes file before anything is allocated."""

# Shared with the C++ core (csrc/limits.h is generated from this table: ``python scripts/limits_header.py --write``).
MAX_SLOTS = 64
"""Arguments and outputs of one op together: the C++ core's per-call slot arrays (csrc/call.h)."""
KERNARG_BUFFER_ALIGNMENT = 64
"""The loader's kernarg buffer is aligned to this (csrc/launch.cpp): a kernarg layout may ask for at most this."""
MAX_PROGRAM_WORDS = 256
"""Words (opcodes and operands) of one compiled expression program."""
MAX_PROGRAM_DEPTH = 32
"""Evaluation stack entries one expression program may need."""
MAX_DEVICES = 64
"""GPU indices 0..63: the C++ core keeps per-device state in arrays of this size; the loader refuses a larger index."""
MAX_EXPR_NESTING = 64
"""Nesting of an expression's syntax tree (``-(-(...))``, ``((...))``, a chain of operators): found by a loop before
any recursive step, so ``'-' * 998 + '1'`` is a flyship error, never Python's RecursionError. Python only: the C++
core never parses text, it runs postfix programs with an explicit stack of at most ``MAX_PROGRAM_DEPTH`` entries."""

# The plan contract: what Python (flyship/loader/plan.py) lowers and the C++ core parses (csrc/plan.cpp).
PLAN_VERSION = 10
VARIANT_ON_PURPOSE = -2
"""A selection's variant index for a specialization that runs the op's reference on purpose (a tuning table's bucket
the original wins): the Python chooser (flyship.loader.selection) gives it, the C++ core (kOnPurpose) acts on it."""
"""The plan's format version; the per-user plan cache keys on it."""

# C++ name -> this module's name: the constants csrc/limits.h defines, each with the value above.
CXX_CONSTANTS = (
    ("kPlanVersion", "PLAN_VERSION"),
    ("kMaxSlots", "MAX_SLOTS"),
    ("kMaxLaunches", "MAX_LAUNCHES"),
    ("kMaxWorkspaces", "MAX_WORKSPACES"),
    ("kMaxKernargBytes", "MAX_KERNARG_BYTES"),
    ("kKernargBufferAlignment", "KERNARG_BUFFER_ALIGNMENT"),
    ("kMaxBlock", "MAX_BLOCK"),
    ("kMaxRank", "MAX_RANK"),
    ("kMaxProgramWords", "MAX_PROGRAM_WORDS"),
    ("kMaxProgramDepth", "MAX_PROGRAM_DEPTH"),
    ("kMaxDevices", "MAX_DEVICES"),
    ("kOnPurpose", "VARIANT_ON_PURPOSE"),
)
HEADER = "limits.h"
"""The generated header's name in csrc/."""


def cxx_header() -> str:
    """The text of csrc/limits.h: every shared limit as a ``constexpr``, generated from this table."""
    table = globals()
    lines = ["// GENERATED from bundle/limits.py by `python scripts/limits_header.py --write`: do not edit.",
             "// The limits the rule book and the C++ core share; a test keeps this file equal to the generator's output",
             "// and compares the compiled values (the extension's LIMITS) with flyship.bundle.limits.",
             "#pragma once", "", "#include <cstdint>", "", "namespace flyship {", ""]
    for cxx, name in CXX_CONSTANTS:
        lines.append(f"constexpr int64_t {cxx} = {int(table[name])};  // {name}")
    lines += ["", "}  // namespace flyship", "",
              "// Every constant above, for code that lists them all (the extension's LIMITS): X(name) each.",
              "#define FLYSHIP_SHARED_LIMITS(X) \\", *(f"  X({cxx}) \\" for cxx, _ in CXX_CONSTANTS[:-1]),
              f"  X({CXX_CONSTANTS[-1][0]})", ""]
    return "\n".join(lines)

