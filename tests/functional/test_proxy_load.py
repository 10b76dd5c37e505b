"""Load and failure: clients sending and receiving through two ``kmq serve`` replicas, one of
them SIGKILLed mid-run, then a ledger check: every message whose send was answered is acked
(0 lost), duplicates counted. Loopback only, bounded in messages and time."""

from __future__ import annotations

import base64
import itertools
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from kmq.records import parse_queue_headers
from tests.functional.conftest import Broker, RunningTracker, Topics
from tests.functional.helpers import Children, read_markers, read_records
from tests.functional.test_proxy_helpers import Replica, make_topics, running_tracker, start_replica

MESSAGES = 1500
BATCH = 10
SENDERS = 3
RECEIVERS = 6
VISIBILITY_S = 3.0
DEADLINE_S = 75.0
QUEUE = "load"


@dataclass
class Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    confirmed: set[int] = field(default_factory=set)
    """Sent, and the proxy answered that the broker has it."""
    attempted: set[int] = field(default_factory=set)
    deliveries: list[tuple[int, int]] = field(default_factory=list)
    """(seq, attempt) of every message handed to a client."""
    acked: set[int] = field(default_factory=set)
    send_errors: int = 0
    ack_errors: list[str] = field(default_factory=list)
    """Acks sent again: their answer was lost or not a 200."""
    receive_errors: int = 0


@pytest.fixture
def load_topics(broker: Broker) -> Topics:
    return make_topics(broker, 4)


@pytest.fixture
def load_tracker(broker: Broker, load_topics: Topics) -> Iterator[RunningTracker]:
    yield from running_tracker(broker, load_topics)


def payload(seq: int) -> str:
    return base64.b64encode(f"{seq:08d}".encode()).decode()


def seq_of(message: dict[str, str]) -> int:
    return int(base64.b64decode(message["body"]))


