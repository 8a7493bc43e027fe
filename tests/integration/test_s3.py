"""compactor on S3-compatible storage, with real components end to end.

moto serves S3 over HTTP on 127.0.0.1 (see ``s3_server.py``); pyiceberg's SqlCatalog keeps its
warehouse in a bucket and reads and writes through pyarrow's S3 filesystem; compactor lists
through pyarrow and deletes through boto3's DeleteObjects. The server records every request, so
the tests can tell which S3 operations a run used, whichever client sent them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.utils.config import Config

from compactor import compaction
from compactor.bench.sample import REGIONS, create_events_table, events_batch
from compactor.commit.inflight import RunRecord, boot_id, pid_namespace, read_record, record_paths
from compactor.compaction import RunResult
from compactor.maintain.expire import expire_snapshots, retention_policy
from compactor.maintain.orphans import remove_orphans
from compactor.options import resolve_options
from compactor.storage import deleter

from support.rows import assert_same_rows, scan_rows
from support.s3_tables import (
    COMMITS,
    DATA_FILES,
    DAYS,
    ROWS_PER_COMMIT,
    TABLE,
    make_table,
    object_key,
    referenced_keys,
)
from support.tables import live_data_files

if TYPE_CHECKING:
    from support.s3_server import S3Bucket, S3Request

# The server and bucket fixtures; imported by pytest first, so its asserts are rewritten too.
pytest_plugins = ("support.s3_server",)

# pyiceberg percent-encodes this partition value in the file's key: region=sa%2Feast+1%3A50%25
ODD_REGION = "sa/east 1:50%"
COMPACTOR = Path(sys.executable).parent / "compactor"
HOUR_MS = 3_600_000


# --- tables, runs and what S3 saw --------------------------------------------------------------


def compact_table(catalog: Catalog) -> tuple[RunResult, Table]:
    """One compaction run with small targets; returns the result and the reloaded table."""
    table = catalog.load_table(TABLE)
    options = resolve_options(
        TABLE,
        table.metadata.properties,
        target_file_size="1MiB",
        allow_small_target=True,
        min_input_files=2,
    )
    result = compaction.compact_table(table, options)
    return result, catalog.load_table(TABLE)


def one_partition_batch(commit: int, rows: int, region: str) -> pa.Table:
    """Sample rows that all fall into day 2026-01-01 and ``region``."""
    batch = events_batch(commit, rows, days=1)
    index = batch.schema.get_field_index("region")
    column = batch.schema.field(index)
    return batch.set_column(index, column, pa.array([region] * rows, column.type))


def run_records(s3: S3Bucket, table: Table) -> list[str]:
    """Keys of run records (``metadata/compactor-run.*.json``) stored for ``table``."""
    return sorted(
        key
        for key in s3.objects(table.location())
        if key.rsplit("/", 1)[-1].startswith("compactor-run.")
    )


def batch_deletes(requests: list[S3Request]) -> list[S3Request]:
    """DeleteObjects requests (``POST /bucket?delete``)."""
    return [r for r in requests if r.is_batch_delete]


def object_deletes(requests: list[S3Request]) -> list[S3Request]:
    """Single-object deletes (``DELETE /bucket/key``), from any client."""
    return [r for r in requests if r.method == "DELETE" and r.key]


@dataclass
class DeleteCalls:
    """The S3 delete calls made by the boto3 clients compactor's deleter creates."""

    batches: list[list[str]] = field(default_factory=list)
    delete_objects: int = 0
    delete_object: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def keys(self) -> list[str]:
        return [key for batch in self.batches for key in batch]

    def reset(self) -> None:
        with self.lock:
            self.batches, self.delete_objects, self.delete_object = [], 0, 0


