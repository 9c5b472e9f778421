"""HTTP triggers on loopback: `/<routePrefix>/<route>` -> azure.functions.HttpRequest -> response.

The request is handed to azure.functions' own HttpRequestConverter in the shape the host sends
it, and the function's HttpResponse (or str) goes back through HttpResponseConverter, so what
the function sees and returns matches Azure. Routes use the Functions template syntax:
`{name}`, `{name:int}` (int, long, alpha, bool, guid, double, float, decimal are enforced; other
constraints accept any segment), `{name?}` optional, `{*rest}` catch-all. Literals match
case-insensitively, as in ASP.NET routing. Auth levels are not enforced locally (Core Tools
does not either). A method the route does not allow answers 404, as the host does.
No function output -> 204; an exception -> 500 with an empty body.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from azure.functions import meta
from azure.functions.http import HttpRequestConverter, HttpResponseConverter

from emulators.functions_host.bindings import ALL_HTTP_METHODS, FunctionSpec, HttpTrigger
from emulators.functions_host.dispatcher import describe_error
from emulators.functions_host.invoke import FunctionInvoker
from emulators.functions_host.logs import event
from emulators.functions_host.sbclient import OutputSender

MAX_BODY_BYTES = 100 * 1024 * 1024  # the Functions HTTP request limit

_CONSTRAINTS = {
    "int": r"-?\d+",
    "long": r"-?\d+",
    "alpha": r"[A-Za-z]+",
    "bool": r"(?i:true|false)",
    "guid": r"[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}",
    "double": r"-?\d+(?:\.\d+)?",
    "float": r"-?\d+(?:\.\d+)?",
    "decimal": r"-?\d+(?:\.\d+)?",
}
_PARAM = re.compile(r"\{([^{}]+)\}")


class RouteError(ValueError):
    pass


@dataclass(frozen=True)
class Route:
    template: str
    pattern: re.Pattern[str]
    names: tuple[str, ...]  # route parameter names, by regex group index


def compile_route(prefix: str, route: str) -> Route:
    """Compile a Functions route template (with the host's routePrefix) to a regex."""
    segments = [s for s in (prefix.strip("/") + "/" + route.strip("/")).split("/") if s]
    names: list[str] = []
    regex = ""
    for segment in segments:
        piece = ""
        optional = False
        position = 0
        for match in _PARAM.finditer(segment):
            piece += re.escape(segment[position : match.start()])
            position = match.end()
            spec = match.group(1).strip()
            group = f"p{len(names)}"
            if spec.startswith("*"):
                names.append(spec.lstrip("*"))
                piece += f"(?P<{group}>.*)"
                optional = True
                continue
            if spec.endswith("?"):
                optional = True
                spec = spec[:-1]
            name, _, constraint = spec.partition(":")
            name = name.split("=", 1)[0].strip()
            if not name:
                raise RouteError(f"route {route!r}: empty parameter name")
            names.append(name)
            body = _CONSTRAINTS.get(constraint.split("(", 1)[0].strip().lower(), r"[^/]+")
            piece += f"(?P<{group}>{body})"
        piece += re.escape(segment[position:])
        regex += f"(?:/{piece})?" if optional else f"/{piece}"
    if len(set(names)) != len(names):
        raise RouteError(f"route {route!r}: a parameter name appears twice")
    pattern = re.compile(f"^{regex or '/'}/?$", re.IGNORECASE)
    return Route(template=route, pattern=pattern, names=tuple(names))


@dataclass(frozen=True)
class HttpFunction:
    spec: FunctionSpec
    trigger: HttpTrigger
    invoker: FunctionInvoker
    route: Route


def match_route(
    functions: Sequence[HttpFunction], method: str, path: str
) -> tuple[HttpFunction, dict[str, str]] | None:
    for function in functions:
        found = function.route.pattern.match(path)
        if found is None or method.upper() not in function.trigger.methods:
            continue
        params = {
            name: unquote(found.group(f"p{i}"))
            for i, name in enumerate(function.route.names)
            if found.group(f"p{i}") is not None
        }
        return function, params
    return None


def build_request(
    method: str, url: str, headers: dict[str, str], route_params: dict[str, str], body: bytes
) -> Any:
    """An azure.functions.HttpRequest through the package's own converter."""
    query: dict[str, str] = {}
    for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        query[key] = f"{query[key]},{value}" if key in query else value
    datum = meta.Datum(
        type="http",
        value={
            "method": meta.Datum(type="string", value=method.upper()),
            "url": meta.Datum(type="string", value=url),
            "headers": {k.lower(): meta.Datum(type="string", value=v) for k, v in headers.items()},
            "query": {k: meta.Datum(type="string", value=v) for k, v in query.items()},
            "params": {k: meta.Datum(type="string", value=v) for k, v in route_params.items()},
            "body": meta.Datum(type="bytes", value=body),
        },
    )
    return HttpRequestConverter.decode(datum, trigger_metadata=None)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def build_response(value: Any) -> Response:
    """The function's output (HttpResponse, str or None) as the host would send it."""
    if value is None:
        return Response(204, [], b"")
    datum = HttpResponseConverter.encode(value, expected_type=None)
    if datum.type == "string":
        return Response(200, [("Content-Type", "text/plain; charset=utf-8")], datum.value.encode())
    fields = datum.value
    headers = [(name, header.value) for name, header in fields["headers"].items()]
    for cookie in fields.get("cookies") or []:
        headers += [("Set-Cookie", morsel.OutputString()) for morsel in cookie.values()]
    body = fields["body"].value or b""
    if isinstance(body, str):
        body = body.encode("utf-8")
    return Response(int(fields["status_code"].value), headers, body)


# The host's own webhook endpoints (e.g. /runtime/webhooks/eventgrid): lower-case path ->
# handler(method, url, headers, body). They take any method, as the host's do.
Webhook = Callable[[str, str, dict[str, str], bytes], "Response"]


class HttpHost:
    """A ThreadingHTTPServer bound to loopback that routes to the app's HTTP functions."""

    def __init__(
        self,
        functions: Sequence[HttpFunction],
        outputs: OutputSender,
        logger: logging.Logger,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        status: dict[str, Any] | None = None,
        webhooks: Mapping[str, Webhook] | None = None,
        listener: socket.socket | None = None,
    ) -> None:
        self.functions = list(functions)
        self.webhooks = {path.lower().rstrip("/"): hook for path, hook in (webhooks or {}).items()}
        self.outputs = outputs
        self.logger = logger
        self.status = status or {}
        if listener is None:
            self._server = _Server((host, port), _Handler)
        else:
            self._server = _Server.on(listener)
        self._server.host = self
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        return str(self._server.server_address[0])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="functions-host-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def handle(self, method: str, url: str, headers: dict[str, str], body: bytes) -> Response:
        path = urlsplit(url).path
        if method == "GET" and path in {"", "/"}:
            return Response(200, [("Content-Type", "text/plain; charset=utf-8")], b"running\n")
        if method == "GET" and path.rstrip("/") == "/admin/host/status":
            document = json.dumps({"state": "Running", **self.status}).encode()
            return Response(200, [("Content-Type", "application/json")], document)
        webhook = self.webhooks.get(path.lower().rstrip("/"))
        if webhook is not None:
            return webhook(method, url, headers, body)
        found = match_route(self.functions, method, path)
        if found is None:
            return Response(404, [], b"")
        function, route_params = found
        started = time.perf_counter()
        error: str | None = None
        try:
            request = build_request(method, url, headers, route_params, body)
            result = function.invoker.invoke(request)
            for output in function.invoker.service_bus_outputs:
                self.outputs.send(output, function.invoker.output_value(result, output.param))
            http_out = function.invoker.http_output
            value = function.invoker.output_value(result, http_out.param) if http_out else None
            response = build_response(value)
        except Exception as exc:  # noqa: BLE001 - a failing function answers 500, never kills the server
            error = describe_error(exc)
            response = Response(500, [], b"")
        event(
            self.logger,
            logging.INFO if error is None else logging.ERROR,
            "invocation",
            f"{function.spec.name} {'succeeded' if error is None else 'failed'}",
            function=function.spec.name,
            method=method,
            path=path,
            status=response.status,
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
            outcome="succeeded" if error is None else "failed",
            error=error,
        )
        return response


def listen(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket for :class:`HttpHost` (``listener=``), bound now: its port is known
    (and taken) before the host starts, so settings that name the host's own URL can be made
    from it, with no gap in which another process could take the port."""
    return socket.create_server((host, port), backlog=_Server.request_queue_size)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    host: HttpHost

    @classmethod
    def on(cls, listener: socket.socket) -> _Server:
        """A server on an already bound and listening socket (see :func:`listen`)."""
        server = cls(listener.getsockname()[:2], _Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = listener
        host, port = listener.getsockname()[:2]
        server.server_address = (host, port)
        server.server_name, server.server_port = str(host), int(port)
        return server


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        # Invocations are logged by the host; access logs on stderr would double every line.
        return

    def _read_body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY_BYTES:
                    return None
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
        except ValueError:
            self._send(400, [], b"malformed request body\n")
            return
        if body is None:
            self._send(413, [], b"")
            self.close_connection = True
            return
        host = self.headers.get("Host") or f"{self.server.host.address}:{self.server.host.port}"
        url = f"http://{host}{self.path}"
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        response = self.server.host.handle(self.command, url, headers, body)
        self._send(response.status, response.headers, response.body)

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in {"content-length", "transfer-encoding", "connection"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


for _method in ALL_HTTP_METHODS:
    setattr(_Handler, f"do_{_method}", _Handler._dispatch)
