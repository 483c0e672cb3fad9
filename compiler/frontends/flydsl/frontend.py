"""The FlyDSL frontend: trace a ``@flyc.jit`` launcher on the CPU, assemble its ISA, prove, bind kernargs.

The only module that imports ``flydsl`` (lazily, inside the worker process of one target). What differs
between FlyDSL releases (how to compile without launching, target triple, tensor ABI) is asked of the version
adapter (:mod:`flyship.compiler.frontends.flydsl.versions`). The target comes from ``FLYDSL_GPU_ARCH`` (a
bare ``ARCH`` overrides it, so both are set). FlyDSL compiles once per launcher call (an entry point may call
several launchers), as for any user, with its IR dump off; :mod:`flyship.compiler.frontends.flydsl.capture`
takes the final ISA, FlyDSL's own code object and the host function from each compile. The disk cache is
turned off so every build really compiles.

The protocol's face is here (:class:`FlydslFrontend`); the jobs are in their own modules: what a launcher declares
(:mod:`.signature`), an ``Entry``'s calls bound to the op (:mod:`.entry`), the traced example call (:mod:`.trace`),
a traced call's builds (:mod:`.launches`), and the host IR, capture, assembly and proof modules beside them.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from flyship.bundle import targets as _targets
from flyship.bundle.manifest import KernargLayout, KernelMetadata
from flyship.compiler.configs import Autotuned, Config, is_native, native_pairs, refuse_pre_hook
from flyship.compiler.frontends.base import BuildContext, Frontend, KernelBuild, WorkerSetup
from flyship.compiler.frontends.flydsl import assemble as _assemble
from flyship.compiler.frontends.flydsl import versions as _versions
from flyship.compiler.frontends.flydsl.launches import _artefacts, _launch_builds, _layout
from flyship.compiler.frontends.flydsl.signature import (COMPILE_HINT_OPTIONS, _is_compile_time, check_options,
                                                         check_signature, reaches_launcher)
from flyship.compiler.frontends.flydsl.trace import LauncherCall, _trace
from flyship.compiler.spec import Entry, OpDecl, Spec


def target_environment(target: str) -> dict[str, str]:
    """The variables FlyDSL reads the target from at import: ``FLYDSL_GPU_ARCH`` and the bare ``ARCH``, which
    overrides it (FlyDSL falls back to gfx942 silently when neither is set and no GPU answers)."""
    processor = target.split(":")[0]
    return {"FLYDSL_GPU_ARCH": processor, "ARCH": processor}


def setup_environment(target: str, rocm_root: Path | None, cache_dir: Path) -> None:
    """Set the process environment FlyDSL reads, before flydsl is imported (worker initializer)."""
    _versions.apply_compile_environment(os.environ)
    os.environ.update(target_environment(target))
    os.environ["FLYDSL_RUNTIME_CACHE_DIR"] = str(cache_dir)
    if rocm_root is not None:
        os.environ["ROCM_PATH"] = str(rocm_root)


def version() -> str:
    return _versions.current().version


class FlydslFrontend(Frontend):
    """FlyDSL ``@flyc.jit`` launchers, for AMD targets: trace on the CPU, assemble FlyDSL's ISA with flyship's
    LLVM toolchain, prove the code object equal to FlyDSL's own, read grid and bindings from the host IR."""

    name = "flydsl"
    title = "FlyDSL launcher"
    vendors = frozenset({"amd"})
    needs_llvm = True
    declares_grid = False
    pipelined = True  # compile() holds ctx.trace_slot around the FlyDSL compile only
    config_options = COMPILE_HINT_OPTIONS  # flydsl.Config's num_warps and kwargs are launcher keywords: Constexprs
    packages = ("flydsl",)
    # MLIR_: FlyDSL's pipeline is MLIR's; ARCH and COMPILE_ONLY: bare names FlyDSL reads (docs/flydsl-versions.md).
    env_prefixes = ("FLYDSL_", "MLIR_")
    env_names = ("ARCH", "COMPILE_ONLY")
    install_hint = ("run flyc-build from the build environment (make install creates .venv-flydsl: "
                    ".venv-flydsl/bin/flyc-build), or pip install flydsl==0.5.0 there")

    def accepts(self, kernel: Any) -> bool:
        if isinstance(kernel, Entry):
            return kernel.frontend == self.name
        # A builder's plain Python wrapper around an inner @flyc.jit launcher is an entry (spec.op wraps it).
        if inspect.isfunction(kernel):
            return reaches_launcher(kernel)
        return (type(kernel).__module__ or "").startswith("flydsl")

    def prepare_planning(self, amd_target: str | None) -> None:
        # Kernel modules may read the arch at import time: the planning import of a target sees what its worker
        # sees (setup_environment), and never falls back to a GPU probe.
        if amd_target:
            os.environ.update(target_environment(amd_target))

    def target_environment(self, target: _targets.TargetID) -> dict[str, str]:
        return target_environment(target.text) if target.vendor == "amd" else {}

    def check_installed(self, targets: Sequence[_targets.TargetID]) -> None:
        _versions.check_installed()  # before the spec file imports flydsl: a release outside the range is refused

    def read_autotuner(self, kernel: Any) -> Autotuned | None:
        # FlyDSL 0.5.0 flydsl.autotune.Autotuner: .fn, .configs, .key, .prune_configs_by(configs, named_args).
        if not is_native(kernel, "Autotuner", self.packages):
            return None
        return Autotuned(kernel.fn, native_pairs(kernel, self.read_config, "flydsl"), list(kernel.key),
                         kernel.prune_configs_by)

    def compile_time_parameters(self, kernel: Any) -> dict[str, bool]:
        try:
            params = inspect.signature(getattr(kernel, "func", kernel)).parameters
        except (TypeError, ValueError):
            return {}
        return {n: p.default is not inspect.Parameter.empty for n, p in params.items()
                if _is_compile_time(p.annotation)}

    def read_config(self, config: Any) -> Config | None:
        # FlyDSL 0.5.0 flydsl.autotune.Config: kwargs and num_warps are keywords of the launcher (Constexprs of
        # the op), waves_per_eu a compile hint.
        if not is_native(config, "Config", self.packages):
            return None
        refuse_pre_hook(config)
        values = dict(config.kwargs)
        if config.num_warps is not None:
            values["num_warps"] = config.num_warps
        if config.waves_per_eu is not None:
            values["waves_per_eu"] = config.waves_per_eu
        return Config(**values)

    def prepare_worker(self, setup: WorkerSetup) -> None:
        cache = Path(tempfile.mkdtemp(prefix="flydsl-cache-", dir=setup.scratch_root))
        setup_environment(setup.target, setup.rocm_root, cache)

    def check_declaration(self, op: OpDecl) -> None:
        check_signature(op)
        check_options(op)

    def version(self) -> str:
        return version()

    def compile(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> KernelBuild:
        """Compile one specialization of a FlyDSL op for one AMD target and prove the code object(s).

        An entry that calls several ``@flyc.jit`` launchers gives one code object per launcher call, each
        assembled from that call's ISA and proved against that call's own FlyDSL code object; the launches of
        all calls, in order, are the variant's launches.

        Returns:
            A :class:`KernelBuild` whose code object flyship assembled from the ISA FlyDSL's own code object
            was assembled from, and proved equal to that code object; ``facts`` is the host-IR analysis;
            ``then`` the launches after the first.

        Raises:
            FrontendError: trace/compile failure (with FlyDSL's message), or IR flyship cannot bind.
            CodeObjectError: our code object differs from FlyDSL's (``kind`` ``proof.PROOF``).
        """
        from flydsl._mlir import ir

        check_signature(op)
        adapter = _versions.current()
        triple = adapter.triple.rstrip("-")

        def assemble_call(call: LauncherCall, asm: Any) -> tuple[str, bytes, list[bytes], list[str], Any]:
            """The call's ISA (features declared) and our code object, then FlyDSL's code object(s), the host
            function's argument types and the lowered host function (:func:`_artefacts`)."""
            isa, theirs_all, origin_types, lowered = _artefacts(call.compile, call.name, call.where)
            adapter.check_isa_target(isa, call.where)
            # FlyDSL compiles for the bare processor (features "any"; its pipeline takes no target features,
            # and LLVM refuses xnack/sramecc as subtarget features): a target ID with features is declared on
            # that ISA, and the proof allows, and records, exactly what that changes.
            isa = _assemble.set_target_features(isa, target, call.where)
            ours = asm.assemble(isa, code_object_version=ctx.code_object_version)
            return isa, ours, theirs_all, origin_types, lowered

        # The assembler and linker start now and load while FlyDSL compiles; they get the ISA at the end.
        with _assemble.Assembler(ctx.toolchain, target, triple, ctx.workdir / "asm") as asm:
            with ctx.trace_slot():  # the CPU-bound part; assembly and proof overlap the next kernel's trace
                calls = _trace(op, spec, target)
            assembled = [assemble_call(calls[0], asm)]
        for k, call in enumerate(calls[1:], 2):  # each further launcher call: its own code object
            with _assemble.Assembler(ctx.toolchain, target, triple, ctx.workdir / f"asm{k}") as asm:
                assembled.append(assemble_call(call, asm))
        builds: list[KernelBuild] = []
        for call, artefacts in zip(calls, assembled):
            builds.extend(_launch_builds(call, *artefacts, op, spec, target, ctx, adapter.version, ir))
        return dataclasses.replace(builds[0], then=tuple(builds[1:]))

    def kernarg_layout(self, build: KernelBuild, meta: KernelMetadata, where: str) -> KernargLayout:
        return _layout(build.facts, meta, where)
