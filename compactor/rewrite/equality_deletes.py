"""Apply equality deletes while rewriting: drop each row whose key equals a deleted key.

An equality-delete file lists values of the columns its ``equality_ids`` name (by field id, so
renamed columns still match); a row is deleted when all of them are equal, null equal to null
and, as in Iceberg Java, floating-point values compared by their canonical bits (every NaN equals
every NaN whatever its payload, -0.0 is not 0.0). Which delete files apply to which data file
(sequence numbers, partitions, global deletes under an unpartitioned spec) is decided by the
planner; this module only applies them.

Vectorised: the keys of the delete files that apply to a group's files are read once per pool
(below) into a :class:`~compactor.rewrite.deleted_keys.DeletedKeys`, whose hash tables are
built once; each batch then only looks its rows' keys up in them (a few numpy gathers per key
column) and is filtered, row order kept. Memory: those keys are held while the group is
rewritten (read once per partition of the group and shared by every file of it they apply to):
32 to 56 bytes per distinct key and at most as much per distinct value of each key column, plus
the distinct values of string and binary key columns (22 MB for 288,634 keys of two integer
columns) — of the order of the key columns decoded, which is what Java's reader holds too. Key
columns are compared on their storage type (a uuid as its 16 bytes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema

from compactor.errors import DataFileError, file_error
from compactor.iceberg.pyiceberg_compat import arrow_storage
from compactor.rewrite.deleted_keys import DeletedKeys

if TYPE_CHECKING:
    from compactor.planning.planner import TaskInput

FIELD_ID = b"PARQUET:field_id"

BatchFilter = Callable[[pa.RecordBatch], pa.RecordBatch]


def equality_deletes_of(delete_files: Sequence[DataFile]) -> list[DataFile]:
    """The equality-delete files among ``delete_files``."""
    return [d for d in delete_files if d.content == DataFileContent.EQUALITY_DELETES]


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
        self._keys: dict[tuple[int, tuple[pa.DataType, ...]], DeletedKeys] = {}
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

    def _keys_for(self, pool: int, types: tuple[pa.DataType, ...]) -> DeletedKeys:
        """The distinct keys of a pool's deletes (cast to the data's ``types``), each with its
        newest deletion."""
        with self._lock:
            cached = self._keys.get((pool, types))
            if cached is not None:
                return cached
            columns: list[list[pa.Array]] = [[] for _ in types]
            sequences = []
            for path, delete_file in sorted(self._pools[pool].items()):
                read = self._read_keys(delete_file)
                for i, kind in enumerate(types):
                    columns[i].extend(arrow_storage(read.column(i)).cast(kind).chunks)
                sequences.append(np.full(read.num_rows, self._sequence_numbers[path], np.int64))
            keys = DeletedKeys(
                [
                    pa.chunked_array(chunks, kind)
                    for chunks, kind in zip(columns, types, strict=True)
                ],
                np.concatenate(sequences),
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
            if batch.num_rows == 0:
                return batch
            deleted = None
            for ids, pool in pools.items():
                columns = [arrow_storage(batch.column(names[i])) for i in ids]
                keys = self._keys_for(pool, tuple(c.type for c in columns))
                these = keys.deleted(columns, sequence)
                deleted = these if deleted is None else deleted | these
            if deleted is None or not deleted.any():
                return batch
            return batch.filter(pa.array(~deleted))

        return apply
