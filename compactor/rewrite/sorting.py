"""Sort or z-order a group's rows before they are written: an external merge sort.

Every row gets one binary key (:mod:`compactor.rewrite.sort_keys`) whose byte order is the
order asked for. Rows are gathered into runs of at most ``memory`` bytes; each run is sorted in
memory and, unless it is the only one, spilled to an LZ4-compressed Arrow IPC file in a
temporary directory of its own (``$TMPDIR``: a sixth of the decoded size of TPC-DS
store_sales, measured). Runs are then merged batch by batch, at most :func:`fan_in` at a time
(in several passes when there are more), into the rolling Parquet writer, which cuts files at
the target size: the files of a group hold consecutive, non-overlapping ranges of the sort key.

Memory: the run being gathered and its sorted copy while reading (``2 * memory``), then, while
merging, one batch of at most ``memory / (2 * fan_in)`` bytes per run and what is merged from
them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema

from compactor.planning.sort_order import Clustering, SortField
from compactor.rewrite.parquet_output import field_positions
from compactor.rewrite.sort_keys import SortKeys

if TYPE_CHECKING:
    from compactor.rewrite.parquet_output import PartitioningWriter, RollingParquetWriter

KEY = "_compactor_sort_key"
# Runs are merged by this many at most; spilled runs are read back in batches of this size.
MAX_FAN_IN = 64
MIN_BATCH_BYTES = 256 * 1024
# Spilled runs are compressed: uncompressed, a sorted group took its decoded size on disk
# (several times its Parquet size); LZ4 costs ~0.4 s per decoded GB to write and read back.
SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


def fan_in(memory: int) -> int:
    """Runs merged at once: their batches, and what is merged from them, fit ``memory``."""
    return max(2, min(MAX_FAN_IN, memory // (4 * MIN_BATCH_BYTES)))


def _sorted(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table.column(KEY)))


class _Run:
    """A spilled, sorted run, read back one batch at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = pa.OSFile(path, "rb")
        self._reader = pa.ipc.open_file(self._file)
        self._next = 0

    def batch(self) -> pa.RecordBatch | None:
        while self._next < self._reader.num_record_batches:
            batch = self._reader.get_batch(self._next)
            self._next += 1
            if batch.num_rows:
                return batch
        self.close()
        return None

    def close(self) -> None:
        self._file.close()


def _merge(runs: Sequence[_Run]) -> Iterator[pa.Table]:
    """The rows of sorted ``runs`` in key order, in sorted tables.

    Each round takes, from every run's current batch, the rows whose key is at most the
    smallest of the batches' last keys: no row still unread can sort before those.
    """
    heads = {i: b for i, run in enumerate(runs) if (b := run.batch()) is not None}
    while heads:
        bound = min(batch.column(KEY)[-1].as_py() for batch in heads.values())
        pieces = []
        for i, batch in list(heads.items()):
            keys = batch.column(KEY)
            taken = pc.sum(pc.less_equal(keys, pa.scalar(bound, keys.type))).as_py() or 0
            if taken:
                pieces.append(batch.slice(0, taken))
            if taken < batch.num_rows:
                heads[i] = batch.slice(taken)
            elif (following := runs[i].batch()) is not None:
                heads[i] = following
            else:
                del heads[i]
        yield _sorted(pa.Table.from_batches(pieces))


class SortingWriter:
    """Takes a group's rows as :class:`RollingParquetWriter` does; :meth:`close` writes them,
    ordered by ``prefix`` fields and then ``clustering``, into that writer."""

    def __init__(
        self,
        writer: RollingParquetWriter | PartitioningWriter,
        clustering: Clustering | None,
        schema: Schema,
        inputs: Sequence[DataFile],
        *,
        memory: int,
        prefix: Sequence[SortField] = (),
        between_batches: Callable[[], None] = lambda: None,
        on_written: Callable[[int], None] = lambda rows: None,
    ) -> None:
        self._writer, self._memory = writer, memory
        # Asked before each merged table is spilled or written (it raises to stop).
        self._check = between_batches
        self._on_written = on_written  # told the rows of each batch written to ``writer``
        self._keys = SortKeys(
            clustering, schema, field_positions(writer.arrow_schema), inputs, prefix=prefix
        )
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._runs: list[str] = []  # spilled runs not merged yet
        self._spilled = 0
        self._directory: str | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Take one batch of the group's rows (in the table's read schema or the output's)."""
        if batch.num_rows == 0:
            return
        batch = self._writer.to_output(batch)
        keyed = batch.append_column(KEY, self._keys.of(batch))
        self._pending.append(keyed)
        self._pending_bytes += keyed.nbytes
        if self._pending_bytes >= self._memory:
            self._spill(_sorted(self._take_pending()))

    def close(self) -> list[DataFile]:
        """Write every row taken, in order, close the writer, and return its data files."""
        try:
            if not self._runs:
                if self._pending:
                    self._emit(_sorted(self._take_pending()))
            else:
                if self._pending:
                    self._spill(_sorted(self._take_pending()))
                self._merge_all(self._emit)
        finally:
            self._release()
        return self._writer.close()

    def abort(self) -> None:
        """Drop the rows taken and close the writer's open file."""
        self._release()
        self._writer.abort()

    def _take_pending(self) -> pa.Table:
        table = pa.Table.from_batches(self._pending)
        self._pending, self._pending_bytes = [], 0
        return table

    def _batch_rows(self, table: pa.Table) -> int:
        """Rows per spilled batch: what merging ``fan_in`` runs at once can hold."""
        batch_bytes = max(MIN_BATCH_BYTES, self._memory // (2 * fan_in(self._memory)))
        return max(1, batch_bytes * table.num_rows // max(table.nbytes, 1))

    def _spill(self, table: pa.Table | Iterator[pa.Table]) -> None:
        """Write one sorted run (a table, or sorted tables one after the other) to disk."""
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="compactor-sort-")
        path = os.path.join(self._directory, f"run-{self._spilled:06d}.arrow")
        self._spilled += 1
        tables = iter([table]) if isinstance(table, pa.Table) else table
        writer = None
        try:
            for part in tables:
                if writer is None:
                    writer = pa.ipc.new_file(path, part.schema, options=SPILL_OPTIONS)
                self._check()
                for batch in part.to_batches(max_chunksize=self._batch_rows(part)):
                    writer.write_batch(batch)
        finally:
            if writer is not None:
                writer.close()
        if writer is not None:
            self._runs.append(path)

    def _merge_all(self, emit: Callable[[pa.Table], None]) -> None:
        """Merge every run into ``emit``, first into fewer runs while there are too many."""
        width = fan_in(self._memory)
        while len(self._runs) > width:
            first, self._runs = self._runs[:width], self._runs[width:]
            self._merge_into(first, self._spill)
        self._merge_into(self._runs, emit)

    @staticmethod
    def _merge_into(paths: Sequence[str], sink: Callable[[Iterator[pa.Table]], None]) -> None:
        runs = [_Run(path) for path in paths]
        try:
            sink(_merge(runs))
        finally:
            for run in runs:
                run.close()
                os.remove(run.path)

    def _emit(self, tables: pa.Table | Iterator[pa.Table]) -> None:
        for table in [tables] if isinstance(tables, pa.Table) else tables:
            self._check()
            for batch in table.drop_columns([KEY]).to_batches():
                self._writer.write(batch)
                self._on_written(batch.num_rows)

    def _release(self) -> None:
        self._pending = []
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
