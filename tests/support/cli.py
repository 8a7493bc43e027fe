"""The installed ``compactor`` script run in a directory and environment of a test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from compactor.iceberg.catalogs import embedded_catalog

COMPACTOR = Path(sys.executable).parent / "compactor"
# Variables that would change what the CLI reads or how rich renders its output.
LEAKY_VARIABLES = ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "XDG_DATA_HOME")


def cli_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without any catalog or compactor settings, rooted at ``home``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.upper().startswith(("PYICEBERG_", "COMPACTOR_")) and name not in LEAKY_VARIABLES
    }
    env.update(COMPACTOR_HOME=str(home), HOME=str(home), PYICEBERG_HOME=str(home))
    env.update(extra or {})
    return env


def compactor(
    home: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``compactor`` script in ``home`` and capture what it prints."""
    return subprocess.run(
        [str(COMPACTOR), *args],
        cwd=home,  # pyiceberg also reads .pyiceberg.yaml from the working directory
        env=cli_env(home, env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def isolate(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """This process, for the test: no catalog or compactor settings, every home at ``home``."""
    for name in list(os.environ):
        if name.upper().startswith(("PYICEBERG_", "COMPACTOR_")) or name in LEAKY_VARIABLES:
            monkeypatch.delenv(name)
    for name in ("HOME", "PYICEBERG_HOME", "COMPACTOR_HOME"):
        monkeypatch.setenv(name, str(home))


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI in-process; the result looks like a finished subprocess."""
    from typer.testing import CliRunner

    from compactor.cli.app import app

    result = CliRunner().invoke(app, list(args))
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def embedded(home: Path) -> SqlCatalog:
    """The embedded catalog the CLI opens when ``COMPACTOR_HOME`` is ``home``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMPACTOR_HOME", str(home))
        return embedded_catalog()


def assert_one_error_line(
    result: subprocess.CompletedProcess[str], exit_code: int, *culprits: str
) -> str:
    """Exactly one ``error:`` line on stderr naming every culprit, no traceback; nothing on
    stdout, or with ``--json`` the same error as a JSON document."""
    assert result.returncode == exit_code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    for culprit in culprits:
        assert culprit in lines[0]
    if "--json" in result.args:
        error = {"error": lines[0].removeprefix("error: "), "exit_code": exit_code}
        assert json.loads(result.stdout) == error
    else:
        assert result.stdout == ""
    return lines[0]
