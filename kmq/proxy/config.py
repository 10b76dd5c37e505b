"""The proxy's settings (everything but Kafka's, which live in :class:`kmq.ServiceConfig`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.errors import ConfigError
from kmq.policy import RetryPolicy
from kmq.proxy.auth import MAX_CLOCK_SKEW_S, AccessKey, QueuePatterns, TokenTable
from kmq.proxy.handles import MIN_SECRET_BYTES

MAX_RECEIVE = 100
MAX_WAIT_S = 20.0
MAX_BATCH = 100


@dataclass(frozen=True)
class ProxyConfig:
    """Settings of one ``kmq serve`` replica. Every replica of a deployment needs the same
    ``secrets`` (so that any of them can settle any handle) and, normally, the same
    credentials."""

    secrets: tuple[bytes, ...] = field(repr=False)
    """HMAC keys for receipt handles: the first signs, all verify (rotation)."""
    tokens: TokenTable | None = field(default=None, repr=False)
    """Bearer tokens of the native API; ``None`` refuses every native request (401)."""
    sqs_keys: Mapping[str, AccessKey] | None = field(default=None, repr=False)
    """SigV4 access keys of the SQS API; ``None`` refuses every SQS request (403)."""
    insecure_no_auth: bool = False
    """Development only: accept every request without credentials."""
    queues: QueuePatterns = field(default_factory=QueuePatterns)
    """The queues this proxy serves (empty: any valid queue id)."""
    max_body_bytes: int = 2 * 1024 * 1024
    default_visibility_s: float = 30.0
    handle_ttl_s: float = MAX_REDELIVERY_TIMEOUT_S
    """How long a receipt handle stays valid after the receive that made it; a lease can
    never be extended past it (SQS's 12 h rule)."""
    prefetch: int = 100
    """Each queue's consumer's ``max_in_flight``: messages a replica buffers, not yet handed out."""
    consumer_idle_s: float = 300.0
    """Close a queue's consumer after this long without receive requests."""
    threads: int = 64
    """Threads for blocking Kafka calls (sends, settles, hand-offs)."""
    public_url: str | None = None
    """Base of SQS queue URLs; default: the scheme and Host of each request."""
    account_id: str = "000000000000"
    region: str = "us-east-1"
    max_clock_skew_s: float = MAX_CLOCK_SKEW_S
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    counts_cache_s: float = 1.0
    """How long an approximate queue depth is reused before it is read again."""
    """Retry policy of the messages this proxy takes (travels in their START markers)."""

    def __post_init__(self) -> None:
        if not self.secrets or any(len(s) < MIN_SECRET_BYTES for s in self.secrets):
            raise ConfigError(
                f"a receipt-handle secret of at least {MIN_SECRET_BYTES} bytes is required "
                "(--secret or KMQ_PROXY_SECRET), the same on every replica"
            )
        if not (self.tokens or self.sqs_keys or self.insecure_no_auth):
            raise ConfigError(
                "no credentials: give --tokens-file/KMQ_PROXY_TOKENS and/or "
                "--sqs-credentials-file/KMQ_PROXY_SQS_CREDENTIALS (or, for development "
                "only, --insecure-no-auth)"
            )
        _int(self.max_body_bytes, "max_body_bytes", 1024)
        _int(self.prefetch, "prefetch", 1)
        _int(self.threads, "threads", 4)
        _seconds(self.default_visibility_s, "default_visibility_s", MAX_REDELIVERY_TIMEOUT_S)
        _seconds(self.handle_ttl_s, "handle_ttl_s", MAX_REDELIVERY_TIMEOUT_S)
        _seconds(self.consumer_idle_s, "consumer_idle_s", math.inf)
        _seconds(self.max_clock_skew_s, "max_clock_skew_s", 3600.0)
        if not 0 <= self.counts_cache_s <= 3600:
            raise ConfigError("counts_cache_s must be within [0, 3600]")
        if self.default_visibility_s > self.handle_ttl_s:
            raise ConfigError("default_visibility_s must not exceed handle_ttl_s")
        if not (self.account_id.isdigit() and len(self.account_id) == 12):
            raise ConfigError("account_id must be 12 digits")


def _int(value: object, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r}")


def _seconds(value: object, what: str, maximum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number of seconds, got {value!r}")
    if not 0 < value <= maximum:
        raise ConfigError(f"{what} must be > 0 and <= {maximum:g}, got {value!r}")
