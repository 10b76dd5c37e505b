"""Creating kmq's two topics when they are missing."""

from __future__ import annotations

import logging
import time

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from kmq.config import ServiceConfig
from kmq.errors import BrokerError

log = logging.getLogger(__name__)


def ensure_topics(config: ServiceConfig, *, timeout_s: float = 30.0) -> list[str]:
    """Create the queue, markers and control topics if absent; return the names it created.

    Existing topics are left as they are, whatever their partition count.
    """
    wanted = {
        config.queue_topic: config.queue_partitions,
        config.marker_topic: config.marker_partitions,
        config.control_topic: 1,
    }
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=config.bootstrap_servers,
            client_id=f"{config.client_id}-admin",
            request_timeout_ms=config.request_timeout_ms,
        )
    except KafkaError as exc:
        raise BrokerError(f"cannot reach Kafka at {config.bootstrap_servers}: {exc}") from exc
    created: list[str] = []
    try:
        existing = set(admin.list_topics())
        missing = [
            NewTopic(
                name,
                partitions,
                config.replication_factor,
                topic_configs={"cleanup.policy": "compact"} if name == config.control_topic else {},
            )
            for name, partitions in wanted.items()
            if name not in existing
        ]
        for topic in missing:
            try:
                admin.create_topics([topic])
                created.append(topic.name)
                log.info("created topic %s with %d partitions", topic.name, topic.num_partitions)
            except TopicAlreadyExistsError:
                pass
        deadline = time.monotonic() + timeout_s
        while created and not set(created) <= set(admin.list_topics()):
            if time.monotonic() > deadline:
                raise BrokerError(f"topics {created} were created but never became visible")
            time.sleep(0.05)
    except KafkaError as exc:
        raise BrokerError(f"creating topics failed: {exc}") from exc
    finally:
        admin.close()
    return created
