"""Read many data files at once where the Iceberg read path would only add cost.

A group's inputs usually come from one writer with the current schema and carry no deletes.
For those, the Iceberg read path's per-file set-up in Python (schema conversion, name mapping,
projection: tens of milliseconds per file, holding the GIL) is pure overhead: pyarrow's
dataset scanner reads them in parallel in C++ instead.

A file takes this path only when reading it by column name *is* reading it by field id and
nothing about its rows needs Iceberg's read rules: a Parquet file of a format 1 or 2 table
(v3 rows take their lineage from their positions), no delete file applies to it, every column
of the current schema is a top-level primitive column of the file with the same field id, the
same name and the same type (string and binary in either width). Every other file goes
through the Iceberg read path, file by file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as ds
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import FileFormat
from pyiceberg.table.metadata import TableMetadata

from compactor.errors import DataFileError, first_line

if TYPE_CHECKING:
    from compactor.planning.planner import TaskInput

FIELD_ID = b"PARQUET:field_id"
FOOTER_READERS = 8
# Scanner read-ahead: files opened ahead of the one being read (as pyarrow's default).
FRAGMENT_READAHEAD = 4
_WIDTHS = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}


def _signature(schema: pa.Schema) -> dict[str, tuple[bytes | None, pa.DataType]]:
    """Column name -> (field id, type with string/binary widths unified)."""
    return {f.name: ((f.metadata or {}).get(FIELD_ID), _WIDTHS.get(f.type, f.type)) for f in schema}


class BulkRead:
    """The inputs of a group that can be read at once, and a scanner over them.

    ``expected`` is the Arrow schema the group's output is written in (field ids in the field
    metadata). Batches come out in that schema, ready to be written without projection.
    Not ``enabled``, or on a FileIO other than pyiceberg's pyarrow one, every input is in
    :attr:`rest`.
    """

    def __init__(
        self,
        io: FileIO,
        metadata: TableMetadata,
        inputs: Sequence[TaskInput],
        expected: pa.Schema,
        *,
        enabled: bool = True,
    ) -> None:
        self._expected = expected
        self.files: list[TaskInput] = []
        self.rest: list[TaskInput] = list(inputs)
        self._fragments: list[ds.ParquetFileFragment] = []
        if not enabled or not isinstance(io, PyArrowFileIO) or metadata.format_version > 2:
            return
        if any(pa.types.is_nested(f.type) for f in expected):
            return
        candidates = [f for f in inputs if _plain(f)]
        if not candidates:
            return
        wanted = _signature(expected)
        file_format = ds.ParquetFileFormat()

        def fragment(f: TaskInput) -> ds.ParquetFileFragment | None:
            scheme, netloc, path = io.parse_location(f.path, io.properties)
            try:
                made = file_format.make_fragment(path, filesystem=io.fs_by_scheme(scheme, netloc))
                found = _signature(made.physical_schema)
            except Exception as exc:
                raise DataFileError(f"data file {f.path}: {first_line(exc)}") from exc
            return made if all(found.get(n) == s for n, s in wanted.items()) else None

        with ThreadPoolExecutor(FOOTER_READERS) as pool:
            fragments = list(pool.map(fragment, candidates))
        chosen = {id(f) for f, made in zip(candidates, fragments, strict=True) if made}
        self.files = [f for f in inputs if id(f) in chosen]
        self.rest = [f for f in inputs if id(f) not in chosen]
        self._fragments = [made for made in fragments if made is not None]

    @property
    def expected_records(self) -> int:
        return sum(f.data_file.record_count for f in self.files)

    def batches(self, between: Callable[[], None]) -> Iterator[pa.RecordBatch]:
        """The rows of :attr:`files`, in the expected schema; ``between`` runs after each batch."""
        if not self._fragments:
            return
        dataset = ds.FileSystemDataset(
            self._fragments,
            self._expected,
            ds.ParquetFileFormat(),
            self._fragments[0].filesystem,
        )
        for batch in dataset.to_batches(use_threads=True, fragment_readahead=FRAGMENT_READAHEAD):
            yield batch
            between()


def _plain(f: TaskInput) -> bool:
    """Whether ``f``'s rows are exactly its file's rows (no deletes; Parquet)."""
    return not f.delete_files and f.data_file.file_format == FileFormat.PARQUET
