"""A throwaway S3 server for ``--s3 local``: moto on 127.0.0.1 that counts the requests it answers.

Counting at the server sees every request whichever client sent it (DuckDB's httpfs, pyarrow's
AWS SDK), which is how the benchmark reports GET requests for a local run. With a latency, each
request waits that long before moto answers it: a fixed time to first byte, as object stores
have (tens of milliseconds) and a loopback server does not. Requests wait side by side, so it
emulates latency, not bandwidth.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"
ACCESS_KEY = SECRET_KEY = "compactor-bench"
REGION = "us-east-1"


class RequestCounter:
    """WSGI middleware counting requests by HTTP method, then answering each after ``latency_s``."""

    def __init__(
        self,
        app: Callable[..., Any],
        latency_s: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._app, self._latency_s, self._sleep = app, latency_s, sleep
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        with self._lock:
            self._counts[environ["REQUEST_METHOD"]] += 1
        if self._latency_s > 0:
            self._sleep(self._latency_s)
        return self._app(environ, start_response)

    def count(self, method: str) -> int:
        """Requests with ``method`` answered so far."""
        with self._lock:
            return self._counts[method]


@dataclass(frozen=True)
class LocalS3:
    """The running server: its endpoint, credentials and request counter."""

    endpoint: str
    counter: RequestCounter

    def properties(self) -> dict[str, str]:
        """pyiceberg ``s3.*`` FileIO properties for this server."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
        }


@contextmanager
def local_s3(latency_s: float = 0.0) -> Iterator[LocalS3]:
    """Start moto's S3 on a port the OS picks on 127.0.0.1; stop it (and drop its data) after.

    Every request is answered ``latency_s`` seconds late (see the module docstring).
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
    server.start()
    access_log = logging.getLogger("werkzeug")  # one line per request otherwise
    level = access_log.level
    access_log.setLevel(logging.WARNING)
    try:
        host, port = server.get_host_and_port()
        wsgi = server._server  # moto reads its WSGI app per request: wrap it to count
        assert wsgi is not None
        counter = RequestCounter(wsgi.app, latency_s)
        wsgi.app = counter
        yield LocalS3(f"http://{host}:{port}", counter)
    finally:
        access_log.setLevel(level)
        server.stop()
