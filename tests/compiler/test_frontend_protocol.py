"""A new frontend is its folder plus one registration: tests/compiler/tiny_frontend.py registers "tiny" (a made-up
DSL, tinydsl) from the tests alone, and the compile stage plans, tunes, keys, and builds it through the real build
path (spawned workers included) by asking the frontend, with no product file naming it."""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M
from flyship.bundle import targets as _targets
from flyship.compiler import pipeline as B
from flyship.compiler import cache as C
from flyship.compiler import executors, frontends, pools, spec, tuning
from flyship.compiler.worker import SPEC_IMPORT, load_spec_file
from flyship.errors import CompileError

from ..conftest import ROOT

pytestmark = pytest.mark.cpu

SPEC = """
    from flyship.compiler.spec import *
    from tests.compiler.tiny_frontend import TinyKernel

    namespace("tiny_ops")
    op("vadd", kernel=TinyKernel(), grid=("cdiv(a.numel, 64)",),
       args=[Tensor("a", rank=1), Tensor("b", rank=1), Output("c", like="a")],
       specs=[Spec("f32", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (4096,), "b": (4096,)})])
"""


@pytest.fixture
def tiny(monkeypatch):
    """The tests-only frontend, registered for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(frontends, "_REGISTRY", dict(frontends._registry()))
    module = importlib.import_module("tests.compiler.tiny_frontend")
    return module, frontends.register(module.FRONTEND)


def spec_file(tmp_path: Path, text: str = SPEC) -> Path:
    p = tmp_path / "tiny_spec.py"
    p.write_text(textwrap.dedent(text))
    return p


def test_a_frontend_registered_from_the_tests_is_planned_and_compiled_in_spawned_workers(tiny, tmp_path):
    targets = B.check_archs(("gfx942",))
    sf = B.read_declarations(str(spec_file(tmp_path)), targets)
    assert [o.frontend for o in sf.ops] == ["tiny"] and frontends.origin("tiny") == "tests.compiler.tiny_frontend"
    tasks = B.plan(sf, targets)
    opts = B.BuildOptions(spec_path=str(spec_file(tmp_path)), out_dir=str(tmp_path / "out"), archs=("gfx942",))
    results = executors.run(tasks, opts, None, None, tmp_path, lambda line: None, ("tiny",))
    variants, failures = B.succeeded(results)
    (v,) = variants.values()
    assert not failures and (v.symbol, v.toolchain, v.launch.block) == ("vadd_kernel_0", {"tiny": "1.0"}, (64, 1, 1))
    assert [(f.offset, f.kind, f.arg) for f in v.kernargs.fields][:2] == [(0, "pointer", "a"), (8, "shape", "a")]


def test_flyc_build_writes_a_bundle_of_a_frontend_no_product_file_names(tiny, tmp_path):
    opts = B.BuildOptions(spec_path=str(spec_file(tmp_path)), out_dir=str(tmp_path / "out"), archs=("gfx942",),
                          cache=False)
    rows = B.build(opts, progress=lambda line: None)
    m = M.read(tmp_path / "out")
    assert [(o.name, o.frontend) for o in m.ops] == [("vadd", "tiny")] and m.build.frontends == {"tiny": "1.0"}
    assert [(r.op, r.target, r.symbol) for r in rows] == [("vadd", "gfx942", "vadd_kernel_0")]


def test_the_frontend_reads_its_dsls_autotuner_and_configs_and_sizes_their_blocks(tiny):
    module, _fe = tiny
    tuned = module.TinyAutotuner(module.TinyKernel(), [module.TinyConfig(64), module.TinyConfig(2048)], key=["a"])

    def run():
        spec.namespace("tiny_tuned")
        spec.op("vadd", kernel=tuned, grid=("cdiv(a.numel, 64)",),
                args=[spec.Tensor("a", rank=1), spec.Tensor("b", rank=1), spec.Output("c", like="a")],
                specs=[spec.Spec("f32", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (64,), "b": (64,)})])

    op = spec.run_spec_file("tiny_tuned.py", run).ops[0]
    assert (op.frontend, op.key) == ("tiny", ("a.shape[0]",))
    assert [(s.name, s.options) for s in op.specs] == [("f32__num_threads64", {"num_threads": 64}),
                                                       ("f32__num_threads2048", {"num_threads": 2048})]
    assert tuning.from_native_config(module.TinyConfig(128)).values == {"num_threads": 128}
    tasks, lines = tuning.prune_tasks([op], [("vadd", s.name, "gfx942") for s in op.specs])
    assert tasks == [("vadd", "f32__num_threads64", "gfx942")]
    assert lines == ["op vadd on gfx942: pruned 1 of 2 configs (block 2048 over gfx942's 1024: 1)"]


def test_the_build_cache_and_the_workers_environment_follow_the_frontend(tiny):
    assert C.package_versions()["tinydsl"] == "absent" and "tinydsl" in C.versioned_packages()
    env = C.dsl_environment({"TINYDSL_OPT": "3", "TINY_ARCH": "gfx942", "TINYDSL_CACHE_DIR": "/c", "TINY_X": "1"})
    assert env == {"TINYDSL_OPT": "3", "TINY_ARCH": "gfx942"}
    assert executors.target_environment("gfx950", "b")["TINYDSL_TARGET"] == "gfx950"
    assert "TINYDSL_TARGET" not in executors.target_environment("sm_90", "b")
    assert _targets.parse_target("gfx942").vendor in tiny[1].vendors


def test_a_spec_file_whose_dsl_is_missing_gets_the_frontends_install_hint(tiny, tmp_path):
    with pytest.raises(CompileError, match=r"expected a Python with tinydsl \(the spec file imports it\), got .*"
                                           r"which has none; pip install tinydsl into the build Python") as e:
        load_spec_file(str(spec_file(tmp_path, "import tinydsl\n")))
    assert e.value.kind == SPEC_IMPORT  # a failure reason reads "SpecImportError: ..."


def test_no_product_file_names_the_tests_frontend():
    product = [p for d in ("bundle", "compiler", "loader", "flyship", "csrc") for p in (ROOT / d).rglob("*")
               if p.is_file() and p.suffix in (".py", ".json", ".cpp", ".h")]
    assert product and not [p for p in product if any(w in p.read_text() for w in ("tinydsl", "tiny_frontend"))]


PIPE_SPEC = """
    from flyship.compiler.spec import *
    from tests.compiler.pipe_frontend import PipeKernel

    namespace("pipe_ops")
    op("vadd", kernel=PipeKernel(), grid=("cdiv(a.numel, 64)",),
       args=[Tensor("a", rank=1), Tensor("b", rank=1), Output("c", like="a")],
       specs=[Spec(f"s{k}", dtypes={"a": "float32", "b": "float32"}, shapes={"a": (4096,), "b": (4096,)})
              for k in range(4)])
