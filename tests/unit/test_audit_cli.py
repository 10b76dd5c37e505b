"""The `kmq audit` command line, up to the point where it would start Spark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from kmq.cli import main


def test_kmq_and_its_cli_do_not_import_spark() -> None:
    code = (
        "import sys, kmq, kmq.cli; "
        "print(sorted(m for m in ('pyspark', 'pyarrow', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(main, ["audit", "--help"])
    assert result.exit_code == 0
    for option in ("--output", "--master", "--check [none|no-loss|settled]", "--queue", "--conf"):
        assert option in result.output


def test_bad_key_value_options_fail_before_spark_starts(tmp_path: Path) -> None:
    args = ["audit", "--bootstrap-servers", "127.0.0.1:9", "-o", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--kafka", "no-equals-sign"])
    assert result.exit_code == 2
    assert "'no-equals-sign' is not KEY=VALUE" in result.output
    assert "starting Spark" not in result.output
    assert not any(tmp_path.iterdir())


def test_output_and_servers_are_required() -> None:
    result = CliRunner().invoke(main, ["audit"], env={"KMQ_BOOTSTRAP_SERVERS": ""})
    assert result.exit_code == 2
    assert "Missing option" in result.output
