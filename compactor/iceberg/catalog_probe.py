"""Before a catalog is opened: its client's driver is installed, and its server accepts a
connection at all, within ``--catalog-timeout``.

pyiceberg gives its catalogs no connect timeout and Glue's client retries a refused connection
for about 20 s, so a catalog that is down took 15-20 s to be reported. One TCP connection to the
server the catalog's settings name (REST and Hive ``uri``, a SQL database's host, Glue's
endpoint) tells within the timeout; a catalog that answers is then opened as before.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from compactor.durations import parse_duration_ms
from compactor.errors import CatalogUnreachableError, first_line
from compactor.options.defaults import DEFAULT_CATALOG_TIMEOUT

CATALOG_TIMEOUT_VARIABLE = "COMPACTOR_CATALOG_TIMEOUT"
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306, "thrift": 9083}


def catalog_timeout_s(given: str | None = None) -> float:
    """``--catalog-timeout``, else ``$COMPACTOR_CATALOG_TIMEOUT``, else the default, in seconds."""
    if given is not None:
        return parse_duration_ms(given, "--catalog-timeout") / 1000
    text = os.environ.get(CATALOG_TIMEOUT_VARIABLE) or DEFAULT_CATALOG_TIMEOUT
    return parse_duration_ms(text, CATALOG_TIMEOUT_VARIABLE) / 1000


def catalog_server(properties: Mapping[str, Any]) -> tuple[str, int] | None:
    """The host and port a catalog with these settings connects to first; None when there is
    none to probe (SQLite, a catalog type not known here, AWS's Glue with no region set)."""
    uri = str(properties.get("uri") or "")
    if str(properties.get("type") or "").lower() == "glue":
        region = properties.get("glue.region") or properties.get("client.region")
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        uri = str(properties.get("glue.endpoint") or "")
        uri = uri or (f"https://glue.{region}.amazonaws.com" if region else "")
    scheme = urlsplit(uri).scheme.split("+")[0].lower()
    if scheme not in DEFAULT_PORTS:
        return None
    parts = urlsplit(uri)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or DEFAULT_PORTS[scheme]


# The module a SQLAlchemy URL's dialect loads when it names no driver (``postgresql://``).
DEFAULT_SQL_DRIVERS = {"postgresql": "psycopg2", "mysql": "MySQLdb"}


def missing_driver(properties: Mapping[str, Any]) -> str | None:
    """The Python module the catalog's client needs and this process lacks, if any: the SQL
    driver a ``uri`` names (``postgresql+pg8000://``), boto3 for Glue, thrift for Hive."""
    uri = str(properties.get("uri") or "")
    scheme = urlsplit(uri).scheme.lower()
    dialect, _, driver = scheme.partition("+")
    if str(properties.get("type") or "").lower() == "glue":
        module = "boto3"
    elif dialect == "thrift":
        module = "thrift"
    else:
        module = driver or DEFAULT_SQL_DRIVERS.get(dialect, "")
    return module if module and importlib.util.find_spec(module) is None else None


def _through_proxy(host: str, scheme: str) -> bool:
    """Whether the process's proxy settings send requests to ``host`` through a proxy."""
    proxies = urllib.request.getproxies()
    return bool(proxies.get(scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(host)


def probe_catalog(name: str, properties: Mapping[str, Any], timeout_s: float) -> None:
    """Raise :class:`CatalogUnreachableError` when the catalog's server does not accept a
    connection within ``timeout_s``; nothing when it does or there is nothing to probe."""
    server = catalog_server(properties)
    if server is None:
        return
    host, port = server
    scheme = "https" if port == 443 else "http"
    if _through_proxy(host, scheme):
        return  # the proxy, not this process, connects to the server
    try:
        socket.create_connection(server, timeout=timeout_s).close()
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else first_line(exc)
        raise CatalogUnreachableError(
            f"catalog {name!r} is unreachable: {host}:{port}: {reason} "
            f"(--catalog-timeout {timeout_s:g}s)"
        ) from exc
