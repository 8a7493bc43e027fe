"""Five catalog set-ups, each against its real server on loopback, for ``test_catalogs.py``.

====================  ===========================================  =========================
set-up                catalog                                      table storage
====================  ===========================================  =========================
``sqlite-local``      pyiceberg SqlCatalog on a SQLite file        local disk (``file://``)
``sqlite-s3``         pyiceberg SqlCatalog on a SQLite file        S3 (moto server)
``rest-s3``           Apache Iceberg's REST catalog server (Java)  S3 (moto server)
``postgres-s3``       pyiceberg SqlCatalog on a PostgreSQL cluster  S3 (moto server)
``glue-s3``           pyiceberg GlueCatalog on moto's Glue          S3 (moto server)
====================  ===========================================  =========================

The :func:`lake` fixture is parametrised over the five: a test taking ``lake`` runs once per
set-up, with ids ``sqlite-local`` ... ``glue-s3`` (so ``-k sqlite-local`` picks one). Servers
are session-scoped and started on first use only, and stopped at the end of the session however
it ends (``try``/``finally``; the Java server also dies with this process):

- S3 and Glue: one moto server (``s3_server.moto_s3``), one bucket per test;
- REST: ``org.apache.iceberg.rest.RESTCatalogServer`` from the ``test-fixtures`` jar of
  ``org.apache.iceberg:iceberg-open-api`` (:data:`ICEBERG_VERSION`), a JdbcCatalog on SQLite
  behind it and S3FileIO on moto. Its classpath is resolved once by Maven from a generated pom
  and cached in ``~/.cache/compactor-tests/rest-catalog-server/`` (``COMPACTOR_TEST_CACHE``
  moves the root) under a file lock;
- PostgreSQL: a throwaway cluster (``initdb`` into a temporary directory, run as ``nobody`` when
  we are root; TCP on 127.0.0.1 and its socket in that directory), one database per test.

Each test gets a :class:`Lake`: its catalog's properties (written to a ``.pyiceberg.yaml`` in a
private ``PYICEBERG_HOME`` for the command line, see :meth:`Lake.cli`), a namespace of its own
and the table storage (:class:`LocalStorage` or :class:`S3Storage`) to list and plant files in.
Credentials are explicit test ones; no user AWS or pyiceberg configuration is read.

Used from a test module with
``pytest_plugins = ("support.s3_server", "support.catalog_servers")``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import boto3
import pytest
from pyiceberg.catalog import Catalog, load_catalog

from support import java_reader
from support.java_reader import file_lock
from support.s3_server import ACCESS_KEY, AWS_LEAKY, HOST, REGION, SECRET_KEY, MotoS3

SETUPS = ("sqlite-local", "sqlite-s3", "rest-s3", "postgres-s3", "glue-s3")
CATALOG_NAME = "lake"
COMPACTOR = Path(sys.executable).parent / "compactor"
CLI_TIMEOUT_S = 180

# Server start-up times of this session, shown at the end of the run (see pytest_terminal_summary).
START_TIMES: dict[str, float] = {}

_numbers = itertools.count()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if START_TIMES:
        started = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in START_TIMES.items())
        terminalreporter.write_line(f"catalog servers started: {started}")


# --------------------------------------------------------------------------------------------
# Storage: where a table's files are, listed and planted through the storage's own client
# --------------------------------------------------------------------------------------------


class Storage(Protocol):
    """A table storage: locations are ``file://`` URIs or ``s3://bucket/key``."""

    can_age: bool  # whether a file's modification time can be set (for orphan age tests)

    def key(self, location: str) -> str: ...
    def files(self, location: str) -> dict[str, int]: ...
    def put(self, location: str, body: bytes = b"junk") -> str: ...
    def exists(self, location: str) -> bool: ...
    def age(self, location: str, ms: int) -> None: ...


