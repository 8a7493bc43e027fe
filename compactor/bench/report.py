"""The benchmark reports: report.json (schema below), report.md and, for queries, a PNG chart.

report.json, ``schema_version`` 1; every benchmark has:

- ``schema_version`` (int), ``benchmark`` ("queries", "rewrite", "plan" or "manifests"),
  ``created_at``
  (ISO 8601)
- ``command`` (list of str): the command line
- ``machine``: ``cpu_count``, ``cpu_model``, ``memory_bytes``, ``platform``, ``python``,
  ``versions`` (``compactor``, ``pyiceberg``, ``pyarrow``, ``duckdb``)
- ``parameters``: the options, sizes in bytes

``queries`` adds ``generation``, ``load``, ``queries``, ``totals``, ``compaction``,
``s3_requests``; ``rewrite`` adds ``input``, ``floor_1``, ``floor_2``, ``compactor``, ``ratios``,
``fraction_of_floor`` (and, with ``--equality-deletes``, ``conversion``); ``plan`` adds ``table``, ``plan``, ``runs``, ``plan_seconds``; ``manifests`` adds ``table``,
``rewrite``, ``scan_before``, ``scan_after``, ``runs_before``, ``runs_after``,
``duckdb_scan_before``, ``duckdb_scan_after``, ``duckdb_runs_before``, ``duckdb_runs_after``.
docs/benchmarks.md describes each field.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

from compactor.sizes import count

SCHEMA_VERSION = 1
MB = 10**6


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The machine and the versions that produced a report."""
    return {
        "cpu_count": os.cpu_count() or 1,
        "cpu_model": _cpu_model(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: version(p) for p in ("compactor", "pyiceberg", "pyarrow", "duckdb")},
    }


def build_report(
    benchmark: str, command: list[str], parameters: dict[str, Any], body: dict[str, Any]
) -> dict[str, Any]:
    """report.json's document: the common header, then the benchmark's own sections."""
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": benchmark,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine(),
        "parameters": parameters,
        **body,
    }


def _mb(num_bytes: float | None) -> str:
    return "–" if num_bytes is None else f"{num_bytes / MB:,.1f}"


def _num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:,.{digits}f}{suffix}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _percent(after: float, before: float) -> str:
    """The change from ``before`` to ``after`` as a signed percentage."""
    return f"{(after - before) / before:+.1%}" if before else "–"


def _machine_lines(report: dict[str, Any]) -> list[str]:
    m = report["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    return [
        f"Command: `{' '.join(report['command'])}`",
        "",
        f"Machine: {m['cpu_count']} × {m['cpu_model']}, {m['memory_bytes'] / 2**30:.0f} GiB, "
        f"{m['platform']}, Python {m['python']}; {versions}.",
        "",
    ]


