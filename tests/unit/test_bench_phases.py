"""The process that runs a bench phase loads the packages ``compactor run`` loads, no more."""

from __future__ import annotations

import json
import subprocess
import sys

PACKAGES_AFTER = """
import json, sys
import compactor.api
before = {name.split(".")[0] for name in sys.modules}
import compactor.bench.phases
after = {name.split(".")[0] for name in sys.modules}
print(json.dumps(sorted(
    name for name in after - before
    if name not in sys.stdlib_module_names and not name.startswith("_")
)))
"""


def test_the_phases_module_loads_no_package_compactors_api_does_not() -> None:
    """compactor's phase is measured against ``--memory-limit`` as a user's process would be:
    DuckDB (~34 MiB resident) and the bench's loaders stay out of it."""
    loaded = subprocess.run(
        [sys.executable, "-c", PACKAGES_AFTER], capture_output=True, text=True, check=True
    )
    assert json.loads(loaded.stdout) == []
