"""What the benchmark reports say about where they ran."""

from __future__ import annotations

from typing import Any

import pytest

from compactor.bench.report import queries_chart_title


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ({"storage": "local"}, "on local disk:"),
        ({"storage": "s3-local", "s3_latency_ms": 0}, "on a local S3 server:"),
        ({"storage": "s3-local", "s3_latency_ms": 30}, "on a local S3 server (30 ms a request):"),
        ({"storage": "s3", "s3_endpoint": "https://s3.example"}, "on S3 at https://s3.example:"),
    ],
)
def test_the_queries_chart_says_where_the_tables_were(
    storage: dict[str, Any], expected: str
) -> None:
    report = {"parameters": {"scale_factor": 1, **storage}, "totals": {"speedup": 6.7}}
    title = queries_chart_title(report)
    assert title.startswith(f"TPC-DS SF 1 in DuckDB {expected} before and after"), title
    assert title.endswith("(total 6.70x)")
