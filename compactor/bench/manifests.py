"""``compactor bench manifests``: what rewriting manifests buys a table of many one-file commits.

The table is TPC-DS ``store_sales`` written as ``bench plan`` writes it
(:func:`~compactor.bench.planning.build_table`): ``--commits`` fast appends of one real Parquet
file each, one manifest per commit. Then, each in a fresh process: pyiceberg's scan planning
(``table.scan().plan_files()``), ``--repetitions`` times; ``compactor.rewrite_manifests(table)``
once; scan planning again, ``--repetitions`` times. The report has the manifests before and
after, the rewrite's time, and the median planning time before and after.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compactor.bench.planning import TABLE, PlanParameters, build_table
from compactor.bench.progress import Steps
from compactor.bench.rewrite import PhaseUsage, in_fresh_process
from compactor.bench.tpcds import NAMESPACE
from compactor.bench.warehouse import Warehouse
from compactor.errors import UsageError

IDENTIFIER = f"{NAMESPACE}.{TABLE}"


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


def _load(catalog_properties: dict[str, str]) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    from compactor.bench.warehouse import CATALOG_NAME
    from compactor.iceberg import pyiceberg_compat

    pyiceberg_compat.install()
    return SqlCatalog(CATALOG_NAME, **catalog_properties).load_table(IDENTIFIER)


def scan_phase(catalog_properties: dict[str, str]) -> dict[str, Any]:
    """Load the table, then plan a full scan with pyiceberg; the measures."""
    from compactor.planning.manifest_groups import manifest_stats

    usage = PhaseUsage()
    table = _load(catalog_properties)
    loaded = usage.elapsed()
    tasks = list(table.scan().plan_files())
    total = usage.elapsed()
    return {
        "load_table_seconds": round(loaded, 3),
        "plan_files_seconds": round(total - loaded, 3),
        **usage.resources(),
        "manifests": manifest_stats(table).total,
        "files": len(tasks),
    }


def rewrite_phase(catalog_properties: dict[str, str]) -> dict[str, Any]:
    """Load the table, then rewrite its manifests; the measures and the result."""
    import compactor

    usage = PhaseUsage()
    table = _load(catalog_properties)
    loaded = usage.elapsed()
    result = compactor.rewrite_manifests(table)
    total = usage.elapsed()
    document = result.to_dict()
    return {
        "seconds": round(total - loaded, 3),
        **usage.resources(),
        **{
            key: document[key]
            for key in (
                "manifests_before",
                "manifests_after",
                "entries",
                "manifests_replaced",
                "manifests_written",
                "bytes_replaced",
                "bytes_written",
                "snapshot_id",
            )
        },
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r["plan_files_seconds"])
    return ordered[(len(ordered) - 1) // 2]


def run_manifest_benchmark(
    parameters: ManifestParameters, warehouse: Warehouse, workdir: Path, steps: Steps
) -> dict[str, Any]:
    """Build the table, plan scans, rewrite its manifests, plan scans again: the report's body."""
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
    properties = warehouse.catalog_properties

    def scans(when: str) -> list[dict[str, Any]]:
        runs = []
        for run in range(parameters.repetitions):
            with steps.step(f"scan planning {when}, run {run + 1} of {parameters.repetitions}"):
                runs.append(in_fresh_process(scan_phase, properties))
        return runs

    before = scans("before")
    with steps.step("rewriting manifests (fresh process)"):
        rewrite = in_fresh_process(rewrite_phase, properties)
    after = scans("after")
    steps.note(
        f"{rewrite['manifests_replaced']:,} manifests into {rewrite['manifests_written']:,} in "
        f"{rewrite['seconds']:.2f}s; plan_files {_median(before)['plan_files_seconds']:.2f}s "
        f"-> {_median(after)['plan_files_seconds']:.2f}s"
    )
    return {
        "table": built,
        "rewrite": rewrite,
        "scan_before": _median(before),
        "scan_after": _median(after),
        "runs_before": before,
        "runs_after": after,
    }
