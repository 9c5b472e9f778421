"""Run the Service Bus emulator as a child process from tests.

    from emulators.servicebus.testing import running_emulator

    with running_emulator("tests/contract/Config.json") as emulator:
        client = ServiceBusClient.from_connection_string(emulator.connection_string)
        ...
        emulator.restart()  # same port: an outage the client has to ride out

The process is always killed on exit (also when the body raises). State is in memory, so a
restart comes back empty. Between ``stop()`` and the next ``start()`` (and during ``restart``)
the ports stay held (``emulators.ports.hold_port``): clients are refused, as by a broker that
is down, and no other process is handed them meanwhile; ``close()`` stops for good.

For a token credential instead of the connection string, use
``ServiceBusClient(emulator.namespace, credential, use_tls=False)``: the SDK keeps the port of
``127.0.0.1:<port>`` only when TLS is off, which is what ``UseDevelopmentEmulator=true`` sets.
With TLS on (the SDK's default), the SDK drops the port and dials 5671; reach the emulator's TLS
listener with ``ServiceBusClient("localhost", credential, custom_endpoint_address=
f"sb://127.0.0.1:{emulator.tls_port}", transport_type=TransportType.Amqp,
connection_verify=emulator.ca_cert)`` (start it with ``tls=True``).

AMQP over WebSockets (start it with ``websocket=True``): the same connection string plus
``**emulator.websocket_kwargs()``, i.e. ``transport_type=TransportType.AmqpOverWebsocket,
custom_endpoint_address=f"sb://127.0.0.1:{emulator.websocket_port}"`` (the SDK keeps no port of
its own for WebSockets: without a custom endpoint it dials port 80/443). With ``tls=True`` as
well there is a wss:// listener too: ``emulator.websocket_kwargs(tls=True)`` adds
``connection_verify``; use it with a connection string *without* UseDevelopmentEmulator (that
setting turns TLS off), e.g. ``emulator.tls_connection_string``.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from emulators.ports import hold_port

SAS_KEY_NAME = "RootManageSharedAccessKey"
SAS_KEY = "SAS_KEY_VALUE"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0


class EmulatorError(RuntimeError):
    """The emulator did not start (its stderr tail is in the message)."""


class EmulatorProcess:
    """One emulator child process; ``port`` stays the same across ``restart()``."""

    def __init__(
        self,
        config: str | Path | None = None,
        *,
        port: int = 0,
        extra_args: list[str] | None = None,
        log_path: str | Path | None = None,
        tls: bool = False,
        websocket: bool = False,
    ) -> None:
        self.config = None if config is None else Path(config)
        self.tls = tls
        self.websocket = websocket
        self.tls_port: int | None = None
        self.websocket_port: int | None = None
        self.websocket_tls_port: int | None = None
        self.ca_cert: str | None = None
        self.port = port
        self.extra_args = list(extra_args or [])
        self.log_path = Path(log_path) if log_path else None
        self._process: subprocess.Popen[str] | None = None
        self.returncode: int | None = None  # exit code of the last stopped process
        self._stderr_tail: list[str] = []
        self._stderr_thread: threading.Thread | None = None
        self._held: list[socket.socket] = []  # its ports while it is stopped

    @property
    def namespace(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName={SAS_KEY_NAME};"
            f"SharedAccessKey={SAS_KEY};UseDevelopmentEmulator=true;"
        )

    @property
    def tls_connection_string(self) -> str:
        """For the TLS listeners: no UseDevelopmentEmulator (it turns TLS off), no port (the
        SDK drops it under TLS; pass custom_endpoint_address)."""
        return (
            f"Endpoint=sb://localhost/;SharedAccessKeyName={SAS_KEY_NAME};"
            f"SharedAccessKey={SAS_KEY};"
        )

    def websocket_kwargs(self, *, tls: bool = False) -> dict[str, Any]:
        """Client keywords for AMQP over WebSockets (ws://, or wss:// with ``tls``)."""
        from azure.servicebus import TransportType

        port = self.websocket_tls_port if tls else self.websocket_port
        if port is None:
            raise EmulatorError("start the emulator with websocket=True (and tls=True for wss)")
        kwargs: dict[str, Any] = {
            "transport_type": TransportType.AmqpOverWebsocket,
            "custom_endpoint_address": f"sb://127.0.0.1:{port}",
        }
        if tls:
            kwargs["connection_verify"] = self.ca_cert
        return kwargs

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.running:
            return
        command = [sys.executable, "-m", "sebridge.cli", "servicebus-emulator"]
        command += ["--port", str(self.port)]
        if self.config is not None:
            command += ["--config", str(self.config)]
        command += self.extra_args
        info = Path(tempfile.mkdtemp(prefix="sebridge-sb-")) / "listening.json"
        command += ["--listen-info", str(info)]
        if self.tls:
            command += ["--tls-port", str(self.tls_port or 0)]
        if self.websocket:
            command += ["--websocket-port", str(self.websocket_port or 0)]
            if self.tls:
                command += ["--websocket-tls-port", str(self.websocket_tls_port or 0)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        deadline = time.monotonic() + timeout
        while True:  # a just-freed port can linger briefly after stop(); retry until deadline
            self._process = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            self._stderr_tail = []
            self._stderr_thread = threading.Thread(
                target=self._pump_stderr, args=(self._process.stderr,), daemon=True
            )
            self._stderr_thread.start()
            line = _read_line(self._process, max(0.1, deadline - time.monotonic()))
            if line is not None and line.startswith("listening on amqp://"):
                self.port = int(line.strip().rsplit(":", 1)[1])
                details = json.loads(info.read_text())  # written before the first line
                shutil.rmtree(info.parent, ignore_errors=True)
                self.tls_port = details.get("amqps")
                self.websocket_port = details.get("ws")
                self.websocket_tls_port = details.get("wss")
                self.ca_cert = details.get("ca_cert")
                threading.Thread(target=_drain, args=(self._process.stdout,), daemon=True).start()
                self._release_ports()  # it listens on them now
                return
            exit_code = self._process.poll()
            self._kill()
            # only "cannot listen" (exit 1: the port is still held) is worth another try
            if time.monotonic() >= deadline or self.port == 0 or exit_code not in (1, None):
                self._release_ports()
                shutil.rmtree(info.parent, ignore_errors=True)
                tail = "".join(self._stderr_tail[-20:])
                raise EmulatorError(f"emulator did not start (got {line!r}); stderr:\n{tail}")
            time.sleep(0.2)

    def _pump_stderr(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        sink = self.log_path.open("a", encoding="utf-8") if self.log_path else None
        try:
            for line in stream:
                self._stderr_tail.append(line)
                del self._stderr_tail[:-200]
                if sink is not None:
                    sink.write(line)
                    sink.flush()
        finally:
            if sink is not None:
                sink.close()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``. Its ports stay held
        until ``start()`` listens on them again, or ``close()``."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        self.returncode = process.returncode
        self._close_pipes(process)
        self._process = None
        self._hold_ports()

    def close(self) -> None:
        """Stop for good: the process, and the hold on its ports."""
        self.stop()
        self._release_ports()

    def _hold_ports(self) -> None:
        ports = (self.port, self.tls_port, self.websocket_port, self.websocket_tls_port)
        for port in ports:
            # OSError: taken in the instant since the exit; start() will say so
            if port:
                with suppress(OSError):
                    self._held.append(hold_port(port))

    def _release_ports(self) -> None:
        while self._held:
            self._held.pop().close()

    def _kill(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait(STOP_TIMEOUT)
        self._close_pipes(process)
        self._process = None

    @staticmethod
    def _close_pipes(process: subprocess.Popen[str]) -> None:
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                with suppress(OSError):
                    stream.close()

    def restart(self, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start again on the same port (empty state);
        the port is held meanwhile (see ``stop()``)."""
        self.stop()
        if down_for > 0:
            time.sleep(down_for)
        self.start()

    @property
    def stderr_tail(self) -> str:
        return "".join(self._stderr_tail)


def _read_line(process: subprocess.Popen[str], timeout: float) -> str | None:
    """First stdout line of ``process`` within ``timeout`` seconds (None on timeout or exit)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def reader() -> None:
        assert process.stdout is not None
        try:
            lines.put(process.stdout.readline() or None)
        except (OSError, ValueError):
            lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


def _drain(stream: IO[str] | None) -> None:
    if stream is None:
        return
    try:
        for _ in stream:
            pass
    except (OSError, ValueError):
        pass


@contextmanager
def running_emulator(
    config: str | Path | None = None,
    *,
    port: int = 0,
    extra_args: list[str] | None = None,
    log_path: str | Path | None = None,
    tls: bool = False,
    websocket: bool = False,
) -> Iterator[EmulatorProcess]:
    """Start the emulator (``config`` defaults to infra/servicebus-emulator/Config.json).

    ``tls=True`` also opens a TLS listener (``.tls_port``) with a self-signed certificate
    (``.ca_cert``, pass it as ``connection_verify``). ``websocket=True`` also serves AMQP over
    WebSockets (``.websocket_port``; with ``tls=True`` also wss on ``.websocket_tls_port``);
    ``.websocket_kwargs()`` are the client keywords that reach it.
    """
    emulator = EmulatorProcess(
        config, port=port, extra_args=extra_args, log_path=log_path, tls=tls, websocket=websocket
    )
    try:
        emulator.start()
        yield emulator
    finally:
        emulator.close()
