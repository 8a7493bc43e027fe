"""TPC-DS data and queries from DuckDB's own ``tpcds`` extension, loaded into Iceberg fragmented.

Tables are loaded as a streaming writer leaves them: one small Parquet file per commit, each
commit appending the next slice of the generated rows in the generator's order. Tables are
unpartitioned: TPC-DS fact tables carry dates only as integer surrogate keys, and partitioning
by day at small scale factors would give thousands of partitions too small for any compaction
to reach the target size (see docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.table import Table

from compactor.errors import UsageError
from compactor.iceberg.duckdb_views import load_packaged_extension

# The eight I/O-heavy queries of the Amazon S3 Tables compaction study.
DEFAULT_QUERIES = (25, 31, 49, 76, 77, 80, 88, 96)
NAMESPACE = "tpcds"
GENERATOR_FILE = "tpcds.duckdb"
# Rows DuckDB hands over at a time while loading (slices are cut from these).
FETCH_ROWS = 65_536


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
    totals = _summary(table)
    return table, LoadedTable(
        table=name,
        rows_generated=rows_generated,
        rows_loaded=int(totals.get("total-records", 0)),
        files=int(totals.get("total-data-files", 0)),
        bytes=int(totals.get("total-files-size", 0)),
        commits=commits,
        seconds=round(time.monotonic() - started, 3),
    )
