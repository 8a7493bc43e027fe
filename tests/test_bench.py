"""``compactor bench queries`` and ``compactor bench rewrite`` at tiny scale, end to end.

The commands run as subprocesses (as users run them) at TPC-DS scale factor 0.01 with small
files and a small target, so the whole module stays within seconds; the reports they write
are checked field by field against what was generated, loaded and compacted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyiceberg.catalog import Catalog
from test_cli import assert_one_error_line
from test_cli import compactor as run_cli
from typer.testing import CliRunner

from compactor.bench import query_benchmark
from compactor.bench.queries import same_results
from compactor.bench.tpcds import DEFAULT_QUERIES, NAMESPACE
from compactor.cli.app import app
from compactor.compaction import RunResult
from compactor.iceberg.duckdb_views import load_packaged_extension

pytestmark = pytest.mark.slow  # left out by `make test-quick`

SCALE_FACTOR = "0.01"
SMALL = ("--scale-factor", SCALE_FACTOR, "--target-file-size", "4MB", "--allow-small-target")
QUICK = ("--warmup", "0", "--repetitions", "1")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# report.json: key -> type, or a nested schema (a one-element list: every item has that schema).
MEASURE = {
    "median_s": float,
    "times_s": list,
    "files_opened": int,
    "bytes_read": int,
    "get_requests": (int, type(None)),
    "rows": int,
}
COMMON = {
    "schema_version": int,
    "benchmark": str,
    "created_at": str,
    "command": list,
    "machine": {
        "cpu_count": int,
        "cpu_model": str,
        "memory_bytes": int,
        "platform": str,
        "python": str,
        "versions": {"compactor": str, "pyiceberg": str, "pyarrow": str, "duckdb": str},
    },
    "parameters": dict,
}
QUERIES_SCHEMA = {
    **COMMON,
    "generation": {"seconds": float},
    "load": {
        "seconds": float,
        "files": int,
        "bytes": int,
        "commits": int,
        "rows_loaded": int,
        "rows_generated": int,
        "tables": [
            {
                "table": str,
                "rows_generated": int,
                "rows_loaded": int,
                "files": int,
                "bytes": int,
                "commits": int,
                "seconds": float,
            }
        ],
    },
    "queries": [
        {
            "query": int,
            "tables": list,
            "before": MEASURE,
            "after": MEASURE,
            "speedup": float,
            "identical_results": bool,
        }
    ],
    "totals": {
        "before_s": float,
        "after_s": float,
        "speedup": float,
        "files_opened_before": int,
        "files_opened_after": int,
        "bytes_read_before": int,
        "bytes_read_after": int,
        "identical_results": bool,
    },
    "compaction": {
        "input_files": int,
        "output_files": int,
        "input_bytes": int,
        "output_bytes": int,
        "records": int,
        "seconds": float,
        "mb_per_s": float,
        "files_before": int,
        "files_after": int,
        "tables": [dict],
    },
    "s3_requests": (dict, type(None)),
}
PHASE = {
    "seconds": float,
    "cpu_seconds": float,
    "mb_per_s": float,
    "mb_per_s_per_core": float,
    "peak_rss_bytes": int,
    "baseline_rss_bytes": int,
    "output_files": int,
    "output_bytes": int,
    "output_file_sizes": list,
}
REWRITE_SCHEMA = {
    **COMMON,
    "input": {"table": str, "files": int, "bytes": int, "rows": int, "commits": int},
    "floor": PHASE,
    "compactor": {
        **PHASE,
        "input_files": int,
        "groups": int,
        "parallelism": int,
        "records_written": int,
        "rows_deleted": int,
    },
    "fraction_of_floor": float,
}


def assert_schema(value: Any, schema: Any, where: str = "report") -> None:
    """``value`` has every key of ``schema`` with a value of the given type (ints count as floats)."""
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        for key, sub in schema.items():
            assert key in value, f"{where}: no key {key!r}"
            assert_schema(value[key], sub, f"{where}.{key}")
    elif isinstance(schema, list):
        assert isinstance(value, list) and value, f"{where}: {value!r} is not a non-empty list"
        for i, item in enumerate(value):
            assert_schema(item, schema[0], f"{where}[{i}]")
    else:
        allowed = schema if isinstance(schema, tuple) else (schema,)
        if float in allowed:
            allowed = (*allowed, int)
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
        assert ok, f"{where}: {value!r} is not {schema}"


def bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``compactor bench ARGS --out OUT --json``; returns the process and report.json."""
    out = tmp_path / "report"
    result = run_cli(tmp_path, "bench", *args, "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert json.loads(result.stdout) == report
    return result, report


def generated_row_counts(scale_factor: float) -> dict[str, int]:
    """Rows of every TPC-DS table as DuckDB's dsdgen generates them."""
    con = duckdb.connect()
    load_packaged_extension(con, "tpcds")
    con.execute("CALL dsdgen(sf = ?)", [scale_factor])
    tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
    return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}  # type: ignore[index]