@dataclass(frozen=True)
class LocalStorage:
    """Files on local disk, under ``root``."""

    root: Path
    can_age: bool = True

    def key(self, location: str) -> str:
        """The local path of a ``file://`` URI (or of a plain path)."""
        if location.startswith("file://"):
            return location[len("file://") :]
        if location.startswith("file:"):
            return location[len("file:") :]
        assert "://" not in location, f"{location} is not a local location"
        return location

    def files(self, location: str) -> dict[str, int]:
        """Path -> size of every file under the directory ``location``."""
        root = Path(self.key(location))
        return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}

    def put(self, location: str, body: bytes = b"junk") -> str:
        path = Path(self.key(location))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        return location

    def exists(self, location: str) -> bool:
        return Path(self.key(location)).is_file()

    def age(self, location: str, ms: int) -> None:
        """Set the modification time of ``location`` (a file, or every file under a directory)."""
        path = Path(self.key(location))
        paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for p in paths:
            os.utime(p, ns=(ms * 1_000_000, ms * 1_000_000))


@dataclass(frozen=True)
class S3Storage:
    """Objects in one bucket of the moto server, through boto3."""

    client: Any
    bucket: str
    can_age: bool = False  # S3 sets LastModified itself

    def key(self, location: str) -> str:
        """The object key of ``s3://<bucket>/<key>`` (s3a and s3n alike), as spelled."""
        scheme, _, rest = location.partition("://")
        assert scheme in ("s3", "s3a", "s3n"), location
        bucket, _, key = rest.partition("/")
        assert bucket == self.bucket, f"{location} is not in bucket {self.bucket}"
        return key

    def files(self, location: str) -> dict[str, int]:
        """Key -> size of every object under ``location`` (a directory: ``/`` is appended)."""
        prefix = self.key(location).rstrip("/") + "/"
        found: dict[str, int] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        ):
            for item in page.get("Contents", []):
                found[item["Key"]] = item["Size"]
        return found

    def put(self, location: str, body: bytes = b"junk") -> str:
        self.client.put_object(Bucket=self.bucket, Key=self.key(location), Body=body)
        return location

    def exists(self, location: str) -> bool:
        key = self.key(location)
        response = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)
        return any(item["Key"] == key for item in response.get("Contents", []))

    def age(self, location: str, ms: int) -> None:
        raise NotImplementedError("S3 objects' LastModified cannot be set")


# --------------------------------------------------------------------------------------------
# The lake a test works on
# --------------------------------------------------------------------------------------------


@dataclass
class Lake:
    """One set-up as a test sees it: a catalog (by its properties), a namespace, the storage."""

    setup: str
    properties: dict[str, str]
    namespace: str
    storage: Storage
    home: Path  # the command line's HOME and PYICEBERG_HOME
    catalog_name: str = CATALOG_NAME
    env: dict[str, str] = field(default_factory=dict)
    _catalog: Catalog | None = field(default=None, repr=False)

    def catalog(self) -> Catalog:
        """The test's pyiceberg catalog client (one per lake: a Glue client is slow to build)."""
        if self._catalog is None:
            self._catalog = self.new_catalog()
        return self._catalog

    def new_catalog(self) -> Catalog:
        """Another pyiceberg catalog client with the lake's properties, as another writer has."""
        return load_catalog(self.catalog_name, **self.properties)

    def identifier(self, table: str) -> str:
        return f"{self.namespace}.{table}"

    def cli(self, *args: str, table: str, expect_exit: int = 0) -> dict[str, Any]:
        """Run ``compactor <args> --catalog lake --table <namespace.table> --json``; its JSON.

        The catalog comes from ``$PYICEBERG_HOME/.pyiceberg.yaml``, as a user would configure it.
        """
        command = [
            *_compactor_command(),
            *args,
            "--catalog",
            self.catalog_name,
            "--table",
            self.identifier(table),
            "--json",
        ]
        process = subprocess.run(
            command,
            cwd=self.home,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=CLI_TIMEOUT_S,
        )
        assert process.returncode == expect_exit, (
            f"{' '.join(command)} exited {process.returncode}\n"
            f"stdout:\n{process.stdout}\nstderr:\n{process.stderr}"
        )
        document: dict[str, Any] = json.loads(process.stdout)
        return document