def queries_markdown(report: dict[str, Any]) -> str:
    """report.md of ``bench queries``."""
    p, load, comp, totals = (
        report["parameters"],
        report["load"],
        report["compaction"],
        report["totals"],
    )
    with_gets = report["s3_requests"] is not None
    lines = [
        f"# TPC-DS queries before and after compaction (scale factor {p['scale_factor']})",
        "",
        *_machine_lines(report),
        f"Loaded {len(load['tables'])} tables ({load['rows_loaded']:,} rows) as {load['files']:,} "
        f"files ({_mb(load['bytes'])} MB) in {load['commits']:,} commits; "
        f"per query: {p['warmup']} warm-up run(s), then the median of {p['repetitions']} timed run(s).",
        "",
        f"**Data files: {_mb(comp['data_bytes_before'])} MB before compaction, "
        f"{_mb(comp['data_bytes_after'])} MB after "
        f"({_percent(comp['data_bytes_after'], comp['data_bytes_before'])}); read by the queries: "
        f"{_mb(totals['bytes_read_before'])} MB before, {_mb(totals['bytes_read_after'])} MB after "
        f"({_percent(totals['bytes_read_after'], totals['bytes_read_before'])}).**",
        "",
    ]
    header = ["query", "before (s)", "after (s)", "speedup", "files before", "files after"]
    header += ["MB read before", "MB read after"]
    header += ["GETs before", "GETs after"] if with_gets else []
    header += ["same results"]
    rows = []
    for q in report["queries"]:
        b, a = q["before"], q["after"]
        row = [str(q["query"]), _num(b["median_s"], 3), _num(a["median_s"], 3)]
        row += [_num(q["speedup"], 2, "x"), f"{b['files_opened']:,}", f"{a['files_opened']:,}"]
        row += [_mb(b["bytes_read"]), _mb(a["bytes_read"])]
        row += [f"{b['get_requests']:,}", f"{a['get_requests']:,}"] if with_gets else []
        rows.append([*row, "yes" if q["identical_results"] else "**NO**"])
    total = ["**total**", _num(totals["before_s"], 3), _num(totals["after_s"], 3)]
    total += [f"**{_num(totals['speedup'], 2, 'x')}**"]
    total += [f"{totals['files_opened_before']:,}", f"{totals['files_opened_after']:,}"]
    total += [_mb(totals["bytes_read_before"]), _mb(totals["bytes_read_after"])]
    total += (
        [f"{totals['get_requests_before']:,}", f"{totals['get_requests_after']:,}"]
        if with_gets
        else []
    )
    rows.append([*total, "yes" if totals["identical_results"] else "**NO**"])
    lines += _table(header, rows)
    lines += [
        f"Compaction (target {p['target_file_size']}): {comp['input_files']:,} files "
        f"({_mb(comp['input_bytes'])} MB) rewritten into {comp['output_files']:,} "
        f"({_mb(comp['output_bytes'])} MB) in {comp['seconds']:.1f}s, {comp['mb_per_s']:.1f} MB/s; "
        f"the tables went from {comp['files_before']:,} to {comp['files_after']:,} data files.",
        "",
        "Files opened and bytes read: DuckDB's FileSystem log of one extra, untimed run of each "
        "query.",
    ]
    pruned = [q for q in report["queries"] if "pruning" in q]
    if pruned:
        lines += [
            "",
            f"Strategy {p['strategy']}: what min/max statistics let a reader skip in the "
            "filtered queries (files by their manifest bounds, row groups by their Parquet "
            "statistics; to read / in the table):",
            "",
        ]
        prune_rows = [
            [
                str(q["query"]),
                *(
                    f"{q['pruning'][phase][kind + '_to_read']:,} / {q['pruning'][phase][kind]:,}"
                    for phase in ("before", "after")
                    for kind in ("files", "row_groups")
                ),
            ]
            for q in pruned
        ]
        header = ["query", "files before", "row groups before", "files after", "row groups after"]
        lines += _table(header, prune_rows)
    if with_gets:
        s3 = report["s3_requests"]
        source = (
            "counted at the S3 server" if s3["counted_by"] == "server" else "from DuckDB's HTTP log"
        )
        lines += [
            f"GET requests ({source}, one run of each query): {s3['get_before']:,} before, "
            f"{s3['get_after']:,} after ({_num(s3['ratio'], 1, 'x')} fewer).",
        ]
    return "\n".join(lines) + "\n"


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def rewrite_markdown(report: dict[str, Any]) -> str:
    """report.md of ``bench rewrite``."""
    p, inp, comp, ratios = (
        report["parameters"],
        report["input"],
        report["compactor"],
        report["ratios"],
    )
    floor_1, floor_2 = report["floor_1"], report["floor_2"]
    header = ["", "seconds", "MB/s", "files/s", "CPU s", "CPU busy", "peak RSS (MB)"]
    header += ["output files", "compactor's time ÷ this"]
    phases = (
        ("raw pyarrow, 1 process", floor_1, ratios["time_vs_floor_1"]),
        (f"raw pyarrow, {floor_2['processes']} processes", floor_2, ratios["time_vs_floor_2"]),
        (f"compactor (parallelism {comp['parallelism']})", comp, 1.0),
    )
    rows = [
        [
            name,
            _num(r["seconds"], 2),
            _num(r["mb_per_s"], 1),
            _num(r["files_per_s"], 1),
            _num(r["cpu_seconds"], 1),
            _num(r["cpu_seconds"] / r["seconds"] if r["seconds"] else None, 2, " cores"),
            _mb(r["peak_rss_bytes"]),
            f"{r['output_files']} (avg {_mb(r['output_bytes'] / max(r['output_files'], 1))} MB)",
            _times(ratio),
        ]
        for name, r, ratio in phases
    ]
    workload = f"workload `{p['workload']}`: " if p.get("workload") else ""
    groups = comp["groups"]
    lines = [
        "# Rewrite throughput: compactor against a raw pyarrow floor",
        "",
        *_machine_lines(report),
        f"Input ({workload}TPC-DS scale factor {p['scale_factor']}): `{inp['table']}`, "
        f"{count(inp['files'], 'file')}, {_mb(inp['bytes'])} MB, {inp['rows']:,} rows in "
        f"{count(inp['commits'], 'commit')}; target {p['target_file_size']}.",
        "",
        *_table(header, rows),
        f"compactor takes **{_times(ratios['time_vs_floor_1'])} the 1-process floor's time** and "
        f"**{_times(ratios['time_vs_floor_2'])} the {floor_2['processes']}-process floor's**, "
        f"with {_times(ratios['cpu_vs_floor_1'])} its CPU and "
        f"{_times(ratios['peak_rss_vs_floor_1'])} its peak RSS (1-process floor); it rewrote "
        f"{count(groups, 'group')}, at most {comp['parallelism']} at once.",
        "",
        "Each phase runs in fresh processes, one phase after the other; peak RSS is a process's "
        f"high-water mark (baseline after imports: floor {_mb(floor_1['baseline_rss_bytes'])} "
        f"MB, compactor {_mb(comp['baseline_rss_bytes'])} MB). The "
        f"{floor_2['processes']}-process floor reads the files in {floor_2['processes']} halves "
        "of about equal bytes, each in its own process, both at once: its seconds are the "
        "pair's wall time, its CPU their sum, its peak RSS the larger one (together "
        f"{_mb(floor_2['peak_rss_sum_bytes'])} MB).",
    ]
    if comp["parallelism"] and groups < comp["parallelism"]:
        lines += [
            "",
            f"Note: {count(groups, 'group')} for parallelism "
            f"{comp['parallelism']}: groups are what run at once (see --max-group-size).",
        ]
    lines += ["", *_breakdown_lines(comp)]
    if "conversion" in report:
        lines += ["", *_remedies_lines(report["conversion"], comp)]
    return "\n".join(lines) + "\n"


