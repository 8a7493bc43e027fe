"""TPC-DS data and queries from DuckDB's own ``tpcds`` extension, loaded into Iceberg fragmented.

Tables are loaded as a streaming writer leaves them: one small Parquet file per commit, each
commit appending the next slice of the generated rows in the generator's order
(:func:`load_table`). :func:`load_table_in_files` instead cuts the rows, once, into a given
number of files of equal rows in a given number of commits (a fixed-shape workload); it writes
the files with pyiceberg's writer and commits them with :func:`commit_appends`. Tables are
unpartitioned: TPC-DS fact tables carry dates only as integer surrogate keys, and partitioning
by day at small scale factors would give thousands of partitions too small for any compaction
to reach the target size (see docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.io.pyarrow import pyarrow_to_schema, write_file
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus
from pyiceberg.table import Table, WriteTask
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)

from compactor.commit.snapshot_writer import SnapshotWriter, branch_commit
from compactor.errors import UsageError
from compactor.iceberg.duckdb_views import load_packaged_extension
from compactor.iceberg.pyiceberg_compat import (
    snapshot_manifests,
)

# The eight I/O-heavy queries of the Amazon S3 Tables compaction study.
DEFAULT_QUERIES = (25, 31, 49, 76, 77, 80, 88, 96)
NAMESPACE = "tpcds"
GENERATOR_FILE = "tpcds.duckdb"
# Rows DuckDB hands over at a time while loading (slices are cut from these).
FETCH_ROWS = 65_536
# commit_appends: snapshots added per catalog commit (each catalog commit rewrites the whole
# table metadata, which grows with every snapshot: one per snapshot would make loading
# thousands of commits quadratic).
SNAPSHOTS_PER_CATALOG_COMMIT = 100
# load_table_in_files: files handed to pyiceberg's (threaded) writer at a time.
WRITE_BATCH_FILES = 256


def generate(path: Path, scale_factor: float) -> duckdb.DuckDBPyConnection:
    """A DuckDB database at ``path`` (replaced) holding TPC-DS at ``scale_factor``."""
    if scale_factor <= 0:
        raise UsageError(f"--scale-factor: must be above 0, got {scale_factor}")
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    load_packaged_extension(con, "tpcds")
    con.execute("CALL dsdgen(sf = ?)", [scale_factor])
    return con


def parse_query_numbers(text: str) -> list[int]:
    """``"25,31, 49"`` -> ``[25, 31, 49]``; TPC-DS has queries 1 to 99."""
    try:
        numbers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--queries {text!r}: expected numbers like 25,31,49") from None
    wrong = [n for n in numbers if not 1 <= n <= 99]
    if not numbers or wrong:
        raise UsageError(f"--queries {text!r}: TPC-DS queries are numbered 1 to 99")
    return list(dict.fromkeys(numbers))


def query_texts(con: duckdb.DuckDBPyConnection, numbers: list[int]) -> dict[int, str]:
    """The text of each query, from the extension's ``tpcds_queries()``."""
    texts = dict(con.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall())
    return {n: texts[n] for n in numbers}


def tables_of(query: str, names: list[str]) -> list[str]:
    """The tables among ``names`` that ``query`` mentions."""
    return [n for n in names if re.search(rf"\b{re.escape(n)}\b", query, re.IGNORECASE)]


def generated_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Names of the generated TPC-DS tables."""
    return [
        row[0]
        for row in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
    ]


@dataclass
class LoadedTable:
    """One table as loaded: what DuckDB generated and what the Iceberg snapshot holds."""

    table: str
    rows_generated: int
    rows_loaded: int
    files: int
    bytes: int
    commits: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _loaded(
    table: Table, name: str, rows_generated: int, commits: int, started: float
) -> dict[str, Any]:
    """The fields of a LoadedTable for ``table``, from its current snapshot's totals."""
    totals = _summary(table)
    return {
        "table": name,
        "rows_generated": rows_generated,
        "rows_loaded": int(totals.get("total-records", 0)),
        "files": int(totals.get("total-data-files", 0)),
        "bytes": int(totals.get("total-files-size", 0)),
        "commits": commits,
        "seconds": round(time.monotonic() - started, 3),
    }


class _Sizer:
    """Rows per slice for files of about ``file_size``, corrected after every file written."""

    def __init__(self, file_size: int) -> None:
        self.file_size = file_size
        self.rows = 0

    def calibrate(self, sample: pa.Table) -> None:
        """A first estimate: ``sample`` written as Parquet with pyiceberg's default codec."""
        buffer = io.BytesIO()
        pq.write_table(sample, buffer, compression="zstd")
        self.observe(sample.num_rows, buffer.tell())

    def observe(self, rows: int, size: int) -> None:
        """A file of ``rows`` rows came out ``size`` bytes."""
        if size > 0:
            self.rows = max(1, int(rows * self.file_size / size))


