"""The run record beside a table: live runs make others back off; abandoned runs are cleaned up."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

import compactor
from compactor.bench.sample import create_events_table
from compactor.commit.inflight import (
    LeaseHeldError,
    RunLease,
    RunRecord,
    boot_id,
    pid_namespace,
    process_token,
    read_record,
    record_paths,
)

from support.cli import compactor as compactor_cli
from support.cli import embedded
from support.runs import run_compaction
from support.tables import live_data_files, local_path, unreferenced_files

TABLE = "db.events"


@pytest.fixture
def events(catalog: Catalog) -> Table:
    return create_events_table(catalog, TABLE, commits=4, rows_per_commit=240)


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _write_slot(table: Table, slot: int, payload: bytes) -> None:
    local_path(record_paths(table)[slot]).write_bytes(payload)


def _record(
    files: list[str],
    *,
    host: str | None = None,
    pid: int,
    expires_ms: int,
    seq: int = 1,
    process: str | None = None,
) -> RunRecord:
    """A record as a run in this PID namespace and boot writes it (unless told otherwise)."""
    return RunRecord(
        run_id="deadbeef0001",
        host=host or socket.gethostname(),
        pid=pid,
        started_ms=0,
        expires_ms=expires_ms,
        files=files,
        seq=seq,
        process=f"{boot_id()}:0" if process is None else process,
        pid_namespace=pid_namespace(),
    )


def _junk(table: Table, name: str) -> str:
    """An unreferenced file under the table's data directory, as a killed run leaves them."""
    path = local_path(table.metadata.location) / "data" / name
    path.write_bytes(b"half-written parquet")
    return f"{table.metadata.location}/data/{name}"


def test_live_run_makes_another_back_off(catalog: Catalog, events: Table) -> None:
    holder = RunLease(events, "holder", ttl_s=600)
    holder.acquire()
    try:
        snapshots = len(events.metadata.snapshots)
        with pytest.raises(LeaseHeldError, match="backing off"):
            run_compaction(catalog, TABLE)
        table = catalog.load_table(TABLE)
        assert len(table.metadata.snapshots) == snapshots
        assert unreferenced_files(table) == []
        assert read_record(table).run_id == "holder"
    finally:
        holder.release()
    result, table = run_compaction(catalog, TABLE)
    assert result.snapshot_ids
    assert read_record(table) is None


def test_the_library_returns_a_backed_off_result_while_a_live_run_holds_the_table(
    catalog: Catalog, events: Table
) -> None:
    """``compactor.compact`` and ``compactor.rewrite_deletes`` do nothing and say why, as the
    command line does, instead of raising."""
    holder = RunLease(events, "holder", ttl_s=600)
    holder.acquire()
    try:
        snapshots = len(events.metadata.snapshots)
        compacted = compactor.compact(
            events, target_file_size="1MiB", allow_small_target=True, min_input_files=2
        )
        rewritten = compactor.rewrite_deletes(events)
        table = catalog.load_table(TABLE)
        assert "run holder" in (compacted.backed_off or "")
        assert "run holder" in (rewritten.backed_off or "")
        assert compacted.plan.groups and not compacted.snapshot_ids
        assert rewritten.snapshot_id is None and rewritten.to_dict()["backed_off"]
        assert len(table.metadata.snapshots) == snapshots
        assert unreferenced_files(table) == []
        assert read_record(table).run_id == "holder"
    finally:
        holder.release()


def test_abandoned_run_files_are_removed_but_referenced_ones_kept(
    catalog: Catalog, events: Table
) -> None:
    junk = _junk(events, "compactor-deadbeef0001-g0000-00000-aaaa.parquet")
    committed = sorted(live_data_files(events))[0]
    record = _record([junk, committed], pid=_dead_pid(), expires_ms=int(time.time() * 1000) + 10**9)
    _write_slot(events, 1, json.dumps(asdict(record)).encode())

    result, table = run_compaction(catalog, TABLE)
    assert result.recovered_files == [junk]
    assert not local_path(junk).exists()
    assert result.snapshot_ids  # the run went on to compact
    assert unreferenced_files(table) == []
    assert read_record(table) is None
    assert not any(local_path(p).exists() for p in record_paths(table))


