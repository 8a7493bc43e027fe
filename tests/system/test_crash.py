"""Crash safety of ``compactor run``: killed at any point, a run never changes the table's rows,
and the next run removes every file the killed one left behind.

Each trial runs the real CLI in a subprocess through ``crash_runner.py``, which makes the process
send itself a signal on the N-th call of one function (see its docstring for the points). After
a SIGKILL the table must read the same rows, every unreferenced file must be listed in the run
record the killed run left or in its tasks' intent files (or be one of those), and a normal run
must then succeed, report the files it recovered and leave no unreferenced file, no intent file
and no run record. SIGTERM must stop the run cleanly, a second
Ctrl-C after the commit landed must not delete what the table now references, and a run must
back off while another live process holds the table's run record.

No sleeps: the lease holder reports on stdout once it holds the lease, and the hook of a
graceful signal waits until the CLI has taken it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from compactor.bench.sample import create_events_table
from compactor.commit.inflight import RunRecord, read_record, record_paths, recorded_files
from compactor.iceberg.catalogs import embedded_catalog
from compactor.iceberg.references import table_references

from support import crash_runner
from support.cli import cli_env, isolate
from support.crash_runner import HOOK_MESSAGE
from support.json_output import assert_documented
from support.rows import assert_same_rows, scan_rows
from support.tables import local_path, unreferenced_files

pytestmark = pytest.mark.slow  # left out by `make test-quick`

RUNNER = Path(crash_runner.__file__)
COMPACTOR = Path(sys.executable).parent / "compactor"
TABLE = "db.events"
# 2 days x 4 regions = 8 partitions, each with 5 input files of ~750 rows (~15 KB). At a 32 KiB
# target every partition is one group rewritten into 2 output files (~3100 + ~600 rows): the
# writer's row groups are at least 256 KiB in memory once it has learnt the compression ratio,
# so a group needs a few thousand rows to roll over to a second file.
COMMITS, ROWS_PER_COMMIT, DAYS = 5, 6000, 2
GROUPS = 2 * 4
RUN = (
    "run",
    "--table",
    TABLE,
    "--target-file-size",
    "32KiB",
    "--allow-small-target",
    "--min-input-files",
    "2",
    "--json",
)
TIMEOUT_S = 300


# --- environment, tables and runs ---------------------------------------------------------


@pytest.fixture(autouse=True)
def _isolated_pyiceberg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In-process pyiceberg reads no user configuration; the embedded catalog is the test's."""
    isolate(monkeypatch, tmp_path)