def test_two_replicas_one_sigkilled_lose_nothing(
    broker: Broker,
    load_topics: Topics,
    load_tracker: RunningTracker,
    children: Children,
    tmp_path: Path,
) -> None:
    replicas = [
        start_replica(children, broker, load_topics, tmp_path, name, "--threads", "32")
        for name in ("proxy-a", "proxy-b")
    ]
    a, b = replicas
    ledger = Ledger()
    dead: set[str] = set()
    stop = threading.Event()
    deadline = time.monotonic() + DEADLINE_S
    seqs = iter(range(MESSAGES))
    seq_lock = threading.Lock()

    def live(start: int) -> list[Replica]:
        ordered = replicas[start % 2 :] + replicas[: start % 2]
        return [r for r in ordered if r.url not in dead]

    def sender(index: int) -> None:
        clients = {r.url: r.client(timeout_s=15.0) for r in replicas}
        turn = itertools.count(index)
        try:
            while time.monotonic() < deadline:
                with seq_lock:
                    batch = list(itertools.islice(seqs, BATCH))
                if not batch:
                    return
                with ledger.lock:
                    ledger.attempted.update(batch)
                while batch and time.monotonic() < deadline:
                    target = live(next(turn))[0]
                    try:
                        r = clients[target.url].post(
                            f"/v1/queues/{QUEUE}/messages/batch",
                            json={"messages": [{"body": payload(s)} for s in batch]},
                        )
                    except httpx.TransportError:
                        with ledger.lock:
                            ledger.send_errors += 1
                        continue  # unknown whether it was written: send again (a duplicate at most)
                    if r.status_code >= 500:
                        with ledger.lock:
                            ledger.send_errors += 1
                        continue
                    assert r.status_code in (200, 201), r.text
                    failed = {f["index"] for f in r.json()["failed"]}
                    with ledger.lock:
                        ledger.confirmed.update(s for i, s in enumerate(batch) if i not in failed)
                    batch = [s for i, s in enumerate(batch) if i in failed]
        finally:
            for c in clients.values():
                c.close()

    def receiver(index: int) -> None:
        clients = {r.url: r.client(timeout_s=15.0) for r in replicas}
        turn = itertools.count(index)
        rng = random.Random(index)
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                source = live(next(turn))[0]
                try:
                    r = clients[source.url].post(
                        f"/v1/queues/{QUEUE}/receive",
                        json={"max_messages": BATCH, "wait_s": 1.0, "visibility_s": VISIBILITY_S},
                    )
                except httpx.TransportError:
                    with ledger.lock:
                        ledger.receive_errors += 1
                    continue
                if r.status_code != 200:
                    with ledger.lock:
                        ledger.receive_errors += 1
                    continue
                messages = r.json()["messages"]
                if not messages:
                    continue
                with ledger.lock:
                    ledger.deliveries.extend((seq_of(m), m["attempt"]) for m in messages)
                # Settle through either replica: handles are good on any of them. An ack
                # whose answer is lost (its replica killed, say) may or may not have been
                # written, so it is sent again through a live replica: acking twice is
                # harmless, and a message acked unbeknownst to its client is not lost.
                receipts = [m["receipt"] for m in messages]
                ok = False
                for _ in range(3):
                    settler = rng.choice(live(0))
                    try:
                        ack = clients[settler.url].post(
                            f"/v1/queues/{QUEUE}/ack", json={"receipts": receipts}
                        )
                        ok = ack.status_code == 200
                        error = "" if ok else f"{ack.status_code} {ack.text[:200]}"
                    except httpx.TransportError as exc:
                        ok, error = False, repr(exc)
                    if ok:
                        break
                    with ledger.lock:
                        ledger.ack_errors.append(error)
                with ledger.lock:
                    if ok:
                        ledger.acked.update(seq_of(m) for m in messages)
        finally:
            for c in clients.values():
                c.close()

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(SENDERS)]
    threads += [threading.Thread(target=receiver, args=(i,)) for i in range(RECEIVERS)]
    for t in threads:
        t.start()

    # Mid-run: take a batch from A and never settle it, then SIGKILL A.
    while len(ledger.acked) < MESSAGES // 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(ledger.acked) < MESSAGES, "the run was over before the kill"
    with a.client() as c:
        held = c.post(
            f"/v1/queues/{QUEUE}/receive",
            json={"max_messages": BATCH, "wait_s": 5.0, "visibility_s": VISIBILITY_S},
        )
    held_seqs = {seq_of(m) for m in held.json()["messages"]}
    assert held_seqs, "replica A handed out nothing to hold"
    with ledger.lock:
        ledger.deliveries.extend((s, 1) for s in held_seqs)
    dead.add(a.url)
    a.child.kill()
    killed_at = len(ledger.acked)

    for t in threads[:SENDERS]:
        t.join(DEADLINE_S)
    while time.monotonic() < deadline:
        with ledger.lock:
            if ledger.confirmed <= ledger.acked:
                break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(30)

    lost = ledger.confirmed - ledger.acked
    delivered = [s for s, _ in ledger.deliveries]
    duplicates = len(delivered) - len(set(delivered))
    redelivered = {s for s, attempt in ledger.deliveries if attempt > 1}
    print(
        f"ledger: sent={len(ledger.confirmed)} acked={len(ledger.acked)} lost={len(lost)} "
        f"deliveries={len(delivered)} duplicates={duplicates} redelivered={len(redelivered)} "
        f"killed_after={killed_at} acks send_errors={ledger.send_errors} "
        f"receive_errors={ledger.receive_errors} ack_errors={ledger.ack_errors}"
    )
    assert ledger.confirmed, "nothing was sent"
    assert len(ledger.attempted) == MESSAGES, "the senders did not finish in time"
    if lost:
        with b.client() as c:
            status = c.get("/v1/status").text
        tail = "\n".join(b.child.lines[-60:])
        # The first line is what a CI summary shows: where the lost messages are goes in it.
        where = _whereabouts(broker, load_topics, lost).replace("\n", " | ")
        raise AssertionError(
            f"{len(lost)} confirmed messages never acked: {sorted(lost)[:20]}; where: {where}; "
            f"replica B: {status}\n{tail}"
        )
    assert set(delivered) <= ledger.attempted, "a message nobody sent"
    assert held_seqs <= ledger.acked and held_seqs <= redelivered, "held by the dead replica"
    assert b.child.proc.poll() is None, "the surviving replica died"


def _whereabouts(broker: Broker, topics: Topics, lost: set[int]) -> str:
    """For a failure message: where each lost message's copies are and their markers."""
    records = read_records(broker.bootstrap_servers, topics.queue)
    records += read_records(broker.bootstrap_servers, topics.retry)
    copies: dict[str, list[str]] = {}
    for r in records:
        if r.value.isdigit() and int(r.value) in lost:
            message_id, attempt, _ = parse_queue_headers(r.headers)
            copies.setdefault(message_id or "", []).append(
                f"seq {int(r.value)} {r.topic}/{r.partition}@{r.offset} attempt {attempt}"
            )
    markers: dict[str, list[str]] = {}
    for m in read_markers(broker.bootstrap_servers, topics):
        if m.message_id in copies:
            markers.setdefault(m.message_id, []).append(f"{m.type.name}@{m.attempt}")
    found = {int(r.value) for r in records if r.value.isdigit()}
    nowhere = [f"seq {s}: no record on either topic" for s in sorted(lost - found)[:10]]
    return "\n".join([f"{mid}: {where}; markers {markers.get(mid, [])}"
                       for mid, where in sorted(copies.items())[:10]] + nowhere)  # fmt: skip
