"""Fixtures of the integration tests: both read paths of a compaction, both kinds of data file."""

from __future__ import annotations

from collections.abc import Iterator

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
