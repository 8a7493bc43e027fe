"""The ``compactor`` console script, run as a subprocess against real catalogs and warehouses.

Every run gets its own environment: ``COMPACTOR_HOME``, ``HOME`` and ``PYICEBERG_HOME`` point at
the test's directory (so no user configuration leaks in), no stdin, and no terminal.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyiceberg.catalog
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.utils.config import Config

from compactor import __version__, api
from compactor.bench.sample import REGIONS, create_events_table
from compactor.commit.inflight import read_record
from compactor.errors import CommitStateUnknownError
from compactor.sizes import format_size

from support.catalog_servers import free_port
from support.cli import assert_one_error_line, compactor, embedded, isolate
from support.deletes import commit_delete_files, write_position_delete_file
from support.json_output import assert_documented
from support.rows import assert_same_rows, scan_rows
from support.runs import assert_dry_run_predicts
from support.tables import live_data_files, live_delete_files, unreferenced_files

TABLE = "db.events"
COMMITS, ROWS_PER_COMMIT, DAYS = 8, 500, 3
# Every commit writes one file into each (day, region) partition.
PARTITIONS = [
    f"ts_day=2026-01-0{day}/region={region}" for day in range(1, DAYS + 1) for region in REGIONS
]
DATA_FILES = COMMITS * len(PARTITIONS)
# A target small enough for the sample table's kilobyte-sized files to be worth compacting.
SMALL_TARGET = ("--target-file-size", "1MiB", "--allow-small-target", "--min-input-files", "2")

# --- running the CLI -----------------------------------------------------------------------


def run_table(
    home: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``compactor run --table db.events ARGS``."""
    return compactor(home, "run", "--table", TABLE, *args, env=env)


# --- catalogs, tables and files --------------------------------------------------------------


@pytest.fixture(autouse=True)
def _isolated_pyiceberg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In-process pyiceberg must not read the user's configuration either."""
    isolate(monkeypatch, tmp_path)


def make_events_table(home: Path) -> Path:
    create_events_table(
        embedded(home), TABLE, commits=COMMITS, rows_per_commit=ROWS_PER_COMMIT, days=DAYS
    )
    return home


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A COMPACTOR_HOME of this test alone, holding ``db.events`` in 96 small files."""
    return make_events_table(tmp_path)


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``db.events`` for the tests whose runs must change nothing (each checks that)."""
    path = tmp_path_factory.mktemp("shared")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(path))
        mp.setenv("PYICEBERG_HOME", str(path))
        return make_events_table(path)


def load(home: Path) -> Table:
    return embedded(home).load_table(TABLE)


def snapshot_ids(table: Table) -> list[int]:
    return [s.snapshot_id for s in table.metadata.snapshots]


def data_files(table: Table) -> list[tuple[Path, int]]:
    """Local path and size of every live data file."""
    files = table.inspect.files().to_pylist()
    return [(Path(urlparse(f["file_path"]).path), f["file_size_in_bytes"]) for f in files]


def listing(root: Path) -> dict[str, int]:
    """Every file under ``root`` with its size."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def assert_replace_snapshot(table: Table, snapshot_id: int, parent_id: int) -> None:
    current = table.current_snapshot()
    assert current is not None
    assert current.snapshot_id == snapshot_id
    assert current.parent_snapshot_id == parent_id
    assert current.summary is not None
    assert current.summary.operation == Operation.REPLACE


class Untouched:
    """Records a table's snapshots and its warehouse; ``check`` asserts neither changed."""

    def __init__(self, home: Path) -> None:
        self.home, self.warehouse = home, home / "warehouse"
        self.snapshots = snapshot_ids(load(home))
        self.files = listing(self.warehouse)

    def check(self) -> None:
        assert snapshot_ids(load(self.home)) == self.snapshots
        assert listing(self.warehouse) == self.files


# --- run -------------------------------------------------------------------------------------


