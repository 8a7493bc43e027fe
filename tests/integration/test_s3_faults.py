"""compactor on S3 that misbehaves: faults injected at the HTTP level into moto's answers.

The faults (``s3_server.S3Faults``, fixture ``s3_faults``, scoped to the test's bucket and
switched off after it) hit whichever client sends the request: pyarrow's AWS SDK (reads,
writes, listings) or boto3 (DeleteObjects). Each test checks that a run either succeeds after
retries with the same rows, or fails with one CompactorError line and the table unchanged; and
that afterwards (after the next run, or an orphans run) no object under the table's location is
left that its metadata does not reference.

- (a) 503 SlowDown on GETs of data files, uploads, listings and DeleteObjects;
- (b) connections reset after part of an upload's body was read (UploadPart);
- (c) 500 InternalError on GETs of a data file;
- (d) DeleteObjects answered 200 with per-key ``<Error>`` entries;
- ListObjectsV2 pagination, DeleteObjects batch sizes, and the ``s3.retry-strategy-impl``
  FileIO property that sets how often pyarrow retries.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from compactor import compaction
from compactor.bench.sample import create_events_table
from compactor.compaction import RunResult
from compactor.errors import CompactorError, first_line
from compactor.iceberg.pyiceberg_compat import S3_RETRY_ATTEMPTS, with_s3_retries
from compactor.iceberg.references import table_references
from compactor.maintain.expire import expire_snapshots, retention_policy
from compactor.maintain.orphans import remove_orphans
from compactor.options import resolve_options
from compactor.storage.deleter import S3_BATCH, delete_files
from compactor.storage.listing import list_files, list_prefix

from support.rows import assert_same_rows, scan_rows

if TYPE_CHECKING:
    from support.s3_server import S3Bucket, S3Faults, S3Request

pytest_plugins = ("support.s3_server",)

TABLE = "db.events"
COMMITS, ROWS_PER_COMMIT = 3, 100  # one day, four regions: 12 data files, 4 groups
COMPACTOR = Path(sys.executable).parent / "compactor"
HOUR_MS = 3_600_000
RUN_OPTIONS = {"target_file_size": "1MiB", "allow_small_target": True, "min_input_files": 2}


# --- tables, runs and what is left in the bucket ------------------------------------------------


# A retry strategy the catalog's configuration names: it wins over compactor's (6 attempts).
# pyarrow's own, 3 attempts: tests of faults that never clear wait through fewer back-offs.
PLAIN_RETRIES = {"s3.retry-strategy-impl": "pyarrow.fs.AwsStandardS3RetryStrategy"}
PLAIN_ATTEMPTS = 3


def make_table(s3: S3Bucket, **properties: str) -> tuple[Catalog, Table]:
    catalog = s3.catalog({**s3.properties(), **properties})
    table = create_events_table(
        catalog, TABLE, commits=COMMITS, rows_per_commit=ROWS_PER_COMMIT, days=1
    )
    return catalog, table


def compact_table(catalog: Catalog) -> tuple[RunResult, Table]:
    table = catalog.load_table(TABLE)
    options = resolve_options(TABLE, table.metadata.properties, **RUN_OPTIONS)
    result = compaction.compact_table(table, options)
    return result, catalog.load_table(TABLE)


def input_file(table: Table, region: str) -> str:
    """The location of one of the table's data files in ``region``'s partition."""
    paths = sorted(task.file.file_path for task in table.scan().plan_files())
    return next(p for p in paths if f"/region={region}/" in p)


def object_key(s3: S3Bucket, location: str) -> str:
    scheme, _, rest = location.partition("://")
    assert scheme in ("s3", "s3a", "s3n"), location
    return s3.key(f"s3://{rest}")


def leftovers(s3: S3Bucket, table: Table) -> list[str]:
    """Objects under the table's location that no snapshot references, but table metadata files.

    Run records and intent files count: after a finished run none may remain.
    """
    referenced = {object_key(s3, p) for p in table_references(table).all()}
    return sorted(
        key
        for key in s3.objects(table.location())
        if key not in referenced and not key.endswith(".metadata.json")
    )


def open_uploads(s3: S3Bucket, table: Table) -> list[str]:
    """Keys of multipart uploads begun under the table's location and never completed."""
    prefix = s3.key(table.location()) + "/"
    response = s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix)
    return sorted(upload["Key"] for upload in response.get("Uploads", []))


