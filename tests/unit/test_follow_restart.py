"""``kmq audit --follow`` starts a failed streaming query again from its checkpoint, and gives
up only after ``max_restarts`` failures in a row (no Spark: scripted queries)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from kmq.audit import follow
from kmq.audit.follow import FollowConfig, FollowError


class Clock(threading.Event):
    """A stop event whose waits return at once and are recorded (no real sleeping)."""

    def __init__(self, stop_after_waits: int | None = None) -> None:
        super().__init__()
        self.waits: list[float] = []
        self._stop_after = stop_after_waits

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        if self._stop_after is not None and len(self.waits) >= self._stop_after:
            self.set()
        return self.is_set()


class Query:
    """Fails at its first look when ``error`` is given; else stays healthy."""

    def __init__(self, error: str | None, on_look: Any = None) -> None:
        self.error = error
        self.stopped = False
        self.on_look = on_look

    def exception(self) -> str | None:
        if self.on_look is not None:
            self.on_look()
        return self.error

    @property
    def isActive(self) -> bool:
        return self.error is None

    def stop(self) -> None:
        self.stopped = True


def run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, queries: list[Query], stop: Clock,
    max_restarts: int = 2,
) -> tuple[list[Query], list[str]]:  # fmt: skip
    started: list[Query] = []
    said: list[str] = []

    def start(spark: Any, config: FollowConfig, follower: Any) -> Query:
        query = queries[len(started)]
        started.append(query)
        return query

    monkeypatch.setattr(follow, "_start_query", start)
    monkeypatch.setattr(follow.Follower, "refresh", lambda self: None)
    config = FollowConfig(
        bootstrap_servers="127.0.0.1:1", output=tmp_path, trigger_s=0.5, max_restarts=max_restarts
    )
    follow.run_follow(None, config, said.append, stop)  # type: ignore[arg-type]
    return started, said


def test_a_failed_query_is_started_again_from_its_checkpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    queries = [Query("Python worker failed to connect back."), Query(None)]
    clock = Clock(stop_after_waits=4)
    started, said = run(monkeypatch, tmp_path, queries, clock)
    assert started == queries and all(q.stopped for q in queries)
    assert clock.waits[:2] == [0.5, 1.0], "a look at the query, then the first restart waits 1 s"
    assert any("starting it again from its checkpoint" in line for line in said)


def test_failures_in_a_row_back_off_and_then_give_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    queries = [Query(f"boom {i}") for i in range(3)]
    clock = Clock()
    with pytest.raises(FollowError, match="boom 2"):
        run(monkeypatch, tmp_path, queries, clock, max_restarts=2)
    backoffs = [w for w in clock.waits if w >= 1.0]
    assert backoffs == [1.0, 2.0]


def test_a_completed_batch_resets_the_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    follower_states: list[Any] = []

    def progress() -> None:  # a batch completes while this query runs, then it fails
        follower_states[0].batch_id += 1

    original_init = follow.Follower.__init__

    def init(self: Any, config: FollowConfig, say: Any) -> None:
        original_init(self, config, say)
        follower_states.append(self.state)

    monkeypatch.setattr(follow.Follower, "__init__", init)
    queries = [Query("a", progress), Query("b", progress), Query("c", progress), Query(None)]
    clock = Clock(stop_after_waits=8)
    started, _ = run(monkeypatch, tmp_path, queries, clock, max_restarts=1)
    assert started == queries, "three failures, but never two in a row without progress"
    assert [w for w in clock.waits if w >= 1.0] == [1.0, 1.0, 1.0]


def test_summary_json_is_written_after_the_report_and_the_metrics(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A reader that sees a refresh in summary.json finds it in the other outputs too."""
    written: list[str] = []
    monkeypatch.setattr(follow, "write_atomically", lambda path, text: written.append(path.name))
    config = FollowConfig(
        bootstrap_servers="127.0.0.1:1", output=tmp_path, prometheus=tmp_path / "kmq.prom"
    )
    follow.Follower(config, lambda _: None).refresh()
    assert written == ["kmq.prom", "report.html", "summary.json"]