def watch_deletes(monkeypatch: pytest.MonkeyPatch) -> DeleteCalls:
    """Hook botocore's events on every client compactor.storage.deleter creates from now on."""
    calls = DeleteCalls()
    make_client = deleter.s3_client

    def on_params(params: dict[str, Any], **_: Any) -> None:
        with calls.lock:
            calls.batches.append([item["Key"] for item in params["Delete"]["Objects"]])

    def on_batch(**_: Any) -> None:
        with calls.lock:
            calls.delete_objects += 1

    def on_single(**_: Any) -> None:
        with calls.lock:
            calls.delete_object += 1

    def hooked(io: Any) -> Any:
        client = make_client(io)
        assert client is not None, "boto3 is installed: the deleter must get a client"
        client.meta.events.register("before-parameter-build.s3.DeleteObjects", on_params)
        client.meta.events.register("before-call.s3.DeleteObjects", on_batch)
        client.meta.events.register("before-call.s3.DeleteObject", on_single)
        return client

    monkeypatch.setattr(deleter, "s3_client", hooked)
    return calls


# --- 1. compaction -----------------------------------------------------------------------------


@pytest.mark.usefixtures("file_kind")
def test_compaction_on_s3(s3: S3Bucket) -> None:
    """Files with field ids, and files imported without them (read through the name mapping
    from S3), are compacted; the run leaves nothing behind in the bucket."""
    catalog, table = make_table(s3)
    before_snapshot = table.current_snapshot()
    assert before_snapshot is not None
    before_rows = scan_rows(table)
    before_files = live_data_files(table)
    mark = s3.log.mark()

    result, table = compact_table(catalog)

    summary = result.to_dict()
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert summary["snapshot_id"] == snapshot.snapshot_id
    assert snapshot.parent_snapshot_id == before_snapshot.snapshot_id
    assert snapshot.summary.operation == Operation.REPLACE
    assert summary["failed_groups"] == []
    assert summary["rewritten_files"] == DATA_FILES
    after_files = live_data_files(table)
    assert len(after_files) == DAYS * len(REGIONS) < len(before_files)
    assert_same_rows(before_rows, scan_rows(table))

    # The new files are objects in the bucket, under the table's data/, of the recorded size.
    objects = s3.objects(table.location())
    table_key = s3.key(table.location())
    for path in set(after_files) - set(before_files):
        assert s3.key(path).startswith(f"{table_key}/data/")
        assert objects[s3.key(path)] == after_files[path].file_size_in_bytes
    # The run kept its record in S3 while it ran and removed it at the end.
    requests = s3.requests_since(mark)
    written = {r.key for r in requests if r.method == "PUT" and "compactor-run." in r.key}
    assert written == {f"{table_key}/metadata/compactor-run.{slot}.json" for slot in (0, 1)}
    assert run_records(s3, table) == []
    # Nothing was left behind: every object is a file the table references or table metadata.
    referenced = referenced_keys(s3, table)
    strays = [k for k in objects if k not in referenced and not k.endswith(".metadata.json")]
    assert strays == []


# --- 2. expire and orphans ---------------------------------------------------------------------


