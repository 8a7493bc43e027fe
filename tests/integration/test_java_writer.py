"""Iceberg Java writes CDC tables (java_writer.py) that Iceberg Java reads as its writer expects.

Also the Java reader's long-lived server: a failed read does not stop it, and one that died is
started again.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFileContent, FileFormat, ManifestEntryStatus
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.puffin import PuffinFile
from pyiceberg.types import LongType, NestedField, StringType

from support import java_reader as java_reader_module
from support.java_reader import JavaReader, JavaReadError, java_read
from support.java_writer import SCENARIOS, read_expected, write_cdc_table, write_cdc_tables


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def _ids(uri: str) -> set[int]:
    """The ids in one data or equality-delete file (not read as a hive-partitioned dataset)."""
    return set(pq.ParquetFile(_local(uri)).read(columns=["id"]).column("id").to_pylist())


def _entries(table: Table, snapshot_id: int | None = None, live: bool = True) -> list[Any]:
    snapshot = (
        table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    )
    assert snapshot is not None
    return [
        entry
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=live)
    ]


def _kinds(table: Table) -> Counter[str]:
    """Live files of the current snapshot by kind, as pyiceberg reads the manifests."""
    kinds: Counter[str] = Counter()
    for entry in _entries(table):
        f = entry.data_file
        if f.content == DataFileContent.DATA:
            kinds["data"] += 1
        elif f.content == DataFileContent.EQUALITY_DELETES:
            kinds["equality_deletes"] += 1
        elif f.file_format == FileFormat.PUFFIN:
            kinds["deletion_vectors"] += 1
        else:
            kinds["position_deletes"] += 1
    return kinds


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, java_reader: JavaReader) -> Path:
    """Every scenario written once for the module (seed 0), each under its own directory."""
    root = tmp_path_factory.mktemp("cdc")
    write_cdc_tables({scenario: root / scenario for scenario in SCENARIOS}, seed=0)
    return root


def _register(catalog: Catalog, written: Path, scenario: str) -> Table:
    expected = read_expected(written / scenario)
    return catalog.register_table(("db", scenario.replace("-", "_")), expected.metadata_location)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_java_reads_what_its_writer_expects(catalog: Catalog, written: Path, scenario: str) -> None:
    """The live rows Java reads (its delete semantics) are the writer model's, key for key."""
    table = _register(catalog, written, scenario)
    expected = read_expected(written / scenario)
    assert table.format_version == expected.format_version
    assert len(table.metadata.snapshots) == expected.commits

    java = java_read(table, snapshot_ids=[])
    assert java.read().columns == expected.columns
    assert java.read().rows == expected.rows, java_reader_module._diff(
        java.read().rows, expected.rows
    )
    # The deletes matter: fewer live rows than rows in the live data files.
    data_rows = sum(
        e.data_file.record_count
        for e in _entries(table)
        if e.data_file.content == DataFileContent.DATA
    )
    assert len(expected.by_key) < data_rows
    # Java and pyiceberg count the same live files of each kind.
    assert java.live_files() == _kinds(table)


def test_upsert_has_partitioned_equality_and_position_deletes(
    catalog: Catalog, written: Path
) -> None:
    table = _register(catalog, written, "upsert")
    kinds = _kinds(table)
    assert kinds["equality_deletes"] >= 50 and kinds["position_deletes"] >= 5, kinds
    assert kinds["deletion_vectors"] == 0
    assert len(table.metadata.snapshots) == 30
    eq = [e.data_file for e in _entries(table) if e.data_file.equality_ids]
    assert {tuple(f.equality_ids) for f in eq} == {(1,)}
    assert {f.partition[0] for f in eq} == {"eu", "us", "apac", "latam"}
    # Key-only delete files, as Flink's upsert mode writes them.
    assert pq.read_schema(_local(eq[0].file_path)).names == ["id"]
    # Some keys were deleted, some deleted keys came back.
    expected = read_expected(written / "upsert")
    deleted = set()
    for f in eq:
        deleted |= _ids(f.file_path)
    assert deleted - set(expected.by_key) and deleted & set(expected.by_key)
    # Pure-delete commits add delete files only.
    delete_only = [
        s for s in table.metadata.snapshots if s.summary and s.summary.operation.value == "delete"
    ]
    assert len(delete_only) >= 5


