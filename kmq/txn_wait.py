"""Transactional calls that give up after a deadline.

kafka-python 3.0.12's ``send_offsets_to_transaction``, ``commit_transaction`` and
``abort_transaction`` wait for the transaction coordinator without a timeout. In a full chaos
run a tracker's coordinator connection never came back after a network fault, and its loop
waited 3.5 minutes in one commit: no redeliveries from any of its partitions, and its group
stuck in a rebalance it could not join. These run the same steps and wait at most
``timeout_s``; :class:`TransactionStuck` then tells the caller to drop the producer and claim
the partition again (which fences the stuck one and ends its transaction at the broker).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kafka.errors import KafkaTimeoutError


class TransactionStuck(KafkaTimeoutError):  # type: ignore[misc]
    """A transactional call was not answered in time; the producer is no longer usable."""


def init(producer: Any, timeout_s: float) -> None:
    """``init_transactions()`` that waits at most ``timeout_s`` (KafkaTimeoutError after):
    kafka-python 3.0 waits its ``max_block_ms`` for it, and a claim of a markers partition
    during a network fault then stopped a tracker's loop, and every partition it served,
    for 10 s. Called again after a timeout, it goes on waiting for the same request."""
    config = getattr(producer, "config", None)
    if not isinstance(config, dict) or "max_block_ms" not in config:
        producer.init_transactions()  # not kafka-python 3.0's KafkaProducer (a test stub)
        return
    # init_transactions() reads max_block_ms only for this wait; this producer is used by
    # the tracker's loop thread alone.
    saved = config["max_block_ms"]
    config["max_block_ms"] = max(1, int(timeout_s * 1000))
    try:
        producer.init_transactions()
    finally:
        config["max_block_ms"] = saved


def send_offsets(
    producer: Any, offsets: Mapping[Any, Any], group_metadata: Any, timeout_s: float
) -> None:
    _wait(
        producer,
        lambda m: m.send_offsets_to_transaction(dict(offsets), group_metadata),
        lambda: producer.send_offsets_to_transaction(dict(offsets), group_metadata),
        timeout_s,
        "offset commit",
    )


def commit(producer: Any, timeout_s: float) -> None:
    _wait(
        producer,
        lambda m: m.begin_commit(),
        lambda: producer.commit_transaction(),
        timeout_s,
        "commit",
    )


def abort(producer: Any, timeout_s: float) -> None:
    _wait(
        producer,
        lambda m: m.begin_abort(),
        lambda: producer.abort_transaction(),
        timeout_s,
        "abort",
    )


def _wait(
    producer: Any,
    start: Callable[[Any], Any],
    unbounded: Callable[[], None],
    timeout_s: float,
    what: str,
) -> None:
    manager = getattr(producer, "_transaction_manager", None)
    sender = getattr(producer, "_sender", None)
    if manager is None or sender is None:
        unbounded()  # not kafka-python 3.0's KafkaProducer (a test stub): its own call
        return
    # What the KafkaProducer method does, with a timeout on the wait.
    result = start(manager)
    sender.wakeup()
    if not result.wait(timeout_ms=timeout_s * 1000):
        raise TransactionStuck(f"the transaction's {what} was not answered in {timeout_s:g} s")