def test_run_json_commits_one_replace_snapshot_then_finds_nothing_to_do(home: Path) -> None:
    start = load(home)
    start_id = start.metadata.current_snapshot_id
    assert start_id is not None
    input_bytes = sum(size for _, size in data_files(start))

    result = run_table(home, *SMALL_TARGET, "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["table"] == TABLE
    assert type(report["snapshot_id"]) is int
    assert report["groups"] == len(PARTITIONS)
    assert report["rewritten_files"] == DATA_FILES
    assert report["rewritten_bytes"] == input_bytes
    assert 0 < report["added_files"] < report["rewritten_files"]
    assert report["added_bytes"] > 0
    assert isinstance(report["duration_ms"], int) and report["duration_ms"] >= 0
    table = load(home)
    assert_replace_snapshot(table, report["snapshot_id"], start_id)
    assert len(data_files(table)) == report["added_files"]
    assert sum(size for _, size in data_files(table)) == report["added_bytes"]

    again = run_table(home, *SMALL_TARGET, "--json")

    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["snapshot_id"] is None
    assert snapshot_ids(load(home)) == snapshot_ids(table)


def test_dry_run_prints_the_plan_and_writes_nothing_then_run_names_its_snapshot(
    home: Path,
) -> None:
    before = Untouched(home)
    input_bytes = sum(size for _, size in data_files(load(home)))

    dry = run_table(home, *SMALL_TARGET, "--dry-run")

    assert dry.returncode == 0, dry.stderr
    assert dry.stderr == ""
    for heading in ("group", "partition", "input files", "input bytes", "expected outputs"):
        assert heading in dry.stdout
    for partition in PARTITIONS:
        assert partition in dry.stdout
    totals = f"{DATA_FILES} files ({format_size(input_bytes)}) in {len(PARTITIONS)} groups"
    assert totals in dry.stdout
    before.check()

    result = run_table(home, *SMALL_TARGET)

    assert result.returncode == 0, result.stderr
    table = load(home)
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id not in before.snapshots
    assert_replace_snapshot(table, current.snapshot_id, before.snapshots[-1])
    assert f"snapshot {current.snapshot_id}" in result.stdout
    assert not result.stdout.lstrip().startswith("{")


# --- inspect ---------------------------------------------------------------------------------


def test_inspect_reports_file_layout_as_json_and_as_a_table(shared_home: Path) -> None:
    files = data_files(load(shared_home))
    data_bytes = sum(size for _, size in files)

    result = compactor(shared_home, "inspect", "--table", TABLE, "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["data_files"] == len(files) == DATA_FILES
    assert report["data_bytes"] == data_bytes
    assert report["average_file_size"] == round(data_bytes / len(files))
    assert report["small_files"] == DATA_FILES  # kilobytes each, against the default 512 MiB

    # The embedded catalog also answers to its name, as error messages call it.
    human = compactor(shared_home, "inspect", "--table", TABLE, "--catalog", "default")

    assert human.returncode == 0, human.stderr
    rows = {line.split("│")[1].strip(): line for line in human.stdout.splitlines() if "│" in line}
    assert str(DATA_FILES) in rows["data files"]
    assert format_size(data_bytes) in rows["data bytes"]
    assert "average file size" in rows
    assert any(name.startswith("small files") for name in rows)
    for partition in sorted(PARTITIONS)[:10]:  # most small files first, then by name
        assert partition in rows


# --- bad input -------------------------------------------------------------------------------

RUN = ("run", "--table", TABLE)
USAGE_ERRORS = {
    "unknown catalog": ((*RUN, *SMALL_TARGET, "--catalog", "nope"), ("'nope'",)),
    "unknown namespace": (
        ("run", "--table", "nope.events", *SMALL_TARGET),
        ("nope.events", "namespace 'nope'"),
    ),
    "unknown table": (("run", "--table", "db.nope", *SMALL_TARGET), ("db.nope",)),
    "malformed filter": (
        (*RUN, *SMALL_TARGET, "--where", "event_id >>> 3"),
        ("--where", "event_id >>> 3"),
    ),
    "filter on an unknown column": (
        (*RUN, *SMALL_TARGET, "--where", "nope = 3"),
        ("--where", "nope"),
    ),
    "target below the minimum": (
        (*RUN, "--target-file-size", "1MB"),
        ("--target-file-size", "1MB", "--allow-small-target"),
    ),
    "target above the maximum": (
        (*RUN, "--target-file-size", "1GiB", "--allow-small-target"),
        ("--target-file-size", "1GiB"),
    ),
    "unparsable size": (
        (*RUN, "--target-file-size", "12 parsecs"),
        ("--target-file-size", "12 parsecs"),
    ),
    "unknown executor": ((*RUN, *SMALL_TARGET, "--executor", "spark"), ("--executor", "'spark'")),
    "ray address without the ray executor": (
        (*RUN, *SMALL_TARGET, "--ray-address", "ray://head:10001"),
        ("--ray-address", "--executor 'ray'"),
    ),
    "table without namespace": (("run", "--table", "events", *SMALL_TARGET), ("'events'",)),
    "inspect of an unknown table": (("inspect", "--table", "db.nope"), ("db.nope",)),
}


@pytest.mark.parametrize(("args", "culprits"), USAGE_ERRORS.values(), ids=USAGE_ERRORS.keys())
def test_bad_input_is_one_error_line_with_exit_code_2(
    shared_home: Path, args: tuple[str, ...], culprits: tuple[str, ...]
) -> None:
    before = Untouched(shared_home)

    result = compactor(shared_home, *args)

    assert_one_error_line(result, 2, *culprits)
    before.check()


def test_unreadable_pyiceberg_yaml_is_one_error_line_naming_the_file(
    shared_home: Path, tmp_path: Path
) -> None:
    config = tmp_path / ".pyiceberg.yaml"
    config.write_text("catalog:\n  lake:\n    type: sql\n   uri: sqlite:///x.db\n")
    before = Untouched(shared_home)

    result = run_table(shared_home, *SMALL_TARGET, env={"PYICEBERG_HOME": str(tmp_path)})

    assert_one_error_line(result, 2, str(config), "line 4")
    before.check()


@pytest.mark.parametrize("how", ["missing", "corrupt"])
def test_an_unreadable_data_file_is_quarantined_and_compacted_around_with_exit_0(
    home: Path, how: str
) -> None:
    start = load(home)
    bad, _ = data_files(start)[0]
    if how == "missing":
        bad.unlink()
    else:
        bad.write_bytes(b"this is not a parquet file\n" * 100)

    result = run_table(home, *SMALL_TARGET)

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # One log line naming the file and the cause; the result names it too.
    (warning,) = [line for line in result.stderr.splitlines() if str(bad) in line]
    assert warning.startswith("WARNING ") and "table db.events: group " in warning
    assert f"unreadable file file://{bad}: {how} data file: " in warning
    assert warning.endswith("; quarantined, rewriting the group without it")
    assert "committed replace snapshot" in result.stdout
    assert f"  quarantined, left as it is: file://{bad}: {how} data file: " in result.stdout
    after = load(home)
    assert_replace_snapshot(
        after, after.metadata.current_snapshot_id, start.metadata.current_snapshot_id
    )
    assert bad in dict(data_files(after))  # left as it is; every partition is compacted
    assert len(data_files(after)) == len(PARTITIONS) + 1
    inspected = json.loads(compactor(home, "inspect", "--table", TABLE, "--json").stdout)
    assert inspected["unreadable_files"] == [f"file://{bad}"]
    assert [f["path"] for f in inspected["quarantined_files"]] == [f"file://{bad}"]
    shown = compactor(home, "inspect", "--table", TABLE).stdout
    assert "quarantined file, left out of compaction since " in shown
    assert f"file://{bad}: {how} data file: " in shown


# --- catalogs configured the pyiceberg way ---------------------------------------------------


def assert_cli_compacts(home: Path, catalog: Catalog, name: str, env: Mapping[str, str]) -> None:
    create_events_table(catalog, TABLE, commits=3, rows_per_commit=200, days=DAYS)
    start_id = catalog.load_table(TABLE).metadata.current_snapshot_id
    assert start_id is not None

    result = run_table(home, "--catalog", name, *SMALL_TARGET, "--json", env=env)

    assert result.returncode == 0, result.stderr
    snapshot_id = json.loads(result.stdout)["snapshot_id"]
    assert type(snapshot_id) is int
    assert_replace_snapshot(catalog.load_table(TABLE), snapshot_id, start_id)
    assert not (home / "catalog.db").exists()  # the embedded catalog was never opened


def test_catalog_from_environment_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "PYICEBERG_CATALOG__LAKE__TYPE": "sql",
        "PYICEBERG_CATALOG__LAKE__URI": f"sqlite:///{tmp_path}/lake.db",
        "PYICEBERG_CATALOG__LAKE__WAREHOUSE": f"file://{tmp_path}/lakewh",
    }
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())  # read once, on import

    assert_cli_compacts(tmp_path, load_catalog("lake"), "lake", env)


