"""Config spaces at build time: expansion, refusals, per-target pruning, the key check, reading FlyDSL's and
Triton's autotuned kernels, and flyc-build end to end (the manifest carries the key)."""

from __future__ import annotations

import json
import textwrap

import pytest

from flyship.bundle import manifest as M
from flyship.errors import SpecError

from ..conftest import ROOT, run_build

pytestmark = pytest.mark.compile
triton = pytest.importorskip("triton", reason="needs triton 3.6 (the FlyDSL venv); it declares Triton config spaces")

from flyship.compiler import spec as S  # noqa: E402
from flyship.compiler import tuning as T  # noqa: E402

KERNELS = ROOT / "examples" / "triton"


def rmsnorm_kernel():
    import sys

    sys.path.insert(0, str(KERNELS))
    from tl_rmsnorm import rmsnorm_kernel as k

    return k


ARGS = [S.Tensor("x", rank=2), S.Tensor("w", rank=1), S.Output("out", like="x"), S.Value("x_row_stride", "x.stride[0]"),
        S.Value("out_row_stride", "out.stride[0]"), S.Value("n_cols", "x.shape[1]"), S.Scalar("eps", "float", 1e-6),
        S.Constexpr("BLOCK_N")]
BASE = S.Spec("f16", dtypes={"x": "float16", "w": "float16"}, shapes={"x": (64, 1000), "w": (1000,)},
              constexprs={"BLOCK_N": 1024}, constraints=("x.shape[1] <= 1024", "w.shape[0] == x.shape[1]"))


def declare(**kw):
    def run():
        S.namespace("tuned_t")
        S.op("rmsnorm", kernel=kw.pop("kernel", None) or rmsnorm_kernel(), args=ARGS, grid=("x.shape[0]",),
             specs=kw.pop("specs", [BASE]), **kw)

    return S.run_spec_file("t.py", run).ops[0]


def test_each_config_becomes_a_specialization_named_after_its_values():
    op = declare(configs=[T.Config(num_warps=2), T.Config(num_warps=8, num_stages=1)], key=("x.shape[0]", "x.shape[1]"))
    assert [s.name for s in op.specs] == ["f16__w2", "f16__w8_s1"]
    assert op.specs[1].options == {"num_warps": 8, "num_stages": 1}
    assert op.key == ("x.shape[0]", "x.shape[1]")


def test_a_config_keyword_the_frontend_does_not_understand_is_refused_not_dropped():
    with pytest.raises(SpecError, match=r"sets \['BLOCK_M'\], which the triton frontend does not understand"):
        declare(configs=[T.Config(num_warps=2), T.Config(BLOCK_M=64)], key=("x.shape[0]",))


def test_a_config_space_without_a_key_is_refused():
    with pytest.raises(SpecError, match="needs key="):
        declare(configs=[T.Config(num_warps=2)])


def test_a_key_that_is_not_an_expression_over_the_inputs_is_refused():
    with pytest.raises(SpecError, match="key expression 'BLOCK_N'"):
        declare(configs=[T.Config(num_warps=2)], key=("BLOCK_N",))


def test_configs_over_the_targets_block_limit_are_pruned_before_compiling_on_that_target_only():
    op = declare(configs=[T.Config(num_warps=4), T.Config(num_warps=32)], key=("x.shape[0]",))
    tasks = [(op.name, s.name, t) for s in op.specs for t in ("gfx942", "sm_90")]
    kept, report = T.prune_tasks([op], tasks)
    assert ("rmsnorm", "f16__w32", "gfx942") not in kept and ("rmsnorm", "f16__w32", "sm_90") in kept
    assert report == ["op rmsnorm on gfx942: pruned 1 of 2 configs (block 2048 over gfx942's 1024: 1)"]


