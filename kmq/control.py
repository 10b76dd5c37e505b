"""The control topic: a small compacted topic every kmq process tails.

It holds three kinds of record, told apart by key:

* a queue id: that queue's pause (:mod:`kmq.pause`);
* ``layout <topic>``: where each queue's records live on ``topic`` (:mod:`kmq.layout`);
* ``unread <retry topic> <partition> <queue>``: a tracker wrote copies for ``queue`` to that
  retry-topic partition while no consumer of the queue said it read any (every reader
  killed, say); a consumer reading nothing of the queue's retry lane reads it meanwhile
  (:mod:`kmq.adopted`). Withdrawn (a tombstone) once a reader is heard again.

Queue ids never contain a space, nor do topic names, so they never collide. Earlier
releases take an ``unread`` key for a queue that is not paused, and ignore it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kafka import TopicPartition
from kafka.errors import KafkaError

from kmq import kafka_clients
from kmq.errors import BrokerError
from kmq.kafka_clients import KafkaConnection
from kmq.layout import TopicLayout, decode_layout, encode_layout
from kmq.pause import PauseTable, encode_pause

log = logging.getLogger(__name__)

LAYOUT_PREFIX = "layout "
UNREAD_PREFIX = "unread "
UNREAD_VALUE = b"1"


def layout_key(topic: str) -> bytes:
    return (LAYOUT_PREFIX + topic).encode()


def unread_key(retry_topic: str, partition: int, queue: str) -> bytes:
    return f"{UNREAD_PREFIX}{retry_topic} {partition} {queue}".encode()


def parse_unread_key(name: str) -> tuple[str, int, str] | None:
    """(retry topic, partition, queue) of an ``unread`` key; None if malformed."""
    parts = name[len(UNREAD_PREFIX) :].split(" ")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[0] or not parts[2]:
        return None
    return parts[0], int(parts[1]), parts[2]


class ControlTable:
    """The latest pause per queue and layout per topic. Pure: no I/O."""

    def __init__(self) -> None:
        self.pauses = PauseTable()
        self._layouts: dict[str, TopicLayout] = {}
        self._unread: dict[str, dict[str, frozenset[int]]] = {}

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if not key:
            return
        name = key.decode("utf-8", "replace")
        if name.startswith(UNREAD_PREFIX):
            parsed = parse_unread_key(name)
            if parsed is None:
                return
            topic, partition, queue = parsed
            queues = self._unread.setdefault(topic, {})
            now = queues.get(queue, frozenset())
            now = now | {partition} if value else now - {partition}
            if now:
                queues[queue] = now
            else:
                queues.pop(queue, None)
        elif name.startswith(LAYOUT_PREFIX):
            topic = name[len(LAYOUT_PREFIX) :]
            layout = decode_layout(value)
            if layout is None:
                self._layouts.pop(topic, None)
            else:
                self._layouts[topic] = layout
        else:
            self.pauses.apply(name, value)

    def layout(self, topic: str) -> TopicLayout | None:
        return self._layouts.get(topic)

    def unread(self, retry_topic: str, queue: str) -> frozenset[int]:
        """The partitions of ``retry_topic`` said to hold copies for ``queue`` that no
        consumer reads."""
        return self._unread.get(retry_topic, {}).get(queue, frozenset())

    def unread_notices(self, retry_topic: str) -> list[tuple[str, int]]:
        """Every (queue, partition) ``unread`` notice on ``retry_topic`` standing now."""
        queues = self._unread.get(retry_topic, {})
        return [(q, p) for q, parts in queues.items() for p in sorted(parts)]


class ControlWatcher:
    """Tails the control topic in a background thread and keeps a :class:`ControlTable`."""

    def __init__(self, conn: KafkaConnection | str, control_topic: str) -> None:
        self.table = ControlTable()
        self.caught_up = threading.Event()
        self._topic = control_topic
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self.version = 0
        """Bumped whenever a record is applied."""
        self._consumer = kafka_clients.consumer(
            kafka_clients.connection(conn),
            "control",
            enable_auto_commit=False,
            fetch_max_wait_ms=200,
        )
        self._thread = threading.Thread(target=self._run, name="kmq-control", daemon=True)
        self._thread.start()

    def paused_until_ms(self, queue: str) -> int:
        return self.table.pauses.paused_until_ms(queue, int(time.time() * 1000))

    def layout(self, topic: str, timeout_s: float = 30.0) -> TopicLayout | None:
        """``topic``'s layout, once everything on the control topic so far has been read."""
        self.wait_caught_up(timeout_s)
        return self.table.layout(topic)

    def wait_caught_up(self, timeout_s: float) -> None:
        if not self.caught_up.wait(timeout_s):
            raise BrokerError(
                f"could not read control topic {self._topic} to its end in {timeout_s:g} s"
            )

    def wait_for(self, check: Callable[[], bool], timeout_s: float) -> bool:
        """Block until ``check()`` is true (re-checked after each record) or time runs out."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not check():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def _run(self) -> None:
        tps: list[TopicPartition] = []
        while not self._stop.is_set():
            try:
                if not tps:
                    partitions = self._consumer.partitions_for_topic(self._topic) or set()
                    tps = [TopicPartition(self._topic, p) for p in sorted(partitions)]
                    if not tps:
                        # The metadata may be stale: ask the broker for every topic name.
                        if self._topic not in self._consumer.topics():
                            # No control topic: no pauses and no layouts (kmq 0.1's). Keep
                            # looking, in case it is created later.
                            self.caught_up.set()
                        self._stop.wait(0.5)
                        continue
                    self._consumer.assign(tps)
                    self._consumer.seek_to_beginning(*tps)
                applied = False
                for batch in self._consumer.poll(timeout_ms=200).values():
                    for record in batch:
                        self.table.apply(record.key, record.value)
                        applied = True
                if applied:
                    with self._changed:
                        self.version += 1
                        self._changed.notify_all()
                if not self.caught_up.is_set() and all(
                    (hw := self._consumer.highwater(tp)) is not None
                    and self._consumer.position(tp) >= hw
                    for tp in tps
                ):
                    self.caught_up.set()
            except Exception as exc:  # a dead watcher would stall every producer: retry
                log.warning("control topic %s: %r", self._topic, exc)
                self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()


def read_control(
    conn: KafkaConnection | str, control_topic: str, timeout_s: float = 30.0
) -> ControlTable:
    """Everything on the control topic now, read once (for short-lived tools)."""
    watcher = ControlWatcher(conn, control_topic)
    try:
        watcher.wait_caught_up(timeout_s)
        return watcher.table
    finally:
        watcher.close()


def _write(conn: KafkaConnection | str, control_topic: str, key: bytes, value: bytes) -> None:
    producer = kafka_clients.producer(kafka_clients.connection(conn), "control", acks="all")
    try:
        producer.send(control_topic, key=key, value=value).get(30)
    except KafkaError as exc:
        raise BrokerError(f"could not write to control topic {control_topic}: {exc}") from exc
    finally:
        producer.close(timeout=5)


def set_pause(conn: KafkaConnection | str, control_topic: str, queue: str, until_ms: int) -> None:
    """Pause ``queue`` until ``until_ms`` (epoch ms); ``0`` resumes it."""
    _write(conn, control_topic, queue.encode(), encode_pause(until_ms))


def set_layout(
    conn: KafkaConnection | str, control_topic: str, topic: str, layout: TopicLayout
) -> None:
    """Store ``topic``'s layout."""
    _write(conn, control_topic, layout_key(topic), encode_layout(layout))
