"""``compactor bench plan --distinct-files``: a table of many files, most of them hard links.

The table must be what ``bench plan`` builds without the option (every file a live data file
of its own manifest entry, real Parquet bytes behind each), only with fewer files written, and
planning must plan every one of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from compactor.bench.planning import plan_parameters
from compactor.bench.tpcds import NAMESPACE
from compactor.bench.warehouse import CATALOG_FILE, CATALOG_NAME, WAREHOUSE_DIR
from compactor.errors import UsageError

from support.cli import compactor as run_cli
from support.tables import live_data_files, local_path


def test_distinct_files_are_written_and_the_others_linked_to_them(tmp_path: Path) -> None:
    workdir, out = tmp_path / "work", tmp_path / "report"
    result = run_cli(
        tmp_path,
        *["bench", "plan", "--files", "60", "--commits", "6", "--distinct-files", "25"],
        *["--repetitions", "1", "--workdir", str(workdir), "--out", str(out), "--json"],
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert (report["table"]["files"], report["table"]["distinct_files"]) == (60, 25)
    assert report["plan"]["files_planned"] == report["plan"]["data_files_scanned"] == 60

    catalog = SqlCatalog(
        CATALOG_NAME,
        uri=f"sqlite:///{workdir / CATALOG_FILE}",
        warehouse=(workdir / WAREHOUSE_DIR).as_uri(),
    )
    table = catalog.load_table(f"{NAMESPACE}.store_sales")
    files = live_data_files(table)
    assert len(files) == 60
    inodes = {os.stat(local_path(path)).st_ino for path in files}
    assert len(inodes) == 25  # file n is a link to file n % 25
    for path, data_file in files.items():
        assert os.path.getsize(local_path(path)) == data_file.file_size_in_bytes


@pytest.mark.parametrize("distinct", [0, 61])
def test_distinct_files_must_be_between_one_and_the_files(distinct: int) -> None:
    with pytest.raises(UsageError, match="distinct files"):
        plan_parameters(
            files=60,
            commits=6,
            rows_per_file=10,
            scale_factor=0.01,
            repetitions=1,
            target_file_size="512MB",
            allow_small_target=False,
            distinct_files=distinct,
        )
