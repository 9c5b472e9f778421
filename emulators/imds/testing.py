"""Helpers for tests that need an IMDS: run the simulator and talk to its /_sim/ API.

    from emulators.imds.testing import running_simulator, scenario_names, expected_transitions

    with running_simulator("user-reboot", speed=5, extra_args=["--start-on-first-poll"]) as sim:
        forwarder_env = {"SEBRIDGE_IMDS_URL": sim.base_url}   # whatever the forwarder reads
        ...
        assert sim.posts()[0]["status"] == 200

``running_simulator`` runs ``python -m sebridge.cli imds-sim`` as a subprocess (the real
program, no PATH needed) and always kills it on exit. ``in_process_simulator`` serves the same
app from a thread for fast tests. Both yield a :class:`SimClient`.

Only the standard library is used here, so the helper works wherever the simulator does.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from emulators.imds.faults import parse_cli_rule
from emulators.imds.scenario import load_scenario
from emulators.imds.scenario import scenario_names as _scenario_names
from emulators.imds.server import SimConfig, make_server

API_VERSION = "2020-07-01"
_LISTENING = re.compile(r"^listening on (http://\S+:(\d+))$")


def scenario_names() -> list[str]:
    """Every packaged scenario, for ``pytest.mark.parametrize``."""
    return _scenario_names()


def expected_transitions(name: str) -> list[dict[str, str]]:
    """The scenario's ``expect``: ``[{"transition": ..., "eventId": <lower-case>}, ...]``.

    The order is the whole document's order; transitions of events that change at the same
    scenario moment are listed in document order. Compare per event with
    :func:`expected_by_event` if your consumer orders same-moment transitions differently.
    """
    return [e.to_json() for e in load_scenario(name).expect]


def expected_by_event(name: str) -> dict[str, list[str]]:
    """``{eventId: [transition, ...]}`` in order, from the scenario's ``expect``."""
    out: dict[str, list[str]] = {}
    for item in load_scenario(name).expect:
        out.setdefault(item.event_id, []).append(item.transition)
    return out


def scenario_duration(name: str, speed: float = 1.0) -> float:
    """Real seconds from the scenario start until its last step, at ``speed``."""
    return load_scenario(name).duration / speed


