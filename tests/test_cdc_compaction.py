"""CDC and merge-on-read tables written by Iceberg Java, compacted, and read back by Iceberg Java.

The tables come from an independent writer (tests/java_writer.py: Flink-style upserts with
equality and position deletes, Spark-style merge-on-read position deletes, equality deletes
under an all-void spec, a schema change between data and deletes, and a format-v3 table with
deletion vectors). After ``compactor run`` the rows Iceberg Java reads equal those its writer
expects, row for row; data files fall to one per partition and, as every data file was
rewritten, no delete file is left.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers import live_data_files, live_delete_files, run_compaction
from java_reader import JavaReader, java_read
from java_writer import read_expected, write_cdc_table
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor.errors import UnsupportedTableError

# scenario -> partitions of its current data (one output file each)
COMPACTED = {"upsert": 4, "merge-on-read": 3, "void-spec": 5, "schema-change": 1}


def _written(catalog: Catalog, tmp_path: Path, scenario: str) -> tuple[Table, Counter[str]]:
    location = tmp_path / scenario
    metadata_location = write_cdc_table(scenario, location, seed=1)
    table = catalog.register_table(("db", scenario.replace("-", "_")), metadata_location)
    return table, read_expected(location).rows


@pytest.mark.parametrize("scenario", sorted(COMPACTED))
def test_java_reads_the_same_rows_after_compaction(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader, scenario: str
) -> None:
    table, expected = _written(catalog, tmp_path, scenario)
    before = java_read(table, [])
    assert before.current.rows == expected
    data_before = len(live_data_files(table))
    deletes_before = live_delete_files(table)
    assert deletes_before

    result, after = run_compaction(catalog, f"db.{scenario.replace('-', '_')}")

    summary = result.to_dict()
    assert summary["failed_groups"] == [] and not result.plan.skipped, summary
    assert summary["rewritten_files"] == data_before
    # One file per partition of the data (a void spec's files form one more partition).
    assert len(live_data_files(after)) == COMPACTED[scenario]
    assert live_delete_files(after) == {}
    assert summary["rewritten_delete_files"] == len(deletes_before)
    # Files of an all-void spec are unpartitioned, as Java's location provider places them.
    assert not [p for p in live_data_files(after) if "=null/" in p]
    read = java_read(after, [after.current_snapshot().snapshot_id])
    assert read.current.rows == expected
    assert read.live_files() == Counter({"data": COMPACTED[scenario]})
    assert summary["deleted_rows_applied"] > 0


def test_a_format_v3_table_is_refused_and_left_as_it_was(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table, expected = _written(catalog, tmp_path, "dv")
    metadata_location = table.metadata_location
    with pytest.raises(UnsupportedTableError, match="format version 3"):
        run_compaction(catalog, "db.dv")
    table = catalog.load_table("db.dv")
    assert table.metadata_location == metadata_location
    assert java_read(table, []).current.rows == expected