def test_expire_and_orphans_on_s3(s3: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, table = make_table(s3)
    table_key = s3.key(table.location())
    # A partition whose directory pyiceberg percent-encodes: one file, never compacted.
    table.append(one_partition_batch(COMMITS, 40, ODD_REGION))
    odd_dir = f"{table_key}/data/ts_day=2026-01-01/region={quote_plus(ODD_REGION, safe='')}"
    (odd_file,) = [p for p in live_data_files(table) if s3.key(p).startswith(odd_dir + "/")]
    assert "%2F" in odd_file and "%25" in odd_file and "+" in odd_file

    result, table = compact_table(catalog)
    assert result.to_dict()["rewritten_files"] == DATA_FILES
    assert odd_file in live_data_files(table)

    # A live file the metadata spells s3a:// while the listing spells it s3://: comparing the
    # strings as they are would make it an orphan, and delete it.
    imported_key = f"{table_key}/data/imported/part-00000.parquet"
    imported = one_partition_batch(COMMITS + 1, 40, "eu")
    with table.io.new_output(f"s3a://{s3.bucket}/{imported_key}").create() as stream:
        pq.write_table(
            imported.cast(pa.schema([f.remove_metadata() for f in imported.schema])), stream
        )
    table.add_files([f"s3a://{s3.bucket}/{imported_key}"])
    table = catalog.load_table(TABLE)
    assert f"s3a://{s3.bucket}/{imported_key}" in live_data_files(table)
    rows = scan_rows(table)
    assert rows.num_rows == COMMITS * ROWS_PER_COMMIT + 80

    # --- expire everything but the current snapshot -------------------------------------------
    objects_before = s3.objects(table.location())
    calls = watch_deletes(monkeypatch)
    mark = s3.log.mark()
    now_ms = int(time.time() * 1000)
    policy = retention_policy(table, TABLE, "0s", None, now_ms)
    assert result.snapshot_ids[-1] in {s.snapshot_id for s in table.metadata.snapshots}
    expired = expire_snapshots(table, TABLE, policy)
    table = catalog.load_table(TABLE)

    data = expired.to_dict()
    assert data["snapshots_expired"] == COMMITS + 2  # the appends, the odd one, the compaction
    assert [s.snapshot_id for s in table.metadata.snapshots] == [table.metadata.current_snapshot_id]
    assert data["failed"] == [] and data["refused_outside_table_location"] == 0
    assert data["deleted"]["data_files"]["files"] == DATA_FILES
    deleted = {object_key(s3, r.location) for refs in expired.report.by_kind.values() for r in refs}
    objects_after = s3.objects(table.location())
    # Exactly the reported files went, and the reported bytes are the bytes that left S3; the
    # only new object is the expiry commit's table metadata.
    assert set(objects_before) - set(objects_after) == deleted
    assert set(objects_after) - set(objects_before) == {s3.key(table.metadata_location)}
    assert sum(objects_after.values()) < sum(objects_before.values())
    remaining = sum(size for key, size in objects_after.items() if key in objects_before)
    assert sum(objects_before.values()) - remaining == data["bytes_deleted"]
    assert referenced_keys(s3, table) <= set(objects_after)
    assert_same_rows(rows, scan_rows(table))
    # Through DeleteObjects batches only: seen by botocore's hooks and by the server.
    assert calls.delete_objects >= 1 and calls.delete_object == 0
    assert sorted(calls.keys) == sorted(deleted)
    requests = s3.requests_since(mark)
    assert len(batch_deletes(requests)) == calls.delete_objects
    assert object_deletes(requests) == []

    # --- orphans: junk under the table's prefix goes, referenced files and siblings stay ------
    junk = {
        s3.key(s3.put(f"{table_key}/data/ts_day=2026-01-01/region=eu/junk-0.parquet")),
        s3.key(s3.put(f"{odd_dir}/junk-1.parquet")),  # beside the percent-encoded file
        s3.key(s3.put(f"{table_key}/data/with space/junk 2.parquet")),
        s3.key(s3.put(f"{table_key}/metadata/junk-3.avro")),
    }
    sibling = s3.key(s3.put(f"{table_key}_old/data/junk-4.parquet"))
    kept = s3.objects(table.location()).keys() - junk
    assert s3.key(odd_file) in kept and imported_key in kept
    calls.reset()
    mark = s3.log.mark()
    # moto stamps objects with the current time: a cut-off an hour ahead makes all old enough.
    cutoff_ms = int(time.time() * 1000) + HOUR_MS
    orphaned = remove_orphans(
        catalog.load_table(TABLE), TABLE, cutoff_ms, allow_short_older_than=True
    )

    data = orphaned.to_dict()
    assert {s3.key(ref.location) for ref in orphaned.scan.orphans} == junk
    assert data["files_deleted"] == len(junk) and data["failed"] == []
    assert data["refused"] == [] and data["skipped_too_young"] == 0
    assert s3.objects(table.location()).keys() == kept
    assert s3.exists(sibling)
    assert_same_rows(rows, scan_rows(catalog.load_table(TABLE)))
    assert calls.delete_objects >= 1 and calls.delete_object == 0
    assert sorted(calls.keys) == sorted(junk)
    requests = s3.requests_since(mark)
    assert len(batch_deletes(requests)) == calls.delete_objects
    assert object_deletes(requests) == []


# --- 3. crash recovery -------------------------------------------------------------------------


def exited_pid() -> int:
    """The process id of a process of this host that has exited (and been reaped)."""
    with subprocess.Popen([sys.executable, "-c", ""], stdin=subprocess.DEVNULL) as process:
        process.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)
    return process.pid


