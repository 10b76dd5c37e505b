"""``python -m bench [--quick] [--bootstrap-servers HOST:PORT] [--only SECTION ...]``"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from bench import (
    backlog,
    e2e,
    latency,
    producer,
    profile,
    proxy,
    redelivery,
    report,
    tracker_core,
    transactional,
)
from bench.common import JSON, Context, code_fingerprint, hardware

SECTIONS: dict[str, Callable[[Context], JSON]] = {
    "e2e": e2e.run,
    "latency": latency.run,
    "redelivery": redelivery.run,
    "tracker_core": tracker_core.run,
    "producer": producer.run,
    "transactional": transactional.run,
    "backlog": backlog.run,
    "proxy": proxy.run,
    "profile": profile.run,
}
DEFAULT_SECTIONS = [
    "e2e",
    "latency",
    "redelivery",
    "tracker_core",
    "producer",
    "transactional",
    "backlog",
    "proxy",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="kmq beside raw Kafka, on the same broker."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small counts, under 2 minutes (no profile)",
    )
    parser.add_argument(
        "--bootstrap-servers",
        help="use this Kafka instead of starting the embedded Tansu broker",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        help="consumer-group session timeout (default 2000 embedded, 6000 external)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(SECTIONS),
        help="run only this section (repeatable); default: all but profile in --quick",
    )
    parser.add_argument(
        "--name",
        help="results go to bench/results/<name>.{json,md} (default: quick or full)",
    )
    parser.add_argument(
        "--profile-queues", type=int, default=1, help="logical queues of the profile runs"
    )
    parser.add_argument(
        "--profile-messages",
        type=int,
        default=0,
        help="messages of the profile runs (default 15,000 with --quick, else 40,000)",
    )
    parser.add_argument("--keep-work-dir", action="store_true", help="keep child logs")
    return parser.parse_args(argv)


def _has_py_spy() -> bool:
    return bool(shutil.which("py-spy") or Path(sys.executable).with_name("py-spy").exists())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    name = args.name or ("quick" if args.quick else "full")
    if args.only:
        sections = list(dict.fromkeys(args.only))
    else:
        sections = list(DEFAULT_SECTIONS)
        if not args.quick and _has_py_spy():
            sections.append("profile")
    work_dir = Path(tempfile.mkdtemp(prefix="kmq-bench-"))
    started = time.monotonic()
    results: JSON = {
        "name": name,
        "mode": "quick" if args.quick else "full",
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "hardware": hardware(),
        "loadavg_start": os.getloadavg(),
        "code": {"start": code_fingerprint()},
        "sections": {},
        "errors": {},
    }
    failed = False
    with ExitStack() as stack:
        if args.bootstrap_servers:
            bootstrap, broker = (
                args.bootstrap_servers,
                f"external Kafka at {args.bootstrap_servers}",
            )
            session_ms = args.session_timeout_ms or 6000
            broker_pid: int | None = None
        else:
            from kmq.dev.embedded import EmbeddedBroker

            embedded = stack.enter_context(EmbeddedBroker(log_path=work_dir / "tansu.log"))
            bootstrap, broker = (
                embedded.bootstrap_servers,
                "embedded Tansu 0.6 (in memory)",
            )
            session_ms = args.session_timeout_ms or 2000
            broker_pid = embedded.process.pid if embedded.process else None
        ctx = Context(
            bootstrap_servers=bootstrap,
            session_timeout_ms=session_ms,
            quick=args.quick,
            broker=broker,
            work_dir=work_dir,
            broker_pid=broker_pid,
            profile_queues=args.profile_queues,
            profile_messages=args.profile_messages,
        )
        ctx.results = results["sections"]
        results["broker"] = broker
        ctx.say(f"{name}: sections {', '.join(sections)} on {broker} ({bootstrap})")
        for section in sections:
            t0 = time.monotonic()
            try:
                results["sections"][section] = SECTIONS[section](ctx)
            except Exception as exc:
                failed = True
                traceback.print_exc()
                results["errors"][section] = repr(exc)
                ctx.say(f"section {section} failed: {exc!r}")
            ctx.say(f"section {section}: {time.monotonic() - t0:.0f} s")
    results["seconds"] = time.monotonic() - started
    results["loadavg_end"] = os.getloadavg()
    results["code"]["end"] = code_fingerprint()
    results["code"]["changed_during_run"] = results["code"]["start"] != results["code"]["end"]
    if "profile" in results["sections"]:
        profile.keep_profiles(name, results["sections"]["profile"], report.RESULTS_DIR)
    json_path, md_path = report.write(results, name)
    print()
    print(md_path.read_text())
    print(f"results: {json_path} and {md_path} ({results['seconds']:.0f} s)")
    if failed or args.keep_work_dir:
        print(f"child logs: {work_dir}")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
