"""A loopback IMDS for tests: serves exactly the document the test sets, and misbehaves on
demand in the ways the IMDS simulator does not (a body that trickles, never ends, is huge, or
stalls; EventIds and field values no scenario would accept).

    with ImdsStub() as imds:
        imds.set_events([{"EventId": ..., ...}])
        imds.mode = "trickle"            # the next GETs send one byte every trickle_every s
        ... sebridge forwarder --imds-endpoint imds.url ...
        imds.gets()                      # monotonic times of the scheduled-events GETs

Only 127.0.0.1. Every misbehaviour is bounded: a trickle or a stall ends with the server, an
endless body after :data:`ENDLESS_LIMIT` bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

MODES = ("normal", "trickle", "endless", "huge", "stall", "stall-body", "500")
ENDLESS_LIMIT = 256 * 1024 * 1024  # bytes: a test's endless body still ends
NOT_FOUND_HTML = (
    "<!DOCTYPE html><html><head><title>404 - Not Found</title></head><body>"
    + "<h1>Not Found</h1><p>The resource you are looking for has been removed.</p>" * 5
    + "</body></html>"
)


@dataclass(frozen=True)
class Request:
    at: float  # time.monotonic() when it arrived
    method: str
    path: str
    body: bytes


class ImdsStub:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.incarnation = 1
        # Served instead of the incarnation number when set (an odd DocumentIncarnation).
        self.incarnation_as: Any = None
        self.mode = "normal"
        self.trickle_every = 3.0  # seconds between the bytes of a trickling body
        self.stall_for = 120.0  # seconds a stalled request is held (or until the server stops)
        self.instance_status = 404  # instance metadata: 404 with an HTML page, or 200
        # What instance metadata's "compute" holds (None: a name, vmId, resource id, group and
        # subscription).
        self.instance_compute: dict[str, Any] | None = None
        self.instance_hang = 0.0  # seconds an instance metadata request is held before it answers
        self.instance_in_flight = 0  # instance metadata requests being held now
        self.error_body = b'{"error": "Internal server error"}'  # what mode "500" answers
        self.requests: list[Request] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- the test's side ------------------------------------------------------------------------
    def set_events(self, events: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            self.events = [dict(e) for e in events]
            self.incarnation += 1

    def document_bytes(self) -> bytes:
        with self._lock:
            incarnation = self.incarnation if self.incarnation_as is None else self.incarnation_as
            return json.dumps({"DocumentIncarnation": incarnation, "Events": self.events}).encode()

    def gets(self) -> list[float]:
        with self._lock:
            return [r.at for r in self.requests if r.method == "GET"]

    def posts(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == "POST"]

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ImdsStub:
        stub = self

        class Handler(_Handler):
            imds = stub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _record(self, method: str, path: str, body: bytes) -> None:
        with self._lock:
            self.requests.append(Request(time.monotonic(), method, path, body))


def max_in_any_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most requests that started within any ``window`` seconds (a sliding window)."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, at in enumerate(ordered):
        while at - ordered[start] >= window - 1e-9:  # exactly a window apart: not within it
            start += 1
        best = max(best, end - start + 1)
    return best


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    imds: ImdsStub

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        self.imds._record("GET", path, b"")
        if path == "/metadata/instance":
            self._instance()
        elif path == "/metadata/scheduledevents":
            self._document()
        else:
            self._send(404, NOT_FOUND_HTML.encode(), "text/html")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0") or 0)
        body = self.rfile.read(min(length, 65536))
        self.imds._record("POST", urlsplit(self.path).path, body)
        self._send(200, b"", "application/json")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _instance(self) -> None:
        if self.imds.instance_hang > 0:
            with self.imds._lock:
                self.imds.instance_in_flight += 1
            try:
                self.imds.stopping.wait(self.imds.instance_hang)
            finally:
                with self.imds._lock:
                    self.imds.instance_in_flight -= 1
        if self.imds.instance_status != 200:
            self._send(self.imds.instance_status, NOT_FOUND_HTML.encode(), "text/html")
            return
        compute = self.imds.instance_compute or {  # an identity, as Azure's always is
            "name": "stub-vm",
            "vmId": "5a5a5a5a-0000-4000-8000-000000000001",
            "resourceId": "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/"
            "virtualMachines/stub-vm",
            "resourceGroupName": "rg",
            "subscriptionId": "sub",
        }
        self._send(200, json.dumps({"compute": compute}).encode())

    def _document(self) -> None:
        imds, mode = self.imds, self.imds.mode
        body = imds.document_bytes()
        if mode == "normal":
            self._send(200, body)
        elif mode == "500":
            self._send(500, imds.error_body)
        elif mode == "stall":
            imds.stopping.wait(imds.stall_for)  # not a byte, not even the status line
            self.close_connection = True
        elif mode == "huge":
            padding = b" " * (5 * 1024 * 1024)
            self._send(200, body[:-1] + padding + body[-1:])
        elif mode == "endless":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.close_connection = True
            chunk = b" " * 65536
            frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            for _ in _bounded(ENDLESS_LIMIT // len(chunk), imds.stopping):
                try:
                    self.wfile.write(frame)
                except OSError:
                    return
        else:  # trickle, stall-body: the headers, then the body a byte at a time, or not at all
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            if mode == "stall-body":
                self.wfile.write(body[:1])
                self.wfile.flush()
                imds.stopping.wait(imds.stall_for)
                return
            for byte in _paced(body, imds.trickle_every, imds.stopping):
                try:
                    self.wfile.write(byte)
                    self.wfile.flush()
                except OSError:
                    return


def _bounded(count: int, stopping: threading.Event) -> Iterator[int]:
    for i in range(count):
        if stopping.is_set():
            return
        yield i


def _paced(body: bytes, every: float, stopping: threading.Event) -> Iterator[bytes]:
    for i in range(len(body)):
        if stopping.wait(every if i else 0):
            return
        yield body[i : i + 1]
