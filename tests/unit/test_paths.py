"""Location keys, the table-location fence, and ``--older-than`` parsing: pure unit tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from compactor.durations import parse_cutoff
from compactor.errors import UsageError
from compactor.storage.paths import UnsafePathError, is_within, location_key

NOW_MS = 1_790_000_000_000  # a fixed "now": cut-offs are computed from it, never from the clock

# --- location_key: spellings of one file compare equal ---------------------------------------

SAME_FILE = {
    "s3 schemes": [
        "s3://bucket/t/data/f.parquet",
        "s3a://bucket/t/data/f.parquet",
        "s3n://bucket/t/data/f.parquet",
    ],
    "local forms": [
        "file:/wh/t/data/f.parquet",
        "file:///wh/t/data/f.parquet",
        "/wh/t/data/f.parquet",
    ],
    "percent-encoding": ["s3://bucket/t/data/a%3Db/f.parquet", "s3://bucket/t/data/a=b/f.parquet"],
    "encoded local": ["file:///wh/t/data/a%20b.parquet", "/wh/t/data/a b.parquet"],
    "doubled slashes": ["s3://bucket/t//data///f.parquet", "s3://bucket/t/data/f.parquet"],
    "doubled local slashes": ["file:////wh//t/data/f.parquet", "/wh/t/data/f.parquet"],
    "single dots": ["s3://bucket/t/./data/f.parquet", "s3://bucket/t/data/f.parquet"],
    "scheme case": ["S3A://bucket/t/data/f.parquet", "s3://bucket/t/data/f.parquet"],
    "gcs": ["gcs://bucket/t/f", "gs://bucket/t/f"],
    "azure": ["abfss://c@acct.dfs.core.windows.net/t/f", "abfs://c@acct.dfs.core.windows.net/t/f"],
}


@pytest.mark.parametrize("spellings", SAME_FILE.values(), ids=SAME_FILE.keys())
def test_equivalent_spellings_have_one_key(spellings: list[str]) -> None:
    keys = {location_key(spelling) for spelling in spellings}
    assert len(keys) == 1, keys


DIFFERENT_FILES = {
    "other bucket": ("s3://bucket/t/f", "s3://other/t/f"),
    "other scheme": ("s3://bucket/t/f", "gs://bucket/t/f"),
    "local vs object store": ("/bucket/t/f", "s3://bucket/t/f"),
    "other name": ("s3://bucket/t/a=b", "s3://bucket/t/a%3Dc"),
    "case of a path": ("s3://bucket/t/F", "s3://bucket/t/f"),
}


@pytest.mark.parametrize(("a", "b"), DIFFERENT_FILES.values(), ids=DIFFERENT_FILES.keys())
def test_different_files_have_different_keys(a: str, b: str) -> None:
    assert location_key(a) != location_key(b)


def test_key_form() -> None:
    assert location_key("s3a://Bucket//t/x") == "s3://bucket/t/x"
    assert location_key("file:/wh/t/x") == "file:///wh/t/x"
    assert location_key("/wh/t/x") == "file:///wh/t/x"


UNSAFE = {
    "dot-dot": "s3://bucket/t/../other/f",
    "local dot-dot": "/wh/t/data/../../etc/passwd",
    "encoded dot-dot": "s3://bucket/t/%2E%2E/other/f",
    "trailing dot-dot": "file:///wh/t/..",
    "query string": "s3://bucket/t/f.parquet?versionId=3",
    "fragment": "s3://bucket/t/f.parquet#part",
    "empty path": "s3://bucket",
    "control character": "s3://bucket/t/f%0A.parquet",
    "windows drive": "C:\\wh\\t\\f.parquet",
}


@pytest.mark.parametrize("location", UNSAFE.values(), ids=UNSAFE.keys())
def test_odd_locations_are_refused(location: str) -> None:
    with pytest.raises(UnsafePathError):
        location_key(location)


# --- is_within: strictly under the table location -------------------------------------------

ROOT = "s3://bucket/db/events"


@pytest.mark.parametrize(
    "location",
    [
        "s3://bucket/db/events/data/f.parquet",
        "s3a://bucket/db/events/metadata/v1.metadata.json",
        "s3://bucket/db//events/data/x=1/f.parquet",
        "s3://bucket/db/events/data/a%3Db/f.parquet",
    ],
)
def test_inside_the_table_location(location: str) -> None:
    assert is_within(location, ROOT)
    assert is_within(location, ROOT + "/")


@pytest.mark.parametrize(
    "location",
    [
        "s3://bucket/db/events",  # the root itself
        "s3://bucket/db/events/",
        "s3://bucket/db/events_old/data/f.parquet",  # a sibling sharing the prefix
        "s3://bucket/db/eventsdata/f.parquet",
        "s3://bucket/db/f.parquet",  # the parent
        "s3://other/db/events/data/f.parquet",  # another bucket
        "gs://bucket/db/events/data/f.parquet",  # another store
        "file:///bucket/db/events/data/f.parquet",
        "s3://bucket/db/events/../events_old/f.parquet",  # escapes
        "s3://bucket/db/events/data/f.parquet?versionId=1",  # odd
    ],
)
def test_not_inside_the_table_location(location: str) -> None:
    assert not is_within(location, ROOT)


def test_local_table_location() -> None:
    assert is_within("/wh/db/t/data/f.parquet", "file:///wh/db/t")
    assert is_within("file:///wh/db/t/data/f.parquet", "/wh/db/t/")
    assert is_within("file:/wh/db/t/data/f.parquet", "file:///wh/db/t")
    assert not is_within("file:///wh/db/t_old/f.parquet", "file:///wh/db/t")
    assert not is_within("file:///wh/db/t", "file:///wh/db/t")


# --- parse_cutoff ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "before_ms"),
    [
        ("0s", 0),
        ("250ms", 250),
        ("45s", 45_000),
        ("30m", 30 * 60_000),
        ("12h", 12 * 3_600_000),
        ("1.5h", 5_400_000),
        ("5d", 5 * 86_400_000),
        ("2w", 14 * 86_400_000),
        (" 3d ", 3 * 86_400_000),
    ],
)
def test_durations_count_back_from_now(text: str, before_ms: int) -> None:
    assert parse_cutoff(text, "--older-than", NOW_MS) == NOW_MS - before_ms


@pytest.fixture
def far_timezone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone 14 hours from UTC: a naive timestamp must still be UTC."""
    monkeypatch.setenv("TZ", "TEST-14")  # POSIX form, no tz database needed
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-01-02T03:04:05+00:00", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2026-01-02T05:04:05+02:00", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2026-01-02T03:04:05Z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2026-01-02T03:04:05", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),  # no zone: UTC
        ("2026-01-02", datetime(2026, 1, 2, tzinfo=UTC)),
    ],
)
def test_iso_timestamps_are_absolute(text: str, moment: datetime, far_timezone: None) -> None:
    expected = int(moment.timestamp() * 1000)
    assert parse_cutoff(text, "--older-than", NOW_MS) == expected
    assert parse_cutoff(text, "--older-than", NOW_MS + 86_400_000) == expected


@pytest.mark.parametrize("text", ["garbage", "", "5", "5 days", "-5d", "5y", "d5", "2026-13-01"])
def test_garbage_is_a_usage_error_naming_the_flag_and_value(text: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_cutoff(text, "--older-than", NOW_MS)
    assert "--older-than" in str(raised.value)
    assert repr(text) in str(raised.value)