class SimClient:
    """Small client for one running simulator (IMDS calls and the /_sim/ API)."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.port = int(self.base_url.rsplit(":", 1)[1])
        self.timeout = timeout

    def url(self, path: str, vm: str | None = None) -> str:
        prefix = f"/vm/{vm}" if vm else ""
        return f"{self.base_url}{prefix}{path}"

    @property
    def scheduled_events_url(self) -> str:
        return self.url("/metadata/scheduledevents")

    def _call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - loopback URL built by this class
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace")
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {detail}") from None

    # -- IMDS, as a forwarder would call it ----------------------------------------------------

    def document(self, vm: str | None = None) -> dict[str, Any]:
        path = f"{'/vm/' + vm if vm else ''}/metadata/scheduledevents?api-version={API_VERSION}"
        request = urllib.request.Request(self.base_url + path, headers={"Metadata": "true"})  # noqa: S310
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
            result: dict[str, Any] = json.loads(response.read())
            return result

    def approve(self, event_id: str, vm: str | None = None) -> int:
        path = f"{'/vm/' + vm if vm else ''}/metadata/scheduledevents?api-version={API_VERSION}"
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        request = urllib.request.Request(  # noqa: S310
            self.base_url + path, data=body, method="POST", headers={"Metadata": "true"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    # -- test control ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/_sim/state")
        return result

    def posts(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/_sim/requests")["posts"]
        return result

    def set_faults(
        self,
        *rules: Mapping[str, Any],
        append: bool = False,
        first_call_delay: float | None = None,
    ) -> dict[str, Any]:
        """``set_faults({"kind": "429", "count": 3})``; no rules clears them."""
        body: dict[str, Any] = {"rules": list(rules), "append": append}
        if first_call_delay is not None:
            body["firstCallDelay"] = first_call_delay
        result: dict[str, Any] = self._call("POST", "/_sim/faults", body)
        return result

    def reset(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/_sim/reset", {})
        return result

    def advance(self, seconds: float) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/_sim/advance?seconds={seconds}", {})
        return result

    def hold_clock(self) -> dict[str, Any]:
        """Stop scenario time where it is (events change no more until :meth:`run_clock`)."""
        result: dict[str, Any] = self._call("POST", "/_sim/clock", {"running": False})
        return result

    def run_clock(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/_sim/clock", {"running": True})
        return result

    def event(self, op: str, **fields: Any) -> dict[str, Any]:
        """``event("add", event={...}, notBeforeIn=30)``, ``event("start", eventId=...)``."""
        result: dict[str, Any] = self._call("POST", "/_sim/event", {"op": op, **fields})
        return result

    def load_scenario(self, name: str, speed: float | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name}
        if speed is not None:
            body["speed"] = speed
        result: dict[str, Any] = self._call("POST", "/_sim/scenario", body)
        return result


class RunningSimulator(SimClient):
    """A simulator subprocess; ``stderr_text()`` returns its log so far."""

    def __init__(self, process: subprocess.Popen[str], base_url: str, log: IO[str]) -> None:
        super().__init__(base_url)
        self.process = process
        self._log = log

    def stderr_text(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(encoding="utf-8", errors="replace")


def _read_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    # Drains stdout for the whole life of the process so a stray print can never block it.
    for line in stream:
        lines.put(line)
    lines.put(None)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@contextlib.contextmanager
def running_simulator(
    scenario: str,
    *,
    speed: float = 1.0,
    extra_args: Sequence[str] = (),
    port: int = 0,
    start_timeout: float = 15.0,
) -> Iterator[RunningSimulator]:
    """Run ``sebridge imds-sim`` in a subprocess until the block ends (killed even on error)."""
    command = [
        sys.executable,
        "-m",
        "sebridge.cli",
        "imds-sim",
        "--port",
        str(port),
        "--scenario",
        scenario,
        "--speed",
        repr(float(speed)),
        *extra_args,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with tempfile.NamedTemporaryFile(
        "w+", prefix="imds-sim-", suffix=".log", encoding="utf-8", delete=True
    ) as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            assert process.stdout is not None
            lines: queue.Queue[str | None] = queue.Queue()
            threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
            try:
                first = lines.get(timeout=start_timeout)
            except queue.Empty:
                first = None
            match = _LISTENING.match((first or "").strip())
            if match is None:
                _stop(process)
                log.flush()
                raise RuntimeError(
                    f"imds-sim did not start (first stdout line {first!r}); its log:\n"
                    + Path(log.name).read_text(encoding="utf-8", errors="replace")
                )
            yield RunningSimulator(process, match.group(1), log)
        finally:
            _stop(process)
            if process.stdout is not None:
                process.stdout.close()


@contextlib.contextmanager
def in_process_simulator(
    scenario: str,
    *,
    speed: float = 1.0,
    faults: Sequence[str] = (),
    first_call_delay: float = 0.0,
    instance_metadata: bool = True,
    start_on_first_poll: bool = False,
) -> Iterator[SimClient]:
    """The same simulator served from a thread of this process (no startup cost)."""
    config = SimConfig(
        scenario=scenario,
        speed=speed,
        faults=tuple(parse_cli_rule(f) for f in faults),
        first_call_delay=first_call_delay,
        instance_metadata=instance_metadata,
        start_on_first_poll=start_on_first_poll,
    )
    server = make_server(config)
    thread = threading.Thread(target=server.serve_forever, name="imds-sim-test", daemon=True)
    thread.start()
    try:
        yield SimClient(f"http://127.0.0.1:{server.port}")
    finally:
        server.app.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
