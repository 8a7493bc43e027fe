"""``compactor bench queries``, ``bench rewrite`` and ``bench plan`` at tiny scale, end to end.

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
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from typer.testing import CliRunner

from compactor.bench import query_benchmark
from compactor.bench.phases import TASK_PHASES
from compactor.bench.queries import same_results
from compactor.bench.rewrite import WORKLOADS, rewrite_parameters, split_by_bytes
from compactor.bench.s3_local import RequestCounter
from compactor.bench.tpcds import DEFAULT_QUERIES, NAMESPACE
from compactor.bench.warehouse import CATALOG_FILE, CATALOG_NAME, WAREHOUSE_DIR
from compactor.cli.app import app
from compactor.compaction import RunResult
from compactor.errors import UsageError
from compactor.iceberg.duckdb_views import duckdb_path, load_packaged_extension

from support.cli import assert_one_error_line
from support.cli import compactor as run_cli

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
        "data_bytes_before": int,
        "data_bytes_after": int,
        "tables": [dict],
    },
    "s3_requests": (dict, type(None)),
}
PHASE = {
    "seconds": float,
    "cpu_seconds": float,
    "mb_per_s": float,
    "mb_per_s_per_core": float,
    "files_per_s": float,
    "peak_rss_bytes": int,
    "baseline_rss_bytes": int,
    "input_files": int,
    "input_bytes": int,
    "output_files": int,
    "output_bytes": int,
    "output_file_sizes": list,
}
RATIOS = {
    f"{measure}_vs_{floor}": float
    for measure in ("time", "cpu", "peak_rss")
    for floor in ("floor_1", "floor_2")
}
# compactor's breakdown: stages one after the other, and where their CPU went.
STAGES = ("plan", "rewrite", "commit")
CPU_PARTS = ("plan", *TASK_PHASES, "pyarrow_threads", "rewrite_other", "commit")
REWRITE_SCHEMA = {
    **COMMON,
    "input": {"table": str, "files": int, "bytes": int, "rows": int, "commits": int},
    "floor_1": PHASE,
    "floor_2": {**PHASE, "processes": int, "peak_rss_sum_bytes": int, "parts": [PHASE]},
    "compactor": {
        **PHASE,
        "groups": int,
        "parallelism": int,
        "max_group_size": int,
        "memory_limit": int,
        "records_written": int,
        "rows_deleted": int,
        "breakdown": {
            "seconds": dict.fromkeys(STAGES, float),
            "cpu_seconds": dict.fromkeys(CPU_PARTS, float),
            "cpu_ms_per_file": dict.fromkeys((*CPU_PARTS, "total"), float),
        },
    },
    "ratios": RATIOS,
    "fraction_of_floor": float,
}
PLAN_RUN = {
    "seconds": float,
    "load_table_seconds": float,
    "plan_seconds": float,
    "cpu_seconds": float,
    "peak_rss_bytes": int,
    "baseline_rss_bytes": int,
    "manifests": int,
    "manifests_read": int,
    "data_files_scanned": int,
    "files_planned": int,
    "bytes_planned": int,
    "groups": int,
}
PLAN_SCHEMA = {
    **COMMON,
    "table": {
        "table": str,
        "files": int,
        "bytes": int,
        "rows": int,
        "commits": int,
        "catalog_commits": int,
        "rows_per_file": int,
        "writer_processes": int,
        "seconds": float,
    },
    "plan": PLAN_RUN,
    "runs": [PLAN_RUN],
    "plan_seconds": {"median": float, "min": float, "max": float, "mean": float},
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
    # Bin-packing rewrites the same rows: the data files do not grow.
    assert 0 < compaction["data_bytes_after"] <= compaction["data_bytes_before"] == load["bytes"]
    out = tmp_path / "report"
    markdown = (out / "report.md").read_text()
    assert f"**Data files: {compaction['data_bytes_before'] / 10**6:,.1f} MB before" in markdown
    for number in DEFAULT_QUERIES:
        assert f"| {number} |" in markdown
    assert (out / "chart.png").read_bytes().startswith(PNG_MAGIC)


def test_queries_bench_with_a_sort_strategy_runs_filtered_queries_and_counts_skips(
    tmp_path: Path,
) -> None:
    # Files of 768KB: row groups of 256 KiB written make several of each.
    _, report = bench(
        tmp_path,
        "queries",
        *("--scale-factor", SCALE_FACTOR, "--target-file-size", "768KB", "--allow-small-target"),
        *QUICK,
        *("--file-size", "64KB", "--queries", "96", "--strategy", "sort"),
        *("--row-group-size", "256KiB"),
    )

    assert report["parameters"]["strategy"] == "sort"
    assert report["parameters"]["row_group_size"] == 256 * 1024
    queries = {q["query"]: q for q in report["queries"]}
    assert list(queries) == [96, 901, 902, 903, 904]
    assert all(q["identical_results"] and q["before"]["rows"] for q in queries.values())
    assert "pruning" not in queries[96]
    for number in (901, 903):  # on the date key, which the fact tables are sorted by first
        before, after = queries[number]["pruning"]["before"], queries[number]["pruning"]["after"]
        assert before["files"] > after["files"] > after["files_to_read"] > 0
        assert after["row_groups"] > after["row_groups_to_read"] > 0
        assert after["row_groups"] > 2 * after["files"], "row groups follow --row-group-size"
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "Strategy sort: what min/max statistics let a reader skip" in markdown
    assert "| 901 |" in markdown


def test_queries_bench_that_compacts_nothing_says_so_and_fails(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_cli(
        tmp_path,
        "bench",
        "queries",
        *("--scale-factor", SCALE_FACTOR, *QUICK, "--queries", "96", "--out", str(out)),
    )  # 1 MB files: every table of scale factor 0.01 is a handful of files at most
    assert result.returncode == 1, result.stderr
    assert "error: nothing was compacted: at scale factor 0.01 with --file-size 1MB" in (
        result.stderr
    )
    assert "give a smaller --file-size" in result.stderr
    assert not (out / "report.json").exists()


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
        "--s3-latency",
        "2ms",
    )

    assert_schema(report, QUERIES_SCHEMA)
    assert report["parameters"]["storage"] == "s3-local"
    assert report["parameters"]["s3_latency_ms"] == 2
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
        (("--s3-latency", "30ms"), "--s3-latency"),
        (("--s3", "local", "--s3-latency", "soon"), "--s3-latency"),
        (("--row-group-size", "1KB"), "--row-group-size"),
        (("--row-group-size", "many"), "--row-group-size"),
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
    floor, compacted = report["floor_1"], report["compactor"]
    assert compacted["input_files"] == source["files"]
    deletes = source["equality_deletes"]
    assert deletes["files"] == 10 and deletes["keys"] > 0
    assert compacted["records_written"] + compacted["rows_deleted"] == source["rows"]
    assert 0.1 < compacted["rows_deleted"] / source["rows"] < 0.3
    for phase in (floor, report["floor_2"], compacted):
        assert 0 < phase["output_files"] < source["files"]
        assert phase["output_bytes"] == sum(phase["output_file_sizes"])
        assert phase["peak_rss_bytes"] >= phase["baseline_rss_bytes"] > 0
        assert phase["mb_per_s"] > 0
    assert report["fraction_of_floor"] == pytest.approx(
        compacted["mb_per_s"] / floor["mb_per_s"], abs=1e-3
    )
    # The conversion, rolled back before compactor's phase (which still applied every delete).
    converted = report["conversion"]
    assert converted["equality_delete_files_converted"] == deletes["files"]
    assert converted["rows_matched"] == compacted["rows_deleted"]
    assert converted["data_files_read"] == source["files"]
    assert 0 < converted["bytes_read"] == converted["key_bytes_read"] < compacted["input_bytes"]
    assert converted["peak_rss_bytes"] >= converted["baseline_rss_bytes"] > 0
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "the 1-process floor's time" in markdown
    assert "convert (key columns only)" in markdown


def test_rewrite_workload_presets_expand_and_explicit_flags_override_them() -> None:
    large = rewrite_parameters(workload="large")
    assert (large.scale_factor, large.files, large.commits) == (3.0, 3_000, 3_000)
    assert (large.target_file_size, large.input_size, large.file_size) == ("512MB", None, None)
    tiny = rewrite_parameters(workload="tiny")
    assert (tiny.scale_factor, tiny.files, tiny.commits) == (0.3, 10_000, 200)
    assert tiny.target_file_size == "512MB" and tiny.workload == "tiny"
    assert set(WORKLOADS) == {"large", "tiny"}
    # Flags win over the preset; --files alone keeps its files per commit.
    small = rewrite_parameters(
        workload="tiny",
        scale_factor=0.01,
        files=120,
        target_file_size="4MB",
        allow_small_target=True,
        parallelism=3,
        max_group_size="8MB",
        memory_limit="1GiB",
    )
    assert (small.scale_factor, small.files, small.commits) == (0.01, 120, 3)
    assert (small.target_file_size, small.parallelism, small.max_group_size) == ("4MB", 3, "8MB")
    assert small.memory_limit == "1GiB"
    assert rewrite_parameters(workload="large", files=40).commits == 40
    assert rewrite_parameters(workload="large", files=40, commits=4).commits == 4
    # Without a workload: by size, as before; or --files alone, one file per commit.
    default = rewrite_parameters()
    assert (default.scale_factor, default.input_size, default.file_size) == (1.0, 10**9, 10**6)
    assert (default.files, default.commits, default.target_file_size) == (None, None, "512MB")
    assert (rewrite_parameters(files=30).files, rewrite_parameters(files=30).commits) == (30, 30)
    for wrong, culprit in (
        ({"workload": "huge"}, "--workload"),
        ({"workload": "tiny", "input_size": "1GB"}, "--input-size"),
        ({"files": 10, "file_size": "1MB"}, "--file-size"),
        ({"files": 10, "commits": 20}, "commits"),
        ({"workload": "large", "parallelism": 0}, "parallelism"),
        ({"workload": "large", "max_group_size": "100MB"}, "max_group_size"),
        ({"workload": "large", "memory_limit": "100MiB"}, "memory_limit"),
    ):
        with pytest.raises(UsageError, match=culprit):
            rewrite_parameters(**wrong)  # type: ignore[arg-type]


def test_the_two_process_floor_splits_the_files_in_consecutive_halves_by_bytes() -> None:
    files = [("a", 10), ("b", 10), ("c", 50), ("d", 10), ("e", 20)]

    assert split_by_bytes(files, 2) == [files[:3], files[3:]]
    assert split_by_bytes([("a", 1), ("b", 100)], 2) == [[("a", 1)], [("b", 100)]]
    assert split_by_bytes([("a", 5)], 2) == [[("a", 5)]]


def test_rewrite_bench_workload_reports_both_floors_and_compactor_against_each(
    tmp_path: Path,
) -> None:
    _, report = bench(
        tmp_path,
        "rewrite",
        "--workload",
        "tiny",
        "--scale-factor",
        SCALE_FACTOR,
        "--files",
        "40",
        "--commits",
        "4",
        "--target-file-size",
        "1MB",
        "--allow-small-target",
        "--parallelism",
        "1",
        "--memory-limit",
        "320MiB",
    )

    assert_schema(report, REWRITE_SCHEMA)
    assert report["compactor"]["memory_limit"] == 320 * 2**20
    parameters = report["parameters"]
    assert (parameters["workload"], parameters["files"], parameters["commits"]) == ("tiny", 40, 4)
    assert parameters["input_size"] is None and parameters["parallelism"] == 1
    source = report["input"]
    assert (source["files"], source["commits"]) == (40, 4)
    assert source["rows"] == source["rows_generated"] > 40
    floor_1, floor_2, compacted = report["floor_1"], report["floor_2"], report["compactor"]
    for phase in (floor_1, floor_2, compacted):
        assert phase["input_files"] == 40
        assert phase["input_bytes"] == source["bytes"]
        # seconds are rounded to the millisecond, files_per_s to a tenth: consistent within that
        low, high = phase["seconds"] - 0.0005, phase["seconds"] + 0.0005
        assert 40 / high - 0.05 <= phase["files_per_s"] <= 40 / low + 0.05
    # Two processes at once, each on a half of the files: the pair's wall time, their CPU.
    halves = floor_2["parts"]
    assert floor_2["processes"] == len(halves) == 2
    assert [h["input_files"] for h in halves] == [20, 20]
    assert floor_2["seconds"] >= max(h["seconds"] for h in halves)
    assert floor_2["cpu_seconds"] == pytest.approx(sum(h["cpu_seconds"] for h in halves))
    assert floor_2["peak_rss_bytes"] == max(h["peak_rss_bytes"] for h in halves)
    assert floor_2["output_bytes"] == sum(h["output_bytes"] for h in halves)
    assert compacted["parallelism"] == 1 and compacted["groups"] == 1
    assert compacted["records_written"] == source["rows"]
    # Where compactor's time went: stages in turn, CPU parts within the phase's CPU.
    parts = compacted["breakdown"]
    assert sum(parts["seconds"].values()) == pytest.approx(compacted["seconds"], abs=0.003)
    cpu = parts["cpu_seconds"]
    assert all(cpu[part] > 0 for part in ("plan", "open_footer", "decode", "write", "commit"))
    assert cpu["read_each"] == 0  # every file read in bulk
    measured = sum(value for part, value in cpu.items() if part != "rewrite_other")
    assert measured <= compacted["cpu_seconds"] + 0.01
    assert parts["cpu_ms_per_file"]["decode"] == pytest.approx(cpu["decode"] * 1000 / 40, abs=0.02)
    ratios = report["ratios"]
    assert ratios["time_vs_floor_1"] == pytest.approx(
        compacted["seconds"] / floor_1["seconds"], abs=1e-3
    )
    assert ratios["time_vs_floor_2"] == pytest.approx(
        compacted["seconds"] / floor_2["seconds"], abs=1e-3
    )
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert f"{ratios['time_vs_floor_1']:.2f}x the 1-process floor's time" in markdown
    for row in ("| raw pyarrow, 1 process |", "| raw pyarrow, 2 processes |", "| compactor"):
        assert row in markdown
    assert "| read: open, footer |" in markdown


def test_bad_rewrite_options_are_one_error_line_with_exit_code_2(tmp_path: Path) -> None:
    for args, culprit in (
        (("--workload", "tiny", "--file-size", "1MB"), "--file-size"),
        (("--parallelism", "0"), "--parallelism"),
    ):
        assert_one_error_line(run_cli(tmp_path, "bench", "rewrite", *args), 2, culprit)


def test_a_rewrite_bench_where_compactor_finds_nothing_to_rewrite_is_an_error(
    tmp_path: Path,
) -> None:
    """Three files are fewer than a group needs: one error line before any phase runs, no
    report with a 0x ratio."""
    out = tmp_path / "report"
    result = run_cli(
        tmp_path,
        "bench",
        "rewrite",
        *SMALL,
        "--files",
        "3",
        "--commits",
        "3",
        "--out",
        str(out),
    )

    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0])
    assert "tpcds.store_sales" in errors[0] and "nothing to rewrite in its 3 files" in errors[0]
    assert "--files" in errors[0]
    assert "floor" not in result.stderr  # refused after loading, before the phases
    assert not (out / "report.json").exists()


# --- bench plan ------------------------------------------------------------------------------


def test_plan_bench_plans_every_file_it_loaded(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    _, report = bench(
        tmp_path,
        "plan",
        "--files",
        "200",
        "--commits",
        "20",
        "--repetitions",
        "2",
        "--workdir",
        str(workdir),
    )

    assert_schema(report, PLAN_SCHEMA)
    table = report["table"]
    assert (table["files"], table["commits"], table["rows"]) == (200, 20, 200 * 10)
    assert len(report["runs"]) == 2
    for run in report["runs"]:
        assert run["files_planned"] == run["data_files_scanned"] == 200
        assert run["manifests_read"] == run["manifests"] == 20
        assert run["bytes_planned"] == table["bytes"]
        assert run["plan_seconds"] > 0 and run["peak_rss_bytes"] > 0
    assert report["plan"]["plan_seconds"] == report["plan_seconds"]["median"]
    assert "**Planning 200 files from 20 manifests" in (tmp_path / "report/report.md").read_text()
    # Every file is a real Parquet file of its own, with the table's field ids.
    catalog = SqlCatalog(
        CATALOG_NAME,
        uri=f"sqlite:///{workdir / CATALOG_FILE}",
        warehouse=(workdir / WAREHOUSE_DIR).as_uri(),
    )
    iceberg_table = catalog.load_table(f"{NAMESPACE}.store_sales")
    assert len(iceberg_table.metadata.snapshots) == 20
    tasks = list(iceberg_table.scan().plan_files())
    paths = {duckdb_path(t.file.file_path) for t in tasks}
    assert len(paths) == 200
    field_ids = {f.field_id for f in iceberg_table.schema().fields}
    for path in sorted(paths)[:: 200 // 5]:
        schema = pq.read_schema(path)
        assert {int(f.metadata[b"PARQUET:field_id"]) for f in schema} == field_ids
    assert iceberg_table.scan().to_arrow().num_rows == 200 * 10


def test_bad_plan_options_are_one_error_line_with_exit_code_2(tmp_path: Path) -> None:
    for args, culprit in (
        (("--files", "10", "--commits", "20"), "--commits"),
        (("--target-file-size", "1MB"), "--target-file-size"),
    ):
        assert_one_error_line(run_cli(tmp_path, "bench", "plan", *args), 2, culprit)


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
                "--row-group-size",
                "--out",
                "--json",
            ),
        ),
        (
            "rewrite",
            (
                "--workload",
                "--input-size",
                "--file-size",
                "--files",
                "--commits",
                "--target-file-size",
                "--parallelism",
                "--max-group-size",
                "--equality-deletes",
                "--out",
                "--json",
            ),
        ),
        (
            "plan",
            (
                "--files",
                "--commits",
                "--rows-per-file",
                "--repetitions",
                "--target-file-size",
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


def test_the_local_s3_server_answers_each_request_after_its_latency() -> None:
    slept: list[float] = []
    answered: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        answered.append(environ["REQUEST_METHOD"])
        return [b""]

    counter = RequestCounter(app, latency_s=0.03, sleep=slept.append)
    for method in ("GET", "GET", "HEAD"):
        counter({"REQUEST_METHOD": method}, None)

    assert slept == [0.03] * 3 and answered == ["GET", "GET", "HEAD"]
    assert (counter.count("GET"), counter.count("HEAD")) == (2, 1)
