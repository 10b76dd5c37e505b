"""``python -m bench.run_length [--queues N] [--counts A,B,...] [--reps R]``: section 1's
end-to-end run at several message counts, raw and kmq interleaved on one embedded broker,
to see how much of a figure is the run's start and end rather than its steady state.

It is how the full run's counts were chosen (bench/README.md): at 16,000 messages over 16
queues raw kafka-python was done in about 0.3 s, and both sides' figures were mostly
their first and last batches.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import Context
from bench.pipeline import Run, run_pipeline


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run_length")
    parser.add_argument("--queues", type=int, default=16)
    parser.add_argument("--counts", default="16000,64000,160000")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    from kmq.dev.embedded import EmbeddedBroker

    work_dir = Path(tempfile.mkdtemp(prefix="kmq-bench-length-"))
    print(
        "| queues | messages | raw msgs/s (s) | kmq msgs/s (s) | kmq/raw "
        "| CPU µs/msg raw / kmq | CPU kmq/raw |"
    )
    print("|---|---|---|---|---|---|---|")
    with EmbeddedBroker(log_path=work_dir / "tansu.log") as broker:
        assert broker.process is not None
        ctx = Context(
            bootstrap_servers=broker.bootstrap_servers,
            session_timeout_ms=2000,
            quick=False,
            broker="embedded Tansu 0.6 (in memory)",
            work_dir=work_dir,
            broker_pid=broker.process.pid,
        )
        for _ in range(args.reps):
            for count in counts:
                raw = run_pipeline(ctx, Run(side="raw", queues=args.queues, count=count))
                kmq = run_pipeline(ctx, Run(side="kmq", queues=args.queues, count=count))
                raw_cpu = sum(raw["cpu_us_per_msg"].values())
                kmq_cpu = sum(kmq["cpu_us_per_msg"].values())
                print(
                    f"| {args.queues} | {count:,} "
                    f"| {raw['acked_per_s']:,.0f} ({raw['seconds']:.2f}) "
                    f"| {kmq['acked_per_s']:,.0f} ({kmq['seconds']:.2f}) "
                    f"| {kmq['acked_per_s'] / raw['acked_per_s']:.2f}x "
                    f"| {raw_cpu:.0f} / {kmq_cpu:.0f} | {kmq_cpu / raw_cpu:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