def test_catalog_from_pyiceberg_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".pyiceberg.yaml").write_text(
        "catalog:\n"
        "  lake:\n"
        "    type: sql\n"
        f"    uri: sqlite:///{tmp_path}/lake.db\n"
        f"    warehouse: {(tmp_path / 'lakewh').as_uri()}\n"
    )
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())  # read once, on import

    assert_cli_compacts(tmp_path, load_catalog("lake"), "lake", {})


# --- help ------------------------------------------------------------------------------------


def test_help(tmp_path: Path) -> None:
    top = compactor(tmp_path, "--help")

    assert top.returncode == 0, top.stderr
    assert "run" in top.stdout and "inspect" in top.stdout

    run = compactor(tmp_path, "run", "--help")

    assert run.returncode == 0, run.stderr
    for option in ("--target-file-size", "--where", "--dry-run", "--json"):
        assert option in run.stdout

    version = compactor(tmp_path, "--version")

    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"compactor {__version__}"


def test_rewrite_deletes_compacts_the_position_deletes_of_files_left_alone(home: Path) -> None:
    table = load(home)
    first = next(iter(live_data_files(table).values())).partition
    files = sorted(
        (f for f in live_data_files(table).values() if f.partition == first),
        key=lambda f: f.file_path,
    )
    table = commit_delete_files(
        table,
        [
            write_position_delete_file(table, {files[0]: [0]}),
            write_position_delete_file(table, {files[1]: [1, 2]}),
        ],
    )
    before = scan_rows(table)

    result = compactor(home, "rewrite-deletes", "--table", TABLE, "--json")

    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert_documented("rewrite-deletes", data)
    assert (data["files_removed"], data["files_added"]) == (2, 1)
    assert data["delete_files_before"]["position"] == 2
    assert data["delete_files_after"]["position"] == 1
    table = load(home)
    assert len(live_delete_files(table)) == 1
    assert table.current_snapshot().summary.operation == Operation.REPLACE
    assert_same_rows(before, scan_rows(table))
    again = compactor(home, "rewrite-deletes", "--table", TABLE)
    assert again.returncode == 0, again.stderr
    assert "replaced 0 position delete files with 0" in again.stdout


