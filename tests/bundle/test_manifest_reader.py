"""The manifest reader's per-class field plan is built whole before it is used: an exception while it is built
(a RecursionError deep inside a caller's reference) leaves nothing behind, and a second thread never reads
with half a plan. Bundle tier: stdlib only."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from flyship.bundle import manifest_json as M

pytestmark = pytest.mark.cpu


@dataclasses.dataclass(frozen=True)
class Pair:
    first: str
    second: int
    third: tuple[str, ...] = ()


DATA = {"first": "a", "second": 2, "third": ["x"]}


def failing_once_on(monkeypatch, field_type, exc):
    """Make the reader of ``field_type`` fail the first time it is resolved, as a RecursionError would."""
    real = M._reader
    state = {"failed": False}

    def reader(cls):
        if cls == field_type and not state["failed"]:
            state["failed"] = True
            raise exc
        return real(cls)

    monkeypatch.setattr(M, "_reader", reader)


def test_an_exception_while_the_field_plan_is_built_does_not_poison_later_reads(monkeypatch):
    failing_once_on(monkeypatch, int, RecursionError("maximum recursion depth exceeded"))
    read = M._dataclass_reader(Pair)
    with pytest.raises(RecursionError):
        read(DATA, "manifest", False)
    assert read(DATA, "manifest", False) == Pair("a", 2, ("x",))


def test_a_second_thread_never_reads_with_a_half_built_field_plan(monkeypatch):
    real = M._reader
    builder = threading.current_thread()
    half_built, other_done = threading.Event(), threading.Event()

    def slow_reader(cls):
        if cls == int and threading.current_thread() is builder:
            half_built.set()  # "first" is resolved, "second" not yet
            assert other_done.wait(10)
        return real(cls)

    monkeypatch.setattr(M, "_reader", slow_reader)
    read = M._dataclass_reader(Pair)
    seen = []

    def other():
        assert half_built.wait(10)
        try:
            seen.append(read(DATA, "manifest", False))
        except BaseException as e:  # noqa: BLE001 - the failure is the finding
            seen.append(e)
        other_done.set()

    t = threading.Thread(target=other)
    t.start()
    first = read(DATA, "manifest", False)
    t.join(10)
    assert seen == [Pair("a", 2, ("x",))]
    assert first == Pair("a", 2, ("x",))
