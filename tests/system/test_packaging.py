"""compactor as users install it: ``pip install '.[s3]'`` into a fresh virtual environment.

One environment for the module, holding compactor with its core and ``s3`` dependencies and
nothing else (not this test suite's environment, not the other extras). In it: every module
imports (deploy/check_install.py, which the container image's build runs too), every
third-party import of the package is a declared dependency, and every action and the daemon run
on a real table, which keeps its rows while its files get fewer.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from support import REPOSITORY
from support.daemon import COMPACT_EVERY_SECOND

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]

ROOT = REPOSITORY
PACKAGE = ROOT / "compactor"
CHECK_INSTALL = ROOT / "deploy" / "check_install.py"
# Modules that need an extra the install leaves out, and the extra.
EXTRA_ONLY_MODULES = {"compactor.execute.ray_executor": "ray"}
# Third-party modules imported only inside the functions of a feature of an extra.
LAZY_IMPORTS = {"ray": "ray", "matplotlib": "bench", "moto": "bench"}
# Distributions of the test suite's own environment that the fresh one must not have.
NOT_INSTALLED = ("pytest", "ray", "moto", "matplotlib", "psycopg2")

TABLE = "db.events"
CATALOG = "default"
COMMITS, ROWS_PER_COMMIT, DAYS = 6, 200, 2  # 6 files in each of 2 days x 4 regions
SMALL_TARGET = ("--target-file-size", "1MiB", "--allow-small-target", "--min-input-files", "2")
INSTALL_TIMEOUT_S = 900
COMMAND_TIMEOUT_S = 300
# Bound for a broken daemon only: the wait ends on the event the daemon logs.
DAEMON_TIMEOUT_S = 120

# Run by the fresh environment's Python: build the table, add to it, describe it.
TABLE_SCRIPT = """
import hashlib, json, sys
from pathlib import Path
import pyarrow as pa
from pyiceberg.catalog import load_catalog

catalog = load_catalog("default")
command, identifier = sys.argv[1], sys.argv[2]
if command == "create":
    from compactor.bench.sample import create_events_table
    from compactor.iceberg.delete_files import commit_delete_files, write_position_delete_file

    commits, rows, days = (int(a) for a in sys.argv[3:6])
    table = create_events_table(
        catalog, identifier, commits=commits, rows_per_commit=rows, days=days
    )
    # Two position delete files, in one partition, on two of its data files.
    files = sorted(
        (t.file for t in table.scan().plan_files()), key=lambda f: (str(f.partition), f.file_path)
    )
    first = [f for f in files if f.partition == files[0].partition][:2]
    deletes = [
        write_position_delete_file(
            table,
            pa.table({"file_path": [data_file.file_path] * len(positions), "pos": positions}),
            spec_id=data_file.spec_id,
            partition=data_file.partition,
        )
        for data_file, positions in zip(first, ([0], [1, 2]))
    ]
    commit_delete_files(table, deletes)
elif command == "append":
    from compactor.bench.sample import events_batch

    table = catalog.load_table(identifier)
    first, commits, rows, days = (int(a) for a in sys.argv[3:7])
    for commit in range(first, first + commits):
        table.append(events_batch(commit, rows, days))