def assert_retried(s3: S3Bucket, mark: int, faults: S3Faults) -> None:
    """Every request a fault hit was sent again."""
    sent = s3.requests_since(mark)
    assert faults.injected
    for _, request in faults.injected:
        same = [r for r in sent if (r.method, r.key) == (request.method, request.key)]
        assert len(same) >= 2, f"{request.method} {request.key} was not retried"


def expect_unchanged(
    catalog: Catalog, faults: S3Faults, snapshot_id: int | None, rows: pa.Table
) -> Table:
    """The table is at ``snapshot_id`` with ``rows``; switches the faults off to read it."""
    table = catalog.load_table(TABLE)
    assert table.metadata.current_snapshot_id == snapshot_id
    faults.clear()
    assert_same_rows(rows, scan_rows(table))
    return table


# --- (a) throttling ------------------------------------------------------------------------------


def test_throttled_requests_are_retried(s3: S3Bucket, s3_faults: S3Faults) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    before = table.metadata.current_snapshot_id
    # 503 SlowDown for the first request of each kind below, per key; moto answers the retry.
    # (A few only: each retry waits up to a second or so, pyarrow's backoff.)
    s3_faults.throttle("GET", re.escape(s3.key(input_file(table, "us"))))  # an input (pyarrow)
    s3_faults.throttle("PUT", r"/region=us/compactor-", query=["partNumber"])  # output part
    s3_faults.throttle("PUT", r"/metadata/compactor-run\.", query=["partNumber"])  # run record
    s3_faults.throttle("PUT", r"\.metadata\.json$", query=["partNumber"])  # the commit
    s3_faults.throttle("GET", r"^$", query=["list-type"])  # the first listing (pyarrow)
    s3_faults.throttle("POST", r"^$", query=["delete"])  # the first DeleteObjects (boto3)
    mark = s3.log.mark()

    result, table = compact_table(catalog)

    assert result.errors == [] and len(result.snapshot_ids) == 1
    assert table.metadata.current_snapshot_id != before
    assert result.to_dict()["rewritten_files"] == COMMITS * 4
    assert_same_rows(rows, scan_rows(table))
    kinds = {(r.method, _kind(r)) for _, r in s3_faults.injected}
    assert kinds == {
        ("GET", "data"),
        ("PUT", "output"),
        ("PUT", "record"),
        ("PUT", "table metadata"),
        ("GET", "listing"),
        ("POST", "batch delete"),
    }
    assert_retried(s3, mark, s3_faults)
    assert leftovers(s3, table) == []
    assert open_uploads(s3, table) == []


def _kind(request: S3Request) -> str:
    if request.is_batch_delete:
        return "batch delete"
    if not request.key:
        return "listing"
    name = request.key.rsplit("/", 1)[-1]
    if name.startswith("compactor-run."):
        return "record"
    if name.endswith(".metadata.json"):
        return "table metadata"
    return "output" if name.startswith("compactor-") else "data"


# --- (b) connections dropped mid-upload ----------------------------------------------------------


def test_upload_connection_dropped_once_is_retried(s3: S3Bucket, s3_faults: S3Faults) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    # The first UploadPart of every output file and of the commit's manifest list: the server
    # reads half the body, then resets the connection; pyarrow uploads the part again.
    outputs = s3_faults.drop_connection("PUT", r"/data/.*compactor-", query=["partNumber"])
    manifest_list = s3_faults.drop_connection("PUT", r"/metadata/snap-", query=["partNumber"])
    mark = s3.log.mark()

    result, table = compact_table(catalog)

    assert result.errors == [] and result.snapshot_ids
    assert len(outputs.injected) == 4 and len(manifest_list.injected) == 1
    assert_retried(s3, mark, s3_faults)
    assert_same_rows(rows, scan_rows(table))
    assert leftovers(s3, table) == []
    assert open_uploads(s3, table) == []


