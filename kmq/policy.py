"""Per-queue retry policy: how many attempts, how long to back off, where dead letters go."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kmq.config import MAX_REDELIVERY_TIMEOUT_S, check_positive_int, check_seconds
from kmq.errors import ConfigError

DEAD_LETTER_SUFFIX = ".dlq"


@dataclass(frozen=True)
class RetryPolicy:
    """Set per queue with ``svc.queue(id, policy=RetryPolicy(...))``.

    A message that would be delivered for attempt ``max_attempts + 1`` goes to the dead-letter
    queue instead (``0`` means never). ``nack()`` without a delay waits a random time in
    ``[backoff_min_s, min(backoff_max_s, backoff_min_s * backoff_multiplier ** (attempt - 1))]``
    (exponential backoff with full jitter above the minimum).
    """

    max_attempts: int = 5
    backoff_min_s: float = 0.5
    backoff_max_s: float = 60.0
    backoff_multiplier: float = 2.0
    dead_letter_queue: str | None = None
    """Defaults to ``<queue>.dlq`` on the same topics."""

    def __post_init__(self) -> None:
        check_positive_int(self.max_attempts, "max_attempts", minimum=0)
        if self.max_attempts > 1_000_000:
            raise ConfigError(f"max_attempts must be <= 1000000, got {self.max_attempts}")
        check_seconds(self.backoff_min_s, "backoff_min_s")
        check_seconds(self.backoff_max_s, "backoff_max_s")
        if self.backoff_max_s < self.backoff_min_s:
            raise ConfigError("backoff_max_s must be >= backoff_min_s")
        m = self.backoff_multiplier
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 1.0 <= m <= 100.0:
            raise ConfigError(f"backoff_multiplier must be within [1, 100], got {m!r}")
        if self.dead_letter_queue is not None:
            from kmq.validation import check_queue_id

            check_queue_id(self.dead_letter_queue)

    def backoff_s(self, attempt: int, rand: Callable[[], float]) -> float:
        """Delay before redelivering a message nacked on ``attempt``; ``rand()`` is in [0, 1)."""
        exponent = min(max(attempt, 1) - 1, 64)
        ceiling = min(self.backoff_max_s, self.backoff_min_s * self.backoff_multiplier**exponent)
        delay = self.backoff_min_s + rand() * (ceiling - self.backoff_min_s)
        return min(max(delay, 0.0), MAX_REDELIVERY_TIMEOUT_S)

    def dead_letter_queue_for(self, queue: str) -> str:
        return self.dead_letter_queue or queue + DEAD_LETTER_SUFFIX
