"""A benchmark without the bench extra stops before it starts, with one line naming the extra."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from compactor.cli.app import app


@pytest.mark.parametrize("command", ["queries", "rewrite", "plan"])
def test_a_benchmark_without_the_bench_extra_names_it(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "matplotlib" else find_spec(name, *args),
    )
    result = CliRunner().invoke(app, ["bench", command, "--out", "unused"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert lines == [
        "error: compactor bench needs the bench extra: pip install 'compactor[bench]' "
        "(missing: matplotlib)"
    ]
