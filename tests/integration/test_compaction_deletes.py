"""Merge-on-read deletes: position and equality deletes are applied, and retired with their files."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

import compactor
from compactor.bench.sample import events_batch

from support.deletes import (
    commit_delete_files,
    write_equality_delete_file,
    write_position_delete_file,
)
from support.java_reader import assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.runs import compact_and_verify, run_compaction
from support.tables import (
    append_rows,
    events_table,
    live_data_files,
    live_delete_files,
    live_entries,
    read_data_file,
    snapshot_entries,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")


def _events(catalog: Catalog, commits: int = 4) -> Table:
    return events_table(
        catalog,
        "db.ev",
        commits=commits,
        rows_per_commit=400,
        days=1,
        properties={"format-version": "2"},
    )


def _region_files(table: Table, region: str) -> list[DataFile]:
    files = [f for f in live_data_files(table).values() if f.partition[1] == region]
    return sorted(files, key=lambda f: f.file_path)


def _event_ids_at(table: Table, data_file: DataFile, positions: list[int]) -> set[int]:
    ids = read_data_file(table, data_file).column("event_id").to_pylist()
    return {ids[p] for p in positions}


def test_position_delete_helper_hides_rows(catalog: Catalog) -> None:
    """The test helper writes real position deletes: pyiceberg's scan stops returning the rows."""
    table = _events(catalog, commits=2)
    before = scan_rows(table)
    target = _region_files(table, "eu")[0]
    gone = _event_ids_at(table, target, [0, 3])
    delete_file = write_position_delete_file(table, {target: [0, 3]})
    table = commit_delete_files(table, [delete_file])

    after = scan_rows(table)
    assert table.current_snapshot().summary.operation == Operation.DELETE
    assert after.num_rows == before.num_rows - 2
    assert not gone & set(after.column("event_id").to_pylist())
    assert gone <= set(before.column("event_id").to_pylist())
    assert set(live_delete_files(table)) == {delete_file.file_path}


@pytest.mark.usefixtures("file_kind")
def test_position_deletes_applied_and_retired(catalog: Catalog) -> None:
    table = _events(catalog)
    eu, us, ap = (_region_files(table, r) for r in ("eu", "us", "ap"))
    gone = (
        _event_ids_at(table, eu[0], [0, 5, 7])
        | _event_ids_at(table, eu[1], [1])
        | _event_ids_at(table, us[2], [3, 99])
        | _event_ids_at(table, ap[0], [2])
    )
    deletes = [
        # One file covering two data files (path bounds differ: matched by metrics).
        write_position_delete_file(table, {eu[0]: [0, 5, 7], eu[1]: [1]}),
        # One file for one data file (path bounds equal: matched by path).
        write_position_delete_file(table, {us[2]: [3, 99]}),
        # No path bounds: applies partition-wide.
        write_position_delete_file(table, {ap[0]: [2]}, path_bounds=False),
    ]
    table = commit_delete_files(table, deletes)
    pre = scan_rows(table)
    assert not gone & set(pre.column("event_id").to_pylist())
    data_before = live_data_files(table)

    result, after, before_rows = compact_and_verify(catalog, "db.ev")

    assert before_rows.num_rows == pre.num_rows == 4 * 400 - len(gone)
    summary = result.to_dict()
    assert summary["rewritten_delete_files"] == 3
    assert summary["deleted_rows_applied"] == len(gone)
    assert summary["records"] == before_rows.num_rows
    # The rewritten data files are no longer live, the deleted rows stay deleted.
    live = live_data_files(after)
    assert not set(data_before) & set(live)
    assert not gone & set(scan_rows(after).column("event_id").to_pylist())
    # The dangling delete files were removed by the same replace snapshot.
    assert live_delete_files(after) == {}
    snapshot = after.current_snapshot()
    removed = {
        e.data_file.file_path
        for e in snapshot_entries(after)
        if e.status == ManifestEntryStatus.DELETED and e.snapshot_id == snapshot.snapshot_id
    }
    assert {d.file_path for d in deletes} <= removed
    props = snapshot.summary.additional_properties
    assert props["removed-position-delete-files"] == "3"
    assert props["total-delete-files"] == "0"
    assert props["total-position-deletes"] == "0"


