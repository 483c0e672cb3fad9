"""The frontend protocol: a third frontend registers with one line and gets the common tail (metadata ->
kernarg layout -> resources -> example check). The toy frontend below "compiles" by returning FlyDSL's own
vector-add code object (tests/compiler/data/vadd.gfx942.hsaco: three tensors, each a pointer + an i32 size,
required block 64), so this runs on the CPU without any DSL."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from flyship.bundle.manifest import KernargField, KernargLayout, Launch, Proof
from flyship.compiler import frontends, spec
from flyship.compiler.frontends import BuildContext, Frontend, FrontendError, KernelBuild

pytestmark = pytest.mark.cpu
VADD = Path(__file__).parent / "data" / "vadd.gfx942.hsaco"


class ToyKernel:
    """What a toy DSL's decorator would return."""


class ToyFrontend(Frontend):
    name = "toy"
    title = "toy kernel"
    vendors = frozenset({"amd"})
    needs_llvm = False
    declares_grid = True

    def __init__(self, **build_changes):
        self.build_changes = build_changes

    def accepts(self, kernel) -> bool:
        return isinstance(kernel, ToyKernel)

    def version(self) -> str:
        return "1.0"

    def compile(self, op, spec_, target, ctx) -> KernelBuild:
        b = KernelBuild(target=target, code_object=VADD.read_bytes(), format="hsaco", symbol="vadd_kernel_0",
                        launch=Launch(grid=("cdiv(a.numel, 64)", "1", "1"), block=(64, 1, 1)),
                        proof=Proof(method="frontend-binary", reference_sha256="0" * 64, identical_sections=(),
                                    kernel_descriptor="n/a", metadata="n/a"),
                        toolchain={"toy": self.version()}, example_grid=(64, 1, 1), facts=("a", "b", "c"))
        return dataclasses.replace(b, **self.build_changes)

    def kernarg_layout(self, build, meta, where) -> KernargLayout:
        fields = []
        for name, arg in zip(build.facts, (a for a in meta.args if a.value_kind == "global_buffer")):
            fields.append(KernargField(offset=arg.offset, size=8, kind="pointer", type="ptr", arg=name))
            fields.append(KernargField(offset=arg.offset + 8, size=4, kind="shape", type="i32", arg=name, dim=0))
        return KernargLayout(size=44, alignment=8, fields=tuple(fields))


@pytest.fixture
def toy(monkeypatch):
    """The toy frontend registered for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(frontends, "_REGISTRY", dict(frontends._registry()))
    return frontends.register(ToyFrontend())


def declare(grid=("cdiv(a.numel, 64)",)):
    def run():
        spec.namespace("toy_ops")
        spec.op("vadd", kernel=ToyKernel(), grid=grid,
                args=[spec.Tensor("a", rank=1), spec.Tensor("b", rank=1), spec.Output("c", like="a")],
                specs=[spec.Spec("f32", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (4096,), "b": (4096,)})])

    return spec.run_spec_file("toy_ops.py", run).ops[0]


def compile_with(fe: Frontend, tmp_path: Path):
    op = declare()
    return frontends.compile_variant(fe, op, op.specs[0], "gfx942", BuildContext(workdir=tmp_path, toolchain=None))


def test_a_registered_frontend_claims_its_kernels_and_its_grid_rule(toy):
    assert frontends.detect(ToyKernel()) is toy and frontends.get("toy") is toy
    assert frontends.names()[-1] == "toy"
    assert declare().frontend == "toy"
    with pytest.raises(spec.SpecError, match=r"a toy kernel needs grid=\(\.\.\.\) expressions"):
        declare(grid=None)


def test_the_common_tail_reads_the_metadata_and_checks_the_frontends_layout(toy, tmp_path):
    v = compile_with(toy, tmp_path)
    assert (v.symbol, v.code_object_version, v.metadata.reqd_workgroup_size) == ("vadd_kernel_0", 6, (64, 1, 1))
    assert [(f.offset, f.kind, f.arg) for f in v.kernargs.fields][:2] == [(0, "pointer", "a"), (8, "shape", "a")]
    assert v.example_grid == (64, 1, 1) and v.seconds > 0


def test_the_common_tail_refuses_a_grid_that_disagrees_with_the_frontends_own(toy, tmp_path):
    with pytest.raises(FrontendError, match=r"give \[64, 1, 1\] at the example shapes but the frontend computed "
                                            r"\[63, 1, 1\]"):
        compile_with(ToyFrontend(example_grid=(63, 1, 1)), tmp_path)


def test_the_common_tail_refuses_a_block_other_than_the_kernels_required_one(toy, tmp_path):
    launch = Launch(grid=("cdiv(a.numel, 64)", "1", "1"), block=(128, 1, 1))
    with pytest.raises(FrontendError, match=r"launch block \[128, 1, 1\] differs from the code object's required "
                                            r"workgroup size \[64, 1, 1\]"):
        compile_with(ToyFrontend(launch=launch), tmp_path)


def test_the_common_tail_refuses_a_layout_that_leaves_a_kernel_argument_unset(toy, tmp_path):
    with pytest.raises(FrontendError, match=r"has no kernarg field; the loader would leave it unset"):
        compile_with(ToyFrontend(facts=("a", "b")), tmp_path)


def test_the_common_tail_refuses_an_example_that_violates_the_guard(toy, tmp_path):
    with pytest.raises(FrontendError, match=r"violates the guard constraint 'a.numel < 4096'"):
        compile_with(ToyFrontend(constraints=("a.numel < 4096",)), tmp_path)


def test_a_second_frontend_under_a_taken_name_is_refused(toy):
    class Other(ToyFrontend):
        pass

    with pytest.raises(FrontendError, match="expected one frontend named 'toy'"):
        frontends.register(Other())


def test_the_builtin_frontends_register_without_importing_their_dsls():
    code = ("import sys; from flyship.compiler import frontends; print(frontends.names()); "
            "print(sorted(m for m in ('flydsl', 'triton') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.split("\n")[:2] == ["['flydsl', 'triton']", "[]"]