def test_abandoned_run_is_recovered_on_s3(s3: S3Bucket) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    live = sorted(live_data_files(table))[0]
    table_key = s3.key(table.location())
    # The dead run had uploaded one output file, and recorded another that did get committed.
    junk = s3.put(
        f"{table_key}/data/ts_day=2026-01-01/region=eu/compactor-0123456789ab-g0000-0-00000.parquet",
        b"PAR1 partial upload",
    )
    now_ms = int(time.time() * 1000)
    record = RunRecord(
        run_id="0123456789ab",
        host=socket.gethostname(),
        pid=exited_pid(),
        started_ms=now_ms - 60_000,
        expires_ms=now_ms + HOUR_MS,  # not expired: only its dead process frees the lease
        files=[junk, live],
        seq=1,
        process=f"{boot_id()}:0",  # written in this PID namespace and boot
        pid_namespace=pid_namespace(),
    )
    record_path = record_paths(table)[1]
    assert record_path == f"{table.location()}/metadata/compactor-run.1.json"
    s3.client.put_object(
        Bucket=s3.bucket, Key=s3.key(record_path), Body=json.dumps(asdict(record)).encode()
    )
    assert read_record(table) == record
    mark = s3.log.mark()

    result, table = compact_table(catalog)

    assert result.recovered_files == [junk]
    assert result.to_dict()["recovered_files"] == 1
    assert not s3.exists(s3.key(junk))
    assert s3.exists(s3.key(live))
    assert s3.key(live) in referenced_keys(s3, table)
    assert result.snapshot_ids, "the run went on to compact after recovering"
    assert_same_rows(rows, scan_rows(table))
    assert run_records(s3, table) == []
    requests = s3.requests_since(mark)
    assert batch_deletes(requests) and object_deletes(requests) == []


# --- 4. the CLI --------------------------------------------------------------------------------


