"""Rewrite one group of input files: stream their live rows through the Iceberg read path.

:func:`rewrite_files` is a pure function of (inputs, output spec): it commits nothing and calls
nothing of the driver's, so it runs wherever :func:`compactor.rewrite.task_runner.run_task` runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table.metadata import TableMetadata

from compactor.errors import CompactorError, DataFileError, file_error
from compactor.iceberg.pyiceberg_compat import (
    delete_file_key,
    read_data_file,
    read_position_deletes,
)
from compactor.options.defaults import STREAM_FILE_THRESHOLD
from compactor.planning.sort_order import Clustering
from compactor.rewrite.bulk_read import BulkDone, BulkRead
from compactor.rewrite.equality_deletes import EqualityDeleteApplier
from compactor.rewrite.parquet_output import (
    OutputSpec,
    PartitioningWriter,
    RollingParquetWriter,
    partition_order,
)
from compactor.rewrite.phase_times import carried, phase, timed
from compactor.rewrite.sorting import SortingWriter
from compactor.storage.deleter import delete_files

if TYPE_CHECKING:
    from compactor.planning.planner import TaskInput

READ_THREADS = 4
# Decoded rows per byte of a compressed Parquet file, for read-ahead: a rough, typical ratio.
DECODED_PER_STORED = 4


@dataclass
class Rewritten:
    """What rewriting a group's inputs produced."""

    data_files: list[DataFile] = field(default_factory=list)
    records_read: int = 0
    rows_deleted: int = 0
    bulk_read_files: int = 0


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _position_deletes(f: TaskInput) -> list[DataFile]:
    return [d for d in f.delete_files if d.content == DataFileContent.POSITION_DELETES]


def _positions_by_file(io: FileIO, inputs: Sequence[TaskInput]) -> dict[str, list[pa.ChunkedArray]]:
    """Deleted positions per input, from the delete files that apply to that input's entry.

    A delete file (or deletion vector) lists positions by path, but applies only to data files whose sequence
    numbers the spec allows (e.g. not to a path removed and added again after the delete):
    each input takes positions only from its own ``delete_files``.
    """
    wanted = {f.path for f in inputs}
    unique = {delete_file_key(d): d for f in inputs for d in _position_deletes(f)}
    read: dict[str, dict[str, pa.ChunkedArray]] = {}
    for key, delete_file in sorted(unique.items()):
        try:
            by_file = read_position_deletes(io, delete_file)
        except Exception as exc:
            raise file_error("delete", delete_file.file_path, exc) from exc
        read[key] = {p: a for p, a in by_file.items() if p in wanted}
    positions: dict[str, list[pa.ChunkedArray]] = {}
    for f in inputs:
        for key in sorted(map(delete_file_key, _position_deletes(f))):
            array = read[key].get(f.path)
            if array is not None:
                positions.setdefault(f.path, []).append(array)
    return positions


def _deleted_count(positions: list[pa.ChunkedArray] | None, record_count: int) -> int:
    if not positions:
        return 0
    merged = pa.chunked_array([chunk for array in positions for chunk in array.chunks], pa.int64())
    unique = pc.unique(merged)
    in_range = pc.and_(pc.greater_equal(unique, 0), pc.less(unique, record_count))
    return pc.sum(pc.cast(in_range, pa.int64())).as_py() or 0


