"""Crash safety of ``compactor rewrite-manifests``: killed at any point, the table reads the same
rows, every file left behind is listed in the run record, and the next run cleans up.

Each trial runs the real CLI through ``crash_runner.py`` (see its docstring for the points),
which sends the process SIGKILL on the first call of one function.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compactor.bench.sample import create_events_table
from compactor.commit.inflight import read_record, recorded_files
from compactor.iceberg.catalogs import embedded_catalog

from support import crash_runner
from support.cli import cli_env, isolate
from support.crash_runner import HOOK_MESSAGE
from support.rows import assert_same_rows, scan_rows
from support.tables import unreferenced_files

pytestmark = pytest.mark.slow  # left out by `make test-quick`

RUNNER = Path(crash_runner.__file__)
COMPACTOR = Path(sys.executable).parent / "compactor"
TABLE = "db.events"
REWRITE = ("rewrite-manifests", "--table", TABLE, "--json")
TIMEOUT_S = 300


def _run(home: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command),
        cwd=home,
        env=cli_env(home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("point", ["manifest-list", "commit", "committed", "record"])
def test_a_killed_rewrite_leaves_the_rows_and_the_next_run_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    isolate(monkeypatch, tmp_path)
    catalog = embedded_catalog()
    table = create_events_table(catalog, TABLE, commits=10, rows_per_commit=200, days=2)
    before = scan_rows(table)
    # The record is written when the lease is taken: its second write records the manifests.
    n = 2 if point == "record" else 1

    killed = _run(tmp_path, sys.executable, str(RUNNER), point, str(n), "SIGKILL", "--", *REWRITE)

    assert killed.returncode == -9, killed.stderr
    assert HOOK_MESSAGE.format(point=point, n=n, signal="SIGKILL") in killed.stderr
    table = catalog.load_table(TABLE)
    assert_same_rows(before, scan_rows(table))
    record = read_record(table)
    assert record is not None
    listed, _ = recorded_files(table, record)
    left = unreferenced_files(table)
    assert set(left) <= {p.removeprefix("file://") for p in listed}, left

    again = _run(tmp_path, str(COMPACTOR), *REWRITE)

    assert again.returncode == 0, again.stderr
    document = json.loads(again.stdout)
    table = catalog.load_table(TABLE)
    assert document["manifests_after"]["data"] == 1
    assert_same_rows(before, scan_rows(table))
    assert unreferenced_files(table) == [] and read_record(table) is None