def test_cli_run_and_expire_on_s3(
    s3: S3Bucket, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    catalog_properties = {
        "type": "sql",
        "uri": s3.catalog_uri,
        "warehouse": s3.warehouse,
        **s3.properties(),
    }
    prefix = f"PYICEBERG_CATALOG__{s3.catalog_name.upper()}__"
    variables = {
        prefix + key.upper().replace(".", "__").replace("-", "_"): value
        for key, value in catalog_properties.items()
    }
    assert set(variables) >= {prefix + "S3__ENDPOINT", prefix + "S3__ACCESS_KEY_ID"}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    # pyiceberg maps "__" inside a key to "." and "_" to "-": s3.endpoint, s3.access-key-id.
    assert Config().get_catalog_config(s3.catalog_name) == catalog_properties
    env = dict(os.environ)  # isolated by the s3 fixture: HOME etc. are tmp_path

    def compactor(*args: str) -> dict[str, Any]:
        process = subprocess.run(
            [str(COMPACTOR), *args, "--catalog", s3.catalog_name, "--table", TABLE, "--json"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert process.returncode == 0, f"stdout:\n{process.stdout}\nstderr:\n{process.stderr}"
        document: dict[str, Any] = json.loads(process.stdout)
        return document

    mark = s3.log.mark()
    ran = compactor(
        "run", "--target-file-size", "1MiB", "--allow-small-target", "--min-input-files", "2"
    )
    table = catalog.load_table(TABLE)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert ran["snapshot_id"] == snapshot.snapshot_id
    assert snapshot.summary.operation == Operation.REPLACE
    assert ran["rewritten_files"] == DATA_FILES and ran["failed_groups"] == []
    assert ran["added_files"] == len(live_data_files(table)) < DATA_FILES
    assert_same_rows(rows, scan_rows(table))
    assert run_records(s3, table) == []
    # The subprocess's requests reached this server too.
    assert any(r.method == "PUT" and "compactor-run." in r.key for r in s3.requests_since(mark))

    objects_before = s3.objects(table.location())
    mark = s3.log.mark()
    expired = compactor("expire", "--older-than", "0s")
    table = catalog.load_table(TABLE)
    assert expired["snapshots_expired"] == COMMITS
    assert expired["files_deleted"] > 0 and expired["failed"] == []
    assert expired["deleted"]["data_files"]["files"] == DATA_FILES
    objects_after = s3.objects(table.location())
    assert set(objects_after) - set(objects_before) == {s3.key(table.metadata_location)}
    assert len(set(objects_before) - set(objects_after)) == expired["files_deleted"]
    remaining = sum(size for key, size in objects_after.items() if key in objects_before)
    assert sum(objects_before.values()) - remaining == expired["bytes_deleted"]
    assert referenced_keys(s3, table) <= set(objects_after)
    assert_same_rows(rows, scan_rows(table))
    requests = s3.requests_since(mark)
    assert batch_deletes(requests) and object_deletes(requests) == []


# --- 5. credentials ----------------------------------------------------------------------------


def test_deletes_are_signed_with_the_tables_credentials_on_s3(s3: S3Bucket) -> None:
    """pyiceberg's ``client.*`` credentials configure the deleter's boto3 client as well."""
    access_key = "lake-client-key"
    assert os.environ["AWS_ACCESS_KEY_ID"] != access_key  # the default chain would sign otherwise
    catalog = s3.catalog(
        {
            "s3.endpoint": s3.endpoint,
            "client.access-key-id": access_key,
            "client.secret-access-key": "lake-client-secret",
            "client.region": s3.properties()["s3.region"],
        }
    )
    mark = s3.log.mark()
    create_events_table(catalog, TABLE, commits=3, rows_per_commit=100, days=1)
    result, table = compact_table(catalog)
    assert result.snapshot_ids
    policy = retention_policy(table, TABLE, "0s", None, int(time.time() * 1000))
    expired = expire_snapshots(table, TABLE, policy).to_dict()
    assert expired["files_deleted"] > 0 and expired["failed"] == []

    requests = s3.requests_since(mark)
    assert batch_deletes(requests)
    signers = {(r.method, r.access_key) for r in requests if r.access_key != access_key}
    assert signers == set()


# --- 6. refused deletes ------------------------------------------------------------------------


def test_refused_deletes_are_reported_and_left_to_orphans_on_s3(s3: S3Bucket) -> None:
    """A DeleteObjects request S3 refuses is reported as failed files, not raised mid-way."""
    catalog = s3.catalog()
    create_events_table(catalog, TABLE, commits=3, rows_per_commit=100, days=1)
    result, table = compact_table(catalog)
    assert result.snapshot_ids
    rows = scan_rows(table)
    objects_before = s3.objects(table.location())
    policy = retention_policy(table, TABLE, "0s", None, int(time.time() * 1000))

    s3.log.refuse_batch_deletes(s3.bucket)
    try:
        expired = expire_snapshots(table, TABLE, policy)
    finally:
        s3.log.refuse_batch_deletes(s3.bucket, refuse=False)

    data = expired.to_dict()
    assert data["snapshots_expired"] == 3  # the expiry itself was committed
    assert data["files_deleted"] == 0 and data["deleted"] == {}
    failed = {object_key(s3, location) for location in data["failed"]}
    assert len(failed) == len(data["failed"]) > 3 * 4  # at least the rewritten data files
    objects = s3.objects(table.location())
    assert set(objects_before) <= set(objects)
    table = catalog.load_table(TABLE)
    assert_same_rows(rows, scan_rows(table))
    assert failed.isdisjoint(referenced_keys(s3, table))

    # What could not be deleted is now an orphan: the next orphans run removes exactly that.
    cutoff_ms = int(time.time() * 1000) + HOUR_MS
    orphaned = remove_orphans(table, TABLE, cutoff_ms, allow_short_older_than=True)
    assert {s3.key(ref.location) for ref in orphaned.scan.orphans} == failed
    assert orphaned.to_dict()["failed"] == []
    assert failed.isdisjoint(s3.objects(table.location()))
    assert_same_rows(rows, scan_rows(catalog.load_table(TABLE)))