class _OrderedReader:
    """Reads inputs through the Iceberg read path, file by file, small files ahead in threads.

    At most ``read_ahead`` bytes of decoded rows are in flight, estimated as DECODED_PER_STORED
    times the files' sizes; files estimated at a quarter of that or more (or of
    STREAM_FILE_THRESHOLD bytes) are streamed batch by batch instead, so memory never depends
    on file size.
    """

    def __init__(
        self,
        io: FileIO,
        metadata: TableMetadata,
        files: Sequence[TaskInput],
        positions: dict[str, list[pa.ChunkedArray]],
        equality_sequence_numbers: Mapping[str, int],
        read_ahead: int,
    ) -> None:
        self._io, self._metadata, self._positions = io, metadata, positions
        self._read_ahead = read_ahead
        self._equality = EqualityDeleteApplier(
            io, metadata.schema(), files, equality_sequence_numbers
        )
        # Rows each input lost to equality deletes (each file is read by one thread).
        self.equality_deleted: dict[str, int] = {}

    def _stream(self, f: TaskInput) -> Iterator[pa.RecordBatch]:
        try:
            drop = self._equality.filter_for(f)
            deleted = 0
            for batch in read_data_file(
                self._io,
                self._metadata,
                f.data_file,
                self._positions.get(f.path),
                f.lineage_sequence_number,
            ):
                if drop is not None:
                    rows = batch.num_rows
                    batch = drop(batch)
                    deleted += rows - batch.num_rows
                yield batch
            self.equality_deleted[f.path] = deleted
        except CompactorError:
            raise
        except Exception as exc:
            raise file_error("data", f.path, exc) from exc

    def _load(self, f: TaskInput) -> list[pa.RecordBatch]:
        with phase("read_each"):
            return list(self._stream(f))

    def batches(
        self, files: Sequence[TaskInput]
    ) -> Iterator[tuple[TaskInput, list[pa.RecordBatch] | Iterator[pa.RecordBatch]]]:
        """Each of ``files`` (some of the inputs) with its live rows, in order."""
        pending: deque[tuple[TaskInput, Future[list[pa.RecordBatch]] | None]] = deque()
        in_flight = 0
        index = 0
        with ThreadPoolExecutor(READ_THREADS) as pool:
            try:
                while index < len(files) or pending:
                    while index < len(files) and (not pending or in_flight < self._read_ahead):
                        f = files[index]
                        index += 1
                        decoded = f.size * DECODED_PER_STORED
                        if f.size >= STREAM_FILE_THRESHOLD or 4 * decoded >= self._read_ahead:
                            pending.append((f, None))
                            break
                        pending.append((f, pool.submit(carried(self._load), f)))
                        in_flight += decoded
                    f, future = pending.popleft()
                    if future is None:
                        yield f, timed("read_each", self._stream(f))
                    else:
                        in_flight -= f.size * DECODED_PER_STORED
                        yield f, future.result()
            finally:
                for _, future in pending:
                    if future is not None:
                        future.cancel()


def _read_each(
    reader: _OrderedReader,
    files: Sequence[TaskInput],
    positions: dict[str, list[pa.ChunkedArray]],
    writer: RollingParquetWriter | PartitioningWriter | SortingWriter,
    result: Rewritten,
    between_files: Callable[[], None],
    on_read: Callable[[int, int], None],
    label: str,
) -> None:
    """Write the live rows of ``files`` read through the Iceberg read path, checking counts
    (``label`` names the group in errors)."""
    for f, batches in reader.batches(files):
        rows = 0
        for batch in batches:
            rows += batch.num_rows
            with phase("write"):
                writer.write(batch)
        deleted = _deleted_count(positions.get(f.path), f.data_file.record_count)
        deleted += reader.equality_deleted.get(f.path, 0)
        if rows + deleted != f.data_file.record_count:
            raise DataFileError(
                f"{label}: data file {f.path}: read {rows} live rows + {deleted} deleted, "
                f"but the manifest records {f.data_file.record_count}"
            )
        result.records_read += rows
        result.rows_deleted += deleted
        on_read(1, f.size)
        between_files()


def _ignore(files: int, size: int) -> None:
    """No one asked for progress."""