def test_the_users_prune_function_sees_the_targets_limits_and_the_example():
    seen = {}

    def prune(configs, named):
        seen[named["target"]] = (named["lds_bytes"], tuple(named["x"].shape))
        return [c for c in configs if c.values["num_warps"] * 1024 <= named["lds_bytes"] // 16]

    op = declare(configs=[T.Config(num_warps=2), T.Config(num_warps=8)], key=("x.shape[0]",), prune=prune)
    tasks = [(op.name, s.name, t) for s in op.specs for t in ("gfx942", "gfx950")]
    kept, report = T.prune_tasks([op], tasks)
    assert seen == {"gfx942": (65536, (64, 1000)), "gfx950": (163840, (64, 1000))}
    assert ("rmsnorm", "f16__w8", "gfx942") not in kept and ("rmsnorm", "f16__w8", "gfx950") in kept
    assert "the op's prune function: 1" in report[0]


def test_a_prune_that_leaves_nothing_on_a_target_is_an_error():
    op = declare(configs=[T.Config(num_warps=2)], key=("x.shape[0]",), prune=lambda cs, named: [])
    with pytest.raises(SpecError, match="every config was pruned on gfx942"):
        T.prune_tasks([op], [(op.name, "f16__w2", "gfx942")])


def test_a_key_that_leaves_out_a_dimension_the_grid_depends_on_is_warned_about_by_name():
    op = declare(configs=[T.Config(num_warps=2)], key=("x.shape[1]",))
    (line,) = T.key_warnings(op, {"f16__w2": ("x.shape[0]", "1", "1")})
    assert "leaves out x.shape[0]" in line
    full = declare(configs=[T.Config(num_warps=2)], key=("x.shape[0]", "x.shape[1]"))
    assert T.key_warnings(full, {"f16__w2": ("x.shape[0]", "1", "1")}) == []  # w.shape[0] == x.shape[1]


def test_a_triton_autotuned_kernel_gives_its_configs_key_and_prune_function():
    def early(configs, named, **kw):
        return configs[:1]

    k = triton.autotune(configs=[triton.Config({}, num_warps=2, num_stages=1), triton.Config({}, num_warps=4)],
                        key=["n_cols"], prune_configs_by={"early_config_prune": early})(rmsnorm_kernel())
    op = declare(kernel=k)
    assert [s.name for s in op.specs] == ["f16__w2_s1", "f16__w4_s3"]
    assert op.key == ("x.shape[1]",)  # the Value n_cols
    kept, _ = T.prune_tasks([op], [(op.name, s.name, "gfx942") for s in op.specs])
    assert kept == [("rmsnorm", "f16__w2_s1", "gfx942")]


def test_a_flydsl_autotuned_launcher_gives_its_configs_and_key():
    flydsl = pytest.importorskip("flydsl", reason="needs FlyDSL 0.5.0; it would read flydsl.autotune")
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "flydsl"))
    from elementwise import add

    tuned = flydsl.autotune(configs=[flydsl.Config(num_warps=4), flydsl.Config(num_warps=8, waves_per_eu=2)],
                            key=["x"])(add)
    fn, pairs, key, prune = T.from_autotuner(tuned)
    assert fn is add and key == ["x"] and prune is None
    assert [c.values for c, _ in pairs] == [{"num_warps": 4}, {"num_warps": 8, "waves_per_eu": 2}]
    assert T.key_from_names(key, [S.Tensor("x", rank=2)]) == ("x.shape[0]", "x.shape[1]")