def test_merge_on_read_has_position_deletes_spanning_data_files(
    catalog: Catalog, written: Path
) -> None:
    table = _register(catalog, written, "merge-on-read")
    kinds = _kinds(table)
    assert kinds["position_deletes"] >= 10 and kinds["equality_deletes"] == 0, kinds
    targets = []
    for entry in _entries(table):
        if entry.data_file.content == DataFileContent.POSITION_DELETES:
            paths = pq.ParquetFile(_local(entry.data_file.file_path)).read().column("file_path")
            targets.append(set(paths.to_pylist()))
    assert max(len(t) for t in targets) >= 2  # partition-scoped: several data files
    assert min(len(t) for t in targets) == 1  # file-scoped
    hit = Counter(path for t in targets for path in t)
    assert max(hit.values()) >= 2  # a data file with deletes from several commits


def test_dv_has_one_deletion_vector_per_data_file_replacing_older_ones(
    catalog: Catalog, written: Path
) -> None:
    table = _register(catalog, written, "dv")
    assert table.format_version == 3
    java = java_read(table, snapshot_ids=[])
    live = java.live_files()
    assert live["deletion_vectors"] >= 5 and live["position_deletes"] == 0, live
    assert live["equality_deletes"] == 0
    dvs = [e.data_file for e in _entries(table) if e.data_file.file_format == FileFormat.PUFFIN]
    assert len(dvs) == live["deletion_vectors"]
    # Several DVs share a Puffin file (one per commit).
    assert max(Counter(f.file_path for f in dvs).values()) >= 2
    for path in {f.file_path for f in dvs}:
        assert _local(path).read_bytes()[:4] == b"PFA1"
    # Older DVs were removed when a newer one replaced them: DELETED entries of Puffin files.
    replaced = [
        e
        for s in table.metadata.snapshots
        for e in _entries(table, s.snapshot_id, live=False)
        if e.status == ManifestEntryStatus.DELETED and e.data_file.file_format == FileFormat.PUFFIN
    ]
    assert replaced and read_expected(written / "dv").written["replaced_dvs"] > 0


def test_void_spec_equality_deletes_are_global(catalog: Catalog, written: Path) -> None:
    table = _register(catalog, written, "void-spec")
    specs = table.specs()
    assert set(specs) == {0, 1}
    old, void = specs[0].fields[0], specs[1].fields[0]
    assert str(old.transform) == "identity" and str(void.transform) == "void"
    assert (old.field_id, old.name) == (void.field_id, void.name)
    assert table.spec().spec_id == 1

    entries = _entries(table)
    void_deletes = [
        e.data_file
        for e in entries
        if e.data_file.content == DataFileContent.EQUALITY_DELETES and e.data_file.spec_id == 1
    ]
    old_data = [
        e.data_file
        for e in entries
        if e.data_file.content == DataFileContent.DATA and e.data_file.spec_id == 0
    ]
    assert void_deletes and old_data
    assert {f.partition[0] for f in void_deletes} == {None}
    deleted = set()
    for f in void_deletes:
        deleted |= _ids(f.file_path)
    in_old = set()
    for f in old_data:
        in_old |= _ids(f.file_path)
    # Keys deleted only by the void spec's deletes, whose rows sit in old partitioned files.
    gone = (deleted & in_old) - set(read_expected(written / "void-spec").by_key)
    regions = {f.partition[0] for f in old_data if gone & _ids(f.file_path)}
    assert len(regions) >= 2, regions


def test_schema_change_deletes_rows_written_before_it(catalog: Catalog, written: Path) -> None:
    table = _register(catalog, written, "schema-change")
    names = [f.name for f in table.schema().fields]
    assert names == ["id", "region", "title", "amount", "qty", "day", "note"]
    assert table.schema().find_field("title").field_id == 3
    assert len(table.schemas()) == 2
    old_files = [
        e.data_file
        for e in _entries(table)
        if e.data_file.content == DataFileContent.DATA
        and "note" not in pq.read_schema(_local(e.data_file.file_path)).names
    ]
    late_deletes = [
        e
        for e in _entries(table)
        if e.data_file.content == DataFileContent.EQUALITY_DELETES
        and e.sequence_number > max(s.sequence_number for s in _old_snapshots(table))
    ]
    assert old_files and late_deletes
    expected = read_expected(written / "schema-change")
    assert any(row.endswith(",null]") for row in expected.by_key.values())
    assert any(not row.endswith(",null]") for row in expected.by_key.values())


