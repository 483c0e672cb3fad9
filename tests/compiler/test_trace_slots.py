"""The trace slots of a pipelined worker pool (``compiler/worker.py: TraceSlots``). A worker that died in the DSL's
native code while tracing (upstream's fp8 GEMMs crash FlyDSL 0.5.0 on gfx942) held a multiprocessing semaphore
for good: the pool's other worker waited for it forever, and CPython 3.11's ProcessPoolExecutor, not watching a
worker spawned after its manager took the sentinels, never reported the death, so flyc-build hung. Slots are lock
files now, which the kernel frees when their holder dies."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time

import pytest

from flyship.compiler.worker import TraceSlots

pytestmark = pytest.mark.cpu


def _hold_and_die(slots: TraceSlots, held) -> None:
    slots.__enter__()
    held.set()
    os._exit(1)  # dies holding the slot: no __exit__, no cleanup


def _acquired_within(slots: TraceSlots, seconds: float) -> bool:
    ctx = multiprocessing.get_context("spawn")
    done = ctx.Event()
    p = ctx.Process(target=_enter_and_signal, args=(slots, done))
    p.start()
    ok = done.wait(seconds)
    p.kill()
    p.join()
    return ok


def _enter_and_signal(slots: TraceSlots, done) -> None:
    with slots:
        done.set()


def test_a_slot_held_by_a_worker_that_died_is_free_for_the_next_worker(tmp_path):
    slots = TraceSlots(tmp_path, 1)
    ctx = multiprocessing.get_context("spawn")
    held = ctx.Event()
    p = ctx.Process(target=_hold_and_die, args=(slots, held))
    p.start()
    assert held.wait(30)
    p.join(30)
    assert p.exitcode == 1
    t0 = time.monotonic()
    with slots:  # a semaphore would block here forever
        assert time.monotonic() - t0 < 5


def test_slots_let_only_their_count_of_holders_in_at_once(tmp_path):
    slots = TraceSlots(tmp_path, 2)
    first, second = pickle.loads(pickle.dumps(slots)), pickle.loads(pickle.dumps(slots))
    with first, second:
        assert not _acquired_within(slots, 1.0)  # both slots held: a third waits
    assert _acquired_within(slots, 30)  # released on exit
