"""Expose an Iceberg snapshot to DuckDB as a view over exactly the data files its scan plan returns."""

from __future__ import annotations

from urllib.parse import unquote, urlparse

import duckdb
from pyiceberg.table import Table

from compactor.errors import UnsupportedTableError


def duckdb_path(location: str) -> str:
    """A path DuckDB can open: local paths for ``file:`` URIs, others unchanged (``s3://``)."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path)
    if parsed.scheme in ("s3a", "s3n"):
        return "s3://" + location.split("://", 1)[1]
    return location


def snapshot_files(table: Table, snapshot_id: int | None = None) -> list[str]:
    """Data files of a snapshot (default: current); refuses snapshots with delete files."""
    files = []
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        if task.delete_files:
            raise UnsupportedTableError(
                f"table {'.'.join(table.name())}: has delete files, which a plain Parquet view would ignore"
            )
        files.append(duckdb_path(task.file.file_path))
    return files


def create_view(con: duckdb.DuckDBPyConnection, name: str, table: Table) -> int:
    """(Re)create view ``name`` over the table's current files; returns how many files it reads."""
    files = snapshot_files(table)
    listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    con.execute(
        f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM read_parquet([{listing}], union_by_name = true)'
    )
    return len(files)
