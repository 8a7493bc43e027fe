"""Job files and the daemon's settings file: the examples load, every mistake is one line.

A malformed file is refused before anything starts, with one ``error:`` line naming the file,
the line and the setting, and exit code 2. ``compactor daemon`` runs as a subprocess with no
stdin and a private environment: every refusal here must end it on its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from compactor.daemon.history import History
from compactor.daemon.jobfiles import ACTIONS, load_job
from compactor.errors import ConfigError
from compactor.iceberg.catalogs import compactor_home

from support import REPOSITORY
from support.catalog_servers import free_port
from support.cli import COMPACTOR, assert_one_error_line, cli_env, invoke, isolate
from support.json_output import assert_documented

REPO_JOBS = REPOSITORY / "jobs"
EXAMPLES = sorted(REPO_JOBS.glob("*.toml"))
# A refusal takes well under a second; a daemon that started serving would never end.
DAEMON_TIMEOUT_S = 30


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In-process commands read no user configuration and run in the test's directory."""
    isolate(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)


def expect_refusal(
    result: subprocess.CompletedProcess[str], path: Path, line: int | None, *fragments: str
) -> str:
    """One ``error: FILE:LINE: ...`` line (``error: FILE: ...`` without a line), exit 2."""
    message = assert_one_error_line(result, 2, *fragments)
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert message.startswith(f"error: {where}"), message
    return message


# --- the examples ----------------------------------------------------------------------------


def test_the_repository_has_example_job_files() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_job_file_loads_with_its_actions(path: Path) -> None:
    written = tomllib.loads(path.read_text())

    job = load_job(path)

    actions = job.spec.actions()
    assert actions, f"{path.name} has no action"
    assert list(actions) == [name for name in ACTIONS if name in written]
    assert job.spec.tables == written["tables"]
    for section in actions.values():
        assert section.trigger() is not None


def copy_examples(directory: Path) -> list[Path]:
    shutil.copytree(REPO_JOBS, directory / "jobs")
    return sorted((directory / "jobs").glob("*.toml"))


def test_jobs_validate_without_arguments_checks_the_job_directory(tmp_path: Path) -> None:
    copies = copy_examples(tmp_path)

    result = invoke("jobs", "validate")

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == len(copies) == len(EXAMPLES)
    for line, path in zip(lines, copies, strict=True):
        assert line.startswith(f"{path.resolve()}: ok: "), line
        for name in load_job(path).spec.actions():
            assert name in line


def test_jobs_validate_json_lists_every_file_and_its_actions(tmp_path: Path) -> None:
    copies = copy_examples(tmp_path)

    result = invoke("jobs", "validate", "--json")

    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert_documented("jobs validate", document)
    assert document["valid"] is True and document["errors"] == [] and document["exit_code"] == 0
    assert [job["resolved"] for job in document["jobs"]] == [None] * len(copies)
    listed = {Path(job["file"]).name: job for job in document["jobs"]}
    assert sorted(listed) == [p.name for p in copies]
    for path in copies:
        written = tomllib.loads(path.read_text())
        job = listed[path.name]
        assert list(job["actions"]) == [name for name in ACTIONS if name in written]
        assert all(job["actions"].values())
        assert job["tables"] == written["tables"]


def test_jobs_validate_checks_the_files_given(tmp_path: Path) -> None:
    copies = copy_examples(tmp_path)

    result = invoke("jobs", "validate", *(str(p) for p in copies[:2]))

    assert result.returncode == 0, result.stderr
    assert [line.split(": ok: ")[0] for line in result.stdout.splitlines()] == [
        str(p) for p in copies[:2]
    ]


# --- malformed job files ---------------------------------------------------------------------

HEADER = '# Tables written by the ingestion jobs\ndescription = "ingestion"\n'
TABLES = HEADER + 'tables = ["events.*"]\n\n'  # tables on line 3, next line 5

