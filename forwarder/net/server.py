"""The forwarder's small HTTP servers (/metrics and /healthz, the drain probe), bounded.

Both answer a load balancer or a scraper on the VM itself: a request at a time is the norm, but
nothing outside must be able to make the forwarder start a thread per connection (its systemd
unit has a TasksMax). At most ``max_connections`` requests are served at once; one more is
closed at once, unanswered (the prober or scraper retries at its next interval), and the
listen backlog is as short.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.request_queue_size = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__((address, port), handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: the client retries
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
