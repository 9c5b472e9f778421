"""A threaded loopback HTTP server with a recorded request log (shared by the fakes)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

MAX_BODY = 1 << 20


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)  # when the request came in (wall clock)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Reply:
    status: int
    body: Any = None  # dict/list -> JSON, bytes/str sent as is
    headers: dict[str, str] = field(default_factory=dict)


class LoopbackServer:
    """Subclasses implement ``handle(request) -> Reply``; it runs under ``self.lock``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.requests: list[Request] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def handle(self, request: Request) -> Reply:  # pragma: no cover - abstract
        raise NotImplementedError

    def delay(self, request: Request) -> float:
        """Seconds to wait before handling ``request``, outside the lock (slow-server faults)."""
        return 0.0

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> Self:
        """Serve on 127.0.0.1:``port`` (0: a free one) in a thread."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body leave in one segment: no Nagle / delayed-ACK stalls of ~40 ms.
            wbufsize = -1
            disable_nagle_algorithm = True

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, MAX_BODY)) if length else b""
                parts = urlsplit(self.path)
                request = Request(
                    method=self.command,
                    path=parts.path,
                    query={k: v[0] for k, v in parse_qs(parts.query).items()},
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
                pause = fake.delay(request)
                if pause > 0:
                    time.sleep(pause)
                with fake.lock:
                    fake.requests.append(request)
                    reply = fake.handle(request)
                if isinstance(reply.body, dict | list):
                    payload = json.dumps(reply.body).encode()
                    content_type = "application/json; charset=utf-8"
                elif isinstance(reply.body, str):
                    payload, content_type = reply.body.encode(), "text/plain; charset=utf-8"
                else:
                    payload, content_type = reply.body or b"", "application/octet-stream"
                self.send_response(reply.status)
                headers = {"Content-Type": content_type, **reply.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests read self.requests; stderr stays quiet

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            daemon=True,
            name=type(self).__name__,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
