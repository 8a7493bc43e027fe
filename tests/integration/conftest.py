"""Fixtures of the integration tests: both read paths of a compaction."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["bulk", "iceberg"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test's compactions with bulk reading on (the default), then off.

    Modules whose row tests must hold on both read paths use it with
    ``pytestmark = pytest.mark.usefixtures("read_path")``.
    """
    from support.runs import DEFAULT_OPTIONS

    monkeypatch.setitem(DEFAULT_OPTIONS, "bulk_read", request.param == "bulk")
    return str(request.param)