def _slices(batches: Iterator[pa.RecordBatch], sizer: _Sizer) -> Iterator[pa.Table]:
    """Cut the stream of ``batches`` into tables of ``sizer.rows`` rows (the last may be shorter)."""
    pending: list[pa.RecordBatch] = []
    buffered = 0
    for batch in batches:
        if not sizer.rows:
            sizer.calibrate(pa.Table.from_batches([batch]))
        pending.append(batch)
        buffered += batch.num_rows
        while pending and buffered >= sizer.rows:
            combined = pa.Table.from_batches(pending)
            head, rest = combined.slice(0, sizer.rows), combined.slice(sizer.rows)
            pending, buffered = rest.to_batches(), rest.num_rows
            yield head
    if buffered:
        yield pa.Table.from_batches(pending)


def _source(con: duckdb.DuckDBPyConnection, name: str, repeat: bool) -> Iterator[pa.RecordBatch]:
    while True:
        yield from con.execute(f'SELECT * FROM "{name}"').to_arrow_reader(FETCH_ROWS)
        if not repeat:
            return


def _summary(table: Table) -> dict[str, str]:
    snapshot = table.current_snapshot()
    return snapshot.summary.additional_properties if snapshot and snapshot.summary else {}


def load_table(
    con: duckdb.DuckDBPyConnection,
    catalog: Catalog,
    name: str,
    file_size: int,
    *,
    until_bytes: int | None = None,
    on_commit: Callable[[int, int], None] | None = None,
) -> tuple[Table, LoadedTable]:
    """Create ``tpcds.<name>`` and append the generated rows one ~``file_size`` file per commit.

    With ``until_bytes``, the rows are appended over and over until the table holds that many
    bytes of data files. Each commit's file size is measured and the next slice sized from it;
    ``on_commit`` receives each commit's rows and bytes.
    """
    started = time.monotonic()
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(NAMESPACE)
    generated = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()
    rows_generated = int(generated[0]) if generated else 0
    schema = con.execute(f'SELECT * FROM "{name}" LIMIT 0').to_arrow_table().schema
    table = catalog.create_table(f"{NAMESPACE}.{name}", schema=schema)
    batches = _source(con, name, repeat=until_bytes is not None and rows_generated > 0)
    sizer = _Sizer(file_size)
    loaded_bytes = commits = 0
    for piece in _slices(batches, sizer):
        table.append(piece)
        commits += 1
        size = int(_summary(table).get("added-files-size", 0))
        loaded_bytes += size
        sizer.observe(piece.num_rows, size)
        if on_commit:
            on_commit(piece.num_rows, size)
        if until_bytes is not None and loaded_bytes >= until_bytes:
            break
    return table, LoadedTable(**_loaded(table, name, rows_generated, commits, started))


