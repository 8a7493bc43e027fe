"""A data file that cannot be read (truncated, corrupt, missing) fails neither its group nor the run.

The file is quarantined and reported, stays in the table as it is, and its group is compacted
without it (or, when too little is left, kept exactly as it was); every other group is compacted
as usual. Every run test holds on both read paths. The quarantine itself: test_quarantine.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor.bench.sample import REGIONS
from compactor.compaction import last_unreadable_files
from compactor.daemon.history import SCHEMA, History
from compactor.errors import DataFileError, UnreadableFileError, file_error
from compactor.execute.ray_executor import _error_from, _error_json
from compactor.options import resolve_options
from compactor.planning.planner import plan_rewrite
from compactor.planning.tasks import plan_tasks
from compactor.rewrite.task_runner import run_task

from support.rows import assert_same_rows, scan_rows
from support.runs import DEFAULT_OPTIONS, EVERY_READ_PATH, run_compaction
from support.tables import (
    events_table,
    live_data_files,
    local_path,
    records_by_partition,
    unreferenced_files,
)

if TYPE_CHECKING:
    from support.s3_server import S3Bucket

pytest_plugins = ("support.s3_server",)

TABLE = "db.events"
TRUNCATED, DELETED = "us", "ap"  # the partitions with a bad file; eu and sa stay healthy
HEALTHY = [r for r in REGIONS if r not in (TRUNCATED, DELETED)]


def files_in(table: Table, region: str) -> set[str]:
    """Paths of the live data files of one region's partition."""
    return {p for p, f in live_data_files(table).items() if f.partition[1] == region}


def healthy_filter() -> str:
    return " or ".join(f"region = '{r}'" for r in HEALTHY)


def break_one_file_each(table: Table) -> tuple[str, str]:
    """Truncate a data file of the TRUNCATED partition, delete one of the DELETED partition."""
    truncated, deleted = sorted(files_in(table, TRUNCATED))[0], sorted(files_in(table, DELETED))[0]
    path = local_path(truncated)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    local_path(deleted).unlink()
    return truncated, deleted


@pytest.fixture
def broken(catalog: Catalog) -> tuple[Table, str, str]:
    """The events table (one day, four regions, three files each) with two bad files."""
    table = events_table(catalog, TABLE, commits=3, rows_per_commit=400, days=1)
    truncated, deleted = break_one_file_each(table)
    return catalog.load_table(TABLE), truncated, deleted


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("read_path", EVERY_READ_PATH, indirect=True)
def test_a_group_with_an_unreadable_file_is_compacted_around_it(
    catalog: Catalog, broken: tuple[Table, str, str], read_path: str
) -> None:
    before, truncated, deleted = broken
    healthy_rows = scan_rows(before, healthy_filter())
    bad_files = {r: files_in(before, r) for r in (TRUNCATED, DELETED)}
    records = records_by_partition(before)

    result, after = run_compaction(catalog, TABLE)

    data = result.to_dict()
    skipped = {f["path"]: f for f in data["skipped_files"]}
    assert set(skipped) == {truncated, deleted}
    assert skipped[truncated]["reason"].startswith("corrupt data file: ")
    assert "Parquet magic bytes not found" in skipped[truncated]["reason"]
    assert skipped[deleted]["reason"].startswith("missing data file: ")
    assert [f["path"] for f in data["quarantined_files"]] == sorted([truncated, deleted])
    # One commit, no group failed: every partition is one new file, but for the bad files.
    assert data["failed_groups"] == [] and result.errors == []
    assert len(result.snapshot_ids) == 1 and data["committed_groups"] == len(REGIONS)
    assert (data["bulk_read_files"] > 0) == (read_path != "iceberg")
    assert all(len(files_in(after, r)) == 1 for r in HEALTHY)
    assert_same_rows(healthy_rows, scan_rows(after, healthy_filter()))
    for region, bad in ((TRUNCATED, truncated), (DELETED, deleted)):
        kept = files_in(after, region)  # the unreadable file, as it was, and one new file
        assert bad in kept and len(kept) == 2 and not kept & (bad_files[region] - {bad})
    assert records_by_partition(after) == records  # the unreadable files' rows still counted
    assert last_unreadable_files(after) == sorted([truncated, deleted])  # what inspect shows
    assert unreferenced_files(after) == []


