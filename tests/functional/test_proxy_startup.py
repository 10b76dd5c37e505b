"""``kmq serve`` started before Kafka can be reached: one clear line, within the request
timeout it was given, and it keeps trying instead of dying."""

from __future__ import annotations

import time

from tests.functional.helpers import Children


def test_unreachable_kafka_is_said_within_the_request_timeout(children: Children) -> None:
    started = time.monotonic()
    proxy = children.python(
        "serve", "-m", "kmq.proxy",
        "--bootstrap-servers", "127.0.0.1:1",
        "--request-timeout-ms", "2000",
        "--port", "0",
        "--secret", "s" * 32,
        "--insecure-no-auth",
    )  # fmt: skip
    line = proxy.wait_for(r"127\.0\.0\.1:1.*retrying in", 25)[0]
    # The default 30 s request timeout would make the first line wait 30 s or more.
    assert time.monotonic() - started < 25
    assert "Traceback" not in "\n".join(proxy.lines), proxy.lines
    assert "127.0.0.1:1 is unreachable (Connection refused)" in line, line
    assert proxy.proc.poll() is None, "it gave up"