def _compactor_command() -> list[str]:
    """The ``compactor`` console script of this interpreter, else ``python -m compactor``."""
    if COMPACTOR.is_file():
        return [str(COMPACTOR)]
    return [sys.executable, "-m", "compactor"]


def write_pyiceberg_yaml(home: Path, name: str, properties: dict[str, str]) -> Path:
    """``home/.pyiceberg.yaml`` defining catalog ``name`` (block style: strictyaml's subset)."""
    lines = ["catalog:", f"  {name}:"]
    lines += [f"    {key}: {json.dumps(value)}" for key, value in properties.items()]
    path = home / ".pyiceberg.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cli_environment(home: Path) -> dict[str, str]:
    """This process's environment without AWS, pyiceberg or compactor settings; HOME is ``home``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in AWS_LEAKY
        and not name.upper().startswith(("PYICEBERG_", "COMPACTOR_", "AWS_"))
    }
    env.update(
        HOME=str(home),
        PYICEBERG_HOME=str(home),
        COMPACTOR_HOME=str(home / "compactor-home"),
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(home / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "no-aws-credentials"),
        NO_PROXY=HOST,
        no_proxy=HOST,
    )
    return env


def isolate_test_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Explicit test credentials for boto3/pyarrow in this process; no proxies, no AWS profile.

    HOME stays: the Java reader's cache (``~/.cache/compactor-tests``) is found through it.
    """
    for name in list(os.environ):
        if name in AWS_LEAKY or name.upper().startswith("PYICEBERG_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("NO_PROXY", HOST)
    monkeypatch.setenv("no_proxy", HOST)


def s3_properties(endpoint: str) -> dict[str, str]:
    """pyiceberg's FileIO properties for the moto server."""
    return {
        "s3.endpoint": endpoint,
        "s3.access-key-id": ACCESS_KEY,
        "s3.secret-access-key": SECRET_KEY,
        "s3.region": REGION,
    }


@functools.lru_cache(maxsize=8)
def s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )


def new_bucket(client: Any, setup: str) -> str:
    bucket = f"lake-{next(_numbers):04d}-{setup}"
    client.create_bucket(Bucket=bucket)
    return bucket


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the test process dies, however it dies."""
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def stop_process_group(process: subprocess.Popen[Any], timeout: float = 10) -> None:
    """SIGTERM the process's group (it leads one), then SIGKILL if it is still there."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout)


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def cache_root() -> Path:
    """The test caches' root (``COMPACTOR_TEST_CACHE``), which the Java reader's also lives in."""
    return java_reader.cache_root().parent


# --------------------------------------------------------------------------------------------
# Apache Iceberg's REST catalog server
# --------------------------------------------------------------------------------------------

