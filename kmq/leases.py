"""The consumer's pure core: its messages from START to settle, and the batch cycle.

No I/O and no clocks: the consumer adapter (:mod:`kmq.consumer`) feeds events and ``now``
and carries out what comes back. Tested without a broker in ``tests/unit/test_leases.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
P = TypeVar("P", bound=Hashable)


class Leases(Generic[K, T]):
    """Every message a consumer has STARTed and not settled, in keep-alive order.

    A message's first KEEPALIVE is due ``keepalive_s`` after it was started, each next one
    ``keepalive_s`` after the previous: started messages join at the back, a message that
    gets its KEEPALIVE moves to the back, so the due ones are always at the front.
    """

    def __init__(self, keepalive_s: float) -> None:
        self.keepalive_s = keepalive_s
        self._items: OrderedDict[K, tuple[float, T]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[T]:
        return (item for _, item in self._items.values())

    def started(self, items: Sequence[tuple[K, T]], now: float) -> None:
        due = now + self.keepalive_s
        for key, item in items:
            self._items[key] = (due, item)
            self._items.move_to_end(key)  # a key started again must not keep its old place

    def settle(self, key: K) -> T | None:
        entry = self._items.pop(key, None)
        return None if entry is None else entry[1]

    def due(self, now: float) -> list[T]:
        """Messages whose KEEPALIVE is due; each is rescheduled ``keepalive_s`` from now."""
        out: list[T] = []
        items = self._items
        nxt = now + self.keepalive_s
        while items:
            key = next(iter(items))
            at, item = items[key]
            if at > now:
                break
            out.append(item)
            items[key] = (nxt, item)
            items.move_to_end(key)
        return out

    def take_all(self) -> list[T]:
        out = [item for _, item in self._items.values()]
        self._items.clear()
        return out


@dataclass(eq=False)
class Batch(Generic[P, T]):
    """One polled batch: its messages and, per partition, its first offset (to read it
    again) and the offset to commit."""

    messages: list[T]
    firsts: dict[P, int]
    commits: dict[P, int]
    started: bool = False
    committing: bool = False


@dataclass
class Actions(Generic[P, T]):
    commit: list[Batch[P, T]] = field(default_factory=list)
    """Commit these batches' offsets, in this order (their STARTs are on the broker)."""
    hand_out: list[T] = field(default_factory=list)
    """Give these messages to the application."""
    seek: dict[P, int] = field(default_factory=dict)
    """Read these partitions again from these offsets."""
    dropped: list[T] = field(default_factory=list)
    """Forget these messages: never handed out, read again after the seek."""


class BatchCycle(Generic[P, T]):
    """Polled batches on their way out, in order. The safety order holds per batch: its
    START markers are on the broker, then its offsets are committed, then its messages are
    handed out. Batches overlap: the next batch's STARTs go out while a commit is in
    flight. Commits are issued in poll order, so a later batch's offsets never land before
    an earlier one's.
    """

    def __init__(self) -> None:
        self._batches: list[Batch[P, T]] = []

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def messages(self) -> int:
        return sum(len(b.messages) for b in self._batches)

    def add(self, batch: Batch[P, T]) -> None:
        self._batches.append(batch)

    def batches(self) -> list[Batch[P, T]]:
        return list(self._batches)

    def started(self, batch: Batch[P, T], ok: bool) -> Actions[P, T]:
        """``batch``'s STARTs were acknowledged (``ok``) or refused."""
        actions: Actions[P, T] = Actions()
        if batch not in self._batches:
            return actions
        if not ok:
            # Nothing of it was handed out or committed: read it again. Later batches
            # were read past it, so they are read again too (their STARTs, if they landed,
            # become duplicates the tracker folds into one lease).
            i = self._batches.index(batch)
            failed = [b for b in self._batches[i:] if not b.committing]
            for b in failed:
                self._batches.remove(b)
                actions.dropped.extend(b.messages)
                for p, offset in b.firsts.items():
                    actions.seek[p] = min(offset, actions.seek.get(p, offset))
            return actions
        batch.started = True
        for b in self._batches:
            if b.committing:
                continue
            if not b.started:
                break
            b.committing = True
            actions.commit.append(b)
        return actions

    def committed(self, batch: Batch[P, T]) -> Actions[P, T]:
        """``batch``'s commit is over (landed or not: its STARTs are on the broker, so the
        worst a failed commit costs is a second START by the partition's next owner)."""
        actions: Actions[P, T] = Actions()
        if batch in self._batches:
            self._batches.remove(batch)
            actions.hand_out.extend(batch.messages)
        return actions
