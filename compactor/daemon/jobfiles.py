"""Job files: which tables the daemon keeps healthy, with which actions, when, and how.

A job file is TOML (see the examples in ``jobs/``)::

    tables = ["sales.*", "web.clicks"]      # exact names or globs on NAMESPACE.TABLE
    exclude = ["sales.*_staging"]

    [compact]
    every = "5m"                            # or: cron = "*/5 * * * *"
    min_small_files = 12

    [expire]
    cron = "0 3 * * *"

    [orphans]
    every = "1d"

    [rewrite_deletes]
    every = "1h"
    min_equality_delete_files = 1

    [rewrite_manifests]
    every = "1h"
    min_manifests = 100
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError

from compactor.daemon.config_files import load_toml, validate
from compactor.durations import duration_ms, format_duration, parse_duration_ms
from compactor.errors import ConfigError, UsageError, first_line
from compactor.iceberg.catalogs import all_namespaces, open_catalog
from compactor.options.compact import CompactOptions, resolve_options
from compactor.options.defaults import (
    DEFAULT_COOLDOWN,
    DEFAULT_MIN_DELETE_FILES,
    DEFAULT_MIN_EQUALITY_DELETE_FILES,
    DEFAULT_MIN_MANIFESTS,
    DEFAULT_MIN_POSITION_DELETE_FILES,
    DEFAULT_MIN_SMALL_FILES,
    MIN_ORPHAN_AGE_MS,
)
from compactor.options.fields import Duration, Size
from compactor.options.maintenance import (
    ExpireOptions,
    OrphansOptions,
    RewriteDeletesOptions,
    RewriteManifestsOptions,
)

ACTIONS = ("compact", "rewrite_deletes", "rewrite_manifests", "expire", "orphans")
Action = Literal["compact", "rewrite_deletes", "rewrite_manifests", "expire", "orphans"]
GLOB_CHARS = set("*?[")
MIN_EVERY_MS = 1000


def _check_pattern(pattern: str) -> str:
    namespace, _, name = pattern.rpartition(".")
    if not namespace or not name:
        raise ValueError(f"{pattern!r} is not NAMESPACE.TABLE (globs allowed: 'sales.*')")
    return pattern


TablePattern = Annotated[str, AfterValidator(_check_pattern)]


def _check_cron(expression: str) -> str:
    try:
        CronTrigger.from_crontab(expression)
    except ValueError as exc:
        raise ValueError(f"{expression!r} is not a crontab expression: {exc}") from None
    return expression


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Schedule(_Section):
    """When an action runs: ``every`` (an interval) or ``cron`` (a crontab line, UTC)."""

    every: Duration | None = None
    cron: Annotated[str, AfterValidator(_check_cron)] | None = None

    @model_validator(mode="after")
    def _one_schedule(self) -> Schedule:
        if (self.every is None) == (self.cron is None):
            raise ValueError('give exactly one of every = "10m" or cron = "*/10 * * * *"')
        if self.every is not None and parse_duration_ms(self.every, "every") < MIN_EVERY_MS:
            raise ValueError(f"every {self.every!r}: must be at least 1s")
        return self

    def trigger(self) -> BaseTrigger:
        """The APScheduler trigger for this schedule."""
        if self.every is not None:
            return IntervalTrigger(seconds=parse_duration_ms(self.every, "every") / 1000)
        assert self.cron is not None
        return CronTrigger.from_crontab(self.cron, timezone="UTC")

    def describe(self) -> str:
        return f"every {self.every}" if self.every is not None else f"cron {self.cron!r}"


class CompactAction(Schedule, CompactOptions):
    """Compact a table when its fragmentation crosses a threshold, then rest ``cooldown``.

    Takes every option of a compaction run (:class:`~compactor.options.CompactOptions`).
    """

    min_small_files: int = Field(DEFAULT_MIN_SMALL_FILES, ge=1)
    min_small_bytes: Size | None = None
    min_delete_files: int = Field(DEFAULT_MIN_DELETE_FILES, ge=1)
    cooldown: Duration = DEFAULT_COOLDOWN

    @model_validator(mode="after")
    def _resolves(self) -> CompactAction:
        """What a run would refuse (a target outside the allowed range, say) is refused now."""
        try:
            resolve_options("job", {}, **self.given())
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        return self


class RewriteDeletesAction(Schedule, RewriteDeletesOptions):
    """Convert a table's equality deletes once a partition holds ``min_equality_delete_files``
    of them (over data files no compaction rewrites anyway), and compact its position-delete
    files once a partition holds ``min_position_delete_files`` of them.

    Takes every option of ``compactor rewrite-deletes``
    (:class:`~compactor.options.RewriteDeletesOptions`); how the daemon picks between
    conversion and compaction: :mod:`compactor.daemon.remedies`.
    """

    min_equality_delete_files: int = Field(DEFAULT_MIN_EQUALITY_DELETE_FILES, ge=1)
    min_position_delete_files: int = Field(DEFAULT_MIN_POSITION_DELETE_FILES, ge=1)

    @property
    def fewest_delete_files(self) -> int:
        """The fewest delete files a table needs for this section to be due."""
        if not self.convert_equality_deletes:
            return self.min_position_delete_files
        return min(self.min_equality_delete_files, self.min_position_delete_files)


class RewriteManifestsAction(Schedule, RewriteManifestsOptions):
    """Rewrite a table's manifests, clustered by partition, once it has ``min_manifests`` of
    them (and, when set, they average fewer than ``max_average_entries`` live entries each).

    Takes every option of ``compactor rewrite-manifests``
    (:class:`~compactor.options.RewriteManifestsOptions`). Queued behind compactions, and
    checked again right after a compaction of the table commits.
    """

    min_manifests: int = Field(DEFAULT_MIN_MANIFESTS, ge=1)
    max_average_entries: int | None = Field(None, ge=1)

    def due(self, manifests: int, entries: int) -> list[str]:
        """The thresholds a table of ``manifests`` holding ``entries`` live entries crosses;
        empty when its manifests need no rewrite."""
        if manifests < self.min_manifests:
            return []
        reasons = [f"{manifests} manifests >= min_manifests {self.min_manifests}"]
        if self.max_average_entries is None:
            return reasons
        average = entries / manifests
        if average >= self.max_average_entries:
            return []
        return [
            *reasons,
            f"{average:.1f} entries per manifest < max_average_entries {self.max_average_entries}",
        ]


class _Destructive(Schedule):
    """An action that deletes: on table globs only when the job says ``on_table_globs``."""

    on_table_globs: bool = False


class ExpireAction(_Destructive, ExpireOptions):
    """Expire snapshots; takes every option of ``compactor expire``
    (:class:`~compactor.options.ExpireOptions`): ``older_than``/``retain_last`` default to the
    table's properties."""


