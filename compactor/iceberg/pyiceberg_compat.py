"""The only module that touches private pyiceberg APIs (pinned to pyiceberg 0.12.x).

pyiceberg has no public API to read one data file through the Iceberg read path with its
position deletes, to write Parquet with Iceberg column statistics from a stream, or to match
delete files to data files. Everything compactor needs of that lives here, so that a pyiceberg
upgrade touches this file alone.

Importing it changes nothing in pyiceberg: the four fixes compactor needs of pyiceberg itself
are applied by :func:`install`.
"""

from __future__ import annotations

import struct
import threading
import uuid
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow.fs import AwsStandardS3RetryStrategy
from pyiceberg.avro.decoder import BinaryDecoder, new_decoder
from pyiceberg.avro.file import (
    META_SCHEMA,
    SYNC_SIZE,
    AvroFile,
    AvroFileHeader,
    AvroOutputFile,
)
from pyiceberg.avro.reader import DoubleReader
from pyiceberg.avro.resolver import construct_reader, resolve_reader
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.visitors import (
    _InclusiveMetricsEvaluator,
    bind,
    expression_evaluator,
    inclusive_projection,
    manifest_evaluator,
)
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.io import pyarrow as pyiceberg_pyarrow
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import (
    MetricModeTypes,
    MetricsMode,
    StatisticsCollector,
    _combine_positional_deletes,
    _get_parquet_writer_kwargs,
    _read_deletes,
    _task_to_record_batches,
    _to_requested_schema,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriterV2,
    ManifestWriter,
    ManifestWriterV1,
    ManifestWriterV2,
    PartitionFieldSummary,
    _inherit_from_manifest,
)
from pyiceberg.manifest import write_manifest_list as _write_manifest_list
from pyiceberg.partitioning import PartitionField, PartitionSpec, _to_partition_representation
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table import FileScanTask
from pyiceberg.table.delete_file_index import DeleteFileIndex
from pyiceberg.table.deletion_vector import DeletionVector
from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.transforms import Transform
from pyiceberg.typedef import IcebergBaseModel, Record, TableVersion
from pyiceberg.types import (
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
    UUIDType,
)

from compactor.iceberg.interop import refuse_fixed_partitions
from compactor.iceberg.manifest_avro import ManifestEncoder
from compactor.iceberg.value_keys import partition_key

__all__ = [
    "install",
    "FilePruner",
    "PartitionPath",
    "PositionDeleteIndex",
    "VERIFY_PAGE_CHECKSUMS",
    "file_statistics",
    "parquet_writer_kwargs",
    "read_data_file",
    "read_position_deletes",
    "to_write_batch",
    "write_schema",
    "manifest_writer",
    "manifest_entries",
    "snapshot_manifests",
    "write_manifest_list",
]

# Parquet pages carry an optional CRC of their bytes (parquet-java writes it by default).
# Written by compactor, and checked on read where present: a flipped bit in a page that still
# decodes would otherwise be rewritten as another value.
VERIFY_PAGE_CHECKSUMS = {"page_checksum_verification": True}
WRITE_PAGE_CHECKSUMS = {"write_page_checksum": True}
_get_file_format = pyiceberg_pyarrow._get_file_format


def _verifying_file_format(file_format: FileFormat, **kwargs: Any) -> Any:
    """pyiceberg's reader format, verifying page checksums of Parquet files."""
    if file_format == FileFormat.PARQUET:
        kwargs = {**kwargs, **VERIFY_PAGE_CHECKSUMS}
    return _get_file_format(file_format, **kwargs)


# Row lineage (format v3): reserved field ids of the metadata columns rewrites must carry.
ROW_ID_FIELD_ID = 2147483540
LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID = 2147483539
LINEAGE_FIELD_IDS = frozenset({ROW_ID_FIELD_ID, LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID})


def read_schema(metadata: TableMetadata) -> Schema:
    """The schema compaction reads and writes: the table's, plus row lineage for format v3.

    Format v3 rewrites must carry each row's ``_row_id`` and ``_last_updated_sequence_number``
    into the new files (the spec's row lineage), as these optional metadata columns.
    """
    schema = metadata.schema()
    if metadata.format_version < 3:
        return schema
    return Schema(
        *schema.fields,
        NestedField(ROW_ID_FIELD_ID, "_row_id", LongType(), required=False),
        NestedField(
            LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID,
            "_last_updated_sequence_number",
            LongType(),
            required=False,
        ),
        schema_id=schema.schema_id,
        identifier_field_ids=schema.identifier_field_ids,
    )