table = catalog.load_table(identifier)
tasks = list(table.scan().plan_files())
rows = table.scan().to_arrow().sort_by("event_id")
print(json.dumps({
    "rows": rows.num_rows,
    "digest": hashlib.sha256(json.dumps(rows.to_pylist(), default=str).encode()).hexdigest(),
    "data_files": len(tasks),
    "delete_files": len({d.file_path for t in tasks for d in t.delete_files}),
    "snapshots": len(table.metadata.snapshots),
    "location": table.metadata.location,
}))
"""

DAEMON_CONFIG = f"""
[daemon]
catalog = "{CATALOG}"
state = "state.db"
listen = "127.0.0.1:0"
log_format = "json"
"""


def _without_python_settings(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without what would make a Python see other packages or another configuration."""
    return {
        name: value
        for name, value in env.items()
        if not name.startswith(("PYTHON", "PYICEBERG_", "COMPACTOR_"))
        and name not in ("VIRTUAL_ENV", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")
    }


@dataclass
class Installed:
    """A fresh environment with compactor installed, and a directory to run it in."""

    venv: Path
    work: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def compactor(self) -> Path:
        return self.venv / "bin" / "compactor"

    def env(self) -> dict[str, str]:
        """No outside configuration; the catalog is SQLite in ``work``, the warehouse beside it."""
        env = _without_python_settings(os.environ)
        prefix = f"PYICEBERG_CATALOG__{CATALOG.upper()}__"
        env.update(
            {
                "HOME": str(self.work),
                "PYICEBERG_HOME": str(self.work),
                "COMPACTOR_HOME": str(self.work / "home"),
                prefix + "TYPE": "sql",
                prefix + "URI": f"sqlite:///{self.work / 'catalog.db'}",
                prefix + "WAREHOUSE": (self.work / "warehouse").as_uri(),
            }
        )
        return env

    def run(self, *command: str | Path) -> subprocess.CompletedProcess[str]:
        """``command`` in ``work`` (not the source tree: only the installed package imports)."""
        return subprocess.run(
            [str(part) for part in command],
            cwd=self.work,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )

    def cli(self, *args: str) -> dict[str, Any]:
        """``compactor ARGS --json``, which must exit 0; its document."""
        result = self.run(self.compactor, *args, "--json")
        assert result.returncode == 0, f"compactor {' '.join(args)}:\n{result.stderr}"
        document: dict[str, Any] = json.loads(result.stdout)
        return document

    def table(self, command: str, *args: int) -> dict[str, Any]:
        """Run TABLE_SCRIPT's ``command`` (create, append, state) on the table; its state."""
        result = self.run(self.python, "-c", TABLE_SCRIPT, command, TABLE, *map(str, args))
        assert result.returncode == 0, f"table {command}:\n{result.stderr}"
        state: dict[str, Any] = json.loads(result.stdout)
        return state


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """``pip install '<copy of the source>[s3]'`` into a new virtual environment.

    The copy holds what the container image's build copies (pyproject.toml, README.md and the
    package), so the build writes nothing into the source tree.
    """
    root = tmp_path_factory.mktemp("packaging")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "compactor", ignore=shutil.ignore_patterns("__pycache__"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{source}[s3]"],
        cwd=root,
        env=_without_python_settings(os.environ) | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, f"pip install '.[s3]' failed:\n{result.stdout}{result.stderr}"
    work = root / "work"
    (work / "warehouse").mkdir(parents=True)
    return Installed(venv, work)


# --- what is installed -----------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level name of each module the package imports from outside itself and the standard
    library, at any depth of its code -> the package's modules importing it."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "compactor" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(_module_name(path))
    return found


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return _normalized(match.group(0))


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def test_every_module_imports_with_the_core_and_s3_dependencies(installed: Installed) -> None:
    result = installed.run(installed.python, CHECK_INSTALL, "--extras", "s3", "--json")

    report = json.loads(result.stdout)
    assert report["failed"] == {}, f"modules that do not import: {report['failed']}"
    assert result.returncode == 0, result.stderr
    assert Path(report["location"]).is_relative_to(installed.venv), report["location"]
    every = {_module_name(path) for path in PACKAGE.rglob("*.py")}
    assert report["skipped"] == EXTRA_ONLY_MODULES
    assert set(report["imported"]) == every - set(EXTRA_ONLY_MODULES)


def test_the_dashboard_pages_are_installed(installed: Installed) -> None:
    listing = (
        "import json; from importlib import resources; "
        "static = resources.files('compactor.daemon.dashboard') / 'static'; "
        "print(json.dumps(sorted(p.name for p in static.iterdir())))"
    )
    result = installed.run(installed.python, "-c", listing)
    assert result.returncode == 0, result.stderr
    shipped = sorted(p.name for p in (PACKAGE / "daemon" / "dashboard" / "static").iterdir())
    assert json.loads(result.stdout) == shipped


def test_every_third_party_import_is_a_declared_dependency(installed: Installed) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = {_requirement_name(r) for r in [*project["dependencies"], *extras["s3"]]}
    imports = _third_party_imports()
    probe = (
        "import importlib.util, json, sys\n"
        "from importlib.metadata import packages_distributions\n"
        "names = json.loads(sys.argv[1])\n"
        "found = packages_distributions()\n"
        "print(json.dumps({n: [found.get(n, []), importlib.util.find_spec(n) is not None]"
        " for n in names}))\n"
    )
    names = sorted({*imports, *NOT_INSTALLED})
    result = installed.run(installed.python, "-c", probe, json.dumps(names))
    assert result.returncode == 0, result.stderr
    where = json.loads(result.stdout)

    # Only the core and s3 dependencies are installed: none of the suite's or other extras'.
    assert [n for n in NOT_INSTALLED if where[n][1]] == []
    for name, modules in sorted(imports.items()):
        distributions, importable = where[name]
        if name in LAZY_IMPORTS:
            extra = LAZY_IMPORTS[name]
            in_extra = {_requirement_name(r) for r in extras[extra]}
            assert _normalized(name) in in_extra, f"{name}: not in the {extra} extra"
            continue
        assert importable, f"{name} (imported by {sorted(modules)}) is not installed"
        assert declared & {_normalized(d) for d in distributions}, (
            f"{name} (imported by {sorted(modules)}) comes from {distributions}, which "
            "pyproject.toml does not declare"
        )


# --- every action and the daemon -------------------------------------------------------------


class Daemon:
    """``compactor daemon`` in the fresh environment, its JSON log read line by line."""

    def __init__(self, installed: Installed) -> None:
        self.process = subprocess.Popen(
            [str(installed.compactor), "daemon", "--config", "compactor.toml"],
            cwd=installed.work,
            env=installed.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            if line.startswith("{"):
                self._events.put(json.loads(line))
        self._events.put(None)

    def wait_for(self, event: str, **fields: Any) -> dict[str, Any]:
        """The next logged ``event`` whose fields include ``fields``."""
        deadline = time.monotonic() + DAEMON_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                logged = self._events.get(timeout=left)
            except queue.Empty:
                break
            if logged is None:
                raise AssertionError(f"daemon ended before {event}:\n{''.join(self.lines)}")
            if logged.get("event") == event and fields.items() <= logged.items():
                return logged
        raise AssertionError(f"no {event} within {DAEMON_TIMEOUT_S}s:\n{''.join(self.lines)}")


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons the test starts; one a failed test left running is killed."""
    started: list[Daemon] = []
    yield started
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


def _same_rows(state: dict[str, Any], before: dict[str, Any]) -> None:
    assert (state["rows"], state["digest"]) == (before["rows"], before["digest"])


def test_every_action_and_the_daemon_run_on_a_real_table(
    installed: Installed, daemons: list[Daemon]
) -> None:
    start = installed.table("create", COMMITS, ROWS_PER_COMMIT, DAYS)
    partitions = DAYS * 4
    assert (start["data_files"], start["delete_files"]) == (COMMITS * partitions, 2)
    assert start["rows"] == COMMITS * ROWS_PER_COMMIT - 3

    inspected = installed.cli("inspect", "--table", TABLE, *SMALL_TARGET[:3])
    assert inspected["data_files"] == inspected["small_files"] == start["data_files"]

    deletes = installed.cli("rewrite-deletes", "--table", TABLE)
    assert (deletes["files_removed"], deletes["files_added"]) == (2, 1)
    state = installed.table("state")
    _same_rows(state, start)
    assert state["delete_files"] == 1

    # The executor of an extra that is not installed: one line saying how to install it.
    ray = installed.run(installed.compactor, "run", "--table", TABLE, "--executor", "ray")
    assert ray.returncode == 2, ray.stderr
    assert "pip install 'compactor[ray]'" in ray.stderr
    assert installed.table("state") == state

    where = ("--where", "region = 'eu'")
    sort = ("--strategy", "sort", "--sort-order", "user_id DESC NULLS LAST, event_id")
    for args in ((*SMALL_TARGET, *sort, *where), SMALL_TARGET):  # eu sorted, then the rest
        before = state
        run = installed.cli("run", "--table", TABLE, *args)
        assert run["committed_groups"] > 0 and run["snapshot_id"] is not None, run
        state = installed.table("state")
        _same_rows(state, start)
        assert state["data_files"] < before["data_files"]
    assert (state["data_files"], state["delete_files"]) == (partitions, 0)

    expired = installed.cli("expire", "--table", TABLE, "--older-than", "0s", "--retain-last", "1")
    assert expired["files_deleted"] > 0
    state = installed.table("state")
    _same_rows(state, start)
    assert state["snapshots"] == 1

    stray = Path(urlparse(state["location"]).path) / "data" / "stray.parquet"
    stray.write_bytes(b"not parquet")
    os.utime(stray, (0, 0))
    swept = installed.cli("orphans", "--table", TABLE, "--older-than", "1d")
    assert [urlparse(p).path for p in swept["deleted_paths"]] == [str(stray)]
    assert not stray.exists()
    _same_rows(installed.table("state"), start)

    # The daemon compacts what two more commits added.
    appended = installed.table("append", COMMITS, 2, ROWS_PER_COMMIT, DAYS)
    assert appended["data_files"] == 3 * partitions
    (installed.work / "compactor.toml").write_text(DAEMON_CONFIG)
    (installed.work / "jobs").mkdir()
    (installed.work / "jobs" / "compact.toml").write_text(COMPACT_EVERY_SECOND)
    daemon = Daemon(installed)
    daemons.append(daemon)
    url = daemon.wait_for("daemon_started")["url"]
    finished = daemon.wait_for("run_finished", table=TABLE, action="compact")
    assert finished["snapshot_ids"], finished
    with urllib.request.urlopen(f"{url}/healthz", timeout=30) as response:
        assert response.status == 200
        assert json.loads(response.read())["status"] == "ok"
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=DAEMON_TIMEOUT_S) == 0, "".join(daemon.lines)
    after = installed.table("state")
    _same_rows(after, appended)
    assert after["data_files"] == partitions