@dataclass
class LoadedInFiles(LoadedTable):
    """A table loaded by :func:`load_table_in_files`: also how many catalog commits it took."""

    catalog_commits: int = 0


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` counts differing by at most one, the larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _new_snapshot_id(taken: set[int]) -> int:
    while True:
        candidate = random.getrandbits(63)
        if candidate and candidate not in taken:
            taken.add(candidate)
            return candidate


def commit_appends(
    table: Table,
    appends: Iterable[Sequence[DataFile]],
    *,
    snapshots_per_catalog_commit: int = SNAPSHOTS_PER_CATALOG_COMMIT,
    on_snapshot: Callable[[Sequence[DataFile]], None] | None = None,
) -> tuple[Table, int]:
    """Commit each list of data files in ``appends`` as its own snapshot, as a fast append.

    Every snapshot is what pyiceberg's ``append`` leaves (``fast_append``): one new manifest of
    ADDED entries listed first, then every manifest of the parent, the next sequence number, an
    ``append`` summary with the running totals, and main moved to it. Up to
    ``snapshots_per_catalog_commit`` of them go to the catalog in one commit, validated as
    pyiceberg's own writes are. Format version 2 only. Returns the refreshed table and how many
    catalog commits it took.
    """
    if table.metadata.format_version != 2:
        raise UsageError(f"table {'.'.join(table.name())}: bench loading needs format version 2")
    metadata = table.metadata
    spec, schema = metadata.spec(), metadata.schema()
    head = table.current_snapshot()
    carried = snapshot_manifests(table.io, head, 2) if head else []
    previous = head.summary.additional_properties if head and head.summary else None
    parent = head.snapshot_id if head else None
    sequence = metadata.last_sequence_number
    taken = {s.snapshot_id for s in metadata.snapshots}
    last_ms = metadata.last_updated_ms
    batch_parent, batch = parent, list[Snapshot]()
    catalog_commits = 0

    def flush() -> None:
        nonlocal batch, batch_parent, catalog_commits
        if batch:
            requirements, updates = branch_commit(metadata, MAIN_BRANCH, batch_parent, batch)
            table.catalog.commit_table(table, requirements, updates)
            table.refresh()
            catalog_commits += 1
            batch, batch_parent = [], parent

    for files in appends:
        snapshot_id = _new_snapshot_id(taken)
        sequence += 1
        writer = SnapshotWriter(table, snapshot_id, None)
        with writer.manifest_writer(spec.spec_id) as manifest_writer:
            for data_file in files:
                manifest_writer.add_entry(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=data_file,
                    )
                )
        manifest = manifest_writer.to_manifest_file()
        manifests = [manifest, *carried]
        manifest_list, _ = writer.manifest_list(parent, sequence, manifests)
        # As the manifest list recorded it, for the next snapshots that carry it over.
        manifest.sequence_number = manifest.min_sequence_number = sequence
        collector = SnapshotSummaryCollector()
        for data_file in files:
            collector.add_file(data_file, schema=schema, partition_spec=spec)
        summary = update_snapshot_summaries(
            Summary(operation=Operation.APPEND, **collector.build()), previous_summary=previous
        )
        last_ms = max(int(time.time() * 1000), last_ms + 1)
        batch.append(
            Snapshot(
                snapshot_id=snapshot_id,
                parent_snapshot_id=parent,
                sequence_number=sequence,
                timestamp_ms=last_ms,
                manifest_list=manifest_list,
                summary=summary,
                schema_id=metadata.current_schema_id,
            )
        )
        carried, previous, parent = manifests, summary.additional_properties, snapshot_id
        if on_snapshot:
            on_snapshot(files)
        if len(batch) >= snapshots_per_catalog_commit:
            flush()
    flush()
    return table, catalog_commits


class _Rows:
    """Takes the next N rows from a stream of record batches."""

    def __init__(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> None:
        self._batches, self._schema = batches, schema
        self._pending: list[pa.RecordBatch] = []
        self._buffered = 0

    def take(self, rows: int) -> pa.Table:
        while self._buffered < rows:
            batch = next(self._batches, None)
            if batch is None:
                break
            self._pending.append(batch)
            self._buffered += batch.num_rows
        combined = pa.Table.from_batches(self._pending, schema=self._schema)
        head, rest = combined.slice(0, rows), combined.slice(rows)
        self._pending, self._buffered = rest.to_batches(), rest.num_rows
        return head


def load_table_in_files(
    con: duckdb.DuckDBPyConnection,
    catalog: Catalog,
    name: str,
    files: int,
    commits: int,
    *,
    on_commit: Callable[[int, int], None] | None = None,
) -> tuple[Table, LoadedInFiles]:
    """Create ``tpcds.<name>`` and append its generated rows once as ``files`` files of equal
    rows (the generator's order) in ``commits`` fast-append snapshots of equal file counts.

    The files are written by pyiceberg's writer (field ids, column metrics, the table's
    codec) and committed by :func:`commit_appends`. ``on_commit`` receives each commit's rows
    and bytes.
    """
    started = time.monotonic()
    if files < 1 or not 1 <= commits <= files:
        raise UsageError(
            f"--files {files} --commits {commits}: need 1 <= commits <= files", "files", "commits"
        )
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(NAMESPACE)
    generated = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()
    rows_generated = int(generated[0]) if generated else 0
    if rows_generated < files:
        raise UsageError(
            f"--files {files}: {name} has only {rows_generated:,} rows at this scale factor",
            "files",
        )
    arrow_schema = con.execute(f'SELECT * FROM "{name}" LIMIT 0').to_arrow_table().schema
    table = catalog.create_table(
        f"{NAMESPACE}.{name}", schema=arrow_schema, properties={"format-version": "2"}
    )
    metadata = table.metadata
    task_schema = pyarrow_to_schema(
        arrow_schema, name_mapping=metadata.schema().name_mapping, format_version=2
    )
    reader = con.execute(f'SELECT * FROM "{name}"').to_arrow_reader(FETCH_ROWS)
    rows = _Rows(iter(reader), arrow_schema)
    file_rows = iter(split_evenly(rows_generated, files))
    per_commit = split_evenly(files, commits)

    def appends() -> Iterator[list[DataFile]]:
        position = 0
        while position < len(per_commit):
            # Several commits' files at once, so that pyiceberg's writer threads have work.
            batch: list[int] = []
            while position < len(per_commit) and (
                not batch or sum(batch) + per_commit[position] <= WRITE_BATCH_FILES
            ):
                batch.append(per_commit[position])
                position += 1
            write_uuid = uuid.uuid4()
            tasks = [
                WriteTask(
                    write_uuid=write_uuid,
                    task_id=task_id,
                    schema=task_schema,
                    record_batches=rows.take(next(file_rows)).to_batches(),
                )
                for task_id in range(sum(batch))
            ]
            written = list(write_file(table.io, metadata, iter(tasks)))
            start = 0
            for count in batch:
                yield written[start : start + count]
                start += count

    def committed(data_files: Sequence[DataFile]) -> None:
        if on_commit:
            on_commit(
                sum(f.record_count for f in data_files),
                sum(f.file_size_in_bytes for f in data_files),
            )

    table, catalog_commits = commit_appends(table, appends(), on_snapshot=committed)
    loaded = _loaded(table, name, rows_generated, commits, started)
    return table, LoadedInFiles(**loaded, catalog_commits=catalog_commits)