# (job file, line of the problem or None, fragments the message must contain)
MALFORMED: dict[str, tuple[str, int | None, tuple[str, ...]]] = {
    "TOML syntax error": (
        TABLES + '[compact]\nevery = "5m\nmin_small_files = 3\n',
        6,
        ("invalid TOML",),
    ),
    "unknown key": (
        TABLES + '[compact]\nevery = "5m"\n# typo below\nmin_smal_files = 3\n',
        8,
        ("compact.min_smal_files", "unknown setting"),
    ),
    "unknown section": (
        TABLES + '[compcat]\nevery = "5m"\n',
        5,
        ("compcat", "unknown setting"),
    ),
    "bad duration": (
        TABLES + '[compact]\nmin_small_files = 3\nevery = "5x"\n',
        7,
        ("compact.every", "'5x'", "duration"),
    ),
    "bad cron": (
        TABLES + '[compact]\nevery = "5m"\n\n[expire]\ncron = "99 * * * *"\n',
        9,
        ("expire.cron", "'99 * * * *'", "crontab"),
    ),
    "both every and cron": (
        TABLES + '[compact]\nevery = "5m"\n\n[orphans]\nevery = "1d"\ncron = "0 4 * * 0"\n',
        8,
        ("orphans", "exactly one of every", "cron"),
    ),
    "neither every nor cron": (
        TABLES + '[expire]\nolder_than = "2d"\nretain_last = 3\n',
        5,
        ("expire", "exactly one of every", "cron"),
    ),
    "no action section": (
        TABLES + 'exclude = ["events.*_staging"]\n',
        None,
        ("no action", "[compact]"),
    ),
    "empty tables": (
        HEADER + 'tables = []\n\n[compact]\nevery = "5m"\n',
        3,
        ("tables", "at least 1"),
    ),
    "missing tables": (
        HEADER + '\n[compact]\nevery = "5m"\n',
        None,
        ("tables", "required setting is missing"),
    ),
    "table without namespace": (
        HEADER + 'tables = ["events.clicks", "clicks"]\n\n[compact]\nevery = "5m"\n',
        3,
        ("tables.1", "'clicks'", "NAMESPACE.TABLE"),
    ),
    "exclude without namespace": (
        TABLES + 'exclude = ["staging"]\n[compact]\nevery = "5m"\n',
        5,
        ("exclude.0", "'staging'", "NAMESPACE.TABLE"),
    ),
    "bad where filter": (
        TABLES + '[compact]\nevery = "5m"\nwhere = "region = = \'eu\'"\n',
        7,
        ("compact.where", "not a valid filter"),
    ),
    "zero threshold": (
        TABLES + '[compact]\nevery = "5m"\nmin_small_files = 12\nmin_delete_files = 0\n',
        8,
        ("compact.min_delete_files", "greater than or equal to 1"),
    ),
    "negative threshold": (
        TABLES + '[compact]\nevery = "5m"\nmin_small_files = -4\n',
        7,
        ("compact.min_small_files", "greater than or equal to 1"),
    ),
    "zero retain_last": (
        TABLES + '[expire]\ncron = "0 3 * * *"\nretain_last = 0\n',
        7,
        ("expire.retain_last", "greater than or equal to 1"),
    ),
    "bad size": (
        TABLES + '[compact]\nevery = "5m"\ntarget_file_size = "12 parsecs"\n',
        7,
        ("compact.target_file_size", "'12 parsecs'", "size"),
    ),
    "bad byte threshold": (
        TABLES + '[compact]\nevery = "5m"\nmin_small_bytes = "lots"\n',
        7,
        ("compact.min_small_bytes", "'lots'", "size"),
    ),
    "threshold of the wrong type": (
        TABLES + '[compact]\nevery = "5m"\nmin_small_files = "twelve"\n',
        7,
        ("compact.min_small_files", "integer"),
    ),
    "unknown executor": (
        TABLES + '[compact]\nevery = "5m"\nexecutor = "spark"\n',
        7,
        ("compact.executor", "'threads'", "'ray'"),
    ),
    "ray address without the ray executor": (
        TABLES + '[compact]\nevery = "5m"\nray_address = "ray://head:10001"\n',
        7,  # the key's line, not the section's
        ("compact", "ray_address 'ray://head:10001': is only used with executor 'ray'"),
    ),
    "dotted keys": (
        TABLES + 'compact.every = "5m"\ncompact.cooldown = "soon"\n',
        6,
        ("compact.cooldown", "'soon'", "duration"),
    ),
}


