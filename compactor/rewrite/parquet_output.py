"""Write a stream of record batches into Parquet data files that roll at the target size."""

from __future__ import annotations

import functools
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table.locations import LocationProvider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.transforms import VoidTransform
from pyiceberg.typedef import Record

from compactor.iceberg.pyiceberg_compat import (
    PartitionPath,
    arrow_storage,
    file_statistics,
    parquet_writer_kwargs,
    partition_value,
    read_schema,
    to_write_batch,
    transform_arrow,
    write_schema,
)
from compactor.iceberg.value_keys import canonical_array, same_partition
from compactor.options.compact import ROW_GROUP_SIZE_PROPERTY
from compactor.options.defaults import DEFAULT_ROW_GROUP_SIZE
from compactor.planning.planner import is_unpartitioned
from compactor.planning.sort_order import SortField
from compactor.rewrite.bulk_read import FIELD_ID
from compactor.rewrite.freed_memory import hand_back_near
from compactor.rewrite.phase_times import phase

# A file is closed once it is this close to the target; the next row group is sized to fill it.
FILL_RATIO = 0.97
MIN_ROW_GROUP_BYTES = 256 * 1024
COALESCE_BATCHES = 256


def field_positions(schema: pa.Schema) -> dict[int, int]:
    """Field id -> column position in an output Arrow schema (top-level columns)."""
    return {
        int(f.metadata[FIELD_ID]): i
        for i, f in enumerate(schema)
        if f.metadata and FIELD_ID in f.metadata
    }


@dataclass
class OutputSpec:
    """Where and how a group's output files are written."""

    metadata: TableMetadata
    io: FileIO
    locations: LocationProvider
    spec_id: int
    partition: Record
    target_file_size: int
    # In-memory bytes the rows of one row group may take: pyarrow writes a row group from rows
    # all held in memory, so this is the memory budget's cap on it (see RollingParquetWriter).
    row_group_size: int
    file_prefix: str
    sort_order_id: int | None = None  # the table sort order the rows are written in
    # The memory limit of the process writing: freed pages are handed back past a share of it.
    memory_limit: int | None = None


def output_file_name(prefix: str, counter: int, suffix: str = "") -> str:
    """The name of a run's ``counter``-th output file of a group (``prefix`` names both)."""
    return f"{prefix}-{counter:05d}-{uuid.uuid4().hex[:8]}{suffix}.parquet"


def output_location(
    metadata: TableMetadata,
    locations: LocationProvider,
    spec_id: int,
    partition: Record,
    name: str,
) -> str:
    """Where the file ``name`` of ``partition`` goes: under the partition's path, unless the
    spec is unpartitioned (all-void specs too, as Java's location provider)."""
    spec = metadata.specs()[spec_id]
    key = None
    if not is_unpartitioned(spec):
        key = PartitionPath(spec, metadata.schema(), partition)
    return locations.new_data_location(name, key)  # type: ignore[arg-type]


@dataclass
class _OpenFile:
    path: str
    stream: Any
    writer: pq.ParquetWriter
    raw_bytes: int = 0