ICEBERG_VERSION = "1.10.0"
REST_MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
REST_READY_TIMEOUT_S = 90
MAVEN_TIMEOUT_S = 1800
# The iceberg-open-api pom declares no dependencies: its test fixtures' runtime dependencies
# exist only in Iceberg's Gradle build, so they are listed here (versions of Iceberg 1.10's
# gradle/libs.versions.toml where it matters: Jetty 11 for jakarta.servlet 5).
#   iceberg-core:tests       RESTCatalogAdapter, RESTCatalogServlet
#   iceberg-aws(+bundle)     S3FileIO and the AWS SDK, for an s3:// warehouse
#   jetty-server/-servlet    the HTTP server
#   sqlite-jdbc              the JdbcCatalog behind it (jdbc:sqlite:file:...)
#   hadoop-common            the server builds its catalog with a Hadoop Configuration; only the
#                            jar plus what Configuration loads (as tests/support/java/pom.xml does)
#   slf4j-simple             its log, into the server's log file
REST_DEPENDENCIES: tuple[tuple[str, str, str, str | None, bool], ...] = (
    # group, artifact, version, classifier, exclude all transitive dependencies
    ("org.apache.iceberg", "iceberg-open-api", ICEBERG_VERSION, "test-fixtures", False),
    ("org.apache.iceberg", "iceberg-core", ICEBERG_VERSION, "tests", False),
    ("org.apache.iceberg", "iceberg-aws", ICEBERG_VERSION, None, False),
    ("org.apache.iceberg", "iceberg-aws-bundle", ICEBERG_VERSION, None, False),
    ("org.eclipse.jetty", "jetty-server", "11.0.25", None, False),
    ("org.eclipse.jetty", "jetty-servlet", "11.0.25", None, False),
    ("org.xerial", "sqlite-jdbc", "3.50.3.0", None, False),
    ("org.apache.hadoop", "hadoop-common", "3.4.1", None, True),
    ("org.apache.hadoop.thirdparty", "hadoop-shaded-guava", "1.3.0", None, False),
    ("com.fasterxml.woodstox", "woodstox-core", "5.4.0", None, False),
    ("commons-collections", "commons-collections", "3.2.2", None, False),
    ("org.slf4j", "slf4j-simple", "2.0.17", None, False),
)
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss1m", "-Xmx512m")


class CatalogServerError(RuntimeError):
    """A catalog server could not be set up or did not come up."""


def rest_server_pom() -> str:
    deps = []
    for group, artifact, version, classifier, exclude_all in REST_DEPENDENCIES:
        parts = [
            f"<groupId>{group}</groupId>",
            f"<artifactId>{artifact}</artifactId>",
            f"<version>{version}</version>",
        ]
        if classifier:
            parts.append(f"<classifier>{classifier}</classifier>")
        if exclude_all:
            parts.append(
                "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId>"
                "</exclusion></exclusions>"
            )
        deps.append(f"    <dependency>{''.join(parts)}</dependency>")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>compactor.tests</groupId>\n"
        "  <artifactId>rest-catalog-server</artifactId>\n"
        "  <version>1</version>\n"
        "  <packaging>pom</packaging>\n"
        "  <dependencies>\n" + "\n".join(deps) + "\n  </dependencies>\n</project>\n"
    )


def _load_classpath(directory: Path) -> str | None:
    """The cached classpath, if complete and every jar is still in ~/.m2."""
    classpath_file = directory / "classpath.txt"
    if not classpath_file.is_file():
        return None
    jars = [j for j in classpath_file.read_text().strip().split(os.pathsep) if j]
    if not jars or not all(Path(j).is_file() for j in jars):
        return None
    return os.pathsep.join(jars)


def rest_server_classpath() -> str:
    """The REST server's classpath: resolved by Maven once per dependency set, then cached."""
    pom = rest_server_pom()
    digest = hashlib.sha256(pom.encode()).hexdigest()[:12]
    directory = cache_root() / "rest-catalog-server" / f"iceberg-{ICEBERG_VERSION}-{digest}"
    classpath = _load_classpath(directory)
    if classpath is not None:
        return classpath
    with file_lock(directory.with_name(directory.name + ".lock")):
        classpath = _load_classpath(directory)
        if classpath is not None:
            return classpath
        mvn = shutil.which("mvn")
        if mvn is None:
            raise CatalogServerError("mvn not found on PATH: the REST catalog server needs Maven")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "pom.xml").write_text(pom)
        scratch = directory / f"classpath.txt.{os.getpid()}"
        command = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(directory / "pom.xml"),
            f"{DEPENDENCY_PLUGIN}:build-classpath",
            "-Dmdep.includeScope=runtime",
            f"-Dmdep.outputFile={scratch}",
        ]
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=MAVEN_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0 or not scratch.is_file():
            output = (done.stdout + done.stderr).strip()[-6000:]
            raise CatalogServerError(
                f"resolving the REST catalog server failed (exit {done.returncode}): "
                f"{' '.join(command)}\n{output}"
            )
        scratch.rename(directory / "classpath.txt")
        classpath = _load_classpath(directory)
        if classpath is None:
            raise CatalogServerError(f"Maven left an incomplete classpath in {directory}")
        return classpath


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise CatalogServerError("java not found on PATH: the REST catalog server needs JDK 17")
    return found


