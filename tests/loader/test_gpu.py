"""Real launches on a GPU (ROCm torch: the gfx942/gfx950 code objects; CUDA torch: the sm_90 cubins).

Skipped without a GPU. These prove what the CPU tests cannot: module loading, the kernarg buffer as the
runtime reads it, torch's current stream, CUDA-graph capture, threads, and torch.compile with inductor.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import torch

import flyship
from flyship.bundle import targets as _targets

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a GPU (ROCm or CUDA torch): proves kernels load, launch on torch's stream and "
                              "match their references"),
]


@pytest.fixture
def gpu_ops(tiny_bundle, ext):
    """The tiny bundle under a fresh namespace (own counters), its code objects loaded on device 0."""
    ops = flyship.load(tiny_bundle, namespace=f"flyship_g{uuid.uuid4().hex[:8]}")
    target = ops.device_target(0)
    if not any(_targets.is_compatible(t, target) for t in ops.targets):
        pytest.skip(f"the tiny bundle has no code object for this GPU ({target}); it has {', '.join(ops.targets)}")
    return ops


def cuda(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda").to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 1000, 1024, 5000, 1 << 20])
def test_add_matches_the_reference(gpu_ops, dtype, n):
    x, y = cuda(n, dtype=dtype), cuda(n, dtype=dtype)
    torch.testing.assert_close(gpu_ops.add(x, y), x + y)
    spec = "f32" if dtype == torch.float32 else "f16"
    assert gpu_ops.add.stats()["launches"][spec] == 1 and gpu_ops.add.stats()["fallbacks"] == {}


def test_the_out_variant_writes_into_out(gpu_ops):
    x, y, o = cuda(3000), cuda(3000), torch.empty(3000, device="cuda")
    assert gpu_ops.add.out(x, y, out=o) is o
    torch.testing.assert_close(o, x + y)
    assert getattr(torch.ops, gpu_ops.namespace).add.out(x, y, out=o) is None


def test_a_strided_input_and_scalars_reach_the_kernel(gpu_ops):
    x = cuda(300, 700).t()  # strides (1, 700): the kernel takes both strides
    out = gpu_ops.scale_rows(x, -1.5, 7)
    torch.testing.assert_close(out, x * -1.5 + 7)
    assert gpu_ops.scale_rows.stats()["launches"] == {"f32": 1}


def test_two_outputs(gpu_ops):
    x, y = cuda(4099), cuda(4099)
    s, d = gpu_ops.addsub(x, y)
    torch.testing.assert_close(s, x + y)
    torch.testing.assert_close(d, x - y)


def test_inputs_that_fit_nothing_fall_back_and_are_counted(gpu_ops):
    x, y = cuda(100, dtype=torch.float64), cuda(100, dtype=torch.float64)
    torch.testing.assert_close(gpu_ops.add(x, y), x + y)
    assert gpu_ops.add.stats()["fallbacks"] == {"dtype x=float64": 1}
    gpu_ops.fallback = False
    with pytest.raises(RuntimeError,
                       match=r"no specialization fits these inputs \(dtype x=float64\) and the fallback is off"):
        gpu_ops.add(x, y)


def test_empty_inputs_launch_nothing(gpu_ops):
    x = torch.empty(0, device="cuda")
    assert gpu_ops.add(x, x).shape == (0,)
    assert gpu_ops.add.stats()["empty"] == 1 and gpu_ops.add.stats()["launches"]["f32"] == 0


def test_cpu_and_gpu_tensors_mixed_raise(gpu_ops):
    with pytest.raises(RuntimeError, match="expected all tensors on one device, got cuda:0 for 'x' and cpu for 'y'"):
        gpu_ops.add(cuda(8), torch.randn(8))


def test_launches_go_to_the_current_stream(gpu_ops):
    x, y = cuda(1 << 22), cuda(1 << 22)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = gpu_ops.add(x, y)
        again = gpu_ops.add(out, y)  # ordered after the first on the same stream
    side.synchronize()
    torch.testing.assert_close(again, x + y + y)


def test_a_cuda_graph_captures_and_replays_the_launch(gpu_ops):
    x, y, o = cuda(8192), cuda(8192), torch.empty(8192, device="cuda")
    gpu_ops.add.out(x, y, out=o)  # first call loads the module, outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gpu_ops.add.out(x, y, out=o)
    x.copy_(cuda(8192))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(o, x + y)


def test_calls_from_many_threads_at_once(gpu_ops):
    errors, n_threads, n_calls = [], 8, 100

    def work(seed: int) -> None:
        try:
            gen = torch.Generator(device="cuda").manual_seed(seed)
            for _ in range(n_calls):
                x = torch.randn(5000, device="cuda", generator=gen)
                torch.testing.assert_close(gpu_ops.add(x, x), x + x)
        except Exception as e:  # noqa: BLE001 - collected for the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert gpu_ops.add.stats()["launches"]["f32"] == n_threads * n_calls


def test_torch_compile_with_inductor_runs_the_ops_without_graph_breaks(gpu_ops):
    ns = getattr(torch.ops, gpu_ops.namespace)

    def f(x, y):
        s, d = ns.addsub(x, y)
        return ns.scale_rows(ns.add(s, d).view(4, -1), 0.5, bias=1) * 2

    x, y = cuda(4096), cuda(4096)
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, y), ((x + y + x - y).view(4, -1) * 0.5 + 1) * 2)


def test_backward_raises_and_forward_works_with_inputs_that_require_grad(gpu_ops):
    x = cuda(64).requires_grad_()
    y = gpu_ops.add(x, x.detach())
    torch.testing.assert_close(y.detach(), x.detach() * 2)
    with pytest.raises(RuntimeError, match="is not implemented"):
        y.sum().backward()


def test_verification_passes_on_this_gpu(gpu_ops):
    report = gpu_ops.verify()
    print("\n" + report.table())
    ran = [r for r in report.rows if not r.skipped]
    assert ran and all(r.ok and r.max_abs <= 1e-3 for r in ran), report.table()
    assert report.ok
    report.raise_on_failure()


def test_preload_loads_every_runnable_code_object(gpu_ops):
    assert gpu_ops.preload(0) >= 3


def test_per_call_host_time_is_reported(gpu_ops):
    x, y, o = cuda(4096), cuda(4096), torch.empty(4096, device="cuda")
    packet = getattr(torch.ops, gpu_ops.namespace).add

    def per_call(fn, n=20000) -> float:
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    times = {
        "torch.add(x, y)": per_call(lambda: torch.add(x, y)),
        "torch.add(x, y, out=o)": per_call(lambda: torch.add(x, y, out=o)),
        "torch.ops.<ns>.add.default(x, y)": per_call(lambda: packet.default(x, y)),
        "torch.ops.<ns>.add.out(x, y, out=o)": per_call(lambda: packet.out(x, y, out=o)),
        "ops.add(x, y)": per_call(lambda: gpu_ops.add(x, y)),
    }
    print("\nper-call host time, us: " + "; ".join(f"{k} {v:.1f}" for k, v in times.items()))
    # Generous bound: a C++ kernel with no Python on the hot path stays within a few times torch's own op.
    assert times["torch.ops.<ns>.add.default(x, y)"] < 4 * times["torch.add(x, y)"] + 10


def test_backward_of_an_autograd_pair_runs_the_backward_kernel_and_matches_the_reference(gpu_ops):
    x = cuda(5000).requires_grad_()
    y = cuda(5000).requires_grad_()
    s, d = gpu_ops.addsub(x, y)
    gs, gd = cuda(5000), cuda(5000)
    gpu_ops.addsub.reset_stats()
    torch.autograd.backward((s, d), (gs, gd))
    torch.testing.assert_close(x.grad, gs + gd)
    torch.testing.assert_close(y.grad, gs - gd)
    assert gpu_ops.addsub.stats()["launches"] == {"f32": 1} and gpu_ops.addsub.stats()["fallbacks"] == {}


def test_opcheck_passes_for_an_autograd_pair_on_the_gpu(gpu_ops):
    x, y = cuda(3000).requires_grad_(), cuda(3000).requires_grad_()
    torch.library.opcheck(getattr(torch.ops, gpu_ops.namespace).addsub.default, (x, y))


def test_ops_loaded_from_a_warm_plan_cache_match_their_references_from_the_first_call(tiny_bundle, ext, tmp_path,
                                                                                     monkeypatch):
    # The first load writes the plan cache; the second reads only the ops' heads, and each op's specializations
    # come from the cache when it is first called (loader/plancache.py).
    monkeypatch.setenv("FLYSHIP_PLAN_CACHE", str(tmp_path / "plans"))
    cold = flyship.load(tiny_bundle, namespace=f"flyship_g{uuid.uuid4().hex[:8]}")
    warm = flyship.load(tiny_bundle, namespace=f"flyship_g{uuid.uuid4().hex[:8]}")
    if not any(_targets.is_compatible(t, warm.device_target(0)) for t in warm.targets):
        pytest.skip(f"the tiny bundle has no code object for this GPU; it has {', '.join(warm.targets)}")
    assert warm._plan._specs == {}  # nothing but the heads was read at load
    x, y = cuda(4096), cuda(4096)
    for ops in (warm, cold):
        torch.testing.assert_close(ops.add(x, y), x + y)
        assert ops.add.stats()["launches"]["f32"] == 1 and ops.add.stats()["fallbacks"] == {}
    assert warm.preload(0) == cold.preload(0) > 0
