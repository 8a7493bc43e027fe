"""Fixtures of the integration tests: both read paths of a compaction (both kinds of data file:
``file_kind`` in the suite's conftest)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["bulk", "iceberg"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test's compactions with bulk reading on (the default), then off.

    Modules whose row tests must hold on both read paths use it with
    ``pytestmark = pytest.mark.usefixtures("read_path")``; those that must also hold on
    large files, streamed alone on the bulk path, with ``pytest.mark.parametrize("read_path",
    support.runs.EVERY_READ_PATH, indirect=True)``.
    """
    from compactor.rewrite import bulk_read

    from support.runs import DEFAULT_OPTIONS

    monkeypatch.setitem(DEFAULT_OPTIONS, "bulk_read", request.param != "iceberg")
    if request.param == "streamed":  # no file small enough to be scanned with others
        monkeypatch.setattr(bulk_read, "FILES_IN_BUDGET", 2**62)
    return str(request.param)