def test_flyc_build_prunes_per_target_and_writes_the_key_into_the_manifest(tmp_path):
    spec = tmp_path / "tuned_spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(KERNELS)!r})
        from tl_rmsnorm import rmsnorm_kernel
        from flyship.compiler.spec import *
        from flyship.compiler.tuning import Config
        namespace("tuned_e2e")
        op("rmsnorm", kernel=rmsnorm_kernel,
           args=[Tensor("x", rank=2), Tensor("w", rank=1), Output("out", like="x"),
                 Value("x_row_stride", "x.stride[0]"), Value("out_row_stride", "out.stride[0]"),
                 Value("n_cols", "x.shape[1]"), Scalar("eps", "float", 1e-6), Constexpr("BLOCK_N")],
           grid=("x.shape[0]",),
           specs=[Spec("f16", dtypes={{"x": "float16", "w": "float16"}}, shapes={{"x": (8, 1000), "w": (1000,)}},
                       constexprs={{"BLOCK_N": 1024}}, constraints=("x.shape[1] <= 1024", "w.shape[0] == x.shape[1]"))],
           configs=[Config(num_warps=4), Config(num_warps=32)], key=("x.shape[0]", "x.shape[1]"))
    """))
    r = run_build(spec, tmp_path / "b", ["gfx942", "sm_90"], "-j", "2")
    assert "op rmsnorm on gfx942: pruned 1 of 2 configs (block 2048 over gfx942's 1024: 1)" in r.stderr
    m = M.read(tmp_path / "b")
    (op,) = m.ops
    assert op.tuning_key == ("x.shape[0]", "x.shape[1]")
    targets = {s.name: sorted(v.target for v in s.variants) for s in op.specializations}
    assert targets == {"f16__w4": ["gfx942", "sm_90a"], "f16__w32": ["sm_90a"]}
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["ops"][0]["tuning_key"] == list(op.tuning_key)


FLY_ARGS = [S.Tensor("x", rank=2), S.Tensor("y", rank=2), S.Output("out", like="x"), S.Constexpr("VEC")]
FLY_BASE = S.Spec("f32", dtypes={"x": "float32", "y": "float32"}, shapes={"x": (8, 1024), "y": (8, 1024)})


def test_a_flydsl_config_space_accepts_the_compile_hints_the_flydsl_frontend_reads():
    from flyship.compiler.frontends.flydsl.frontend import COMPILE_HINT_OPTIONS, FlydslFrontend

    assert FlydslFrontend.config_options == COMPILE_HINT_OPTIONS  # one owner: tuning reads the frontend's list
    specs, _ = T.expand("add", "flydsl", FLY_ARGS, [FLY_BASE], [(T.Config(VEC=4, waves_per_eu=2), None)])
    assert [(s.name, s.constexprs, s.options) for s in specs] == [("f32__VEC4_wpe2", {"VEC": 4},
                                                                   {"waves_per_eu": 2})]
    with pytest.raises(SpecError, match=r"sets \['maxnreg'\], which the flydsl frontend does not understand.*"
                                        r"'waves_per_eu'"):
        T.expand("add", "flydsl", FLY_ARGS, [FLY_BASE], [(T.Config(maxnreg=128), None)])


def test_flydsl_and_triton_config_objects_passed_to_configs_are_converted():
    flydsl = pytest.importorskip("flydsl", reason="needs FlyDSL 0.5.0; it would pass flydsl.Config objects")
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "flydsl"))
    from elementwise import add

    def run():
        S.namespace("tuned_fly")
        S.op("add", kernel=add, args=FLY_ARGS, specs=[FLY_BASE], key=("x.shape[1]",),
             configs=[flydsl.Config(VEC=4, waves_per_eu=2), flydsl.Config(VEC=8)])

    op = S.run_spec_file("t.py", run).ops[0]
    assert [(s.name, s.constexprs, s.options) for s in op.specs] == [
        ("f32__VEC4_wpe2", {"VEC": 4}, {"waves_per_eu": 2}), ("f32__VEC8", {"VEC": 8}, {})]
    op = declare(configs=[triton.Config({}, num_warps=2, num_stages=1)], key=("x.shape[1]",))
    assert [(s.name, s.options) for s in op.specs] == [("f16__w2_s1", {"num_warps": 2, "num_stages": 1})]
    with pytest.raises(SpecError, match="expected no pre_hook"):
        T.from_native_config(flydsl.Config(waves_per_eu=2, pre_hook=lambda args: None))
    with pytest.raises(SpecError, match=r"configs= expects a non-empty list of flyship.compiler.tuning.Config.*"
                                        r"got \['dict'\]"):
        declare(configs=[{"num_warps": 2}], key=("x.shape[1]",))


def test_configs_given_to_op_replace_an_autotuners_configs_function_and_its_kernel_is_named():
    """upstream rmsnorm_autotune: flydsl.autotune(configs=_search_configs) (a function of the call); op()'s
    configs= replaces it, and without configs= the refusal names the kernel by its function name."""
    flydsl = pytest.importorskip("flydsl", reason="needs FlyDSL 0.5.0; it would read flydsl.autotune")
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "flydsl"))
    from elementwise import add

    tuned = flydsl.autotune(configs=lambda *a, **k: [flydsl.Config(VEC=4)], key=["x"])(add)

    def run(**kw):
        S.namespace("tuned_fn")
        S.op("add", kernel=tuned, args=FLY_ARGS, specs=[FLY_BASE], **kw)

    op = S.run_spec_file("t.py", lambda: run(configs=[S.Config(VEC=4), S.Config(VEC=8)])).ops[0]
    assert op.kernel is add and [s.name for s in op.specs] == ["f32__VEC4", "f32__VEC8"]
    assert op.key == ("x.shape[0]", "x.shape[1]")
    with pytest.raises(SpecError) as e:
        S.run_spec_file("t.py", run)
    assert "op add: autotuned kernel add: expected a list of configs, got a function" in str(e.value)
    assert "configs=[Config(" in str(e.value) and "object at 0x" not in str(e.value)
    assert T.kernel_name(tuned) == "add" and T.kernel_name(rmsnorm_kernel()) == "rmsnorm_kernel"


def test_config_is_importable_from_the_spec_module_as_the_docs_show():
    """docs/spec-api.md "Config spaces": op(..., configs=[Config(...)]) with the spec module's names."""
    ns: dict = {}
    exec("from flyship.compiler.spec import Config", ns)
    assert ns["Config"] is T.Config
    ns = {}
    exec("from flyship.compiler.spec import *", ns)
    assert ns["Config"] is T.Config


