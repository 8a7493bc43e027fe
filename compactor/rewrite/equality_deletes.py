"""Apply equality deletes while rewriting: drop each row whose key equals a deleted key.

An equality-delete file lists values of the columns its ``equality_ids`` name (by field id, so
renamed columns still match); a row is deleted when all of them are equal, null equal to null
and, as in Iceberg Java, floating-point values compared bit for bit (NaN equals NaN, -0.0 is not
0.0). Which delete files apply to which data file (sequence numbers, partitions, global deletes
under an unpartitioned spec) is decided by the planner; this module only applies them.

Vectorised: each batch is anti-joined in Arrow (Acero's hash join) against the keys of the
delete files that apply to it, row order kept. Memory: the key columns of the equality deletes
that apply to one group's files are held while the group is rewritten (they are read once per
group and shared by every file they apply to) — about the size of those columns decoded, which
is what Java's reader holds too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema

from compactor.errors import DataFileError, file_error

if TYPE_CHECKING:
    from compactor.planning.planner import TaskInput

FIELD_ID = b"PARQUET:field_id"
ROW = "__compactor_row"
SEQUENCE = "__compactor_sequence"

BatchFilter = Callable[[pa.RecordBatch], pa.RecordBatch]


def equality_deletes_of(delete_files: Sequence[DataFile]) -> list[DataFile]:
    """The equality-delete files among ``delete_files``."""
    return [d for d in delete_files if d.content == DataFileContent.EQUALITY_DELETES]


def _key_column(array: pa.ChunkedArray | pa.Array) -> list[pa.Array | pa.ChunkedArray]:
    """``array`` as join keys without nulls: a validity flag and the values with nulls filled."""
    if pa.types.is_floating(array.type):
        width = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[array.type.bit_width]
        array = (
            pa.chunked_array([c.view(width) for c in array.chunks], width)
            if isinstance(array, pa.ChunkedArray)
            else array.view(width)
        )
    valid = pc.is_valid(array)
    if array.null_count == 0:
        return [valid, array]
    return [valid, pc.fill_null(array, _zero(array.type))]


def _zero(kind: pa.DataType) -> pa.Scalar:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.scalar("", kind)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pa.scalar(b"", kind)
    if pa.types.is_fixed_size_binary(kind):
        return pa.scalar(b"\0" * kind.byte_width, kind)
    if pa.types.is_boolean(kind):
        return pa.scalar(False)
    return pa.scalar(0, pa.int64()).cast(kind)


def _key_table(columns: Sequence[pa.Array | pa.ChunkedArray]) -> dict[str, pa.Array]:
    keys: dict[str, pa.Array] = {}
    for index, column in enumerate(columns):
        valid, values = _key_column(column)
        keys[f"v{index}"], keys[f"k{index}"] = valid, values
    return keys


class EqualityDeleteApplier:
    """Filters the batches of a group's input files by the equality deletes that apply to them.

    The deletes of one group all share its partition scope, so which of them apply to an input
    depends only on sequence numbers: those newer than the input's data sequence number. Keys
    are therefore read once per group into one table per set of equality columns, each key with
    the newest sequence number that deletes it, and a row is dropped when its key's sequence
    number is above its file's.
    """

    def __init__(
        self,
        io: FileIO,
        schema: Schema,
        inputs: Sequence[TaskInput],
        sequence_numbers: Mapping[str, int],
    ) -> None:
        self._io, self._schema, self._sequence_numbers = io, schema, sequence_numbers
        self._lock = threading.Lock()
        self._keys: dict[tuple[tuple[int, ...], tuple[pa.DataType, ...]], pa.Table] = {}
        self._by_ids: dict[tuple[int, ...], dict[str, DataFile]] = {}
        for f in inputs:
            for d in equality_deletes_of(f.delete_files):
                if d.file_path not in sequence_numbers:
                    raise DataFileError(f"equality delete {d.file_path}: no sequence number given")
                self._by_ids.setdefault(tuple(d.equality_ids or ()), {})[d.file_path] = d

    def _read_keys(self, delete_file: DataFile) -> pa.Table:
        """The delete file's equality columns, named by field id."""
        path = delete_file.file_path
        if delete_file.file_format != FileFormat.PARQUET:
            raise DataFileError(
                f"delete file {path}: {delete_file.file_format} equality deletes are not "
                "supported (Parquet only)"
            )
        ids = list(delete_file.equality_ids or [])
        try:
            with self._io.new_input(path).open() as stream:
                parquet = pq.ParquetFile(stream)
                by_id = {
                    int(f.metadata[FIELD_ID]): f.name
                    for f in parquet.schema_arrow
                    if f.metadata and FIELD_ID in f.metadata
                }
                missing = [i for i in ids if i not in by_id]
                if missing:
                    raise DataFileError(
                        f"delete file {path}: no column with field id {missing[0]} "
                        "(named by its equality_ids)"
                    )
                table = parquet.read(columns=[by_id[i] for i in ids])
        except DataFileError:
            raise
        except Exception as exc:
            raise file_error("delete", path, exc) from exc
        return table.rename_columns([str(i) for i in ids])

    def _keys_for(self, ids: tuple[int, ...], types: tuple[pa.DataType, ...]) -> pa.Table:
        """Distinct keys on ``ids`` (cast to the data's types), each with its newest deletion."""
        with self._lock:
            cached = self._keys.get((ids, types))
            if cached is not None:
                return cached
            parts = []
            for path, delete_file in sorted(self._by_ids[ids].items()):
                read = self._read_keys(delete_file)
                keys = _key_table([read.column(i).cast(kind) for i, kind in enumerate(types)])
                sequence = pa.array([self._sequence_numbers[path]] * read.num_rows, pa.int64())
                parts.append(pa.table({**keys, SEQUENCE: sequence}))
            names = [n for n in parts[0].column_names if n != SEQUENCE]
            newest = pa.concat_tables(parts).group_by(names).aggregate([(SEQUENCE, "max")])
            keys = newest.rename_columns(
                [SEQUENCE if n == f"{SEQUENCE}_max" else n for n in newest.column_names]
            )
            self._keys[(ids, types)] = keys
            return keys

    def filter_for(self, f: TaskInput) -> BatchFilter | None:
        """A function dropping the rows of ``f``'s batches that its equality deletes name."""
        own = equality_deletes_of(f.delete_files)
        if not own:
            return None
        sequence = f.data_sequence_number
        ids_sets = sorted({tuple(d.equality_ids or ()) for d in own})
        newer = {
            path
            for ids in ids_sets
            for path in self._by_ids[ids]
            if self._sequence_numbers[path] > sequence
        }
        if newer != {d.file_path for d in own}:
            raise DataFileError(
                f"data file {f.path}: its equality deletes are not exactly the group's deletes "
                "newer than it (a planning error; nothing was written)"
            )
        names: dict[int, str] = {}
        for ids in ids_sets:
            for field_id in ids:
                name = self._schema.find_column_name(field_id)
                if name is None or "." in name:  # the planner skips such files
                    raise DataFileError(
                        f"data file {f.path}: an equality delete names field id {field_id}, not "
                        "a top-level column of the current schema"
                    )
                names[field_id] = name

        def apply(batch: pa.RecordBatch) -> pa.RecordBatch:
            for ids in ids_sets:
                if batch.num_rows == 0:
                    break
                columns = [batch.column(names[i]) for i in ids]
                keys = self._keys_for(ids, tuple(c.type for c in columns))
                left = pa.table(_key_table(columns))
                left = left.append_column(ROW, pa.array(range(batch.num_rows), pa.int64()))
                on = [n for n in keys.column_names if n != SEQUENCE]
                joined = left.join(keys, keys=on, join_type="left outer", use_threads=False)
                deleted = pc.fill_null(pc.greater(joined[SEQUENCE], sequence), False)
                rows = joined.filter(pc.invert(deleted))[ROW].combine_chunks()
                if len(rows) != batch.num_rows:
                    batch = batch.take(pc.take(rows, pc.sort_indices(rows)))
            return batch

        return apply
