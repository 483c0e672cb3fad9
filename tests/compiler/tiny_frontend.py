"""A frontend that lives only in the tests: "tinydsl", a made-up DSL whose kernels are :class:`TinyKernel` objects.

It exercises every part of the frontend protocol that carries DSL knowledge (autotuner and config reading, the
block a config launches, its packages and environment variables for the build cache, the environment a worker of a
target starts with, the install hint) and "compiles" by returning FlyDSL's own vector-add code object
(tests/compiler/data/vadd.gfx942.hsaco: three tensors, each a pointer + an i32 size, required block 64), so a
bundle builds through the real build path on the CPU without any DSL. Importing this module registers it, as a
frontend's own package does (no product file names it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from flyship.bundle import targets as _targets
from flyship.bundle.manifest import KernargField, KernargLayout, KernelMetadata, Launch, Proof
from flyship.compiler import frontends
from flyship.compiler.configs import Autotuned, Config
from flyship.compiler.frontends import BuildContext, Frontend, KernelBuild
from flyship.compiler.spec import OpDecl, Spec

VADD = Path(__file__).parent / "data" / "vadd.gfx942.hsaco"


class TinyKernel:
    """What tinydsl's decorator returns."""

    __name__ = "tiny_vadd"


@dataclasses.dataclass
class TinyConfig:
    """tinydsl's own config object."""

    num_threads: int


@dataclasses.dataclass
class TinyAutotuner:
    """tinydsl's autotuner: the kernel, its configs and the argument names it keys on."""

    fn: TinyKernel
    configs: list[TinyConfig]
    key: list[str]


class TinyFrontend(Frontend):
    name = "tiny"
    title = "tinydsl kernel"
    vendors = frozenset({"amd"})
    needs_llvm = False
    declares_grid = True
    config_options = ("num_threads",)
    packages = ("tinydsl",)
    env_prefixes = ("TINYDSL_",)
    env_names = ("TINY_ARCH",)
    install_hint = "pip install tinydsl into the build Python"

    def accepts(self, kernel: Any) -> bool:
        return isinstance(kernel, TinyKernel)

    def version(self) -> str:
        return "1.0"

    def target_environment(self, target: _targets.TargetID) -> dict[str, str]:
        return {"TINYDSL_TARGET": target.processor}

    def read_autotuner(self, kernel: Any) -> Optional[Autotuned]:
        if not isinstance(kernel, TinyAutotuner):
            return None
        return Autotuned(kernel.fn, [(self.read_config(c), c) for c in kernel.configs], list(kernel.key), None)

    def read_config(self, config: Any) -> Optional[Config]:
        return Config(num_threads=config.num_threads) if isinstance(config, TinyConfig) else None

    def config_block(self, config: Config, target: _targets.TargetID) -> Optional[int]:
        return int(config.values["num_threads"])

    def compile(self, op: OpDecl, spec: Spec, target: str, ctx: BuildContext) -> KernelBuild:
        return KernelBuild(target=target, code_object=VADD.read_bytes(), format="hsaco", symbol="vadd_kernel_0",
                           launch=Launch(grid=("cdiv(a.numel, 64)", "1", "1"), block=(64, 1, 1)),
                           proof=Proof(method="frontend-binary", reference_sha256="0" * 64, identical_sections=(),
                                       kernel_descriptor="n/a", metadata="n/a"),
                           toolchain={"tiny": self.version()}, example_grid=(64, 1, 1), facts=("a", "b", "c"))

    def kernarg_layout(self, build: KernelBuild, meta: KernelMetadata, where: str) -> KernargLayout:
        fields = []
        for name, arg in zip(build.facts, (a for a in meta.args if a.value_kind == "global_buffer")):
            fields.append(KernargField(offset=arg.offset, size=8, kind="pointer", type="ptr", arg=name))
            fields.append(KernargField(offset=arg.offset + 8, size=4, kind="shape", type="i32", arg=name, dim=0))
        return KernargLayout(size=44, alignment=8, fields=tuple(fields))


FRONTEND = frontends.register(TinyFrontend())
