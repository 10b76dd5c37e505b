"""Queue pause, stored in Kafka itself: a compacted control topic keyed by queue id.

While a queue is paused its consumers hand out nothing new and the tracker holds its
redeliveries. A pause ends at its ``until`` time (wall clock) or on resume.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from kmq.errors import BrokerError

log = logging.getLogger(__name__)


def encode_pause(until_ms: int) -> bytes:
    return json.dumps({"paused_until_ms": int(until_ms)}).encode()


def decode_pause(value: bytes | None) -> int:
    """The pause end in epoch ms; 0 when not paused or unreadable (never pause on garbage)."""
    if not value:
        return 0
    try:
        until = json.loads(value)["paused_until_ms"]
    except (ValueError, KeyError, TypeError):
        return 0
    return until if isinstance(until, int) and not isinstance(until, bool) else 0


class PauseTable:
    """Latest pause per queue, as read from the control topic. Pure: no I/O, time passed in."""

    def __init__(self) -> None:
        self._until_ms: dict[str, int] = {}

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if not key:
            return
        queue = key.decode("utf-8", "replace")
        until = decode_pause(value)
        if until:
            self._until_ms[queue] = until
        else:
            self._until_ms.pop(queue, None)

    def paused_until_ms(self, queue: str, now_ms: int) -> int:
        """The pause's end if ``queue`` is paused at ``now_ms``, else 0."""
        until = self._until_ms.get(queue, 0)
        return until if until > now_ms else 0


class ControlWatcher:
    """Tails the control topic in a background thread and keeps a :class:`PauseTable`."""

    def __init__(self, bootstrap_servers: str, control_topic: str) -> None:
        self.table = PauseTable()
        self.caught_up = threading.Event()
        self._topic = control_topic
        self._stop = threading.Event()
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            enable_auto_commit=False,
            client_id="kmq-control",
            fetch_max_wait_ms=200,
        )
        self._thread = threading.Thread(target=self._run, name="kmq-control", daemon=True)
        self._thread.start()

    def paused_until_ms(self, queue: str) -> int:
        return self.table.paused_until_ms(queue, int(time.time() * 1000))

    def _run(self) -> None:
        tps: list[TopicPartition] = []
        while not self._stop.is_set():
            try:
                if not tps:
                    partitions = self._consumer.partitions_for_topic(self._topic) or set()
                    tps = [TopicPartition(self._topic, p) for p in sorted(partitions)]
                    if not tps:
                        self._stop.wait(1.0)
                        continue
                    self._consumer.assign(tps)
                    self._consumer.seek_to_beginning(*tps)
                for batch in self._consumer.poll(timeout_ms=200).values():
                    for record in batch:
                        self.table.apply(record.key, record.value)
                if not self.caught_up.is_set() and all(
                    (hw := self._consumer.highwater(tp)) is not None
                    and self._consumer.position(tp) >= hw
                    for tp in tps
                ):
                    self.caught_up.set()
            except KafkaError as exc:
                log.warning("control topic %s: %r", self._topic, exc)
                self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()


def set_pause(bootstrap_servers: str, control_topic: str, queue: str, until_ms: int) -> None:
    """Pause ``queue`` until ``until_ms`` (epoch ms); ``0`` resumes it."""
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all")
    try:
        producer.send(control_topic, key=queue.encode(), value=encode_pause(until_ms)).get(30)
    except KafkaError as exc:
        raise BrokerError(f"could not write to control topic {control_topic}: {exc}") from exc
    finally:
        producer.close(timeout=5)