def test_upload_connection_always_dropped_fails_cleanly(s3: S3Bucket, s3_faults: S3Faults) -> None:
    catalog, table = make_table(s3, **PLAIN_RETRIES)
    rows = scan_rows(table)
    before = table.metadata.current_snapshot_id
    dropped = s3_faults.drop_connection(
        "PUT", r"/region=us/compactor-", query=["partNumber"], times=None
    )

    with pytest.raises(CompactorError) as raised:
        compact_table(catalog)

    # pyarrow tried as often as the catalog's own retry strategy says (not compactor's
    # S3_RETRY_ATTEMPTS), then the run failed as a whole and cleaned up.
    assert len(dropped.injected) == PLAIN_ATTEMPTS < S3_RETRY_ATTEMPTS
    message = first_line(raised.value)
    assert "region=us" in message and "NETWORK_CONNECTION" in message
    table = expect_unchanged(catalog, s3_faults, before, rows)
    assert leftovers(s3, table) == []  # the other groups' outputs and intent files are gone
    # pyarrow never aborts the multipart upload of the failed file: it is no object (no
    # listing sees it) but its parts cost storage. The orphans run aborts it, once old enough.
    (stuck,) = open_uploads(s3, table)
    assert re.search(r"/region=us/compactor-", stuck)
    # (moto dates every upload 2010-11-10, so the cut-off's age test is not exercised here.)
    now_ms = int(time.time() * 1000)
    swept = remove_orphans(table, TABLE, now_ms + 1000, allow_short_older_than=True).to_dict()
    assert (swept["open_uploads"], swept["aborted_uploads"]) == (1, 1)
    assert open_uploads(s3, table) == []
    assert open_uploads(s3, table) == []

    result, table = compact_table(catalog)
    assert result.errors == [] and result.snapshot_ids
    assert_same_rows(rows, scan_rows(table))
    assert leftovers(s3, table) == []


@pytest.mark.parametrize("always", [False, True], ids=["once", "always"])
def test_connection_dropped_mid_part(s3: S3Bucket, s3_faults: S3Faults, always: bool) -> None:
    """A part big enough to be cut while it is still being sent (10% read, then a reset)."""
    io = PyArrowFileIO(s3.properties())
    location = f"s3://{s3.bucket}/big/object.bin"
    payload = os.urandom(12 << 20)
    dropped = s3_faults.drop_connection(
        "PUT", r"^big/", query=["partNumber"], times=None if always else 1, fraction=0.1
    )
    if always:
        with (
            pytest.raises(OSError, match="UploadPart"),
            io.new_output(location).create() as stream,
        ):
            stream.write(payload)
        assert not s3.exists("big/object.bin")
        attempts = Counter(_part_number(r) for r in dropped.injected)
        assert attempts and set(attempts.values()) == {3}  # pyarrow's 3 attempts per part
        uploads = s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix="big/")
        assert [u["Key"] for u in uploads.get("Uploads", [])] == ["big/object.bin"]
    else:
        with io.new_output(location).create() as stream:
            stream.write(payload)
        assert len(dropped.injected) == 1
        body = s3.client.get_object(Bucket=s3.bucket, Key="big/object.bin")["Body"].read()
        assert body == payload


def _part_number(request: S3Request) -> str:
    return next(p for p in request.query.split("&") if p.startswith("partNumber="))


# --- (c) 500 InternalError on reading a data file -------------------------------------------


