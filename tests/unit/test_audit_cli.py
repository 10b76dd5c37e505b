"""The `kmq audit` command line, up to the point where it would start Spark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
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


def test_follow_builds_its_config_from_the_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kmq.audit.follow as follow
    import kmq.spark.session as session

    seen: dict[str, Any] = {}
    monkeypatch.setattr(session, "get_session", lambda *a, **k: seen.setdefault("spark", object()))
    monkeypatch.setattr(follow, "run_follow", lambda spark, config, say: seen.update(config=config))
    args = ["audit", "--bootstrap-servers", "127.0.0.1:9", "-o", str(tmp_path), "--follow",
            "--trigger-s", "2", "--stuck-leases", "4", "--pending-bound-s", "30",
            "--prometheus", str(tmp_path / "kmq.prom"),
            "--kafka", "security_protocol=SSL"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert (config.trigger_s, config.stuck_leases, config.pending_bound_s) == (2.0, 4.0, 30.0)
    assert config.prometheus == tmp_path / "kmq.prom"
    assert config.checkpoint_dir == tmp_path / "checkpoint"
    assert config.kafka == {"security_protocol": "SSL"}
    assert config.limits().pending_bound_ms == 30_000
