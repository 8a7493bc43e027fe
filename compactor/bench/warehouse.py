"""Where a benchmark keeps its tables: a SQLite catalog in the work directory, data on local disk
or in an S3 bucket (any S3-compatible endpoint, or a moto server started for the run)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import duckdb
from pyarrow.fs import S3FileSystem
from pyiceberg.catalog.sql import SqlCatalog

from compactor.bench.s3_local import RequestCounter, local_s3
from compactor.errors import ConfigError, UsageError
from compactor.iceberg.duckdb_views import configure_s3

CATALOG_NAME = "bench"
DEFAULT_BUCKET = "compactor-bench"
# Files the benchmark creates in its work directory (and removes there before a run).
CATALOG_FILE = "catalog.db"
WAREHOUSE_DIR = "warehouse"


@dataclass
class Warehouse:
    """A bench catalog and what is needed to reach its data from pyiceberg and DuckDB."""

    storage: str  # "local", "s3-local" or "s3"
    catalog_properties: dict[str, str]
    s3_properties: dict[str, str] = field(default_factory=dict)
    # Requests the S3 server answered (only for a server this process started).
    server_counter: RequestCounter | None = None

    def catalog(self) -> SqlCatalog:
        """The bench catalog (another process can open it from ``catalog_properties``)."""
        return SqlCatalog(CATALOG_NAME, **self.catalog_properties)

    @property
    def on_s3(self) -> bool:
        return self.storage != "local"

    def duckdb_connection(self) -> duckdb.DuckDBPyConnection:
        """A fresh in-memory DuckDB that reads this warehouse's files.

        On S3 the external file cache is off, so every query run reads from storage as a new
        engine would, instead of from data cached by the previous run.
        """
        con = duckdb.connect()
        if self.on_s3:
            configure_s3(con, self.s3_properties)
            con.execute("SET enable_external_file_cache = false")
        return con


def _env_s3_properties(endpoint: str) -> dict[str, str]:
    """pyiceberg ``s3.*`` properties for an external endpoint, from the usual AWS variables."""
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise ConfigError(
            "--s3-endpoint: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_REGION)"
        )
    properties = {
        "s3.endpoint": endpoint,
        "s3.access-key-id": key,
        "s3.secret-access-key": secret,
        "s3.region": os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1",
    }
    if os.environ.get("AWS_SESSION_TOKEN"):
        properties["s3.session-token"] = os.environ["AWS_SESSION_TOKEN"]
    return properties


def _s3_filesystem(properties: dict[str, str]) -> S3FileSystem:
    endpoint = urlparse(properties["s3.endpoint"])
    return S3FileSystem(
        access_key=properties["s3.access-key-id"],
        secret_key=properties["s3.secret-access-key"],
        session_token=properties.get("s3.session-token"),
        region=properties["s3.region"],
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme or "https",
        allow_bucket_creation=True,
    )


def _reset_workdir(workdir: Path) -> None:
    """Remove what an earlier run left in ``workdir`` (only the files the benchmark creates)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / CATALOG_FILE).unlink(missing_ok=True)
    shutil.rmtree(workdir / WAREHOUSE_DIR, ignore_errors=True)


@contextmanager
def open_warehouse(
    workdir: Path,
    *,
    s3: str | None = None,
    s3_endpoint: str | None = None,
    bucket: str = DEFAULT_BUCKET,
    s3_latency_s: float = 0.0,
) -> Iterator[Warehouse]:
    """A fresh warehouse for one run: local under ``workdir``, or in ``bucket`` on S3.

    ``s3="local"`` starts a moto server for the run; ``s3_endpoint`` uses an S3-compatible
    store with the AWS_* credentials of the environment. On S3 the run's data lives under a
    prefix of its own, deleted at the end. ``s3_latency_s`` delays every request to the local
    server (only with ``s3="local"``).
    """
    if s3 not in (None, "local"):
        raise UsageError(
            f"--s3 {s3!r}: the only value is 'local' (use --s3-endpoint URL otherwise)"
        )
    if s3 and s3_endpoint:
        raise UsageError("--s3 local and --s3-endpoint: give one of them")
    if s3_latency_s and s3 != "local":
        raise UsageError("--s3-latency: only with --s3 local (a real store has its own)")
    _reset_workdir(workdir)
    catalog = {"uri": f"sqlite:///{workdir / CATALOG_FILE}"}
    with ExitStack() as stack:
        if not s3 and not s3_endpoint:
            (workdir / WAREHOUSE_DIR).mkdir()
            catalog["warehouse"] = (workdir / WAREHOUSE_DIR).as_uri()
            yield Warehouse("local", catalog)
            return
        counter = None
        if s3:
            server = stack.enter_context(local_s3(s3_latency_s))
            properties, counter, storage = server.properties(), server.counter, "s3-local"
        else:
            properties, storage = _env_s3_properties(str(s3_endpoint)), "s3"
        filesystem = _s3_filesystem(properties)
        prefix = f"{bucket}/compactor-bench-{uuid.uuid4().hex[:8]}"
        filesystem.create_dir(bucket)
        stack.callback(filesystem.delete_dir, prefix)
        catalog["warehouse"] = f"s3://{prefix}"
        yield Warehouse(storage, {**catalog, **properties}, properties, counter)