def test_a_table_target_outside_the_range_warns_once_and_inspect_and_run_go_on(
    home: Path,
) -> None:
    table = load(home)
    with table.transaction() as transaction:
        transaction.set_properties({"write.target-file-size-bytes": "1024"})

    inspected = compactor(home, "inspect", "--table", TABLE, "--json")
    dry = run_table(home, "--dry-run", "--json")

    for result in (inspected, dry):
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines() == [
            f"warning: table {TABLE}: property write.target-file-size-bytes=1024 is outside "
            "64MB..512MiB; using 64MB (allow_small_target uses it as it is)"
        ]
    assert json.loads(inspected.stdout)["target_file_size"] == 64 * 10**6


def test_sort_and_zorder_runs_name_their_order_and_bad_orders_are_usage_errors(home: Path) -> None:
    before = Untouched(home)
    dry = run_table(
        home, *SMALL_TARGET, "--strategy", "zorder", "--zorder", "ts, user_id", "--dry-run"
    )
    assert dry.returncode == 0, dry.stderr
    assert "order: zorder(ts, user_id)" in dry.stdout

    for args, message in (
        (
            ("--strategy", "sort"),
            f"error: table {TABLE}: has no sort order: give one with --sort-order",
        ),
        (("--sort-order", "ts"), "error: --sort-order 'ts': is only used with --strategy 'sort'"),
        (
            ("--strategy", "sort", "--sort-order", "nope"),
            f"error: table {TABLE}: --sort-order: no column 'nope'",
        ),
    ):
        bad = run_table(home, *SMALL_TARGET, *args)
        assert bad.returncode == 2, bad.stderr
        assert bad.stderr.startswith(message) and bad.stderr.count("\n") == 1, bad.stderr
    before.check()

    result = run_table(
        home,
        *SMALL_TARGET,
        "--strategy",
        "sort",
        "--sort-order",
        "user_id DESC NULLS LAST",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["strategy"] == "sort"
    assert report["plan"]["order"] == "user_id DESC NULLS LAST"
    assert report["added_files"] > 0


def test_verbose_is_taken_after_the_command_too(shared_home: Path) -> None:
    quiet = compactor(shared_home, "inspect", "--table", "db.nope")
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    for args in (
        ("--verbose", "inspect", "--table", "db.nope"),
        ("inspect", "-t", "db.nope", "-v"),
    ):
        result = compactor(shared_home, *args)
        assert result.returncode == 2, result.stderr
        assert "Traceback (most recent call last)" in result.stderr, result.stderr[:500]
        assert result.stderr.splitlines()[-1].startswith("error: table db.nope: no such table")


def test_a_run_off_a_terminal_logs_progress_lines_on_stderr(home: Path) -> None:
    every_advance = {"COMPACTOR_PROGRESS_INTERVAL": "0"}
    result = run_table(home, *SMALL_TARGET, "--json", env=every_advance)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rewritten_files"] == DATA_FILES  # stdout: JSON alone
    lines = result.stderr.splitlines()
    assert lines and all(" progress db.events: " in line for line in lines), result.stderr
    assert f": {DATA_FILES} of {DATA_FILES} files, " in lines[-1]
    assert "(100%)" in lines[-1] and "/s" in lines[-1] and "left" not in lines[-1]

    bad = run_table(home, env={"COMPACTOR_PROGRESS_INTERVAL": "soon"})
    assert_one_error_line(bad, 2, "COMPACTOR_PROGRESS_INTERVAL='soon'")


# --- --json: one documented shape per command ------------------------------------------------


def json_of(home: Path, *args: str, code: int = 0) -> dict[str, Any]:
    """What ``compactor ARGS --json`` prints, after checking its exit code."""
    result = compactor(home, *args, "--json")
    assert result.returncode == code, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_every_json_output_has_the_documented_shape_whatever_happened(home: Path) -> None:
    """docs/json-output.md lists every field each command prints, with its type."""
    inspect = ("inspect", "--table", TABLE, *SMALL_TARGET[:3])
    before = json_of(home, *inspect)
    dry = json_of(home, *RUN, *SMALL_TARGET, "--dry-run")
    done = json_of(home, *RUN, *SMALL_TARGET)
    nothing = json_of(home, *RUN, *SMALL_TARGET)
    after = json_of(home, *inspect)
    for document in (dry, done, nothing):
        assert_documented("run", document)
    assert dry["snapshot_id"] is None and dry["groups"] == done["committed_groups"] > 0
    assert (nothing["snapshot_id"], nothing["groups"]) == (None, 0)
    for document in (before, after):
        assert_documented("inspect", document)
    assert before["small_files"] == DATA_FILES and after["small_files"] == 0
    assert after["files_under_target"] == after["data_files"] == len(PARTITIONS)

    expire = ("expire", "--table", TABLE, "--older-than", "0s", "--retain-last", "1")
    expire_dry = json_of(home, *expire, "--dry-run")
    expired = json_of(home, *expire)
    stray = Path(urlparse(load(home).metadata.location).path) / "data" / "stray.parquet"
    stray.write_bytes(b"not parquet")
    os.utime(stray, (0, 0))
    orphans = ("orphans", "--table", TABLE, "--older-than", "1d")
    orphans_dry = json_of(home, *orphans, "--dry-run")
    swept = json_of(home, *orphans)
    for command, dry_run, real in (
        ("expire", expire_dry, expired),
        ("orphans", orphans_dry, swept),
    ):
        assert_documented(command, dry_run)
        assert_documented(command, real)
        assert_dry_run_predicts(dry_run, real)
        assert real["files_deleted"] > 0
    assert [urlparse(p).path for p in swept["deleted_paths"]] == [str(stray)]

    failed = json_of(home, "run", "--table", "db.nope", code=2)
    assert set(failed) == {"error", "exit_code"} and "db.nope" in failed["error"]


@pytest.mark.parametrize("kind", ["rest", "postgresql", "sqlite", "glue"])
def test_an_unreachable_catalog_is_exit_1_whatever_its_type(tmp_path: Path, kind: str) -> None:
    port = free_port()
    properties = {
        "rest": {"URI": f"http://127.0.0.1:{port}"},
        "postgresql": {"URI": f"postgresql+psycopg2://u:p@127.0.0.1:{port}/lake"},
        "sqlite": {"URI": f"sqlite:///{tmp_path / 'no-such-dir' / 'catalog.db'}"},
        "glue": {"TYPE": "glue", "GLUE__ENDPOINT": f"http://127.0.0.1:{port}"},
    }[kind]
    env = {f"PYICEBERG_CATALOG__LAKE__{key}": value for key, value in properties.items()}
    env.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y", AWS_DEFAULT_REGION="us-east-1")

    result = compactor(tmp_path, "run", "--json", "--catalog", "lake", "--table", "db.t", env=env)
    assert_one_error_line(result, 1, "error: table db.t: catalog 'lake' is unreachable: ")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose server accepts no more connections: its only backlog slot is taken, so a
    client's connection attempt goes unanswered, as with a firewall that drops packets."""
    with socket.socket() as server, socket.socket() as first:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        first.connect(server.getsockname())
        yield server.getsockname()[1]


@pytest.mark.parametrize("kind", ["rest", "postgresql", "glue"])
def test_a_catalog_that_never_answers_is_reported_within_the_catalog_timeout(
    tmp_path: Path, silent_port: int, kind: str
) -> None:
    properties = {
        "rest": {"URI": f"http://127.0.0.1:{silent_port}"},
        "postgresql": {"URI": f"postgresql+psycopg2://u:p@127.0.0.1:{silent_port}/lake"},
        "glue": {"TYPE": "glue", "GLUE__ENDPOINT": f"http://127.0.0.1:{silent_port}"},
    }[kind]
    env = {f"PYICEBERG_CATALOG__LAKE__{key}": value for key, value in properties.items()}
    env.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y", AWS_DEFAULT_REGION="us-east-1")
    # Taken after the command, as --verbose is.
    args = ("inspect", "--catalog", "lake", "--table", "db.t", "--catalog-timeout", "1s")

    result = compactor(tmp_path, *args, env=env)

    assert_one_error_line(
        result,
        1,
        f"table db.t: catalog 'lake' is unreachable: 127.0.0.1:{silent_port}: no answer",
        "(--catalog-timeout 1s)",
    )


def test_a_catalog_timeout_that_is_not_a_duration_is_a_usage_error(tmp_path: Path) -> None:
    result = compactor(tmp_path, "--catalog-timeout", "soon", "inspect", "--table", "db.t")
    assert_one_error_line(result, 2, "--catalog-timeout", "'soon' is not a duration")


def test_a_missing_metadata_file_is_one_line_naming_the_table_and_the_file(home: Path) -> None:
    metadata = Path(urlparse(load(home).metadata_location).path)
    metadata.unlink()

    for args in (("inspect",), ("run", "--json")):
        result = compactor(home, *args, "--table", TABLE)
        line = assert_one_error_line(result, 1, f"table {TABLE}: its metadata file is missing")
        assert str(metadata) in line


def test_a_run_with_a_failed_group_prints_one_json_document_and_exits_1(home: Path) -> None:
    bad, _ = data_files(load(home))[0]
    bad.unlink()
    bad.mkdir()  # cannot be opened, and not for want of bytes: the group fails

    result = run_table(home, *SMALL_TARGET, "--commit-every", "1", "--json")

    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)  # the run's document alone, naming the failed group
    assert_documented("run", report)
    (failed,) = report["failed_groups"]
    assert failed["kind"] == "error" and str(bad) in failed["reason"]
    assert report["committed_groups"] == report["groups"] - 1
    assert result.stderr.splitlines()[-1].startswith("error: table db.events: 1 group failed")


