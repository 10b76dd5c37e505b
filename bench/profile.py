"""Optional section: py-spy profiles of the consumer process (kmq and raw) and the tracker
during a single-queue end-to-end run, reduced to the top costs.

py-spy's raw output is one collapsed stack per line: ``thread (tid): name;frame;... count``
with frames written ``function (file:line)``.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from bench.common import JSON, Context
from bench.pipeline import Run, run_pipeline

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::\d+)?\)$")
_SITE = re.compile(r"/(?:site-packages|lib/python3\.\d+)/")


def _frame_name(frame: str) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = _SITE.split(match["file"])[-1]
    return f"{match['func']} ({path})"


def _is_idle(func: str) -> bool:
    return any(
        needle in func
        for needle in (
            "select (selectors.py",
            "Condition.wait",
            "Event.wait",
            "poll (selectors.py",
        )
    )


def summarize_stacks(path: Path, top: int = 15) -> JSON:
    """Per thread, and overall: samples, top functions by self time and by inclusive time."""
    threads: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    kmq_inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        head, _, frames_text = stack.partition(";")
        thread = head.split(": ", 1)[-1]
        frames = [_frame_name(f) for f in frames_text.split(";") if f]
        if not frames:
            continue
        total += count
        threads[re.sub(r"\d+$", "N", thread)] += count
        self_time[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
            if name.split(" (", 1)[-1].startswith(("kmq/", "tracker/")):
                kmq_inclusive[name] += count

    def share(counter: Counter[str]) -> list[JSON]:
        return [
            {"function": name, "samples": n, "share": n / total}
            for name, n in counter.most_common(top)
        ]

    return {
        "samples": total,
        "threads": share(threads),
        "self": share(self_time),
        "inclusive": share(inclusive),
        "kmq_inclusive": share(kmq_inclusive),
        "idle_self_share": sum(n for f, n in self_time.items() if _is_idle(f)) / total
        if total
        else 0.0,
    }


def run(ctx: Context) -> JSON:
    count = ctx.profile_messages or (15_000 if ctx.quick else 40_000)
    queues = ctx.profile_queues
    sampler = "py-spy record --rate 500 --nonblocking --threads --gil"
    results: JSON = {"settings": {"sampler": sampler, "queues": queues, "messages": count}}
    for side in ("kmq", "raw"):
        stem = f"profile-{side}"
        ctx.say(f"profile: {side} e2e, {queues} queue(s), {count:,} messages, py-spy on each")
        result = run_pipeline(ctx, Run(side=side, queues=queues, count=count, profile=stem))
        results[side] = {
            "acked_per_s": result["acked_per_s"],
            "cpu_us_per_msg": result["cpu_us_per_msg"],
            "files": result.get("profiles"),
        }
        for file in result.get("profiles", []):
            path = Path(file)
            role = next(
                (r for r in ("tracker", "producer") if path.stem.endswith(f"-{r}")), "consumer"
            )
            results[side][role] = summarize_stacks(path)
    return results


def _merge_lines(src: Path, dest: Path) -> None:
    """Collapsed stacks without line numbers or thread ids: far smaller, same picture."""
    merged: Counter[str] = Counter()
    for line in src.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            stack = re.sub(r":\d+\)", ")", stack)
            stack = re.sub(r"^thread \(\d+\): ", "", stack)
            merged[stack] += int(count)
    dest.write_text("".join(f"{s} {n}\n" for s, n in merged.most_common()))


def keep_profiles(name: str, results: JSON, dest: Path) -> None:
    """Copy the collapsed stacks next to the results (speedscope opens them) and point the
    results at the copies."""
    dest.mkdir(parents=True, exist_ok=True)
    for side in ("kmq", "raw"):
        kept: list[str] = []
        for file in results.get(side, {}).get("files") or []:
            src = Path(file)
            if src.exists():
                target = dest / f"{name}-{src.name}"
                _merge_lines(src, target)
                kept.append(str(target.relative_to(dest.parent.parent)))
        if side in results:
            results[side]["files"] = kept