# compactor's breakdown (report.json's ``compactor.breakdown``), in the order of the work.
_BREAKDOWN_ROWS = (
    ("plan", "planning (and the run's start)"),
    ("open_footer", "read: open, footer"),
    ("projection", "read: mapping, projection"),
    ("decode", "read: bulk scan, in compactor's thread"),
    ("pyarrow_threads", "read: bulk scan, decoding in pyarrow's threads"),
    ("read_each", "read: Iceberg read path, file by file"),
    ("write", "write: encode"),
    ("statistics", "statistics for the manifests"),
    ("rewrite_other", "rewrite: the rest"),
    ("commit", "commit (and the run's end)"),
)


def _breakdown_lines(comp: dict[str, Any]) -> list[str]:
    """Where compactor's time went: CPU seconds per stage and per input file."""
    parts = comp["breakdown"]
    cpu, per_file, seconds = parts["cpu_seconds"], parts["cpu_ms_per_file"], parts["seconds"]
    rows = [[name, _num(cpu[key], 3), _num(per_file[key], 3)] for key, name in _BREAKDOWN_ROWS]
    rows.append(["total", _num(comp["cpu_seconds"], 3), _num(per_file["total"], 3)])
    return [
        f"Where compactor's CPU went, over {count(comp['input_files'], 'input file')} (wall "
        f"time: planning {seconds['plan']:.2f}s, rewrite {seconds['rewrite']:.2f}s, commit "
        f"{seconds['commit']:.2f}s). The rewrite's parts are the CPU of compactor's threads in "
        'each, and of pyarrow\'s thread pools during the rewrite; "the rest" is the rest of '
        "the process's CPU during the rewrite (threads that ended, work between the parts).",
        "",
        *_table(["stage", "CPU s", "CPU ms per file"], rows),
    ]