@pytest.mark.parametrize(("content", "line", "fragments"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_job_file_is_one_error_line_naming_file_line_and_setting(
    tmp_path: Path, content: str, line: int | None, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "ingestion.toml"
    path.write_text(content)

    result = invoke("jobs", "validate", str(path))

    expect_refusal(result, path, line, *fragments)
    with pytest.raises(ConfigError):
        load_job(path)


def test_jobs_validate_refuses_a_bad_file_of_the_job_directory_and_checks_the_others(
    tmp_path: Path,
) -> None:
    copy_examples(tmp_path)
    bad = tmp_path / "jobs" / "zz-broken.toml"
    bad.write_text(MALFORMED["bad cron"][0])

    result = invoke("jobs", "validate")

    assert result.returncode == 2
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: {bad.resolve()}:9: expire.cron"), error
    assert result.stdout.count(": ok: ") == len(EXAMPLES)


def test_jobs_validate_reports_every_problem_of_every_file_at_its_keys_line(
    tmp_path: Path,
) -> None:
    first, second, good = (tmp_path / f"{n}.toml" for n in ("a", "b", "c"))
    first.write_text(TABLES + '[compact]\nevery = "5x"\nbogus = 1\n[expire]\nretain_last = 0\n')
    second.write_text(MALFORMED["ray address without the ray executor"][0])
    good.write_text(TABLES + '[compact]\nevery = "5m"\n')

    result = invoke("jobs", "validate", str(first), str(second), str(good))
    as_json = json.loads(
        invoke("jobs", "validate", str(first), str(second), str(good), "--json").stdout
    )

    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert [e.split(": ")[1:3] for e in errors] == [
        [f"{first}:6", "compact.every"],
        [f"{first}:7", "compact.bogus"],
        [f"{first}:9", "expire.retain_last"],
        [f"{second}:7", "compact"],
    ]
    assert f"{good}: ok" in result.stdout
    assert as_json["errors"] == [e.removeprefix("error: ") for e in errors]
    assert [job["file"] for job in as_json["jobs"]] == [str(good)]


def test_the_daemon_refuses_a_job_file_with_its_first_problem_and_how_many_more(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.toml"
    path.write_text(TABLES + '[compact]\nevery = "5x"\nbogus = 1\n')
    with pytest.raises(
        ConfigError, match=r"compact\.every: .*\(and 1 more: `compactor jobs validate`"
    ):
        load_job(path)


def test_jobs_validate_of_a_missing_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"

    expect_refusal(invoke("jobs", "validate", str(path)), path, None, "no such file")


# --- compactor daemon ------------------------------------------------------------------------

DAEMON_FILE = '# compactor daemon\n[daemon]\njobs = "jobs"\nstate = "state.db"\nlisten = ""\n'

# (compactor.toml, line of the problem, fragments the message must contain)
MALFORMED_SETTINGS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "unknown key": (
        DAEMON_FILE + "max_concurent_runs = 2\n",
        6,
        ("daemon.max_concurent_runs", "unknown setting"),
    ),
    "unknown key outside [daemon]": (
        '# compactor daemon\njobs = "jobs"\n',
        2,
        ("jobs", "unknown setting"),
    ),
    "listen without a port": (
        '# compactor daemon\n[daemon]\njobs = "jobs"\nlisten = "localhost"\n',
        4,
        ("daemon.listen", "'localhost'", "HOST:PORT"),
    ),
    "listen port out of range": (
        '# compactor daemon\n[daemon]\njobs = "jobs"\nlisten = "127.0.0.1:70000"\n',
        4,
        ("daemon.listen", "'127.0.0.1:70000'", "HOST:PORT"),
    ),
    # A rule between two settings is reported at the line of their section.
    "backoff_max shorter than backoff_initial": (
        '# compactor daemon\n[daemon]\nbackoff_initial = "1h"\nbackoff_max = "10m"\n',
        4,  # the line of the key the check names
        ("daemon", "backoff_max is shorter than backoff_initial"),
    ),
    "bad backoff duration": (
        '# compactor daemon\n[daemon]\n\nbackoff_initial = "5 minutes"\n',
        4,
        ("daemon.backoff_initial", "'5 minutes'", "duration"),
    ),
    "no concurrency": (
        "# compactor daemon\n[daemon]\nmax_concurrent_runs = 0\n",
        3,
        ("daemon.max_concurrent_runs", "greater than or equal to 1"),
    ),
    "TOML syntax error": (
        "# compactor daemon\n[daemon]\nmax_concurrent_runs = 2 2\n",
        3,
        ("invalid TOML",),
    ),
}


def write_settings(home: Path, settings: str = DAEMON_FILE) -> Path:
    (home / "compactor.toml").write_text(settings)
    return home / "compactor.toml"


@pytest.mark.parametrize(
    ("settings", "line", "fragments"), MALFORMED_SETTINGS.values(), ids=MALFORMED_SETTINGS.keys()
)
def test_a_malformed_settings_file_is_one_error_line_naming_file_and_line(
    tmp_path: Path, settings: str, line: int, fragments: tuple[str, ...]
) -> None:
    config = write_settings(tmp_path, settings)
    copy_examples(tmp_path)

    result = invoke("jobs", "validate", "--config", str(config))

    expect_refusal(result, config.resolve(), line, *fragments)


def test_a_settings_file_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    copy_examples(tmp_path)
    config = tmp_path / "etc" / "compactor.toml"

    result = invoke("jobs", "validate", "--config", str(config))

    expect_refusal(result, config.resolve(), None, "no such file")


def daemon_setup_with_broken_job(home: Path) -> tuple[Path, Path]:
    copy_examples(home)
    broken = home / "jobs" / "zz-broken.toml"  # loaded after the good examples
    broken.write_text(MALFORMED["unknown key"][0])
    return write_settings(home), broken


def daemon_setup_without_jobs(home: Path) -> tuple[Path, Path]:
    return write_settings(home), home / "jobs"


def daemon_setup_with_empty_jobs(home: Path) -> tuple[Path, Path]:
    (home / "jobs").mkdir()
    (home / "jobs" / "README.md").write_text("job files go here\n")
    return write_settings(home), home / "jobs"


def daemon_setup_with_settings(settings: str) -> Callable[[Path], tuple[Path, Path]]:
    def setup(home: Path) -> tuple[Path, Path]:
        copy_examples(home)
        config = write_settings(home, settings)
        return config, config

    return setup


# name -> (setup returning the --config path and the file the error names, line, fragments)
DAEMON_REFUSALS: dict[
    str, tuple[Callable[[Path], tuple[Path, Path]], int | None, tuple[str, ...]]
] = {
    "malformed job file": (
        daemon_setup_with_broken_job,
        MALFORMED["unknown key"][1],
        MALFORMED["unknown key"][2],
    ),
    "missing job directory": (daemon_setup_without_jobs, None, ("job directory does not exist",)),
    "empty job directory": (daemon_setup_with_empty_jobs, None, ("no job files",)),
    **{
        f"settings: {name}": (daemon_setup_with_settings(MALFORMED_SETTINGS[name][0]), *rest)
        for name in (
            "unknown key",
            "listen without a port",
            "backoff_max shorter than backoff_initial",
        )
        for rest in [MALFORMED_SETTINGS[name][1:]]
    },
}


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run_daemon(home: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """``compactor daemon --config CONFIG`` in ``home``, isolated; it must end by itself.

    A daemon still running at the timeout is killed and reported with exit code -1.
    """
    command = [str(COMPACTOR), "daemon", "--config", str(config)]
    try:
        return subprocess.run(
            command,
            cwd=home,
            env=cli_env(home),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=DAEMON_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = f"still running after {DAEMON_TIMEOUT_S}s\n{_text(exc.stderr)}"
        return subprocess.CompletedProcess(command, -1, _text(exc.stdout), stderr)


def listing(root: Path) -> dict[str, int]:
    """Every file and directory under ``root``, with its size (-1 for a directory)."""
    return {
        str(p.relative_to(root)): -1 if p.is_dir() else p.stat().st_size for p in root.rglob("*")
    }


@dataclass
class DaemonRefusal:
    home: Path
    culprit: Path  # the file the error must name
    files_before: dict[str, int]
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def daemon_refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DaemonRefusal]:
    """Every refused daemon start, run side by side."""
    setups = {}
    for index, (name, (setup, _, _)) in enumerate(DAEMON_REFUSALS.items()):
        home = tmp_path_factory.mktemp(f"daemon{index}")
        config, culprit = setup(home)
        setups[name] = (home, config, culprit, listing(home))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {
            name: pool.submit(run_daemon, home, config)
            for name, (home, config, _, _) in setups.items()
        }
        return {
            name: DaemonRefusal(home, culprit, before, futures[name].result())
            for name, (home, _, culprit, before) in setups.items()
        }


@pytest.mark.parametrize(
    ("name", "line", "fragments"),
    [(name, line, fragments) for name, (_, line, fragments) in DAEMON_REFUSALS.items()],
    ids=DAEMON_REFUSALS.keys(),
)
def test_the_daemon_refuses_to_start_with_one_error_line(
    daemon_refusals: dict[str, DaemonRefusal],
    name: str,
    line: int | None,
    fragments: tuple[str, ...],
) -> None:
    refusal = daemon_refusals[name]

    expect_refusal(refusal.result, refusal.culprit.resolve(), line, *fragments)
    # It stopped before writing anything: no state file, catalog or warehouse, here (its
    # directory, HOME and COMPACTOR_HOME) or anywhere else under it.
    assert listing(refusal.home) == refusal.files_before


# --- compactor status ------------------------------------------------------------------------


def test_status_without_a_state_file_is_one_line_naming_it(tmp_path: Path) -> None:
    config = write_settings(tmp_path)
    copy_examples(tmp_path)
    state = (tmp_path / "state.db").resolve()

    result = invoke("status", "--config", str(config))

    message = assert_one_error_line(result, 2, str(state), "does not exist")
    assert message.startswith(f"error: state file {state}: "), message
    assert not state.exists()


def test_status_shows_errors_as_they_were_written(tmp_path: Path) -> None:
    """Brackets in an error (paths, lists, a server's text) are not taken for rich markup."""
    config = write_settings(tmp_path)
    copy_examples(tmp_path)
    history = History((tmp_path / "state.db").resolve())
    history.record_tick("nightly", "compact", 1.0, "[red]tick[/red]")
    run = history.start_run("db.t", "compact", "nightly", 1.0)
    run.ended_at, run.outcome, run.error = 2.0, "failed", "[bold]run[/bold]"
    history.finish_run(run)
    history.close()

    result = invoke("status", "--config", str(config))

    assert result.returncode == 0, result.stderr
    assert "[red]tick[/red]" in result.stdout and "[bold]run[/bold]" in result.stdout


def test_status_without_a_config_looks_for_the_default_state_file(tmp_path: Path) -> None:
    state = compactor_home() / "daemon.db"
    assert state.parent == tmp_path.resolve()

    result = invoke("status", "--json")

    assert_one_error_line(result, 2, str(state), "does not exist")
    assert not state.exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'tables = ["db.*"]\n\n[orphans]\nevery = "1d"\n',
            "[orphans] deletes files, and tables 'db.*' is a glob: set on_table_globs = true",
        ),
        (
            'tables = ["db.t", "*.*"]\n\n[expire]\ncron = "0 3 * * *"\n',
            "[expire] deletes files, and tables '*.*' is a glob",
        ),
        ('tables = ["db.t"]\n\n[compact]\nevery = "0s"\n', "every '0s': must be at least 1s"),
        (
            'tables = ["db.t"]\n\n[compact]\nevery = "5m"\ntarget_file_size = "1KB"\n',
            "target_file_size '1KB' (1000 B) is outside the allowed range",
        ),
    ],
)
def test_job_files_the_daemon_could_never_run_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_job(path)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"{path}:")