def read_data_file(
    io: FileIO,
    metadata: TableMetadata,
    data_file: DataFile,
    positional_deletes: list[pa.ChunkedArray] | None,
    lineage_sequence_number: int,
) -> Iterator[pa.RecordBatch]:
    """Stream one data file's live rows in :func:`read_schema`.

    Columns are matched by field id (or by the table's name mapping for files without ids),
    missing columns are filled per the spec's projection rules, and deleted positions dropped.
    For format v3, each row's lineage is read from the file or, where null, inherited
    (``first_row_id`` + position; ``lineage_sequence_number``, the entry's file sequence
    number, as Iceberg Java reads it) before deleted positions are dropped. A file without a
    ``first_row_id`` (its manifest predates v3) has no lineage yet: both are null, as in Java.
    """
    schema = read_schema(metadata)
    lineage = metadata.format_version >= 3
    batches = _task_to_record_batches(
        io,
        FileScanTask(data_file),
        bind(schema, AlwaysTrue(), case_sensitive=True),
        schema,
        schema,
        {
            field_id
            for field_id in schema.field_ids
            if not isinstance(schema.find_type(field_id), MapType | ListType)
        },
        None if lineage else positional_deletes or None,
        True,
        metadata.name_mapping(),
        metadata.specs().get(data_file.spec_id),
        metadata.format_version,
        None,
    )
    if not lineage:
        return batches
    return _with_lineage(batches, data_file, positional_deletes, lineage_sequence_number)


def read_columns(
    io: FileIO, metadata: TableMetadata, data_file: DataFile, field_ids: Sequence[int]
) -> Iterator[pa.RecordBatch]:
    """Stream the columns ``field_ids`` (top-level columns of the current schema) of every row
    of one data file, in file order, deleted rows included.

    Only those columns are read. They are projected as :func:`read_data_file` projects them: by
    field id (or the table's name mapping), promoted to the current type, a column the file
    lacks filled per the spec's projection rules (an identity partition's value, else null),
    and named as in the current schema.
    """
    table_schema = metadata.schema()
    schema = Schema(*[table_schema.find_field(field_id) for field_id in field_ids])
    return _task_to_record_batches(
        io,
        FileScanTask(data_file),
        bind(schema, AlwaysTrue(), case_sensitive=True),
        schema,
        schema,
        set(field_ids),
        None,
        True,
        metadata.name_mapping(),
        metadata.specs().get(data_file.spec_id),
        metadata.format_version,
        None,
    )


def _with_lineage(
    batches: Iterator[pa.RecordBatch],
    data_file: DataFile,
    positional_deletes: list[pa.ChunkedArray] | None,
    sequence_number: int,
) -> Iterator[pa.RecordBatch]:
    first = first_row_id(data_file)
    offset = 0
    for batch in batches:
        rows = batch.num_rows
        batch = with_lineage(batch, first, offset, sequence_number)
        if positional_deletes:
            batch = batch.take(
                _combine_positional_deletes(positional_deletes, offset, offset + rows)
            )
        offset += rows
        yield batch


def with_lineage(
    batch: pa.RecordBatch, first: int | None, start: int, sequence_number: int
) -> pa.RecordBatch:
    """``batch``, the rows from position ``start`` of a data file whose ``first_row_id`` is
    ``first``, with each row's lineage (format v3): its ``_row_id`` and
    ``_last_updated_sequence_number`` columns where set, else ``first`` + position and
    ``sequence_number``; both null if ``first`` is None, as in Java. Deleted rows are dropped
    after this, so that positions are the file's."""
    rows = batch.num_rows
    row_id = batch.schema.get_field_index("_row_id")
    sequence = batch.schema.get_field_index("_last_updated_sequence_number")
    if first is None:
        ids, sequences = pa.nulls(rows, pa.int64()), pa.nulls(rows, pa.int64())
    else:
        inherited = pa.array(range(first + start, first + start + rows), pa.int64())
        ids = pc.coalesce(batch.column(row_id), inherited)
        sequences = pc.coalesce(batch.column(sequence), pa.scalar(sequence_number, pa.int64()))
    batch = batch.set_column(row_id, batch.schema.field(row_id), ids)
    return batch.set_column(sequence, batch.schema.field(sequence), sequences)


def live_positions(deleted: list[pa.ChunkedArray], start: int, end: int) -> pa.Array:
    """The positions in ``[start, end)`` of a data file that ``deleted`` does not list, as
    offsets from ``start`` (for ``RecordBatch.take``), as pyiceberg's read path computes them."""
    return _combine_positional_deletes(deleted, start, end)


def read_position_deletes(io: FileIO, delete_file: DataFile) -> dict[str, pa.ChunkedArray]:
    """Read a position delete file or a deletion vector into {data file path: positions}."""
    if is_deletion_vector(delete_file):
        return read_deletion_vector(io, delete_file)
    return _read_deletes(io, delete_file)


def write_schema(metadata: TableMetadata) -> tuple[Schema, pa.Schema]:
    """The Iceberg schema written to Parquet (names sanitised) and its Arrow form with field ids.

    :func:`read_schema`'s: with the row lineage columns for format v3.
    """
    schema = sanitize_column_names(read_schema(metadata))
    return schema, schema_to_pyarrow(schema, include_field_ids=True)


def to_write_batch(
    batch: pa.RecordBatch, read_schema: Schema, file_schema: Schema
) -> pa.RecordBatch:
    """Convert a batch read in ``read_schema`` to the Parquet file schema with field ids."""
    return _to_requested_schema(
        requested_schema=file_schema,
        file_schema=read_schema,
        batch=batch,
        include_field_ids=True,
        format_model=FileFormatFactory.get(FileFormat.PARQUET),
    )