def _remedies_lines(conversion: dict[str, Any], comp: dict[str, Any]) -> list[str]:
    """The two remedies of equality deletes, each from the same table: converting them, and
    the rewrite above."""
    header = ["remedy", "seconds", "CPU s", "MB read", "peak RSS (MB)", "CPU ÷ rewrite's"]
    phases = (
        ("convert (key columns only)", conversion, conversion["bytes_read"]),
        ("rewrite (deletes applied)", comp, comp["input_bytes"]),
    )
    rows = [
        [
            name,
            _num(r["seconds"], 2),
            _num(r["cpu_seconds"], 1),
            _mb(read),
            _mb(r["peak_rss_bytes"]),
            _times(r["cpu_seconds"] / comp["cpu_seconds"] if comp["cpu_seconds"] else None),
        ]
        for name, r, read in phases
    ]
    return [
        "Equality deletes, two remedies (the conversion ran first, then the table was put "
        "back on its snapshot before it):",
        "",
        *_table(header, rows),
        f"The conversion read {count(conversion['data_files_read'], 'data file')}' key "
        f"columns, matched {conversion['rows_matched']:,} rows and replaced "
        f"{count(conversion['equality_delete_files_converted'], 'equality-delete file')} "
        f"with {count(conversion['position_delete_files_written'] or 0, 'position-delete file')}"
        f" and {count(conversion['deletion_vectors_written'] or 0, 'deletion vector')}.",
    ]


def plan_markdown(report: dict[str, Any]) -> str:
    """report.md of ``bench plan``."""
    p, table, median = report["parameters"], report["table"], report["plan"]
    header = ["run", "load table (s)", "plan (s)", "CPU s", "peak RSS (MB)"]
    header += ["manifests read", "files planned", "groups"]
    rows = [
        [
            str(number),
            _num(r["load_table_seconds"], 3),
            _num(r["plan_seconds"], 3),
            _num(r["cpu_seconds"], 2),
            _mb(r["peak_rss_bytes"]),
            f"{r['manifests_read']:,} of {r['manifests']:,}",
            f"{r['files_planned']:,}",
            f"{r['groups']:,}",
        ]
        for number, r in enumerate(report["runs"], start=1)
    ]
    lines = [
        "# Planning a table of many small files",
        "",
        *_machine_lines(report),
        f"Table: `{table['table']}`, {table['files']:,} files of {table['rows_per_file']} rows "
        f"({_mb(table['bytes'])} MB, {table['rows']:,} rows) over "
        f"{count(table['commits'], 'commit')} (one manifest each); built in "
        f"{table['seconds']:.1f}s by {count(table['writer_processes'], 'writer process', 'writer processes')}, "
        f"the snapshots sent to the catalog in {count(table['catalog_commits'], 'commit')}. "
        f"Target {p['target_file_size']}.",
        "",
        *_table(header, rows),
        f"**Planning {median['files_planned']:,} files from {median['manifests_read']:,} "
        f"manifests takes {median['plan_seconds']:.2f}s** (median of "
        f"{count(len(report['runs']), 'run')}; min {report['plan_seconds']['min']:.2f}s, max "
        f"{report['plan_seconds']['max']:.2f}s), peak RSS {_mb(median['peak_rss_bytes'])} MB.",
        "",
        "Each run is a fresh process: it loads the table from the catalog (the metadata file), "
        "then runs `compactor.plan(table)` (the manifest list and every manifest read, "
        "candidates picked, groups packed; nothing written).",
    ]
    return "\n".join(lines) + "\n"


def storage_label(parameters: dict[str, Any]) -> str:
    """Where a benchmark's tables were: ``local disk``, ``a local S3 server (30 ms a request)``,
    ``S3 at https://...``."""
    storage = parameters.get("storage", "local")
    if storage == "local":
        return "local disk"
    if storage == "s3-local":
        latency = parameters.get("s3_latency_ms") or 0
        return "a local S3 server" + (f" ({latency:g} ms a request)" if latency else "")
    endpoint = parameters.get("s3_endpoint")
    return f"S3 at {endpoint}" if endpoint else "S3"


def queries_chart_title(report: dict[str, Any]) -> str:
    """The chart's title: what ran, where, and the total speed-up."""
    p = report["parameters"]
    return (
        f"TPC-DS SF {p['scale_factor']} in DuckDB on {storage_label(p)}: before and after "
        f"compaction (total {_num(report['totals']['speedup'], 2, 'x')})"
    )


