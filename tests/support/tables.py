"""What a table's snapshots hold: live entries and files, totals per partition, stray files;
rows appended as files with field ids or imported without them."""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record

from compactor.bench.sample import EVENTS_SCHEMA, EVENTS_SPEC, events_batch
from compactor.iceberg.pyiceberg_compat import file_statistics, partition_value, transform_arrow
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


# --------------------------------------------------------------------------------------------
# Rows appended as pyiceberg writes them, or as a migration leaves them
# --------------------------------------------------------------------------------------------

# The two kinds of data file a table's rows can be in: written by an Iceberg writer, with a
# field id on every column, or imported (pyiceberg's ``add_files``, Spark's ``migrate`` and
# ``add_files``): plain Parquet without field ids, whose columns readers find through the
# table's name mapping (``schema.name-mapping.default``).
FIELD_IDS, IMPORTED = "field_ids", "imported"
PARQUET_FIELD_ID = b"PARQUET:field_id"
NAME_MAPPING = TableProperties.DEFAULT_NAME_MAPPING


@dataclasses.dataclass
class Appends:
    """How :func:`append_rows` writes rows (``kind``), and the files it imported."""

    kind: str = FIELD_IDS
    imported: list[str] = dataclasses.field(default_factory=list)


# The ``file_kind`` fixture replaces it for each test.
APPENDS = Appends()


def append_rows(table: Table, rows: pa.Table) -> Table:
    """Append ``rows`` in one snapshot, one data file per partition of the default spec: as
    pyiceberg's ``append`` writes them, or imported, as :data:`APPENDS` says. Returns ``table``,
    updated."""
    if APPENDS.kind == IMPORTED:
        APPENDS.imported.extend(import_rows(table, rows))
    else:
        assert APPENDS.kind == FIELD_IDS, APPENDS.kind
        table.append(rows)
    return table