def _run(home: Path, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
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


def compactor(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``compactor`` script, as a user runs it."""
    return _run(home, [str(COMPACTOR), *args])


def crashing(
    home: Path, point: str, n: int, signals: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``compactor ARGS`` under crash_runner's hook; returns the outcome and the process id.

    ``signals``: what the hook sends on the ``n``-th call of ``point``'s function, e.g.
    ``SIGKILL`` or ``SIGINT,SIGINT``.
    """
    command = [sys.executable, str(RUNNER), point, str(n), signals, "--", *args]
    with subprocess.Popen(
        command,
        cwd=home,
        env=cli_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), process.pid


def describe(process: subprocess.CompletedProcess[str]) -> str:
    return f"exit {process.returncode}\nstdout:\n{process.stdout}\nstderr:\n{process.stderr}"


def make_table(home: Path) -> tuple[SqlCatalog, Table]:
    """``db.events`` in the embedded catalog under ``home`` (the test's COMPACTOR_HOME)."""
    catalog = embedded_catalog()
    assert Path(catalog.properties["warehouse"].removeprefix("file://")).is_relative_to(home)
    table = create_events_table(
        catalog, TABLE, commits=COMMITS, rows_per_commit=ROWS_PER_COMMIT, days=DAYS
    )
    return catalog, table


def rows(table: Table) -> pa.Table:
    """The table's rows, timestamps as their exact microsecond counts.

    The cast is lossless and makes :func:`assert_same_rows` about ten times faster.
    """
    data = scan_rows(table)
    for index, column in enumerate(data.schema):
        if pa.types.is_timestamp(column.type):
            data = data.set_column(index, column.name, data.column(index).cast(pa.int64()))
    return data


def record_files_present(table: Table) -> list[str]:
    return [p for p in record_paths(table) if local_path(p).exists()]


def intent_files_present(table: Table) -> list[str]:
    return sorted(
        str(p) for p in local_path(table.metadata.location).glob("metadata/compactor-intent-*")
    )


def torn_slots(table: Table, paths: list[str] | None = None) -> list[str]:
    """Slots of the run record (or the given files) that exist but do not parse."""
    torn = []
    for path in record_files_present(table) if paths is None else paths:
        try:
            json.loads(local_path(path).read_bytes())
        except ValueError:
            torn.append(path)
    return torn


def is_partial_parquet(path: Path) -> bool:
    """A Parquet file cut short: it has data but not the footer that ends with ``PAR1``."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    data = path.read_bytes()
    return data.startswith(b"PAR1") and not data.endswith(b"PAR1")


def assert_fully_compacted(table: Table) -> None:
    """Every input file was rewritten: each live data file is one of compactor's."""
    files = table.inspect.files().to_pylist()
    assert files
    inputs = [
        f["file_path"] for f in files if not Path(f["file_path"]).name.startswith("compactor-")
    ]
    assert inputs == [], f"{len(inputs)} input files were never compacted, e.g. {inputs[0]}"


# --- SIGKILL at every point -----------------------------------------------------------------

# Points at which the killed run has, for certain, created files that no snapshot references.
LEAVES_FILES = {"open", "write", "close", "manifest-list", "commit"}

# (point, n, commit_every): n counts calls of the point's function across the run's threads.
# Output files: 8 groups x 2 = 16; commits: 1, or 4 with --commit-every 2 (from the second on,
# a kill leaves earlier commits behind). Record writes: 1 at acquire (tearing it leaves no intact
# slot), then one per metadata file of a commit before it is created: 2 (one commit) is the
# commit's first manifest once every output file is written, 10 (four commits, 24 record writes)
# one of a later commit's. Intent writes: one per output file before it is created: 1 is the
# first output file (tearing the first write of an attempt leaves it no intact slot), 11 one
# late in the run.
TRIALS = [
    ("open", 1, 0),
    ("open", 11, 2),
    ("write", 1, 0),
    ("write", 5, 2),
    ("close", 1, 0),
    ("close", 6, 2),
    ("close", 16, 0),
    ("manifest-list", 1, 0),
    ("manifest-list", 1, 2),
    ("manifest-list", 3, 2),
    ("commit", 1, 0),
    ("commit", 1, 2),
    ("commit", 4, 2),
    ("committed", 1, 0),
    ("committed", 1, 2),
    ("committed", 3, 2),
    ("record", 1, 0),
    ("record", 2, 0),
    ("record", 10, 2),
    ("intent", 1, 0),
    ("intent", 11, 2),
]


@pytest.mark.parametrize(
    ("point", "n", "commit_every"),
    TRIALS,
    ids=[f"{point}-{n}-every{every}" for point, n, every in TRIALS],
)
def test_killed_run_changes_no_rows_and_next_run_cleans_up(
    tmp_path: Path, point: str, n: int, commit_every: int
) -> None:
    catalog, table = make_table(tmp_path)
    before = rows(table)
    args = (*RUN, "--parallelism", "2", "--commit-every", str(commit_every))

    killed, pid = crashing(tmp_path, point, n, "SIGKILL", *args)
    assert killed.returncode == -signal.SIGKILL, describe(killed)
    assert HOOK_MESSAGE.format(point=point, n=n, signal="SIGKILL") in killed.stderr

    table = catalog.load_table(TABLE)
    assert_same_rows(before, rows(table))
    record = read_record(table)
    assert record is not None, "the killed run left no run record"
    if point == "record":
        assert torn_slots(table), "the hook did not tear a slot of the run record"
    if point == "intent":
        assert torn_slots(table, intent_files_present(table)), "no intent file slot was torn"
    if record.run_id != "unknown":  # only when the first write of the record was torn
        assert record.pid == pid
    referenced = table_references(table).all()
    files, intents = recorded_files(table, record)
    leftovers = [p for p in files if p not in referenced]
    # A file is recorded before it is created: whatever the killed run left is in its record
    # or in its intent files (or is one of those).
    tracked = {str(local_path(p)) for p in [*files, *intents]}
    untracked = set(unreferenced_files(table)) - tracked
    assert not untracked, f"files left behind but not in the run record: {sorted(untracked)}"
    if point in LEAVES_FILES:
        assert any(local_path(p).exists() for p in leftovers), "killed run left no files"
    if point == "write":
        assert any(is_partial_parquet(local_path(p)) for p in leftovers), "no half-written file"

    recovery = compactor(tmp_path, *args)
    assert recovery.returncode == 0, describe(recovery)
    summary = json.loads(recovery.stdout)
    assert summary["backed_off"] is None, summary
    assert summary["recovered_files"] == len(leftovers), summary
    if point in LEAVES_FILES:
        assert summary["recovered_files"] > 0
    assert summary["failed_groups"] == []

    table = catalog.load_table(TABLE)
    assert_same_rows(before, rows(table))
    assert unreferenced_files(table) == []
    assert record_files_present(table) == []
    assert intent_files_present(table) == []
    assert not any(local_path(p).exists() for p in leftovers)
    assert_fully_compacted(table)


# --- SIGTERM: a clean stop ------------------------------------------------------------------


def test_sigterm_commits_finished_groups_and_cleans_up(tmp_path: Path) -> None:
    catalog, table = make_table(tmp_path)
    before = rows(table)
    snapshots = len(table.metadata.snapshots)
    # One group at a time: closes 1 and 2 finish group 0; close 3 is group 1's first file.
    args = (*RUN, "--parallelism", "1")

    stopped, _ = crashing(tmp_path, "close", 3, "SIGTERM", *args)
    assert stopped.returncode == 0, describe(stopped)
    assert HOOK_MESSAGE.format(point="close", n=3, signal="SIGTERM") in stopped.stderr
    summary = json.loads(stopped.stdout)
    assert summary["stopped"] is True
    assert summary["groups"] == GROUPS
    committed = summary["committed_groups"]
    assert committed >= 1
    failed = summary["failed_groups"]
    assert failed, "every group finished: the stop came too late to cancel any"
    assert {f["kind"] for f in failed} == {"cancelled"}, failed
    # Groups run in plan order: those before the signal are committed, the others cancelled.
    assert [f["group_id"] for f in failed] == list(range(committed, GROUPS))
    assert len(summary["snapshot_ids"]) == 1
    assert summary["recovered_files"] == 0

    table = catalog.load_table(TABLE)
    assert len(table.metadata.snapshots) == snapshots + 1
    assert_same_rows(before, rows(table))
    assert unreferenced_files(table) == []
    assert record_files_present(table) == []


def test_second_interrupt_after_the_commit_landed_keeps_its_files(tmp_path: Path) -> None:
    """Ctrl-C twice, the second while the catalog commit returns: the snapshot has landed, so
    neither its manifests nor its data files may be deleted as the run unwinds."""
    catalog, table = make_table(tmp_path)
    before = rows(table)
    snapshots = len(table.metadata.snapshots)
    args = (*RUN, "--parallelism", "2")

    interrupted, _ = crashing(tmp_path, "committed", 1, "SIGINT,SIGINT", *args)
    assert interrupted.returncode == 130, describe(interrupted)
    assert HOOK_MESSAGE.format(point="committed", n=1, signal="SIGINT,SIGINT") in (
        interrupted.stderr
    )
    table = catalog.load_table(TABLE)
    assert len(table.metadata.snapshots) == snapshots + 1
    assert_same_rows(before, rows(table))
    assert_fully_compacted(table)
    # The commit's outcome was in doubt as the run unwound: its record and its tasks' intent
    # files stay, for the next run to settle; nothing else is unreferenced.
    assert record_files_present(table)
    assert intent_files_present(table)
    assert unreferenced_files(table) == intent_files_present(table)

    recovery = compactor(tmp_path, *args)
    assert recovery.returncode == 0, describe(recovery)
    summary = json.loads(recovery.stdout)
    assert summary["recovered_files"] == 0
    table = catalog.load_table(TABLE)
    assert_same_rows(before, rows(table))
    assert unreferenced_files(table) == []
    assert record_files_present(table) == []
    assert intent_files_present(table) == []


# --- a live run holds the table ---------------------------------------------------------------

HOLDER = """
import sys
from compactor.iceberg.catalogs import embedded_catalog
from compactor.commit.inflight import RunLease

table = embedded_catalog().load_table(sys.argv[1])
lease = RunLease(table, "holder", ttl_s=600)
lease.acquire()
print("acquired", flush=True)
sys.stdin.read()
lease.release()
print("released", flush=True)
"""


@pytest.fixture
def lease_holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process holding ``db.events``'s run record until its stdin is closed."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, TABLE],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()


def table_files(table: Table) -> dict[str, int]:
    root = local_path(table.metadata.location)
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_run_backs_off_while_another_process_holds_the_table(
    tmp_path: Path, lease_holder: subprocess.Popen[str]
) -> None:
    catalog, table = make_table(tmp_path)
    before = rows(table)
    assert lease_holder.stdout is not None and lease_holder.stdin is not None
    assert lease_holder.stdout.readline().strip() == "acquired"
    held = read_record(table)
    assert isinstance(held, RunRecord) and held.pid == lease_holder.pid
    snapshots = [s.snapshot_id for s in table.metadata.snapshots]
    files = table_files(table)

    backed_off = compactor(tmp_path, *RUN)
    assert backed_off.returncode == 0, describe(backed_off)
    summary: dict[str, Any] = json.loads(backed_off.stdout)
    assert_documented("run", summary)  # the shape of every other run
    assert (summary["snapshot_id"], summary["committed_groups"]) == (None, 0)
    assert "backing off" in summary["backed_off"]
    assert str(lease_holder.pid) in summary["backed_off"]
    table = catalog.load_table(TABLE)
    assert [s.snapshot_id for s in table.metadata.snapshots] == snapshots
    assert table_files(table) == files
    assert unreferenced_files(table) == []
    assert read_record(table) == held

    lease_holder.stdin.close()
    assert lease_holder.stdout.readline().strip() == "released"
    assert lease_holder.wait(timeout=TIMEOUT_S) == 0

    ran = compactor(tmp_path, *RUN)
    assert ran.returncode == 0, describe(ran)
    summary = json.loads(ran.stdout)
    assert summary["snapshot_id"] is not None
    assert summary["committed_groups"] == GROUPS
    assert summary["recovered_files"] == 0
    table = catalog.load_table(TABLE)
    assert_same_rows(before, rows(table))
    assert unreferenced_files(table) == []
    assert record_files_present(table) == []
    assert_fully_compacted(table)
