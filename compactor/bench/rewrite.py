"""``compactor bench rewrite``: compaction throughput against a raw pyarrow floor.

The input is TPC-DS ``store_sales`` loaded as ~``--file-size`` files, one per commit, its rows
appended over and over until the table holds ``--input-size`` bytes. Two phases then read the
same files, each in a fresh process so its peak RSS is its own:

- the **floor**: plain pyarrow, no Iceberg. ``pyarrow.dataset`` reads the files (threaded) and
  one ``ParquetWriter`` writes them into files rolling at the target size, with the table's
  compression settings and row groups of at most ``write.parquet.row-group-size-bytes``;
- **compactor**: ``compact()`` on the table, as ``compactor run`` would (plan, rewrite tasks on
  the default executor through the Iceberg read path, commit).

With ``--equality-deletes F`` a fraction F of store_sales' keys (``ss_item_sk``,
``ss_ticket_number``; every copy of each) is deleted by equality deletes committed after the
data, as a CDC source leaves them: compactor applies them while rewriting (the floor does not).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from compactor.bench.progress import Steps
from compactor.bench.tpcds import GENERATOR_FILE, NAMESPACE, generate, load_table
from compactor.bench.warehouse import Warehouse
from compactor.errors import UsageError
from compactor.iceberg.delete_files import commit_delete_files, write_equality_delete_file
from compactor.iceberg.duckdb_views import snapshot_files
from compactor.iceberg.pyiceberg_compat import parquet_writer_kwargs
from compactor.options import resolve_options

MB = 10**6
TABLE = "store_sales"
# store_sales' key, and how many commits --equality-deletes spreads its deletes over.
DELETE_KEY = ("ss_item_sk", "ss_ticket_number")
DELETE_COMMITS = 10
# A file is closed once it is this close to the target (as compactor's writer does).
FILL_RATIO = 0.97


@dataclass(frozen=True)
class RewriteParameters:
    """What ``bench rewrite`` was asked to do."""

    scale_factor: float
    input_size: int
    file_size: int
    target_file_size: str
    allow_small_target: bool
    equality_deletes: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class _Usage:
    """Wall time, CPU time and peak RSS of this process from now on (one phase).

    On Linux the RSS high-water mark is reset first (``/proc/self/clear_refs``), so the peak
    is the phase's own and not an earlier one's, nor the parent's before ``exec``.
    """

    def __init__(self) -> None:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
        self.baseline_rss = _proc_status_bytes("VmRSS")
        self._cpu = _cpu_seconds()
        self._started = time.perf_counter()

    def result(self, input_bytes: int, outputs: list[int]) -> dict[str, Any]:
        seconds = time.perf_counter() - self._started
        rate = input_bytes / MB / seconds if seconds > 0 else 0.0
        cores = multiprocessing.cpu_count()
        return {
            "seconds": round(seconds, 3),
            "cpu_seconds": round(_cpu_seconds() - self._cpu, 3),
            "mb_per_s": round(rate, 2),
            "mb_per_s_per_core": round(rate / cores, 2),
            "peak_rss_bytes": _proc_status_bytes("VmHWM"),
            "baseline_rss_bytes": self.baseline_rss,
            "output_files": len(outputs),
            "output_bytes": sum(outputs),
            "output_file_sizes": sorted(outputs),
        }


def _proc_status_bytes(name: str) -> int:
    """``VmRSS``/``VmHWM`` of this process; elsewhere than Linux, the lifetime peak RSS."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def floor_phase(
    files: list[str],
    out_dir: str,
    input_bytes: int,
    target: int,
    row_group_size: int,
    writer_kwargs: dict[str, Any],
) -> dict[str, Any]:
    """Read ``files`` with pyarrow and write them into target-size Parquet files in ``out_dir``."""
    usage = _Usage()
    dataset = ds.dataset(files, format="parquet")
    budget = min(row_group_size, target)
    outputs: list[int] = []
    writer: pq.ParquetWriter | None = None
    sink: pa.NativeFile | None = None
    pending: list[pa.RecordBatch] = []
    buffered = 0

    def flush() -> None:
        nonlocal writer, sink, pending, buffered
        if writer is None:
            sink = pa.OSFile(f"{out_dir}/floor-{len(outputs):05d}.parquet", "wb")
            writer = pq.ParquetWriter(
                sink, dataset.schema, store_decimal_as_integer=True, **writer_kwargs
            )
        rows = pa.Table.from_batches(pending, schema=dataset.schema)
        writer.write_table(rows, row_group_size=max(rows.num_rows, 1))
        pending, buffered = [], 0
        assert sink is not None
        if sink.tell() >= target * FILL_RATIO:
            close()

    def close() -> None:
        nonlocal writer, sink
        if writer is not None and sink is not None:
            writer.close()
            outputs.append(sink.tell())
            sink.close()
            writer = sink = None

    for batch in dataset.to_batches(use_threads=True):
        pending.append(batch)
        buffered += batch.nbytes
        if buffered >= budget:
            flush()
    if pending:
        flush()
    close()
    return usage.result(input_bytes, outputs)


