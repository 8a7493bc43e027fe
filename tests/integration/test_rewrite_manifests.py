"""rewrite-manifests: many small manifests into few, clustered by partition, nothing else changed.

Every test checks that the table reads the same: the live files and every entry's snapshot id,
data and file sequence numbers (and, format 3, first row id) before and after, and Iceberg
Java's read of the rows and of every manifest. Concurrent writers commit through their own
table object just before the rewrite's first catalog call, as a streaming job would.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

import compactor
from compactor.commit.inflight import read_record
from compactor.errors import CommitStateUnknownError, UsageError
from compactor.iceberg.pyiceberg_compat import (
    delete_file_key,
    first_row_id,
    manifest_entries,
    snapshot_manifests,
)
from compactor.iceberg.value_keys import partition_key
from compactor.planning.manifest_groups import plan_manifest_rewrite

from support.cli import assert_one_error_line, embedded
from support.cli import compactor as run_cli
from support.deletes import commit_delete_files, write_position_delete_file
from support.java_reader import JavaReader, assert_java_reads_same, java_read
from support.java_writer import read_expected, write_cdc_table
from support.json_output import assert_documented
from support.rows import assert_same_rows, scan_rows
from support.tables import list_files, live_data_files, unreferenced_files

TABLE = "db.t"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
)
SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
)
REGIONS = ["a", "b", "c", "d", "e"]
# Small enough that 60 entries fill more than one manifest (an entry takes ~60 bytes, a
# manifest's header ~4 KB).
TARGET = 6000


def _table(catalog: Catalog, commits: int = 60, name: str = TABLE, version: str = "2") -> Table:
    """One single-row append per commit, regions in turn: one manifest per commit, every
    manifest's partition interleaved with the others'."""
    table = catalog.create_table(
        name,
        SCHEMA,
        partition_spec=SPEC,
        properties={"format-version": version, "commit.manifest.target-size-bytes": str(TARGET)},
    )
    for n in range(commits):
        _append(table, [n])
    return table


def _append(table: Table, ids: list[int]) -> None:
    table.append(
        pa.table(
            {"id": ids, "region": [REGIONS[i % len(REGIONS)] for i in ids]},
            schema=SCHEMA.as_arrow(),
        )
    )


def _entries(table: Table) -> dict[str, tuple[Any, ...]]:
    """Every live entry of the current snapshot: its content, snapshot id, data and file
    sequence numbers, first row id and record count, by file (deletion vectors by blob)."""
    version = table.metadata.format_version
    snapshot = table.current_snapshot()
    assert snapshot is not None
    found = {}
    for manifest in snapshot_manifests(table.io, snapshot, version):
        for entry in manifest_entries(table.io, manifest, version):
            data_file = entry.data_file
            found[delete_file_key(data_file)] = (
                manifest.content,
                entry.snapshot_id,
                entry.sequence_number,
                entry.file_sequence_number,
                first_row_id(data_file) if version >= 3 else None,
                data_file.record_count,
            )
    return found


def _manifests(table: Table) -> list[Any]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot_manifests(table.io, snapshot, table.metadata.format_version)


def _counts(table: Table) -> Counter[str]:
    return Counter(m.content.name.lower() for m in _manifests(table))


def _assert_clustered(table: Table, content: ManifestContent = ManifestContent.DATA) -> None:
    """The manifests of ``content`` hold partitions in runs: each partition in one manifest, or
    in consecutive manifests where it spans several."""
    version = table.metadata.format_version
    seen: list[set[Any]] = []
    for manifest in _manifests(table):
        if manifest.content == content:
            entries = manifest_entries(table.io, manifest, version)
            seen.append({partition_key(e.data_file.partition) for e in entries})
    for n, partitions in enumerate(seen):
        for later in seen[n + 2 :]:
            assert not partitions & later, "a partition is split between distant manifests"
        if n + 1 < len(seen):
            assert len(partitions & seen[n + 1]) <= 1


def _assert_java_reads_every_manifest(table: Table, rows: Counter[str], live: Counter[str]) -> None:
    """Java reads the current rows and every manifest; the new snapshot's manifests hold only
    EXISTING entries, its live files are those before."""
    java = assert_java_reads_same(table, snapshot_ids=[])
    assert java.current.rows == rows
    assert java.live_files() == live
    by_path = {m.path: m for m in java.manifests}
    snapshot = table.current_snapshot()
    assert snapshot is not None
    for path in java.snapshots[snapshot.snapshot_id].manifests:
        manifest = by_path[path]
        assert (manifest.added, manifest.deleted) == (0, 0) and manifest.existing > 0


def _with_concurrent(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, concurrent: Callable[[Table], None]
) -> list[int]:
    """``concurrent`` commits through another table object just before the rewrite's first
    catalog call, after the rewrite last read the table."""
    calls: list[int] = []
    commit_table = catalog.commit_table

    def concurrent_writer_first(table: Table, requirements: tuple, updates: tuple) -> Any:
        if not calls:
            calls.append(1)
            concurrent(catalog.load_table(TABLE))
        return commit_table(table, requirements, updates)

    monkeypatch.setattr(catalog, "commit_table", concurrent_writer_first)
    return calls


# --------------------------------------------------------------------------------------------
# What a rewrite keeps
# --------------------------------------------------------------------------------------------


def test_rows_files_and_sequence_numbers_are_unchanged_and_java_reads_every_manifest(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    table = _table(catalog)
    rows = scan_rows(table)
    entries = _entries(table)
    java_before = java_read(table, [])
    summary_before = table.current_snapshot().summary.additional_properties
    assert _counts(table) == {"data": 60}

    result = compactor.rewrite_manifests(table)

    data = result.to_dict()
    assert data["snapshot_id"] is not None and data["conflicts"] == []
    assert data["manifests_before"] == {"data": 60, "deletes": 0}
    assert data["entries"] == {"data": 60, "deletes": 0} and data["entries_rewritten"] == 60
    table = catalog.load_table(TABLE)
    after = _counts(table)
    assert data["manifests_after"] == {"data": after["data"], "deletes": 0}
    assert 1 < after["data"] < 10  # several manifests of the small target, not one per commit
    assert all(m.manifest_length <= TARGET * 1.1 for m in _manifests(table))
    # Every entry: same file, snapshot id, data and file sequence numbers, as EXISTING.
    assert _entries(table) == entries
    assert len({e[2] for e in entries.values()}) == 60  # one sequence number per commit
    for manifest in _manifests(table):
        assert manifest.added_snapshot_id == data["snapshot_id"]
        assert manifest.added_files_count == 0 and manifest.deleted_files_count == 0
        for entry in manifest_entries(table.io, manifest, 2, discard_deleted=False):
            assert entry.status == ManifestEntryStatus.EXISTING
    _assert_clustered(table)
    snapshot = table.current_snapshot()
    assert snapshot.summary.operation == Operation.REPLACE
    properties = snapshot.summary.additional_properties
    assert properties["manifests-replaced"] == "60" and properties["entries-processed"] == "60"
    assert properties["compactor.action"] == "rewrite-manifests"
    for total in ("total-data-files", "total-records", "total-files-size", "total-delete-files"):
        assert properties[total] == summary_before[total]
    assert not [k for k in properties if k.startswith(("added-", "deleted-"))]
    assert_same_rows(rows, scan_rows(table))
    _assert_java_reads_every_manifest(table, java_before.current.rows, java_before.live_files())
    assert unreferenced_files(table) == [] and read_record(table) is None


def test_a_format_v1_table_is_rewritten_too(catalog: Catalog, java_reader: JavaReader) -> None:
    table = _table(catalog, commits=30, version="1")
    rows = scan_rows(table)
    entries = _entries(table)
    java_before = java_read(table, [])

    result = compactor.rewrite_manifests(table, target_manifest_size="1MiB")

    assert result.to_dict()["manifests_after"] == {"data": 1, "deletes": 0}
    table = catalog.load_table(TABLE)
    assert _entries(table) == entries
    assert_same_rows(rows, scan_rows(table))
    _assert_java_reads_every_manifest(table, java_before.current.rows, java_before.live_files())


def test_a_second_run_is_a_no_op(catalog: Catalog) -> None:
    table = _table(catalog)
    compactor.rewrite_manifests(table)
    table = catalog.load_table(TABLE)
    metadata_location = table.metadata_location

    again = compactor.rewrite_manifests(table)

    data = again.to_dict()
    assert data["snapshot_id"] is None and data["groups"] == []
    assert data["groups_in_order"] == 1 and data["manifests_replaced"] == 0
    assert data["manifests_after"] == data["manifests_before"]
    assert catalog.load_table(TABLE).metadata_location == metadata_location


def test_an_append_after_a_rewrite_makes_the_manifests_overlap_again(catalog: Catalog) -> None:
    table = _table(catalog, commits=20)
    compactor.rewrite_manifests(table, target_manifest_size="1MiB")
    table = catalog.load_table(TABLE)
    assert _counts(table) == {"data": 1}
    _append(table, [100, 101])
    assert plan_manifest_rewrite(table, 1 << 20).groups  # two manifests over one range

    result = compactor.rewrite_manifests(table, target_manifest_size="1MiB")

    assert result.to_dict()["manifests_replaced"] == 2
    assert _counts(catalog.load_table(TABLE)) == {"data": 1}


def test_delete_manifests_are_rewritten_separately_and_deletes_still_apply(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    table = _table(catalog, commits=30)
    files = sorted(live_data_files(table).values(), key=lambda f: f.file_path)
    for data_file in files[:12]:  # one delete manifest per commit
        table = commit_delete_files(table, [write_position_delete_file(table, {data_file: [0]})])
    rows = scan_rows(table)
    assert rows.num_rows == 18
    entries = _entries(table)
    java_before = java_read(table, [])
    assert _counts(table) == {"data": 30, "deletes": 12}

    result = compactor.rewrite_manifests(table, target_manifest_size="1MiB")

    data = result.to_dict()
    assert data["manifests_before"] == {"data": 30, "deletes": 12}
    assert data["manifests_after"] == {"data": 1, "deletes": 1}
    assert data["entries"] == {"data": 30, "deletes": 12}
    assert sorted((g["content"], g["manifests_before"]) for g in data["groups"]) == [
        ("data", 30),
        ("deletes", 12),
    ]
    table = catalog.load_table(TABLE)
    assert _counts(table) == {"data": 1, "deletes": 1}
    # Delete files keep their data sequence numbers: each still applies to exactly its rows.
    assert _entries(table) == entries
    assert_same_rows(rows, scan_rows(table))
    _assert_java_reads_every_manifest(table, java_before.current.rows, java_before.live_files())


def test_spec_id_rewrites_one_specs_manifests_only(catalog: Catalog) -> None:
    table = _table(catalog, commits=8)
    with table.update_spec() as update:
        update.add_identity("id")
    table = catalog.load_table(TABLE)
    for n in range(8, 14):
        _append(table, [n])
    before = {m.manifest_path for m in _manifests(table) if m.partition_spec_id == 1}
    assert len(before) == 6
    rows = scan_rows(table)

    result = compactor.rewrite_manifests(table, spec_id=0, target_manifest_size="1MiB")

    data = result.to_dict()
    assert data["spec_id"] == 0 and [g["spec_id"] for g in data["groups"]] == [0]
    table = catalog.load_table(TABLE)
    manifests = _manifests(table)
    assert {m.manifest_path for m in manifests if m.partition_spec_id == 1} == before
    assert len([m for m in manifests if m.partition_spec_id == 0]) == 1
    assert_same_rows(rows, scan_rows(table))
    with pytest.raises(UsageError, match="spec_id 7"):
        compactor.rewrite_manifests(table, spec_id=7)


def test_dry_run_writes_nothing_and_predicts_the_run(catalog: Catalog, warehouse: Path) -> None:
    table = _table(catalog)
    files = list_files(warehouse)
    metadata_location = table.metadata_location

    dry = compactor.rewrite_manifests(table, dry_run=True).to_dict()

    assert dry["dry_run"] and dry["snapshot_id"] is None
    assert list_files(warehouse) == files
    assert catalog.load_table(TABLE).metadata_location == metadata_location
    done = compactor.rewrite_manifests(catalog.load_table(TABLE)).to_dict()
    assert dry["manifests_after"] == done["manifests_after"]
    assert dry["manifests_written"] == done["manifests_written"]


def test_format_v3_keeps_row_lineage_and_deletion_vectors(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    location = tmp_path / "dv"
    table = catalog.register_table(("db", "dv"), write_cdc_table("dv", location, seed=1))
    expected = read_expected(location).rows
    before = java_read(table, [])
    assert before.current.rows == expected
    lineage = before.lineage()
    entries = _entries(table)
    assert any(e[0] == ManifestContent.DELETES for e in entries.values())
    manifests_before = _counts(table)

    result = compactor.rewrite_manifests(table, target_manifest_size="1MiB")

    data = result.to_dict()
    assert data["snapshot_id"] is not None
    table = catalog.load_table("db.dv")
    after = _counts(table)
    assert after["data"] == 1 and after["deletes"] <= 1
    assert sum(manifests_before.values()) > sum(after.values())
    # Every entry keeps its first row id, sequence numbers and snapshot id.
    assert _entries(table) == entries
    read = java_read(table, [table.current_snapshot().snapshot_id])
    assert read.current.rows == expected
    assert read.lineage() == lineage
    assert read.live_files() == before.live_files()


# --------------------------------------------------------------------------------------------
# Beside live writers
# --------------------------------------------------------------------------------------------


def test_a_concurrent_append_is_carried_over(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, java_reader: JavaReader
) -> None:
    table = _table(catalog, commits=20)
    rows = scan_rows(table)
    entries = _entries(table)
    appended: list[int] = []

    def append(other: Table) -> None:
        _append(other, [500, 501])
        appended.append(other.current_snapshot().snapshot_id)

    calls = _with_concurrent(catalog, monkeypatch, append)
    result = compactor.rewrite_manifests(table, target_manifest_size="1MiB")

    assert calls == [1]
    data = result.to_dict()
    assert data["snapshot_id"] is not None and data["attempts"] == 2
    table = catalog.load_table(TABLE)
    snapshot = table.current_snapshot()
    assert snapshot.parent_snapshot_id == appended[0]
    # The rewritten manifest and the appended one, kept by reference.
    manifests = _manifests(table)
    assert len(manifests) == 2
    assert [m.added_snapshot_id for m in manifests].count(appended[0]) == 1
    after = _entries(table)
    assert {k: v for k, v in after.items() if k in entries} == entries
    assert len(after) == len(entries) + 2  # one file per region
    expected = pa.concat_tables(
        [rows, pa.table({"id": [500, 501], "region": ["a", "b"]}, schema=SCHEMA.as_arrow())]
    )
    assert_same_rows(expected, scan_rows(table))
    assert_java_reads_same(table, snapshot_ids=[])
    assert unreferenced_files(table) == []


def test_a_concurrent_delete_of_an_entry_refuses_its_group_and_leaves_no_file(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, java_reader: JavaReader
) -> None:
    table = _table(catalog, commits=20)
    files = sorted(live_data_files(table).values(), key=lambda f: f.file_path)
    for data_file in files[:4]:
        table = commit_delete_files(table, [write_position_delete_file(table, {data_file: [0]})])
    expected = scan_rows(table).filter(pa.compute.field("id") != 7)
    assert expected.num_rows == 15

    def delete(other: Table) -> None:  # the file holding id 7 goes: its data manifest changes
        other.delete("id = 7")

    calls = _with_concurrent(catalog, monkeypatch, delete)
    result = compactor.rewrite_manifests(table, target_manifest_size="1MiB")

    assert calls == [1]
    data = result.to_dict()
    # The data group is refused, the delete group committed on top of the delete.
    (conflict,) = data["conflicts"]
    assert "was replaced by snapshot" in conflict["reason"]
    refused = next(g for g in data["groups"] if g["group_id"] == conflict["group_id"])
    assert refused["content"] == "data"
    assert data["committed_groups"] == 1 and data["snapshot_id"] is not None
    table = catalog.load_table(TABLE)
    counts = _counts(table)
    assert counts["deletes"] == 1 and counts["data"] > 1
    # The deleted row stays deleted; no entry is lost or back.
    assert_same_rows(expected, scan_rows(table))
    java = assert_java_reads_same(table, snapshot_ids=[])
    assert java.live_files()["data"] == 19
    assert unreferenced_files(table) == [] and read_record(table) is None


def test_every_group_refused_commits_nothing(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(catalog, commits=20)
    _with_concurrent(catalog, monkeypatch, lambda other: other.delete("id = 3"))

    result = compactor.rewrite_manifests(table, target_manifest_size="1MiB")

    assert result.snapshot_id is None and len(result.conflicts) == 1
    table = catalog.load_table(TABLE)
    assert table.current_snapshot().summary.operation == Operation.DELETE
    assert unreferenced_files(table) == [] and read_record(table) is None


def test_unknown_commit_state_keeps_every_file_for_the_next_run(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(catalog, commits=20)
    rows = scan_rows(table)

    def unknown(*args: Any, **kwargs: Any) -> Any:
        raise CommitStateUnknownException("gateway timeout")

    monkeypatch.setattr(table.catalog, "commit_table", unknown)
    with pytest.raises(CommitStateUnknownError, match=TABLE):
        compactor.rewrite_manifests(table)
    monkeypatch.undo()
    table = catalog.load_table(TABLE)
    assert [p for p in unreferenced_files(table) if p.endswith(".avro")]  # kept: it may land
    assert read_record(table) is not None

    result = compactor.rewrite_manifests(table)

    assert result.recovered_files and result.snapshot_id is not None
    table = catalog.load_table(TABLE)
    assert unreferenced_files(table) == []
    assert_same_rows(rows, scan_rows(table))


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def test_the_command_prints_json_a_table_and_one_line_errors(tmp_path: Path) -> None:
    catalog = embedded(tmp_path)
    catalog.create_namespace("db")
    table = _table(catalog, commits=12)
    rows = scan_rows(table)

    result = run_cli(
        tmp_path, "rewrite-manifests", "--table", TABLE, "--target-manifest-size", "1MiB", "--json"
    )

    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert_documented("rewrite-manifests", document)
    assert document["manifests_before"]["data"] == 12
    assert document["manifests_after"]["data"] == 1
    assert_same_rows(rows, scan_rows(embedded(tmp_path).load_table(TABLE)))

    again = run_cli(tmp_path, "rewrite-manifests", "--table", TABLE)
    assert again.returncode == 0, again.stderr
    assert "replaced 0 manifests with 0" in again.stdout
    assert "1 group already in order" in again.stdout

    bad = run_cli(tmp_path, "rewrite-manifests", "--table", TABLE, "--spec-id", "4")
    assert_one_error_line(bad, 2, "spec")
