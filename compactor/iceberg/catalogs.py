"""Load catalogs the way pyiceberg users configure them, with an embedded SQLite default.

``--catalog NAME`` selects a catalog from ``~/.pyiceberg.yaml`` (or ``$PYICEBERG_HOME``) or from
``PYICEBERG_CATALOG__<NAME>__*`` environment variables. Without it, pyiceberg's default catalog
is used when one is configured; otherwise the embedded catalog: SQLite at
``$COMPACTOR_HOME/catalog.db`` with its warehouse in ``$COMPACTOR_HOME/warehouse``
(``COMPACTOR_HOME`` defaults to ``~/.local/share/compactor``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.utils.config import Config

from compactor.errors import (
    CatalogUnreachableError,
    ConfigError,
    TableMetadataMissingError,
    TableNotFoundError,
    UsageError,
    first_line,
)
from compactor.iceberg.catalog_probe import catalog_timeout_s, missing_driver, probe_catalog
from compactor.iceberg.pyiceberg_compat import with_s3_retries
from compactor.redaction import register_secrets

EMBEDDED_CATALOG = "default"
# Namespaces are listed this deep at most (a guard against catalogs that list a namespace as
# its own child).
NAMESPACE_DEPTH = 8


def compactor_home() -> Path:
    """Directory of the embedded catalog and warehouse."""
    configured = os.environ.get("COMPACTOR_HOME")
    if configured:
        return Path(configured).expanduser().resolve()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "compactor"


def embedded_catalog() -> SqlCatalog:
    """The embedded SQLite catalog under :func:`compactor_home` (created on first use)."""
    home = compactor_home()
    (home / "warehouse").mkdir(parents=True, exist_ok=True)
    return SqlCatalog(
        EMBEDDED_CATALOG,
        uri=f"sqlite:///{home / 'catalog.db'}",
        warehouse=(home / "warehouse").as_uri(),
        **with_s3_retries({}),
    )


# Drivers a catalog may need, and the extra that installs each.
EXTRA_FOR_MODULE = {
    "psycopg2": "postgres",
    "boto3": "s3",
    "botocore": "s3",
    "ray": "ray",
    "thrift": "hive",
}


def catalog_properties(name: str | None, config: Config | None = None) -> dict[str, Any] | None:
    """The configured properties of catalog ``name`` (None: pyiceberg's default), or None for
    the embedded catalog; a ConfigError when ``name`` is configured nowhere. Reads no catalog."""
    config = config or Config()
    if name is None:
        return config.get_catalog_config(config.get_default_catalog_name())
    properties = config.get_catalog_config(name)
    if properties is None and name != EMBEDDED_CATALOG:
        raise ConfigError(
            f"catalog {name!r} is not configured: define it in ~/.pyiceberg.yaml or with "
            f"PYICEBERG_CATALOG__{name.upper()}__URI (and __TYPE, __WAREHOUSE)"
        )
    return properties


def open_catalog(name: str | None, timeout: str | None = None) -> Catalog:
    """Open the catalog named ``name``, pyiceberg's configured default, or the embedded one.

    The embedded catalog answers to its own name too, unless a catalog of that name is configured.
    The configuration is read now, not when pyiceberg was imported, and passed on as is. A
    catalog whose server accepts no connection within ``timeout`` (``--catalog-timeout``; see
    :func:`~compactor.iceberg.catalog_probe.catalog_timeout_s`) is reported unreachable.
    """
    config = Config()
    properties = catalog_properties(name, config)
    if properties is None:
        return embedded_catalog()
    name = name or config.get_default_catalog_name()
    register_secrets(properties)
    driver = missing_driver(properties)  # a missing driver says more than an unreachable server
    if driver is not None:
        raise _needs_module(name, driver)
    probe_catalog(name, properties, catalog_timeout_s(timeout))
    try:
        return load_catalog(name, **cast(dict[str, str | None], with_s3_retries(properties)))
    except Exception as exc:
        missing = _missing_module(exc)
        if missing:
            raise _needs_module(name, missing) from exc
        if _unreachable(exc):
            raise CatalogUnreachableError(
                f"catalog {name!r} is unreachable: {first_line(exc)}"
            ) from exc
        raise ConfigError(f"catalog {name!r}: {first_line(exc)}") from exc


def _needs_module(name: str, module: str) -> ConfigError:
    """The error for catalog ``name`` needing ``module``, naming the extra that installs it."""
    extra = EXTRA_FOR_MODULE.get(module.split(".")[0])
    how = f"pip install 'compactor[{extra}]'" if extra else f"pip install {module}"
    return ConfigError(
        f"catalog {name!r}: needs the Python module {module!r}, which is not installed ({how})"
    )


# Exceptions (by class name, so that no optional driver is imported) meaning that the catalog's
# server did not answer: requests and urllib3 (REST), SQLAlchemy (SQL), botocore (Glue).
_UNREACHABLE = frozenset(
    {
        "ConnectionError",  # builtin, requests
        "ConnectTimeout",
        "ReadTimeout",
        "TimeoutError",
        "NewConnectionError",
        "MaxRetryError",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "OperationalError",  # SQLAlchemy: the database refused, timed out or cannot be opened
    }
)


# What a database that answered says when it refuses the settings' user, password or database
# (PostgreSQL, MySQL): a configuration error, not an unreachable catalog.
_LOGIN_REFUSED = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "FATAL:  role",
    "FATAL:  database",
    "Access denied for user",
)


def _unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc``, or anything in its chain of causes, says the server did not answer."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(m in str(exc) for m in _LOGIN_REFUSED):
            return False
        if any(cls.__name__ in _UNREACHABLE for cls in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _missing_module(exc: BaseException | None) -> str | None:
    """The module whose import failed somewhere in ``exc``'s chain of causes, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return exc.name
        exc = exc.__cause__ or exc.__context__
    return None


def parse_identifier(identifier: str) -> tuple[str, ...]:
    """Split ``db.table`` (or ``a.b.table``) into a pyiceberg identifier."""
    parts = tuple(identifier.split("."))
    if len(parts) < 2 or not all(parts):
        raise UsageError(f"--table {identifier!r}: expected NAMESPACE.TABLE, e.g. db.events")
    return parts


def identifier_of(table: Table) -> str:
    """``namespace.table`` of a table loaded from a catalog: how messages and results name it."""
    return ".".join(table.name())


def open_table(catalog: Catalog, identifier: str) -> Table:
    """Load a table, turning 'not found' into one clear line naming what is missing."""
    parts = parse_identifier(identifier)
    try:
        return catalog.load_table(parts)
    except FileNotFoundError as exc:
        raise TableMetadataMissingError(
            f"table {identifier}: its metadata file is missing from storage "
            f"(catalog {catalog.name!r} points at it): {first_line(exc)}"
        ) from None
    except NoSuchTableError:
        namespace = ".".join(parts[:-1])
        try:
            namespace_exists = catalog.namespace_exists(namespace)
        except Exception:
            namespace_exists = True
        if not namespace_exists:
            raise TableNotFoundError(
                f"table {identifier}: namespace {namespace!r} does not exist in catalog {catalog.name!r}"
            ) from None
        raise TableNotFoundError(
            f"table {identifier}: no such table in catalog {catalog.name!r}"
        ) from None
    except NoSuchNamespaceError:
        raise TableNotFoundError(
            f"table {identifier}: namespace {'.'.join(parts[:-1])!r} does not exist in catalog {catalog.name!r}"
        ) from None
    except Exception as exc:
        if _unreachable(exc):
            raise CatalogUnreachableError(
                f"table {identifier}: catalog {catalog.name!r} is unreachable: {first_line(exc)}"
            ) from exc
        raise


def all_namespaces(catalog: Catalog) -> list[tuple[str, ...]]:
    """Every namespace of ``catalog``, nested ones included (a namespace dropped meanwhile is skipped)."""
    found: list[tuple[str, ...]] = []
    pending = [tuple(ns) for ns in catalog.list_namespaces()]
    while pending:
        namespace = pending.pop()
        found.append(namespace)
        if len(namespace) < NAMESPACE_DEPTH:
            try:
                pending.extend(tuple(ns) for ns in catalog.list_namespaces(namespace))
            except NoSuchNamespaceError:
                continue
    return sorted(found)
