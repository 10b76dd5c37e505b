"""Progress lines while the audit runs: one per step, plus Spark task counts in between."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from pyspark import SparkContext


class Progress:
    """``with progress.step("reading"):`` prints the step, its Spark tasks as they finish
    (at most every ``interval_s``), and its duration. ``say`` gets each line."""

    def __init__(
        self,
        sc: SparkContext,
        say: Callable[[str], None],
        total_steps: int,
        interval_s: float = 2.0,
    ) -> None:
        self._tracker = sc.statusTracker()
        self._say = say
        self._total = total_steps
        self._interval_s = interval_s
        self._n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.timings: dict[str, float] = {}

    @contextmanager
    def step(self, name: str, key: str | None = None) -> Iterator[None]:
        self._n += 1
        self._say(f"[{self._n}/{self._total}] {name} ...")
        start = time.monotonic()
        yield
        elapsed = time.monotonic() - start
        self.timings[key or name] = elapsed
        self._say(f"[{self._n}/{self._total}] {name}: done in {elapsed:.1f} s")

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._watch, name="kmq-audit-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        last = ""
        while not self._stop.wait(self._interval_s):
            done = total = 0
            for stage_id in self._tracker.getActiveStageIds():
                info = self._tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            line = f"      spark tasks: {done}/{total} done" if total else ""
            if line and line != last:
                self._say(line)
            last = line
