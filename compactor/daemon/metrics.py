"""The daemon's Prometheus metrics and its HTTP endpoint (``/metrics``, ``/healthz``, and
whatever else a page handler answers: the dashboard)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Answers a GET of any other path (path with query, request headers): status, headers, body.
PageHandler = Callable[[str, Message], tuple[int, dict[str, str], bytes]]
# Run durations from a second to two hours.
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


class DaemonMetrics:
    """Every metric the daemon exports, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.runs = Counter(
            "compactor_runs",
            "Finished runs by action and outcome.",
            ["action", "outcome"],
            registry=r,
        )
        self.rewritten_files = Counter(
            "compactor_rewritten_files", "Data files removed by committed compactions.", registry=r
        )
        self.rewritten_bytes = Counter(
            "compactor_rewritten_bytes", "Bytes of data files removed by compactions.", registry=r
        )
        self.added_files = Counter(
            "compactor_added_files", "Data files written by committed compactions.", registry=r
        )
        self.deleted_files = Counter(
            "compactor_deleted_files",
            "Files deleted by expiry and orphan removal.",
            ["action"],
            registry=r,
        )
        self.deleted_bytes = Counter(
            "compactor_deleted_bytes",
            "Bytes deleted by expiry and orphan removal.",
            ["action"],
            registry=r,
        )
        self.commit_conflicts = Counter(
            "compactor_commit_conflicts",
            "File groups refused at commit because a concurrent commit touched their files.",
            registry=r,
        )
        self.grown_groups = Counter(
            "compactor_grown_groups",
            "File groups rewritten but not committed: their output was larger than their input "
            "and the rewrite gained nothing else.",
            registry=r,
        )
        self.duration = Histogram(
            "compactor_run_duration_seconds",
            "Run duration by action.",
            ["action"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.small_files = Gauge(
            "compactor_table_small_files",
            "Small files a compaction would merge, per table, at the last scan.",
            ["table"],
            registry=r,
        )
        self.small_bytes = Gauge(
            "compactor_table_small_bytes",
            "Bytes of those small files, per table, at the last scan.",
            ["table"],
            registry=r,
        )
        self.data_files = Gauge(
            "compactor_table_data_files",
            "Data files per table at the last scan.",
            ["table"],
            registry=r,
        )
        self.delete_files = Gauge(
            "compactor_table_delete_files",
            "Delete files per table at the last scan.",
            ["table"],
            registry=r,
        )
        self.commits_in_doubt = Gauge(
            "compactor_table_commits_in_doubt",
            "Commits whose outcome the catalog did not tell, per table, at the last compaction "
            "or delete rewrite: their files are kept until each has landed or can no longer "
            "land.",
            ["table"],
            registry=r,
        )
        self.quarantined_files = Gauge(
            "compactor_table_quarantined_files",
            "Files of the table's quarantine at its last compaction: found unreadable, left as "
            "they are and out of compaction until their bytes change or they are cleared.",
            ["table"],
            registry=r,
        )
        self.queue_length = Gauge("compactor_queue_length", "Runs waiting to start.", registry=r)
        self.running = Gauge("compactor_running_runs", "Runs in progress.", registry=r)
        self.scan_errors = Counter(
            "compactor_scan_errors", "Tables that could not be scored.", registry=r
        )
        self.tick_failures = Counter(
            "compactor_job_tick_failures",
            "Failed ticks by job and action: catalog unreachable, a named table missing, or a "
            "table that could not be scored.",
            ["job", "action"],
            registry=r,
        )
        self.consecutive_tick_failures = Gauge(
            "compactor_job_consecutive_tick_failures",
            "Ticks failed in a row by job and action; 0 after a tick that succeeded.",
            ["job", "action"],
            registry=r,
        )
        self.manifests = Gauge(
            "compactor_table_manifests",
            "Manifests of the current snapshot per table and content (data, deletes), at the "
            "last manifest check or rewrite.",
            ["table", "content"],
            registry=r,
        )
        self.manifest_entries = Gauge(
            "compactor_table_average_manifest_entries",
            "Live entries per manifest per table, at the last manifest check or rewrite.",
            ["table"],
            registry=r,
        )
        self.metadata_files = Gauge(
            "compactor_table_metadata_files",
            "metadata.json files a table lists (the current one and its log), at the last "
            "manifest check or rewrite.",
            ["table"],
            registry=r,
        )
        self.rewritten_manifests = Counter(
            "compactor_rewritten_manifests",
            "Manifests replaced by committed manifest rewrites.",
            registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, self.server.metrics.exposition())
        elif path == "/healthz":
            status, details = self.server.health()
            body = json.dumps({"status": status, **details}).encode()
            self._send(200 if status == "ok" else 503, "application/json", body)
        elif self.server.pages is not None:
            code, headers, body = self.server.pages(self.path, self.headers)
            self._send(code, headers.pop("Content-Type"), body, headers)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

    def _send(
        self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line
        return


class MetricsServer(ThreadingHTTPServer):
    """``/metrics`` in Prometheus' text format; ``/healthz``: 200 ``ok`` while running, 503
    ``degraded`` (some job keeps failing) or ``draining``; other paths to ``pages``, if given."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        metrics: DaemonMetrics,
        health: Callable[[], tuple[str, dict[str, Any]]],
        pages: PageHandler | None = None,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.metrics = metrics
        self.health = health
        self.pages = pages
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]  # as bound: port 0 is the one assigned
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