@pytest.mark.usefixtures("file_kind")
def test_position_deletes_outside_where_are_kept(catalog: Catalog) -> None:
    """A delete file whose data files are not rewritten stays, and its rows stay deleted."""
    table = _events(catalog)
    eu, us = _region_files(table, "eu"), _region_files(table, "us")
    eu_delete = write_position_delete_file(table, {eu[1]: [4]})
    us_delete = write_position_delete_file(table, {us[1]: [6, 8]})
    gone_us = _event_ids_at(table, us[1], [6, 8])
    table = commit_delete_files(table, [eu_delete, us_delete])

    result, after, _ = compact_and_verify(catalog, "db.ev", where="region = 'eu'")

    assert result.to_dict()["rewritten_delete_files"] == 1
    assert set(live_delete_files(after)) == {us_delete.file_path}
    assert us[1].file_path in live_data_files(after)
    assert not gone_us & set(scan_rows(after).column("event_id").to_pylist())


def _delete_event_ids(table: Table, data_file: DataFile, event_ids: list[int]) -> Table:
    """``table`` after a commit of an equality delete of ``event_ids`` in the partition of
    ``data_file``."""
    eq_delete = write_equality_delete_file(
        table,
        ["event_id"],
        [(v,) for v in event_ids],
        spec_id=data_file.spec_id,
        partition=data_file.partition,
    )
    return commit_delete_files(table, [eq_delete], operation=Operation.OVERWRITE)


def _stored_rows(table: Table, files: Iterable[DataFile]) -> pa.Table:
    """The rows stored in ``files``, no delete applied."""
    return pa.concat_tables(read_data_file(table, f) for f in files)


@pytest.mark.usefixtures("file_kind")
def test_equality_deletes_are_applied_and_retired(catalog: Catalog, java_reader: object) -> None:
    """Rows an equality delete names leave the rewritten files, and so does the delete file.

    Newer rows with a deleted key survive (the delete applies only to older data files), and
    other partitions are out of the delete's reach.
    """
    table = _events(catalog)
    old_eu = _region_files(table, "eu")
    assert len(old_eu) == 4
    victims = sorted(read_data_file(table, old_eu[0]).column("event_id").to_pylist())[:3]
    older = list(live_data_files(table).values())
    table = _delete_event_ids(table, old_eu[0], victims)
    # Two more commits, newer than the delete; one of their eu rows takes a deleted key again.
    for commit in range(4, 6):
        rows = events_batch(commit, 400, 1).to_pylist()
        if commit == 4:
            next(r for r in rows if r["region"] == "eu")["event_id"] = victims[0]
        append_rows(table, pa.Table.from_pylist(rows, table.schema().as_arrow()))
    table = catalog.load_table("db.ev")
    newer = [f for f in live_data_files(table).values() if f not in older]
    stored = _stored_rows(table, older)
    deleted = pc.and_(
        pc.equal(stored["region"], "eu"), pc.is_in(stored["event_id"], pa.array(victims))
    )
    expected = pa.concat_tables([stored.filter(pc.invert(deleted)), _stored_rows(table, newer)])
    assert len(expected) == 6 * 400 - 3
    parent = table.current_snapshot().snapshot_id

    result, after = run_compaction(catalog, "db.ev")

    assert result.plan.groups and not result.plan.skipped
    assert result.to_dict()["rewritten_delete_files"] == 1
    assert live_delete_files(after) == {}
    assert len(live_data_files(after)) < len(older) + len(newer)
    assert_same_rows(expected, _stored_rows(after, live_data_files(after).values()))
    current = after.current_snapshot().snapshot_id
    assert_java_reads_same(
        after, {None: expected, current: expected, parent: expected}, [current, parent]
    )