# --- bench queries ---------------------------------------------------------------------------


def test_queries_bench_reports_identical_results_on_fewer_files(tmp_path: Path) -> None:
    _, report = bench(tmp_path, "queries", *SMALL, *QUICK, "--file-size", "64KB")

    assert_schema(report, QUERIES_SCHEMA)
    assert report["benchmark"] == "queries"
    assert report["parameters"]["storage"] == "local"
    assert report["s3_requests"] is None
    # Every table loaded holds exactly the rows dsdgen generated, in one small file per commit.
    generated = generated_row_counts(float(SCALE_FACTOR))
    load = report["load"]
    for table in load["tables"]:
        assert table["rows_loaded"] == table["rows_generated"] == generated[table["table"]]
        assert table["files"] == table["commits"]
    assert load["files"] > 2 * len(load["tables"])
    # The eight default queries, each with the same results before and after.
    assert [q["query"] for q in report["queries"]] == list(DEFAULT_QUERIES)
    assert all(q["identical_results"] for q in report["queries"])
    assert report["totals"]["identical_results"] is True
    assert sum(q["before"]["rows"] for q in report["queries"]) > 0
    for q in report["queries"]:
        assert q["before"]["rows"] == q["after"]["rows"]
        assert q["before"]["files_opened"] > q["after"]["files_opened"] > 0
        assert q["before"]["get_requests"] is None
        assert "store_sales" in q["tables"] or "web_sales" in q["tables"]
    totals = report["totals"]
    assert totals["before_s"] == pytest.approx(
        sum(q["before"]["median_s"] for q in report["queries"]), abs=1e-5
    )
    assert totals["files_opened_before"] > totals["files_opened_after"]
    compaction = report["compaction"]
    assert compaction["input_files"] > compaction["output_files"] > 0
    assert compaction["files_before"] == load["files"] > compaction["files_after"]
    assert compaction["records"] <= load["rows_loaded"]
    out = tmp_path / "report"
    markdown = (out / "report.md").read_text()
    for number in DEFAULT_QUERIES:
        assert f"| {number} |" in markdown
    assert (out / "chart.png").read_bytes().startswith(PNG_MAGIC)


def test_queries_bench_on_local_s3_counts_fewer_gets_after_compaction(tmp_path: Path) -> None:
    _, report = bench(
        tmp_path,
        "queries",
        *SMALL,
        *QUICK,
        "--file-size",
        "256KB",
        "--queries",
        "96,88",
        "--s3",
        "local",
    )

    assert_schema(report, QUERIES_SCHEMA)
    assert report["parameters"]["storage"] == "s3-local"
    s3 = report["s3_requests"]
    assert s3["counted_by"] == "server"
    assert s3["get_before"] > s3["get_after"] > 0
    assert s3["get_before"] == sum(q["before"]["get_requests"] for q in report["queries"])
    for q in report["queries"]:
        assert q["identical_results"]
        assert q["before"]["get_requests"] > q["after"]["get_requests"] > 0
    assert (
        "GET requests (counted at the S3 server" in (tmp_path / "report" / "report.md").read_text()
    )