class _WrittenShare:
    """Progress of a sorted group: half of each input's bytes when it is read (``reading``),
    the rest of the group's bytes in proportion to the rows written (``rows``), which starts
    once every input was read."""

    def __init__(self, inputs: Sequence[TaskInput], tell: Callable[[int, int], None]) -> None:
        self._tell = tell
        self._bytes = sum(f.size for f in inputs)
        self._rows = max(sum(f.data_file.record_count for f in inputs), 1)
        self._read = self._written_rows = self._written = 0

    def reading(self, files: int, size: int) -> None:
        self._read += size // 2
        self._tell(files, size // 2)

    def rows(self, count: int) -> None:
        rest = self._bytes - self._read
        self._written_rows += count
        share = min(rest * self._written_rows // self._rows, rest)
        if share > self._written:
            self._tell(0, share - self._written)
            self._written = share


def rewrite_files(
    inputs: Sequence[TaskInput],
    out: OutputSpec,
    *,
    equality_sequence_numbers: Mapping[str, int],
    read_ahead: int,
    label: str,
    between_files: Callable[[], None],
    on_file_created: Callable[[str], None],
    bulk_read: bool = True,
    clustering: Clustering | None = None,
    repartition: bool = False,
    on_read: Callable[[int, int], None] | None = None,
) -> Rewritten:
    """Rewrite ``inputs`` into new data files; on any failure remove what was written and raise.

    ``equality_sequence_numbers`` gives the data sequence number of each equality delete of the
    inputs. ``between_files`` runs after each input file read through the Iceberg read path,
    after each batch read in bulk (a batch may hold the rows of several small files, up to 1/16
    of ``read_ahead``), and while sorted rows are merged and written (it raises to stop);
    ``on_file_created`` gets each output path before its file is created. Checks that every
    live input row was written: rows read plus rows deleted by position deletes must equal
    each input file's record count (for files read in bulk, :mod:`compactor.rewrite.bulk_read`,
    their total). ``label`` names the group in errors;
    ``bulk_read=False`` reads every file through the Iceberg read path.
    With ``clustering`` the rows are sorted (:mod:`compactor.rewrite.sorting`, in runs of half
    ``read_ahead`` bytes) before they are written. With ``repartition`` the inputs (of other
    specs) are written into ``out``'s spec, split by its partitions: sorted by them first (a
    spec whose fields are all void, or that has none, takes them as they come).
    ``on_read`` is told (files, bytes) as inputs are read: after each file read each, after
    each run read in bulk. A sorted group's inputs count half their bytes as they are read and
    the other half as the sorted rows are written (files 0), so that its progress does not
    stand at 100% through the merge.
    """
    read = on_read or _ignore
    writer: RollingParquetWriter | PartitioningWriter = (
        PartitioningWriter(out, on_create=on_file_created)
        if repartition
        else RollingParquetWriter(out, on_create=on_file_created)
    )
    sink: RollingParquetWriter | PartitioningWriter | SortingWriter = writer
    prefix = partition_order(out) if repartition else ()
    result = Rewritten()
    try:
        if clustering is not None or prefix:
            share = _WrittenShare(inputs, read)
            read = share.reading
            sink = SortingWriter(
                writer,
                clustering,
                out.metadata.schema(),
                [f.data_file for f in inputs],
                # A run being sorted and its sorted copy are held at once: half each.
                memory=read_ahead // 2,
                prefix=prefix,
                between_batches=between_files,
                on_written=share.rows,
            )
        positions = _positions_by_file(out.io, inputs)
        reader = _OrderedReader(
            out.io, out.metadata, inputs, positions, equality_sequence_numbers, read_ahead
        )
        bulk = BulkRead(
            out.io,
            out.metadata,
            inputs,
            writer.arrow_schema,
            read_ahead,
            positions,
            enabled=bulk_read,
        )
        bulk_rows = 0
        for item in bulk.items():
            if isinstance(item, pa.RecordBatch):
                bulk_rows += item.num_rows
                with phase("write"):
                    sink.write(item)
                between_files()
            elif isinstance(item, BulkDone):
                deleted = sum(
                    _deleted_count(positions.get(f.path), f.data_file.record_count)
                    for f in item.files
                )
                if bulk_rows + deleted != item.records:
                    raise DataFileError(
                        f"{label}: read {bulk_rows} live rows + {deleted} deleted from "
                        f"{len(item.files)} files, but the manifests record {item.records}"
                    )
                result.records_read += bulk_rows
                result.rows_deleted += deleted
                result.bulk_read_files += len(item.files)
                bulk_rows = 0
                read(len(item.files), sum(f.size for f in item.files))
            else:
                _read_each(reader, item.files, positions, sink, result, between_files, read, label)
        with phase("write"):
            result.data_files = sink.close()
        if writer.records_written != result.records_read:
            raise DataFileError(
                f"{label}: wrote {writer.records_written} rows, read {result.records_read}"
            )
    except BaseException as exc:
        sink.abort()
        delete_files(out.io, writer.created)
        if isinstance(exc, CompactorError | KeyboardInterrupt | SystemExit):
            raise
        raise DataFileError(f"{label}: {_describe(exc)}") from exc
    return result
