"""Issue 23 item 6: upstream FlyDSL's RoPE + KV cache and flash attention builders, named in a spec exactly as
upstream's own tests and interface call them (``build_fused_rope_cache_module(...)`` and
``build_flash_attn_func_module(num_heads=..., head_dim=..., causal=...)``, each returning a plain Python function
around an inner ``@flyc.jit`` launcher; flash attention's takes ``*args``), build for gfx942 and gfx950 with a code
object proven equal to FlyDSL's own and a kernarg layout that tiles the code object's metadata.

Upstream's ``kernels/`` is not in the wheel nor in this repository: point ``FLYSHIP_UPSTREAM_FLYDSL`` at a folder
holding it (``git archive HEAD kernels`` of ROCm/FlyDSL, extracted). Without it the tests skip.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flyship.bundle import manifest as M

from ..conftest import run_build
from .upstream import assert_proven, upstream_kernels

pytestmark = pytest.mark.compile
ARCHS = ["gfx942", "gfx950"]


@pytest.fixture(scope="module")
def upstream() -> Path:
    return upstream_kernels("its RoPE + KV cache and flash attention builders build", "kernels/attention/fused_rope_cache_kernel.py")


ROPE = """
    from kernels.attention.fused_rope_cache_kernel import build_fused_rope_cache_module
    T, QH, KH, D, BLOCK, BLOCKS, MAX_POS = 32, 8, 1, 64, 16, 40, 1024
    # What the builder bakes in (heads, head_dim, block_size, the cos/sin width) is pinned: another size needs
    # another build.
    BAKED = (f"Q.shape[1] == {QH}", f"Q.shape[2] == {D}", *(f"{t}.shape[0] == Q.shape[0]" for t in "KV"),
             *(f"{t}.shape[1] == {KH}" for t in "KV"), *(f"{t}.shape[2] == {D}" for t in "KV"),
             *(f"{c}.shape[1] == {BLOCK}" for c in ("KeyCache", "ValueCache")),
             *(f"{c}.shape[2] == {KH}" for c in ("KeyCache", "ValueCache")),
             *(f"{c}.shape[3] == {D}" for c in ("KeyCache", "ValueCache")),
             *(f"{c}.shape[1] == {D // 2}" for c in ("CosCache", "SinCache")))
    # upstream's kernel writes both caches in place: mutable=True makes mutable what the kernel writes (the write
    # check finds both caches; mutable=["KeyCache", "ValueCache"] or Tensor(..., mutable=True) on each is the same)
    op("rope_cache", mutable=True, kernel=build_fused_rope_cache_module(head_dim=D, num_q_heads=QH, num_kv_heads=KH,
                                                         block_size=BLOCK, is_neox=True, flash_layout=True,
                                                         dtype_str="bf16"),
       args=[Tensor("Q", rank=3), Tensor("K", rank=3), Tensor("V", rank=3), Tensor("Positions", rank=1),
             Tensor("CosCache", rank=2), Tensor("SinCache", rank=2), Tensor("SlotMapping", rank=1),
             Tensor("KeyCache", rank=4), Tensor("ValueCache", rank=4),
             Output("Q_out", like="Q"), Output("K_out", like="K"), Value("num_tokens", "Q.shape[0]"),
             Tensor("KScale", rank=1), Tensor("VScale", rank=1)],
       specs=[Spec("bf16", dtypes={"Q": "bfloat16", "K": "bfloat16", "V": "bfloat16", "Positions": "int32",
                                   "CosCache": "bfloat16", "SinCache": "bfloat16", "SlotMapping": "int32",
                                   "KeyCache": "bfloat16", "ValueCache": "bfloat16", "KScale": "float32",
                                   "VScale": "float32"},
                   shapes={"Q": (T, QH, D), "K": (T, KH, D), "V": (T, KH, D), "Positions": (T,),
                           "CosCache": (MAX_POS, D // 2), "SinCache": (MAX_POS, D // 2), "SlotMapping": (T,),
                           "KeyCache": (BLOCKS, BLOCK, KH, D), "ValueCache": (BLOCKS, BLOCK, KH, D),
                           "KScale": (1,), "VScale": (1,)},
                   constraints=BAKED)])
"""

# flydsl_flash_attn_func calls exe(q, k, v, out, B, S) on BSHD tensors; the builder returns _guarded(*args,
# **kwargs), which passes Out for the unused LSE / cu_seqlens / block-table slots and its keyword default
# block_table_stride=0 as the block-table stride: declared as written, those six arguments and nothing else.
FLASH = """
    from kernels.attention.flash_attn_generic import build_flash_attn_func_module
    B, S, H, D = 2, 256, 8, 128
    ARGS = [Tensor("Q", rank=4), Tensor("K", rank=4), Tensor("V", rank=4), Output("O", like="Q"),
            Value("batch_size", "Q.shape[0]"), Value("seq_len", "Q.shape[1]")]
    F16 = {"Q": "float16", "K": "float16", "V": "float16"}
    SHAPES = {"Q": (B, S, H, D), "K": (B, S, H, D), "V": (B, S, H, D)}
    # K and V match Q; the heads and head_dim are baked into the build; the returned function refuses seq_len < 1.
    SAME = (*(f"{t}.shape[{d}] == Q.shape[{d}]" for t in "KV" for d in (0, 1)),
            *(f"{t}.shape[2] == {H}" for t in "QKV"), *(f"{t}.shape[3] == {D}" for t in "QKV"), "Q.shape[1] >= 1")
    op("fa_causal", kernel=build_flash_attn_func_module(num_heads=H, head_dim=D, causal=True, dtype_str="f16"),
       args=ARGS, specs=[Spec("f16", dtypes=F16, shapes=SHAPES, constraints=SAME)])
    # Non-causal: the returned function picks the launcher that skips the KV pad mask when seq_len % 64 == 0
    # (the example's), so the spec pins it; another length would need the masking launcher, another spec.
    op("fa", kernel=build_flash_attn_func_module(num_heads=H, head_dim=D, causal=False, dtype_str="f16"),
       args=ARGS, specs=[Spec("f16", dtypes=F16, shapes=SHAPES, constraints=SAME + ("Q.shape[1] % 64 == 0",))])
"""


def _build(tmp_path: Path, upstream: Path, body: str) -> M.Manifest:
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(upstream)!r})
        from flyship.compiler.spec import Output, Spec, Tensor, Value, namespace, op
        namespace("upstream")
    """) + textwrap.dedent(body))
    run_build(spec, tmp_path / "o", ARCHS)
    return M.read(tmp_path / "o")


