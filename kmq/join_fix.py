"""A fix for kafka-python 3.0.12's lost group joins.

``KafkaConsumer.poll(timeout_ms=N)`` runs a group join as a task and gives up waiting for it
after ``N`` ms, leaving the task running. If the task then finishes before the next poll,
that poll sees a finished task, throws its result away and sends a new JoinGroup. For the
group leader that is a new rebalance (about 5 s on the embedded broker, up to the rebalance
timeout on Apache Kafka), and the same can happen again: a kmq consumer, which polls its
queue and retry-lane groups in turn from one thread, could take 15 s or more to join.

:func:`apply` makes the next poll complete such a join instead, exactly as the poll that
waited for it would have. It patches only the kafka-python version it was written against.
"""

from __future__ import annotations

import threading
from typing import Any

import kafka
from kafka.coordinator.base import BaseCoordinator
from kafka.structs import MemberState

FIXED_VERSION = "3.0.12"
"""The kafka-python release whose ``join_group_async`` this replaces."""

_lock = threading.Lock()
_applied = False


async def complete_finished_join(coordinator: Any, original: Any, timeout_ms: Any) -> Any:
    """``join_group_async`` that first completes a join task which finished unobserved."""
    task = coordinator._join_task
    if task is not None and task.is_done and task.succeeded() and coordinator.need_rejoin():
        coordinator._join_task = None
        # What BaseCoordinator.join_group_async does when its own wait sees the task succeed.
        with coordinator._lock:
            coordinator.rejoining = False
            coordinator.rejoin_needed = False
            coordinator.state = MemberState.STABLE
            coordinator._enable_heartbeat()
        generation = coordinator._generation
        await coordinator._on_join_complete_async(
            generation.generation_id, generation.member_id, generation.protocol, task.value
        )
        return True
    return await original(coordinator, timeout_ms)


def apply() -> bool:
    """Install the fix once per process; False (and nothing changed) on other versions."""
    global _applied
    with _lock:
        if _applied:
            return True
        if kafka.__version__ != FIXED_VERSION or not hasattr(BaseCoordinator, "join_group_async"):
            return False
        original = BaseCoordinator.join_group_async

        async def join_group_async(self: Any, timeout_ms: Any = None) -> Any:
            return await complete_finished_join(self, original, timeout_ms)

        BaseCoordinator.join_group_async = join_group_async
        _applied = True
        return True
