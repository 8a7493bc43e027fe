"""The benchmark reports: report.json (schema below), report.md and, for queries, a PNG chart.

report.json, ``schema_version`` 1; every benchmark has:

- ``schema_version`` (int), ``benchmark`` ("queries" or "rewrite"), ``created_at`` (ISO 8601)
- ``command`` (list of str): the command line
- ``machine``: ``cpu_count``, ``cpu_model``, ``memory_bytes``, ``platform``, ``python``,
  ``versions`` (``compactor``, ``pyiceberg``, ``pyarrow``, ``duckdb``)
- ``parameters``: the options, sizes in bytes

``queries`` adds ``generation``, ``load``, ``queries``, ``totals``, ``compaction``,
``s3_requests``; ``rewrite`` adds ``input``, ``floor``, ``compactor``, ``fraction_of_floor``.
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


def rewrite_markdown(report: dict[str, Any]) -> str:
    """report.md of ``bench rewrite``."""
    inp, floor, comp = report["input"], report["floor"], report["compactor"]
    header = ["", "seconds", "MB/s", "MB/s per core", "CPU busy", "peak RSS (MB)", "output files"]
    rows = [
        [
            name,
            _num(r["seconds"], 2),
            _num(r["mb_per_s"], 1),
            _num(r["mb_per_s_per_core"], 1),
            _num(r["cpu_seconds"] / r["seconds"] if r["seconds"] else None, 2, " cores"),
            _mb(r["peak_rss_bytes"]),
            f"{r['output_files']} (avg {_mb(r['output_bytes'] / max(r['output_files'], 1))} MB)",
        ]
        for name, r in (("raw pyarrow floor", floor), ("compactor", comp))
    ]
    lines = [
        "# Rewrite throughput: compactor against a raw pyarrow floor",
        "",
        *_machine_lines(report),
        f"Input: `{inp['table']}`, {inp['files']:,} files, {_mb(inp['bytes'])} MB, "
        f"{inp['rows']:,} rows, target {report['parameters']['target_file_size']}.",
        "",
        *_table(header, rows),
        f"compactor runs at **{report['fraction_of_floor']:.0%}** of the floor. Each phase runs "
        "in a fresh process; peak RSS is that process's high-water mark (baseline after imports: "
        f"floor {_mb(floor['baseline_rss_bytes'])} MB, compactor {_mb(comp['baseline_rss_bytes'])} MB).",
    ]
    return "\n".join(lines) + "\n"


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
    p = report["parameters"]
    ax.set_title(
        f"TPC-DS SF {p['scale_factor']} in DuckDB: before and after compaction "
        f"(total {_num(report['totals']['speedup'], 2, 'x')})"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(report: dict[str, Any], out: Path) -> list[Path]:
    """Write report.json, report.md (and chart.png for queries) into ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    if report["benchmark"] == "queries":
        paths[1].write_text(queries_markdown(report))
        paths.append(out / "chart.png")
        queries_chart(report, paths[2])
    else:
        paths[1].write_text(rewrite_markdown(report))
    return paths
