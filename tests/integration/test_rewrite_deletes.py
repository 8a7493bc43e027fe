"""rewrite-deletes: position delete files merged per partition, dangling rows dropped, rows kept.

Every test checks what readers delete before and after: pyiceberg's scan, and Iceberg Java's read
(an independent implementation of the spec's delete rules) of the current state. The tables are
pyiceberg tables with position deletes written by the test helpers, and one table written by
Iceberg Java itself (Spark-style merge-on-read).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from compactor.commit.inflight import read_record
from compactor.errors import CommitStateUnknownError, UnsupportedTableError
from compactor.iceberg.delete_files import commit_manifests
from compactor.iceberg.pyiceberg_compat import manifest_writer
from compactor.maintain import delete_rewrite
from compactor.maintain.delete_rewrite import rewrite_position_deletes

from support.cli import assert_one_error_line, embedded
from support.cli import compactor as compactor_cli
from support.deletes import commit_delete_files, write_position_delete_file
from support.java_reader import JavaReader, assert_java_reads_same, java_read
from support.java_writer import read_expected, write_cdc_table
from support.rows import assert_same_rows, scan_rows
from support.tables import (
    assert_manifests_consistent,
    list_files,
    live_data_files,
    live_delete_files,
    live_entries,
    unreferenced_files,
)

FILE_PATH_ID = 2147483546
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
)
SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
)


def _table(catalog: Catalog, name: str = "db.t", appends: int = 3) -> Table:
    """Partitioned by region (a, b); each append adds one 20-row data file per region."""
    table = catalog.create_table(
        name, SCHEMA, partition_spec=SPEC, properties={"format-version": "2"}
    )
    for commit in range(appends):
        ids = range(commit * 100, commit * 100 + 40)
        table.append(
            pa.table(
                {"id": list(ids), "region": ["a" if i % 2 else "b" for i in ids]},
                schema=SCHEMA.as_arrow(),
            )
        )
    return table


def _files(table: Table, region: str) -> list[DataFile]:
    found = [f for f in live_data_files(table).values() if f.partition[0] == region]
    return sorted(
        found, key=lambda f: min(pq.ParquetFile(_local(f.file_path)).read()["id"].to_pylist())
    )


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://").removeprefix("file:"))


def _delete(table: Table, deletes: dict[DataFile, list[int]]) -> DataFile:
    """Commit one position delete file; returns it."""
    delete_file = write_position_delete_file(table, deletes)
    commit_delete_files(table, [delete_file])
    return delete_file


def _entries_by_path(table: Table) -> dict[str, ManifestEntry]:
    return {e.data_file.file_path: e for e in live_entries(table)}


def _rows_of(delete_file: DataFile) -> list[tuple[str, int]]:
    data = pq.ParquetFile(_local(delete_file.file_path)).read()
    return list(zip(data["file_path"].to_pylist(), data["pos"].to_pylist(), strict=True))


def _java_rows(table: Table) -> Counter[str]:
    return java_read(table, []).current.rows


def _assert_rows_kept(table: Table, before: pa.Table, java_before: Counter[str]) -> None:
    assert_same_rows(before, scan_rows(table))
    assert _java_rows(table) == java_before
    assert_java_reads_same(table, snapshot_ids=[])


def _remove_files(table: Table, files: list[DataFile]) -> Table:
    """Remove data files with pyiceberg's own overwrite (no rows added)."""
    with table.transaction() as tx, tx.update_snapshot().overwrite() as overwrite:
        for data_file in files:
            overwrite.delete_data_file(data_file)
    table.refresh()
    return table


def _remove_delete_file(table: Table, delete_file: DataFile) -> None:
    """Another writer's commit that drops one position delete file (status DELETED)."""
    metadata = table.metadata
    head = table.current_snapshot()
    assert head is not None
    snapshot_id = metadata.new_snapshot_id()
    locations = table.location_provider()
    manifests = []
    for manifest in head.manifests(table.io):
        entries = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if not any(e.data_file.file_path == delete_file.file_path for e in entries):
            manifests.append(manifest)
            continue
        output = table.io.new_output(locations.new_metadata_location(f"{uuid.uuid4()}-x.avro"))
        with manifest_writer(
            ManifestContent.DELETES,
            2,
            metadata.specs()[manifest.partition_spec_id],
            metadata.schema(),
            output,
            snapshot_id,
            "deflate",
        ) as writer:
            for e in entries:
                gone = e.data_file.file_path == delete_file.file_path
                writer.add_entry(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.DELETED
                        if gone
                        else ManifestEntryStatus.EXISTING,
                        snapshot_id=snapshot_id if gone else e.snapshot_id,
                        sequence_number=e.sequence_number,
                        file_sequence_number=e.file_sequence_number,
                        data_file=e.data_file,
                    )
                )
        manifests.append(writer.to_manifest_file())
    commit_manifests(table, snapshot_id, manifests, Summary(operation=Operation.DELETE))


