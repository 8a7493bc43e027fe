"""Read many data files at once where the Iceberg read path would only add cost.

A group's inputs usually come from one writer with the current schema and carry no deletes.
For those, the Iceberg read path's per-file set-up in Python (schema conversion, name mapping,
projection: tens of milliseconds per file, holding the GIL) is pure overhead: pyarrow's
dataset scanner reads them in parallel in C++ instead.

A file takes this path when:

- it is a Parquet file and the FileIO is pyiceberg's pyarrow one (files small enough that
  FILES_IN_BUDGET of them fit the read-ahead are scanned together by pyarrow's dataset scanner;
  a larger one is streamed alone, a batch at a time: the dataset scanner, as the Iceberg read
  path, decodes a whole row group at once, hundreds of MB in a file of one large row group);
- no equality delete applies to it (its position deletes and deletion vectors are dropped from
  the scanned batches by position);
- its schema has a :class:`~compactor.rewrite.file_projection.Projection`: its fields, top-level
  and nested (struct, list, map) alike, resolved to field ids (its own, or the table's name
  mapping's for files imported without them), renamed, widened by the spec's type promotions,
  and the fields it lacks filled with their identity partition value (top-level columns) or
  null.

Of a format 3 table, each row's lineage is worked out as the Iceberg read path works it out,
from the file's ``first_row_id`` and the row's position in the file, before deleted rows are
dropped. Every other file goes through the Iceberg read path, file by file.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, TypeAlias

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFileContent, FileFormat
from pyiceberg.table.metadata import TableMetadata

from compactor.errors import DataFileError, file_error, first_line
from compactor.iceberg.pyiceberg_compat import (
    VERIFY_PAGE_CHECKSUMS,
    first_row_id,
    live_positions,
    read_schema,
    with_lineage,
)
from compactor.rewrite.file_projection import FIELD_ID as FIELD_ID
from compactor.rewrite.file_projection import Projection, Resolver, fill
from compactor.rewrite.phase_times import carried, phase, timed

if TYPE_CHECKING:
    from compactor.planning.planner import TaskInput

FOOTER_READERS = 8
# Scanner read-ahead bounds: rows per batch, batches ahead within a file, files ahead.
MIN_BATCH_ROWS, MAX_BATCH_ROWS = 1024, 128 * 1024
BATCHES_AHEAD = 2
# Only files small enough that this many fit the read-ahead are scanned together: the scanner
# buffers whole row groups of the files in flight (one request per row group, not per column),
# and larger files gain little from being read together.
FILES_IN_BUDGET = 64
MAX_FILES_AHEAD = 8
# Files are read ahead only when this many of them fit the read-ahead budget.
TINY_FILE_FACTOR = 256
# Files whose footers are read and checked, then scanned, at a time (bounds cached footers).
CHUNK_FILES = 128
FORMAT = ds.ParquetFileFormat(**VERIFY_PAGE_CHECKSUMS)


class _Kind(Enum):
    """How an input is read: scanned with others, scanned alone, or through the Iceberg path."""

    SMALL = "small"
    LARGE = "large"
    EACH = "each"


@dataclass(frozen=True)
class _Scannable:
    """A candidate file as a scanner fragment, with how it is read."""

    source: TaskInput
    fragment: ds.ParquetFileFragment
    projection: Projection
    constants: dict[int, pa.Scalar]
    deleted: list[pa.ChunkedArray] | None  # positions of its rows deleted


@dataclass(frozen=True)
class BulkDone:
    """The batches since the previous marker hold the live rows of ``files``, read in bulk."""

    files: list[TaskInput]

    @property
    def records(self) -> int:
        """Rows the manifests record for ``files`` (deleted rows included)."""
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
    footers; measured, not merely configured: see tests/system/test_memory_limit.py).
    ``positions`` holds the deleted positions of each input with position deletes (read by the
    caller). Not ``enabled``, or on a FileIO other than pyiceberg's pyarrow one, every input
    is read each.
    """

    def __init__(
        self,
        io: FileIO,
        metadata: TableMetadata,
        inputs: Sequence[TaskInput],
        expected: pa.Schema,
        read_ahead: int,
        positions: Mapping[str, list[pa.ChunkedArray]],
        *,
        enabled: bool = True,
    ) -> None:
        self._io, self._inputs, self._positions = io, list(inputs), positions
        self._expected, self._read_ahead = expected, read_ahead
        self._resolver = Resolver(
            expected,
            read_schema(metadata),
            metadata.specs(),
            metadata.name_mapping(),
            metadata.format_version,
        )
        self._enabled = enabled and isinstance(io, PyArrowFileIO)
        self._lineage = metadata.format_version >= 3

    def _kind(self, f: TaskInput) -> _Kind:
        if not (self._enabled and _plain(f)):
            return _Kind.EACH
        return _Kind.SMALL if f.size * FILES_IN_BUDGET <= self._read_ahead else _Kind.LARGE

    def _footer(self, f: TaskInput) -> ds.ParquetFileFragment:
        """``f`` as a scanner fragment, its footer read."""
        io = self._io
        assert isinstance(io, PyArrowFileIO)
        scheme, netloc, path = io.parse_location(f.path, io.properties)
        try:
            with phase("open_footer"):
                fragment = FORMAT.make_fragment(path, filesystem=io.fs_by_scheme(scheme, netloc))
                fragment.physical_schema  # noqa: B018 (reads the footer, in the pool's thread)
        except Exception as exc:
            raise file_error("data", f.path, exc) from exc
        return fragment

    def _scannable(self, f: TaskInput, fragment: ds.ParquetFileFragment) -> _Scannable | None:
        """``f`` with how a scan reads it, if a scan can."""
        with phase("projection"):
            projection = self._resolver.projection(fragment.physical_schema, f.data_file.spec_id)
            if projection is None:
                return None
            constants = projection.constants(f.data_file, self._expected)
            if constants is None:
                return None
            return _Scannable(f, fragment, projection, constants, self._positions.get(f.path))

    def items(self) -> Iterator[Item]:
        """The inputs' batches and markers, in plan order.

        They are produced in a thread of their own, at most ``read_ahead`` bytes ahead, so that
        decoding the next rows overlaps with encoding these (pyarrow releases the GIL for both).
        The thread waits while the consumer reads a :class:`ReadEach` run, whose reader has a
        read-ahead of its own.
        """
        return _ahead(timed("decode", self._produce()), self._read_ahead)

    def _chunks(self) -> Iterator[tuple[_Kind, list[TaskInput]]]:
        """The inputs in order, as chunks of one kind: at most CHUNK_FILES small files, one
        large one, or a run of the rest."""
        inputs, start = self._inputs, 0
        while start < len(inputs):
            end = start + 1
            kind = self._kind(inputs[start])
            stop = {
                _Kind.SMALL: min(start + CHUNK_FILES, len(inputs)),
                _Kind.LARGE: end,
                _Kind.EACH: len(inputs),
            }[kind]
            while end < stop and self._kind(inputs[end]) is kind:
                end += 1
            yield kind, inputs[start:end]
            start = end

    def _produce(self) -> Iterator[Item]:
        """The items of each chunk in turn; the next chunk's footers are read (in the pool)
        while this one is scanned."""
        with ThreadPoolExecutor(FOOTER_READERS) as pool:
            footer = carried(self._footer)
            pending: tuple[_Kind, list[TaskInput], list[Future[ds.ParquetFileFragment]]] | None
            pending = None
            for kind, chunk in self._chunks():
                reading = (
                    None
                    if kind is _Kind.EACH
                    else (kind, chunk, [pool.submit(footer, f) for f in chunk])
                )
                if pending is not None:
                    yield from self._chunk_items(*pending)
                pending = reading
                if reading is None:
                    yield ReadEach(chunk)
            if pending is not None:
                yield from self._chunk_items(*pending)

    def _chunk_items(
        self, kind: _Kind, chunk: list[TaskInput], footers: list[Future[ds.ParquetFileFragment]]
    ) -> Iterator[Item]:
        scannable = [self._scannable(f, x.result()) for f, x in zip(chunk, footers, strict=True)]
        yield from self._runs(chunk, scannable, streamed=kind is _Kind.LARGE)

    def _runs(
        self, chunk: list[TaskInput], files: list[_Scannable | None], *, streamed: bool
    ) -> Iterator[Item]:
        """Consecutive files of ``chunk`` scanned together where they can be, in order."""
        i = 0
        while i < len(chunk):
            j = i + 1
            first = files[i]
            if first is None:
                while j < len(chunk) and files[j] is None:
                    j += 1
                yield ReadEach(chunk[i:j])
            else:
                # One scan per file system (data files may live in more than one bucket) and
                # projection. ``filesystem`` wraps the C++ object anew on each access: compare
                # by value.
                while (
                    j < len(chunk)
                    and (other := files[j]) is not None
                    and other.projection == first.projection
                    and other.fragment.filesystem.equals(first.fragment.filesystem)
                ):
                    j += 1
                run = [f for f in files[i:j] if f is not None]
                try:
                    yield from _coalesced(self._scan(run, streamed), self._read_ahead // 16)
                except Exception as exc:
                    raise _culprit(chunk[i:j], run, exc, streamed) from exc
                yield BulkDone(chunk[i:j])
            i = j

    def _scan(self, files: list[_Scannable], streamed: bool) -> Iterator[pa.RecordBatch]:
        fragments = [f.fragment for f in files]
        projection = files[0].projection
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
        batch_rows = min(max(self._read_ahead // (16 * row_bytes), MIN_BATCH_ROWS), MAX_BATCH_ROWS)
        as_scanned = projection.scan.equals(self._expected, check_metadata=True)
        tagged: Iterator[tuple[_Scannable, pa.RecordBatch]]
        if streamed:
            # The dataset scanner decodes a whole row group at a time (hundreds of MB in a
            # file written as one row group): a large file is streamed batch by batch instead,
            # in quarter batches (row_bytes counts encoded bytes, a few times fewer than
            # decoded: measured on store_sales, 32 against ~280 a row).
            (one,) = files
            tagged = (
                (one, b)
                for b in _stream(
                    one.fragment, projection.scan, max(batch_rows // 4, MIN_BATCH_ROWS)
                )
            )
        else:
            dataset = ds.FileSystemDataset(
                fragments, projection.scan, FORMAT, fragments[0].filesystem
            )
            files_ahead = self._read_ahead // (TINY_FILE_FACTOR * max(decoded // len(fragments), 1))
            scanner = ds.Scanner.from_dataset(
                dataset,
                batch_size=batch_rows,
                batch_readahead=BATCHES_AHEAD,
                fragment_readahead=min(max(files_ahead, 1), MAX_FILES_AHEAD),
                use_threads=False,
            )
            if as_scanned and not self._lineage and not any(f.deleted for f in files):
                yield from scanner.to_batches()
                return
            by_path = {f.fragment.path: f for f in files}
            tagged = ((by_path[t.fragment.path], t.record_batch) for t in scanner.scan_batches())
        offsets = {id(f): 0 for f in files}  # each file's batches come in order
        for one, batch in tagged:
            start = offsets[id(one)]
            offsets[id(one)] += batch.num_rows
            if not as_scanned:
                batch = fill(batch, one.constants, self._expected)
            if self._lineage:
                source = one.source
                first = first_row_id(source.data_file)
                batch = with_lineage(batch, first, start, source.lineage_sequence_number)
            if one.deleted:
                batch = batch.take(live_positions(one.deleted, start, start + batch.num_rows))
                if not batch.num_rows:
                    continue
            yield batch


def _coalesced(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """``batches`` (of one schema), runs of small ones joined into batches of about ``size``
    bytes: a scan yields at least a batch per file, and what takes them works per batch."""
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    for batch in batches:
        held.append(batch)
        held_bytes += batch.nbytes
        if held_bytes >= size:
            yield held[0] if len(held) == 1 else pa.concat_batches(held)
            held, held_bytes = [], 0
    if held:
        yield held[0] if len(held) == 1 else pa.concat_batches(held)


def _stream(
    fragment: ds.ParquetFileFragment, scan: pa.Schema, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """The rows of ``fragment`` as a scan with schema ``scan`` reads them, ``batch_rows`` at a
    time: one row group's compressed columns buffered (read in as few requests as they can),
    no more than a batch of each column decoded. (Asked for all row groups at once, the reader
    buffers every one of them up front: the whole file.)"""
    columns = set(fragment.physical_schema.names)
    read = [field.name for field in scan if field.name in columns]
    with fragment.filesystem.open_input_file(fragment.path) as source:
        parquet = pq.ParquetFile(
            source, metadata=fragment.metadata, pre_buffer=True, **VERIFY_PAGE_CHECKSUMS
        )
        for row_group in range(parquet.num_row_groups):
            for batch in parquet.iter_batches(batch_rows, [row_group], read):
                yield pa.RecordBatch.from_arrays(
                    [
                        batch.column(field.name).cast(field.type)
                        if field.name in columns
                        else pa.nulls(batch.num_rows, field.type)
                        for field in scan
                    ],
                    schema=scan,
                )


def _culprit(
    files: list[TaskInput], scanned: list[_Scannable], exc: Exception, streamed: bool
) -> DataFileError:
    """The error naming the file of a bulk run that ``exc``, raised scanning the run, came from.

    A scan of many files does not say which one failed: each is read again on its own (only
    on failure), and the first that fails is named. A corrupt page under a valid footer then
    makes its file unreadable, as a corrupt footer does. A large file is read again as it was
    read, streamed.
    """
    for f, one in zip(files, scanned, strict=True):
        fragment = one.fragment
        try:
            batches = (
                _stream(fragment, one.projection.scan, MIN_BATCH_ROWS)
                if streamed
                else ds.FileSystemDataset(
                    [fragment], one.projection.scan, FORMAT, fragment.filesystem
                ).to_batches(use_threads=False)
            )
            for _ in batches:
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

    thread = threading.Thread(target=carried(produce), name="compactor-bulk-read", daemon=True)
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
    """Whether ``f`` is Parquet and only position deletes apply to it."""
    return f.data_file.file_format == FileFormat.PARQUET and all(
        d.content == DataFileContent.POSITION_DELETES for d in f.delete_files
    )
