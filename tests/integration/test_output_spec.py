"""``--output-spec-id``: files of older partition specs are rewritten into the given spec, split
by its partitions; rows, partition values and Iceberg Java's reading stay right, files with
field ids and files imported without them (read through the table's name mapping) alike."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform

from compactor import compaction
from compactor.bench.sample import create_events_table, events_batch
from compactor.commit.committer import commit_replace
from compactor.errors import UsageError
from compactor.options import resolve_options

from support.deletes import commit_delete_files, write_equality_delete_file
from support.java_reader import assert_java_reads_same, java_read
from support.rows import assert_same_rows, scan_rows
from support.runs import DEFAULT_OPTIONS
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    assert_rows_match_partition,
    events_table,
    files_without_field_ids,
    live_data_files,
    live_delete_files,
    live_entries,
    read_data_file,
    unmapped_snapshots,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

TABLE = "db.events"


@pytest.fixture
def evolved(catalog: Catalog) -> Table:
    """Spec 0 (day, region: 3 x 4 partitions, 4 files each), then spec 1 adds bucket(4, user_id)
    and drops the day (2 more commits in it); rows appended with
    :func:`support.tables.append_rows`."""
    table = events_table(catalog, TABLE, commits=4, rows_per_commit=480)
    with table.update_spec() as update:
        update.add_field("user_id", BucketTransform(4), "user_bucket")
        update.remove_field("ts_day")
    for commit in (10, 11):
        append_rows(table, events_batch(commit=commit, rows=480, days=3))
    table = catalog.load_table(TABLE)
    assert table.metadata.default_spec_id == 1
    assert {f.spec_id for f in live_data_files(table).values()} == {0, 1}
    return table


def _compact(
    catalog: Catalog, before_commit: Callable[[Table], None] | None = None, **options: object
) -> compaction.RunResult:
    table = catalog.load_table(TABLE)
    resolved = resolve_options(
        TABLE, table.metadata.properties, **{**DEFAULT_OPTIONS, "output_spec_id": 1, **options}
    )
    return compaction.compact_table(table, resolved)


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("file_kind", [FIELD_IDS, IMPORTED], indirect=True)
def test_files_of_the_old_spec_move_into_the_new_one(catalog: Catalog, evolved: Table) -> None:
    before = scan_rows(evolved)
    old_files = [f for f in live_data_files(evolved).values() if f.spec_id == 0]

    result = _compact(catalog)

    table = catalog.load_table(TABLE)
    data = result.to_dict()
    assert data["failed_groups"] == []
    moved = [g for g in data["plan"]["groups"] if g["repartition"]]
    assert len(moved) == 1 and moved[0]["input_files"] == len(old_files)
    live = list(live_data_files(table).values())
    assert {f.spec_id for f in live} == {1}
    for data_file in live:
        assert_rows_match_partition(table, data_file)
    # The moved rows: one file per partition of spec 1 (region x bucket, nulls included);
    # the spec-1 files of each partition were compacted on their own, as Spark groups them.
    prefix = f"compactor-{result.run_id}-g{moved[0]['group_id']:04d}-"
    partitions = [tuple(f.partition) for f in live if prefix in f.file_path]
    assert len(partitions) == len(set(partitions)) == 4 * 5
    assert_same_rows(before, scan_rows(table))
    assert files_without_field_ids(table) == [], "Java compares the current rows"
    assert_java_reads_same(table, unmapped_snapshots(table))


def test_without_the_option_files_keep_their_spec(catalog: Catalog, evolved: Table) -> None:
    _compact(catalog, output_spec_id=None)
    assert {f.spec_id for f in live_data_files(catalog.load_table(TABLE)).values()} == {0, 1}


def test_an_unknown_spec_is_a_one_line_error(catalog: Catalog, evolved: Table) -> None:
    with pytest.raises(
        UsageError,
        match=r"table db\.events: output_spec_id 7: no such partition "
        r"spec \(specs: 0, 1; current: 1\)",
    ):
        _compact(catalog, output_spec_id=7)


def test_an_equality_delete_scoped_to_an_old_partition_meanwhile_refuses_the_move(
    catalog: Catalog, evolved: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the new spec's partitions the delete would no longer reach the moved rows."""
    victim = sorted(
        (f for f in live_data_files(evolved).values() if f.spec_id == 0), key=lambda f: f.file_path
    )[0]
    doomed = read_data_file(evolved, victim).column("event_id")[0].as_py()
    before = scan_rows(evolved)

    def add_equality_delete_first(table: Table, *args: object, **kwargs: object):
        other = catalog.load_table(TABLE)
        delete_file = write_equality_delete_file(
            other, ["event_id"], [(doomed,)], spec_id=0, partition=victim.partition
        )
        commit_delete_files(other, [delete_file])
        return commit_replace(table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compaction, "commit_replace", add_equality_delete_first)
    result = _compact(catalog)

    data = result.to_dict()
    refused = [f for f in data["failed_groups"] if "equality delete" in f["reason"]]
    assert len(refused) == 1 and refused[0]["kind"] == "conflict"
    table = catalog.load_table(TABLE)
    assert victim.file_path in live_data_files(table), "the moving group was not committed"
    assert any(e.data_file.spec_id == 0 for e in live_entries(table))
    expected = before.filter(pa.compute.field("event_id") != doomed)
    current = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    assert_java_reads_same(table, {None: expected, current: expected}, snapshot_ids=[current])


