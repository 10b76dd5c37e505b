"""kafka-python 3.0.12 drops a group join that finishes between two polls: the fix keeps it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from kafka.coordinator.base import BaseCoordinator
from kafka.future import Future
from kafka.structs import MemberState

from kmq import join_fix


class _Generation:
    generation_id = 7
    member_id = "m-1"
    protocol = "kmq-layout"


class _Coordinator:
    """The parts of a BaseCoordinator that a finished join touches."""

    def __init__(self, task: Future | None, rejoin: bool = True) -> None:
        self._join_task = task
        self._lock = threading.RLock()
        self._generation = _Generation()
        self.rejoining = True
        self.rejoin_needed = rejoin
        self.state = MemberState.REBALANCING
        self.heartbeat_enabled = False
        self.completed: list[tuple[Any, ...]] = []

    def need_rejoin(self) -> bool:
        return self.rejoin_needed

    def _enable_heartbeat(self) -> None:
        self.heartbeat_enabled = True

    async def _on_join_complete_async(self, *args: Any) -> None:
        self.completed.append(args)


def _run(coordinator: _Coordinator) -> tuple[Any, list[Any]]:
    originals: list[Any] = []

    async def original(c: Any, timeout_ms: Any) -> str:
        originals.append(timeout_ms)
        return "original"

    result = asyncio.run(join_fix.complete_finished_join(coordinator, original, 100))
    return result, originals


def _done(value: Any = None, error: Exception | None = None) -> Future:
    future = Future()
    if error is None:
        future.success(value)
    else:
        future.failure(error)
    return future


def test_a_join_that_finished_after_the_poll_gave_up_is_completed_not_resent() -> None:
    coordinator = _Coordinator(_done(b"assignment"))
    result, originals = _run(coordinator)
    assert result is True
    assert originals == []  # no new JoinGroup
    assert coordinator.completed == [(7, "m-1", "kmq-layout", b"assignment")]
    assert coordinator._join_task is None
    assert coordinator.state is MemberState.STABLE
    assert not coordinator.rejoin_needed and not coordinator.rejoining
    assert coordinator.heartbeat_enabled


def test_a_pending_join_a_failed_join_or_no_join_go_to_kafka_python() -> None:
    for task in (Future(), _done(error=RuntimeError("join failed")), None):
        coordinator = _Coordinator(task)
        result, originals = _run(coordinator)
        assert (result, originals) == ("original", [100])
        assert coordinator.completed == []
        assert coordinator.state is MemberState.REBALANCING


def test_a_finished_join_is_not_replayed_when_no_rejoin_is_needed() -> None:
    coordinator = _Coordinator(_done(b"assignment"), rejoin=False)
    result, originals = _run(coordinator)
    assert (result, originals) == ("original", [100])
    assert coordinator.completed == []


def test_apply_patches_kafka_python_once() -> None:
    assert join_fix.apply() is True
    patched = BaseCoordinator.join_group_async
    assert join_fix.apply() is True
    assert BaseCoordinator.join_group_async is patched
    assert patched.__module__ == "kmq.join_fix"
