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

import time
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


class Pending:
    """A transactional call sent and not yet waited for: several producers' calls can be
    in flight at once (a tracker round commits every partition's transaction together)."""

    def __init__(self, result: Any, what: str) -> None:
        self._result = result  # kafka-python's TransactionalRequestResult; None: done
        self._sent = time.monotonic()
        self.what = what

    def wait(self, timeout_s: float) -> None:
        """Wait until ``timeout_s`` after it was sent (:class:`TransactionStuck` then);
        raises the broker's error if the call failed."""
        if self._result is None:
            return
        left_s = max(0.0, timeout_s - (time.monotonic() - self._sent))
        if not self._result.wait(timeout_ms=left_s * 1000):
            raise TransactionStuck(
                f"the transaction's {self.what} was not answered in {timeout_s:g} s"
            )


def start_offsets(producer: Any, offsets: Mapping[Any, Any], group_metadata: Any) -> Pending:
    """Send the offset commit of ``producer``'s transaction; :meth:`Pending.wait` for it."""
    return _start(
        producer,
        lambda m: m.send_offsets_to_transaction(dict(offsets), group_metadata),
        lambda: producer.send_offsets_to_transaction(dict(offsets), group_metadata),
        "offset commit",
    )


def start_commit(producer: Any) -> Pending:
    """Send the commit of ``producer``'s transaction; :meth:`Pending.wait` for it."""
    return _start(
        producer, lambda m: m.begin_commit(), lambda: producer.commit_transaction(), "commit"
    )


def send_offsets(
    producer: Any, offsets: Mapping[Any, Any], group_metadata: Any, timeout_s: float
) -> None:
    start_offsets(producer, offsets, group_metadata).wait(timeout_s)


def commit(producer: Any, timeout_s: float) -> None:
    start_commit(producer).wait(timeout_s)


def abort(producer: Any, timeout_s: float) -> None:
    call = _start(
        producer, lambda m: m.begin_abort(), lambda: producer.abort_transaction(), "abort"
    )
    call.wait(timeout_s)


def _start(
    producer: Any,
    start: Callable[[Any], Any],
    unbounded: Callable[[], None],
    what: str,
) -> Pending:
    manager = getattr(producer, "_transaction_manager", None)
    sender = getattr(producer, "_sender", None)
    if manager is None or sender is None:
        unbounded()  # not kafka-python 3.0's KafkaProducer (a test stub): its own call
        return Pending(None, what)
    # What the KafkaProducer method does, without its wait.
    result = start(manager)
    sender.wakeup()
    return Pending(result, what)