@pytest.mark.usefixtures("read_path", "file_kind")
@pytest.mark.parametrize("read_path", EVERY_READ_PATH, indirect=True)
def test_a_missing_or_truncated_object_in_s3_is_compacted_around(s3: S3Bucket) -> None:
    catalog = s3.catalog()
    table = events_table(catalog, TABLE, commits=3, rows_per_commit=100, days=1)
    truncated, deleted = sorted(files_in(table, TRUNCATED))[0], sorted(files_in(table, DELETED))[0]
    body = s3.client.get_object(Bucket=s3.bucket, Key=s3.key(truncated))["Body"].read()
    s3.client.put_object(Bucket=s3.bucket, Key=s3.key(truncated), Body=body[: len(body) // 2])
    s3.client.delete_object(Bucket=s3.bucket, Key=s3.key(deleted))

    result, _ = run_compaction(catalog, TABLE)

    reasons = {f.path: f.reason for f in result.skipped_files}
    assert reasons.keys() == {truncated, deleted}
    assert reasons[truncated].startswith("corrupt data file: ")
    assert reasons[deleted].startswith("missing data file: ")
    assert {f.path for f in result.quarantined_files} == {truncated, deleted}
    assert len(result.snapshot_ids) == 1 and len(result.committed) == len(REGIONS)


def test_a_group_too_small_without_its_unreadable_file_is_left_as_it_was(
    catalog: Catalog, broken: tuple[Table, str, str]
) -> None:
    """Two files left of three, three needed: nothing is committed, nothing fails, and the next
    run does not try the quarantined file again."""
    before, truncated, _ = broken
    options = {"where": f"region = '{TRUNCATED}'", "min_input_files": 3}

    result, after = run_compaction(catalog, TABLE, **options)
    again, _ = run_compaction(catalog, TABLE, **options)

    assert result.snapshot_ids == [] and result.failures == []
    assert [f.path for f in result.skipped_files] == [truncated]
    assert [f.path for f in result.quarantined_files] == [truncated]
    assert after.metadata.snapshots == before.metadata.snapshots
    assert unreferenced_files(after) == []
    assert again.plan.groups == [] and again.skipped_files == []
    assert again.plan.skipped["quarantined_files"] == 1
    assert [f.path for f in again.quarantined_files] == [truncated]


def test_an_unreadable_file_travels_from_a_worker_as_the_same_error(
    catalog: Catalog, broken: tuple[Table, str, str]
) -> None:
    """The Ray executor returns a task's error as JSON: the skipped file survives the trip."""
    table, truncated, _ = broken
    where = f"region = '{TRUNCATED}'"
    options = resolve_options(TABLE, table.metadata.properties, **DEFAULT_OPTIONS, where=where)
    plan, _ = plan_rewrite(table, TABLE, options.plan)
    (task,) = plan_tasks(plan, "r1", table.io.properties, options.execution)
    with pytest.raises(UnreadableFileError) as raised:
        run_task(task)

    returned = _error_from(task, _error_json(raised.value))

    assert isinstance(returned, UnreadableFileError)
    assert (returned.path, returned.reason) == (truncated, raised.value.reason)
    assert str(returned) == str(raised.value)


def damage_a_page(path: Path, column: str) -> None:
    """Flip bytes inside ``column``'s first column chunk: the footer stays valid."""
    chunks = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(
        chunks.column(i)
        for i in range(chunks.num_columns)
        if chunks.column(i).path_in_schema == column
    )
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data = bytearray(path.read_bytes())
    middle = start + chunk.total_compressed_size // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    path.write_bytes(bytes(data))


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("read_path", EVERY_READ_PATH, indirect=True)
def test_a_damaged_page_under_a_valid_footer_is_compacted_around(
    catalog: Catalog, read_path: str
) -> None:
    table = events_table(catalog, TABLE, commits=3, rows_per_commit=400, days=1)
    damaged = sorted(files_in(table, TRUNCATED))[1]
    damage_a_page(local_path(damaged), "payload")
    healthy = [r for r in REGIONS if r != TRUNCATED]
    where = " or ".join(f"region = '{r}'" for r in healthy)
    healthy_rows = scan_rows(table, where)
    kept = files_in(table, TRUNCATED)

    result, after = run_compaction(catalog, TABLE)

    data = result.to_dict()
    (skipped,) = data["skipped_files"]
    assert skipped["path"] == damaged
    assert skipped["reason"].startswith("corrupt data file: "), skipped
    assert [f["path"] for f in data["quarantined_files"]] == [damaged]
    assert data["committed_groups"] == len(REGIONS) and data["failed_groups"] == []
    assert (data["bulk_read_files"] > 0) == (read_path != "iceberg")
    (added,) = files_in(after, TRUNCATED) - {damaged}
    assert files_in(after, TRUNCATED) & kept == {damaged} and added not in kept
    assert all(len(files_in(after, r)) == 1 for r in healthy)
    assert_same_rows(healthy_rows, scan_rows(after, where))
    assert unreferenced_files(after) == []


@pytest.mark.parametrize("read_path", EVERY_READ_PATH, indirect=True)
def test_a_value_damaged_in_a_checksummed_page_is_caught_not_rewritten(
    catalog: Catalog, read_path: str
) -> None:
    """A flipped bit in an uncompressed page still decodes, to another value. compactor writes
    page checksums and verifies them where present: the damaged file is unreadable, left as it
    is, and the wrong value is not carried into a new file (its group's other files are)."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("x", pa.float64())])
    table = catalog.create_table(
        TABLE, schema, properties={"write.parquet.compression-codec": "uncompressed"}
    )
    rng = np.random.default_rng(3)

    def append(start: int) -> None:
        ids = np.arange(start, start + 2000)
        table.append(pa.table({"id": ids, "x": rng.random(len(ids))}, schema))

    for start in range(0, 6000, 2000):
        append(start)
    result, table = run_compaction(catalog, TABLE)
    (compacted,) = [d.file_path for r in result.committed for d in r.data_files]
    before = scan_rows(table)
    for start in range(6000, 10000, 2000):
        append(start)
    path = local_path(compacted)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(1)  # x: plain doubles
    data = bytearray(path.read_bytes())
    data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0x01
    path.write_bytes(bytes(data))
    damaged = pq.read_table(path)  # without verification it reads: other values
    assert damaged.num_rows == before.num_rows
    assert sorted(damaged.column("x").to_pylist()) != sorted(before.column("x").to_pylist())
    kept = set(live_data_files(catalog.load_table(TABLE)))

    result, after = run_compaction(catalog, TABLE)

    (skipped,) = result.to_dict()["skipped_files"]
    assert skipped["path"] == compacted
    assert "CRC checksum verification failed" in skipped["reason"]
    (added,) = [d.file_path for d in result.added_files]
    assert len(result.snapshot_ids) == 1 and set(live_data_files(after)) == {compacted, added}
    assert compacted in kept and added not in kept
    assert sorted(pq.read_table(local_path(added)).column("id").to_pylist()) == list(
        range(6000, 10000)
    )


def test_only_missing_or_corrupt_files_count_as_unreadable(tmp_path: Path) -> None:
    path = str(tmp_path / "f.parquet")
    missing = FileNotFoundError(2, "No such file or directory")
    no_such_key = OSError("AWS Error NO_SUCH_KEY during GetObject operation")
    corrupt = OSError("Couldn't deserialize thrift: don't know what type")
    damaged_pages = [
        OSError("ZSTD decompression failed: Data corruption detected"),
        OSError("Corrupt snappy compressed data."),
        OSError("GZipCodec failed: incorrect data check"),
        OSError("Invalid page header"),
        OSError("Unexpected end of stream"),
        OSError(
            "could not verify page integrity, CRC checksum verification failed for page_ordinal 2"
        ),
    ]
    for exc in (missing, no_such_key, corrupt, *damaged_pages):
        assert isinstance(file_error("data", path, exc), UnreadableFileError)
    throttled = OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your rate")
    timeout = OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28")
    bug = ValueError("Unsupported cast from string to int64")
    for exc in (throttled, timeout, bug):
        error = file_error("data", path, exc)
        assert type(error) is DataFileError and str(error).startswith(f"data file {path}: ")


def test_the_state_file_records_unreadable_files_also_when_written_by_an_earlier_version(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    old_schema = SCHEMA  # the runs table as it was before skipped_files and quarantined_files
    for added in ("skipped_files", "quarantined_files"):
        old_schema = old_schema.replace(f",\n    {added} TEXT NOT NULL DEFAULT '[]'", "")
    assert "skipped_files" not in old_schema and "quarantined_files" not in old_schema
    with sqlite3.connect(path) as db:
        db.executescript(old_schema)
    history = History(path)
    row = history.start_run("db.events", "compact", "job", 1.0)
    row.outcome, row.ended_at = "partial", 2.0
    row.skipped_files = [{"group_id": 3, "path": "s3://b/t/f.parquet", "reason": "missing"}]
    row.quarantined_files = [
        {"path": "s3://b/t/f.parquet", "reason": "missing", "first_seen_ms": 1}
    ]
    history.finish_run(row)

    (stored,) = history.runs()
    assert (stored.skipped_files, stored.quarantined_files) == (
        row.skipped_files,
        row.quarantined_files,
    )
    history.close()
