"""What a table's snapshots hold: live entries and files, totals per partition, stray files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from compactor.iceberg.references import table_references
from compactor.iceberg.value_keys import PartitionKey, partition_key, value_key
from compactor.quarantine import QUARANTINE_FILE


def live_entries(table: Table, snapshot: Snapshot | None = None) -> list[ManifestEntry]:
    """Live (added or existing) manifest entries of ``snapshot`` (default: current)."""
    snapshot = snapshot or table.current_snapshot()
    if snapshot is None:
        return []
    return [
        entry
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def snapshot_entries(table: Table, snapshot: Snapshot | None = None) -> list[ManifestEntry]:
    """Every manifest entry of ``snapshot`` (default: current), DELETED ones included."""
    snapshot = snapshot or table.current_snapshot()
    assert snapshot is not None
    return [
        entry
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
    ]


def live_data_files(table: Table, snapshot: Snapshot | None = None) -> dict[str, DataFile]:
    """Path -> DataFile of every live data file."""
    return {
        e.data_file.file_path: e.data_file
        for e in live_entries(table, snapshot)
        if e.data_file.content == DataFileContent.DATA
    }


def live_delete_files(table: Table, snapshot: Snapshot | None = None) -> dict[str, DataFile]:
    """Path -> DataFile of every live position or equality delete file."""
    return {
        e.data_file.file_path: e.data_file
        for e in live_entries(table, snapshot)
        if e.data_file.content != DataFileContent.DATA
    }


def records_by_partition(table: Table) -> Counter[tuple[int, PartitionKey]]:
    """(spec id, partition key) -> records in live data files (as the manifests record them)."""
    counts: Counter[tuple[int, PartitionKey]] = Counter()
    for data_file in live_data_files(table).values():
        counts[(data_file.spec_id, partition_key(data_file.partition))] += data_file.record_count
    return counts


def files_by_partition(table: Table) -> Counter[tuple[int, PartitionKey]]:
    """(spec id, partition key) -> number of live data files."""
    return Counter((f.spec_id, partition_key(f.partition)) for f in live_data_files(table).values())


def assert_manifests_consistent(table: Table) -> None:
    """Each manifest of the current snapshot tracks one content type, as the spec requires.

    Also checks the manifests' spec ids match their entries'.
    """
    snapshot = table.current_snapshot()
    assert snapshot is not None
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            is_data = entry.data_file.content == DataFileContent.DATA
            expected = ManifestContent.DATA if is_data else ManifestContent.DELETES
            assert manifest.content == expected, (
                f"{entry.data_file.content} file {entry.data_file.file_path} "
                f"is tracked by a {manifest.content} manifest {manifest.manifest_path}"
            )
            assert entry.data_file.spec_id == manifest.partition_spec_id


def local_path(uri: str) -> Path:
    """Local filesystem path of a ``file://`` URI (or of a plain path)."""
    return Path(uri.removeprefix("file://"))


def list_files(root: Path) -> dict[str, int]:
    """Relative path -> size of every file under ``root``, recursively."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def read_data_file(table: Table, data_file: DataFile) -> pa.Table:
    """One data file's contents as written (no schema projection)."""
    with table.io.new_input(data_file.file_path).open() as stream:
        return pq.read_table(stream)


def assert_rows_match_partition(table: Table, data_file: DataFile) -> None:
    """Every row of ``data_file`` transforms to the file's partition value under its spec."""
    spec = table.metadata.specs()[data_file.spec_id]
    schema = table.schema()
    contents = read_data_file(table, data_file)
    for position, field in enumerate(spec.fields):
        source = schema.find_field(field.source_id)
        column = contents.column(source.name).combine_chunks()
        if pa.types.is_large_binary(column.type):  # pyiceberg's truncate takes no large_binary
            column = column.cast(pa.binary())
        if str(field.transform) == "void":
            assert data_file.partition[position] is None
            continue
        transformed = field.transform.pyarrow_transform(source.field_type)(column)
        values = {value_key(v) for v in transformed.to_pylist()}
        assert values == {value_key(data_file.partition[position])}, (
            f"{data_file.file_path}: {field.name} values {values} "
            f"outside partition {data_file.partition}"
        )


def new_data_files(before: Table, after: Table) -> list[DataFile]:
    """Data files live in ``after`` that were not live in ``before``."""
    old = live_data_files(before)
    return [f for path, f in live_data_files(after).items() if path not in old]


def unreferenced_files(table: Table) -> list[str]:
    """Local paths of files under the table's location that no snapshot of ``table`` references.

    Table metadata files (``*.metadata.json``) are not snapshot files and are left out; so are
    a live run's record (``compactor-run.*.json``) and the table's quarantine.
    """
    referenced = {str(local_path(uri)) for uri in table_references(table).all()}
    root = local_path(table.metadata.location)
    return sorted(
        str(path)
        for path in root.rglob("*")
        if path.is_file()
        and not path.name.endswith(".metadata.json")
        and not path.name.startswith("compactor-run.")
        and path.name != QUARANTINE_FILE
        and str(path) not in referenced
    )
