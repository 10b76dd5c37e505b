"""kmq: per-message acknowledgement, leases, redelivery and dead letters on Apache Kafka."""

from kmq.config import ConsumerConfig, ServiceConfig
from kmq.consumer import Consumer
from kmq.errors import (
    BrokerError,
    ConfigError,
    ConsumerClosedError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidQueueError,
    KmqError,
    MarkerDecodeError,
    MessageStateError,
    MessageTooLargeError,
    SendFailedError,
)
from kmq.kafka_clients import KafkaSecurity
from kmq.message import Message
from kmq.policy import RetryPolicy
from kmq.producer import Producer
from kmq.receipts import Receipt, Settler
from kmq.service import Queue, Service

__version__ = "0.1.0"

__all__ = [
    "BrokerError",
    "ConfigError",
    "Consumer",
    "ConsumerClosedError",
    "ConsumerConfig",
    "InvalidArgumentError",
    "InvalidMessageError",
    "InvalidQueueError",
    "KafkaSecurity",
    "KmqError",
    "MarkerDecodeError",
    "Message",
    "MessageStateError",
    "MessageTooLargeError",
    "Producer",
    "Queue",
    "Receipt",
    "RetryPolicy",
    "SendFailedError",
    "Service",
    "ServiceConfig",
    "Settler",
]