@dataclass
class RollingParquetWriter:
    """Accepts batches in the table's read schema (or already in :attr:`arrow_schema`);
    produces Iceberg DataFiles of ~target size.

    A row group closes once it holds the table's ``write.parquet.row-group-size-bytes`` of
    written (compressed) bytes, as Iceberg Java's writer closes them (default 128 MiB), or once
    its rows take ``out.row_group_size`` bytes in memory, whichever comes first. pyarrow has no
    row group that batches append to (each ``write_table`` closes its own): a row group's rows
    are buffered decoded until it is written, so the memory budget bounds them, and the rows
    that make the written size are estimated from the written bytes per in-memory byte so far.
    Paths of every file created are kept in ``created`` so a failed group can remove them.
    """

    out: OutputSpec
    on_create: Callable[[str], None] | None = None
    created: list[str] = field(default_factory=list)
    data_files: list[DataFile] = field(default_factory=list)
    records_written: int = 0
    _buffer: list[pa.RecordBatch] = field(default_factory=list)
    _buffered_bytes: int = 0
    _file: _OpenFile | None = None
    # Compressed bytes on disk per in-memory byte, learnt from what has been written so far.
    _ratio: float = 0.0
    _counter: int = 0
    # Parquet leaf columns the next file dictionary-encodes (see :func:`dictionary_columns`).
    _dictionary: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._read_schema: Schema = read_schema(self.out.metadata)
        self._file_schema, self._arrow_schema = write_schema(self.out.metadata)
        self._properties = self.out.metadata.properties
        self._writer_kwargs = parquet_writer_kwargs(self._properties)
        self._leaf_paths = parquet_leaf_paths(self._arrow_schema)
        self._row_group_target = row_group_target(self._properties)

    def write(self, batch: pa.RecordBatch) -> None:
        """Buffer one batch; flush a row group when the buffer reaches its budget.

        A batch larger than the room left in the budget is split, so that a row group (and so
        the file it closes) does not overshoot by up to a whole batch: readers hand over whole
        input files as one batch, often larger than the budget itself.
        """
        if batch.num_rows == 0:
            return
        batch = self.to_output(batch)
        while batch.num_rows:
            budget = self._row_group_budget()
            room = budget - self._buffered_bytes
            size = batch.nbytes
            if size <= room or batch.num_rows == 1:
                self._buffer.append(batch)
                self._buffered_bytes += size
                if len(self._buffer) >= COALESCE_BATCHES:
                    # Many small batches (one per small input file) cost far more memory than
                    # their rows: keep them as one.
                    self._buffer = [pa.concat_batches(self._buffer)]
                if self._buffered_bytes >= budget:
                    self._flush_row_group()
                return
            rows = max(1, batch.num_rows * room // size)
            head = batch.slice(0, rows)
            self._buffer.append(head)
            self._buffered_bytes += head.nbytes
            self._flush_row_group()
            batch = batch.slice(rows)

    def to_output(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (in the table's read schema, or already the output's) in :attr:`arrow_schema`."""
        if not batch.schema.equals(self._arrow_schema, check_metadata=True):
            batch = to_write_batch(batch, self._read_schema, self._file_schema)
            if batch.schema != self._arrow_schema:
                batch = batch.cast(self._arrow_schema)
        return batch

    @property
    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the written files (field ids in the field metadata)."""
        return self._arrow_schema

    def close(self) -> list[DataFile]:
        """Flush what is buffered and close the last file; returns every DataFile written."""
        if self._buffer:
            self._flush_row_group()
        self._close_file()
        return self.data_files

    def abort(self) -> None:
        """Close any open file without producing a DataFile (its path stays in ``created``)."""
        if self._file is not None:
            try:
                self._file.writer.close()
            finally:
                self._file.stream.close()
                self._file = None

    def _written(self) -> int:
        return self._file.stream.tell() if self._file else 0

    def _row_group_budget(self) -> int:
        """In-memory bytes of rows for the next row group: as many as write the table's row
        group size, or what the file has room for if less, within the memory budget. Before
        any is written, how many that is is unknown: the first row group takes the row group
        size (or the target file size, if smaller) in memory, as rows seldom take fewer bytes
        written than in memory; its written size then sizes the others."""
        memory = self.out.row_group_size
        if self._ratio <= 0:
            return min(memory, self._row_group_target, self.out.target_file_size)
        room = max(self.out.target_file_size - self._written(), 0)
        written = min(self._row_group_target, room)
        return int(max(MIN_ROW_GROUP_BYTES, min(memory, written / self._ratio)))

    def _flush_row_group(self) -> None:
        table = pa.Table.from_batches(self._buffer, schema=self._arrow_schema)
        self._buffer, raw = [], self._buffered_bytes
        self._buffered_bytes = 0
        if self._file is None:
            self._dictionary = dictionary_columns(table, self._leaf_paths)
            self._open_file()
        assert self._file is not None
        before, rows = self._written(), table.num_rows
        self._file.writer.write_table(table, row_group_size=max(rows, 1))
        del table  # its rows are written: their pages are free to hand back
        hand_back_near(self.out.memory_limit)
        self._file.raw_bytes += raw
        self.records_written += rows
        written = self._written()
        if written > before and raw > 0:
            self._ratio = max(written, 1) / max(self._file.raw_bytes, 1)
        if written >= self.out.target_file_size * FILL_RATIO:
            self._close_file()

    def _open_file(self) -> None:
        name = output_file_name(self.out.file_prefix, self._counter)
        self._counter += 1
        out = self.out
        path = output_location(out.metadata, out.locations, out.spec_id, out.partition, name)
        self.created.append(path)
        if self.on_create:
            self.on_create(path)
        stream = self.out.io.new_output(path).create(overwrite=False)
        try:
            writer = pq.ParquetWriter(
                stream,
                schema=self._arrow_schema,
                store_decimal_as_integer=True,
                use_dictionary=self._dictionary,
                **self._writer_kwargs,
            )
        except Exception:
            stream.close()
            raise
        self._file = _OpenFile(path, stream, writer)

    def _close_file(self) -> None:
        if self._file is None:
            return
        current, self._file = self._file, None
        try:
            current.writer.close()
            size = current.stream.tell()
        finally:
            current.stream.close()
        with phase("statistics"):
            statistics = file_statistics(
                current.writer.writer.metadata, self._file_schema, self._properties
            )
            data_file = DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=current.path,
                file_format=FileFormat.PARQUET,
                partition=self.out.partition,
                file_size_in_bytes=size,
                sort_order_id=self.out.sort_order_id,
                equality_ids=None,
                key_metadata=None,
                **statistics,
            )
        data_file.spec_id = self.out.spec_id
        self.data_files.append(data_file)


def row_group_target(properties: dict[str, str]) -> int:
    """Written bytes a row group closes at: the table's ``write.parquet.row-group-size-bytes``
    (checked when options are resolved), :data:`DEFAULT_ROW_GROUP_SIZE` when unset."""
    try:
        size = int(properties.get(ROW_GROUP_SIZE_PROPERTY, DEFAULT_ROW_GROUP_SIZE))
    except ValueError:
        size = DEFAULT_ROW_GROUP_SIZE
    return size if size > 0 else DEFAULT_ROW_GROUP_SIZE


@functools.lru_cache(maxsize=64)
def parquet_leaf_paths(schema: pa.Schema) -> dict[str, list[str]]:
    """Top-level column name -> the dotted paths of its Parquet leaf columns (cached per schema:
    every partition's writer of a run asks for the same one; callers only read it)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), buffer)
    parquet = pq.ParquetFile(pa.BufferReader(buffer.getvalue())).schema
    paths: dict[str, list[str]] = {name: [] for name in schema.names}
    for i in range(len(parquet)):
        path = parquet.column(i).path
        paths[path.split(".", 1)[0]].append(path)
    return paths


def dictionary_columns(table: pa.Table, leaf_paths: dict[str, list[str]]) -> list[str]:
    """The leaf columns of ``table``'s file worth dictionary-encoding, judged on its first rows.

    pyarrow dictionary-encodes every column until the dictionary reaches its page limit; on a
    high-cardinality column (ids, timestamps, URLs) the dictionary costs more than it saves,
    and merging many small files makes it larger still. Like parquet-java (Iceberg's reference
    writer), a primitive column is dictionary-encoded only when its distinct values plus the
    indices take fewer bytes than its values written plain; nested columns always are.
    """
    chosen = []
    for name, paths in leaf_paths.items():
        column = table.column(name)
        column = arrow_storage(column)  # uuid: judged on its storage
        if pa.types.is_nested(column.type) or _dictionary_pays(column):
            chosen += paths
    return chosen


_VARIABLE_WIDTH = (
    pa.types.is_binary,
    pa.types.is_string,
    pa.types.is_large_binary,
    pa.types.is_large_string,
)


def _plain_bytes(values: pa.Array | pa.ChunkedArray) -> int:
    """Bytes of the non-null ``values`` in Parquet's plain encoding (before compression)."""
    count = len(values) - values.null_count
    kind = values.type
    if any(is_kind(kind) for is_kind in _VARIABLE_WIDTH):
        lengths = pc.sum(pc.binary_length(values)).as_py() or 0
        return lengths + 4 * count
    return count * _plain_bits(kind) // 8


def _plain_bits(kind: pa.DataType) -> int:
    """Bits of one fixed-width value of ``kind`` as Parquet stores it, not as Arrow holds it:
    a decimal is an INT32 up to 9 digits, an INT64 up to 18, else the fewest bytes that hold
    its precision (as written with ``store_decimal_as_integer``); 8 and 16-bit integers are
    INT32."""
    if pa.types.is_decimal(kind):
        if kind.precision <= 9:
            return 32
        if kind.precision <= 18:
            return 64
        return 8 * math.ceil((kind.precision * math.log2(10) + 1) / 8)
    if pa.types.is_integer(kind):
        return max(kind.bit_width, 32)
    return int(kind.bit_width)


def _dictionary_pays(column: pa.ChunkedArray) -> bool:
    count = len(column) - column.null_count
    distinct = pc.unique(column).drop_null()
    if count == 0 or len(distinct) <= 1:
        return True
    index_bytes = count * math.ceil(math.log2(len(distinct))) / 8
    return _plain_bytes(distinct) + index_bytes < _plain_bytes(column)


class PartitioningWriter:
    """Writes rows of many partitions of ``out``'s spec, one :class:`RollingParquetWriter` at a
    time: rows must come ordered by their partition values (:func:`partition_order` first), so
    each partition's files are written in turn and at most one file is open.
    """

    def __init__(self, out: OutputSpec, on_create: Callable[[str], None] | None = None) -> None:
        self._out, self._on_create = out, on_create
        self._template = RollingParquetWriter(out)
        spec, schema = out.metadata.specs()[out.spec_id], out.metadata.schema()
        positions = field_positions(self._template.arrow_schema)
        self._fields = [
            (field, positions[field.source_id], schema.find_type(field.source_id))
            for field in spec.fields
        ]
        self._current: RollingParquetWriter | None = None
        self._done: list[RollingParquetWriter] = []

    @property
    def arrow_schema(self) -> pa.Schema:
        return self._template.arrow_schema

    def to_output(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return self._template.to_output(batch)

    @property
    def created(self) -> list[str]:
        return [p for w in self._writers() for p in w.created]

    @property
    def records_written(self) -> int:
        return sum(w.records_written for w in self._writers())

    def write(self, batch: pa.RecordBatch) -> None:
        """Write ``batch``, whose rows are ordered by partition, to each partition's files."""
        if batch.num_rows == 0:
            return
        batch = self.to_output(batch)
        values = [
            pa.nulls(batch.num_rows)
            if isinstance(field.transform, VoidTransform)
            else transform_arrow(field.transform, kind, batch.column(position))
            for field, position, kind in self._fields
        ]
        starts = _run_starts(values, batch.num_rows)
        for start, end in zip(starts, [*starts[1:], batch.num_rows], strict=True):
            partition = Record(
                *(
                    partition_value(field, kind, array[start].as_py())
                    for (field, _, kind), array in zip(self._fields, values, strict=True)
                )
            )
            if self._current is None or not same_partition(self._current.out.partition, partition):
                self._switch(partition)
            assert self._current is not None
            self._current.write(batch.slice(start, end - start))

    def close(self) -> list[DataFile]:
        """Close the last partition's file; returns every DataFile written."""
        if self._current is not None:
            self._current.close()
        return [f for w in self._writers() for f in w.data_files]

    def abort(self) -> None:
        if self._current is not None:
            self._current.abort()

    def _switch(self, partition: Record) -> None:
        if self._current is not None:
            self._current.close()
            self._done.append(self._current)
        out = replace(self._out, partition=partition)
        self._current = RollingParquetWriter(out, on_create=self._on_create)

    def _writers(self) -> list[RollingParquetWriter]:
        return self._done + ([self._current] if self._current is not None else [])


def _run_starts(values: list[pa.Array], rows: int) -> list[int]:
    """Positions where any of ``values`` (equal-length arrays) differs from the row before.

    Floats compare by :func:`canonical_array`: NaNs are one run, -0.0 and 0.0 two.
    """
    changed = np.zeros(rows, dtype=bool)
    changed[0] = True
    for array in values:
        if len(array) < 2 or pa.types.is_null(array.type):  # a void field's: never changes
            continue
        array = canonical_array(array)
        before, after = array.slice(0, rows - 1), array.slice(1)
        differs = pc.fill_null(pc.not_equal(before, after), False)
        one_null = pc.xor(before.is_null(), after.is_null())
        changed[1:] |= np.asarray(pc.or_(differs, one_null), dtype=bool)
    return [int(i) for i in np.flatnonzero(changed)]


def partition_order(out: OutputSpec) -> tuple[SortField, ...]:
    """Sort fields that order rows by ``out``'s spec partition values (void fields left out)."""
    spec, schema = out.metadata.specs()[out.spec_id], out.metadata.schema()
    return tuple(
        SortField(
            schema.find_column_name(field.source_id) or "", field.source_id, str(field.transform)
        )
        for field in spec.fields
        if not isinstance(field.transform, VoidTransform)
    )
