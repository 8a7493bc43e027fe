"""compactor's core scenarios over five catalog set-ups, each against its real server.

Every test here runs once per set-up of ``catalog_servers.py``: SQLite + local disk, SQLite + S3,
Iceberg's REST catalog server + S3, PostgreSQL + S3 and Glue + S3 (S3 and Glue served by moto).
The command line runs as a user would run it, against a ``.pyiceberg.yaml`` naming the catalog;
tables are written and checked with pyiceberg, files listed through the storage's own client.

- compaction (``compactor run``): a fragmented table keeps exactly its rows, with fewer files,
  and Iceberg's Java library reads the same rows, snapshots and refs as pyiceberg in every
  set-up (``tests/support/java_reader.py``: a local FileIO for local disk, S3FileIO configured
  from the table's FileIO properties for S3); an append committed while a run rewrites is kept (library
  API, an executor that appends before it rewrites);
- ``compactor expire``: expired snapshots go, and exactly the files only they reached;
- ``compactor orphans``: an old unreferenced file goes, referenced and young files stay.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.expressions import EqualTo
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

import compactor

from support.java_reader import JavaReader, assert_java_reads_same

if TYPE_CHECKING:
    from support.catalog_servers import Lake

# The servers and the parametrised ``lake`` fixture.
pytest_plugins = ("support.s3_server", "support.catalog_servers")

TABLE = "events"
REGIONS = ("eu", "us")
ROWS_PER_REGION = 25
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    NestedField(3, "payload", StringType(), required=False),
)
SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
)
DAY_MS = 86_400_000
SMALL_TARGET = ("--target-file-size", "1MiB", "--allow-small-target", "--min-input-files", "2")


# --- tables and what they hold -----------------------------------------------------------------


def batch(commit: int) -> pa.Table:
    """ROWS_PER_REGION rows in each region: one small file per partition when appended."""
    ids = [commit * 1000 + i for i in range(ROWS_PER_REGION * len(REGIONS))]
    return pa.Table.from_pylist(
        [
            {"id": i, "region": REGIONS[n % len(REGIONS)], "payload": f"c{commit}-{n}"}
            for n, i in enumerate(ids)
        ],
        schema=SCHEMA.as_arrow(),
    )


def create_table(lake: Lake, commits: int) -> tuple[Table, Counter[tuple[Any, ...]]]:
    """``<namespace>.events``, partitioned by region, after ``commits`` appends; its rows."""
    catalog = lake.catalog()
    table = catalog.create_table(lake.identifier(TABLE), SCHEMA, partition_spec=SPEC)
    written: Counter[tuple[Any, ...]] = Counter()
    for commit in range(commits):
        data = batch(commit)
        table.append(data)
        written += as_rows(data)
    return catalog.load_table(lake.identifier(TABLE)), written


def load(lake: Lake) -> Table:
    return lake.catalog().load_table(lake.identifier(TABLE))


def as_rows(data: pa.Table) -> Counter[tuple[Any, ...]]:
    """The rows of ``data`` as a multiset of tuples (columns in schema order)."""
    names = [f.name for f in SCHEMA.fields]
    return Counter(tuple(row[n] for n in names) for row in data.to_pylist())


def rows(table: Table, snapshot_id: int | None = None) -> Counter[tuple[Any, ...]]:
    """The rows a scan returns, as a multiset."""
    scan = table.scan() if snapshot_id is None else table.scan(snapshot_id=snapshot_id)
    return as_rows(scan.to_arrow())


def live_files(table: Table, snapshot: Snapshot | None = None) -> set[str]:
    """Locations of the data files live in ``snapshot`` (default: the current one)."""
    snapshot = snapshot or table.current_snapshot()
    assert snapshot is not None
    return {
        entry.data_file.file_path
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    }


def reachable(table: Table, snapshots: Sequence[Snapshot]) -> set[str]:
    """Everything ``snapshots`` reach: manifest lists, manifests and live data files."""
    found: set[str] = set()
    for snapshot in snapshots:
        found.add(snapshot.manifest_list)
        found.update(m.manifest_path for m in snapshot.manifests(table.io))
        found.update(live_files(table, snapshot))
    return found


def head(table: Table) -> Snapshot:
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return snapshot


# --- (a) compaction ----------------------------------------------------------------------------

COMMITS = 10  # 20 files of 25 rows


def test_run_compacts_a_fragmented_table(lake: Lake, java_reader: JavaReader) -> None:
    table, before_rows = create_table(lake, COMMITS)
    before_files = live_files(table)
    before = head(table)
    assert len(before_files) == COMMITS * len(REGIONS)
    assert before_rows.total() == COMMITS * ROWS_PER_REGION * len(REGIONS)

    result = lake.cli("run", *SMALL_TARGET, table=TABLE)

    table = load(lake)
    after = head(table)
    assert result["snapshot_id"] == after.snapshot_id
    assert result["failed_groups"] == []
    assert result["rewritten_files"] == len(before_files)
    assert after.summary.operation == Operation.REPLACE
    assert after.parent_snapshot_id == before.snapshot_id
    after_files = live_files(table)
    assert len(after_files) == result["added_files"] == len(REGIONS)
    assert rows(table) == before_rows
    stored = lake.storage.files(table.location())
    for location in after_files:
        assert lake.storage.key(location) in stored, f"{location} is not in storage"
    # Iceberg Java reads the table where it is stored (S3: through S3FileIO, same endpoint and
    # credentials as the table's pyiceberg FileIO), before and after the compaction.
    assert_java_reads_same(table, snapshot_ids=[after.snapshot_id, before.snapshot_id])


class AppendBeforeRewriting:
    """An executor that commits an append (another writer) after planning, before the rewrite."""

    def __init__(self, append: Callable[[], None]) -> None:
        self.inner = compactor.ThreadExecutor(1)
        self.append = append
        self.appended = False

    def run(self, tasks: Sequence[Any], cancel: Any) -> Iterator[tuple[Any, Any]]:
        self.append()
        self.appended = True
        yield from self.inner.run(tasks, cancel)

    def close(self) -> None:
        self.inner.close()


def test_append_during_a_run_is_kept(lake: Lake) -> None:
    table, before_rows = create_table(lake, 2)
    extra = batch(99)
    appended: list[int] = []

    def append() -> None:
        writer = lake.new_catalog().load_table(lake.identifier(TABLE))  # another writer
        writer.append(extra)
        appended.append(head(writer).snapshot_id)

    executor = AppendBeforeRewriting(append)
    result = compactor.compact(
        table,
        executor=executor,
        target_file_size="1MiB",
        allow_small_target=True,
        min_input_files=2,
        parallelism=1,
    ).to_dict()

    assert executor.appended and result["failed_groups"] == []
    table = load(lake)
    compaction = head(table)
    assert result["snapshot_id"] == compaction.snapshot_id
    assert compaction.summary.operation == Operation.REPLACE
    assert compaction.parent_snapshot_id == appended[0]  # committed on top of the append
    append_snapshot = table.snapshot_by_id(appended[0])
    assert append_snapshot is not None
    appended_files = live_files(table, append_snapshot) - live_files(
        table, table.snapshot_by_id(append_snapshot.parent_snapshot_id)
    )
    assert appended_files and appended_files <= live_files(table)
    assert rows(table) == before_rows + as_rows(extra)


# --- (b) expire --------------------------------------------------------------------------------


def test_expire_deletes_only_what_expired_snapshots_reached(lake: Lake) -> None:
    table, written = create_table(lake, 2)
    # Dropped below: then only the expired snapshots reach these.
    eu_files = {f for f in live_files(table) if "/region=eu/" in f}
    table.delete(EqualTo("region", "eu"))
    table = load(lake)
    current = head(table)
    assert current.summary.operation == Operation.DELETE
    kept_rows = rows(table)
    assert kept_rows == Counter({row: n for row, n in written.items() if row[1] != "eu"})
    assert kept_rows.total() == 2 * ROWS_PER_REGION
    expired = [s for s in table.metadata.snapshots if s.snapshot_id != current.snapshot_id]
    assert len(expired) == 2  # the appends
    doomed = reachable(table, expired) - reachable(table, [current])
    assert eu_files <= doomed and eu_files.isdisjoint(live_files(table))
    storage = lake.storage
    stored_before = storage.files(table.location())
    assert {storage.key(f) for f in doomed} <= set(stored_before)

    result = lake.cli("expire", "--older-than", "0s", table=TABLE)

    table = load(lake)
    assert [s.snapshot_id for s in table.metadata.snapshots] == [current.snapshot_id]
    assert result["snapshots_expired"] == len(expired)
    assert result["failed"] == []
    assert result["files_deleted"] == len(doomed)
    assert result["deleted"]["data_files"]["files"] == len(eu_files)
    stored_after = storage.files(table.location())
    # Exactly the files only expired snapshots reached left storage; the only new file is the
    # expiry commit's table metadata.
    assert set(stored_before) - set(stored_after) == {storage.key(f) for f in doomed}
    new = set(stored_after) - set(stored_before)
    assert new == {storage.key(table.metadata_location)}
    assert {storage.key(f) for f in reachable(table, [current])} <= set(stored_after)
    assert rows(table) == kept_rows


# --- (c) orphans -------------------------------------------------------------------------------


def test_orphans_deletes_an_old_unreferenced_file(lake: Lake) -> None:
    table, kept_rows = create_table(lake, 1)
    storage = lake.storage
    location = table.location()
    legit = set(storage.files(location))  # data, manifests, manifest lists, metadata.json
    junk = [
        storage.put(f"{location}/data/region=eu/00000-orphan.parquet", b"PAR1 junk"),
        storage.put(f"{location}/metadata/orphan-m0.avro", b"junk"),
    ]
    sibling = storage.put(f"{location}_old/data/00000-orphan.parquet", b"PAR1 junk")
    young: str | None = None
    if storage.can_age:
        # Everything is old: only the metadata's references may protect a file now.
        old = int(time.time() * 1000) - 10 * DAY_MS
        storage.age(location, old)
        storage.age(sibling, old)
        young = storage.put(f"{location}/data/region=us/00001-young.parquet", b"PAR1 new")
        args: tuple[str, ...] = ("--older-than", "3d")
    else:
        # S3 stamps objects itself: a cut-off ahead of now makes every object old enough.
        cutoff = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        args = ("--older-than", cutoff.isoformat(timespec="seconds"), "--allow-short-older-than")

    result = lake.cli("orphans", *args, table=TABLE)

    assert result["failed"] == [] and result["refused"] == []
    assert result["orphan_files"] == len(junk)
    assert result["files_deleted"] == len(junk)
    stored = set(storage.files(location))
    for location_ in junk:
        assert storage.key(location_) not in stored
    assert legit <= stored
    assert storage.exists(sibling)
    if young is not None:
        assert storage.exists(young)
        assert result["skipped_too_young"] == 1
    assert rows(load(lake)) == kept_rows
