"""The suite's own scheduling: tests of one ``xdist_group`` run on one pytest-xdist worker.

``make test`` runs ``-n 2 --dist loadgroup``; the Ray cluster, the packaging venvs and every
module-scoped fixture (tests/conftest.py) count on it to be built once. A pytest or pytest-xdist
release that silently stops grouping (pytest 9.2 with pytest-xdist 3.8 does) fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SUITE = """
import pytest

@pytest.fixture(scope="module")
def shared():
    return object()

@pytest.mark.xdist_group("marked")
@pytest.mark.parametrize("i", range(4))
def test_marked(i):
    pass

@pytest.mark.parametrize("i", range(4))
def test_sharing(shared, i):
    pass

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pass
"""


def test_a_group_and_the_users_of_a_module_fixture_each_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(SUITE)
    conftest = Path(__file__).parents[1] / "conftest.py"
    (tmp_path / "conftest.py").write_text(conftest.read_text())
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2"]
        + ["--dist", "loadgroup", "-v", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    workers: dict[str, set[str]] = {}
    for worker, test in re.findall(r"\[(gw\d)\] .*PASSED \S+::(test_\w+)", ran.stdout):
        workers.setdefault(test, set()).add(worker)
    assert set(workers) == {"test_marked", "test_sharing", "test_free"}, ran.stdout
    assert len(workers["test_marked"]) == 1, ran.stdout
    assert len(workers["test_sharing"]) == 1, ran.stdout
