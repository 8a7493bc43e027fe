"""Read many data files at once where the Iceberg read path would only add cost.

A group's inputs usually come from one writer with the current schema and carry no deletes.
For those, the Iceberg read path's per-file set-up in Python (schema conversion, name mapping,
projection: tens of milliseconds per file, holding the GIL) is pure overhead: pyarrow's
dataset scanner reads them in parallel in C++ instead.

A file takes this path only when reading it by column name *is* reading it by field id and
nothing about its rows needs Iceberg's read rules: a small Parquet file of a format 1 or 2 table
(v3 rows take their lineage from their positions), no delete file applies to it, every column
of the current schema is a top-level primitive column of the file with the same field id, the
same name and the same type (string and binary in either width). Every other file goes
through the Iceberg read path, file by file.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import pyarrow as pa
import pyarrow.dataset as ds
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import FileFormat
from pyiceberg.table.metadata import TableMetadata

from compactor.errors import DataFileError, file_error, first_line
from compactor.iceberg.pyiceberg_compat import VERIFY_PAGE_CHECKSUMS

if TYPE_CHECKING:
    from compactor.planning.planner import TaskInput

FIELD_ID = b"PARQUET:field_id"
FOOTER_READERS = 8
# Scanner read-ahead bounds: rows per batch, batches ahead within a file, files ahead.
MIN_BATCH_ROWS, MAX_BATCH_ROWS = 1024, 128 * 1024
BATCHES_AHEAD = 2
# Only files small enough that this many fit the read-ahead are read in bulk: the scanner
# buffers whole row groups of the files in flight (one request per row group, not per column),
# and larger files gain little from being read together.
FILES_IN_BUDGET = 64
MAX_FILES_AHEAD = 8
# Files are read ahead only when this many of them fit the read-ahead budget.
TINY_FILE_FACTOR = 256
# Files whose footers are read and checked, then scanned, at a time (bounds cached footers).
CHUNK_FILES = 128
FORMAT = ds.ParquetFileFormat(**VERIFY_PAGE_CHECKSUMS)
_WIDTHS = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}


def _signature(schema: pa.Schema) -> dict[str, tuple[bytes | None, pa.DataType]]:
    """Column name -> (field id, type with string/binary widths unified)."""
    return {f.name: ((f.metadata or {}).get(FIELD_ID), _WIDTHS.get(f.type, f.type)) for f in schema}


@dataclass(frozen=True)
class BulkDone:
    """The batches since the previous marker hold the rows of ``files``, read in bulk."""

    files: list[TaskInput]

    @property
    def records(self) -> int:
        """Rows the manifests record for ``files``."""
        return sum(f.data_file.record_count for f in self.files)


@dataclass(frozen=True)
class ReadEach:
    """``files`` come next and go through the Iceberg read path, file by file."""

    files: list[TaskInput]


Item: TypeAlias = pa.RecordBatch | BulkDone | ReadEach


class BulkRead:
    """A group's inputs in plan order: runs read in bulk, and runs left to the Iceberg read path.

    ``expected`` is the Arrow schema the group's output is written in (field ids in the field
    metadata). :meth:`items` yields the rows of bulk runs as batches in that schema, ready to be
    written without projection, each run followed by a :class:`BulkDone`; the other inputs come
    as :class:`ReadEach` markers, at their place in the plan, so that rows keep the order of
    the inputs (the order they were written in: what keeps compacted files clustered).
    Candidates are taken CHUNK_FILES at a time: their footers are read (in threads) and
    checked, then consecutive files that pass are scanned together, holding about
    ``read_ahead`` bytes of decoded rows (files and batches read ahead are sized from the
    footers; measured, not merely configured: see tests/system/test_memory_limit.py). Not
    ``enabled``, or on a FileIO other than pyiceberg's pyarrow one, every input is read each.
    """

    def __init__(
        self,
        io: FileIO,
        metadata: TableMetadata,
        inputs: Sequence[TaskInput],
        expected: pa.Schema,
        read_ahead: int,
        *,
        enabled: bool = True,
    ) -> None:
        self._io, self._inputs = io, list(inputs)
        self._expected, self._read_ahead = expected, read_ahead
        self._wanted = _signature(expected)
        self._enabled = (
            enabled
            and isinstance(io, PyArrowFileIO)
            and metadata.format_version <= 2
            and not any(pa.types.is_nested(f.type) for f in expected)
        )

    def _candidate(self, f: TaskInput) -> bool:
        return self._enabled and _plain(f) and f.size * FILES_IN_BUDGET <= self._read_ahead

    def _fragment(self, f: TaskInput) -> ds.ParquetFileFragment | None:
        """``f`` as a scanner fragment if reading it by name is reading it by field id."""
        io = self._io
        assert isinstance(io, PyArrowFileIO)
        scheme, netloc, path = io.parse_location(f.path, io.properties)
        try:
            fragment = FORMAT.make_fragment(path, filesystem=io.fs_by_scheme(scheme, netloc))
            found = _signature(fragment.physical_schema)
        except Exception as exc:
            raise file_error("data", f.path, exc) from exc
        return fragment if all(found.get(n) == s for n, s in self._wanted.items()) else None

    def items(self) -> Iterator[Item]:
        """The inputs' batches and markers, in plan order.

        They are produced in a thread of their own, at most ``read_ahead`` bytes ahead, so that
        decoding the next rows overlaps with encoding these (pyarrow releases the GIL for both).
        The thread waits while the consumer reads a :class:`ReadEach` run, whose reader has a
        read-ahead of its own.
        """
        return _ahead(self._produce(), self._read_ahead)

    def _produce(self) -> Iterator[Item]:
        inputs, start = self._inputs, 0
        with ThreadPoolExecutor(FOOTER_READERS) as pool:
            while start < len(inputs):
                end = start + 1
                bulk = self._candidate(inputs[start])
                stop = min(start + CHUNK_FILES, len(inputs)) if bulk else len(inputs)
                while end < stop and self._candidate(inputs[end]) == bulk:
                    end += 1
                chunk, start = inputs[start:end], end
                if not bulk:
                    yield ReadEach(chunk)
                    continue
                fragments = list(pool.map(self._fragment, chunk))
                yield from self._runs(chunk, fragments)

    def _runs(
        self, chunk: list[TaskInput], fragments: list[ds.ParquetFileFragment | None]
    ) -> Iterator[Item]:
        """Consecutive files of ``chunk`` scanned together where they can be, in order."""
        i = 0
        while i < len(chunk):
            j = i + 1
            first = fragments[i]
            if first is None:
                while j < len(chunk) and fragments[j] is None:
                    j += 1
                yield ReadEach(chunk[i:j])
            else:
                # One scan per file system (data files may live in more than one bucket).
                # ``filesystem`` wraps the C++ object anew on each access: compare by value.
                while (
                    j < len(chunk)
                    and (fragment := fragments[j]) is not None
                    and fragment.filesystem.equals(first.filesystem)
                ):
                    j += 1
                run = [f for f in fragments[i:j] if f is not None]
                try:
                    yield from self._scan(run)
                except Exception as exc:
                    raise _culprit(chunk[i:j], run, self._expected, exc) from exc
                yield BulkDone(chunk[i:j])
            i = j

    def _scan(self, fragments: list[ds.ParquetFileFragment]) -> Iterator[pa.RecordBatch]:
        dataset = ds.FileSystemDataset(fragments, self._expected, FORMAT, fragments[0].filesystem)
        rows = sum(f.metadata.num_rows for f in fragments)
        decoded = sum(
            f.metadata.row_group(i).total_byte_size
            for f in fragments
            for i in range(f.metadata.num_row_groups)
        )
        row_bytes = max(decoded // max(rows, 1), 1)
        # Batches of ~1/16 of the budget. pyarrow's scanner queues what it reads ahead without
        # bound while its consumer is slower (more so with use_threads), so it reads on one
        # thread, ahead by several files only when files are tiny; _ahead bounds the rest.
        batch_rows = self._read_ahead // (16 * row_bytes)
        files_ahead = self._read_ahead // (TINY_FILE_FACTOR * max(decoded // len(fragments), 1))
        yield from dataset.to_batches(
            batch_size=min(max(batch_rows, MIN_BATCH_ROWS), MAX_BATCH_ROWS),
            batch_readahead=BATCHES_AHEAD,
            fragment_readahead=min(max(files_ahead, 1), MAX_FILES_AHEAD),
            use_threads=False,
        )


def _culprit(
    files: list[TaskInput],
    fragments: list[ds.ParquetFileFragment],
    schema: pa.Schema,
    exc: Exception,
) -> DataFileError:
    """The error naming the file of a bulk run that ``exc``, raised scanning the run, came from.

    A scan of many files does not say which one failed: each is read again on its own (only
    on failure), and the first that fails is named. A corrupt page under a valid footer then
    makes its file unreadable, as a corrupt footer does.
    """
    for f, fragment in zip(files, fragments, strict=True):
        try:
            dataset = ds.FileSystemDataset([fragment], schema, FORMAT, fragment.filesystem)
            for _ in dataset.to_batches(use_threads=False):
                pass
        except Exception as again:
            return file_error("data", f.path, again)
    paths = ", ".join(f.path for f in files[:3]) + (", ..." if len(files) > 3 else "")
    return DataFileError(f"data files {paths} (read together): {first_line(exc)}")


def _weight(item: Item, budget: int) -> int:
    """Bytes ``item`` holds while queued or in use; a ReadEach run holds the whole budget."""
    if isinstance(item, pa.RecordBatch):
        return item.nbytes
    return budget if isinstance(item, ReadEach) else 0


def _ahead(items: Iterator[Item], budget: int) -> Iterator[Item]:
    """``items``, produced in a thread at most ``budget`` bytes ahead of the consumer.

    An item counts until the consumer asks for the next one. An error in the thread is raised
    to the consumer; a consumer that stops early stops the thread (and closes ``items``)
    before this generator finishes closing.
    """
    ready: deque[tuple[Item, int]] = deque()  # with its weight, worked out once
    state = {"held": 0, "in_use": 0, "done": False, "stop": False}
    errors: list[BaseException] = []
    changed = threading.Condition()

    def produce() -> None:
        try:
            for item in items:
                weight = _weight(item, budget)
                with changed:
                    while (
                        state["held"] >= budget and (ready or state["in_use"]) and not state["stop"]
                    ):
                        changed.wait()
                    if state["stop"]:
                        return
                    ready.append((item, weight))
                    state["held"] += weight
                    changed.notify_all()
        except BaseException as exc:  # handed to the consumer
            errors.append(exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
            with changed:
                state["done"] = True
                changed.notify_all()

    thread = threading.Thread(target=produce, name="compactor-bulk-read", daemon=True)
    thread.start()
    try:
        while True:
            with changed:
                while not ready and not state["done"]:
                    changed.wait()
                if not ready:
                    break
                item, state["in_use"] = ready.popleft()
            yield item
            with changed:
                state["held"] -= state["in_use"]
                state["in_use"] = 0
                changed.notify_all()
        if errors:
            raise errors[0]
    finally:
        with changed:
            state["stop"] = True
            changed.notify_all()
        thread.join()


def _plain(f: TaskInput) -> bool:
    """Whether ``f``'s rows are exactly its file's rows (no deletes; Parquet)."""
    return not f.delete_files and f.data_file.file_format == FileFormat.PARQUET