def test_internal_error_on_data_file_is_retried(s3: S3Bucket, s3_faults: S3Faults) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    # Twice per file: pyarrow's third attempt (its default maximum) gets the data.
    failing = s3_faults.error("GET", re.escape(s3.key(input_file(table, "us"))), times=2)
    mark = s3.log.mark()

    result, table = compact_table(catalog)

    assert result.errors == [] and result.snapshot_ids
    assert len(failing.injected) == 2
    assert_retried(s3, mark, s3_faults)
    assert_same_rows(rows, scan_rows(table))
    assert leftovers(s3, table) == []


def cli(s3: S3Bucket, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``compactor`` command against the test's catalog."""
    properties = {"type": "sql", "uri": s3.catalog_uri, "warehouse": s3.warehouse}
    properties.update(s3.properties())
    prefix = f"PYICEBERG_CATALOG__{s3.catalog_name.upper()}__"
    env = dict(os.environ)  # isolated by the s3 fixture
    for key, value in properties.items():
        env[prefix + key.upper().replace(".", "__").replace("-", "_")] = value
    return subprocess.run(
        [str(COMPACTOR), *args, "--catalog", s3.catalog_name, "--table", TABLE],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_internal_error_on_data_file_fails_cleanly(
    s3: S3Bucket, s3_faults: S3Faults, tmp_path: Path
) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    before = table.metadata.current_snapshot_id
    broken = input_file(table, "us")
    s3_faults.error("GET", re.escape(s3.key(broken)) + "$", times=None)

    process = cli(
        s3, tmp_path, "run", "--target-file-size", "1MiB", "--allow-small-target",
        "--min-input-files", "2",
    )  # fmt: skip

    assert process.returncode == 1, process.stdout + process.stderr
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), process.stderr
    assert broken in lines[0] and "INTERNAL_FAILURE" in lines[0]
    table = expect_unchanged(catalog, s3_faults, before, rows)
    assert leftovers(s3, table) == []
    assert open_uploads(s3, table) == []

    result, table = compact_table(catalog)
    assert result.errors == [] and result.snapshot_ids and result.recovered_files == []
    assert_same_rows(rows, scan_rows(table))
    assert leftovers(s3, table) == []


# --- (d) DeleteObjects with per-key errors -------------------------------------------------------


def test_per_key_delete_errors_are_reported_and_left_to_orphans(
    s3: S3Bucket, s3_faults: S3Faults, caplog: pytest.LogCaptureFixture
) -> None:
    catalog, table = make_table(s3)
    result, table = compact_table(catalog)
    assert result.snapshot_ids
    rows = scan_rows(table)
    objects_before = s3.objects(table.location())
    # For good: the rewritten files of one region and the old manifest lists. Once: another
    # region's (a transient per-key InternalError: the deleter sends those keys again).
    denied = s3_faults.fail_deletes(r"/region=us/00000-|/metadata/snap-")
    transient = s3_faults.fail_deletes(r"/region=eu/00000-", code="InternalError", times=1)
    policy = retention_policy(table, TABLE, "0s", None, int(time.time() * 1000))

    expired = expire_snapshots(table, TABLE, policy)

    data = expired.to_dict()
    assert data["snapshots_expired"] == COMMITS
    # Reported as failed: exactly the keys S3 refused for good, each in one request only.
    failed = {object_key(s3, location) for location in data["failed"]}
    refused = [k for k in s3_faults.failed_delete_keys() if denied.key.search(k)]
    assert failed == set(refused) and len(refused) == len(failed) == 2 * COMMITS
    assert len([k for k in failed if "/region=us/" in k]) == COMMITS
    warnings = [r.getMessage() for r in caplog.records if r.name == "compactor.storage.deleter"]
    assert any(f"AccessDenied x{2 * COMMITS}" in w for w in warnings), warnings
    # The transient ones were sent again, in a request of their own, and deleted.
    retried = [k for k in s3_faults.failed_delete_keys() if transient.key.search(k)]
    assert len(retried) == COMMITS
    assert sorted(s3_faults.delete_batches[-1]) == sorted(retried)
    objects = s3.objects(table.location())
    assert not any("/region=eu/00000-" in key for key in objects)  # deleted on the retry
    assert failed <= set(objects)
    deleted = set(objects_before) - set(objects)
    assert deleted and deleted.isdisjoint(failed)
    table = catalog.load_table(TABLE)
    assert_same_rows(rows, scan_rows(table))
    assert sorted(failed) == leftovers(s3, table)

    # What could not be deleted is an orphan now; the orphans run lists in pages of 5 keys.
    s3_faults.clear()
    s3_faults.cap_list_keys(5)
    listed_from = len(s3_faults.list_requests)
    orphaned = remove_orphans(
        table, TABLE, int(time.time() * 1000) + HOUR_MS, allow_short_older_than=True
    )
    assert {object_key(s3, ref.location) for ref in orphaned.scan.orphans} == failed
    assert orphaned.to_dict()["failed"] == []
    assert orphaned.scan.listed > 5
    pages = s3_faults.list_requests[listed_from:]
    assert sum("continuation-token=" in r.query for r in pages) >= orphaned.scan.listed // 5 - 1
    table = catalog.load_table(TABLE)
    assert leftovers(s3, table) == []
    assert_same_rows(rows, scan_rows(table))


def test_failed_run_whose_cleanup_is_refused_is_recovered_by_the_next(
    s3: S3Bucket, s3_faults: S3Faults
) -> None:
    catalog, table = make_table(s3, **PLAIN_RETRIES)
    rows = scan_rows(table)
    before = table.metadata.current_snapshot_id
    # The run fails on a data file, and its clean-up may delete none of its own files.
    s3_faults.error("GET", re.escape(s3.key(input_file(table, "eu"))), times=None)
    refused = s3_faults.fail_deletes(r"/compactor-[0-9a-f]{12}-g|/compactor-intent-")

    with pytest.raises(CompactorError, match="region=eu"):
        compact_table(catalog)

    table = expect_unchanged(catalog, s3_faults, before, rows)
    assert refused.injected  # the clean-up was tried, and refused
    left = leftovers(s3, table)
    names = [key.rsplit("/", 1)[-1] for key in left]
    run_records = [n for n in names if n.startswith("compactor-run.")]
    assert run_records, "the failed run keeps its record for the next run"
    assert any(n.startswith("compactor-intent-") for n in names)
    assert all(n.startswith("compactor-") for n in names), names
    outputs = sorted(k for k in left if "/data/" in k)

    result, table = compact_table(catalog)

    assert sorted(object_key(s3, p) for p in result.recovered_files) == outputs
    assert result.errors == [] and result.snapshot_ids
    assert_same_rows(rows, scan_rows(table))
    assert leftovers(s3, table) == []


# --- listings and batches ---------------------------------------------------------------------


def test_listings_follow_list_objects_v2_pages(s3: S3Bucket, s3_faults: S3Faults) -> None:
    keys = [f"root/d{i % 3}/sub/f-{i:02d}.bin" for i in range(17)]
    keys += [f"root/flat/part-{i:02d}.bin" for i in range(9)] + ["root/flat/other.bin"]
    for key in keys:
        s3.put(key, key.encode())
    io = PyArrowFileIO(s3.properties())
    s3_faults.cap_list_keys(4)

    found = list(list_files(io, f"s3://{s3.bucket}/root"))
    prefixed = list_prefix(io, f"s3://{s3.bucket}/root/flat/part-")

    assert sorted(object_key(s3, f.location) for f in found) == sorted(keys)
    assert {f.size for f in found} == {len(k) for k in keys}
    assert prefixed == [f"s3://{s3.bucket}/root/flat/part-{i:02d}.bin" for i in range(9)]
    requests = s3_faults.list_requests
    assert requests and all("list-type=2" in r.query for r in requests)  # V2 only
    assert sum("continuation-token=" in r.query for r in requests) >= len(keys) // 4


def test_delete_objects_batches_hold_at_most_1000_keys(s3: S3Bucket, s3_faults: S3Faults) -> None:
    real = [s3.put(f"batch/real-{i}.bin") for i in range(3)]
    paths = real + [
        f"s3://{s3.bucket}/batch/missing-{i:05d}.bin" for i in range(2 * S3_BATCH + 345)
    ]

    assert delete_files(PyArrowFileIO(s3.properties()), paths) == []

    assert sorted(len(batch) for batch in s3_faults.delete_batches) == [348, S3_BATCH, S3_BATCH]
    assert sorted(k for batch in s3_faults.delete_batches for k in batch) == sorted(
        object_key(s3, p) for p in paths
    )
    assert not any(s3.exists(object_key(s3, p)) for p in real)


# --- how many times pyarrow retries ----------------------------------------------------------


def test_retry_strategy_property_sets_pyarrow_attempts(s3: S3Bucket, s3_faults: S3Faults) -> None:
    """3 failures per request: beyond pyarrow's default 3 attempts, within compactor's 6.

    pyiceberg 0.12 passes ``s3.retry-strategy-impl`` (a class it instantiates without
    arguments) to pyarrow's S3FileSystem as its ``retry_strategy``; compactor sets it.
    """
    for name in ("plain", "patient"):
        s3.put(f"retry/{name}.bin", b"x" * 4096)
    s3_faults.throttle("GET", r"^retry/", times=3)
    plain = PyArrowFileIO(s3.properties())
    patient = PyArrowFileIO(with_s3_retries(s3.properties()))
    mark = s3.log.mark()

    with (
        pytest.raises(OSError, match=r"(SERVICE_UNAVAILABLE|SLOW_DOWN) during GetObject"),
        plain.new_input(f"s3://{s3.bucket}/retry/plain.bin").open() as stream,
    ):
        stream.read()
    with patient.new_input(f"s3://{s3.bucket}/retry/patient.bin").open() as stream:
        assert stream.read() == b"x" * 4096
    # Both got 3 SlowDowns: the plain client gave up after them, the patient one tried again.
    assert Counter(r.key for _, r in s3_faults.injected) == {
        "retry/plain.bin": 3,
        "retry/patient.bin": 3,
    }
    gets = Counter(r.key for r in s3.requests_since(mark) if r.method == "GET")
    assert gets == {"retry/plain.bin": 3, "retry/patient.bin": 4}


@pytest.mark.parametrize("size", [100, 4096])
def test_throttled_read_smaller_than_the_error_document(
    s3: S3Bucket, s3_faults: S3Faults, size: int
) -> None:
    """pyarrow is not retried when the error document does not fit the range it reads.

    pyarrow reads a range into a buffer of exactly the range's size, and the AWS SDK writes an
    error response's body into that buffer too: an error document longer than the range
    overflows it ("Failed to flush response stream"), which the SDK reports as a
    non-retryable INTERNAL_FAILURE without its HTTP status. S3's own error documents are
    some 250-350 bytes (these are ~200); compactor's run records are about as small.
    """
    s3.put("small/object.bin", b"x" * size)
    fault = s3_faults.throttle("GET", r"^small/")
    source = PyArrowFileIO(s3.properties()).new_input(f"s3://{s3.bucket}/small/object.bin")
    if size < 200:
        with (
            pytest.raises(OSError, match="INTERNAL_FAILURE.*Failed to flush response stream"),
            source.open() as stream,
        ):
            stream.read()
        assert len(fault.injected) == 1  # no second attempt
    else:
        with source.open() as stream:
            assert stream.read() == b"x" * size
        assert len(fault.injected) == 1 and s3.exists("small/object.bin")


def test_throttled_read_of_the_run_record(s3: S3Bucket, s3_faults: S3Faults) -> None:
    """pyarrow does not retry it (see above): compactor's own read of the record does."""
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    s3_faults.throttle("GET", r"/metadata/compactor-run\.[01]\.json$")

    result, table = compact_table(catalog)

    assert result.errors == [] and result.snapshot_ids
    assert_same_rows(rows, scan_rows(table))
    assert leftovers(s3, table) == []
