"""Fixtures of more than one folder of the suite: a SQLite catalog, the Java reader, both kinds
of data file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from compactor.iceberg import pyiceberg_compat

# The suite's shared code (tests/support/, on the path by pyproject's ``pythonpath``): its
# asserts are rewritten as in test modules, so that a failing helper shows its values.
pytest.register_assert_rewrite("support")

if TYPE_CHECKING:
    from support.java_reader import JavaReader

NAMESPACE = "db"


def pytest_itemcollected(item: pytest.Item) -> None:
    """The tests sharing a module-scoped fixture run on one pytest-xdist worker (``--dist
    loadgroup``), so that the fixture is built once, not once on each worker. Tests already in
    a group keep theirs."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None or item.get_closest_marker("xdist_group"):
        return
    shared = sorted(
        name for name, defs in info.name2fixturedefs.items() if defs[-1].scope == "module"
    )
    if shared:
        item.add_marker(pytest.mark.xdist_group(f"{item.path.stem}:{'+'.join(shared)}"))


@pytest.fixture(scope="session", autouse=True)
def _pyiceberg_fixes() -> None:
    """pyiceberg with compactor's fixes installed, as in every process compactor runs: tests
    also call compactor's modules directly, below the entry points that install them."""
    pyiceberg_compat.install()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    """The warehouse directory every table of the test's catalog lives under."""
    path = tmp_path / "wh"
    path.mkdir()
    return path


@pytest.fixture
def catalog(tmp_path: Path, warehouse: Path) -> SqlCatalog:
    """A fresh SQLite catalog with namespace ``db``."""
    cat = SqlCatalog(
        "default",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=warehouse.as_uri(),
    )
    cat.create_namespace(NAMESPACE)
    return cat


# The stress test's size: writer operations. Small in the normal suite; larger with the flag
# (declared here, where pytest reads command-line options whatever folder is run).
DEFAULT_STRESS_OPS = 30


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress-ops",
        type=int,
        default=DEFAULT_STRESS_OPS,
        help=f"operations the stress test's writer performs (default {DEFAULT_STRESS_OPS})",
    )


@pytest.fixture
def stress_ops(request: pytest.FixtureRequest) -> int:
    """How many operations the stress test's writer performs (``--stress-ops``)."""
    return request.config.getoption("--stress-ops")


@pytest.fixture(scope="session")
def java_reader() -> JavaReader:
    """The independent reader, Apache Iceberg's Java library (tests/support/java), built once per
    source version (Maven); a failed build errors the test."""
    from support.java_reader import ensure_reader

    return ensure_reader()


@pytest.fixture(params=["field_ids", "imported"])
def file_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Build the test's tables from files with Iceberg field ids (pyiceberg's append), then from
    files without them, as a migration imports them (``add_files``): read through the table's
    name mapping.

    Row tests that must hold on both kinds of file use it (``pytest.mark.usefixtures``, or
    parametrized ``indirect`` to pair the imported kind with some of their cases only) and
    append their rows with :func:`support.tables.append_rows`; an imported variant fails unless
    it imported files.
    """
    from support import tables

    appends = tables.Appends(kind=request.param)
    monkeypatch.setattr(tables, "APPENDS", appends)
    yield str(request.param)
    if request.param == tables.IMPORTED:
        assert appends.imported, "no file was imported: the variant tested files with field ids"
