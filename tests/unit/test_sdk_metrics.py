"""kmq.metrics: off by default at no cost, one family per registry, what each call counts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

import kmq
from kmq import metrics
from kmq.message import Message, State


def test_off_by_default_and_prometheus_client_never_imported() -> None:
    code = (
        "import sys, kmq\n"
        "svc = kmq.Service(bootstrap_servers='127.0.0.1:1')\n"
        "svc.queue('q').producer()\n"
        "assert svc.config.metrics is None\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert out.stdout.strip() == "False"
    assert metrics.for_queue(None, "q") is None


def test_metrics_must_be_a_registry() -> None:
    with pytest.raises(kmq.ConfigError, match="CollectorRegistry"):
        kmq.ServiceConfig(bootstrap_servers="h:1", metrics=object())  # type: ignore[arg-type]


def test_services_sharing_a_registry_share_its_families() -> None:
    registry = CollectorRegistry()
    a = metrics.for_queue(registry, "a")
    again = metrics.for_queue(registry, "a")
    b = metrics.for_queue(registry, "b")
    assert a is not None and b is not None and a is again
    a.sent.inc(2)
    b.sent.inc()
    assert registry.get_sample_value("kmq_messages_sent_total", {"queue": "a"}) == 2
    assert registry.get_sample_value("kmq_messages_sent_total", {"queue": "b"}) == 1


class _Consumer:
    queue = "a"
    in_flight = 3


def test_settling_counts_by_outcome_and_times_from_receive() -> None:
    registry = CollectorRegistry()
    m = metrics.for_queue(registry, "a")
    assert m is not None
    messages = [Message.__new__(Message) for _ in range(4)]
    m.taken(messages)
    for message, state in zip(messages, (State.ACKED, State.ACKED, State.NACKED, State.REJECTED),
                              strict=True):  # fmt: skip
        m.settled(message, state)
    untimed = Message.__new__(Message)  # not handed out by receive(): counted, not timed
    m.settled(untimed, State.ACKED)

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"queue": "a"})

    assert value("kmq_messages_received_total") == 4
    assert (value("kmq_messages_acked_total"), value("kmq_messages_nacked_total"),
            value("kmq_messages_rejected_total")) == (3, 1, 1)  # fmt: skip
    assert value("kmq_message_processing_seconds_count") == 4
    consumer = _Consumer()
    m.watch(consumer)
    assert value("kmq_messages_in_flight") == 3
    del consumer
    assert value("kmq_messages_in_flight") is None  # gone with its consumer
