"""Credentials never appear in anything compactor prints, logs or stores, --verbose included."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.daemon import DaemonProcess
from support.deletes import commit_delete_files, write_position_delete_file
from support.s3_tables import TABLE, make_table
from support.tables import live_data_files

if TYPE_CHECKING:
    from support.s3_server import S3Bucket

pytest_plugins = ("support.s3_server",)

COMPACTOR = Path(sys.executable).parent / "compactor"
ACCESS_KEY_ID = "AKIACOMPACTORTEST7Q2Z"
SECRET = "cmp/Secret+Key-9f8e7d6c5b4a3f2e1d0c"
PASSWORD = "pg-pass-4c1d"


def test_a_catalog_that_cannot_load_names_the_missing_driver_and_not_its_password(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PYICEBERG_HOME": str(tmp_path),
        "PYICEBERG_CATALOG__PG__TYPE": "sql",
        "PYICEBERG_CATALOG__PG__URI": f"postgresql+pg8000://user:{PASSWORD}@127.0.0.1:9/db",
    }
    process = subprocess.run(
        [str(COMPACTOR), "--verbose", "inspect", "--catalog", "pg", "--table", "db.t"],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert process.returncode == 2, process.stderr
    last = process.stderr.strip().splitlines()[-1]
    assert "needs the Python module 'pg8000', which is not installed" in last
    assert PASSWORD not in process.stdout + process.stderr


def test_s3_runs_print_log_and_store_no_credential(
    s3: S3Bucket, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """run, expire and orphans with --verbose (botocore debug logs) and --json, on moto's S3."""
    catalog, table = make_table(s3)
    properties = {
        "type": "sql",
        "uri": s3.catalog_uri,
        "warehouse": s3.warehouse,
        **s3.properties(),
        "s3.access-key-id": ACCESS_KEY_ID,
        "s3.secret-access-key": SECRET,
    }
    prefix = f"PYICEBERG_CATALOG__{s3.catalog_name.upper()}__"
    for key, value in properties.items():
        monkeypatch.setenv(prefix + key.upper().replace(".", "__").replace("-", "_"), value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    mark = s3.log.mark()
    outputs = []
    for args in (
        ("run", "--target-file-size", "1MiB", "--allow-small-target", "--min-input-files", "2"),
        ("expire", "--older-than", "0s"),
        ("orphans", "--dry-run"),
    ):
        process = subprocess.run(
            [str(COMPACTOR), "--verbose", *args, "--catalog", s3.catalog_name, "--table", TABLE]
            + ["--json"],
            cwd=tmp_path,
            env=dict(os.environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert process.returncode == 0, process.stderr[-3000:]
        outputs.append(process.stdout + process.stderr)
    everything = "\n".join(outputs)
    # The debug logs were there, and signed requests with our key id reached the server.
    assert "botocore" in everything and "Authorization" in everything
    assert any(r.access_key == ACCESS_KEY_ID for r in s3.requests_since(mark))
    stored = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    for key in s3.objects(catalog.load_table(TABLE).location()):
        stored.append(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    for secret in (ACCESS_KEY_ID, SECRET):
        assert secret not in everything
        assert not [blob for blob in stored if secret.encode() in blob]


@pytest.mark.slow
def test_the_daemon_on_s3_logs_measures_and_stores_no_credential(
    s3: S3Bucket, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A --verbose daemon compacting and rewriting delete files: its log lines (botocore's
    debug lines included), /metrics and its state file hold no credential."""
    catalog, table = make_table(s3)
    files = sorted(live_data_files(table).values(), key=lambda f: f.file_path)
    same = [f for f in files if f.partition == files[0].partition]
    commit_delete_files(table, [write_position_delete_file(table, {f: [0]}) for f in same[:2]])
    prefix = f"PYICEBERG_CATALOG__{s3.catalog_name.upper()}__"
    properties = {
        "type": "sql",
        "uri": s3.catalog_uri,
        "warehouse": s3.warehouse,
        **s3.properties(),
        "s3.access-key-id": ACCESS_KEY_ID,
        "s3.secret-access-key": SECRET,
    }
    for key, value in properties.items():
        monkeypatch.setenv(prefix + key.upper().replace(".", "__").replace("-", "_"), value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "all.toml").write_text(
        'tables = ["db.*"]\n\n[compact]\nevery = "1s"\nmin_small_files = 2\n'
        'min_input_files = 2\ntarget_file_size = "1MiB"\nallow_small_target = true\n'
        'cooldown = "1h"\n\n[rewrite_deletes]\nevery = "1s"\nmin_position_delete_files = 2\n'
    )
    (tmp_path / "compactor.toml").write_text(
        f'[daemon]\ncatalog = "{s3.catalog_name}"\nstate = "state.db"\n'
        'listen = "127.0.0.1:0"\nlog_format = "json"\n'
    )
    command = [str(COMPACTOR), "--verbose", "daemon", "--config", "compactor.toml"]
    daemon = DaemonProcess(command, dict(os.environ), tmp_path)
    try:
        finished: set[str] = set()
        while len(finished) < 2:  # both are due at the first tick: either may run first
            event = daemon.wait_for(
                lambda e: (
                    e.get("event") == "run_finished"
                    and (e["action"] == "rewrite_deletes" or bool(e["snapshot_ids"]))
                ),
                "a committed compaction and a delete rewrite",
            )
            finished.add(event["action"])
        with urllib.request.urlopen(f"{daemon.url}/metrics", timeout=30) as response:
            metrics = response.read().decode()
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    logged = "".join(daemon.lines)
    assert "botocore" in logged and "Authorization" in logged  # the debug lines were there
    assert 'compactor_runs_total{action="rewrite_deletes"' in metrics
    state = (tmp_path / "state.db").read_bytes()
    for secret in (ACCESS_KEY_ID, SECRET):
        assert secret not in logged and secret not in metrics
        assert secret.encode() not in state