def parquet_writer_kwargs(properties: dict[str, str]) -> dict[str, Any]:
    """pyarrow ParquetWriter options from the table's ``write.parquet.*`` properties."""
    with warnings.catch_warnings():
        # compactor implements write.parquet.row-group-size-bytes itself.
        warnings.simplefilter("ignore")
        return {**_get_parquet_writer_kwargs(properties), **WRITE_PAGE_CHECKSUMS}


def arrow_storage(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``array``, or its storage when its type is an extension type.

    pyiceberg reads uuid columns as Arrow's ``arrow.uuid`` extension type, which Arrow's joins,
    grouping and most kernels do not take; its storage, ``fixed_size_binary(16)``, holds the
    same 16 bytes.
    """
    kind = array.type
    if not isinstance(kind, pa.BaseExtensionType):
        return array
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([chunk.storage for chunk in array.chunks], kind.storage_type)
    return array.storage


def transform_arrow(
    transform: Transform[Any, Any], source_type: IcebergType, array: pa.Array
) -> pa.Array:
    """``transform`` applied to ``array``, a column of ``source_type`` (uuids come out as their
    :func:`arrow_storage`). pyiceberg's truncate takes no ``large_binary``, the type it reads
    binary columns as: they are cast to ``binary`` first."""
    if pa.types.is_large_binary(array.type):
        array = array.cast(pa.binary())
    return arrow_storage(transform.pyarrow_transform(source_type)(array))


def partition_value(field: PartitionField, source_type: IcebergType, value: Any) -> Any:
    """A partition tuple's value for ``value``, one of :func:`transform_arrow`'s results.

    pyiceberg's ``partition_record_value`` converts by the source column's type, which fails
    for a transform whose result has another type (the bucket of a time column is an int). A
    uuid is a :class:`uuid.UUID`, as pyiceberg reads it from manifests (its partition
    representation is the 16 bytes): a manifest holding both could not be summarised.
    """
    result_type = field.transform.result_type(source_type)
    if isinstance(result_type, UUIDType) and isinstance(value, bytes):
        return uuid.UUID(bytes=value)
    return _to_partition_representation(result_type, value)


def file_statistics(
    parquet_metadata: pq.FileMetaData, file_schema: Schema, properties: dict[str, str]
) -> dict[str, Any]:
    """Iceberg column metrics of a written Parquet file, honouring ``write.metadata.metrics.*``.

    Metrics cover the table's columns; row lineage columns get none (the metrics limit of
    ``write.metadata.metrics.max-inferred-column-defaults`` counts the table's columns only).
    """
    lineage = [f for f in file_schema.fields if f.field_id in LINEAGE_FIELD_IDS]
    table_columns = Schema(*[f for f in file_schema.fields if f.field_id not in LINEAGE_FIELD_IDS])
    plan = compute_statistics_plan(table_columns, properties)
    none = MetricsMode(MetricModeTypes.NONE)
    plan.update(
        (f.field_id, StatisticsCollector(f.field_id, LongType(), none, f.name)) for f in lineage
    )
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=plan,
        parquet_column_mapping=parquet_path_to_id_mapping(file_schema),
    )
    return stats.to_serialized_dict()


class PartitionPath:
    """Adapter giving a partition record the ``to_path()`` that location providers call."""

    def __init__(self, spec: PartitionSpec, schema: Schema, partition: Record) -> None:
        self._spec, self._schema, self._partition = spec, schema, partition

    def to_path(self) -> str:
        return self._spec.partition_to_path(self._partition, self._schema)


class PositionDeleteIndex:
    """pyiceberg's ``DeleteFileIndex`` (position deletes by partition and by referenced file),
    its partitions matched by :func:`partition_key`: a delete in partition ``x = NaN`` applies
    to the files of that partition, one in ``x = -0.0`` not to those of ``x = 0.0``.
    """

    def __init__(self) -> None:
        self._index = DeleteFileIndex()

    @staticmethod
    def _key(data_file: DataFile) -> Record:
        return Record(*partition_key(data_file.partition))

    def add_delete_file(self, entry: ManifestEntry) -> None:
        """Index the position delete file of ``entry`` (its data sequence number included)."""
        self._index.add_delete_file(entry, partition_key=self._key(entry.data_file))

    def for_data_file(self, sequence_number: int, data_file: DataFile) -> set[DataFile]:
        """The position delete files that apply to ``data_file`` of ``sequence_number``."""
        return self._index.for_data_file(
            sequence_number, data_file, partition_key=self._key(data_file)
        )


class FilePruner:
    """Decides, from partition values and column metrics, which files a row filter can touch."""

    def __init__(self, metadata: TableMetadata, row_filter: BooleanExpression) -> None:
        self._schema = metadata.schema()
        self._specs = metadata.specs()
        self._filter = row_filter
        self._manifest_evals: dict[int, Any] = {}
        self._partition_evals: dict[int, Any] = {}
        self._metrics_eval = _InclusiveMetricsEvaluator(
            self._schema, row_filter, case_sensitive=True
        )

    def _projection(self, spec_id: int) -> BooleanExpression:
        return inclusive_projection(self._schema, self._specs[spec_id], True)(self._filter)

    def manifest_may_match(self, manifest: ManifestFile) -> bool:
        spec_id = manifest.partition_spec_id
        if spec_id not in self._manifest_evals:
            spec = self._specs[spec_id]
            self._manifest_evals[spec_id] = manifest_evaluator(
                spec, self._schema, self._projection(spec_id), True
            )
        return self._manifest_evals[spec_id](manifest)

    def partition_may_match(self, data_file: DataFile) -> bool:
        spec_id = data_file.spec_id
        if spec_id not in self._partition_evals:
            spec = self._specs[spec_id]
            partition_schema = Schema(*spec.partition_type(self._schema).fields)
            self._partition_evals[spec_id] = expression_evaluator(
                partition_schema, self._projection(spec_id), True
            )
        return self._partition_evals[spec_id](data_file.partition)

    def file_may_match(self, data_file: DataFile) -> bool:
        return self.partition_may_match(data_file) and self._metrics_eval.eval(data_file)


EQUALITY_IDS_FIELD_ID = 135
PARTITION_FIELD_ID = 102


def _spec_data_file_type(data_file: StructType) -> StructType:
    """``data_file`` with ``equality_ids`` as the spec's ``list<int>``, partition fields optional.

    pyiceberg 0.12 declares ``equality_ids`` ``list<long>``; Iceberg Java then fails to read any
    manifest holding equality-delete entries (ClassCastException Long -> Integer). It also makes
    a partition field required when its source column is, so a ``void`` field (always null)
    cannot be written; Java declares every partition field optional.
    """
    fields = []
    for f in data_file.fields:
        if f.field_id == PARTITION_FIELD_ID and isinstance(f.field_type, StructType):
            optional = [
                NestedField(p.field_id, p.name, p.field_type, required=False, doc=p.doc)
                for p in f.field_type.fields
            ]
            f = NestedField(f.field_id, f.name, StructType(*optional), f.required, doc=f.doc)
        if f.field_id == EQUALITY_IDS_FIELD_ID and isinstance(f.field_type, ListType):
            element = f.field_type
            f = NestedField(
                field_id=f.field_id,
                name=f.name,
                field_type=ListType(element.element_id, IntegerType(), element_required=True),
                required=f.required,
                doc=f.doc,
            )
        fields.append(f)
    return StructType(*fields)


class _BufferedManifestFile(AvroOutputFile[ManifestEntry]):
    """pyiceberg's ``AvroOutputFile`` for manifests, buffered: entries are encoded as they come
    and the file is written on close.

    :class:`ManifestEncoder` encodes them many to a block (pyiceberg writes one block per entry,
    through its slow generic Avro writers, which are therefore not built here) and holds only
    their bytes. Nothing is written when the ``with`` body raises.
    """

    def __init__(self, output_file: OutputFile, schema: Schema, metadata: dict[str, str]) -> None:
        self.output_file = output_file
        self._encoder = ManifestEncoder(schema, metadata)

    def __enter__(self) -> _BufferedManifestFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self._encoder.write(self.output_file)

    def write_block(self, objects: list[ManifestEntry]) -> None:
        for entry in objects:
            self._encoder.add(entry)


class _SpecSchemaMixin(ManifestWriter):
    """Writes manifests whose Avro schema follows the Iceberg spec exactly."""

    def _with_partition(self, format_version: TableVersion) -> Schema:
        schema = super()._with_partition(format_version)
        return Schema(
            *[
                NestedField(f.field_id, f.name, _spec_data_file_type(f.field_type), f.required)
                if f.field_id == 2 and isinstance(f.field_type, StructType)
                else f
                for f in schema.fields
            ]
        )

    def new_writer(self) -> _BufferedManifestFile:
        return _BufferedManifestFile(
            self._output_file, self._with_partition(self.version), self._meta
        )


class _DataManifestWriterV1(_SpecSchemaMixin, ManifestWriterV1):
    """A v1 data manifest with the spec's schema."""


class _DataManifestWriterV2(_SpecSchemaMixin, ManifestWriterV2):
    """A v2 data manifest with the spec's schema."""


class _DeleteManifestWriterV2(_DataManifestWriterV2):
    """pyiceberg 0.12 writes only data manifests; this writes a v2 delete manifest."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def manifest_writer(
    content: ManifestContent,
    format_version: int,
    spec: PartitionSpec,
    schema: Schema,
    output_file: Any,
    snapshot_id: int,
    avro_compression: Any,
) -> ManifestWriter:
    """A manifest writer for data or (v2, v3) delete manifests, with the spec's Avro schema."""
    writers: dict[tuple[ManifestContent, int], type[ManifestWriter]] = {
        (ManifestContent.DATA, 1): _DataManifestWriterV1,
        (ManifestContent.DATA, 2): _DataManifestWriterV2,
        (ManifestContent.DELETES, 2): _DeleteManifestWriterV2,
        (ManifestContent.DATA, 3): _DataManifestWriterV3,
        (ManifestContent.DELETES, 3): _DeleteManifestWriterV3,
    }
    writer = writers.get((content, format_version))
    if writer is None:
        raise ValueError(
            f"cannot write a {content.name.lower()} manifest for format version {format_version}"
        )
    return writer(spec, schema, output_file, snapshot_id, avro_compression)


POSITION_DELETE_FILE_PATH_ID = 2147483546
POSITION_DELETE_POS_ID = 2147483545


def position_delete_schema() -> tuple[Schema, pa.Schema]:
    """The spec's position delete file schema (``file_path``, ``pos``), and in Arrow with field ids.

    pyiceberg's own ``POSITIONAL_DELETE_SCHEMA`` types ``pos`` as int; the spec says long.
    """
    from pyiceberg.types import LongType, StringType

    schema = Schema(
        NestedField(POSITION_DELETE_FILE_PATH_ID, "file_path", StringType(), required=True),
        NestedField(POSITION_DELETE_POS_ID, "pos", LongType(), required=True),
    )
    return schema, schema_to_pyarrow(schema, include_field_ids=True)


# pyarrow's S3 client tries 3 times by default: too few for a throttled bucket (503 SlowDown).
# Iceberg Java's S3FileIO retries 5 times (s3.retry.num-retries): 6 attempts, as here.
S3_RETRY_ATTEMPTS = 6
S3_RETRY_PROPERTY = "s3.retry-strategy-impl"


class PatientS3RetryStrategy(AwsStandardS3RetryStrategy):
    """pyarrow's standard S3 retries with exponential back-off, S3_RETRY_ATTEMPTS attempts.

    pyiceberg builds it from the ``s3.retry-strategy-impl`` property (a class path, no
    arguments), which :func:`with_s3_retries` sets unless the configuration sets its own.
    """

    def __init__(self) -> None:
        super().__init__(max_attempts=S3_RETRY_ATTEMPTS)


def with_s3_retries(properties: Mapping[str, Any]) -> dict[str, Any]:
    """``properties`` with compactor's S3 retry strategy, unless they name one already."""
    strategy = f"{PatientS3RetryStrategy.__module__}.{PatientS3RetryStrategy.__qualname__}"
    return {S3_RETRY_PROPERTY: strategy, **properties}


# --- Format v3: row lineage, deletion vectors ------------------------------------------------
#
# pyiceberg 0.12 reads manifests and manifest lists with the v2 schemas, so it drops the v3
# fields (a data file's first_row_id, a deletion vector's referenced_data_file and blob offset,
# a manifest's first_row_id), and it writes neither v3 manifests nor v3 manifest lists. The
# functions below read and write them with the spec's v3 schemas; for tables of format 1 and 2
# they are pyiceberg's own.

_V3_DATA_FILE_FIELDS = [f.name for f in DATA_FILE_TYPE[3].fields]
_V3_MANIFEST_FIELDS = [f.name for f in MANIFEST_LIST_FILE_SCHEMAS[3].fields]
_FIRST_ROW_ID = _V3_DATA_FILE_FIELDS.index("first_row_id")
_REFERENCED_DATA_FILE = _V3_DATA_FILE_FIELDS.index("referenced_data_file")
_CONTENT_OFFSET = _V3_DATA_FILE_FIELDS.index("content_offset")
_CONTENT_SIZE = _V3_DATA_FILE_FIELDS.index("content_size_in_bytes")
_MANIFEST_FIRST_ROW_ID = _V3_MANIFEST_FIELDS.index("first_row_id")
_PARTITION_FIELD_ID = 102  # data_file.partition in a manifest entry
# A deletion-vector-v1 blob: length (4 bytes, big-endian), magic, the bitmap, CRC-32 (big-endian).
DV_MAGIC = bytes([0xD1, 0xD3, 0x39, 0x64])


def _field(record: Record, position: int) -> Any:
    return record[position] if len(record) > position else None


def record_values(record: Record) -> list[Any]:
    """A record's values, in order (the list itself: not to be changed)."""
    return record._data


def first_row_id(data_file: DataFile) -> int | None:
    """The row id of the data file's first row (v3; inherited values included), or None."""
    return _field(data_file, _FIRST_ROW_ID)


def referenced_data_file(delete_file: DataFile) -> str | None:
    """The one data file a (v3) delete file applies to, when it names one."""
    return _field(delete_file, _REFERENCED_DATA_FILE)


def is_deletion_vector(delete_file: DataFile) -> bool:
    """Whether ``delete_file`` is a deletion vector (a ``deletion-vector-v1`` blob in Puffin)."""
    return delete_file.file_format == FileFormat.PUFFIN


def delete_file_key(delete_file: DataFile) -> str:
    """What identifies a file of a manifest: its path, plus the blob offset for a DV.

    The deletion vectors of one commit share a Puffin file, one manifest entry each, so a path
    alone names them all.
    """
    if is_deletion_vector(delete_file):
        return f"{delete_file.file_path}#{_field(delete_file, _CONTENT_OFFSET)}"
    return delete_file.file_path


def as_v3_data_file(data_file: DataFile) -> DataFile:
    """``data_file`` with the v3 fields (None where it had none), as v3 manifests store it."""
    if len(data_file) == len(_V3_DATA_FILE_FIELDS):
        return data_file
    values = [data_file[i] for i in range(len(data_file))]
    widened = DataFile(*values, *[None] * (len(_V3_DATA_FILE_FIELDS) - len(values)))
    widened.spec_id = data_file.spec_id
    return widened


def _as_v3_manifest(manifest: ManifestFile) -> ManifestFile:
    values = [manifest[i] for i in range(len(manifest))]
    return ManifestFile(*values, *[None] * (len(_V3_MANIFEST_FIELDS) - len(values)))


def manifest_first_row_id(manifest: ManifestFile) -> int | None:
    """The first row id the manifest list assigned to a v3 data manifest, or None."""
    return _field(manifest, _MANIFEST_FIRST_ROW_ID)


def snapshot_manifests(io: FileIO, snapshot: Snapshot, format_version: int) -> list[ManifestFile]:
    """The manifests of ``snapshot``; for format v3 with their ``first_row_id``."""
    if format_version < 3:
        return snapshot.manifests(io)
    with AvroFile[ManifestFile](
        io.new_input(snapshot.manifest_list),
        MANIFEST_LIST_FILE_SCHEMAS[3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        return list(reader)


# The Avro header key of the writer's schema, and how many resolved readers are kept.
AVRO_SCHEMA_KEY = "avro.schema"
RESOLVED_READERS = 64


class _CachedReaderAvroFile(AvroFile[Any]):
    """pyiceberg's AvroFile, resolving the reader once per distinct file schema.

    Resolving a manifest's Avro schema against the read schema costs milliseconds in Python,
    more than decoding a small manifest's entries; a table's manifests share a handful of
    schemas (one per partition spec and writer). Readers hold no state of their own: a cached
    one serves every file, from any thread.
    """

    _resolved: dict[tuple[str, int], tuple[Schema, Any]] = {}
    _lock = threading.Lock()

    def __enter__(self) -> _CachedReaderAvroFile:
        with self.input_file.open() as stream:
            self.decoder = new_decoder(stream.read())
        self.header = self._read_header()
        key = (self.header.meta.get(AVRO_SCHEMA_KEY, ""), id(self.read_schema))
        with self._lock:
            resolved = self._resolved.get(key)
        if resolved is None:
            schema = self.header.get_schema()
            partition = schema.find_field(_PARTITION_FIELD_ID).field_type
            assert isinstance(partition, StructType)
            refuse_fixed_partitions(partition, f"manifest {self.input_file.location}")
            reader = resolve_reader(
                schema, self.read_schema or schema, self.read_types, self.read_enums
            )
            resolved = (schema, reader)
            with self._lock:
                if len(self._resolved) >= RESOLVED_READERS:
                    self._resolved.clear()
                self._resolved[key] = resolved
        self.schema, self.reader = resolved
        if not self.read_schema:
            self.read_schema = self.schema
        return self

    def _read_header(self) -> AvroFileHeader:
        return _HEADER_READER.read(self.decoder)


_HEADER_READER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})


def avro_blocks(data: bytes) -> tuple[str, Iterator[tuple[int, BinaryDecoder]]]:
    """An Avro file's writer schema (its JSON) and its blocks: (records, decoder) each,
    decompressed, sync markers checked (as pyiceberg's ``AvroFile`` reads them)."""
    decoder = new_decoder(data)
    header = _HEADER_READER.read(decoder)
    codec = header.compression_codec()

    def blocks() -> Iterator[tuple[int, BinaryDecoder]]:
        while decoder.tell() < len(data):
            records = decoder.read_int()
            block = decoder.read_bytes()
            yield records, new_decoder(codec.decompress(block) if codec else block)
            if decoder.read(SYNC_SIZE) != header.sync:
                raise ValueError("Avro block not followed by the file's sync marker")

    return header.meta[AVRO_SCHEMA_KEY], blocks()


def manifest_entries(
    io: FileIO, manifest: ManifestFile, format_version: int, discard_deleted: bool = True
) -> list[ManifestEntry]:
    """The entries of ``manifest`` with inherited values filled in.

    For format v3, each data file without a ``first_row_id`` inherits the manifest's plus the
    record counts of the files before it that had none (the spec's first-row-id inheritance).
    Read as pyiceberg's ``fetch_manifest_entry`` reads them (v3 fields kept for v3 tables), with
    the decoder built once per distinct file schema rather than once per file.
    """
    return list(iter_manifest_entries(io, manifest, format_version, discard_deleted))


def iter_manifest_entries(
    io: FileIO, manifest: ManifestFile, format_version: int, discard_deleted: bool = True
) -> Iterator[ManifestEntry]:
    """The entries of :func:`manifest_entries`, one at a time as they are decoded."""
    read_version = 3 if format_version >= 3 else DEFAULT_READ_VERSION
    with _CachedReaderAvroFile(
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[read_version],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        yield from _inheriting(reader, manifest, discard_deleted)


def with_inherited_values(
    entries: Iterable[ManifestEntry], manifest: ManifestFile, discard_deleted: bool = True
) -> list[ManifestEntry]:
    """``entries`` as read from ``manifest``, with what they inherit from it filled in
    (snapshot id, sequence numbers, spec id; for v3, first row ids): see
    :func:`manifest_entries`. DELETED entries are let go of as they come when
    ``discard_deleted`` (a manifest can hold a hundred thousand, at ~10 KB each decoded)."""
    return list(_inheriting(entries, manifest, discard_deleted))


def _inheriting(
    entries: Iterable[ManifestEntry], manifest: ManifestFile, discard_deleted: bool
) -> Iterator[ManifestEntry]:
    next_row_id = manifest_first_row_id(manifest)
    if manifest.content != ManifestContent.DATA:
        next_row_id = None
    for read in entries:
        entry = _inherit_from_manifest(read, manifest)
        data_file = entry.data_file
        if (
            next_row_id is not None
            and data_file.content == DataFileContent.DATA
            and first_row_id(data_file) is None
        ):
            data_file[_FIRST_ROW_ID] = next_row_id
            next_row_id += data_file.record_count
        if not discard_deleted or entry.status != ManifestEntryStatus.DELETED:
            yield entry


class _V3Mixin(ManifestWriterV2):
    """Writes v3 manifests: the v3 ``data_file`` fields, kept from each entry."""

    @property
    def version(self) -> TableVersion:
        return 3

    def prepare_entry(self, entry: ManifestEntry) -> ManifestEntry:
        entry = super().prepare_entry(entry)
        # Inherited first_row_id values stay with EXISTING and DELETED entries, as the spec asks.
        return ManifestEntry.from_args(
            status=entry.status,
            snapshot_id=entry.snapshot_id,
            sequence_number=entry.sequence_number,
            file_sequence_number=entry.file_sequence_number,
            data_file=as_v3_data_file(entry.data_file),
        )


class _DataManifestWriterV3(_V3Mixin, _DataManifestWriterV2):
    """A v3 data manifest with the spec's schema."""


class _DeleteManifestWriterV3(_V3Mixin, _DeleteManifestWriterV2):
    """A v3 delete manifest with the spec's schema."""


class _ManifestListWriterV3(ManifestListWriterV2):
    """A v3 manifest list: assigns ``first_row_id`` to data manifests that have none.

    Each assignment leaves room for the manifest's existing and added rows (files of manifests
    written before the table was v3 inherit their ids too); ``next_row_id`` is then the
    table's next row id after this snapshot.
    """

    def __init__(
        self,
        output_file: Any,
        snapshot_id: int,
        parent_snapshot_id: int | None,
        sequence_number: int,
        compression: Any,
        first_row_id: int,
    ) -> None:
        super().__init__(output_file, snapshot_id, parent_snapshot_id, sequence_number, compression)
        self._format_version = 3
        self._meta = {**self._meta, "format-version": "3", "first-row-id": str(first_row_id)}
        self.next_row_id = first_row_id

    def __enter__(self) -> _ManifestListWriterV3:
        self._writer = AvroOutputFile[ManifestFile](
            output_file=self._output_file,
            record_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            file_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            schema_name="manifest_file",
            metadata=self._meta,
        )
        self._writer.__enter__()
        return self

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        manifest = _as_v3_manifest(super().prepare_manifest(manifest_file))
        if manifest.content == ManifestContent.DATA and manifest_first_row_id(manifest) is None:
            manifest[_MANIFEST_FIRST_ROW_ID] = self.next_row_id
            self.next_row_id += (manifest.existing_rows_count or 0) + (
                manifest.added_rows_count or 0
            )
        return manifest


def write_manifest_list(
    metadata: TableMetadata,
    output_file: Any,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int,
    avro_compression: Any,
    manifests: list[ManifestFile],
) -> dict[str, int]:
    """Write the manifest list of a new snapshot of the table ``metadata`` describes.

    Returns the snapshot's row-lineage fields for format v3 (``first_row_id``, ``added_rows``),
    else nothing: keyword arguments for pyiceberg's ``Snapshot``.
    """
    if not isinstance(metadata, TableMetadataV3):
        with _write_manifest_list(
            format_version=metadata.format_version,
            output_file=output_file,
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent_snapshot_id,
            sequence_number=sequence_number,
            avro_compression=avro_compression,
        ) as writer:
            writer.add_manifests(manifests)
        return {}
    first = metadata.next_row_id or 0
    with _ManifestListWriterV3(
        output_file, snapshot_id, parent_snapshot_id, sequence_number, avro_compression, first
    ) as writer:
        writer.add_manifests(manifests)
    return {"first_row_id": first, "added_rows": writer.next_row_id - first}


def read_deletion_vector(io: FileIO, dv: DataFile) -> dict[str, pa.ChunkedArray]:
    """Read one deletion vector: {its data file's path: the deleted positions}.

    Reads only the DV's blob (``content_offset``, ``content_size_in_bytes``) and checks its
    length, magic and CRC before trusting it.
    """
    offset, size = _field(dv, _CONTENT_OFFSET), _field(dv, _CONTENT_SIZE)
    target = referenced_data_file(dv)
    if offset is None or size is None or target is None:
        raise ValueError("a deletion vector without referenced_data_file, content_offset or size")
    with io.new_input(dv.file_path).open() as stream:
        stream.seek(offset)
        blob = stream.read(size)
    length = int.from_bytes(blob[0:4], "big")
    if len(blob) != size or length != size - 8 or blob[4:8] != DV_MAGIC:
        raise ValueError(f"the blob at offset {offset} is not a deletion-vector-v1 blob")
    if zlib.crc32(blob[4 : 4 + length]) != int.from_bytes(blob[4 + length :], "big"):
        raise ValueError(f"the deletion vector at offset {offset} fails its CRC check")
    bitmaps = DeletionVector._deserialize_bitmap(blob[8 : 4 + length])
    return {target: DeletionVector(target, bitmaps).to_vector()}


def _dump_v3_metadata(
    self: TableMetadataV3,
    exclude_none: bool = True,
    exclude: Any | None = None,
    by_alias: bool = True,
    **kwargs: Any,
) -> str:
    """TableMetadataV3 as JSON, checked to read back equal (pyiceberg 0.12 refuses to write v3)."""
    text = IcebergBaseModel.model_dump_json(
        self, exclude_none=exclude_none, exclude=exclude, by_alias=by_alias, **kwargs
    )
    if TableMetadataV3.model_validate_json(text) != self:
        raise ValueError(f"table {self.location}: its v3 metadata does not serialise faithfully")
    return text


_install_lock = threading.Lock()
_installed = False


def _read_double(self: DoubleReader, decoder: BinaryDecoder) -> float:
    """An Avro double at full precision: pyiceberg 0.12's compiled decoder reads it as a
    single-precision float (apache/iceberg-python#3808)."""
    return float(struct.unpack("<d", decoder.read(8))[0])


_project_list = pyiceberg_pyarrow.ArrowProjectionVisitor.list
_project_map = pyiceberg_pyarrow.ArrowProjectionVisitor.map


def _with_nulls_of(source: pa.Array | None, projected: pa.Array | None) -> pa.Array | None:
    """``projected`` with ``source``'s null lists or maps null again where the projection made
    them empty (it rebuilds a list or map of structs from the offsets alone)."""
    if (
        source is None
        or projected is None
        or not source.null_count
        or projected.null_count == source.null_count
    ):
        return projected
    mask = source.is_null()
    if isinstance(projected, pa.MapArray):
        return pa.MapArray.from_arrays(
            projected.offsets, projected.keys, projected.items, projected.type, mask=mask
        )
    assert isinstance(projected, (pa.ListArray, pa.LargeListArray)), projected.type
    return type(projected).from_arrays(
        projected.offsets, projected.values, projected.type, mask=mask
    )


def _list_keeping_nulls(
    self: pyiceberg_pyarrow.ArrowProjectionVisitor,
    list_type: ListType,
    list_array: pa.Array | None,
    value_array: pa.Array | None,
) -> pa.Array | None:
    """pyiceberg's projection of a list, a null list of structs kept null
    (apache/iceberg-python#3833)."""
    return _with_nulls_of(list_array, _project_list(self, list_type, list_array, value_array))


def _map_keeping_nulls(
    self: pyiceberg_pyarrow.ArrowProjectionVisitor,
    map_type: MapType,
    map_array: pa.Array | None,
    key_result: pa.Array | None,
    value_result: pa.Array | None,
) -> pa.Array | None:
    """pyiceberg's projection of a map, a null map of structs kept null
    (apache/iceberg-python#3833)."""
    projected = _project_map(self, map_type, map_array, key_result, value_result)
    return _with_nulls_of(map_array, projected)


def install() -> None:
    """Apply compactor's four fixes to pyiceberg 0.12 in this process; again, it does nothing.

    - **Page checksums**: pyiceberg's Parquet reads (its ``_get_file_format``) verify page
      checksums where a file has them (:data:`VERIFY_PAGE_CHECKSUMS`), so that damage that
      still decodes is an error, not other values rewritten into a new file.
    - **v3 metadata**: pyiceberg models v3 metadata (``next-row-id``, snapshots'
      ``first-row-id`` and ``added-rows``) but ``TableMetadataV3.model_dump_json`` raises, so
      catalogs that write metadata.json themselves (SQL, Glue) cannot commit to v3 tables.
      compactor writes v3 snapshots through the functions above; the model's own serialisation
      is enabled, each write checked to parse back to the same metadata.
    - **Avro doubles**: pyiceberg's compiled Avro decoder rounds doubles to single precision,
      so a manifest's ``identity`` partition value of a double column (0.1 read back as
      0.10000000149011612) would be written back changed into every manifest compactor
      rewrites, and Iceberg Java takes such column values from the manifest. Doubles are read
      as the 8 bytes they are.
    - **Null lists and maps**: pyiceberg's projection of a file's rows rebuilds a list or map of
      structs from its offsets and loses its null mask, so a null ``list<struct>`` or
      ``map<_, struct>`` would be rewritten as an empty one. The mask is put back.

    Nothing is patched on import: the library's actions (:mod:`compactor.api`, which the CLI
    and the daemon call) and :func:`~compactor.rewrite.task_runner.run_task` (which executors
    run in processes of their own) call this first.
    ``tests/integration/test_pyiceberg_patches.py`` fails when a pyiceberg release no longer
    needs a fix: remove it here then.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        # Patching is assigning over pyiceberg's function (an lru_cache wrapper) and method,
        # which mypy rightly refuses.
        pyiceberg_pyarrow._get_file_format = _verifying_file_format  # type: ignore[assignment]
        TableMetadataV3.model_dump_json = _dump_v3_metadata  # type: ignore[method-assign]
        DoubleReader.read = _read_double  # type: ignore[method-assign]
        visitor = pyiceberg_pyarrow.ArrowProjectionVisitor
        visitor.list = _list_keeping_nulls  # type: ignore[method-assign]
        visitor.map = _map_keeping_nulls  # type: ignore[method-assign]
        _installed = True
