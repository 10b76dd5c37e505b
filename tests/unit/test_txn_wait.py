"""Transactional calls with a deadline (kmq.txn_wait): kafka-python's own wait for ever."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka.errors import KafkaError, KafkaTimeoutError, ProducerFencedError
from kafka.producer.transaction_manager import TransactionalRequestResult

from kmq import txn_wait
from kmq.txn_wait import TransactionStuck
from tracker.redeliver import Redeliverer, Round, RoundOutcome


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
    outcome = redeliverer.round(_Producer(None), [], {"tp": 1}, "group")
    assert outcome == RoundOutcome(False, stuck=True)
    assert redeliverer.round(_Producer("ok"), [], {"tp": 1}, "group") == RoundOutcome(True)
    assert redeliverer.round(_Producer("fenced"), [], {"tp": 1}, "group") == RoundOutcome(
        False, fenced=True
    )


class _Answered:
    """A result already answered (``error``: how) whose wait is written in ``log``."""

    def __init__(self, log: list[str], name: str, error: BaseException | None) -> None:
        self.log, self.name, self.error = log, name, error

    def wait(self, timeout_ms: float | None = None) -> bool:
        self.log.append(f"wait {self.name}")
        if self.error is not None:
            raise self.error
        return True


class _LoggedManager:
    def __init__(self, log: list[str], producer: str, fail: dict[str, BaseException]) -> None:
        self.log, self.producer, self.fail = log, producer, fail

    def _result(self, step: str) -> _Answered:
        name = f"{step} {self.producer}"
        self.log.append(f"send {name}")
        return _Answered(self.log, name, self.fail.get(step))

    def send_offsets_to_transaction(self, offsets: Any, group: Any) -> _Answered:
        return self._result("offsets")

    def begin_commit(self) -> _Answered:
        return self._result("commit")

    def begin_abort(self) -> _Answered:
        return self._result("abort")


def _logged(log: list[str], name: str, **fail: BaseException) -> _Producer:
    producer = _Producer("ok")
    producer._transaction_manager = _LoggedManager(log, name, fail)  # type: ignore[assignment]
    return producer


def test_rounds_of_several_partitions_go_side_by_side() -> None:
    log: list[str] = []
    redeliverer = Redeliverer("q", "q.retry", "m", lambda topic, queue: (0,))
    a, b = _logged(log, "a"), _logged(log, "b")
    outcomes = redeliverer.rounds([Round(a, [], {"tp": 1}, "g"), Round(b, [], {"tp": 2}, "g")])
    assert outcomes == [RoundOutcome(True), RoundOutcome(True)]
    # Each round's next step is sent as soon as its last one is answered, and no round's
    # wait comes before every round's first step is sent.
    assert log == [
        "send offsets a", "send offsets b", "wait offsets a", "send commit a",
        "wait offsets b", "send commit b", "wait commit a", "wait commit b",
    ]  # fmt: skip


def test_one_partitions_failed_round_leaves_the_others_alone() -> None:
    log: list[str] = []
    redeliverer = Redeliverer("q", "q.retry", "m", lambda topic, queue: (0,))
    fenced = _logged(log, "a", offsets=ProducerFencedError())
    failed = _logged(log, "b", commit=KafkaError("coordinator moved"))
    fine = _logged(log, "c")
    outcomes = redeliverer.rounds(
        [Round(p, [], {"tp": 1}, "g") for p in (fenced, failed, fine)]
        + [Round(_logged(log, "d"), [], {}, "g")]  # nothing to commit: straight to its commit
    )
    assert outcomes == [
        RoundOutcome(False, fenced=True), RoundOutcome(False), RoundOutcome(True),
        RoundOutcome(True),
    ]  # fmt: skip
    assert "send commit a" not in log  # a fenced producer commits nothing
    assert log.index("send abort b") > log.index("wait commit b")
    assert log.index("send commit d") < log.index("wait offsets a")


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