def _commit_of(row: str) -> int:
    """The writer's commit index of a canonical row, from its name ``k<id>-c<commit>-...``."""
    return int(json.loads(row)[2].split("-")[1].removeprefix("c"))


def _referenced(entry: Any) -> set[str]:
    """The data files a Parquet position-delete file deletes rows of."""
    path = entry.data_file.file_path
    return set(pq.ParquetFile(_local(path)).read().column("file_path").to_pylist())


def _dv_targets(puffin_paths: set[str]) -> list[str]:
    """The data file of every DV in those Puffin files (pyiceberg 0.12 reads no
    referenced_data_file from manifests)."""
    return [
        blob.properties["referenced-data-file"]
        for path in sorted(puffin_paths)
        for blob in PuffinFile(_local(path).read_bytes()).footer.blobs
    ]


def test_v2_to_v3_mixes_v2_position_deletes_and_deletion_vectors(
    catalog: Catalog, written: Path
) -> None:
    """After the upgrade, DVs merge the v2 deletes of their files; other files keep v2 deletes."""
    table = _register(catalog, written, "v2-to-v3")
    expected = read_expected(written / "v2-to-v3")
    assert table.format_version == 3 and expected.format_version == 3
    snapshots = table.metadata.snapshots
    assert len(snapshots) == 7
    upgraded = [s for s in snapshots if s.first_row_id is not None]
    assert [s.sequence_number for s in upgraded] == [6, 7]
    java = java_read(table, snapshot_ids=[])
    assert java.format_version == 3
    live = java.live_files()
    assert live["position_deletes"] >= 3 and live["deletion_vectors"] >= 3, live
    assert live["equality_deletes"] == 0
    entries = _entries(table)
    deletes = [e for e in entries if e.data_file.content == DataFileContent.POSITION_DELETES]
    v2 = [e for e in deletes if e.data_file.file_format != FileFormat.PUFFIN]
    dvs = [e for e in deletes if e.data_file.file_format == FileFormat.PUFFIN]
    # Position-delete files only before the upgrade, DVs only after it.
    assert max(e.sequence_number for e in v2) <= 5 and min(e.sequence_number for e in dvs) == 7
    targets = _dv_targets({e.data_file.file_path for e in dvs})
    with_dv = set(targets)
    with_v2 = set().union(*(_referenced(e) for e in v2))
    assert len(targets) == len(with_dv) == len(dvs)  # at most one DV per data file
    assert with_v2 - with_dv  # data files whose v2 deletes still apply
    assert with_v2 & with_dv  # a partition-scoped v2 file stays, ignored for files with a DV
    assert with_dv - with_v2  # DVs of files without earlier deletes
    # The DV commit merged v2 deletes and removed the file-scoped v2 file it merged.
    assert expected.written["dvs_merging_position_deletes"] >= 2
    assert expected.written["replaced_position_delete_files"] >= 1
    removed = [
        e
        for e in _entries(table, live=False)
        if e.status == ManifestEntryStatus.DELETED
        and e.data_file.content == DataFileContent.POSITION_DELETES
    ]
    assert removed and all(e.data_file.file_format == FileFormat.PARQUET for e in removed)
    assert all(len(_referenced(e)) == 1 for e in removed)


def test_v2_to_v3_first_v3_snapshot_assigns_row_ids_to_old_rows(
    catalog: Catalog, written: Path
) -> None:
    """Rows written before the upgrade get row ids from the first v3 manifest list."""
    table = _register(catalog, written, "v2-to-v3")
    expected = read_expected(written / "v2-to-v3")
    first, second = [s for s in table.metadata.snapshots if s.first_row_id is not None]
    # The first v3 snapshot numbers every row of its live data files (its own and the old ones,
    # deleted or not) from 0, the next one goes on from there.
    in_first = sum(
        e.data_file.record_count
        for e in _entries(table, first.snapshot_id)
        if e.data_file.content == DataFileContent.DATA
    )
    assert first.first_row_id == 0 and first.added_rows == in_first
    assert second.first_row_id == in_first
    assert table.metadata.next_row_id == in_first + second.added_rows

    java = java_read(table, snapshot_ids=[])
    assert java.next_row_id == table.metadata.next_row_id
    lineage = java.lineage()
    assert Counter(row for row, _, _ in lineage.elements()) == expected.rows
    ids = [row_id for _, row_id, _ in lineage.elements()]
    assert None not in ids and len(set(ids)) == len(ids)
    assert all(0 <= i < java.next_row_id for i in ids)
    for row, row_id, sequence in lineage.elements():
        commit = _commit_of(row)
        # Inherited from the data file: its (file) sequence number, the commit's.
        assert sequence == commit + 1, (row, sequence)
        # Rows of the last commit are numbered after the first v3 snapshot's.
        assert (row_id >= second.first_row_id) == (commit == 6), (row, row_id)
    assert {_commit_of(row) for row in expected.by_key.values()} >= {0, 1, 2, 4, 5, 6}