@pytest.mark.usefixtures("file_kind")
def test_equality_deletes_converted_to_positions_hide_the_same_rows(catalog: Catalog) -> None:
    """rewrite-deletes finds a delete's keys in the data files it reaches (in imported files
    through the table's name mapping) and writes their positions instead: the same rows are
    read, the data files are untouched, and no equality delete is left."""
    table = _events(catalog)
    old_eu = _region_files(table, "eu")
    victims = sorted(read_data_file(table, old_eu[1]).column("event_id").to_pylist())[-3:]
    table = _delete_event_ids(table, old_eu[1], victims)
    data_files = live_data_files(table)
    stored = _stored_rows(table, data_files.values())
    deleted = pc.and_(
        pc.equal(stored["region"], "eu"), pc.is_in(stored["event_id"], pa.array(victims))
    )
    expected = stored.filter(pc.invert(deleted))
    assert len(expected) == 4 * 400 - 3

    result = compactor.rewrite_deletes(table)

    after = catalog.load_table("db.ev")
    assert result.equality_conversion is not None
    assert result.equality_conversion.to_dict()["rows_matched"] == 3
    assert live_data_files(after) == data_files
    assert [f.equality_ids for f in live_delete_files(after).values()] == [None]
    assert_same_rows(expected, scan_rows(after))


@pytest.mark.usefixtures("file_kind")
def test_delete_file_spanning_two_commits_is_retired_by_the_second(catalog: Catalog) -> None:
    """Partial progress: the data files of one delete file land in groups committed apart."""
    table = _events(catalog)
    # In commit order, as the planner packs them: the first and last land in different groups.
    sequence = {e.data_file.file_path: e.sequence_number for e in live_entries(table)}
    eu = sorted(_region_files(table, "eu"), key=lambda f: sequence[f.file_path])
    gone = _event_ids_at(table, eu[0], [1]) | _event_ids_at(table, eu[-1], [2])
    spanning = write_position_delete_file(table, {eu[0]: [1], eu[-1]: [2]})
    table = commit_delete_files(table, [spanning])
    # Groups of two files: every partition's four files make two groups, committed one by one.
    pair = max(f.file_size_in_bytes for f in live_data_files(table).values()) * 2 + 1
    before = scan_rows(table)

    result, after = run_compaction(
        catalog,
        "db.ev",
        target_file_size=str(pair),
        max_group_size=str(pair),
        commit_every=1,
        max_commits=100,
    )

    eu_groups = [
        {f.path for f in g.files}
        for g in result.plan.groups
        if {f.path for f in g.files} & {f.file_path for f in eu}
    ]
    assert len(eu_groups) == 2 and all(len(g) == 2 for g in eu_groups)
    assert not any({eu[0].file_path, eu[-1].file_path} <= g for g in eu_groups)
    assert len(result.snapshot_ids) == len(result.plan.groups)
    assert live_delete_files(after) == {}
    assert result.to_dict()["rewritten_delete_files"] == 1
    assert not gone & set(scan_rows(after).column("event_id").to_pylist())
    assert_same_rows(before, scan_rows(after))


def test_right_sized_files_are_rewritten_for_their_deletes_past_spark_thresholds(
    catalog: Catalog,
) -> None:
    """Deleted rows >= --delete-ratio-threshold (0.3) of a file, or >= --delete-file-threshold
    delete files (off unless given), make a right-sized file a candidate."""
    table = _events(catalog)
    sizes = [f.file_size_in_bytes for f in live_data_files(table).values()]
    assert min(sizes) >= 0.75 * max(sizes)
    right_sized = {"target_file_size": str(max(sizes)), "allow_small_target": True}
    assert not compactor.plan(table, **right_sized).groups

    eu = _region_files(table, "eu")
    heavy, light = eu[0], eu[1]
    # 40% of one file's rows, 10% of another's: file-scoped deletes (their path bounds).
    table = commit_delete_files(
        table,
        [
            write_position_delete_file(table, {heavy: range(int(heavy.record_count * 0.4))}),
            write_position_delete_file(table, {light: range(int(light.record_count * 0.1))}),
        ],
    )
    planned = {f.path for g in compactor.plan(table, **right_sized).groups for f in g.files}
    assert planned == {heavy.file_path}
    lenient = compactor.plan(table, **right_sized, delete_ratio_threshold=0.5).groups
    assert not lenient
    by_count = compactor.plan(table, **right_sized, delete_file_threshold=1).groups
    assert {f.path for g in by_count for f in g.files} == {heavy.file_path, light.file_path}
