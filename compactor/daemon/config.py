"""The daemon's own settings file, ``compactor.toml``; every default is written here.

::

    [daemon]
    jobs = "jobs"                     # directory of job files, relative to this file
    state = "compactor-state.db"      # run history (SQLite), relative to this file
    catalog = "lake"                  # for job files that name none
    max_concurrent_runs = 2
    listen = "127.0.0.1:9464"         # /metrics, /healthz, the dashboard; "" turns it off
    http_token = ""                   # required by the dashboard and its API; or COMPACTOR_HTTP_TOKEN
    log_format = "auto"               # json when stderr is not a terminal
    backoff_initial = "5m"            # after a failed run; doubles per failure
    backoff_max = "6h"
    conflicts_before_backoff = 2      # runs in a row refused by commit conflicts
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from compactor.daemon.config_files import load_toml, validate
from compactor.daemon.jobfiles import Duration
from compactor.durations import parse_duration_ms
from compactor.iceberg.catalogs import compactor_home
from compactor.redaction import register_secrets

DEFAULT_CONFIG = "compactor.toml"
DEFAULT_LISTEN = "127.0.0.1:9464"
STATE_FILE = "daemon.db"
# Overrides [daemon] http_token: the way to pass it from a Kubernetes Secret.
HTTP_TOKEN_ENVIRONMENT = "COMPACTOR_HTTP_TOKEN"


def _check_listen(value: str) -> str:
    if value == "":
        return value
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:9464; port 0 picks one)")
    return value


class DaemonSection(BaseModel):
    """The ``[daemon]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobs: str = "jobs"
    state: str | None = None
    catalog: str | None = None
    max_concurrent_runs: int = Field(1, ge=1, le=64)
    listen: Annotated[str, AfterValidator(_check_listen)] = DEFAULT_LISTEN
    http_token: str = ""
    log_format: Literal["auto", "json", "text"] = "auto"
    backoff_initial: Duration = "5m"
    backoff_max: Duration = "6h"
    conflicts_before_backoff: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _backoff_order(self) -> DaemonSection:
        if parse_duration_ms(self.backoff_max, "") < parse_duration_ms(self.backoff_initial, ""):
            raise ValueError("backoff_max is shorter than backoff_initial")
        return self


class DaemonFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    daemon: DaemonSection = DaemonSection()


class DaemonConfig:
    """Resolved daemon settings: paths made absolute against the config file's directory."""

    def __init__(self, path: Path | None, section: DaemonSection) -> None:
        base = path.parent if path else Path.cwd()
        self.path = path
        self.section = section
        self.jobs_dir = (base / section.jobs).resolve()
        self.state_path = (
            (base / section.state).resolve() if section.state else compactor_home() / STATE_FILE
        )
        self.backoff_initial_s = parse_duration_ms(section.backoff_initial, "") / 1000
        self.backoff_max_s = parse_duration_ms(section.backoff_max, "") / 1000
        # The bearer token of the dashboard and its API; None: they are open.
        self.http_token = os.environ.get(HTTP_TOKEN_ENVIRONMENT) or section.http_token or None
        if self.http_token:
            register_secrets({HTTP_TOKEN_ENVIRONMENT: self.http_token})

    @property
    def listen(self) -> tuple[str, int] | None:
        """Host and port of the HTTP endpoint, or None when it is off."""
        if not self.section.listen:
            return None
        host, _, port = self.section.listen.rpartition(":")
        return host.strip("[]"), int(port)


def load_daemon_config(path: Path | None) -> DaemonConfig:
    """Read ``path``; None means ``./compactor.toml`` when it exists, else all defaults."""
    if path is None:
        candidate = Path(DEFAULT_CONFIG)
        if not candidate.exists():
            return DaemonConfig(None, DaemonSection())
        path = candidate
    path = path.resolve()
    data, source = load_toml(path)
    return DaemonConfig(path, validate(DaemonFile, data, source, path).daemon)
