"""docs/catalogs.md works as written, against real servers on loopback.

The page marks each block it vouches for with ``<!-- tested: NAME -->``. Every ``.pyiceberg.yaml``
block is written to a private ``PYICEBERG_HOME`` with the page's placeholder addresses replaced
by those of the servers started here (the table "How the blocks are checked" of the page lists
them), a small table is created through pyiceberg with the block's settings, and the page's
``commands`` block is run with bash: ``compactor inspect`` must show the table and ``compactor
run`` must compact it. The ``environment`` block (the same set-up as variables) is run the same
way, and every error line the page shows for a broken set-up is what compactor prints for it.

Servers: moto's S3 (and Glue) server, Apache Iceberg's REST catalog server and a PostgreSQL
cluster, from ``support.catalog_servers``; and here, Hive's standalone metastore 4.0.0 from
Maven Central (its ``bin`` tarball, Hadoop's jars beside it) on embedded Derby; pyiceberg's hive
catalog needs ``thrift``, which the ``hive`` extra installs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from pyiceberg.catalog import load_catalog

from support import REPOSITORY
from support.catalog_servers import (
    JVM_OPTIONS,
    CatalogServerError,
    PostgresServer,
    RestServer,
    _die_with_parent,
    _java,
    _tail,
    cache_root,
    cli_environment,
    free_port,
    isolate_test_process,
    run_checked,
    s3_client,
    stop_process_group,
)
from support.java_reader import file_lock
from support.s3_server import HOST, MotoS3

pytest_plugins = ("support.s3_server", "support.catalog_servers")

PAGE = REPOSITORY / "docs" / "catalogs.md"
TESTED = re.compile(r"<!-- tested: ([\w-]+) -->\n```(\w+)\n(.*?)```", re.DOTALL)
CATALOG = "lake"
APPENDS = 6  # more than a run's default minimum of input files
BIN = Path(sys.executable).parent  # where the ``compactor`` script is


def page_blocks() -> dict[str, tuple[str, str]]:
    """NAME -> (language, text) of every block the page marks tested."""
    blocks: dict[str, tuple[str, str]] = {}
    for name, language, text in TESTED.findall(PAGE.read_text()):
        assert name not in blocks, f"two blocks marked tested: {name}"
        blocks[name] = (language, text)
    return blocks


YAML_SETUPS = ("sqlite", "minio", "rest", "postgres", "glue", "hive")


def test_the_page_marks_a_block_for_every_set_up() -> None:
    blocks = page_blocks()
    assert set(blocks) == {*YAML_SETUPS, "environment", "commands"}
    for name in YAML_SETUPS:
        language, text = blocks[name]
        assert language == "yaml", name
        assert list(yaml.safe_load(text)["catalog"]) == [CATALOG], name


# --- placeholders and set-ups -------------------------------------------------------------------


@dataclass
class SetUp:
    """A tested block made real: what replaces each placeholder, and the environment to run in."""

    home: Path
    namespace: str
    replacements: dict[str, str]
    env: dict[str, str]

    def fill(self, text: str) -> str:
        """``text`` with the page's placeholders replaced, longest first."""
        for placeholder in sorted(self.replacements, key=len, reverse=True):
            text = text.replace(placeholder, self.replacements[placeholder])
        return text

    def unfill(self, text: str) -> str:
        """What compactor printed, with this set-up's values put back as the page spells them."""
        for placeholder, value in sorted(self.replacements.items(), key=lambda p: -len(p[1])):
            text = text.replace(value, placeholder)
        return text

    def run(
        self, script: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A shell block of the page, filled in, run by bash in ``home``."""
        return subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + self.fill(script)],
            cwd=self.home,
            env={**self.env, **(extra_env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


_count = iter(range(10_000))


def _set_up(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> SetUp:
    """Start (or reuse) the servers of block ``name``; a new namespace, bucket and directory."""
    number = next(_count)
    home = tmp_path / "home"
    home.mkdir()
    lake_dir = tmp_path / "lake"
    (lake_dir / "warehouse").mkdir(parents=True)
    env = cli_environment(home)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    namespace = f"docs_{name}_{number:03d}"
    replacements = {"/var/lib/lake": str(lake_dir), "db.events": f"{namespace}.events"}
    if name not in ("sqlite", "hive"):
        moto: MotoS3 = request.getfixturevalue("moto_s3")
        bucket = f"docs-{number:03d}-{name}"
        s3_client(moto.endpoint).create_bucket(Bucket=bucket)
        replacements.update(
            {
                "http://localhost:9000": moto.endpoint,
                "http://localhost:4566": moto.endpoint,
                "s3://warehouse/": f"s3://{bucket}/",
            }
        )
    if name == "rest":
        rest: RestServer = request.getfixturevalue("rest_catalog_server")
        replacements["http://localhost:8181"] = rest.uri
    elif name == "postgres":
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        database = f"docs_{number:03d}"
        postgres.create_database(database)
        replacements["postgresql+psycopg2://iceberg:secret@localhost:5432/iceberg"] = postgres.url(
            database
        )
    elif name == "hive":
        hive: HiveMetastore = request.getfixturevalue("hive_metastore")
        replacements["thrift://localhost:9083"] = hive.uri
    return SetUp(home, namespace, replacements, env)


def _properties(text: str) -> dict[str, str]:
    """The settings of catalog ``lake`` in a filled-in ``.pyiceberg.yaml`` block."""
    return {str(k): str(v) for k, v in yaml.safe_load(text)["catalog"][CATALOG].items()}


def _create_table(properties: dict[str, str], namespace: str) -> int:
    """``<namespace>.events`` with APPENDS small appends, through pyiceberg; its row count."""
    catalog = load_catalog(CATALOG, **properties)
    catalog.create_namespace(namespace)
    table = catalog.create_table(
        f"{namespace}.events", pa.schema([("id", pa.int64()), ("region", pa.string())])
    )
    for n in range(APPENDS):
        table.append(pa.table({"id": [n, n + 100], "region": ["eu", "us"]}))
    return 2 * APPENDS


@pytest.mark.parametrize("name", YAML_SETUPS)
def test_each_tested_block_configures_a_catalog_compactor_can_inspect_and_compact(
    name: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocks = page_blocks()
    setup = _set_up(name, request, tmp_path)
    isolate_test_process(monkeypatch)
    text = setup.fill(blocks[name][1])
    (setup.home / ".pyiceberg.yaml").write_text(text)
    properties = _properties(text)
    rows = _create_table(properties, setup.namespace)

    done = setup.run(blocks["commands"][1])

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "error:" not in done.stderr, done.stderr
    shown = setup.unfill(done.stdout)
    assert re.search(rf"^db\.events \(snapshot \d+, {APPENDS} snapshots\)$", shown, re.M), shown
    assert re.search(rf"│ data files +│ +{APPENDS} │", shown), shown
    assert re.search(rf"│ records +│ +{rows} │", shown), shown
    committed = re.search(
        rf"^db\.events: committed replace snapshot \d+: {APPENDS} files \(.*\) -> 1 file ",
        shown,
        re.M,
    )
    assert committed, shown
    table = load_catalog(CATALOG, **properties).load_table(f"{setup.namespace}.events")
    assert len(table.inspect.files()) == 1
    assert table.scan().to_arrow().num_rows == rows
    # What the page shows of both commands, line for line where it does not depend on the run.
    page = PAGE.read_text()
    for line in ("│ position delete files                    │       0 │", "│ partitions"):
        assert line in page and line in shown


def test_the_environment_block_is_the_minio_block_as_variables(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = page_blocks()
    setup = _set_up("minio", request, tmp_path)
    isolate_test_process(monkeypatch)
    from_file = _properties(setup.fill(blocks["minio"][1]))
    variables = dict(re.findall(r"^export (PYICEBERG_\w+)=(.*)$", blocks["environment"][1], re.M))
    # The page's rule, applied by hand, gives the keys of the file.
    by_rule = {
        name.removeprefix("PYICEBERG_CATALOG__LAKE__")
        .lower()
        .replace("__", ".")
        .replace("_", "-"): setup.fill(value)
        for name, value in variables.items()
    }
    assert by_rule == from_file
    rows = _create_table(from_file, setup.namespace)
    assert not (setup.home / ".pyiceberg.yaml").exists()

    done = setup.run(blocks["environment"][1])

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    shown = setup.unfill(done.stdout)
    assert re.search(rf"^db\.events \(snapshot \d+, {APPENDS} snapshots\)$", shown, re.M), shown
    assert re.search(rf"│ records +│ +{rows} │", shown), shown


# --- the errors the page shows ------------------------------------------------------------------


def _error_lines() -> dict[str, int]:
    """The ``error:`` lines of the page's table of errors, and the exit code it gives each."""
    found = re.findall(r"^\| `(error: [^`]*)` \(exit (\d+)\)", PAGE.read_text(), re.M)
    return {line: int(code) for line, code in found}


def _inspect(setup: SetUp, text: str, extra_env: dict[str, str] | None = None) -> tuple[str, int]:
    """Write the filled-in block, run the page's ``inspect`` command; its one error line (as
    the page would spell it) and its exit code."""
    (setup.home / ".pyiceberg.yaml").write_text(setup.fill(text))
    command = page_blocks()["commands"][1].splitlines()[0]
    assert command.startswith("compactor inspect ")
    done = setup.run(command, extra_env)
    assert done.returncode != 0, done.stdout
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return setup.unfill(lines[0]), done.returncode


def test_an_unreachable_catalog_is_reported_as_the_page_shows(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    setup = _set_up("rest", request, tmp_path)
    closed = free_port()  # nothing listens there
    setup.replacements["http://localhost:8181"] = f"http://{HOST}:{closed}"
    setup.replacements["localhost:8181"] = f"{HOST}:{closed}"

    error = _inspect(setup, page_blocks()["rest"][1])

    assert error in _error_lines().items(), error


def test_a_catalog_configured_nowhere_is_reported_as_the_page_shows(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    setup = _set_up("sqlite", request, tmp_path)

    error = _inspect(setup, "catalog:\n  other:\n    type: sql\n    uri: sqlite:///x.db\n")

    assert error in _error_lines().items(), error


def test_a_missing_driver_is_reported_as_the_page_shows(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    setup = _set_up("postgres", request, tmp_path)
    # The machine without the postgres extra: importing psycopg2 fails as for a missing module.
    stub = tmp_path / "without-psycopg2" / "psycopg2"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg2'\", name='psycopg2')\n"
    )

    error = _inspect(setup, page_blocks()["postgres"][1], {"PYTHONPATH": str(stub.parent)})

    assert error in _error_lines().items(), error


def test_a_database_refusing_the_user_is_reported_as_the_page_shows(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    setup = _set_up("postgres", request, tmp_path)
    postgres: PostgresServer = request.getfixturevalue("postgres_server")
    # The page's own URI, user ``iceberg`` included, at the test server: it has no such role.
    uri = "postgresql+psycopg2://iceberg:secret@localhost:5432/iceberg"
    setup.replacements[uri] = f"postgresql+psycopg2://iceberg:secret@{HOST}:{postgres.port}/iceberg"
    setup.replacements['"localhost" (127.0.0.1), port 5432'] = f'"{HOST}", port {postgres.port}'

    error = _inspect(setup, page_blocks()["postgres"][1])

    assert error in _error_lines().items(), error


def test_a_namespace_the_catalog_lacks_is_reported_as_the_page_shows(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    setup = _set_up("sqlite", request, tmp_path)
    del setup.replacements["db.events"]  # the namespace ``db`` exists nowhere

    error = _inspect(setup, page_blocks()["sqlite"][1])

    assert error in _error_lines().items(), error


# --- Hive's standalone metastore ----------------------------------------------------------------

HIVE_VERSION = "4.0.0"  # 4.0.1 removed the get_table call pyiceberg 0.12 makes
HADOOP_VERSION = "3.3.6"  # the Hadoop Hive 4.0 is built with; its jars are not in the tarball
HIVE_MAIN_CLASS = "org.apache.hadoop.hive.metastore.HiveMetaStore"
SCHEMA_TOOL = "org.apache.hadoop.hive.metastore.tools.schematool.MetastoreSchemaTool"
HIVE_READY_TIMEOUT_S = 180


def _hive_pom() -> str:
    exclude_all = (
        "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion>"
        "</exclusions>"
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>compactor.tests</groupId>
  <artifactId>hive-metastore</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.hive</groupId><artifactId>hive-standalone-metastore-server</artifactId><version>{HIVE_VERSION}</version><classifier>bin</classifier><type>tar.gz</type>{exclude_all}</dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-common</artifactId><version>{HADOOP_VERSION}</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-hdfs</artifactId><version>{HADOOP_VERSION}</version>{exclude_all}</dependency>
  </dependencies>
</project>
"""


def hive_distribution() -> tuple[Path, str]:
    """The metastore's unpacked distribution and Hadoop's jars: resolved once, then cached."""
    pom = _hive_pom()
    digest = hashlib.sha256(pom.encode()).hexdigest()[:12]
    directory = cache_root() / "hive-metastore" / f"hive-{HIVE_VERSION}-{digest}"
    done_file = directory / "hadoop-classpath.txt"
    with file_lock(directory.with_name(directory.name + ".lock")):
        if not done_file.is_file():
            mvn = shutil.which("mvn")
            if mvn is None:
                raise CatalogServerError("mvn not found on PATH: the Hive metastore needs Maven")
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            (directory / "pom.xml").write_text(pom)
            scratch = directory / "classpath.txt"
            run_checked(
                [
                    mvn,
                    "-q",
                    "-B",
                    "-f",
                    str(directory / "pom.xml"),
                    "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:build-classpath",
                    "-Dmdep.includeScope=runtime",
                    f"-Dmdep.outputFile={scratch}",
                ],
                timeout=1800,
            )
            entries = [e for e in scratch.read_text().strip().split(os.pathsep) if e]
            tarball = next(e for e in entries if e.endswith(".tar.gz"))
            with tarfile.open(tarball) as archive:
                archive.extractall(directory / "dist", filter="data")
            # Hive's own jars come from the distribution; Hadoop's shaded client API would
            # shadow hadoop-common's Configuration.
            hadoop = [e for e in entries if e.endswith(".jar") and "hadoop-client-api" not in e]
            done_file.write_text(os.pathsep.join(hadoop))
    (home,) = (directory / "dist").iterdir()
    return home, done_file.read_text()


@dataclass(frozen=True)
class HiveMetastore:
    uri: str
    warehouse: Path
    log: Path


def _metastore_site(derby: Path, warehouse: Path, port: int) -> str:
    settings = {
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={derby};create=true",
        "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
        "metastore.warehouse.dir": warehouse.as_uri(),
        "metastore.thrift.port": str(port),
        "metastore.expression.proxy": "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy",
        "metastore.task.threads.always": "org.apache.hadoop.hive.metastore.events.EventCleanerTask",
        "metastore.event.db.notification.api.auth": "false",
    }
    properties = "".join(
        f"  <property><name>{name}</name><value>{value}</value></property>\n"
        for name, value in settings.items()
    )
    return f"<configuration>\n{properties}</configuration>\n"


@pytest.fixture(scope="session")
def hive_metastore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HiveMetastore]:
    """Hive's standalone metastore on a free port of 127.0.0.1 (Thrift also binds the other
    interfaces), on a Derby database of its own, its warehouse in a temporary directory."""
    home, hadoop = hive_distribution()
    directory = tmp_path_factory.mktemp("hive-metastore")
    conf, warehouse, log = directory / "conf", directory / "warehouse", directory / "metastore.log"
    conf.mkdir()
    warehouse.mkdir()
    port = free_port()
    (conf / "metastore-site.xml").write_text(
        _metastore_site(directory / "metastore_db", warehouse, port)
    )
    classpath = os.pathsep.join([str(conf), str(home / "lib" / "*"), hadoop])
    base = {name: os.environ[name] for name in ("PATH", "LANG", "JAVA_HOME") if name in os.environ}
    env = {**base, "METASTORE_HOME": str(home)}  # where the schema tool finds its scripts
    java = [_java(), *JVM_OPTIONS, "-cp", classpath]
    run_checked(
        [*java, SCHEMA_TOOL, "-initSchema", "-dbType", "derby"], timeout=300, cwd=directory, env=env
    )
    process: subprocess.Popen[bytes] | None = None
    try:
        with log.open("ab") as out:
            process = subprocess.Popen(
                [*java, HIVE_MAIN_CLASS],
                cwd=directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + HIVE_READY_TIMEOUT_S
        while process.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection((HOST, port), timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise CatalogServerError(
                f"the Hive metastore did not listen on {HOST}:{port} (exit {process.poll()}); "
                f"its log:\n{_tail(log)}"
            )
        yield HiveMetastore(f"thrift://{HOST}:{port}", warehouse, log)
    finally:
        if process is not None:
            stop_process_group(process)
