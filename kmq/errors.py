"""The kmq exception hierarchy: everything kmq raises derives from :class:`KmqError`."""

from __future__ import annotations


class KmqError(Exception):
    """Root of every error kmq raises."""


class ConfigError(KmqError, ValueError):
    """A configuration value is missing, of the wrong type, or out of range."""


class InvalidQueueError(KmqError, ValueError):
    """A queue id is empty, too long, or contains characters kmq does not allow."""


class InvalidMessageError(KmqError, ValueError):
    """A payload or header set cannot be sent (wrong type, reserved name, too large)."""


class MessageTooLargeError(InvalidMessageError):
    """The payload would make a queue record over the broker's record size limit."""


class MessageStateError(KmqError):
    """A message was acked or nacked after it was already settled (acked, nacked or released)."""


class ConsumerClosedError(KmqError):
    """The consumer has been closed, or its background loop failed."""


class MarkerDecodeError(KmqError, ValueError):
    """Bytes read from the markers topic are not a valid kmq marker."""


class BrokerError(KmqError):
    """The Kafka broker rejected a request or could not be reached in time."""


class SendFailedError(BrokerError):
    """Messages sent with ``wait=False`` that never reached the broker (raised by
    ``Producer.flush()``). ``failed`` maps each message id to its cause."""

    def __init__(self, queue: str, failed: dict[str, BaseException]) -> None:
        self.failed = failed
        first = next(iter(failed.values()))
        super().__init__(
            f"{len(failed)} message(s) sent to queue {queue!r} with wait=False did not reach "
            f"the broker (first cause: {first!r}); they are not in the queue"
        )


class InvalidArgumentError(KmqError, ValueError):
    """An argument to a kmq call is out of range (a negative delay, say)."""
