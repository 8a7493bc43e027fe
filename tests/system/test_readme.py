"""The README's walk-through works as written: every command of it, in a fresh directory; and
every link of the README and the manual in docs/ leads to a file and a heading that exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from support import REPOSITORY
from support.cli import cli_env

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


# --- links between the README and the manual ----------------------------------------------------

DOCUMENTS = [README, *sorted((REPOSITORY / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(path: Path) -> list[str]:
    """The lines of a Markdown file outside its fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (duplicates get -1, -2, ...)."""
    anchors: set[str] = set()
    for line in _prose(path):
        heading = re.match(r"#{1,6} +(.*?) *#* *$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_every_link_of_the_readme_and_the_manual_resolves() -> None:
    broken = []
    for document in DOCUMENTS:
        for line in _prose(document):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                linked = (document.parent / path).resolve() if path else document
                if not linked.exists():
                    broken.append(f"{document.name}: {target}: no such file")
                elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                    broken.append(f"{document.name}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_the_manual_is_linked_from_the_readme() -> None:
    linked = set(LINK.findall(README.read_text()))
    pages = {f"docs/{page.name}" for page in DOCUMENTS[1:]}
    assert pages <= linked, sorted(pages - linked)
