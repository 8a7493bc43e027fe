"""Snapshots and files around a run: format versions, time travel, no-op reruns, --where,
dry runs, and failures that must leave the table and the warehouse untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from support.rows import assert_same_rows, scan_rows
from support.runs import compact_and_verify, run_compaction
from support.tables import (
    events_table,
    list_files,
    live_data_files,
    live_entries,
    local_path,
    new_data_files,
    unreferenced_files,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")


def _events(catalog: Catalog, *, format_version: str = "2", commits: int = 5) -> Table:
    return events_table(
        catalog,
        "db.ev",
        commits=commits,
        rows_per_commit=400,
        days=2,
        properties={"format-version": format_version},
    )


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("format_version", ["1", "2"])
def test_format_versions(catalog: Catalog, format_version: str) -> None:
    table = _events(catalog, format_version=format_version)
    assert table.metadata.format_version == int(format_version)
    start = table.current_snapshot()

    _, after, _ = compact_and_verify(catalog, "db.ev")

    assert after.metadata.format_version == int(format_version)
    assert after.current_snapshot().sequence_number == (
        0 if format_version == "1" else start.sequence_number + 1
    )
    added = {f.file_path for f in new_data_files(table, after)}
    for entry in live_entries(after):
        if format_version == "1":
            assert entry.sequence_number in (None, 0)
        elif entry.data_file.file_path in added:
            # New files carry the start snapshot's data sequence number (like Java's rewrite),
            # so deletes committed concurrently after the start still apply to their rows.
            assert entry.sequence_number == start.sequence_number


def test_time_travel_to_before_compaction(catalog: Catalog) -> None:
    table = _events(catalog)
    before_id = table.metadata.current_snapshot_id
    old_files = live_data_files(table)

    _, after, before_rows = compact_and_verify(catalog, "db.ev")

    assert after.metadata.current_snapshot_id != before_id
    assert_same_rows(before_rows, after.scan(snapshot_id=before_id).to_arrow())
    assert set(live_data_files(after, after.snapshot_by_id(before_id))) == set(old_files)
    assert not set(old_files) & set(live_data_files(after))
    for path in old_files:
        assert local_path(path).is_file(), path


def test_second_run_is_a_noop(catalog: Catalog) -> None:
    _events(catalog)
    compact_and_verify(catalog, "db.ev")
    table = catalog.load_table("db.ev")
    snapshots = len(table.metadata.snapshots)
    head = table.metadata.current_snapshot_id

    result, again = run_compaction(catalog, "db.ev")

    summary = result.to_dict()
    assert summary["snapshot_id"] is None
    assert summary["groups"] == 0
    assert summary["rewritten_files"] == 0
    assert len(again.metadata.snapshots) == snapshots
    assert again.metadata.current_snapshot_id == head


@pytest.mark.usefixtures("file_kind")
def test_where_restricts_partitions(catalog: Catalog) -> None:
    table = _events(catalog)
    files_before = live_data_files(table)
    others_before = {p for p, f in files_before.items() if f.partition[1] != "eu"}
    eu_before = set(files_before) - others_before
    assert eu_before and others_before

    result, after, _ = compact_and_verify(catalog, "db.ev", where="region = 'eu'")

    files_after = live_data_files(after)
    assert {p for p, f in files_after.items() if f.partition[1] != "eu"} == others_before
    eu_after = {p for p, f in files_after.items() if f.partition[1] == "eu"}
    assert not eu_after & eu_before
    assert len(eu_after) < len(eu_before)
    assert result.to_dict()["rewritten_files"] == len(eu_before)
    assert all(g.partition[1] == "eu" for g in result.plan.groups)


def test_dry_run_writes_nothing(catalog: Catalog, warehouse: Path) -> None:
    table = _events(catalog)
    snapshots = len(table.metadata.snapshots)
    metadata_location = table.metadata_location
    listing = list_files(warehouse)

    result, after = run_compaction(catalog, "db.ev", dry_run=True)

    summary = result.to_dict()
    assert summary["dry_run"] is True
    assert summary["groups"] > 0  # there was work to do
    assert summary["plan"]["input_files"] == len(live_data_files(table))
    assert summary["snapshot_id"] is None
    assert len(after.metadata.snapshots) == snapshots
    assert after.metadata_location == metadata_location
    assert list_files(warehouse) == listing


def _sabotage(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
    else:
        size = path.stat().st_size
        path.write_bytes((b"not a parquet file " * (size // 19 + 1))[:size])


@pytest.mark.parametrize("how", ["missing", "corrupt"])
@pytest.mark.parametrize("position", ["first", "last"])
def test_bad_data_file_is_left_out_of_its_group_cleanly(
    catalog: Catalog, how: str, position: str
) -> None:
    """A missing or corrupt input is named and left as it is; its group is compacted without it,
    the others as usual.

    "first": the first file of the first group, with other groups running in parallel.
    "last": the last file of the last group, run serially, so that group has already written
    output for its other files, which must be removed.
    """
    table = _events(catalog)
    plan = run_compaction(catalog, "db.ev", dry_run=True)[0].plan
    assert len(plan.groups) > 2
    group = plan.groups[0 if position == "first" else -1]
    victim = group.files[0 if position == "first" else -1].data_file
    _sabotage(local_path(victim.file_path), how)

    result, after = run_compaction(catalog, "db.ev", parallelism=2 if position == "first" else 1)

    assert [f.path for f in result.skipped_files] == [victim.file_path]
    assert result.failures == [] and len(result.committed) == len(plan.groups)
    assert len(after.metadata.snapshots) == len(table.metadata.snapshots) + 1
    assert {f.path for f in group.files} & set(live_data_files(after)) == {victim.file_path}
    assert unreferenced_files(after) == []  # the first try's outputs too


def test_failure_keeps_rows_and_a_later_run_succeeds(catalog: Catalog) -> None:
    """After a run that skipped a corrupt file (then restored), compaction works and the rows
    are intact."""
    table = _events(catalog)
    victim = next(iter(live_data_files(table)))
    path = local_path(victim)
    original = path.read_bytes()
    before_rows = scan_rows(table)
    _sabotage(path, "corrupt")
    assert [f.path for f in run_compaction(catalog, "db.ev")[0].skipped_files] == [victim]
    path.write_bytes(original)

    _, after, rows = compact_and_verify(catalog, "db.ev")
    assert_same_rows(before_rows, rows)
