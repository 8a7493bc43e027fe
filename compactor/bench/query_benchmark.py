"""``compactor bench queries``: TPC-DS in DuckDB over fragmented Iceberg tables, compact, again.

generate (dsdgen) -> load the tables the queries read, one small file per commit -> run the
queries over each table's current snapshot -> compact every table with compactor -> run them
again -> compare results and report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog

from compactor.api import compact
from compactor.bench.clustering import FILTERED_QUERIES, pruning_report, strategy_options
from compactor.bench.progress import Advance, Steps
from compactor.bench.queries import QueryMeasure, Row, run_query, same_results
from compactor.bench.tpcds import (
    GENERATOR_FILE,
    NAMESPACE,
    LoadedTable,
    generate,
    generated_tables,
    load_table,
    query_texts,
    tables_of,
)
from compactor.bench.warehouse import Warehouse
from compactor.compaction import RunResult
from compactor.errors import CompactorError
from compactor.iceberg.duckdb_views import create_view
from compactor.options.compact import ROW_GROUP_SIZE_PROPERTY, resolve_options
from compactor.planning.planner import Plan
from compactor.sizes import format_size_exact

MB = 10**6


@dataclass(frozen=True)
class QueriesParameters:
    """What ``bench queries`` was asked to do."""

    scale_factor: float
    file_size: int
    target_file_size: str
    allow_small_target: bool
    queries: list[int]
    warmup: int
    repetitions: int
    # binpack, sort or zorder: how the fact tables are compacted; also runs the filtered
    # queries (compactor.bench.clustering). None: bin-pack, the study's queries only.
    strategy: str | None = None
    # Bytes: set as each table's write.parquet.row-group-size-bytes before it is compacted.
    row_group_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class _BytesProgress:
    """compactor's run progress (input bytes) onto a benchmark step's bar."""

    def __init__(self, advance: Advance) -> None:
        self._advance = advance

    def start(self, plan: Plan) -> None:
        return None

    def advance(self, input_files: int, input_bytes: int) -> None:
        self._advance(input_bytes)


def compact_tables(
    catalog: Catalog, tables: list[str], parameters: QueriesParameters, steps: Steps
) -> list[RunResult]:
    """Compact each table in turn, as ``compactor run --table tpcds.<name>`` would."""
    results = []
    for name in tables:
        identifier = f"{NAMESPACE}.{name}"
        table = catalog.load_table(identifier)
        if parameters.row_group_size is not None:
            with table.transaction() as transaction:
                transaction.set_properties(
                    {ROW_GROUP_SIZE_PROPERTY: str(parameters.row_group_size)}
                )
        options = resolve_options(
            identifier,
            table.metadata.properties,
            target_file_size=parameters.target_file_size,
            allow_small_target=parameters.allow_small_target,
            **strategy_options(parameters.strategy or "binpack", name),
        )
        snapshot = table.current_snapshot()
        summary = snapshot.summary if snapshot is not None else None
        size = int(summary["total-files-size"] or 0) if summary is not None else 0
        with steps.step(f"compacting {identifier}", total=size) as advance:
            results.append(compact(table, options, progress=_BytesProgress(advance)))
    return results


def _compaction_stats(results: list[RunResult]) -> dict[str, Any]:
    rows = []
    for result in results:
        data = result.to_dict()
        rows.append(
            {
                "table": result.table,
                "input_files": data["rewritten_files"],
                "output_files": data["added_files"],
                "input_bytes": data["rewritten_bytes"],
                "output_bytes": data["added_bytes"],
                "records": data["records"],
                "seconds": round(result.duration_s, 3),
                "mb_per_s": _rate(data["rewritten_bytes"], result.duration_s),
            }
        )
    total = {
        key: sum(r[key] for r in rows)
        for key in ("input_files", "output_files", "input_bytes", "output_bytes", "records")
    }
    seconds = round(sum(r["seconds"] for r in rows), 3)
    return {
        **total,
        "seconds": seconds,
        "mb_per_s": _rate(total["input_bytes"], seconds),
        "tables": rows,
    }


def _rate(num_bytes: int, seconds: float) -> float:
    return round(num_bytes / MB / seconds, 2) if seconds > 0 else 0.0


def _snapshot_total(catalog: Catalog, tables: list[str], key: str) -> int:
    """The sum over ``tables`` of their current snapshot's summary ``key`` (e.g. total-data-files)."""
    total = 0
    for name in tables:
        snapshot = catalog.load_table(f"{NAMESPACE}.{name}").current_snapshot()
        summary = snapshot.summary if snapshot else None
        total += int((summary[key] if summary else 0) or 0)
    return total


def _run_all(
    warehouse: Warehouse,
    catalog: Catalog,
    tables: list[str],
    texts: dict[int, str],
    parameters: QueriesParameters,
    steps: Steps,
    label: str,
) -> dict[int, tuple[QueryMeasure, list[Row]]]:
    con = warehouse.duckdb_connection()
    try:
        for name in tables:
            create_view(con, name, catalog.load_table(f"{NAMESPACE}.{name}"))
        counter = warehouse.server_counter
        server_gets = (lambda: counter.count("GET")) if counter else None
        measures = {}
        with steps.step(
            f"running {len(texts)} queries {label} compaction", total=len(texts)
        ) as advance:
            for number, text in texts.items():
                measures[number] = run_query(
                    con,
                    text,
                    warmup=parameters.warmup,
                    repetitions=parameters.repetitions,
                    count_gets=warehouse.on_s3,
                    server_gets=server_gets,
                )
                advance(1)
        return measures
    finally:
        con.close()


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {}
    for phase in ("before", "after"):
        totals[f"{phase}_s"] = round(sum(r[phase]["median_s"] for r in rows), 6)
        for key in ("files_opened", "bytes_read", "get_requests"):
            values = [r[phase][key] for r in rows]
            totals[f"{key}_{phase}"] = None if None in values else sum(values)
    totals["speedup"] = (
        round(totals["before_s"] / totals["after_s"], 3) if totals["after_s"] else None
    )
    gets_before, gets_after = totals["get_requests_before"], totals["get_requests_after"]
    totals["get_requests_ratio"] = (
        round(gets_before / gets_after, 3) if gets_before is not None and gets_after else None
    )
    totals["identical_results"] = all(r["identical_results"] for r in rows)
    return totals


