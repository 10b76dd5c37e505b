"""What a consumer reads, announced on its marker records (header ``kmq.reads``), so the
tracker can send a copy to a retry-lane partition that someone reads right now.

The value is the queue id, a space (queue ids hold no whitespace), then the retry-topic
partitions the consumer reads, comma-separated, ascending: ``b"orders 3,4"``. Trackers of
earlier releases ignore the header. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection

READS_HEADER = "kmq.reads"
MAX_PARTITIONS = 1024
"""At most this many partitions are announced (a retry window is no wider)."""


def encode_reads(queue: str, partitions: Collection[int]) -> bytes:
    listed = sorted(partitions)[:MAX_PARTITIONS]
    return f"{queue} {','.join(map(str, listed))}".encode()


def decode_reads(value: bytes | None) -> tuple[str, frozenset[int]] | None:
    """``(queue, partitions)``, or ``None`` for anything malformed (never raises)."""
    if not value:
        return None
    try:
        queue, _, listed = value.decode().partition(" ")
        if not queue or not listed:
            return None
        partitions = frozenset(int(p) for p in listed.split(",")[:MAX_PARTITIONS])
    except (UnicodeDecodeError, ValueError):
        return None
    if any(p < 0 for p in partitions):
        return None
    return queue, partitions