class OrphansAction(_Destructive, OrphansOptions):
    """Remove files no metadata references; takes every option of ``compactor orphans``
    (:class:`~compactor.options.OrphansOptions`): older than ``older_than``, at least 1d unless
    allowed."""

    @field_validator("older_than")
    @classmethod
    def _not_below_the_floor(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("allow_short_older_than"):
            return value
        age_ms = duration_ms(value)
        if age_ms is not None and age_ms < MIN_ORPHAN_AGE_MS:
            raise ValueError(
                f"{value!r} is below the {format_duration(MIN_ORPHAN_AGE_MS)} safety floor of "
                "orphan removal (files of commits and compaction runs in flight could be "
                "deleted); set allow_short_older_than = true to allow it"
            )
        return value


ActionSection = (
    CompactAction | RewriteDeletesAction | RewriteManifestsAction | ExpireAction | OrphansAction
)
"""The section of a job file that configures one action."""


class JobFile(_Section):
    """One job file: the tables in scope and the actions to run on them."""

    description: str | None = None
    catalog: str | None = None
    tables: list[TablePattern] = Field(min_length=1)
    exclude: list[TablePattern] = []
    compact: CompactAction | None = None
    rewrite_deletes: RewriteDeletesAction | None = None
    rewrite_manifests: RewriteManifestsAction | None = None
    expire: ExpireAction | None = None
    orphans: OrphansAction | None = None

    @model_validator(mode="after")
    def _some_action(self) -> JobFile:
        if not self.actions():
            raise ValueError(
                "no action: add a [compact], [rewrite_deletes], [rewrite_manifests], [expire] "
                "or [orphans] section"
            )
        return self

    @model_validator(mode="after")
    def _deletes_on_globs_only_when_said(self) -> JobFile:
        globs = [p for p in self.tables if GLOB_CHARS & set(p)]
        for name in ("expire", "orphans"):
            section = getattr(self, name)
            if globs and section is not None and not section.on_table_globs:
                raise ValueError(
                    f"[{name}] deletes files, and tables {globs[0]!r} is a glob: set "
                    f"on_table_globs = true in [{name}] to run it on every matching table, "
                    "or name the tables"
                )
        return self

    def actions(self) -> dict[Action, ActionSection]:
        """The configured actions, in a fixed order."""
        found: dict[Action, ActionSection | None] = {
            "compact": self.compact,
            "rewrite_deletes": self.rewrite_deletes,
            "rewrite_manifests": self.rewrite_manifests,
            "expire": self.expire,
            "orphans": self.orphans,
        }
        return {name: section for name, section in found.items() if section is not None}


class Job:
    """A validated job file and where it came from."""

    def __init__(self, path: Path, spec: JobFile) -> None:
        self.path = path
        self.spec = spec

    @property
    def name(self) -> str:
        return self.path.stem

    def matches(self, identifier: str) -> bool:
        """Whether ``identifier`` (``ns.table``) is in scope: named or globbed, not excluded."""
        included = any(fnmatch.fnmatchcase(identifier, p) for p in self.spec.tables)
        return included and not any(fnmatch.fnmatchcase(identifier, p) for p in self.spec.exclude)

    def namespaces(self) -> set[str] | None:
        """Namespaces to list for glob patterns; None when some namespace is itself a glob."""
        found = set()
        for pattern in self.spec.tables:
            namespace = pattern.rpartition(".")[0]
            if GLOB_CHARS & set(namespace):
                return None
            found.add(namespace)
        return found

    def missing_tables(self, listed: Collection[str]) -> list[str]:
        """The exact table names of ``tables`` that ``listed`` lacks."""
        return [p for p in self.spec.tables if not GLOB_CHARS & set(p) and p not in listed]

    def empty_globs(self, listed: Collection[str]) -> list[str]:
        """The globs of ``tables`` that match no table of ``listed`` in scope."""
        in_scope = [t for t in listed if self.matches(t)]
        return [
            p
            for p in self.spec.tables
            if GLOB_CHARS & set(p) and not any(fnmatch.fnmatchcase(t, p) for t in in_scope)
        ]


def listed_tables(catalog: Catalog, job: Job) -> list[str]:
    """Every table of the namespaces ``job``'s patterns reach (all of them when a namespace is
    a glob), listed now: new tables included, scope not yet applied."""
    names = job.namespaces()
    if names is None:
        names = {".".join(ns) for ns in all_namespaces(catalog)}
    tables: set[str] = set()
    for namespace in sorted(names):
        try:
            listed = catalog.list_tables(namespace)
        except NoSuchNamespaceError:
            continue
        tables.update(".".join(identifier) for identifier in listed)
    return sorted(tables)


@dataclass
class Resolution:
    """What a job's ``tables`` resolve to in its catalog, and every problem (one line each)."""

    job: Job
    catalog: str | None
    tables: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def resolve_jobs(jobs: list[Job], default_catalog: str | None) -> list[Resolution]:
    """Load each job's catalog (once per catalog) and resolve its ``tables`` against it: a
    catalog that cannot be loaded or listed, a named table that does not exist and a glob that
    matches no table are problems."""
    catalogs: dict[str | None, Catalog | str] = {}
    resolved = []
    for job in jobs:
        name = job.spec.catalog or default_catalog
        if name not in catalogs:
            try:
                catalogs[name] = open_catalog(name)
            except Exception as exc:
                catalogs[name] = first_line(exc)
        catalog = catalogs[name]
        if isinstance(catalog, str):
            resolved.append(Resolution(job, name, problems=[f"{job.path}: {catalog}"]))
            continue
        resolution = Resolution(job, catalog.name)
        try:
            listed = listed_tables(catalog, job)
        except Exception as exc:
            resolution.problems.append(f"{job.path}: catalog {catalog.name!r}: {first_line(exc)}")
        else:
            resolution.tables = [t for t in listed if job.matches(t)]
            resolution.problems.extend(
                f"{job.path}: table {t} does not exist in catalog {catalog.name!r}"
                for t in job.missing_tables(listed)
            )
            resolution.problems.extend(
                f"{job.path}: tables {p!r} matches no table in catalog {catalog.name!r}"
                for p in job.empty_globs(listed)
            )
        resolved.append(resolution)
    return resolved


def load_job(path: Path) -> Job:
    """Load and validate one job file."""
    data, source = load_toml(path)
    return Job(path, validate(JobFile, data, source, path))


def job_paths(directory: Path) -> list[Path]:
    """The job files (``*.toml``) of ``directory``, sorted; an error when there are none."""
    if not directory.is_dir():
        raise ConfigError(f"{directory}: job directory does not exist")
    paths = sorted(directory.glob("*.toml"))
    if not paths:
        raise ConfigError(f"{directory}: no job files (*.toml)")
    return paths


def load_jobs(directory: Path) -> list[Job]:
    """Every job file of ``directory``; the first invalid one raises a ConfigError."""
    return [load_job(path) for path in job_paths(directory)]