def test_deleting_actions_on_globs_run_when_the_job_says_so(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('tables = ["db.*"]\n\n[expire]\ncron = "0 3 * * *"\non_table_globs = true\n')
    assert load_job(path).spec.expire is not None


def test_jobs_validate_refuses_a_catalog_that_is_configured_nowhere(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('catalog = "nope"\ntables = ["db.t"]\n\n[compact]\nevery = "5m"\n')
    expect_refusal(
        invoke("jobs", "validate", str(path)),
        path,
        None,
        "catalog 'nope' is not configured",
        "PYICEBERG_CATALOG__NOPE__URI",
    )
    directory = copy_examples(tmp_path)[0].parent
    result = invoke("jobs", "validate", str(directory))  # a directory: its *.toml files
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(EXAMPLES)


# --- jobs validate --connect -----------------------------------------------------------------


@pytest.fixture
def lake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SqlCatalog:
    """A SQLite catalog configured as ``lake``, with tables db.a, db.b and db.c."""
    properties = {"uri": f"sqlite:///{tmp_path}/lake.db", "warehouse": tmp_path.as_uri()}
    for key, value in {"type": "sql", **properties}.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__LAKE__{key.upper()}", value)
    catalog = SqlCatalog("lake", **properties)
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    for name in ("db.a", "db.b", "db.c"):
        catalog.create_table(name, schema)
    return catalog


def job_file(directory: Path, name: str, tables: str, catalog: str = "lake") -> Path:
    path = directory / f"{name}.toml"
    path.write_text(f'catalog = "{catalog}"\ntables = {tables}\n\n[compact]\nevery = "5m"\n')
    return path


def test_jobs_validate_connect_lists_the_tables_each_job_resolves_to(
    tmp_path: Path, lake: SqlCatalog
) -> None:
    nightly = job_file(tmp_path, "nightly", '["db.*"]')
    single = job_file(tmp_path, "single", '["db.b"]')

    result = invoke("jobs", "validate", "--connect", str(nightly), str(single))

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{nightly}: ok: db.*: compact every"), lines
    assert lines[2].startswith(f"{single}: ok: db.b: compact every"), lines
    assert lines[1::2] == [f"{nightly}: 3 tables (db.a, db.b, db.c)", f"{single}: 1 table (db.b)"]
    document = json.loads(
        invoke("jobs", "validate", "--connect", "--json", str(nightly), str(single)).stdout
    )
    assert_documented("jobs validate", document)
    assert document["valid"] is True
    assert [job["resolved"] for job in document["jobs"]] == [
        {"catalog": "lake", "tables": ["db.a", "db.b", "db.c"]},
        {"catalog": "lake", "tables": ["db.b"]},
    ]


def test_jobs_validate_connect_refuses_missing_tables_and_empty_globs_one_line_each(
    tmp_path: Path, lake: SqlCatalog
) -> None:
    good = job_file(tmp_path, "good", '["db.a"]')
    broken = job_file(tmp_path, "broken", '["db.a", "db.gone", "db.nothing_*", "other.*"]')
    assert invoke("jobs", "validate", str(tmp_path)).returncode == 0  # offline: nothing to see

    result = invoke("jobs", "validate", "--connect", str(tmp_path))

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"error: {broken}: table db.gone does not exist in catalog 'lake'",
        f"error: {broken}: tables 'db.nothing_*' matches no table in catalog 'lake'",
        f"error: {broken}: tables 'other.*' matches no table in catalog 'lake'",
    ]
    assert result.stdout.splitlines()[1:] == [f"{good}: 1 table (db.a)"]  # broken: not ok
    document = json.loads(invoke("jobs", "validate", "--connect", "--json", str(tmp_path)).stdout)
    assert_documented("jobs validate", document)
    assert document["valid"] is False
    assert document["exit_code"] == 2
    assert document["errors"] == [
        line.removeprefix("error: ") for line in result.stderr.splitlines()
    ]


def test_jobs_validate_connect_names_the_catalog_it_cannot_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYICEBERG_CATALOG__DOWN__TYPE", "rest")
    monkeypatch.setenv("PYICEBERG_CATALOG__DOWN__URI", f"http://127.0.0.1:{free_port()}")
    path = job_file(tmp_path, "remote", '["db.a"]', catalog="down")
    assert invoke("jobs", "validate", str(path)).returncode == 0  # configured: fine offline

    result = invoke("jobs", "validate", "--connect", str(path))

    expect_refusal(result, path, None, "catalog 'down'", "Connection refused")
