"""``compactor bench rewrite``: compaction throughput against a raw pyarrow floor.

The input is TPC-DS ``store_sales``, loaded in one of two ways:

- by size (the default): ~``--file-size`` files, one per commit, its rows appended over and
  over until the table holds ``--input-size`` bytes;
- by count (``--workload`` or ``--files``): the generated rows once, cut into ``--files`` files
  of equal rows in ``--commits`` commits (:func:`compactor.bench.tpcds.load_table_in_files`).

Three phases then read the same files, one after the other, each in fresh processes so that
peak RSS is the phase's own:

- **floor, 1 process** (``floor_1``): plain pyarrow, no Iceberg. ``pyarrow.dataset`` reads the
  files (threaded) and one ``ParquetWriter`` writes them into files rolling at the target size,
  with the table's compression settings and row groups of at most
  ``write.parquet.row-group-size-bytes`` of rows in memory (a plain writer cannot count
  written bytes);
- **floor, 2 processes** (``floor_2``): the same, the files split in two halves of about equal
  bytes (consecutive in snapshot order), each half in its own process, both at once: its time
  is the pair's wall time, its CPU the sum, its peak RSS the larger of the two;
- **compactor**: ``compact()`` on the table, as ``compactor run`` would (plan, rewrite tasks on
  the default executor through the Iceberg read path, commit), with ``--parallelism`` and
  ``--max-group-size`` when given.

With ``--imported`` the loaded files are written again without field ids and registered as
``add_files`` registers them, in a table of the same name (:mod:`compactor.bench.imported_table`):
every phase reads the same rows, compactor through the table's name mapping.

With ``--equality-deletes F`` a fraction F of store_sales' keys (``ss_item_sk``,
``ss_ticket_number``; every copy of each) is deleted by equality deletes committed after the
data, as a CDC source leaves them: compactor applies them while rewriting (the floor does not).
Before compactor's phase, a **conversion** phase (fresh process) converts them into position
deletes as ``compactor rewrite-deletes`` does, reading only key columns; the table is then put
back on its snapshot before the conversion, so both remedies start from the same table.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from compactor.bench.imported_table import import_without_field_ids
from compactor.bench.phases import (
    BenchTable,
    compactor_phase,
    conversion_phase,
    floor_phase,
    in_fresh_process,
    in_fresh_processes,
    rates,
)
from compactor.bench.progress import Steps
from compactor.bench.tpcds import (
    GENERATOR_FILE,
    NAMESPACE,
    LoadedTable,
    generate,
    load_table,
    load_table_in_files,
)
from compactor.bench.warehouse import CATALOG_NAME, Warehouse
from compactor.errors import UsageError
from compactor.iceberg.delete_files import commit_delete_files, write_equality_delete_file
from compactor.iceberg.duckdb_views import duckdb_path
from compactor.iceberg.pyiceberg_compat import parquet_writer_kwargs
from compactor.options import RewriteOptions, resolve_options
from compactor.options.defaults import DEFAULT_MIN_INPUT_FILES, MIN_FILE_SIZE_RATIO
from compactor.rewrite.parquet_output import row_group_target
from compactor.sizes import parse_size

MB = 10**6
TABLE = "store_sales"
# store_sales' key, and how many commits --equality-deletes spreads its deletes over.
DELETE_KEY = ("ss_item_sk", "ss_ticket_number")
DELETE_COMMITS = 10


DEFAULT_SCALE_FACTOR = 1.0
DEFAULT_INPUT_SIZE = "1GB"
DEFAULT_FILE_SIZE = "1MB"
DEFAULT_TARGET = "512MB"
# The 2-process floor: how many processes, each reading its share of the files.
FLOOR_PROCESSES = 2


@dataclass(frozen=True)
class Workload:
    """A named input shape: store_sales at a scale factor, once, as files x commits."""

    description: str
    scale_factor: float
    files: int
    commits: int
    target_file_size: str = DEFAULT_TARGET

    @property
    def files_per_commit(self) -> float:
        return self.files / self.commits


WORKLOADS = {
    "large": Workload(
        "TPC-DS store_sales at scale factor 3, unpartitioned, in ~3,000 files, one per commit",
        scale_factor=3.0,
        files=3_000,
        commits=3_000,
    ),
    "tiny": Workload(
        "store_sales at scale factor 0.3 in 10,000 files of ~12 KB, 50 per commit over 200 commits",
        scale_factor=0.3,
        files=10_000,
        commits=200,
    ),
}


@dataclass(frozen=True)
class RewriteParameters:
    """What ``bench rewrite`` was asked to do (see :func:`rewrite_parameters`).

    ``files`` set: the generated rows are loaded once as ``files`` files in ``commits`` commits
    (``input_size`` and ``file_size`` are None); otherwise by size, as before.
    """

    scale_factor: float
    input_size: int | None
    file_size: int | None
    target_file_size: str
    allow_small_target: bool
    equality_deletes: float = 0.0
    workload: str | None = None
    files: int | None = None
    commits: int | None = None
    parallelism: int | None = None
    max_group_size: str | None = None
    memory_limit: str | None = None
    imported: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def rewrite_parameters(
    *,
    workload: str | None = None,
    scale_factor: float | None = None,
    input_size: str | None = None,
    file_size: str | None = None,
    files: int | None = None,
    commits: int | None = None,
    target_file_size: str | None = None,
    allow_small_target: bool = False,
    equality_deletes: float = 0.0,
    parallelism: int | None = None,
    max_group_size: str | None = None,
    memory_limit: str | None = None,
    imported: bool = False,
) -> RewriteParameters:
    """``bench rewrite``'s options, a workload's preset filled in under the ones given.

    A workload sets the scale factor, files, commits and target; ``--scale-factor``,
    ``--files``, ``--commits`` and ``--target-file-size`` override them (``--files`` alone
    keeps the workload's files per commit). ``--input-size`` and ``--file-size`` describe the
    by-size load and are refused with a workload or ``--files``.
    """
    preset = None
    if workload is not None:
        preset = WORKLOADS.get(workload)
        if preset is None:
            raise UsageError(
                f"--workload {workload!r}: must be one of {', '.join(WORKLOADS)}", "workload"
            )
    by_count = preset is not None or files is not None or commits is not None
    if by_count and (input_size is not None or file_size is not None):
        given = " and ".join(
            f for f, v in (("--input-size", input_size), ("--file-size", file_size)) if v
        )
        reason = f"--workload {workload}" if preset else "--files/--commits"
        raise UsageError(
            f"{given}: not with {reason}, which loads the generated rows once as --files files "
            "in --commits commits"
        )
    if by_count:
        if files is None:
            files = preset.files if preset else commits
        if commits is None:
            per_commit = preset.files_per_commit if preset else 1.0
            commits = max(1, math.ceil(files / per_commit)) if files else 0
        if not files or files < 1 or not 1 <= commits <= files:
            raise UsageError(
                f"--files {files} --commits {commits}: need 1 <= commits <= files",
                "files",
                "commits",
            )
    if scale_factor is None:
        scale_factor = preset.scale_factor if preset else DEFAULT_SCALE_FACTOR
    if scale_factor <= 0:
        raise UsageError(f"--scale-factor: must be above 0, got {scale_factor}", "scale_factor")
    if target_file_size is None:
        target_file_size = preset.target_file_size if preset else DEFAULT_TARGET
    size = input_bytes = None
    if not by_count:
        input_bytes = parse_size(input_size or DEFAULT_INPUT_SIZE, "--input-size")
        size = parse_size(file_size or DEFAULT_FILE_SIZE, "--file-size")
        if input_bytes <= 0 or size <= 0:
            raise UsageError("--input-size and --file-size must be above 0")
    if not 0 <= equality_deletes < 1:
        raise UsageError(
            f"--equality-deletes {equality_deletes}: must be in [0, 1)", "equality_deletes"
        )
    # Checks the target, --max-group-size, --parallelism and --memory-limit as compactor run
    # would.
    resolve_options(
        "tpcds",
        {},
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
        max_group_size=max_group_size,
        parallelism=parallelism,
        memory_limit=memory_limit,
    )
    return RewriteParameters(
        scale_factor=scale_factor,
        input_size=input_bytes,
        file_size=size,
        target_file_size=target_file_size,
        allow_small_target=allow_small_target,
        equality_deletes=equality_deletes,
        workload=workload,
        files=files,
        commits=commits,
        parallelism=parallelism,
        max_group_size=max_group_size,
        memory_limit=memory_limit,
        imported=imported,
    )


def _refuse_nothing_to_rewrite(
    table: Table, options: RewriteOptions, files: int, size: int
) -> None:
    """A usage error, before any phase runs, if compactor would plan no group for ``table``."""
    from compactor.api import plan

    if not plan(table, options).groups:
        raise UsageError(
            f"table {NAMESPACE}.{TABLE}: compactor finds nothing to rewrite in its {files:,} "
            f"files ({size / MB:.1f} MB): a group needs {DEFAULT_MIN_INPUT_FILES} files under "
            f"{MIN_FILE_SIZE_RATIO:.0%} of the target, or a target's worth; load more files "
            "(--files) or set a larger --target-file-size"
        )


def add_equality_deletes(
    generator: duckdb.DuckDBPyConnection,
    table: Table,
    fraction: float,
    commits: int = DELETE_COMMITS,
) -> dict[str, Any]:
    """Delete ``fraction`` of store_sales' keys (every copy) with equality deletes, as a CDC
    source would: ``commits`` commits of one delete file each, all newer than the data."""
    percent = round(fraction * 100, 6)
    keys = generator.execute(
        f"SELECT DISTINCT {', '.join(DELETE_KEY)} FROM {TABLE} "
        f"USING SAMPLE {percent} PERCENT (bernoulli, 42)"
    ).fetch_arrow_table()
    if keys.num_rows == 0:
        return {"keys": 0, "files": 0, "fraction": fraction}
    spec = table.spec()
    if spec.fields:
        raise UsageError(f"table {NAMESPACE}.{TABLE}: equality deletes need it unpartitioned")
    per_file = -(-keys.num_rows // commits)
    files = 0
    for start in range(0, keys.num_rows, per_file):
        delete_file = write_equality_delete_file(
            table, keys.slice(start, per_file), spec_id=spec.spec_id, partition=Record()
        )
        table = commit_delete_files(table, [delete_file])
        files += 1
    return {"keys": keys.num_rows, "files": files, "fraction": fraction}


def split_by_bytes(files: Sequence[tuple[str, int]], parts: int) -> list[list[tuple[str, int]]]:
    """``files`` (path, size), in order, cut into up to ``parts`` consecutive runs of about
    equal bytes: each file goes to the part its middle byte falls in (for two parts, neither
    is empty when there are two files or more)."""
    total = sum(size for _, size in files) or 1
    cut: list[list[tuple[str, int]]] = [[] for _ in range(parts)]
    before = 0
    for path, size in files:
        cut[min(parts - 1, int((before + size / 2) * parts / total))].append((path, size))
        before += size
    return [c for c in cut if c]


def _combine(halves: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase of several processes run at once: wall time from the first start to the last
    end, CPU summed, the largest peak RSS (and their sum), outputs together."""
    seconds = max(h["finished_at"] for h in halves) - min(h["started_at"] for h in halves)
    input_bytes = sum(h["input_bytes"] for h in halves)
    input_files = sum(h["input_files"] for h in halves)
    sizes = sorted(size for h in halves for size in h["output_file_sizes"])
    return {
        **rates(seconds, input_bytes, input_files),
        "cpu_seconds": round(sum(h["cpu_seconds"] for h in halves), 3),
        "peak_rss_bytes": max(h["peak_rss_bytes"] for h in halves),
        "peak_rss_sum_bytes": sum(h["peak_rss_bytes"] for h in halves),
        "baseline_rss_bytes": max(h["baseline_rss_bytes"] for h in halves),
        "input_files": input_files,
        "input_bytes": input_bytes,
        "output_files": len(sizes),
        "output_bytes": sum(sizes),
        "output_file_sizes": sizes,
        "processes": len(halves),
        "parts": [_without_clock(h) for h in halves],
    }


def _without_clock(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("started_at", "finished_at")}


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def ratios(
    compacted: dict[str, Any], floor_1: dict[str, Any], floor_2: dict[str, Any]
) -> dict[str, float | None]:
    """compactor's time, CPU and peak RSS as multiples of each floor's (1.29 = 29% longer)."""
    return {
        f"{measure}_vs_{name}": _ratio(compacted[key], floor[key])
        for name, floor in (("floor_1", floor_1), ("floor_2", floor_2))
        for measure, key in (
            ("time", "seconds"),
            ("cpu", "cpu_seconds"),
            ("peak_rss", "peak_rss_bytes"),
        )
    }


def _data_files(table: Table) -> list[tuple[str, int]]:
    """The current snapshot's data files (path a local reader opens, size), in scan order."""
    return [
        (duckdb_path(task.file.file_path), task.file.file_size_in_bytes)
        for task in table.scan().plan_files()
    ]


def _load(
    parameters: RewriteParameters,
    generator: duckdb.DuckDBPyConnection,
    warehouse: Warehouse,
    steps: Steps,
) -> tuple[Table, LoadedTable]:
    catalog = warehouse.catalog()
    if parameters.files is not None:
        assert parameters.commits is not None
        description = (
            f"loading {TABLE} as {parameters.files:,} files in {parameters.commits:,} commits"
        )
        with steps.step(description, total=parameters.commits) as advance:
            return load_table_in_files(
                generator,
                catalog,
                TABLE,
                parameters.files,
                parameters.commits,
                on_commit=lambda _, __: advance(1),
            )
    assert parameters.file_size is not None
    with steps.step(f"loading {TABLE}", total=parameters.input_size) as advance:
        return load_table(
            generator,
            catalog,
            TABLE,
            parameters.file_size,
            until_bytes=parameters.input_size,
            on_commit=lambda _, size: advance(size),
        )


def _roll_back(warehouse: Warehouse, table: Table) -> None:
    """Put ``table``'s main branch back on its snapshot before the conversion."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    current = warehouse.catalog().load_table(f"{NAMESPACE}.{TABLE}")
    current.manage_snapshots().set_current_snapshot(snapshot.snapshot_id).commit()


def run_rewrite_benchmark(
    parameters: RewriteParameters, warehouse: Warehouse, workdir: Path, steps: Steps
) -> dict[str, Any]:
    """Build the input table, measure the floor in 1 and 2 processes, then compactor; returns
    the report's body."""
    with steps.step(f"generating TPC-DS at scale factor {parameters.scale_factor} (dsdgen)"):
        generator = generate(workdir / GENERATOR_FILE, parameters.scale_factor)
    try:
        table, loaded = _load(parameters, generator, warehouse, steps)
        steps.note(
            f"loaded {TABLE}: {loaded.files:,} files, {loaded.bytes / MB:.1f} MB in "
            f"{loaded.commits:,} commits ({loaded.seconds:.1f}s)"
        )
        imported: dict[str, Any] = {}
        if parameters.imported:
            description = f"writing {loaded.files:,} files again without field ids, adding them"
            with steps.step(description, total=loaded.commits) as advance:
                table, imported = import_without_field_ids(
                    warehouse.catalog(), table, loaded.commits, lambda _: advance(1)
                )
            steps.note(f"imported {imported['files']:,} files ({imported['seconds']:.1f}s)")
        floor_inputs = _data_files(table)  # the data files, before any delete
        deletes: dict[str, Any] = {}
        if parameters.equality_deletes > 0:
            with steps.step(f"equality deletes on {', '.join(DELETE_KEY)}"):
                deletes = add_equality_deletes(generator, table, parameters.equality_deletes)
            table = warehouse.catalog().load_table(f"{NAMESPACE}.{TABLE}")
            steps.note(
                f"{deletes['keys']} keys deleted in {deletes['files']} equality-delete files"
            )
    finally:
        generator.close()
    options = resolve_options(
        TABLE,
        table.metadata.properties,
        target_file_size=parameters.target_file_size,
        allow_small_target=parameters.allow_small_target,
    )
    _refuse_nothing_to_rewrite(table, options, loaded.files, loaded.bytes)
    floor_settings = (
        options.plan.target_file_size,
        row_group_target(table.metadata.properties),  # counted in memory, as a plain writer can
        parquet_writer_kwargs(table.metadata.properties),
    )
    floor_dir = workdir / "floor-output"
    shutil.rmtree(floor_dir, ignore_errors=True)
    try:
        floor_dir.mkdir(parents=True)
        with steps.step("raw pyarrow floor, 1 process (fresh process)"):
            floor_1 = _without_clock(
                in_fresh_process(
                    floor_phase,
                    [path for path, _ in floor_inputs],
                    str(floor_dir),
                    sum(size for _, size in floor_inputs),
                    *floor_settings,
                )
            )
        steps.note(f"floor, 1 process: {floor_1['seconds']:.1f}s, {floor_1['mb_per_s']:.1f} MB/s")
        shutil.rmtree(floor_dir)
        parts = split_by_bytes(floor_inputs, FLOOR_PROCESSES)
        calls = []
        for index, part in enumerate(parts):
            (floor_dir / f"part-{index}").mkdir(parents=True)
            paths, size = [path for path, _ in part], sum(size for _, size in part)
            calls.append((paths, str(floor_dir / f"part-{index}"), size, *floor_settings))
        with steps.step(f"raw pyarrow floor, {len(parts)} processes (fresh processes)"):
            floor_2 = _combine(in_fresh_processes(floor_phase, calls))
        steps.note(
            f"floor, {len(parts)} processes: {floor_2['seconds']:.1f}s, "
            f"{floor_2['mb_per_s']:.1f} MB/s"
        )
    finally:
        shutil.rmtree(floor_dir, ignore_errors=True)
    conversion = None
    if deletes.get("files"):
        with steps.step("converting the equality deletes (fresh process)"):
            conversion = in_fresh_process(
                conversion_phase,
                BenchTable(CATALOG_NAME, warehouse.catalog_properties, f"{NAMESPACE}.{TABLE}"),
            )
        _roll_back(warehouse, table)
        steps.note(
            f"conversion: {conversion['seconds']:.1f}s, {conversion['cpu_seconds']:.1f} CPU s, "
            f"{conversion['key_bytes_read'] / MB:.1f} MB of key columns read (rolled back)"
        )
    with steps.step("compactor (fresh process)"):
        compacted = _without_clock(
            in_fresh_process(
                compactor_phase,
                BenchTable(CATALOG_NAME, warehouse.catalog_properties, f"{NAMESPACE}.{TABLE}"),
                parameters.target_file_size,
                parameters.allow_small_target,
                parameters.parallelism,
                parameters.max_group_size,
                parameters.memory_limit,
            )
        )
    compared = ratios(compacted, floor_1, floor_2)
    steps.note(
        f"compactor: {compacted['seconds']:.1f}s, {compacted['mb_per_s']:.1f} MB/s, "
        f"{compared['time_vs_floor_1']}x the 1-process floor's time, "
        f"{compared['time_vs_floor_2']}x the 2-process floor's"
    )
    return {
        "input": {
            **loaded.to_dict(),
            "table": f"{NAMESPACE}.{TABLE}",
            "rows": loaded.rows_loaded,
            "imported": imported,
            "equality_deletes": deletes,
        },
        "floor_1": floor_1,
        "floor_2": floor_2,
        "compactor": compacted,
        **({"conversion": conversion} if conversion is not None else {}),
        "ratios": compared,
        "fraction_of_floor": _ratio(compacted["mb_per_s"], floor_1["mb_per_s"]),
    }
