"""The README's walk-through works as written: every command of it, in a fresh directory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from test_cli import cli_env

REPOSITORY = Path(__file__).resolve().parents[1]
README = REPOSITORY / "README.md"
# The code blocks the README marks as its walk-through, in order.
WALK_THROUGH = re.compile(r"<!-- walk-through -->\n```sh\n(.*?)```", re.DOTALL)


def test_the_readme_walk_through_runs_as_written(tmp_path: Path) -> None:
    blocks = WALK_THROUGH.findall(README.read_text())
    assert len(blocks) >= 2, "the README marks no walk-through"
    # What `make demo` leaves behind: the virtual environment and the demo table (smaller here).
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1], target_is_directory=True)
    (tmp_path / "jobs").symlink_to(REPOSITORY / "jobs", target_is_directory=True)
    home = tmp_path / ".compactor-demo"
    env = cli_env(tmp_path)
    demo = subprocess.run(
        [".venv/bin/compactor", "demo", "--commits", "12", "--rows-per-commit", "200"],
        cwd=tmp_path,
        env={**env, "COMPACTOR_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stderr
    del env["COMPACTOR_HOME"]  # the walk-through sets it

    script = "set -euo pipefail\n" + "\n".join(blocks)
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "error:" not in result.stderr, result.stderr
    assert "demo.events: would expire" in result.stdout
    assert "jobs/streaming.toml: ok" in result.stdout
    assert json.loads((tmp_path / "layout.json").read_text())["table"] == "demo.events"
