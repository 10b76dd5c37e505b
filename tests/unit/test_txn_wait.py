"""Transactional calls with a deadline (kmq.txn_wait): kafka-python's own wait for ever."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka.errors import KafkaError, KafkaTimeoutError, ProducerFencedError
from kafka.producer.transaction_manager import TransactionalRequestResult

from kmq import txn_wait
from kmq.txn_wait import TransactionStuck
from tracker.redeliver import Redeliverer, RoundOutcome


class _Manager:
    """kafka-python's TransactionManager as far as the calls go: each step returns a
    TransactionalRequestResult that ``answer`` completes (or never, if it is None)."""

    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.calls: list[str] = []

    def _result(self, name: str) -> TransactionalRequestResult:
        self.calls.append(name)
        result = TransactionalRequestResult()
        if self.answer == "ok":
            result.done()
        elif self.answer == "fenced":
            result.done(ProducerFencedError())
        return result

    def begin_commit(self) -> TransactionalRequestResult:
        return self._result("commit")

    def begin_abort(self) -> TransactionalRequestResult:
        return self._result("abort")

    def send_offsets_to_transaction(self, offsets: Any, group: Any) -> TransactionalRequestResult:
        return self._result("offsets")


class _Sender:
    def __init__(self) -> None:
        self.wakeups = 0

    def wakeup(self) -> None:
        self.wakeups += 1


class _Producer:
    def __init__(self, answer: str | None) -> None:
        self._transaction_manager = _Manager(answer)
        self._sender = _Sender()
        self.sent: list[Any] = []

    def begin_transaction(self) -> None:
        pass

    def send(self, topic: str, **kwargs: Any) -> None:
        self.sent.append(topic)


@pytest.mark.parametrize(
    "call",
    [
        lambda p: txn_wait.commit(p, 0.05),
        lambda p: txn_wait.abort(p, 0.05),
        lambda p: txn_wait.send_offsets(p, {"tp": 1}, "group", 0.05),
    ],
)
def test_an_unanswered_call_gives_up_at_its_deadline(call: Any) -> None:
    producer = _Producer(None)
    started = time.monotonic()
    wording = r"the transaction's (commit|abort|offset commit) was not answered in 0\.05 s$"
    with pytest.raises(TransactionStuck, match=wording):
        call(producer)
    assert time.monotonic() - started < 2.0
    assert producer._sender.wakeups == 1
    assert isinstance(TransactionStuck("x"), KafkaError)  # a round's KafkaError handling sees it


def test_answered_calls_return_or_raise_the_broker_error() -> None:
    producer = _Producer("ok")
    txn_wait.send_offsets(producer, {"tp": 1}, "group", 1.0)
    txn_wait.commit(producer, 1.0)
    txn_wait.abort(producer, 1.0)
    assert producer._transaction_manager.calls == ["offsets", "commit", "abort"]
    with pytest.raises(ProducerFencedError):
        txn_wait.commit(_Producer("fenced"), 1.0)


def test_a_producer_without_kafka_python_internals_uses_its_own_calls() -> None:
    calls: list[str] = []

    class Plain:
        def commit_transaction(self) -> None:
            calls.append("commit")

        def abort_transaction(self) -> None:
            calls.append("abort")

        def send_offsets_to_transaction(self, offsets: Any, group: Any) -> None:
            calls.append(f"offsets {offsets} {group}")

    txn_wait.send_offsets(Plain(), {"tp": 1}, "g", 1.0)
    txn_wait.commit(Plain(), 1.0)
    txn_wait.abort(Plain(), 1.0)
    assert calls == ["offsets {'tp': 1} g", "commit", "abort"]


def test_a_stuck_round_tells_the_daemon_to_claim_the_partition_again() -> None:
    redeliverer = Redeliverer("q", "q.retry", "m", lambda topic, queue: (0,), txn_timeout_s=0.05)
    out = _Producer("ok")  # no copies: nothing goes through it
    outcome = redeliverer.round(_Producer(None), [], {"tp": 1}, "group", out)
    assert outcome == RoundOutcome(False, stuck=True)
    assert redeliverer.round(_Producer("ok"), [], {"tp": 1}, "group", out) == RoundOutcome(True)
    assert redeliverer.round(_Producer("fenced"), [], {"tp": 1}, "group", out) == RoundOutcome(
        False, fenced=True
    )
    assert out.sent == []


class _InitProducer:
    """What txn_wait.init needs of a kafka-python 3.0 KafkaProducer: its config, and an
    init_transactions() that waits ``max_block_ms`` (here: records it, then raises)."""

    def __init__(self, fail: BaseException | None) -> None:
        self.config: dict[str, Any] = {"max_block_ms": 10_000}
        self.waited_ms: list[int] = []
        self.fail = fail

    def init_transactions(self) -> None:
        self.waited_ms.append(self.config["max_block_ms"])
        if self.fail is not None:
            raise self.fail


@pytest.mark.parametrize("fail", [None, KafkaTimeoutError("not yet")], ids=["answered", "not-yet"])
def test_init_waits_its_own_bound_then_restores_max_block_ms(fail: BaseException | None) -> None:
    producer = _InitProducer(fail)
    if fail is None:
        txn_wait.init(producer, 0.5)
    else:
        with pytest.raises(KafkaTimeoutError):
            txn_wait.init(producer, 0.5)
    assert producer.waited_ms == [500]
    assert producer.config["max_block_ms"] == 10_000, "sends still get the producer's own"