def _plain_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(kind):
        return pa.struct([_plain_field(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(_plain_field(kind.key_field), _plain_field(kind.item_field))
    if pa.types.is_large_list(kind):
        return pa.large_list(_plain_field(kind.value_field))
    if pa.types.is_list(kind):
        return pa.list_(_plain_field(kind.value_field))
    return kind


def _plain_field(column: pa.Field) -> pa.Field:
    """``column`` without metadata (its field id), at every level of nesting."""
    return pa.field(column.name, _plain_type(column.type), column.nullable)


def field_ids_of(schema: pa.Schema) -> list[str]:
    """The columns of a Parquet file's schema, nested ones included, that carry a field id."""
    found = []

    def visit(column: pa.Field, path: str) -> None:
        if column.metadata and PARQUET_FIELD_ID in column.metadata:
            found.append(path)
        kind = column.type
        if pa.types.is_struct(kind):
            children = [kind.field(i) for i in range(kind.num_fields)]
        elif pa.types.is_map(kind):
            children = [kind.key_field, kind.item_field]
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            children = [kind.value_field]
        else:
            children = []
        for child in children:
            visit(child, f"{path}.{child.name}")

    for column in schema:
        visit(column, column.name)
    return found


def _partitions(table: Table, rows: pa.Table) -> list[tuple[Record, pa.Table]]:
    """``rows`` split by the partition of the table's default spec they belong to, in the order
    of their first rows, each with that partition (as a manifest holds it)."""
    spec, schema = table.spec(), table.schema()
    if spec.is_unpartitioned():
        return [(Record(), rows)]
    columns = []
    for partition_field in spec.fields:
        source = schema.find_field(partition_field.source_id)
        name = schema.find_column_name(partition_field.source_id)
        assert name in rows.column_names, f"partition source {name} must be a top-level column"
        values = transform_arrow(partition_field.transform, source.field_type, rows.column(name))
        columns.append(
            [partition_value(partition_field, source.field_type, v) for v in values.to_pylist()]
        )
    positions: dict[tuple[Any, ...], list[int]] = {}
    records: dict[tuple[Any, ...], Record] = {}
    for position, values in enumerate(zip(*columns, strict=True)):
        key = tuple(value_key(v) for v in values)
        positions.setdefault(key, []).append(position)
        records.setdefault(key, Record(*values))
    return [(records[key], rows.take(taken)) for key, taken in positions.items()]


def import_rows(table: Table, rows: pa.Table) -> list[str]:
    """Write ``rows`` as Parquet files without field ids under the table's data directory, one
    per partition (in Hive's ``name=value`` directories), and add them to the table in one
    snapshot, as a migration does; returns their locations.

    pyiceberg's ``add_files`` adds them (it sets the table's name mapping if it has none, and
    infers each file's partition from its column bounds). It infers no partition through a
    transform that does not keep order (bucket, void), nor a NaN one (bounds leave NaN out):
    such files are added as Iceberg Java's ``add_files`` adds a Hive table's files, the
    partition taken from where the file is, the rest as pyiceberg's ``add_files`` makes it.
    """
    schema, spec = table.schema(), table.spec()
    plain = pa.schema([_plain_field(column) for column in rows.schema])
    data_location = f"{table.location().rstrip('/')}/data"
    written: list[tuple[str, Record]] = []
    for partition, part in _partitions(table, rows):
        directory = data_location
        if not spec.is_unpartitioned():
            directory = f"{data_location}/{spec.partition_to_path(partition, schema)}"
        location = f"{directory}/imported-{uuid.uuid4()}.parquet"
        with table.io.new_output(location).create() as stream:
            pq.write_table(part.cast(plain), stream)
        with table.io.new_input(location).open() as stream:
            read_back = pq.read_schema(stream)
        assert field_ids_of(read_back) == [], f"{location} has field ids: {read_back}"
        written.append((location, partition))
    locations = [location for location, _ in written]
    if all(f.transform.preserves_order for f in spec.fields) and not any(
        isinstance(v, float) and math.isnan(v) for _, partition in written for v in partition
    ):
        table.add_files(locations, check_duplicate_files=False)  # fresh names: none to look up
    else:
        _add_with_partitions(table, written)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    added = {
        entry.data_file.file_path: entry.data_file.partition
        for manifest in snapshot.manifests(table.io)
        if manifest.added_snapshot_id == snapshot.snapshot_id
        for entry in manifest.fetch_manifest_entry(table.io)
    }
    assert added.keys() == set(locations)
    for location, partition in written:
        assert partition_key(added[location]) == partition_key(partition), location
    assert table.metadata.name_mapping() is not None
    return locations


def _add_with_partitions(table: Table, files: list[tuple[str, Record]]) -> None:
    """Add the files as ``add_files`` does, each in the partition given."""
    if table.metadata.name_mapping() is None:
        with table.transaction() as tx:
            tx.set_properties({NAME_MAPPING: table.schema().name_mapping.model_dump_json()})
    metadata = table.metadata
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for location, partition in files:
            input_file = table.io.new_input(location)
            with input_file.open() as stream:
                parquet_metadata = pq.read_metadata(stream)
            append.append_data_file(
                DataFile.from_args(
                    content=DataFileContent.DATA,
                    file_path=location,
                    file_format=FileFormat.PARQUET,
                    partition=partition,
                    file_size_in_bytes=len(input_file),
                    sort_order_id=None,
                    spec_id=metadata.default_spec_id,
                    equality_ids=None,
                    key_metadata=None,
                    **file_statistics(parquet_metadata, metadata.schema(), metadata.properties),
                )
            )


def events_table(
    catalog: Catalog,
    identifier: str,
    *,
    commits: int,
    rows_per_commit: int,
    days: int = 3,
    properties: dict[str, str] | None = None,
) -> Table:
    """The sample events table (``compactor.bench.sample``), its rows appended with
    :func:`append_rows`: one small file per (day, region) partition a commit touches."""
    table = catalog.create_table(
        identifier, EVENTS_SCHEMA, partition_spec=EVENTS_SPEC, properties=properties or {}
    )
    for commit in range(commits):
        append_rows(table, events_batch(commit, rows_per_commit, days))
    return table


def files_without_field_ids(table: Table, snapshot: Snapshot | None = None) -> list[str]:
    """Live data files of ``snapshot`` (default: current) whose columns carry no field id.

    Only a table with a name mapping can be read with such files: one without is not looked at.
    """
    if table.metadata.name_mapping() is None:
        return []
    found = []
    for path in live_data_files(table, snapshot):
        with table.io.new_input(path).open() as stream:
            if not field_ids_of(pq.read_schema(stream)):
                found.append(path)
    return found


def unmapped_snapshots(table: Table) -> dict[int | None, None]:
    """The snapshots holding files without field ids, as ``assert_java_reads_same`` takes them:
    Iceberg Java must read them, their rows are not compared (its generic reader reads such files
    by column position, not through the name mapping)."""
    return {s.snapshot_id: None for s in table.snapshots() if files_without_field_ids(table, s)}
