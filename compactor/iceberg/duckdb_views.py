"""Expose an Iceberg snapshot to DuckDB as a view over exactly the data files its scan plan returns.

DuckDB reads ``s3://`` files with its ``httpfs`` extension, loaded from the PyPI package
``duckdb-extension-httpfs`` (no download at run time) and configured from the table's own
``s3.*`` FileIO properties by :func:`configure_s3`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

import duckdb
from pyiceberg.table import Table

from compactor.errors import ConfigError, UnsupportedTableError


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


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def create_view(con: duckdb.DuckDBPyConnection, name: str, table: Table) -> int:
    """(Re)create view ``name`` over the table's current files; returns how many files it reads."""
    files = snapshot_files(table)
    listing = ", ".join(_sql_string(f) for f in files)
    con.execute(
        f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM read_parquet([{listing}], union_by_name = true)'
    )
    return len(files)


def load_packaged_extension(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """``LOAD`` DuckDB extension ``name`` from the PyPI package ``duckdb-extension-<name>``.

    The package ships the extension binary built for this DuckDB version; loading it by path
    works offline, unlike ``INSTALL``.
    """
    package = f"duckdb-extension-{name}=={duckdb.__version__}"
    try:
        module = importlib.import_module(f"duckdb_extension_{name}")
    except ImportError:
        raise ConfigError(
            f"DuckDB extension {name!r} is not installed: pip install '{package}' "
            "(or compactor[bench])"
        ) from None
    root = Path(module.__file__ or "").parent
    path = root / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.is_file():
        raise ConfigError(f"{path}: missing; the DuckDB extension must match DuckDB: {package}")
    con.execute(f"LOAD {_sql_string(str(path))}")


def configure_s3(con: duckdb.DuckDBPyConnection, properties: Mapping[str, str]) -> None:
    """Let DuckDB read ``s3://`` files with the same settings as pyiceberg's ``s3.*`` properties.

    Loads ``httpfs`` and creates an S3 secret from ``s3.endpoint``, ``s3.access-key-id``,
    ``s3.secret-access-key``, ``s3.session-token`` and ``s3.region``; a custom endpoint is
    addressed path-style, as S3-compatible stores expect.
    """
    load_packaged_extension(con, "httpfs")
    settings = {
        "KEY_ID": properties.get("s3.access-key-id"),
        "SECRET": properties.get("s3.secret-access-key"),
        "SESSION_TOKEN": properties.get("s3.session-token"),
        "REGION": properties.get("s3.region"),
    }
    endpoint = properties.get("s3.endpoint")
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        settings.update(
            ENDPOINT=parsed.netloc,
            URL_STYLE="path",
            USE_SSL=str(parsed.scheme == "https").lower(),
        )
    options = "".join(f", {key} {_sql_string(value)}" for key, value in settings.items() if value)
    con.execute(f"CREATE OR REPLACE SECRET compactor_s3 (TYPE s3{options})")