def test_results_that_differ_after_compaction_fail_naming_the_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction step that changes rows (it appends store_sales again) is caught, per query."""
    compact_tables = query_benchmark.compact_tables

    def compact_then_duplicate(catalog: Catalog, *args: Any) -> list[RunResult]:
        results = compact_tables(catalog, *args)
        table = catalog.load_table(f"{NAMESPACE}.store_sales")
        table.append(table.scan().to_arrow())
        return results

    monkeypatch.setattr(query_benchmark, "compact_tables", compact_then_duplicate)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    out = tmp_path / "report"

    result = CliRunner().invoke(
        app,
        [
            "bench",
            "queries",
            *SMALL,
            *QUICK,
            "--file-size",
            "256KB",
            "--queries",
            "96,76",
            "--out",
            str(out),
        ],
    )

    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: query 76: results differ before and after compaction (see {out / 'report.md'})"
    ], result.stderr
    report = json.loads((out / "report.json").read_text())
    # Query 96 counts rows that do not exist at this scale: doubling them changes nothing.
    assert [q["identical_results"] for q in report["queries"]] == [True, False]


def test_bad_options_are_one_error_line_with_exit_code_2(tmp_path: Path) -> None:
    for args, culprit in (
        (("--queries", "0,3"), "--queries"),
        (("--s3", "remote"), "--s3"),
        (("--target-file-size", "1MB"), "--target-file-size"),
        (("--file-size", "big"), "--file-size"),
    ):
        assert_one_error_line(run_cli(tmp_path, "bench", "queries", *args), 2, culprit)


def test_same_results_ignores_row_order_and_float_noise_only() -> None:
    rows = [(1, "a", 0.1 + 0.2, None), (2, "b", 1.0, 3)]

    assert same_results(rows, list(reversed(rows)))
    assert same_results(rows, [(1, "a", 0.3, None), (2, "b", 1.0, 3)])
    assert not same_results(rows, [(1, "a", 0.3001, None), (2, "b", 1.0, 3)])
    assert not same_results(rows, [(1, "a", 0.3, None), (2, "b", 1.0, 4)])
    assert not same_results(rows, [*rows, rows[0]])
    assert not same_results([(1,), (1,), (2,)], [(1,), (2,), (2,)])


# --- bench rewrite ---------------------------------------------------------------------------


def test_rewrite_bench_reports_compactor_beside_the_pyarrow_floor(tmp_path: Path) -> None:
    """On a CDC table: a fifth of its keys deleted by equality deletes, applied by compactor."""
    _, report = bench(
        tmp_path,
        "rewrite",
        "--scale-factor",
        SCALE_FACTOR,
        "--input-size",
        "3MB",
        "--file-size",
        "64KB",
        "--target-file-size",
        "1MB",
        "--allow-small-target",
        "--equality-deletes",
        "0.2",
    )

    assert_schema(report, REWRITE_SCHEMA)
    source = report["input"]
    assert source["bytes"] >= 3 * 10**6
    assert source["files"] == source["commits"] > 20
    floor, compacted = report["floor"], report["compactor"]
    assert compacted["input_files"] == source["files"]
    deletes = source["equality_deletes"]
    assert deletes["files"] == 10 and deletes["keys"] > 0
    assert compacted["records_written"] + compacted["rows_deleted"] == source["rows"]
    assert 0.1 < compacted["rows_deleted"] / source["rows"] < 0.3
    for phase in (floor, compacted):
        assert 0 < phase["output_files"] < source["files"]
        assert phase["output_bytes"] == sum(phase["output_file_sizes"])
        assert phase["peak_rss_bytes"] >= phase["baseline_rss_bytes"] > 0
        assert phase["mb_per_s"] > 0
    assert report["fraction_of_floor"] == pytest.approx(
        compacted["mb_per_s"] / floor["mb_per_s"], abs=1e-3
    )
    assert "of the floor" in (tmp_path / "report" / "report.md").read_text()


def test_bench_help_explains_every_option(tmp_path: Path) -> None:
    for command, options in (
        (
            "queries",
            (
                "--scale-factor",
                "--file-size",
                "--queries",
                "--warmup",
                "--repetitions",
                "--s3",
                "--s3-endpoint",
                "--out",
                "--json",
            ),
        ),
        (
            "rewrite",
            (
                "--input-size",
                "--file-size",
                "--target-file-size",
                "--equality-deletes",
                "--out",
                "--json",
            ),
        ),
    ):
        result = run_cli(tmp_path, "bench", command, "--help")
        assert result.returncode == 0, result.stderr
        assert "Example: compactor bench " + command in " ".join(result.stdout.split())
        for option in options:
            assert option in result.stdout