def run_queries_benchmark(
    parameters: QueriesParameters,
    warehouse: Warehouse,
    workdir: Path,
    steps: Steps,
) -> dict[str, Any]:
    """Run the whole benchmark; returns the report's body (see compactor.bench.report)."""
    started = time.monotonic()
    with steps.step(f"generating TPC-DS at scale factor {parameters.scale_factor} (dsdgen)"):
        generator = generate(workdir / GENERATOR_FILE, parameters.scale_factor)
    generation_s = round(time.monotonic() - started, 3)
    steps.note(f"generated TPC-DS at scale factor {parameters.scale_factor} in {generation_s:.1f}s")
    try:
        texts = query_texts(generator, parameters.queries)
        if parameters.strategy is not None:
            texts.update({q.number: q.text for q in FILTERED_QUERIES})
        names = generated_tables(generator)
        per_query = {n: tables_of(text, names) for n, text in texts.items()}
        tables = sorted({t for used in per_query.values() for t in used})
        catalog = warehouse.catalog()
        total_rows = sum(
            int((generator.execute(f'SELECT count(*) FROM "{t}"').fetchone() or (0,))[0])
            for t in tables
        )
        loaded: list[LoadedTable] = []
        load_started = time.monotonic()
        with steps.step(f"loading {len(tables)} tables into Iceberg", total=total_rows) as advance:
            for name in tables:
                _table, stats = load_table(
                    generator,
                    catalog,
                    name,
                    parameters.file_size,
                    on_commit=lambda rows, _: advance(rows),
                )
                loaded.append(stats)
        load_s = round(time.monotonic() - load_started, 3)
    finally:
        generator.close()
    load = {
        "seconds": load_s,
        "tables": [t.to_dict() for t in loaded],
        **{
            key: sum(getattr(t, key) for t in loaded)
            for key in ("files", "bytes", "commits", "rows_loaded", "rows_generated")
        },
    }
    steps.note(
        f"loaded {len(tables)} tables: {load['files']} files, {load['bytes'] / MB:.1f} MB "
        f"in {load['commits']} commits ({load_s:.1f}s)"
    )
    before = _run_all(warehouse, catalog, tables, texts, parameters, steps, "before")
    pruned_before = _pruning(catalog, tables, parameters)
    results = compact_tables(catalog, tables, parameters, steps)
    compaction = _compaction_stats(results)
    if compaction["input_files"] == 0:
        raise CompactorError(
            f"nothing was compacted: at scale factor {parameters.scale_factor} with "
            f"--file-size {format_size_exact(parameters.file_size)} no table is fragmented enough "
            "(each group needs several small files); give a smaller --file-size, e.g. 64KB"
        )
    compaction["files_before"] = load["files"]
    compaction["files_after"] = _snapshot_total(catalog, tables, "total-data-files")
    compaction["data_bytes_before"] = load["bytes"]
    compaction["data_bytes_after"] = _snapshot_total(catalog, tables, "total-files-size")
    steps.note(
        f"compacted {compaction['input_files']} files into {compaction['output_files']} "
        f"in {compaction['seconds']:.1f}s ({compaction['mb_per_s']:.1f} MB/s); data "
        f"{compaction['data_bytes_before'] / MB:.1f} MB -> {compaction['data_bytes_after'] / MB:.1f} MB"
    )
    after = _run_all(warehouse, catalog, tables, texts, parameters, steps, "after")
    pruned_after = _pruning(catalog, tables, parameters)
    rows = []
    for number in texts:
        (m_before, r_before), (m_after, r_after) = before[number], after[number]
        rows.append(
            {
                "query": number,
                "tables": per_query[number],
                "before": m_before.to_dict(),
                "after": m_after.to_dict(),
                "speedup": round(m_before.median_s / m_after.median_s, 3)
                if m_after.median_s
                else None,
                "identical_results": same_results(r_before, r_after),
            }
        )
        if number in pruned_before:
            rows[-1]["pruning"] = {"before": pruned_before[number], "after": pruned_after[number]}
    return {
        "generation": {"seconds": generation_s},
        "load": load,
        "queries": rows,
        "totals": _totals(rows),
        "compaction": compaction,
        "s3_requests": _s3_requests(warehouse, rows),
    }


def _pruning(
    catalog: Catalog, tables: list[str], parameters: QueriesParameters
) -> dict[int, dict[str, Any]]:
    """Files and row groups each filtered query may skip by min/max statistics (if it runs)."""
    if parameters.strategy is None:
        return {}
    loaded = {name: catalog.load_table(f"{NAMESPACE}.{name}") for name in tables}
    return pruning_report(loaded)


def _s3_requests(warehouse: Warehouse, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not warehouse.on_s3:
        return None
    before = sum(r["before"]["get_requests"] for r in rows)
    after = sum(r["after"]["get_requests"] for r in rows)
    return {
        "counted_by": "server" if warehouse.server_counter else "duckdb_http_log",
        "scope": "one run of each query",
        "get_before": before,
        "get_after": after,
        "ratio": round(before / after, 3) if after else None,
    }