def test_torn_slot_falls_back_to_the_intact_one(catalog: Catalog, events: Table) -> None:
    first = _junk(events, "compactor-deadbeef0001-g0000-00000-bbbb.parquet")
    second = _junk(events, "compactor-deadbeef0001-g0000-00001-cccc.parquet")
    intact = _record([first], pid=_dead_pid(), expires_ms=0, seq=1)
    _write_slot(events, 1, json.dumps(asdict(intact)).encode())
    # The crash tore the next write (seq 2, which would also have listed ``second``, whose file
    # therefore was never created in a real run; here it exists to prove only listed files go).
    _write_slot(events, 0, b'{"run_id": "deadbeef0001", "files": ["')
    assert read_record(events).files == [first]

    result, _ = run_compaction(catalog, TABLE)
    assert result.recovered_files == [first]
    assert not local_path(first).exists()
    assert local_path(second).exists()


def test_expired_lease_of_another_host_is_taken_over(catalog: Catalog, events: Table) -> None:
    junk = _junk(events, "compactor-deadbeef0001-g0000-00000-dddd.parquet")
    expired = _record([junk], host="another-host", pid=1, expires_ms=int(time.time() * 1000) - 1)
    _write_slot(events, 1, json.dumps(asdict(expired)).encode())
    result, _ = run_compaction(catalog, TABLE)
    assert result.recovered_files == [junk]


def test_unexpired_lease_of_another_host_is_respected(catalog: Catalog, events: Table) -> None:
    junk = _junk(events, "compactor-deadbeef0001-g0000-00000-eeee.parquet")
    live = _record([junk], host="another-host", pid=1, expires_ms=int(time.time() * 1000) + 10**9)
    _write_slot(events, 1, json.dumps(asdict(live)).encode())
    with pytest.raises(LeaseHeldError, match="another-host"):
        run_compaction(catalog, TABLE)
    assert local_path(junk).exists()


def test_dry_run_ignores_the_lease(catalog: Catalog, events: Table, warehouse: Path) -> None:
    holder = RunLease(events, "holder", ttl_s=600)
    holder.acquire()
    try:
        result, _ = run_compaction(catalog, TABLE, dry_run=True)
        assert result.plan.groups
    finally:
        holder.release()


def test_a_reused_pid_does_not_keep_a_dead_run_live(catalog: Catalog, events: Table) -> None:
    """A restarted container: same host name, same PID, another process."""
    junk = _junk(events, "compactor-deadbeef0001-g0000-0-00000.parquet")
    now_ms = int(time.time() * 1000)
    mine = process_token(os.getpid())
    assert mine, "this test needs /proc"
    other_process = mine.rsplit(":", 1)[0] + ":1"  # same boot, started at another time
    record = _record([junk], pid=os.getpid(), expires_ms=now_ms + 600_000, process=other_process)
    _write_slot(events, 0, json.dumps(asdict(record)).encode())
    assert not record.is_live(now_ms)

    result, table = run_compaction(catalog, TABLE)
    assert result.recovered_files == [junk]
    assert not local_path(junk).exists()
    assert result.snapshot_ids


def test_the_writing_process_keeps_its_record_live(catalog: Catalog, events: Table) -> None:
    now_ms = int(time.time() * 1000)
    record = _record(
        [], pid=os.getpid(), expires_ms=now_ms + 600_000, process=process_token(os.getpid())
    )
    _write_slot(events, 0, json.dumps(asdict(record)).encode())
    assert record.is_live(now_ms)
    with pytest.raises(LeaseHeldError, match="backing off"):
        run_compaction(catalog, TABLE)


@pytest.mark.parametrize("command", ["run", "rewrite-deletes", "rewrite-manifests"])
def test_a_command_that_backs_off_exits_0_or_the_code_asked_for(
    tmp_path: Path, command: str
) -> None:
    """Wrappers tell "busy, try later" from "done" with ``--exit-code-if-busy``; the reason is
    on stderr, or in the JSON document's ``backed_off``."""
    events = create_events_table(embedded(tmp_path), TABLE, commits=4, rows_per_commit=50)
    holder = RunLease(events, "holder", ttl_s=600)
    holder.acquire()
    try:
        default = compactor_cli(tmp_path, command, "--table", TABLE)
        asked = compactor_cli(tmp_path, command, "--table", TABLE, "--exit-code-if-busy", "75")
        as_json = compactor_cli(
            tmp_path, command, "--table", TABLE, "--exit-code-if-busy", "75", "--json"
        )
    finally:
        holder.release()
    assert default.returncode == 0 and "run holder" in default.stderr, default.stderr
    assert asked.returncode == 75 and "run holder" in asked.stderr and not asked.stdout
    assert as_json.returncode == 75, as_json.stderr
    assert "run holder" in json.loads(as_json.stdout)["backed_off"]
    assert len(embedded(tmp_path).load_table(TABLE).metadata.snapshots) == 4
