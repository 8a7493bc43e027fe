"""``compactor bench manifests``: what rewriting manifests buys a table of many one-file commits.

The table is TPC-DS ``store_sales`` written as ``bench plan`` writes it
(:func:`~compactor.bench.planning.build_table`): ``--commits`` fast appends of one real Parquet
file each, one manifest per commit. Then, each in a fresh process: pyiceberg's scan planning
(``table.scan().plan_files()``) and DuckDB's (``iceberg_scan`` of the same metadata file),
``--repetitions`` times each; ``compactor.rewrite_manifests(table)`` once; both scan plannings
again. The report has the manifests before and after, the rewrite's time, and the median
planning times before and after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from compactor.bench.phases import (
    BenchTable,
    PhaseUsage,
    in_fresh_process,
    manifests_phase,
    scan_phase,
)
from compactor.bench.planning import TABLE, PlanParameters, build_table
from compactor.bench.progress import Steps
from compactor.bench.tpcds import NAMESPACE
from compactor.bench.warehouse import CATALOG_NAME, Warehouse
from compactor.errors import UsageError

IDENTIFIER = f"{NAMESPACE}.{TABLE}"
# DuckDB's iceberg extension reads manifests with its avro extension, which must be loaded first
# (it would otherwise try to download it).
ICEBERG_EXTENSIONS = ("avro", "iceberg")


@dataclass(frozen=True)
class ManifestParameters:
    """What ``bench manifests`` was asked to do."""

    commits: int
    rows_per_file: int
    scale_factor: float
    repetitions: int

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def manifest_parameters(
    *, commits: int, rows_per_file: int, scale_factor: float, repetitions: int
) -> ManifestParameters:
    """Checked ``bench manifests`` options."""
    if commits < 2:
        raise UsageError(f"--commits {commits}: must be at least 2", "commits")
    if rows_per_file < 1 or repetitions < 1:
        raise UsageError("--rows-per-file and --repetitions must be 1 or more")
    if scale_factor <= 0:
        raise UsageError(f"--scale-factor: must be above 0, got {scale_factor}")
    return ManifestParameters(commits, rows_per_file, scale_factor, repetitions)


def iceberg_duckdb() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB with the iceberg extension, loaded from its PyPI package."""
    from compactor.iceberg.duckdb_views import load_packaged_extension

    con = duckdb.connect()
    for name in ICEBERG_EXTENSIONS:
        load_packaged_extension(con, name)
    return con


def _duckdb_query(query: str, metadata_file: str) -> tuple[float, list[Any], set[str]]:
    """Run ``query`` (``?`` is ``metadata_file``) in a new DuckDB with the iceberg extension and
    its file-system log on: seconds, result rows, paths opened."""
    con = iceberg_duckdb()
    try:
        con.execute("CALL enable_logging('FileSystem')")
        started = time.perf_counter()
        rows = con.execute(query, [metadata_file]).fetchall()
        seconds = time.perf_counter() - started
        opened = con.execute(
            "SELECT DISTINCT path FROM duckdb_logs_parsed('FileSystem') WHERE op = 'OPEN'"
        ).fetchall()
    finally:
        con.close()
    return seconds, rows, {path for (path,) in opened}


def duckdb_scan_phase(metadata_location: str) -> dict[str, Any]:
    """Plan a full scan of the snapshot of ``metadata_location`` with DuckDB; the measures.

    ``EXPLAIN SELECT *`` through ``iceberg_scan`` reads the metadata file, the manifest list and
    every manifest, and no data file; ``SELECT count(*)`` is answered from the manifests'
    record counts. Each runs in a database of its own, so neither reuses the other's reads.
    """
    from compactor.iceberg.duckdb_views import duckdb_path

    usage = PhaseUsage()
    metadata_file = duckdb_path(metadata_location)
    explain, _, explain_opened = _duckdb_query(
        "EXPLAIN SELECT * FROM iceberg_scan(?)", metadata_file
    )
    counted, [(rows,)], count_opened = _duckdb_query(
        "SELECT count(*) FROM iceberg_scan(?)", metadata_file
    )
    opened = explain_opened | count_opened
    return {
        "explain_seconds": round(explain, 3),
        "count_seconds": round(counted, 3),
        **usage.resources(),
        "files_opened": len(opened),
        "data_files_opened": sum(path.endswith(".parquet") for path in opened),
        "rows": rows,
    }


def _median(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def run_manifest_benchmark(
    parameters: ManifestParameters, warehouse: Warehouse, workdir: Path, steps: Steps
) -> dict[str, Any]:
    """Build the table, plan scans, rewrite its manifests, plan scans again: the report's body."""
    iceberg_duckdb().close()  # a missing extension fails now, not after the build
    built = build_table(
        PlanParameters(
            files=parameters.commits,
            commits=parameters.commits,
            rows_per_file=parameters.rows_per_file,
            scale_factor=parameters.scale_factor,
            repetitions=parameters.repetitions,
            target_file_size="512MB",
            allow_small_target=False,
        ),
        warehouse,
        workdir,
        steps,
    )
    steps.note(
        f"built {built['table']}: {built['files']:,} files in {built['commits']:,} commits "
        f"({built['seconds']:.1f}s)"
    )
    bench_table = BenchTable(CATALOG_NAME, warehouse.catalog_properties, IDENTIFIER)

    def scans(when: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """pyiceberg's runs and DuckDB's, of the table's current snapshot."""
        metadata_location = bench_table.load().metadata_location
        pyiceberg_runs, duckdb_runs = [], []
        for run in range(parameters.repetitions):
            of = f"{when}, run {run + 1} of {parameters.repetitions}"
            with steps.step(f"pyiceberg scan planning {of}"):
                pyiceberg_runs.append(in_fresh_process(scan_phase, bench_table))
            with steps.step(f"DuckDB iceberg_scan planning {of}"):
                duckdb_runs.append(in_fresh_process(duckdb_scan_phase, metadata_location))
        return pyiceberg_runs, duckdb_runs

    before, duckdb_before = scans("before")
    with steps.step("rewriting manifests (fresh process)"):
        rewrite = in_fresh_process(manifests_phase, bench_table)
    after, duckdb_after = scans("after")
    medians = {
        "scan_before": _median(before, "plan_files_seconds"),
        "scan_after": _median(after, "plan_files_seconds"),
        "duckdb_scan_before": _median(duckdb_before, "explain_seconds"),
        "duckdb_scan_after": _median(duckdb_after, "explain_seconds"),
    }
    steps.note(
        f"{rewrite['manifests_replaced']:,} manifests into {rewrite['manifests_written']:,} in "
        f"{rewrite['seconds']:.2f}s; plan_files {medians['scan_before']['plan_files_seconds']:.2f}s"
        f" -> {medians['scan_after']['plan_files_seconds']:.2f}s; DuckDB EXPLAIN "
        f"{medians['duckdb_scan_before']['explain_seconds']:.2f}s -> "
        f"{medians['duckdb_scan_after']['explain_seconds']:.2f}s"
    )
    return {
        "table": built,
        "rewrite": rewrite,
        **medians,
        "runs_before": before,
        "runs_after": after,
        "duckdb_runs_before": duckdb_before,
        "duckdb_runs_after": duckdb_after,
    }
