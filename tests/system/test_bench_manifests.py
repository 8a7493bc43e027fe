"""``compactor bench manifests`` at tiny scale, end to end, as users run it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from compactor.bench.tpcds import NAMESPACE
from compactor.bench.warehouse import CATALOG_FILE, CATALOG_NAME, WAREHOUSE_DIR
from compactor.planning.manifest_groups import manifest_stats

from support.cli import assert_one_error_line
from support.cli import compactor as run_cli

pytestmark = pytest.mark.slow  # left out by `make test-quick`


def test_manifests_bench_rewrites_every_commits_manifest_and_plans_the_same_files(
    tmp_path: Path,
) -> None:
    workdir, out = tmp_path / "work", tmp_path / "report"
    result = run_cli(
        tmp_path,
        *("bench", "manifests", "--commits", "40", "--repetitions", "1"),
        *("--workdir", str(workdir), "--out", str(out), "--json"),
    )

    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert json.loads(result.stdout) == report
    assert report["benchmark"] == "manifests"
    assert (report["table"]["files"], report["table"]["commits"]) == (40, 40)
    rewrite = report["rewrite"]
    assert rewrite["manifests_before"]["data"] == rewrite["manifests_replaced"] == 40
    assert rewrite["manifests_after"]["data"] == rewrite["manifests_written"] == 1
    assert len(report["runs_before"]) == len(report["runs_after"]) == 1
    for run in report["runs_before"]:
        assert (run["manifests"], run["files"]) == (40, 40) and run["plan_files_seconds"] > 0
    for run in report["runs_after"]:
        assert (run["manifests"], run["files"]) == (1, 40)
    # DuckDB's iceberg_scan plans the same snapshots: metadata file, manifest list and every
    # manifest opened, no data file; the count comes from the manifests' record counts.
    for when, manifests in (("before", 40), ("after", 1)):
        [run] = report[f"duckdb_runs_{when}"]
        assert report[f"duckdb_scan_{when}"] == run
        opened = (run["files_opened"], run["data_files_opened"], run["rows"])
        assert opened == (2 + manifests, 0, 40 * 10)
        assert run["explain_seconds"] > 0 and run["count_seconds"] > 0
        assert run["peak_rss_bytes"] > 0
    markdown = (out / "report.md").read_text()
    assert "**40 manifests rewritten into 1 in" in markdown
    assert "files opened: 42 before, 3 after (0 data files)" in markdown
    catalog = SqlCatalog(
        CATALOG_NAME,
        uri=f"sqlite:///{workdir / CATALOG_FILE}",
        warehouse=(workdir / WAREHOUSE_DIR).as_uri(),
    )
    table = catalog.load_table(f"{NAMESPACE}.store_sales")
    assert manifest_stats(table).manifests == {"data": 1, "deletes": 0}
    assert table.scan().to_arrow().num_rows == 40 * 10


def test_bad_manifests_options_are_one_error_line_with_exit_code_2(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "bench", "manifests", "--commits", "1")
    assert_one_error_line(result, 2, "--commits")