def _check_proven(bundle: Path, m: M.Manifest) -> dict[tuple[str, str], int]:
    """Every code object is proven equal to FlyDSL's own and its kernargs tile its metadata; returns the .text
    size per (op, target)."""
    text = {}
    for op in m.ops:
        for spec in op.specializations:
            assert sorted(v.target for v in spec.variants) == ARCHS, (op.name, spec.name)
            for v in spec.variants:
                co = assert_proven(bundle, f"{op.name}.{spec.name}.{v.target}", v)
                text[(op.name, v.target)] = len(co.section_bytes(".text"))
    return text


def test_upstream_rope_kv_cache_builder_builds_as_upstream_calls_it_equal_to_flydsls_code_object(tmp_path, upstream):
    m = _build(tmp_path, upstream, ROPE)
    text = _check_proven(tmp_path / "o", m)
    assert all(size > 0 for size in text.values())
    op = m.op("rope_cache")
    assert [a.name for a in op.args if getattr(a, "mutable", False)] == ["KeyCache", "ValueCache"]
    v = op.specializations[0].variants[0]
    assert v.launch.block == (64, 1, 1)  # one wave64 per (head, token)
    assert op.specializations[0].example.grid == (8, 32, 1)  # (max(QH, KH), T, 1)
    assert {"Q.shape[1] == 8", "KeyCache.shape[1] == 16"} <= set(op.specializations[0].guard.constraints)


def test_upstream_flash_attention_builders_taking_star_args_build_causal_and_not_equal_to_flydsls_code_object(
        tmp_path, upstream):
    m = _build(tmp_path, upstream, FLASH)
    text = _check_proven(tmp_path / "o", m)
    # The causal and the non-causal kernels differ: each op built the launcher its own builder chose.
    for arch in ARCHS:
        assert text[("fa_causal", arch)] != text[("fa", arch)], arch
    guard = m.op("fa").specializations[0].guard
    assert "Q.shape[1] % 64 == 0" in guard.constraints
    # the block-table stride the entry passes from its keyword default is a constant 0 in the kernargs
    for v in m.op("fa").specializations[0].variants:
        assert ("i32", "0") in [(f.type, f.expr) for f in v.kernargs.fields if f.kind == "expr"]


def test_upstream_rope_kv_cache_as_written_without_mutable_is_refused_naming_both_caches_in_one_line(
        tmp_path, upstream):
    # Writing a KV cache in place must be declared (the schema says Tensor(a!), torch.compile sees the write); the
    # refusal names both caches and the one-line fix, which the test above uses.
    body = ROPE.replace('op("rope_cache", mutable=True,', 'op("rope_cache",')
    assert body != ROPE
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(upstream)!r})
        from flyship.compiler.spec import Output, Spec, Tensor, Value, namespace, op
        namespace("upstream")
    """) + textwrap.dedent(body))
    r = run_build(spec, tmp_path / "o", ["gfx942"], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the kernel stores through 2 input tensors the spec declares neither an Output nor mutable" in r.stderr
    assert "declare them all at once: op(..., mutable=['KeyCache', 'ValueCache'])" in r.stderr
