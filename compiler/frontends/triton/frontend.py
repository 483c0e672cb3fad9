"""The Triton frontend: compile a ``@triton.jit`` kernel on the CPU and ship Triton's own binary unchanged.

The only module that imports ``triton`` (lazily, inside the worker process of one target). What it relies
on (Triton 3.6.0, read in ``triton/compiler/compiler.py`` and ``triton/backends/{nvidia,amd}/``, and
checked on the cubins / hsacos it makes; ``docs/triton.md`` has the long form):

* ``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget(...), options=...)``
  compiles without a GPU: ``GPUTarget("cuda", 90, 32)`` gives a cubin (ptxas is told ``sm_90a``, so the
  cubin is arch-specific), ``GPUTarget("hip", "gfx942", 64)`` an hsaco.
* The signature is explicit, so nothing is specialized behind the guard's back. Triton's JIT turns an int
  argument equal to 1 into a constant and marks ints and pointers divisible by 16 with ``tt.divisibility``;
  by default each spec builds that for its example call with aligned pointers, guarded, then the generic
  ``<spec>__generic`` that specializes only what the spec asks (``Tensor(alignment=16)``,
  ``options={"divisible_by_16": [...]}``) (:mod:`~flyship.compiler.frontends.triton.jitspec`).
* Every Triton 3.6 kernel takes two hidden trailing pointer parameters after its own: global scratch and
  profile scratch. The launchers pass a buffer of ``grid programs x num_ctas x global_scratch_size`` bytes
  (aligned to ``global_scratch_align``) for the first when ``global_scratch_size > 0`` (e.g. a kernel that
  builds TMA descriptors with ``tl.make_tensor_descriptor`` on sm_90), else null; the second is null unless
  proton instrumentation is on (refused here). The AMD launcher always passes null global scratch.
* The launch block is ``num_warps x warp size`` (32 on NVIDIA and RDNA, 64 on CDNA) and the dynamic shared
  memory is the metadata's ``shared`` bytes; ``num_ctas`` must be 1 (no clusters), and cooperative and PDL
  launches are not supported by the bundle format.

The protocol's face is here (:class:`TritonFrontend`); the plan of one compile is
:mod:`~flyship.compiler.frontends.triton.planning`, running and reading back Triton's compile is
:mod:`~flyship.compiler.frontends.triton.compiling`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from typing import Any, Optional

from flyship.bundle import targets as _targets
from flyship.bundle.manifest import KernargLayout, KernelMetadata, Launch, Proof
from flyship.compiler.configs import Autotuned, Config, is_native, native_pairs, refuse_pre_hook
from flyship.compiler.frontends import writes
from flyship.compiler.frontends.base import BuildContext, Frontend, FrontendError, KernelBuild, WorkerSetup
from flyship.compiler.frontends.tail import example_grid
from flyship.compiler.frontends.triton.compiling import (_cubin_target, kernarg_layout, ptxas_version, read_metadata,
                                                         run_triton, version, written_params)
from flyship.compiler.frontends.triton import jitspec as _jitspec
from flyship.compiler.frontends.triton.planning import _where, check_params, plan
from flyship.compiler.spec import OpDecl, Spec
from flyship.errors import SpecError


# Triton backend options a tuning Config may set (triton.Config's fields and the AMD backend's knobs); a Spec's
# options= may hold any other field of Triton's backend options as well.
CONFIG_OPTIONS = ("num_warps", "num_stages", "waves_per_eu", "maxnreg", "matrix_instr_nonkdim", "kpack")


# triton.Config fields flyship can launch only at this value (read_config refuses others).
CONFIG_DEFAULTS_DROPPED = {"num_ctas": 1}


class TritonFrontend(Frontend):
    """``@triton.jit`` kernels, for NVIDIA (cubin) and AMD (hsaco) targets: Triton's own binary, unchanged."""

    name = "triton"
    title = "Triton kernel"
    vendors = frozenset({"amd", "nvidia"})
    needs_llvm = False
    declares_grid = True
    config_options = CONFIG_OPTIONS
    packages = ("triton",)
    # Triton's switches: TRITON_*, and MLIR_* / AMDGCN_* for its MLIR passes and AMD backend (MLIR_ENABLE_DUMP,
    # AMDGCN_USE_BUFFER_OPS); LLVM_* is every build's (flyship.compiler.cache).
    env_prefixes = ("TRITON_", "MLIR_", "AMDGCN_")
    install_hint = ("run flyc-build from the build environment (make install creates .venv-flydsl: "
                    ".venv-flydsl/bin/flyc-build), or pip install triton==3.6.0 there")

    def accepts(self, kernel: Any) -> bool:
        return (type(kernel).__module__ or "").startswith("triton")

    def check_target(self, target: _targets.TargetID) -> None:
        # Triton's AMD target is a bare processor name (GPUTarget("hip", "gfx942", 64); its passes compare it with
        # "gfx942" and LLVM takes it as the CPU name), so it cannot be told sramecc/xnack. Its hsaco leaves both
        # unspecified, which runs on every device of the processor whatever their setting.
        if target.features:
            raise FrontendError(f"--arch {target.text}: Triton compiles for a processor, not for target features "
                                f"({', '.join(k + v for k, v in target.features)}); its hsaco for {target.processor} "
                                f"leaves sramecc and xnack unspecified and runs on every {target.processor} device "
                                f"whatever their setting: use --arch {target.processor}")

    def read_autotuner(self, kernel: Any) -> Optional[Autotuned]:
        # triton.runtime.autotuner.Autotuner: .fn, .configs, .keys, .early_config_prune.
        if not is_native(kernel, "Autotuner", self.packages):
            return None
        return Autotuned(kernel.fn, native_pairs(kernel, self.read_config, "triton"), list(kernel.keys),
                         getattr(kernel, "early_config_prune", None))

    def read_config(self, config: Any) -> Optional[Config]:
        # triton.Config: kwargs (constexprs), num_warps, num_stages, maxnreg; num_ctas != 1 is refused.
        if not is_native(config, "Config", self.packages):
            return None
        refuse_pre_hook(config)
        values = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
        if getattr(config, "maxnreg", None) is not None:
            values["maxnreg"] = config.maxnreg
        for k, ok in CONFIG_DEFAULTS_DROPPED.items():
            if getattr(config, k, ok) != ok:
                raise SpecError(f"config {config}: sets {k}={getattr(config, k)}; flyship launches only {k}={ok}")
        return Config(**values)

    def config_block(self, config: Config, target: _targets.TargetID) -> Optional[int]:
        return int(config.values.get("num_warps", 4)) * _targets.limits(target)["wavefront_size"]

    def expand_specs(self, op: OpDecl) -> tuple[Spec, ...]:
        return _jitspec.expand_specs(op, op.kernel)

    def twin_of(self, spec_name: str) -> Optional[str]:
        return spec_name.removesuffix(_jitspec.GENERIC_SUFFIX) if spec_name.endswith(_jitspec.GENERIC_SUFFIX) else None

    def check_declaration(self, op: OpDecl) -> None:
        # Each kernel's parameters against its declaration, before any worker compiles (a Launch's mismatch
        # used to surface per task, after the whole build had compiled).
        views = [(op.launch_view(launch), op, launch.kernel) for launch in op.launches] or [(op, None, op.kernel)]
        for k, (view, scope, kernel) in enumerate(views, 1):
            where = f"op {op.name}" + (f" launch {k}" if scope is not None else "")
            check_params(view, _jitspec.jit_function(kernel, where), scope, where)

    def build_note(self, op: OpDecl, spec: Spec, target: str) -> str:
        views = [(op.launch_view(launch), op) for launch in op.launches] or [(op, None)]
        notes = []
        for k, (view, scope) in enumerate(views, 1):
            diff = plan(view, spec, target, scope).jit_difference
            if diff:
                notes.append(f"launch {k}: {diff}" if len(views) > 1 else diff)
        note = f"differs from Triton's JIT for the example call: {'; '.join(notes)}" if notes else ""
        dup = _jitspec.jit_duplicate(op, spec)
        if dup:
            note = "; ".join(n for n in (note, dup) if n)
        return note

    def prepare_worker(self, setup: WorkerSetup) -> None:
        os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cache-", dir=setup.scratch_root))

    def version(self) -> str:
        return version()

    def compile(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> KernelBuild:
        """Compile one specialization of a Triton op for one target.

        Args:
            op: the op (its ``kernel`` a ``@triton.jit`` function, ``grid`` its grid expressions).
            spec: the specialization (dtypes, constexprs, options such as ``num_warps``, ``num_stages``,
                ``divisible_by_16`` and per-target overrides).
            target: ``sm_90`` (any ``sm_XX`` flyship has limits for) or ``gfx942`` / ``gfx950`` / ...
            ctx: build context; ``ctx.workdir`` holds Triton's cache for this compile.

        Returns:
            A :class:`KernelBuild` holding Triton's binary unchanged (``proof.method`` ``frontend-binary``),
            block ``num_warps x warp size``, the metadata's ``shared`` bytes as dynamic shared memory, and the
            guard constraints / alignment the compile relies on; ``facts`` is ``(plan, global scratch)``.
            ``target`` is the code object's own target ID (``sm_90a`` for an ``sm_90`` request: Triton always
            asks ptxas for the arch-specific variant).

        Raises:
            FrontendError: naming op, specialization and target, for every refusal of :func:`plan`, for
                Triton's own compile errors, and for a kernel that needs profile scratch (proton
                instrumentation) or whose example violates its guard (checked before compiling).
        """
        if op.launches:  # kernel=[Launch(...), ...]: each kernel compiled alone, the tail binds the workspaces
            builds = [self._compile_one(op.launch_view(launch), spec, target, ctx, op,
                                        f"{_where(op, spec, target)} launch {k + 1} ({launch.kernel.__name__})")
                      for k, launch in enumerate(op.launches)]
            return dataclasses.replace(builds[0], then=tuple(builds[1:]))
        return self._compile_one(op, spec, target, ctx, None, _where(op, spec, target))

    def _compile_one(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext, scope: Optional[OpDecl],
                     where: str) -> KernelBuild:
        """One kernel: ``op`` is the op, or (``scope`` the op) the view of one of its launches."""
        tid = _targets.parse_target(target)
        p = plan(op, spec, target, scope)
        whole = scope or op
        grid_at_example, _, _ = example_grid(whole, spec, p.grid, (*p.constraints, *whole.constraints(spec)), where,
                                             target=target)
        kernel = run_triton(p, tid, ctx, where)
        md = kernel.metadata
        fmt = "cubin" if tid.vendor == "nvidia" else "hsaco"
        binary = bytes(kernel.asm[fmt])
        symbol = str(md.name)
        if int(getattr(md, "profile_scratch_size", 0) or 0) > 0:
            raise FrontendError(f"{where}: kernel {symbol} needs profile scratch memory (proton instrumentation is "
                                "on); unset TRITON_INSTRUMENTATION_MODE for a shippable build")
        scratch_size = int(getattr(md, "global_scratch_size", 0) or 0) * int(getattr(md, "num_ctas", 1) or 1)
        scratch_align = int(getattr(md, "global_scratch_align", 1) or 1)
        wave = _targets.limits(tid)["wavefront_size"]
        if int(md.warp_size) != wave:
            raise FrontendError(f"{where}: Triton compiled for warp size {md.warp_size}, expected the target's {wave}")
        block = int(md.num_warps) * wave
        launch = Launch(grid=p.grid, block=(block, 1, 1), dynamic_lds=str(int(md.shared or 0)))
        toolchain = {"triton": version()}
        if tid.vendor == "nvidia":
            ptxas = ptxas_version(tid.sm)
            if ptxas:
                toolchain["ptxas"] = ptxas
        isa = None
        if ctx.keep_ir:
            isa = str(kernel.asm.get("ptx" if fmt == "cubin" else "amdgcn", "")) or None
        written, accumulated = written_params(kernel, p, where)
        co_target = target
        if tid.vendor == "nvidia":  # the cubin's own arch (sm_90a); read_metadata checks it is the one asked for
            co_target = _cubin_target(binary, symbol, where)
        return KernelBuild(
            target=co_target, code_object=binary, format=fmt, symbol=symbol, launch=launch,
            proof=Proof(method="frontend-binary", reference_sha256=hashlib.sha256(binary).hexdigest(),
                        identical_sections=(), kernel_descriptor="n/a", metadata="n/a"),
            toolchain=toolchain, example_grid=grid_at_example, constraints=p.constraints, alignment=dict(p.alignment),
            isa=isa, facts=(p, tid, (scratch_size, scratch_align)), written=written, accumulated=accumulated,
            unread=frozenset(writes.ttir_unread_params(str(kernel.asm["ttir"]))))

    def read_metadata(self, build: KernelBuild, where: str) -> tuple[KernelMetadata, Optional[int]]:
        p, tid, _ = build.facts
        meta, _, co_version = read_metadata(build.code_object, build.format, build.symbol, p, tid, where)
        wave = _targets.limits(tid)["wavefront_size"]
        if meta.wavefront_size != wave:
            raise FrontendError(f"{where}: the code object says warp size {meta.wavefront_size}, expected the "
                                f"target's {wave}")
        return meta, co_version

    def kernarg_layout(self, build: KernelBuild, meta: KernelMetadata, where: str) -> KernargLayout:
        p, _, scratch = build.facts
        return kernarg_layout(meta, p, scratch, where)