def test_files_that_could_not_be_deleted_exit_1_with_one_json_document(home: Path) -> None:
    before = set(live_data_files(load(home)))
    assert run_table(home, *SMALL_TARGET).returncode == 0
    # One of the rewritten files, which expiring every older snapshot deletes, becomes a
    # directory: removing it fails as a refused delete on object storage would.
    stuck = Path(urlparse(sorted(before)[0]).path)
    stuck.unlink()
    stuck.mkdir()
    (stuck / "keep").write_text("x")

    result = compactor(
        home, "expire", "--table", TABLE, "--older-than", "0s", "--retain-last", "1", "--json"
    )

    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)  # one document: the report, listing the failure
    assert_documented("expire", document)
    assert document["failed"] == [sorted(before)[0]]
    assert document["deleted"]["data_files"]["files"] == len(before) - 1
    assert result.stderr.splitlines()[-1].startswith(f"error: table {TABLE}: could not delete ")


def test_groups_whose_rewrite_would_grow_are_named_and_left_as_they_were(tmp_path: Path) -> None:
    table = create_events_table(embedded(tmp_path), TABLE, commits=1, rows_per_commit=2000, days=1)
    with table.transaction() as transaction:  # rewriting zstd files uncompressed only grows them
        transaction.set_properties({"write.parquet.compression-codec": "uncompressed"})
    before = Untouched(tmp_path)

    result = run_table(tmp_path, "--rewrite-all")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{TABLE}: nothing compacted (no snapshot committed)"
    assert len(lines) == 1 + len(REGIONS), result.stdout
    assert all(" left as it was: its rewrite grew " in line for line in lines[1:])
    assert all(line.endswith("(1 -> 1 file)") for line in lines[1:]), result.stdout
    before.check()