def test_v2_upgraded_has_no_row_lineage(catalog: Catalog, written: Path) -> None:
    """Upgraded to v3 without a commit since: no first_row_id anywhere, null lineage."""
    table = _register(catalog, written, "v2-upgraded")
    expected = read_expected(written / "v2-upgraded")
    assert table.format_version == 3 and expected.format_version == 3
    assert len(table.metadata.snapshots) == 5
    assert all(s.first_row_id is None for s in table.metadata.snapshots)
    assert table.metadata.next_row_id == 0
    # The upgrade wrote a metadata.json of its own, not a snapshot.
    assert table.current_snapshot().sequence_number == table.metadata.last_sequence_number == 5
    java = java_read(table, snapshot_ids=[])
    assert java.format_version == 3 and java.next_row_id == 0
    assert java.current.rows == expected.rows
    assert java.lineage() == Counter({(row, None, None): n for row, n in expected.rows.items()})
    live = java.live_files()
    assert live["position_deletes"] >= 3 and live["deletion_vectors"] == 0, live


def _old_snapshots(table: Table) -> list[Any]:
    schema_ids = [s.schema_id for s in table.metadata.snapshots]
    return [s for s in table.metadata.snapshots if s.schema_id == min(schema_ids)]


def test_writer_is_deterministic(tmp_path: Path, java_reader: JavaReader) -> None:
    write_cdc_table("schema-change", tmp_path / "a", seed=7)
    write_cdc_table("schema-change", tmp_path / "b", seed=7)
    a, b = read_expected(tmp_path / "a"), read_expected(tmp_path / "b")
    assert a.by_key == b.by_key and a.written == b.written
    files = {p.relative_to(tmp_path / "a") for p in (tmp_path / "a" / "data").rglob("*")}
    assert files == {p.relative_to(tmp_path / "b") for p in (tmp_path / "b" / "data").rglob("*")}
    with pytest.raises(ValueError, match="not empty"):
        write_cdc_table("schema-change", tmp_path / "a", seed=7)


# --------------------------------------------------------------------------------------------
# The reader's long-lived server
# --------------------------------------------------------------------------------------------


def test_reader_server_survives_a_failed_read_and_restarts(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "s", StringType()))
    good = catalog.create_table("db.good", schema)
    good.append(pa.table({"id": [1, 2], "s": ["a", "b"]}, schema=schema.as_arrow()))
    bad = catalog.create_table("db.bad", schema)
    bad.append(pa.table({"id": [3], "s": ["c"]}, schema=schema.as_arrow()))
    _local(bad.current_snapshot().manifest_list).unlink()

    assert java_read(good).read().row_count == 2
    pid = java_reader_module.reader_pid()
    assert pid is not None
    with pytest.raises(JavaReadError, match="reading manifest list") as failure:
        java_read(bad)
    assert failure.value.returncode == 1 and "NotFound" in failure.value.stderr
    assert java_reader_module.reader_pid() == pid  # the same server goes on
    assert java_read(good, snapshot_ids=[]).read().row_count == 2

    os.kill(pid, signal.SIGKILL)
    assert java_read(good).read().row_count == 2  # started again
    restarted = java_reader_module.reader_pid()
    assert restarted not in (None, pid)

    java_reader_module.stop_reader()
    assert java_reader_module.reader_pid() is None
    with pytest.raises(ProcessLookupError):
        os.kill(restarted, 0)
    assert java_read(good).read().row_count == 2
