"""A benchmark table as a migration leaves it: the same rows in Parquet files without field ids.

``bench rewrite --imported`` loads store_sales as usual, then writes each of its data files
again with plain pyarrow (the table's codec, no Iceberg field ids) and registers them in a new
table of the same name as pyiceberg's ``add_files`` does (the name mapping set, each file's
entry from its footer by ``parquet_file_to_data_file``), in as many snapshots as the load made
(committed in batches, as the load commits). Readers then resolve the files' columns through
the table's name mapping, as they do for a Hive or plain-Parquet lake moved in with
``add_files`` or Spark's ``migrate``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties

from compactor.bench.tpcds import commit_appends, split_evenly
from compactor.iceberg.duckdb_views import duckdb_path
from compactor.iceberg.pyiceberg_compat import parquet_writer_kwargs

WRITERS = 4
IMPORTED_DIRECTORY = "imported"


def _without_field_ids(source: str, target: str, writer_kwargs: dict[str, Any]) -> None:
    rows = pq.read_table(source)
    schema = pa.schema([pa.field(f.name, f.type, f.nullable) for f in rows.schema])
    with pq.ParquetWriter(target, schema, store_decimal_as_integer=True, **writer_kwargs) as out:
        out.write_table(rows.cast(schema), row_group_size=max(rows.num_rows, 1))


def import_without_field_ids(
    catalog: Catalog,
    table: Table,
    commits: int,
    on_commit: Callable[[int], None] | None = None,
) -> tuple[Table, dict[str, Any]]:
    """Replace ``table`` by a table of the same name, schema and properties holding its rows
    as files without field ids, added as ``add_files`` adds them in ``commits`` snapshots
    (``on_commit`` receives each snapshot's file count). Returns it and what the import did."""
    started = time.monotonic()
    sources = [duckdb_path(task.file.file_path) for task in table.scan().plan_files()]
    location = Path(duckdb_path(table.location()))
    directory = location / IMPORTED_DIRECTORY
    directory.mkdir(parents=True)
    targets = [str(directory / f"{i:05d}-{Path(s).name}") for i, s in enumerate(sources)]
    writer_kwargs = parquet_writer_kwargs(table.metadata.properties)
    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(lambda s, t: _without_field_ids(s, t, writer_kwargs), sources, targets))
    identifier, schema, uri = table.name(), table.schema(), table.location()
    properties = dict(table.metadata.properties)
    catalog.drop_table(identifier)
    shutil.rmtree(location / "data", ignore_errors=True)  # the dropped table's files
    imported = catalog.create_table(identifier, schema=schema, location=uri, properties=properties)
    mapping = imported.schema().name_mapping.model_dump_json()
    with imported.transaction() as transaction:
        transaction.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
    imported = catalog.load_table(identifier)
    metadata = imported.metadata
    with ThreadPoolExecutor(WRITERS) as pool:
        data_files = list(
            pool.map(
                lambda t: parquet_file_to_data_file(imported.io, metadata, Path(t).as_uri()),
                targets,
            )
        )
    snapshots, start = [], 0
    for count in split_evenly(len(targets), min(commits, len(targets))):
        snapshots.append(data_files[start : start + count])
        start += count

    def committed(files: Sequence[DataFile]) -> None:
        if on_commit:
            on_commit(len(files))

    imported, _ = commit_appends(imported, snapshots, on_snapshot=committed)
    return imported, {
        "files": len(targets),
        "commits": min(commits, len(targets)),
        "seconds": round(time.monotonic() - started, 1),
    }