def _get(url: str, timeout: float) -> int:
    """HTTP GET ``url`` without any proxy; the status code."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@dataclass(frozen=True)
class RestServer:
    uri: str
    bucket: str  # the server's warehouse is s3://<bucket>/wh
    endpoint: str  # the S3 endpoint both the server and its clients use
    log: Path


def _rest_environment(catalog_db: Path, warehouse: str, endpoint: str, port: int) -> dict[str, str]:
    """The server's configuration: CATALOG_a_b__c becomes catalog property a.b-c."""
    base = {name: os.environ[name] for name in ("PATH", "LANG", "JAVA_HOME") if name in os.environ}
    return {
        **base,
        "CATALOG_URI": f"jdbc:sqlite:file:{catalog_db}",
        "CATALOG_JDBC_SCHEMA__VERSION": "V1",
        "CATALOG_WAREHOUSE": warehouse,
        "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
        "CATALOG_S3_ENDPOINT": endpoint,
        "CATALOG_S3_PATH__STYLE__ACCESS": "true",
        "CATALOG_S3_ACCESS__KEY__ID": ACCESS_KEY,
        "CATALOG_S3_SECRET__ACCESS__KEY": SECRET_KEY,
        "CATALOG_CLIENT_REGION": REGION,
        "CATALOG_REST_PORT": str(port),
        # The AWS SDK's own lookups stay local too.
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="session")
def rest_catalog_server(
    moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestServer]:
    """Iceberg's REST catalog server on a free port, its warehouse in a bucket of moto's S3.

    Jetty in the fixture listens on every interface (it has no host setting); clients use
    127.0.0.1. Ready once ``GET /v1/config`` answers 200.
    """
    classpath = rest_server_classpath()  # outside the timing: Maven runs once per machine
    started = time.monotonic()
    directory = tmp_path_factory.mktemp("rest-catalog")
    bucket = "rest-catalog-warehouse"
    s3_client(moto_s3.endpoint).create_bucket(Bucket=bucket)
    log = directory / "server.log"
    process: subprocess.Popen[bytes] | None = None
    try:
        for attempt in range(3):  # the port may be taken between choosing and binding it
            port = free_port()
            env = _rest_environment(
                directory / "catalog.db", f"s3://{bucket}/wh", moto_s3.endpoint, port
            )
            with log.open("ab") as out:
                process = subprocess.Popen(
                    [_java(), *JVM_OPTIONS, "-cp", classpath, REST_MAIN_CLASS],
                    cwd=directory,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            uri = f"http://{HOST}:{port}"
            deadline = time.monotonic() + REST_READY_TIMEOUT_S
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    if _get(f"{uri}/v1/config", timeout=2) == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.1)
            else:
                if process.poll() is not None and attempt < 2 and "BindException" in _tail(log):
                    continue
                stop_process_group(process)
                raise CatalogServerError(
                    f"the REST catalog server did not answer GET {uri}/v1/config "
                    f"(exit {process.poll()}); its log:\n{_tail(log)}"
                )
            break
        START_TIMES["rest"] = time.monotonic() - started
        yield RestServer(uri, bucket, moto_s3.endpoint, log)
    finally:
        if process is not None:
            stop_process_group(process)


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------

POSTGRES_USER = "postgres"  # the cluster's superuser, trusted on 127.0.0.1