def test_a_dimension_the_guard_pins_to_a_constant_is_not_asked_for_in_the_key():
    """/tmp/u/s7/spec3.py: constraints 'x.shape[1] == N' (N a constexpr, written in) pin x.shape[1] and, through
    'w.shape[0] == x.shape[1]', w.shape[0]; the key warning named them anyway."""
    pinned = S.Spec("f16", dtypes={"x": "float16", "w": "float16"}, shapes={"x": (64, 1024), "w": (1024,)},
                    constexprs={"BLOCK_N": 1024}, constraints=("x.shape[1] == BLOCK_N", "w.shape[0] == x.shape[1]"))
    op = declare(configs=[T.Config(num_warps=2)], key=("x.shape[0]",), specs=[pinned])
    assert T.key_warnings(op, {"f16__w2": ("x.shape[0]", "x.shape[1]", "1")}) == []
    free = declare(configs=[T.Config(num_warps=2)], key=("x.shape[0]",))  # x.shape[1] <= 1024: not pinned
    lines = T.key_warnings(free, {"f16__w2": ("x.shape[0]", "1", "1")})
    # one dimension under two names (the guard 'w.shape[0] == x.shape[1]'): one warning naming both, not two
    assert [ln.split(" leaves out ")[1].split(", which")[0] for ln in lines] == ["w.shape[0] (= x.shape[1])"]


def test_an_autotuner_key_naming_a_constexpr_gives_no_key_expression():
    """upstream rmsnorm_autotune keys on N, a Constexpr here: each spec fixes it, so it adds nothing to the key."""
    args = [S.Tensor("x", rank=2), S.Constexpr("N"), S.Scalar("eps", "float", 1e-6)]
    assert T.key_from_names(["x", "N"], args) == ("x.shape[0]", "x.shape[1]")
    assert T.key_from_names(["N"], args) == ()
    with pytest.raises(SpecError, match="autotune key 'eps': expected an input tensor, a Value, an int Scalar or a "
                                        "Constexpr of the op, got Scalar"):
        T.key_from_names(["eps"], args)


def test_an_autotuned_flydsl_launcher_declares_the_constexprs_its_configs_set_and_keys_past_its_defaults():
    """upstream rmsnorm_autotune as written: Config(BLOCK_THREADS=...) sets a launcher Constexpr the call does not
    pass, and the key names weight_dtype_str, a Constexpr left at its default: the first is declared from the
    configs, the second leaves the key (one value in every call); both were refused (issue 34 item 4)."""
    flydsl = pytest.importorskip("flydsl", reason="needs FlyDSL 0.5.0; it would read flydsl.autotune")
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "flydsl"))
    from elementwise import add

    tuned = flydsl.autotune(configs=[flydsl.Config(VEC=4), flydsl.Config(VEC=8)], key=["x", "VEC"])(add)
    args = FLY_ARGS[:3]  # x, y, out: VEC undeclared

    def run():
        S.namespace("tuned_cx")
        S.op("add", kernel=tuned, args=args, specs=[FLY_BASE])

    op = S.run_spec_file("t.py", run).ops[0]
    assert [(type(a).__name__, a.name) for a in op.args][3:] == [("Constexpr", "VEC")]
    assert [s.constexprs for s in op.specs] == [{"VEC": 4}, {"VEC": 8}] and op.key == ("x.shape[0]", "x.shape[1]")
    # the defaulted Constexpr in the key, with no config setting it: out of the key, not refused
    tuned = flydsl.autotune(configs=[flydsl.Config(waves_per_eu=1), flydsl.Config(waves_per_eu=2)],
                            key=["x", "VEC"])(add)
    op = S.run_spec_file("t.py", run).ops[0]
    assert [a.name for a in op.args] == ["x", "y", "out"] and op.key == ("x.shape[0]", "x.shape[1]")
