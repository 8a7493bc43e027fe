"""Write and commit delete files (position, equality, deletion vectors): pyiceberg 0.12 cannot.

For benchmarks that build CDC-like tables and for tests; of compactor's actions only the
conversion of equality deletes adds deletes (deletion vectors, through
:func:`write_deletion_vectors`).
Files are Parquet with the spec's field ids and column metrics, or Puffin files of
``deletion-vector-v1`` blobs (format v3); a commit adds one delete manifest per partition spec
in a new snapshot on main, validated like pyiceberg's own writes.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.typedef import Record
from pyroaring import BitMap

from compactor.commit.snapshot_writer import SnapshotWriter, branch_commit
from compactor.errors import UnsupportedTableError
from compactor.iceberg.pyiceberg_compat import (
    DV_MAGIC,
    POSITION_DELETE_POS_ID,
    position_delete_schema,
    snapshot_manifests,
)

POSITION_DELETE_SCHEMA = position_delete_schema()[0]
# A position delete's file_path bounds in full, as Java writes them: equal bounds scope the
# delete file to one data file.
FULL_FILE_PATH_METRICS = {"write.metadata.metrics.column.file_path": "full"}


def _write(
    table: Table,
    data: pa.Table,
    schema: Schema,
    name: str,
    properties: dict[str, str],
    *,
    content: DataFileContent,
    partition: Record,
    equality_ids: list[int] | None,
) -> DataFile:
    path = table.location_provider().new_data_location(f"{name}-{uuid.uuid4().hex}.parquet")
    with table.io.new_output(path).create(overwrite=False) as stream:
        writer = pq.ParquetWriter(stream, data.schema)
        writer.write_table(data)
        writer.close()
        parquet_metadata = writer.writer.metadata
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=compute_statistics_plan(schema, properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    ).to_serialized_dict()
    delete_file = DataFile.from_args(
        file_path=path,
        file_format=FileFormat.PARQUET,
        file_size_in_bytes=len(table.io.new_input(path)),
        sort_order_id=None,
        key_metadata=None,
        content=content,
        partition=partition,
        equality_ids=equality_ids,
        **stats,
    )
    return delete_file


def write_equality_delete_file(
    table: Table, keys: pa.Table, *, spec_id: int, partition: Record
) -> DataFile:
    """An equality delete file deleting rows equal to a row of ``keys`` (columns named as the
    table's current columns) in the partition ``partition`` of spec ``spec_id``."""
    schema = table.schema()
    fields = [schema.find_field(name) for name in keys.column_names]
    delete_schema = Schema(*fields)
    data = keys.cast(schema_to_pyarrow(delete_schema, include_field_ids=True))
    delete_file = _write(
        table,
        data,
        delete_schema,
        "eq-deletes",
        {},
        content=DataFileContent.EQUALITY_DELETES,
        partition=partition,
        equality_ids=[f.field_id for f in fields],
    )
    delete_file.spec_id = spec_id
    return delete_file


def write_position_delete_file(
    table: Table, rows: pa.Table, *, spec_id: int, partition: Record, path_bounds: bool = True
) -> DataFile:
    """A position delete file of ``rows`` (``file_path``, ``pos``), sorted as the spec asks.

    With ``path_bounds`` it carries full ``file_path`` bounds (as Java writes them), otherwise
    none, so that readers apply it partition-wide by metrics.
    """
    data = rows.select(["file_path", "pos"]).sort_by(
        [("file_path", "ascending"), ("pos", "ascending")]
    )
    data = data.cast(schema_to_pyarrow(POSITION_DELETE_SCHEMA, include_field_ids=True))
    delete_file = _write(
        table,
        data,
        POSITION_DELETE_SCHEMA,
        "pos-deletes",
        FULL_FILE_PATH_METRICS,
        content=DataFileContent.POSITION_DELETES,
        partition=partition,
        equality_ids=None,
    )
    if not path_bounds:
        for bounds in (delete_file.lower_bounds, delete_file.upper_bounds):
            bounds.pop(POSITION_DELETE_SCHEMA.fields[0].field_id, None)
    delete_file.spec_id = spec_id
    return delete_file


PUFFIN_MAGIC = b"PFA1"


def _deletion_vector_blob(positions: Iterable[int]) -> bytes:
    """A ``deletion-vector-v1`` blob: the positions as a portable 64-bit roaring bitmap.

    Framed as the spec says: length of magic and bitmap (4 bytes, big-endian), magic, the
    bitmap (bitmap count, then each 32-bit bitmap after its key, little-endian), CRC-32 of
    magic and bitmap (big-endian).
    """
    by_key: dict[int, BitMap] = {}
    for position in positions:
        by_key.setdefault(position >> 32, BitMap()).add(position & 0xFFFFFFFF)
    bitmap = len(by_key).to_bytes(8, "little") + b"".join(
        key.to_bytes(4, "little") + by_key[key].serialize() for key in sorted(by_key)
    )
    body = DV_MAGIC + bitmap
    return len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


def write_deletion_vectors(
    table: Table,
    positions: Mapping[DataFile, Iterable[int]],
    *,
    path: str | None = None,
    on_create: Callable[[str], None] | None = None,
) -> list[DataFile]:
    """One Puffin file holding a deletion vector for each data file of ``positions`` (format v3).

    Returns one delete file entry per DV (they share the Puffin file's path, each with its
    blob's ``content_offset`` and ``content_size_in_bytes``), in ``positions``' order. A data
    file may have one DV at most: committing one for a file that has a DV needs the old one
    removed in the same commit, which :func:`commit_delete_files` does not do. The file is
    written at ``path`` (default: a new data location), ``on_create(path)`` called first.
    """
    if path is None:
        path = table.location_provider().new_data_location(f"dv-{uuid.uuid4().hex}.puffin")
    if on_create is not None:
        on_create(path)
    body, blobs, entries = bytearray(PUFFIN_MAGIC), [], []
    for data_file, deleted in positions.items():
        unique = sorted(set(deleted))
        blob = _deletion_vector_blob(unique)
        offset = len(body)
        body += blob
        blobs.append(
            {
                "type": "deletion-vector-v1",
                "fields": [POSITION_DELETE_POS_ID],
                "snapshot-id": -1,
                "sequence-number": -1,
                "offset": offset,
                "length": len(blob),
                "properties": {
                    "referenced-data-file": data_file.file_path,
                    "cardinality": str(len(unique)),
                },
            }
        )
        entries.append((data_file, offset, len(blob), len(unique)))
    footer = json.dumps({"blobs": blobs, "properties": {"created-by": "compactor"}}).encode()
    body += PUFFIN_MAGIC + footer + len(footer).to_bytes(4, "little") + bytes(4) + PUFFIN_MAGIC
    with table.io.new_output(path).create(overwrite=False) as stream:
        stream.write(bytes(body))
    delete_files = []
    for data_file, offset, length, cardinality in entries:
        dv = DataFile.from_args(
            _table_format_version=3,
            content=DataFileContent.POSITION_DELETES,
            file_path=path,
            file_format=FileFormat.PUFFIN,
            partition=data_file.partition,
            record_count=cardinality,
            file_size_in_bytes=len(body),
            referenced_data_file=data_file.file_path,
            content_offset=offset,
            content_size_in_bytes=length,
        )
        dv.spec_id = data_file.spec_id
        delete_files.append(dv)
    return delete_files


def commit_delete_files(
    table: Table, delete_files: Sequence[DataFile], operation: Operation = Operation.DELETE
) -> Table:
    """Commit ``delete_files`` in a new snapshot on main (v2, v3); returns the refreshed table.

    Carries the head's manifests over, adds one delete manifest per spec, assigns the next
    sequence number, and commits with the same requirements pyiceberg's own writes use.
    """
    metadata = table.metadata
    head = table.current_snapshot()
    if metadata.format_version < 2 or head is None:
        raise UnsupportedTableError(
            f"table {table.name()}: delete files are committed to format 2 or 3 tables with a "
            "snapshot"
        )
    writer = SnapshotWriter(table, metadata.new_snapshot_id(), None)
    by_spec: dict[int, list[DataFile]] = {}
    for delete_file in delete_files:
        by_spec.setdefault(delete_file.spec_id, []).append(delete_file)

    new_manifests = []
    for spec_id, files in sorted(by_spec.items()):
        with writer.manifest_writer(spec_id, ManifestContent.DELETES) as manifest:
            for delete_file in files:
                manifest.add_entry(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=writer.snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=delete_file,
                    )
                )
        new_manifests.append(manifest.to_manifest_file())

    collector = SnapshotSummaryCollector()
    for delete_file in delete_files:
        collector.add_file(
            delete_file,
            schema=metadata.schema(),
            partition_spec=metadata.specs()[delete_file.spec_id],
        )
    summary = update_snapshot_summaries(
        Summary(operation=operation, **collector.build()),
        previous_summary=head.summary.additional_properties if head.summary else None,
    )
    carried = snapshot_manifests(table.io, head, metadata.format_version)
    return commit_manifests(table, writer.snapshot_id, carried + new_manifests, summary)


def commit_manifests(
    table: Table, snapshot_id: int, manifests: list[ManifestFile], summary: Summary
) -> Table:
    """Commit a snapshot listing ``manifests`` on main over its head; returns the table."""
    metadata = table.metadata
    head = table.current_snapshot()
    assert head is not None
    sequence_number = metadata.next_sequence_number()
    writer = SnapshotWriter(table, snapshot_id, None)
    manifest_list, lineage = writer.manifest_list(head.snapshot_id, sequence_number, manifests)
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=head.snapshot_id,
        sequence_number=sequence_number,
        manifest_list=manifest_list,
        summary=summary,
        schema_id=metadata.current_schema_id,
        **lineage,
    )
    requirements, updates = branch_commit(metadata, MAIN_BRANCH, head.snapshot_id, [snapshot])
    table.catalog.commit_table(table, requirements, updates)
    table.refresh()
    return table
