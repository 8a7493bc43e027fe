"""The fragmented events table in a test's S3 bucket, and the object keys a table references."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor.bench.sample import REGIONS
from compactor.iceberg.references import table_references

from support.tables import events_table, live_data_files

if TYPE_CHECKING:
    from support.s3_server import S3Bucket

TABLE = "db.events"
COMMITS, ROWS_PER_COMMIT, DAYS = 5, 400, 3
# Every commit writes one file into each (day, region) partition.
DATA_FILES = COMMITS * DAYS * len(REGIONS)


def make_table(s3: S3Bucket) -> tuple[Catalog, Table]:
    """``db.events``, fragmented: COMMITS appends of one small file per (day, region), as
    :func:`support.tables.append_rows` writes them (a test's ``file_kind``)."""
    catalog = s3.catalog()
    table = events_table(
        catalog, TABLE, commits=COMMITS, rows_per_commit=ROWS_PER_COMMIT, days=DAYS
    )
    assert table.location().startswith(f"{s3.warehouse}/")
    assert len(live_data_files(table)) == DATA_FILES
    return catalog, table


def object_key(s3: S3Bucket, location: str) -> str:
    """The key S3 clients read for ``location``: s3, s3a and s3n are alike; no decoding."""
    scheme, _, rest = location.partition("://")
    assert scheme in ("s3", "s3a", "s3n"), location
    return s3.key(f"s3://{rest}")


def referenced_keys(s3: S3Bucket, table: Table) -> set[str]:
    """Object keys of every file the table's snapshots reach."""
    return {object_key(s3, location) for location in table_references(table).all()}
