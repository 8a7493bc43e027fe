"""A table whose storage refuses writes: one error line naming the table, exit 1, nothing changed.

The warehouse is remounted read-only in a mount namespace of the command's own (``unshare``),
so the refusal is the kernel's ``EROFS``, as on a read-only volume, whoever runs the tests.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from compactor.bench.sample import create_events_table

from support.cli import COMPACTOR, assert_one_error_line, cli_env, embedded
from support.tables import list_files

TABLE = "db.events"
UNSHARE = shutil.which("unshare")


def on_read_only_warehouse(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``compactor ARGS`` with ``home``'s warehouse mounted read-only for it alone."""
    warehouse = home / "warehouse"
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'
    assert UNSHARE is not None
    return subprocess.run(
        [UNSHARE, "-rm", "sh", "-c", script, "sh", str(warehouse), str(COMPACTOR), *args],
        cwd=home,
        env=cli_env(home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.mark.skipif(UNSHARE is None, reason="needs util-linux's unshare")
@pytest.mark.parametrize(
    "args",
    [
        ("run", "--min-input-files", "2"),
        ("rewrite-deletes",),
        ("rewrite-manifests",),
        ("expire", "--older-than", "0s", "--retain-last", "1"),
    ],
    ids=lambda args: args[0],
)
def test_a_read_only_warehouse_is_one_error_naming_the_table(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    table = create_events_table(embedded(tmp_path), TABLE, commits=3, rows_per_commit=50, days=1)
    metadata, files = table.metadata_location, list_files(tmp_path / "warehouse")

    result = on_read_only_warehouse(tmp_path, args[0], "--table", TABLE, *args[1:])

    line = assert_one_error_line(result, 1, TABLE, "storage is not writable", "Read-only")
    assert "OSError" not in line and "--verbose" not in line
    assert embedded(tmp_path).load_table(TABLE).metadata_location == metadata
    assert list_files(tmp_path / "warehouse") == files
