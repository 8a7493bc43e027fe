"""What options read from the process's environment: its CPUs, and pyiceberg's configuration."""

from __future__ import annotations

import math
import os
from pathlib import Path

from compactor.errors import ConfigError, first_line

# A container's CPU limit under cgroup v2: "max 100000" or "<quota> <period>".
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
PYICEBERG_CONFIG_FILE = ".pyiceberg.yaml"


def default_parallelism() -> int:
    """Groups rewritten at once: one per core this process may use.

    That is the CPU affinity, capped by a cgroup v2 CPU quota (a container's CPU limit), not the
    machine's core count.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def pyiceberg_config_file() -> Path | None:
    """The configuration file pyiceberg reads: first of $PYICEBERG_HOME, ~, the current directory."""
    for directory in (os.environ.get("PYICEBERG_HOME"), os.path.expanduser("~"), os.getcwd()):
        if directory and (Path(directory) / PYICEBERG_CONFIG_FILE).is_file():
            return Path(directory) / PYICEBERG_CONFIG_FILE
    return None


def check_pyiceberg_config() -> None:
    """Fail with one line naming the file and line when pyiceberg's configuration is unreadable.

    pyiceberg reads it when its catalog module is first imported and fails there with a long
    parser trace, so this runs first. Imports only pyiceberg's light config module.
    """
    from pyiceberg.utils.config import Config

    try:
        Config()
    except Exception as exc:  # strictyaml, OSError, or ValueError for clashing variables
        problem = getattr(exc, "problem", None) or first_line(exc)
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        source = pyiceberg_config_file() or "PYICEBERG_* environment variables"
        raise ConfigError(f"{source}: {problem}{where}") from exc
