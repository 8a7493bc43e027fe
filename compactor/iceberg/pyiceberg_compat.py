"""The only module that touches private pyiceberg APIs (pinned to pyiceberg 0.12.x).

pyiceberg has no public API to read one data file through the Iceberg read path with its
position deletes, to write Parquet with Iceberg column statistics from a stream, or to match
delete files to data files. Everything compactor needs of that lives here, so that a pyiceberg
upgrade touches this file alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow.fs import AwsStandardS3RetryStrategy
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.visitors import (
    _InclusiveMetricsEvaluator,
    bind,
    expression_evaluator,
    inclusive_projection,
    manifest_evaluator,
)
from pyiceberg.io import FileIO
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import (
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
    DataFile,
    FileFormat,
    ManifestContent,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV1,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table import FileScanTask
from pyiceberg.table.delete_file_index import DeleteFileIndex
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import IntegerType, ListType, MapType, NestedField, StructType

__all__ = [
    "DeleteFileIndex",
    "FilePruner",
    "PartitionPath",
    "file_statistics",
    "parquet_writer_kwargs",
    "read_data_file",
    "read_position_deletes",
    "to_write_batch",
    "write_schema",
    "manifest_writer",
]


def read_data_file(
    io: FileIO,
    metadata: TableMetadata,
    data_file: DataFile,
    positional_deletes: list[pa.ChunkedArray] | None,
) -> Iterator[pa.RecordBatch]:
    """Stream one data file's live rows in the current schema.

    Columns are matched by field id (or by the table's name mapping for files without ids),
    missing columns are filled per the spec's projection rules, and deleted positions dropped.
    """
    schema = metadata.schema()
    return _task_to_record_batches(
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
        positional_deletes or None,
        True,
        metadata.name_mapping(),
        metadata.specs().get(data_file.spec_id),
        metadata.format_version,
        None,
    )


def read_position_deletes(io: FileIO, delete_file: DataFile) -> dict[str, pa.ChunkedArray]:
    """Read a position delete file into {data file path: deleted positions}."""
    return _read_deletes(io, delete_file)


def write_schema(metadata: TableMetadata) -> tuple[Schema, pa.Schema]:
    """The Iceberg schema written to Parquet (names sanitised) and its Arrow form with field ids."""
    schema = sanitize_column_names(metadata.schema())
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
        return _get_parquet_writer_kwargs(properties)


def file_statistics(
    parquet_metadata: pq.FileMetaData, file_schema: Schema, properties: dict[str, str]
) -> dict[str, Any]:
    """Iceberg column metrics of a written Parquet file, honouring ``write.metadata.metrics.*``."""
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=compute_statistics_plan(file_schema, properties),
        parquet_column_mapping=parquet_path_to_id_mapping(file_schema),
    )
    return stats.to_serialized_dict()


class PartitionPath:
    """Adapter giving a partition record the ``to_path()`` that location providers call."""

    def __init__(self, spec: PartitionSpec, schema: Schema, partition: Record) -> None:
        self._spec, self._schema, self._partition = spec, schema, partition

    def to_path(self) -> str:
        return self._spec.partition_to_path(self._partition, self._schema)


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


class _SpecSchemaMixin:
    """Writes manifests whose Avro schema follows the Iceberg spec exactly."""

    def _with_partition(self, format_version: Any) -> Schema:
        schema = super()._with_partition(format_version)  # type: ignore[misc]
        return Schema(
            *[
                NestedField(f.field_id, f.name, _spec_data_file_type(f.field_type), f.required)
                if f.field_id == 2 and isinstance(f.field_type, StructType)
                else f
                for f in schema.fields
            ]
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
    """A manifest writer for data or (v2) delete manifests, with the spec's Avro schema."""
    writers: dict[tuple[ManifestContent, int], type[ManifestWriter]] = {
        (ManifestContent.DATA, 1): _DataManifestWriterV1,
        (ManifestContent.DATA, 2): _DataManifestWriterV2,
        (ManifestContent.DELETES, 2): _DeleteManifestWriterV2,
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
