"""The dashboard's paths: its pages (one HTML shell the scripts fill in), their static files
from the package, and the JSON API. GET only; nothing here changes a table.

With a token configured, every path here needs it (``/metrics`` and ``/healthz`` are served
before these and stay open).
"""

from __future__ import annotations

import json
import logging
import re
from email.message import Message
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from compactor.daemon.dashboard.access import presented_token, token_cookie, token_matches
from compactor.daemon.dashboard.api import DashboardApi
from compactor.errors import first_line
from compactor.redaction import redact

log = logging.getLogger("compactor.daemon.dashboard")

Response = tuple[int, dict[str, str], bytes]

STATIC = resources.files("compactor.daemon.dashboard") / "static"
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The pages: each is the same shell, which renders the one its path names.
PAGES = re.compile(r"^/(?:|runs|jobs|tables/[^/]+)$")
DEFAULT_RUNS = 100
# Everything is served from this daemon: nothing from another host, no inline script or style.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
UNAUTHORISED_PAGE = (
    b"<!doctype html><title>compactor: token needed</title>"
    b"<p>This dashboard needs its token: open it once as <code>/?token=...</code> "
    b"(a cookie keeps it), or send <code>Authorization: Bearer ...</code>.</p>"
)


class Dashboard:
    """Answers the dashboard's GETs (the daemon's HTTP endpoint hands it every other path)."""

    def __init__(self, api: DashboardApi, token: str | None) -> None:
        self.api = api
        self.token = token

    def handle(self, target: str, headers: Message) -> Response:
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        api = path.startswith("/api/")
        if self.token is not None:
            given = query.get("token", [None])[0]
            if not api and given is not None and token_matches(self.token, given):
                # Once, from a link: a cookie keeps the token, and the address drops it.
                rest = urlencode({k: v for k, v in query.items() if k != "token"}, doseq=True)
                location = path + (f"?{rest}" if rest else "")
                cookie = token_cookie(self.token)
                return _reply(303, "text/plain", b"", Location=location, **{"Set-Cookie": cookie})
            if not token_matches(self.token, presented_token(headers)):
                challenge = {"WWW-Authenticate": "Bearer"}
                if api:
                    return _json(401, {"error": "this API needs the daemon's token"}, **challenge)
                return _reply(401, STATIC_TYPES[".html"], UNAUTHORISED_PAGE, **challenge)
        try:
            if api:
                return self._api(path, query)
            if PAGES.match(path):
                return _static("index.html")
            if path.startswith("/static/"):
                return _static(path.removeprefix("/static/"))
        except Exception as exc:
            log.warning("dashboard request failed", exc_info=True)
            return _json(500, {"error": redact(first_line(exc))})
        return _reply(404, "text/plain; charset=utf-8", b"not found\n")

    def _api(self, path: str, query: dict[str, list[str]]) -> Response:
        if path == "/api/v1/tables":
            return _json(200, self.api.tables())
        if path.startswith("/api/v1/tables/"):
            name = unquote(path.removeprefix("/api/v1/tables/"))
            table = self.api.table(name)
            if table is None:
                return _json(404, {"error": redact(f"no job covers table {name}")})
            return _json(200, table)
        if path == "/api/v1/runs":
            limit = query.get("limit", [str(DEFAULT_RUNS)])[0]
            if not limit.isdigit():
                return _json(400, {"error": "limit: give a number of runs"})
            return _json(200, self.api.runs(int(limit)))
        if path == "/api/v1/jobs":
            return _json(200, self.api.job_list())
        return _json(404, {"error": "no such API path: see /api/v1/tables, runs, jobs"})


def _static(name: str) -> Response:
    """A file of the package's static folder (a plain name: no folders, no ``..``)."""
    suffix = name[name.rfind(".") :] if "." in name else ""
    resource = STATIC / name
    if "/" in name or suffix not in STATIC_TYPES or not resource.is_file():
        return _reply(404, "text/plain; charset=utf-8", b"not found\n")
    return _reply(200, STATIC_TYPES[suffix], resource.read_bytes())


def _json(status: int, document: dict[str, Any], **headers: str) -> Response:
    return _reply(status, "application/json", json.dumps(document).encode(), **headers)


def _reply(status: int, content_type: str, body: bytes, **headers: str) -> Response:
    return status, {"Content-Type": content_type, **SECURITY_HEADERS, **headers}, body
