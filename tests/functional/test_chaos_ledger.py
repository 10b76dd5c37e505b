"""The chaos ledger's broker reads, on a real broker: where read_committed readers stop."""

from __future__ import annotations

from kafka import KafkaProducer

from tests.chaos.ledger import committed_stops
from tests.functional.conftest import Broker, Topics


def test_committed_stops_names_only_a_partition_an_open_transaction_holds(
    broker: Broker, topics: Topics
) -> None:
    servers = broker.bootstrap_servers
    hanging = KafkaProducer(
        bootstrap_servers=servers,
        transactional_id=f"stops-{topics.markers}",
        transaction_timeout_ms=60_000,  # longer than the test: only the abort below ends it
    )
    plain = KafkaProducer(bootstrap_servers=servers)
    try:
        hanging.init_transactions()
        hanging.begin_transaction()
        held = hanging.send(topics.markers, b"never committed", partition=0).get(10).offset
        for partition in (0, 1):
            for _ in range(2):
                plain.send(topics.markers, b"after it", partition=partition).get(10)
        stops = committed_stops(servers, topics.markers, quiet_s=1.0, cap_s=30.0)
        assert stops == {0: (held, held + 3)}
        hanging.abort_transaction()
        assert committed_stops(servers, topics.markers, quiet_s=1.0, cap_s=30.0) == {}
    finally:
        hanging.close(timeout=1)
        plain.close(timeout=1)