def _postgres_bindir(required: tuple[str, ...] = ("initdb", "pg_ctl")) -> Path | None:
    on_path = [shutil.which(name) for name in required]
    if all(on_path) and on_path[0] is not None:
        # /usr/local/bin/initdb may be a link into /usr/lib/postgresql/<v>/bin: use its home.
        directory = Path(on_path[0]).resolve().parent
        if all((directory / name).is_file() for name in required):
            return directory
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for directory in candidates:
        if all((directory / name).is_file() for name in required):
            return directory
    return None


def postgres_bindir() -> Path:
    """Where initdb and pg_ctl are; installs Debian's postgresql package when they are missing."""
    found = _postgres_bindir()
    if found is not None:
        return found
    # One installer at a time (parallel test workers); another may have finished meanwhile.
    with file_lock(java_reader.cache_root().parent / "postgresql-install.lock"):
        return _postgres_bindir() or _install_postgres()


def _install_postgres() -> Path:
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise CatalogServerError(
            "PostgreSQL server binaries (initdb, pg_ctl) not found; install them "
            "(Debian/Ubuntu: apt-get install -y postgresql)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        [apt, "update"],
        [apt, "install", "-y", "--no-install-recommends", "postgresql"],
    ):
        done = subprocess.run(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise CatalogServerError(
                f"{' '.join(command)} failed (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-4000:]}"
            )
    found = _postgres_bindir()
    if found is None:
        raise CatalogServerError("apt-get installed postgresql but initdb/pg_ctl are not found")
    return found


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    user: str
    root: Path

    def url(self, database: str, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://{self.user}@{self.host}:{self.port}/{quote(database)}"

    def create_database(self, name: str) -> None:
        import psycopg2  # the postgres extra

        connection = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, dbname="postgres"
        )
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()


def _unprivileged() -> dict[str, Any]:
    """subprocess arguments to run a command as ``nobody`` when root (initdb refuses root)."""
    if os.geteuid() != 0:
        return {}
    import pwd

    user = pwd.getpwnam("nobody")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def run_checked(
    command: list[str], timeout: float, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``command`` run to its end, its output captured; a CatalogServerError with the end of
    its output when it fails."""
    done = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )
    if done.returncode != 0:
        raise CatalogServerError(
            f"{' '.join(command[:6])} ... failed (exit {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-6000:]}"
        )
    return done


def _run_as(command: list[str], cwd: Path, timeout: float = 120) -> None:
    run_checked(
        command,
        timeout,
        cwd=cwd,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C", "LC_ALL": "C"},
        **_unprivileged(),
    )


# Runs beside the cluster: when its stdin closes (the test process ended, even by SIGKILL, or
# the fixture closed it after stopping the cluster), it stops a postmaster still running in
# ``-m immediate`` fashion (SIGQUIT) and removes the directory.
_POSTGRES_WATCHDOG = """
import os, shutil, signal, sys, time
data, root = sys.argv[1], sys.argv[2]
sys.stdin.buffer.read()
try:
    with open(os.path.join(data, "postmaster.pid")) as f:
        pid = int(f.readline())
    os.kill(pid, signal.SIGQUIT)
    for _ in range(100):
        os.kill(pid, 0)
        time.sleep(0.1)
except (OSError, ValueError):
    pass
shutil.rmtree(root, ignore_errors=True)
"""


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL cluster on 127.0.0.1; stopped (``-m immediate``) and removed after."""
    bindir = postgres_bindir()  # outside the timing: installs at most once per machine
    started = time.monotonic()
    # Not under pytest's tmp dirs: those are private to root, and the cluster runs as nobody.
    root = Path(tempfile.mkdtemp(prefix="compactor-pg-"))
    data = root / "data"
    running = False
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _POSTGRES_WATCHDOG, str(data), str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of the test run must not stop it early
    )
    try:
        privileges = _unprivileged()
        if privileges:
            os.chown(root, privileges["user"], privileges["group"])
        _run_as(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                POSTGRES_USER,
                "--auth=trust",
                "--no-sync",
                "--encoding=UTF8",
                "--locale=C",
            ],
            cwd=root,
        )
        for attempt in range(3):  # the port may be taken between choosing and binding it
            port = free_port()
            options = (
                f"-c listen_addresses={HOST} -p {port} -k {root} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            try:
                running = True  # a failed start may leave a postmaster behind: stop it anyway
                _run_as(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(data),
                        "-l",
                        str(root / "server.log"),
                        "-w",
                        "-t",
                        "60",
                        "-o",
                        options,
                        "start",
                    ],
                    cwd=root,
                    timeout=90,
                )
                break
            except CatalogServerError as e:
                if attempt == 2 or "could not bind" not in _tail(root / "server.log"):
                    raise CatalogServerError(
                        f"{e}\nserver log:\n{_tail(root / 'server.log')}"
                    ) from e
        START_TIMES["postgres"] = time.monotonic() - started
        yield PostgresServer(HOST, port, POSTGRES_USER, root)
    finally:
        if running:
            with contextlib.suppress(Exception):
                _run_as(
                    [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                    cwd=root,
                    timeout=60,
                )
        shutil.rmtree(root, ignore_errors=True)
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        try:
            watchdog.wait(30)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()


# --------------------------------------------------------------------------------------------
# The lake fixture
# --------------------------------------------------------------------------------------------


def _lake(setup: str, request: pytest.FixtureRequest, home: Path) -> Lake:
    """Start (or reuse) the set-up's servers and give the test its own catalog and namespace."""
    number = next(_numbers)
    namespace = f"ns_{number:04d}"
    if setup == "sqlite-local":
        warehouse = home / "warehouse"
        warehouse.mkdir()
        properties = {
            "type": "sql",
            "uri": f"sqlite:///{home / 'catalog.db'}",
            "warehouse": warehouse.as_uri(),
        }
        return Lake(setup, properties, namespace, LocalStorage(warehouse), home)

    moto: MotoS3 = request.getfixturevalue("moto_s3")
    client = s3_client(moto.endpoint)
    if setup == "rest-s3":
        server: RestServer = request.getfixturevalue("rest_catalog_server")
        properties = {"type": "rest", "uri": server.uri, **s3_properties(moto.endpoint)}
        return Lake(setup, properties, namespace, S3Storage(client, server.bucket), home)

    bucket = new_bucket(client, setup)
    warehouse_uri = f"s3://{bucket}/wh"
    if setup == "sqlite-s3":
        properties = {"type": "sql", "uri": f"sqlite:///{home / 'catalog.db'}"}
    elif setup == "postgres-s3":
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        database = f"lake_{number:04d}"
        postgres.create_database(database)
        properties = {"type": "sql", "uri": postgres.url(database)}
    elif setup == "glue-s3":
        properties = {
            "type": "glue",
            "glue.endpoint": moto.endpoint,
            "glue.region": REGION,
            "glue.access-key-id": ACCESS_KEY,
            "glue.secret-access-key": SECRET_KEY,
        }
    else:
        raise ValueError(f"unknown set-up {setup!r}")
    properties.update(warehouse=warehouse_uri, **s3_properties(moto.endpoint))
    return Lake(setup, properties, namespace, S3Storage(client, bucket), home)


@pytest.fixture(params=SETUPS)
def lake(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lake:
    """One of the five set-ups (see the module docstring), with a fresh namespace."""
    home = tmp_path / "home"
    home.mkdir()
    lake = _lake(request.param, request, home)
    isolate_test_process(monkeypatch)
    lake.env = cli_environment(home)
    write_pyiceberg_yaml(home, lake.catalog_name, lake.properties)
    lake.catalog().create_namespace(lake.namespace)
    return lake