def test_a_commit_in_doubt_is_shown_by_inspect_and_its_files_are_kept_by_rewrite_deletes(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog answered a run's commit with a 504 and did not apply it (yet)."""
    catalog = embedded(home)
    table = catalog.load_table(TABLE)

    def lost(*_: object) -> None:
        raise CommitStateUnknownException("504 Gateway Timeout")

    monkeypatch.setattr(catalog, "commit_table", lost)
    with pytest.raises(CommitStateUnknownError):
        api.compact(table, target_file_size="1MiB", allow_small_target=True, min_input_files=2)
    kept = unreferenced_files(load(home))
    (pending,) = read_record(load(home)).commits()

    inspected = compactor(home, "inspect", "--table", TABLE, "--json")
    assert inspected.returncode == 0, inspected.stderr
    document = json.loads(inspected.stdout)
    assert_documented("inspect", document)
    (shown,) = document["commits_in_doubt"]
    assert (shown["snapshot_id"], shown["run_id"]) == (pending.snapshot_id, pending.run_id)
    text = compactor(home, "inspect", "--table", TABLE).stdout
    assert f"commit in doubt: snapshot {pending.snapshot_id}" in text

    done = compactor(home, "rewrite-deletes", "--table", TABLE)
    assert done.returncode == 0, done.stderr
    assert f"kept the files of run {pending.run_id}" in done.stderr
    as_json = compactor(home, "rewrite-deletes", "--table", TABLE, "--json")
    document = json.loads(as_json.stdout)
    assert_documented("rewrite-deletes", document)
    assert [c["snapshot_id"] for c in document["commits_in_doubt"]] == [pending.snapshot_id]
    assert set(kept) <= set(unreferenced_files(load(home)))
