"""Apply equality deletes while rewriting: drop each row whose key equals a deleted key.

An equality-delete file lists values of the columns its ``equality_ids`` name (by field id, so
renamed columns still match); a row is deleted when all of them are equal, null equal to null
and, as in Iceberg Java, floating-point values compared by their canonical bits (every NaN equals
every NaN whatever its payload, -0.0 is not 0.0). Which delete files apply to which data file
(sequence numbers, partitions, global deletes under an unpartitioned spec) is decided by the
planner; this module only applies them.

Vectorised: each batch is anti-joined in Arrow (Acero's hash join) against the keys of the
delete files that apply to it, row order kept. Memory: the key columns of the equality deletes
that apply to one group's files are held while the group is rewritten (they are read once per
partition of the group and shared by every file of it they apply to) — about the size of those
columns decoded, which is what Java's reader holds too. Key columns are joined on their storage
type (a uuid as its 16 bytes).
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
from compactor.iceberg.pyiceberg_compat import arrow_storage
from compactor.iceberg.value_keys import canonical_array

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
    array = canonical_array(array)
    valid = pc.is_valid(array)
    if array.null_count == 0:
        return [valid, array]
    return [valid, pc.fill_null(array, _zero(array.type))]


def _zero(kind: pa.DataType) -> pa.Scalar:
    """A value of ``kind`` standing in for nulls (their validity flag tells them apart)."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.scalar("", kind)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pa.scalar(b"", kind)
    # Every other key type is fixed-width (numbers, booleans, dates, times, timestamps,
    # decimals, fixed, uuid storage): all-zero bytes are one of its values.
    zeros = pa.py_buffer(bytes(max(kind.bit_width // 8, 1)))
    return pa.Array.from_buffers(kind, 1, [None, zeros])[0]


def _key_table(columns: Sequence[pa.Array | pa.ChunkedArray]) -> dict[str, pa.Array]:
    keys: dict[str, pa.Array] = {}
    for index, column in enumerate(columns):
        valid, values = _key_column(column)
        keys[f"v{index}"], keys[f"k{index}"] = valid, values
    return keys


class EqualityDeleteApplier:
    """Filters the batches of a group's input files by the equality deletes that apply to them.

    Which deletes apply to an input is the planner's decision: its ``delete_files``. The inputs
    of one partition take, of that partition's deletes, those newer than their data sequence
    number; so, per set of equality columns, their delete sets are the newer parts of one
    *pool*, the delete set of the oldest of them. Keys are read once per pool into one table,
    each key with the newest sequence number that deletes it, and a row is dropped when its
    key's sequence number is above its file's. A group of one partition has one pool per set of
    equality columns; a group moving the files of several partitions into another spec, one per
    partition.
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
        self._keys: dict[tuple[int, tuple[pa.DataType, ...]], pa.Table] = {}
        self._pools: list[dict[str, DataFile]] = []  # delete files by path
        self._pools_with: dict[str, list[int]] = {}  # delete path -> the pools holding it
        self._pool_of: dict[tuple[str, tuple[int, ...]], int] = {}  # (input, ids) -> pool
        for f in sorted(inputs, key=lambda f: f.data_sequence_number):
            own: dict[tuple[int, ...], dict[str, DataFile]] = {}
            for d in equality_deletes_of(f.delete_files):
                if d.file_path not in sequence_numbers:
                    raise DataFileError(f"equality delete {d.file_path}: no sequence number given")
                if sequence_numbers[d.file_path] <= f.data_sequence_number:
                    raise DataFileError(
                        f"equality delete {d.file_path} was given to data file {f.path}, which "
                        "is not older (a planning error; nothing was written)"
                    )
                own.setdefault(tuple(d.equality_ids or ()), {})[d.file_path] = d
            for ids, deletes in own.items():
                self._pool_of[(f.path, ids)] = self._pool(deletes, f.data_sequence_number)

    def _pool(self, deletes: dict[str, DataFile], sequence: int) -> int:
        """A pool whose deletes newer than ``sequence`` are exactly ``deletes`` (all on the same
        columns): one already made when there is one, else ``deletes`` as a new pool."""
        for index in min((self._pools_with.get(path, []) for path in deletes), key=len):
            newer = {p for p in self._pools[index] if self._sequence_numbers[p] > sequence}
            if newer == deletes.keys():
                return index
        self._pools.append(deletes)
        index = len(self._pools) - 1
        for path in deletes:
            self._pools_with.setdefault(path, []).append(index)
        return index

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

    def _keys_for(self, pool: int, types: tuple[pa.DataType, ...]) -> pa.Table:
        """The distinct keys of a pool's deletes (cast to the data's ``types``), each with its
        newest deletion."""
        with self._lock:
            cached = self._keys.get((pool, types))
            if cached is not None:
                return cached
            parts = []
            for path, delete_file in sorted(self._pools[pool].items()):
                read = self._read_keys(delete_file)
                columns = [arrow_storage(read.column(i)).cast(kind) for i, kind in enumerate(types)]
                keys = _key_table(columns)
                sequence = pa.array([self._sequence_numbers[path]] * read.num_rows, pa.int64())
                parts.append(pa.table({**keys, SEQUENCE: sequence}))
            names = [n for n in parts[0].column_names if n != SEQUENCE]
            newest = pa.concat_tables(parts).group_by(names).aggregate([(SEQUENCE, "max")])
            keys = newest.rename_columns(
                [SEQUENCE if n == f"{SEQUENCE}_max" else n for n in newest.column_names]
            )
            self._keys[(pool, types)] = keys
            return keys

    def filter_for(self, f: TaskInput) -> BatchFilter | None:
        """A function dropping the rows of ``f``'s batches that its equality deletes name."""
        own = equality_deletes_of(f.delete_files)
        if not own:
            return None
        sequence = f.data_sequence_number
        pools = {
            ids: self._pool_of[(f.path, ids)]
            for ids in sorted({tuple(d.equality_ids or ()) for d in own})
        }
        names: dict[int, str] = {}
        for ids in pools:
            for field_id in ids:
                name = self._schema.find_column_name(field_id)
                if name is None or "." in name:  # the planner skips such files
                    raise DataFileError(
                        f"data file {f.path}: an equality delete names field id {field_id}, not "
                        "a top-level column of the current schema"
                    )
                names[field_id] = name

        def apply(batch: pa.RecordBatch) -> pa.RecordBatch:
            for ids, pool in pools.items():
                if batch.num_rows == 0:
                    break
                columns = [arrow_storage(batch.column(names[i])) for i in ids]
                keys = self._keys_for(pool, tuple(c.type for c in columns))
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