def compactor_phase(
    catalog_properties: dict[str, str], target: str, allow_small_target: bool
) -> dict[str, Any]:
    """Compact ``tpcds.store_sales`` with compactor's defaults and the given target."""
    from pyiceberg.catalog.sql import SqlCatalog

    from compactor.bench.warehouse import CATALOG_NAME
    from compactor.compaction import compact

    identifier = f"{NAMESPACE}.{TABLE}"
    table = SqlCatalog(CATALOG_NAME, **catalog_properties).load_table(identifier)
    options = resolve_options(
        identifier,
        table.metadata.properties,
        target_file_size=target,
        allow_small_target=allow_small_target,
    )
    usage = _Usage()
    result = compact(table, identifier, options)
    outputs = [d.file_size_in_bytes for r in result.committed for d in r.data_files]
    return {
        **usage.result(sum(r.input_bytes for r in result.committed), outputs),
        "input_files": sum(len(g.files) for g in result.committed_groups),
        "groups": len(result.plan.groups),
        "parallelism": options.parallelism,
        "records_written": sum(r.records_read for r in result.committed),
        "rows_deleted": sum(r.rows_deleted for r in result.committed),
    }


def add_equality_deletes(
    generator: duckdb.DuckDBPyConnection, table: Table, fraction: float
) -> dict[str, Any]:
    """Delete ``fraction`` of store_sales' keys (every copy) with equality deletes, as a CDC
    source would: DELETE_COMMITS commits of one delete file each, all newer than the data."""
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
    per_file = -(-keys.num_rows // DELETE_COMMITS)
    files = 0
    for start in range(0, keys.num_rows, per_file):
        delete_file = write_equality_delete_file(
            table, keys.slice(start, per_file), spec_id=spec.spec_id, partition=Record()
        )
        table = commit_delete_files(table, [delete_file])
        files += 1
    return {"keys": keys.num_rows, "files": files, "fraction": fraction}


def in_fresh_process(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run ``function(*args)`` in a new (spawned) process and return its result."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def run_rewrite_benchmark(
    parameters: RewriteParameters, warehouse: Warehouse, workdir: Path, steps: Steps
) -> dict[str, Any]:
    """Build the input table, measure the floor, then compactor; returns the report's body."""
    with steps.step(f"generating TPC-DS at scale factor {parameters.scale_factor} (dsdgen)"):
        generator = generate(workdir / GENERATOR_FILE, parameters.scale_factor)
    catalog = warehouse.catalog()
    try:
        with steps.step(f"loading {TABLE}", total=parameters.input_size) as advance:
            table, loaded = load_table(
                generator,
                catalog,
                TABLE,
                parameters.file_size,
                until_bytes=parameters.input_size,
                on_commit=lambda _, size: advance(size),
            )
        steps.note(
            f"loaded {TABLE}: {loaded.files} files, {loaded.bytes / MB:.1f} MB in "
            f"{loaded.commits} commits"
        )
        floor_inputs = snapshot_files(table)  # the data files, before any delete
        deletes: dict[str, Any] = {}
        if parameters.equality_deletes > 0:
            with steps.step(f"equality deletes on {', '.join(DELETE_KEY)}"):
                deletes = add_equality_deletes(generator, table, parameters.equality_deletes)
            table = catalog.load_table(f"{NAMESPACE}.{TABLE}")
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
    floor_dir = workdir / "floor-output"
    shutil.rmtree(floor_dir, ignore_errors=True)
    floor_dir.mkdir(parents=True)
    try:
        with steps.step("raw pyarrow floor (fresh process)"):
            floor = in_fresh_process(
                floor_phase,
                floor_inputs,
                str(floor_dir),
                loaded.bytes,
                options.target_file_size,
                options.row_group_size,
                parquet_writer_kwargs(table.metadata.properties),
            )
    finally:
        shutil.rmtree(floor_dir, ignore_errors=True)
    steps.note(f"floor: {floor['mb_per_s']:.1f} MB/s")
    with steps.step("compactor (fresh process)"):
        compacted = in_fresh_process(
            compactor_phase,
            warehouse.catalog_properties,
            parameters.target_file_size,
            parameters.allow_small_target,
        )
    steps.note(f"compactor: {compacted['mb_per_s']:.1f} MB/s")
    return {
        "input": {
            **loaded.to_dict(),
            "table": f"{NAMESPACE}.{TABLE}",
            "rows": loaded.rows_loaded,
            "equality_deletes": deletes,
        },
        "floor": floor,
        "compactor": compacted,
        "fraction_of_floor": round(compacted["mb_per_s"] / floor["mb_per_s"], 3)
        if floor["mb_per_s"]
        else None,
    }