def test_equality_deletes_of_two_old_partitions_apply_each_to_its_own(
    catalog: Catalog, evolved: Table, java_reader: object
) -> None:
    """One moving group holds both partitions' files: each file takes its partition's deletes
    only, though their keys name rows of the other partition too."""
    old = sorted(
        (f for f in live_data_files(evolved).values() if f.spec_id == 0), key=lambda f: f.file_path
    )
    first = old[0]
    second = next(f for f in old if f.partition[0] != first.partition[0])
    table = evolved
    for data_file in (first, second):
        amounts = read_data_file(table, data_file).column("amount").drop_null()[:5].to_pylist()
        delete_file = write_equality_delete_file(
            table, ["amount"], [(a,) for a in amounts], spec_id=0, partition=data_file.partition
        )
        table = commit_delete_files(table, [delete_file])
    before_id = table.metadata.current_snapshot_id
    stored = sum(f.record_count for f in live_data_files(table).values())

    result = _compact(catalog)

    assert result.to_dict()["failed_groups"] == []
    after = catalog.load_table(TABLE)
    assert live_delete_files(after) == {}
    assert {f.spec_id for f in live_data_files(after).values()} == {1}
    current = after.metadata.current_snapshot_id
    java = java_read(after, [before_id, current])
    assert java.read(current).rows == java.read(before_id).rows
    assert java.read(before_id).row_count < stored
    kept = scan_rows(after).filter(pa.compute.field("amount").isin(amounts))
    assert kept.num_rows > 0, "rows of other partitions with the deleted amounts stay"


@pytest.mark.parametrize("version", [1, 2], ids=["void-field", "no-field"])
def test_files_move_into_a_spec_without_partition_values(catalog: Catalog, version: int) -> None:
    """Removing the only partition field leaves a void field (format 1) or none (format 2)."""
    table = create_events_table(
        catalog, TABLE, commits=3, rows_per_commit=240, properties={"format-version": str(version)}
    )
    with table.update_spec() as update:
        update.remove_field("ts_day")
        update.remove_field("region")
    table = catalog.load_table(TABLE)
    before_id = table.metadata.current_snapshot_id
    before = scan_rows(table)

    result = _compact(catalog)

    assert result.to_dict()["failed_groups"] == []
    after = catalog.load_table(TABLE)
    (moved,) = live_data_files(after).values()
    assert moved.spec_id == 1 and all(value is None for value in moved.partition)
    assert_same_rows(before, scan_rows(after))
    assert_java_reads_same(after, snapshot_ids=[before_id, after.metadata.current_snapshot_id])