def queries_chart(report: dict[str, Any], path: Path) -> None:
    """Grouped bars: median time per query before and after compaction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queries = report["queries"]
    labels = [f"q{q['query']}" for q in queries]
    positions = range(len(queries))
    width = 0.4
    fig, ax = plt.subplots(figsize=(max(6, len(queries) * 0.9), 4))
    ax.bar(
        [x - width / 2 for x in positions],
        [q["before"]["median_s"] for q in queries],
        width,
        label="before",
    )
    ax.bar(
        [x + width / 2 for x in positions],
        [q["after"]["median_s"] for q in queries],
        width,
        label="after",
    )
    ax.set_xticks(list(positions), labels)
    ax.set_ylabel("median time (s)")
    ax.set_title(queries_chart_title(report))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def manifests_markdown(report: dict[str, Any]) -> str:
    """report.md of ``bench manifests``."""
    table, rewrite = report["table"], report["rewrite"]
    before, after = report["scan_before"], report["scan_after"]
    header = ["", "manifests", "plan_files (s)", "CPU s", "peak RSS (MB)", "files planned"]
    rows = [
        [
            when,
            f"{scan['manifests']:,}",
            _num(scan["plan_files_seconds"], 3),
            _num(scan["cpu_seconds"], 2),
            _mb(scan["peak_rss_bytes"]),
            f"{scan['files']:,}",
        ]
        for when, scan in (("before", before), ("after", after))
    ]
    speedup = before["plan_files_seconds"] / max(after["plan_files_seconds"], 1e-9)
    duck_before, duck_after = report["duckdb_scan_before"], report["duckdb_scan_after"]
    duck_speedup = duck_before["explain_seconds"] / max(duck_after["explain_seconds"], 1e-9)
    lines = [
        "# Rewriting the manifests of a table of many one-file commits",
        "",
        *_machine_lines(report),
        f"Table: `{table['table']}`, {table['files']:,} files of {table['rows_per_file']} rows "
        f"in {count(table['commits'], 'fast append')} (one manifest each).",
        "",
        f"**{rewrite['manifests_replaced']:,} manifests rewritten into "
        f"{rewrite['manifests_written']:,} in {rewrite['seconds']:.2f}s** "
        f"({_mb(rewrite['bytes_replaced'])} MB into {_mb(rewrite['bytes_written'])} MB; "
        f"CPU {rewrite['cpu_seconds']:.2f}s, peak RSS {_mb(rewrite['peak_rss_bytes'])} MB).",
        "",
        *_table(header, rows),
        f"pyiceberg's `table.scan().plan_files()`: {before['plan_files_seconds']:.2f}s before, "
        f"{after['plan_files_seconds']:.2f}s after ({speedup:.1f}x faster; median of "
        f"{count(len(report['runs_before']), 'fresh process', 'fresh processes')} each).",
        "",
        f"DuckDB's `iceberg_scan`, `EXPLAIN SELECT *`: {duck_before['explain_seconds']:.2f}s "
        f"before, {duck_after['explain_seconds']:.2f}s after ({duck_speedup:.1f}x faster); "
        f"`SELECT count(*)`: {duck_before['count_seconds']:.2f}s before, "
        f"{duck_after['count_seconds']:.2f}s after; files opened: "
        f"{duck_before['files_opened']:,} before, {duck_after['files_opened']:,} after "
        f"({duck_before['data_files_opened'] + duck_after['data_files_opened']} data files).",
    ]
    return "\n".join(lines) + "\n"


def write_reports(report: dict[str, Any], out: Path) -> list[Path]:
    """Write report.json, report.md (and chart.png for queries) into ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    if report["benchmark"] == "queries":
        paths[1].write_text(queries_markdown(report))
        paths.append(out / "chart.png")
        queries_chart(report, paths[2])
    elif report["benchmark"] == "plan":
        paths[1].write_text(plan_markdown(report))
    elif report["benchmark"] == "manifests":
        paths[1].write_text(manifests_markdown(report))
    else:
        paths[1].write_text(rewrite_markdown(report))
    return paths