def _position_deletes(table: Table) -> dict[str, DataFile]:
    return {
        p: f
        for p, f in live_delete_files(table).items()
        if f.content == DataFileContent.POSITION_DELETES
    }


# --------------------------------------------------------------------------------------------
# A table written by Iceberg Java
# --------------------------------------------------------------------------------------------


def test_java_merge_on_read_table_keeps_its_rows(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    location = tmp_path / "mor"
    table = catalog.register_table(("db", "mor"), write_cdc_table("merge-on-read", location, 2))
    expected = read_expected(location).rows
    assert _java_rows(table) == expected
    data_before = {p: e.sequence_number for p, e in _entries_by_path(table).items()}
    data_before = {p: s for p, s in data_before.items() if p in live_data_files(table)}
    deletes_before = _position_deletes(table)
    seq_before = {p: e.sequence_number for p, e in _entries_by_path(table).items()}
    partitions = {(f.spec_id, f.partition) for f in deletes_before.values()}
    assert len(deletes_before) > len(partitions)

    result = rewrite_position_deletes(table, "db.mor")

    summary = result.to_dict()
    table = catalog.load_table("db.mor")
    assert summary["snapshot_id"] == table.current_snapshot().snapshot_id
    assert table.current_snapshot().summary.operation == Operation.REPLACE
    assert table.current_snapshot().summary["compactor.version"]
    assert _java_rows(table) == expected
    deletes_after = _position_deletes(table)
    by_partition = Counter((f.spec_id, f.partition) for f in deletes_after.values())
    assert max(by_partition.values()) <= 1 and len(deletes_after) <= len(partitions)
    assert summary["files_removed"] == len(deletes_before) - len(
        set(deletes_before) & set(deletes_after)
    )
    assert summary["delete_files_after"]["position"] == len(deletes_after)
    # Data files untouched: same paths, same data sequence numbers.
    entries = _entries_by_path(table)
    assert {p: entries[p].sequence_number for p in live_data_files(table)} == data_before
    # Each new file: sorted, unique rows, the replaced files' max sequence number, full bounds.
    for path, delete_file in deletes_after.items():
        if path in deletes_before:
            continue
        rows = _rows_of(delete_file)
        assert rows == sorted(set(rows))
        assert delete_file.record_count == len(rows)
        replaced = [
            d
            for d in deletes_before.values()
            if (d.spec_id, d.partition) == (delete_file.spec_id, delete_file.partition)
        ]
        assert entries[path].sequence_number == max(seq_before[d.file_path] for d in replaced)
        assert delete_file.lower_bounds[FILE_PATH_ID] == rows[0][0].encode()
        assert delete_file.upper_bounds[FILE_PATH_ID] == rows[-1][0].encode()
    leftovers = [p for p in unreferenced_files(table) if not p.endswith("version-hint.text")]
    assert leftovers == []
    assert read_record(table) is None


# --------------------------------------------------------------------------------------------
# Dangling rows
# --------------------------------------------------------------------------------------------


def test_rows_of_removed_data_files_are_dropped(catalog: Catalog, java_reader: JavaReader) -> None:
    table = _table(catalog)
    a1, a2, _ = _files(table, "a")
    b1, _, _ = _files(table, "b")
    d1 = _delete(table, {a1: [0, 1]})
    d2 = _delete(table, {a1: [2], a2: [3, 4]})
    d3 = _delete(table, {a2: [3, 5]})  # pos 3 deleted twice
    db = _delete(table, {b1: [0]})
    table = _remove_files(table, [a1, b1])  # d1 and db now apply to nothing
    before, java_before = scan_rows(table), _java_rows(table)
    seq_d3 = _entries_by_path(table)[d3.file_path].sequence_number

    result = rewrite_position_deletes(table, "db.t")

    table.refresh()
    _assert_rows_kept(table, before, java_before)
    summary = result.to_dict()
    assert summary["files_removed"] == 4 and summary["files_added"] == 1
    assert summary["dangling_rows_dropped"] == 4  # a1's 0, 1, 2 and b1's 0
    assert summary["duplicate_rows_dropped"] == 1
    assert summary["delete_files_before"]["position"] == 4
    assert summary["delete_files_after"]["position"] == 1
    deletes = _position_deletes(table)
    assert not {d1.file_path, d2.file_path, d3.file_path, db.file_path} & set(deletes)
    (new,) = deletes.values()
    assert _rows_of(new) == [(a2.file_path, 3), (a2.file_path, 4), (a2.file_path, 5)]
    assert new.partition[0] == "a" and "compactor-" in new.file_path
    assert new.lower_bounds[FILE_PATH_ID] == new.upper_bounds[FILE_PATH_ID]
    entry = _entries_by_path(table)[new.file_path]
    assert entry.sequence_number == seq_d3  # the largest of d1, d2, d3
    assert entry.status == ManifestEntryStatus.ADDED
    assert unreferenced_files(table) == []
    assert_manifests_consistent(table)


def test_a_re_added_path_is_not_hit_by_an_older_delete(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    """A data file removed and re-added at the same path: the old delete must stay dangling."""
    table = _table(catalog)
    a1, a2, _ = _files(table, "a")
    old = _delete(table, {a1: [0, 1, 2]})
    table = _remove_files(table, [a1])
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(a1)  # same path, higher sequence number than ``old``
    table.refresh()
    newer = _delete(table, {a2: [7]})  # the group's max sequence number exceeds a1's
    entries = _entries_by_path(table)
    assert entries[old.file_path].sequence_number < entries[a1.file_path].sequence_number
    assert entries[a1.file_path].sequence_number < entries[newer.file_path].sequence_number
    before, java_before = scan_rows(table), _java_rows(table)
    assert len(before) == 3 * 40 - 1  # only newer's row is deleted

    result = rewrite_position_deletes(table, "db.t")

    table.refresh()
    _assert_rows_kept(table, before, java_before)
    assert result.to_dict()["dangling_rows_dropped"] == 3
    (new,) = _position_deletes(table).values()
    assert _rows_of(new) == [(a2.file_path, 7)]
    assert _entries_by_path(table)[new.file_path].sequence_number == (
        entries[newer.file_path].sequence_number
    )


def test_new_delete_files_roll_at_the_target_size(catalog: Catalog) -> None:
    table = catalog.create_table(
        "db.big", SCHEMA, partition_spec=SPEC, properties={"format-version": "2"}
    )
    for commit in range(2):
        ids = range(commit * 10_000, commit * 10_000 + 6000)
        table.append(pa.table({"id": list(ids), "region": ["a"] * 6000}, schema=SCHEMA.as_arrow()))
    f1, f2 = _files(table, "a")
    _delete(table, {f1: range(0, 6000, 2), f2: range(1, 3000, 2)})
    _delete(table, {f2: range(2999, 6000, 2), f1: range(0, 100, 2)})  # 51 duplicates
    before = scan_rows(table)

    result = rewrite_position_deletes(table, "db.big", target_file_size=4096)

    table.refresh()
    assert_same_rows(before, scan_rows(table))
    new = sorted(_position_deletes(table).values(), key=lambda d: d.lower_bounds[FILE_PATH_ID])
    assert len(new) >= 2 and len(new) == result.files_added
    rows = [row for d in sorted(new, key=_rows_of) for row in _rows_of(d)]
    assert rows == sorted(set(rows)) and len(rows) == 6000
    assert result.to_dict()["duplicate_rows_dropped"] == 51
    assert all(d.file_size_in_bytes < 3 * 4096 for d in new)


def test_a_single_delete_file_without_dangling_rows_is_left_alone(catalog: Catalog) -> None:
    table = _table(catalog, appends=2)
    a1, _ = _files(table, "a")
    kept = _delete(table, {a1: [1, 2]})
    metadata_location = table.metadata_location

    result = rewrite_position_deletes(table, "db.t")

    assert result.snapshot_id is None and result.groups == []
    assert result.skipped == {delete_rewrite.SINGLE_FILE: 1}
    table.refresh()
    assert table.metadata_location == metadata_location
    assert set(_position_deletes(table)) == {kept.file_path}


# --------------------------------------------------------------------------------------------
# Concurrency, dry run, unknown commit state, v3
# --------------------------------------------------------------------------------------------


def test_concurrent_removal_of_a_replaced_delete_file_refuses_its_partition(
    catalog: Catalog, warehouse: Path, monkeypatch: pytest.MonkeyPatch, java_reader: JavaReader
) -> None:
    table = _table(catalog)
    a1, a2, _ = _files(table, "a")
    b1, b2, _ = _files(table, "b")
    da1 = _delete(table, {a1: [0]})
    da2 = _delete(table, {a2: [1]})
    db1 = _delete(table, {b1: [2]})
    db2 = _delete(table, {b2: [3]})
    concurrent: dict[str, object] = {}

    def note_outputs(t: Table, *args, **kwargs):
        concurrent["outputs"] = {
            d.file_path for g in args[3] for d in g.outputs if g.partition[0] == "a"
        }
        assert all(_local(p).exists() for p in concurrent["outputs"])
        return original(t, *args, **kwargs)

    def other_writer_first(t: Table, requirements: tuple, updates: tuple):
        # Just before the rewrite's first catalog call, after it last read the table.
        if "rows" not in concurrent:
            other = catalog.load_table("db.t")
            concurrent["rows"] = None
            _remove_delete_file(other, da2)
            concurrent["rows"] = scan_rows(other)
            concurrent["java"] = _java_rows(other)
        return commit_table(t, requirements, updates)

    original = delete_rewrite.commit_delete_rewrite
    commit_table = catalog.commit_table
    monkeypatch.setattr(delete_rewrite, "commit_delete_rewrite", note_outputs)
    monkeypatch.setattr(catalog, "commit_table", other_writer_first)

    result = rewrite_position_deletes(table, "db.t")

    table.refresh()
    _assert_rows_kept(table, concurrent["rows"], concurrent["java"])
    (reason,) = result.conflicts.values()
    assert da2.file_path in reason and "removed by snapshot" in reason
    assert result.attempts == 2  # the stale head failed the catalog's check; re-validated
    assert [g.partition[0] for g in result.committed] == ["b"]
    deletes = _position_deletes(table)
    assert da1.file_path in deletes and da2.file_path not in deletes
    assert db1.file_path not in deletes and db2.file_path not in deletes
    assert len(deletes) == 2
    # Partition a's output was deleted; nothing is left unreferenced.
    assert concurrent["outputs"]
    assert not any(_local(p).exists() for p in concurrent["outputs"])
    assert unreferenced_files(table) == []
    assert read_record(table) is None


def test_concurrent_removal_of_a_data_file_refuses_its_partition(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(catalog)
    a1, a2, _ = _files(table, "a")
    da1 = _delete(table, {a1: [0]})
    da2 = _delete(table, {a2: [1]})

    def commit_after_other_writer(t: Table, *args, **kwargs):
        _remove_files(catalog.load_table("db.t"), [a2])
        return original(t, *args, **kwargs)

    original = delete_rewrite.commit_delete_rewrite
    monkeypatch.setattr(delete_rewrite, "commit_delete_rewrite", commit_after_other_writer)

    result = rewrite_position_deletes(table, "db.t")

    assert result.snapshot_id is None and result.committed == []
    (reason,) = result.conflicts.values()
    assert a2.file_path in reason and "was removed by snapshot" in reason
    table.refresh()
    assert set(_position_deletes(table)) == {da1.file_path, da2.file_path}
    assert unreferenced_files(table) == []
    assert read_record(table) is None


def test_where_limits_the_rewrite_to_matching_partitions(catalog: Catalog) -> None:
    table = _table(catalog)
    a1, a2, _ = _files(table, "a")
    b1, b2, _ = _files(table, "b")
    kept = {_delete(table, {a1: [0]}).file_path, _delete(table, {a2: [0]}).file_path}
    _delete(table, {b1: [0]})
    _delete(table, {b2: [0]})
    before = scan_rows(table)

    result = rewrite_position_deletes(table, "db.t", where="region = 'b'")

    assert [g.partition[0] for g in result.committed] == ["b"]
    table.refresh()
    deletes = _position_deletes(table)
    assert len(deletes) == 3 and kept <= set(deletes)
    assert_same_rows(before, scan_rows(table))
    assert_manifests_consistent(table)


def test_dry_run_writes_nothing(catalog: Catalog, warehouse: Path) -> None:
    table = _table(catalog)
    a1, a2, _ = _files(table, "a")
    _delete(table, {a1: [0]})
    _delete(table, {a2: [1], a1: [0]})
    files = list_files(warehouse)
    metadata_location = table.metadata_location

    result = rewrite_position_deletes(table, "db.t", dry_run=True)

    summary = result.to_dict()
    assert summary["dry_run"] and summary["snapshot_id"] is None
    assert summary["files_removed"] == 2 and summary["files_added"] == 1
    assert summary["duplicate_rows_dropped"] == 1
    assert summary["delete_files_after"]["position"] == 1
    assert list_files(warehouse) == files
    table.refresh()
    assert table.metadata_location == metadata_location


def test_unknown_commit_state_keeps_every_file_for_the_next_run(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(catalog, appends=2)
    a1, a2 = _files(table, "a")
    _delete(table, {a1: [0]})
    _delete(table, {a2: [1]})
    before = scan_rows(table)

    def unknown(*args, **kwargs):
        raise CommitStateUnknownException("gateway timeout")

    monkeypatch.setattr(table.catalog, "commit_table", unknown)
    with pytest.raises(CommitStateUnknownError, match="db.t"):
        rewrite_position_deletes(table, "db.t")
    monkeypatch.undo()
    table = catalog.load_table("db.t")
    leftovers = unreferenced_files(table)
    assert any("-deletes.parquet" in p for p in leftovers)  # kept: the commit might land
    assert read_record(table) is not None  # left, expired, for the next run

    result = rewrite_position_deletes(table, "db.t")  # recovers, then rewrites

    assert sorted(result.recovered_files)
    table.refresh()
    assert result.snapshot_id is not None and len(_position_deletes(table)) == 1
    assert_same_rows(before, scan_rows(table))
    assert unreferenced_files(table) == []


def test_format_v3_is_refused_and_left_as_it_was(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table = catalog.register_table(("db", "dv"), write_cdc_table("dv", tmp_path / "dv", 3))
    metadata_location = table.metadata_location
    with pytest.raises(UnsupportedTableError, match="db.dv.*format version 3"):
        rewrite_position_deletes(table, "db.dv")
    assert catalog.load_table("db.dv").metadata_location == metadata_location
    assert read_record(table) is None


def _cli_table(home: Path) -> tuple[Table, Snapshot]:
    """``db.t`` of the embedded catalog at ``home``: two files, each with a position delete
    file of its own; and its head."""
    catalog = embedded(home)
    catalog.create_namespace("db")
    table = _table(catalog, appends=2)
    a1, a2 = _files(table, "a")
    _delete(table, {a1: [1]})
    _delete(table, {a2: [2]})
    table.refresh()
    head = table.current_snapshot()
    assert head is not None
    return table, head


def test_a_missing_branch_a_tag_or_a_memory_limit_too_low_is_one_error_line(
    tmp_path: Path,
) -> None:
    table, head = _cli_table(tmp_path)
    table.manage_snapshots().create_tag(head.snapshot_id, "v1").commit()
    metadata_location = embedded(tmp_path).load_table("db.t").metadata_location
    command = ("rewrite-deletes", "--table", "db.t")

    assert_one_error_line(
        compactor_cli(tmp_path, *command, "--branch", "nope"),
        2,
        "table db.t: no --branch 'nope' (branches: main)",
    )
    assert_one_error_line(
        compactor_cli(tmp_path, *command, "--branch", "v1", "--json"),
        2,
        "table db.t: 'v1' is a tag",
    )
    assert_one_error_line(
        compactor_cli(tmp_path, *command, "--memory-limit", "100MiB"),
        2,
        "--memory-limit",
        "below the minimum",
    )
    assert embedded(tmp_path).load_table("db.t").metadata_location == metadata_location


def test_a_branch_run_names_its_branch_in_each_line(tmp_path: Path) -> None:
    table, head = _cli_table(tmp_path)
    table.manage_snapshots().create_branch(head.snapshot_id, "b").commit()

    ran = compactor_cli(tmp_path, "rewrite-deletes", "--table", "db.t", "--branch", "b")

    assert ran.returncode == 0, ran.stderr
    assert "db.t (branch b): replaced 2 position delete files with 1;" in ran.stdout
    assert embedded(tmp_path).load_table("db.t").current_snapshot() == head, "main is untouched"
