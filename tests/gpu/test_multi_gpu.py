"""Per-device code-object loading on two GPUs (issue: a module loaded on one device cannot launch on another).

Needs two GPUs (the nvidia-h200-x2 kind); with fewer, every test skips with what it would prove.
"""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def two(gpu, ops):
    if gpu.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs, this machine has {gpu.cuda.device_count()}: would prove that each device "
                    "loads each code object once, that calls alternating between cuda:0 and cuda:1 (and from two "
                    "threads) are correct on both, that tensors on different devices are refused, and that the "
                    "loader restores the current device")
    return gpu


def _check_add(torch, ops, device: str, n: int = 70_001) -> None:
    x = torch.randn(n, 3, device=device)
    y = torch.randn(n, 3, device=device)
    out = ops.add(x, y)
    assert out.device == x.device
    torch.testing.assert_close(out, x + y)


def test_alternating_devices_are_correct_and_each_device_loads_the_code_object_once(two, ops):
    torch = two
    from flyship.loader import extension

    ext = extension(ops.flavor)
    before = ext.loaded_modules()
    launches = sum(ops.add.stats()["launches"].values())
    for k in range(20):
        _check_add(torch, ops, f"cuda:{k % 2}")
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    assert sum(ops.add.stats()["launches"].values()) - launches == 20
    # One module per (device, code object): the f32 add variant on cuda:0 and on cuda:1, at most.
    assert ext.loaded_modules() - before <= 2


def test_two_threads_on_two_devices_are_correct(two, ops):
    torch = two
    errors: list[BaseException] = []

    def work(dev: int) -> None:
        try:
            torch.cuda.set_device(dev)
            for _ in range(50):
                _check_add(torch, ops, f"cuda:{dev}", n=4099)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_tensors_on_two_devices_are_refused(two, ops):
    torch = two
    x = torch.randn(8, 3, device="cuda:0")
    y = torch.randn(8, 3, device="cuda:1")
    with pytest.raises(RuntimeError, match="expected all tensors on one device"):
        ops.add(x, y)


def test_the_current_device_is_restored_after_a_call_on_another(two, ops):
    torch = two
    torch.cuda.set_device(0)
    _check_add(torch, ops, "cuda:1")
    assert torch.cuda.current_device() == 0
    torch.cuda.set_device(1)
    _check_add(torch, ops, "cuda:0")
    assert torch.cuda.current_device() == 1
    torch.cuda.set_device(0)
