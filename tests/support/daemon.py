"""A ``compactor daemon`` subprocess followed event by event, and the set-up it runs in.

A plugin: a test module that uses the ``setup`` fixture names it in ``pytest_plugins``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.catalog.sql import SqlCatalog

from support import REPOSITORY

COMPACTOR = Path(sys.executable).parent / "compactor"
CATALOG = "default"  # the name the catalog fixture gives its tables
# A job compacting every table of ``db`` each second, as soon as two files are small.
COMPACT_EVERY_SECOND = """
tables = ["db.*"]

[compact]
every = "1s"
min_small_files = 2
min_input_files = 2
cooldown = "0s"
"""
# Bounds for a broken run only: every wait ends on an event the daemon logs.
EVENT_TIMEOUT_S = 120
EXIT_TIMEOUT_S = 120


class DaemonProcess:
    """A ``compactor daemon`` subprocess and its log, one parsed JSON event at a time."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.started = self.wait_for(lambda e: e.get("event") == "daemon_started", "start")
        self.url = self.started["url"]

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            if line.startswith("{"):
                self._events.put(json.loads(line))
        self._events.put(None)

    def wait_for(self, wanted: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The next logged event for which ``wanted`` is true (earlier ones are passed over)."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} within {EVENT_TIMEOUT_S}s:\n{''.join(self.lines)}")
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                continue
            if event is None:
                raise AssertionError(f"daemon ended before {what}:\n{''.join(self.lines)}")
            if wanted(event):
                return event

    def run_finished(self, table: str, action: str = "compact", committed: bool = False) -> dict:
        """The next finished run of ``action`` on ``table`` (that committed, if asked)."""

        def wanted(event: dict[str, Any]) -> bool:
            return (
                event.get("event") == "run_finished"
                and event["table"] == table
                and event["action"] == action
                and (not committed or bool(event["snapshot_ids"]))
            )

        return self.wait_for(wanted, f"a {action} run on {table}")

    def terminate(self) -> int:
        """SIGTERM, then the exit code (the daemon drains first)."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=EXIT_TIMEOUT_S)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """``/metrics``, parsed: (sample name, sorted labels) -> value."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


class Setup:
    """A catalog, a job directory and the environment a daemon subprocess needs."""

    def __init__(self, tmp_path: Path, catalog: SqlCatalog) -> None:
        self.started: list[DaemonProcess] = []
        self.root = tmp_path
        self.catalog = catalog
        self.jobs = tmp_path / "jobs"
        self.jobs.mkdir()
        self.state = tmp_path / "state.db"
        (tmp_path / "compactor.toml").write_text(
            "[daemon]\n"
            f'catalog = "{CATALOG}"\n'
            'state = "state.db"\n'
            'listen = "127.0.0.1:0"\n'
            'log_format = "json"\n'
            "max_concurrent_runs = 2\n"
            'backoff_initial = "1s"\n'  # a run a killed daemon left open counts as a failure
        )
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("PYICEBERG_", "COMPACTOR_"))
        }
        prefix = f"PYICEBERG_CATALOG__{CATALOG.upper()}__"
        env.update(
            {
                prefix + "TYPE": "sql",
                prefix + "URI": catalog.properties["uri"],
                prefix + "WAREHOUSE": catalog.properties["warehouse"],
                "HOME": str(tmp_path),
                "COMPACTOR_HOME": str(tmp_path / "home"),
            }
        )
        root = str(REPOSITORY)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.env = env

    def job(self, name: str, text: str) -> None:
        (self.jobs / f"{name}.toml").write_text(text)

    def start(self, *prefix: str) -> DaemonProcess:
        """``compactor daemon --config compactor.toml``, optionally through a wrapper command."""
        command = [*prefix] if prefix else [str(COMPACTOR)]
        daemon = DaemonProcess(
            [*command, "daemon", "--config", "compactor.toml"], self.env, self.root
        )
        self.started.append(daemon)
        return daemon

    def runs(self) -> list[dict[str, Any]]:
        with sqlite3.connect(self.state) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute("SELECT * FROM runs ORDER BY id")]

    def cli(self, *args: str) -> str:
        """What ``compactor ARGS`` prints on stdout, in the daemon's directory and environment."""
        process = subprocess.run(
            [str(COMPACTOR), *args],
            cwd=self.root,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=EXIT_TIMEOUT_S,
            check=False,
        )
        assert process.returncode == 0, process.stderr
        return process.stdout

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(
            self.cli("status", "--config", "compactor.toml", "--json")
        )
        return result


@pytest.fixture
def setup(tmp_path: Path, catalog: SqlCatalog) -> Iterator[Setup]:
    """The test's set-up; a daemon a failed test left running is killed afterwards."""
    prepared = Setup(tmp_path, catalog)
    yield prepared
    for daemon in prepared.started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