"""


def test_a_pipelined_frontends_post_trace_steps_overlap_the_next_trace_with_one_trace_at_a_time(tmp_path, monkeypatch):
    """-j 1: one kernel traces at a time (the slot), while the kernel before it assembles and proves in a second
    worker: the build's wall time is below the sum of the steps, and no two traces ever overlap."""
    monkeypatch.setattr(frontends, "_REGISTRY", dict(frontends._registry()))
    frontends.register(importlib.import_module("tests.compiler.pipe_frontend").FRONTEND)
    monkeypatch.setattr(pools, "PIPELINE_MIN_TASKS", 4)  # pipelining pays from a few dozen kernels; this has four
    monkeypatch.setattr(pools, "cores", lambda: 16)  # and needs a core to spare for the extra worker
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("TINYPIPE_LOG", str(log))
    path = spec_file(tmp_path, PIPE_SPEC)
    targets = B.check_archs(("gfx942",))
    sf = B.read_declarations(str(path), targets)
    opts = B.BuildOptions(spec_path=str(path), out_dir=str(tmp_path / "out"), archs=("gfx942",), jobs=1)
    results = executors.run(B.plan(sf, targets), opts, None, None, tmp_path, lambda line: None, ("tinypipe",))
    assert not [r.error for r in results if r.error]
    steps = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda s: s["trace"][0])
    assert len(steps) == 4 and len({s["pid"] for s in steps}) == 2  # -j 1 + one pipelining worker
    for a, b in zip(steps, steps[1:]):
        assert b["trace"][0] >= a["trace"][1] - 0.01, f"two traces at once: {a} {b}"
    # Some kernel's post-trace step ran while the next one traced.
    assert any(b["trace"][0] < a["end"] for a, b in zip(steps, steps[1:])), steps


def test_an_op_whose_frontend_cannot_build_one_of_the_requested_targets_is_noted_not_dropped_silently(tiny, tmp_path):
    """tinydsl builds for AMD only: asked for gfx942 and sm_90, its op is planned for gfx942 and the build says, in a
    note, that it is not built for sm_90 (where it runs its reference)."""
    targets = B.check_archs(("gfx942", "sm_90"))
    notes: list[str] = []
    tasks = B.plan(B.read_declarations(str(spec_file(tmp_path)), targets), targets, notes.append)
    assert tasks == [("vadd", "f32", "gfx942")]
    assert notes == ["flyc-build: note: op vadd (tiny) builds for amd targets only: not built for sm_90 (there it runs "
                     "its reference, or refuses with the fallback off)"]
