"""``compactor bench rewrite --imported``: the same rows as a migrated table, end to end."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from system.test_bench import SCALE_FACTOR, bench

from compactor.bench.imported_table import IMPORTED_DIRECTORY
from compactor.bench.tpcds import NAMESPACE
from compactor.bench.warehouse import CATALOG_FILE, CATALOG_NAME, WAREHOUSE_DIR

pytestmark = pytest.mark.slow  # left out by `make test-quick`


def test_rewrite_bench_imported_reads_files_without_field_ids_through_the_mapping(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"
    _, report = bench(
        tmp_path,
        "rewrite",
        "--files",
        "40",
        "--commits",
        "4",
        "--scale-factor",
        SCALE_FACTOR,
        "--target-file-size",
        "1MB",
        "--allow-small-target",
        "--imported",
        "--workdir",
        str(workdir),
    )

    assert report["parameters"]["imported"] is True
    source, compacted = report["input"], report["compactor"]
    assert (source["imported"]["files"], source["imported"]["commits"]) == (40, 4)
    assert report["floor_1"]["input_files"] == compacted["input_files"] == 40
    assert compacted["records_written"] == source["rows"]
    assert compacted["bulk_read_files"] == 40  # through the name mapping, in bulk
    catalog = SqlCatalog(
        CATALOG_NAME,
        uri=f"sqlite:///{workdir / CATALOG_FILE}",
        warehouse=(workdir / WAREHOUSE_DIR).as_uri(),
    )
    table = catalog.load_table(f"{NAMESPACE}.store_sales")
    assert "schema.name-mapping.default" in table.metadata.properties
    assert len(table.metadata.snapshots) == 4 + 1  # the imports, then compactor's replace
    imported = sorted((workdir / WAREHOUSE_DIR).rglob(f"{IMPORTED_DIRECTORY}/*.parquet"))
    assert len(imported) == 40
    for path in imported[::10]:
        assert all(not f.metadata for f in pq.read_schema(path))
