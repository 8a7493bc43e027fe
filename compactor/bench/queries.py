"""Run TPC-DS queries in DuckDB: median times, what each run read, and result comparison.

Times come from runs without logging. What a query reads comes from one more run with DuckDB's
own logging on: the ``FileSystem`` log gives the files it opened and the bytes it read, the
``HTTP`` log the GET requests it sent (S3 only). A server that counts requests itself can be
given instead (``server_gets``), which is how a run on the local moto server counts.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import duckdb

# Doubles (averages, ratios) may differ in their last bits when DuckDB adds them up in another
# order, and the order follows how the data is split into files and row groups.
FLOAT_TOLERANCE = 1e-9

Row = tuple[Any, ...]


@dataclass
class QueryMeasure:
    """One query in one state of the tables."""

    times_s: list[float]
    files_opened: int
    bytes_read: int
    get_requests: int | None
    rows: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_s": round(self.median_s, 6),
            "times_s": [round(t, 6) for t in self.times_s],
            "files_opened": self.files_opened,
            "bytes_read": self.bytes_read,
            "get_requests": self.get_requests,
            "rows": self.rows,
        }


def _counted_run(
    con: duckdb.DuckDBPyConnection, query: str, server_gets: Callable[[], int] | None
) -> tuple[int, int, int]:
    """Run ``query`` once with logging; (files opened, bytes read, GET requests)."""
    con.execute("CALL enable_logging(['FileSystem', 'HTTP'])")
    before = server_gets() if server_gets else 0
    try:
        con.execute(query).fetchall()
        after = server_gets() if server_gets else 0
        files, read = con.execute(
            "SELECT count(DISTINCT path) FILTER (op = 'OPEN'), "
            "coalesce(sum(bytes) FILTER (op = 'READ'), 0) FROM duckdb_logs_parsed('FileSystem')"
        ).fetchone() or (0, 0)
        gets = con.execute(
            "SELECT count(*) FROM duckdb_logs_parsed('HTTP') WHERE request.type = 'GET'"
        ).fetchone() or (0,)
    finally:
        con.execute("CALL disable_logging()")
        con.execute("CALL truncate_duckdb_logs()")
    return int(files), int(read), after - before if server_gets else int(gets[0])


def run_query(
    con: duckdb.DuckDBPyConnection,
    query: str,
    *,
    warmup: int,
    repetitions: int,
    count_gets: bool,
    server_gets: Callable[[], int] | None = None,
) -> tuple[QueryMeasure, list[Row]]:
    """Time ``query`` (``warmup`` runs first, untimed), then count what one run reads.

    GET requests are counted when ``count_gets``: by ``server_gets`` if given, else from
    DuckDB's HTTP log. Returns the measure and the rows of the last timed run.
    """
    for _ in range(warmup):
        con.execute(query).fetchall()
    times, rows = [], []
    for _ in range(repetitions):
        started = time.perf_counter()
        rows = con.execute(query).fetchall()
        times.append(time.perf_counter() - started)
    files, read, gets = _counted_run(con, query, server_gets)
    return QueryMeasure(times, files, read, gets if count_gets else None, len(rows)), rows


def _sort_key(row: Row) -> tuple[tuple[int, Any], ...]:
    """Orders rows of mixed types and NULLs; floats rounded so near-equal ones sort together."""
    key: list[tuple[int, Any]] = []
    for value in row:
        if value is None:
            key.append((0, 0))
        elif isinstance(value, float):
            key.append((1, 0.0 if math.isnan(value) else float(f"{value:.6g}")))
        elif isinstance(value, int | Decimal | date | datetime):
            key.append((2, value))
        else:
            key.append((3, str(value)))
    return tuple(key)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE) or (
            math.isnan(a) and math.isnan(b)
        )
    return bool(a == b) and type(a) is type(b)


def same_results(before: Sequence[Row], after: Sequence[Row]) -> bool:
    """The same multiset of rows, floats within FLOAT_TOLERANCE, in any order.

    Comparing without order is right for every query: where ORDER BY is total the order is a
    function of the rows, and where it is not, ties may come out in either order.
    """
    if len(before) != len(after):
        return False
    pairs = zip(sorted(before, key=_sort_key), sorted(after, key=_sort_key), strict=True)
    return all(
        len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
        for a, b in pairs
    )
