"""Fixtures for the compaction correctness suite: a real SQLite-backed pyiceberg catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from compactor.iceberg import pyiceberg_compat

NAMESPACE = "db"


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


# The stress test's size: writer operations. Small in the normal suite; larger with the flag.
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


# The independent reader: Apache Iceberg's Java library (tests/java, see java_reader.py).
import java_reader as java_reader_module  # noqa: E402


@pytest.fixture(scope="session")
def java_reader() -> java_reader_module.JavaReader:
    """The Java reader, built once per source version (Maven); a failed build errors the test."""
    return java_reader_module.ensure_reader()


# A real multi-node Ray cluster on loopback (tests/ray_cluster.py), for the Ray executor's tests.
from collections.abc import Iterator  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

if TYPE_CHECKING:
    from ray_cluster import RayCluster


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A head and a worker node, one CPU each, started once; every process stopped at the end."""
    from ray_cluster import ray_cluster as start_cluster

    with start_cluster(workers=1) as cluster:
        yield cluster


@pytest.fixture(params=["bulk", "iceberg"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test's compactions with bulk reading on (the default), then off.

    Modules whose row tests must hold on both read paths use it with
    ``pytestmark = pytest.mark.usefixtures("read_path")``.
    """
    import helpers

    monkeypatch.setitem(helpers.DEFAULT_OPTIONS, "bulk_read", request.param == "bulk")
    return str(request.param)
