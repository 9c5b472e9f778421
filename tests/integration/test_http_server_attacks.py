"""The forwarder's HTTP servers under attack over loopback (issue 22, items 1 and 7).

Item 1: eight connections that sent one header byte every 4 s held every slot of the drain
probe and of the metrics port: the load balancer's probe was closed unanswered 25 of 25 times,
/healthz 12 of 12. Item 7: connections that reset made the servers print raw tracebacks to
stderr (5,002 lines for 200 resets, 5,000 of them not JSON under --log-format json).

Now: slow, idle and resetting clients together, and a well-formed client is answered within
the 2 s deadline every time; every error is counted by reason and logged through the logger, a
line per reason at most, so stderr stays one JSON object per line.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from emulators.imds.testing import RunningSimulator, running_simulator
from emulators.ports import reserve_port
from emulators.processes import ChildProcess, forwarder
from sebridge.forwarder.local.drain_probe import DrainProbe
from sebridge.forwarder.net.server import DEADLINE, ERROR_REASONS
from sebridge.forwarder.observability.metrics import Metrics, MetricsServer
from sebridge.forwarder.observability.observations import Observations
from sebridge.impact import DEFAULT_RULES
from tests.support.attackers import FAILURES, SlowClients, ask, idle_flood, reset_flood, resets
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
IDLE = str(REPO / "benchmarks" / "idle-scenario.json")


class Asker:
    """A well-formed client asking every ``every`` seconds on a thread, ``count`` times (from
    ``source``, an address of this host, if given)."""

    def __init__(
        self, port: int, path: str, count: int, every: float = 0.1, source: str | None = None
    ) -> None:
        self.answers: list[tuple[int | None, float]] = []
        self.done = threading.Event()

        def run() -> None:
            for _ in range(count):
                self.answers.append(ask(port, path, source=source))
                time.sleep(every)
            self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def failures(self) -> list[tuple[int | None, float]]:
        """Answers that did not come, or came after the deadline."""
        return [
            (status, took) for status, took in self.answers if status is None or took >= DEADLINE
        ]


@pytest.fixture
def servers() -> Iterator[tuple[DrainProbe, MetricsServer]]:
    probe = DrainProbe(DEFAULT_RULES, 30)
    probe.bind("127.0.0.1", 0)
    metrics = Metrics(Observations())
    metrics.watch_local(None, probe)
    server = MetricsServer(metrics, "127.0.0.1", 0)
    stop = threading.Event()
    threads = [
        threading.Thread(target=probe.serve, args=(stop,), daemon=True),
        threading.Thread(target=server.serve, args=(stop,), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        yield probe, server
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with running_simulator(IDLE) as running:
        yield running


@contextmanager
def running_forwarder(
    sim: RunningSimulator, state: Path
) -> Iterator[tuple[ChildProcess, int, int]]:
    """The real forwarder with its drain probe and metrics on loopback, JSON logs; once both
    answer: (the process, the probe's port, the metrics port)."""
    probe_port, metrics_port = reserve_port(), reserve_port()
    args = [
        "--log-format",
        "json",
        "--drain-probe-port",
        str(probe_port),
        "--drain-probe-address",
        "127.0.0.1",
        "--metrics-port",
        str(metrics_port),
    ]
    with forwarder(sim.base_url, state, *args) as fw:
        wait_until(lambda: ask(probe_port)[0] == 200, 60, "the probe")
        wait_until(lambda: ask(metrics_port, "/healthz")[0] == 200, 60, "/healthz")
        yield fw, probe_port, metrics_port


def http_errors(metrics_port: int) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["server"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(ask_text(metrics_port, "/metrics"))
        if family.name == "sebridge_forwarder_http_errors"
        for sample in family.samples
    }


@pytest.mark.timeout(180)
def test_slow_idle_and_resetting_clients_never_keep_an_answer_past_the_deadline(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    """64 clients sending a byte every 2 s and 16 idle ones on each port, and a flood of 1,200
    resets to each (200 a second, while the asking lasts), while a well-formed client asks
    each port every 100 ms, 60 times. (The flood is paced so that the test measures the
    server, not how a loaded CI machine shares its two cores among test runs.)"""
    with running_forwarder(sim, tmp_path / "state") as (fw, probe_port, metrics_port):
        with (
            SlowClients(probe_port, 64, every=2.0),
            SlowClients(probe_port, 16, every=None),
            SlowClients(metrics_port, 64, every=2.0),
            SlowClients(metrics_port, 16, every=None),
        ):
            FAILURES.clear()
            floods = [reset_flood(port, 1200, 200) for port in (probe_port, metrics_port)]
            try:
                askers = [Asker(probe_port, "/", 60), Asker(metrics_port, "/healthz", 60)]
                for asker in askers:
                    assert asker.done.wait(60), "the well-formed client never finished"
            finally:
                for flood in floods:
                    flood.wait(60)
        errors = http_errors(metrics_port)
        assert fw.alive
    probe_answers, healthz_answers = (a.answers for a in askers)
    assert askers[0].failures() == [], (FAILURES, errors, probe_answers)
    assert askers[1].failures() == [], (FAILURES, errors, healthz_answers)
    assert {status for status, _ in probe_answers} == {200}
    assert {status for status, _ in healthz_answers} == {200}
    for server in ("drain-probe", "metrics"):
        # 80 slow and idle clients from one address, whose share is 64: dropped to make room
        # (before the share, at their deadline; either way they are dropped, never kept).
        assert errors[(server, "evicted")] + errors[(server, "timeout")] > 0, errors
        assert errors[(server, "reset")] > 0, errors
        assert errors[(server, "handler")] == errors[(server, "internal")] == 0, errors


@pytest.mark.timeout(120)
def test_the_load_balancer_is_answered_under_a_flood_of_idle_connections(
    servers: tuple[DrainProbe, MetricsServer],
) -> None:
    """Review 22d, item 1: two local processes each kept up to 1,000 connections that send
    nothing and opened up to 1,500 new ones a second; the load balancer's probe was reset or
    timed out 3 to 5 times in 8 to 13, and answered in up to 3.4 s. Here: two such floods from
    127.0.0.1 (each at most 9,000 connections in 6 s, 500 new ones a second: 30 times
    what the 64 slots of one address, each held up to the 2 s deadline, can take), the load
    balancer from 127.0.0.2 every 100 ms, 30 times: every one answered 200 within the deadline.
    (Paced, unlike the review's 1,500 a second: time a connection waits in the kernel's accept
    queue is time the server had no CPU for, and on a CI machine sharing two cores among seven
    test processes and both floods that measures the machine, not the server.)"""
    probe, _ = servers
    port = probe.address[1]
    FAILURES.clear()
    floods = [idle_flood(port, 1000, 6.0, 9000, 500) for _ in range(2)]
    try:
        wait_until(lambda: probe.http_errors()["evicted"] > 500, 30, "the flood to bite")
        lb = Asker(port, "/", 30, every=0.1, source="127.0.0.2")
        assert lb.done.wait(60), "the load balancer never finished"
    finally:
        for flood in floods:
            flood.wait(60)
    assert lb.failures() == [], (FAILURES, probe.http_errors(), lb.answers)
    assert {status for status, _ in lb.answers} == {200}


@pytest.mark.timeout(120)
def test_a_request_head_that_is_not_http_gets_400_and_a_method_other_than_get_501(
    servers: tuple[DrainProbe, MetricsServer],
) -> None:
    probe, _ = servers
    for raw, status in (
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"400"),  # a TLS hello
        (b"GET / HTTP/2.0\r\n\r\n", b"400"),
        (b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", b"501"),
    ):
        with socket.create_connection(probe.address, timeout=5) as sock:
            sock.sendall(raw)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert answer.split(b" ", 2)[1] == status, answer
    assert probe.http_errors()["bad-request"] == 2


@pytest.mark.timeout(180)
def test_the_forwarder_answers_its_probe_and_healthz_and_keeps_stderr_json_under_attack(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    with running_forwarder(sim, tmp_path / "state") as (fw, probe_port, metrics_port):
        # Item 1's attack: eight connections sending a header byte every 4 s, to each port.
        with SlowClients(probe_port, 8, every=4.0), SlowClients(metrics_port, 8, every=4.0):
            probe = Asker(probe_port, "/", 25, every=0.2)
            healthz = Asker(metrics_port, "/healthz", 12, every=0.4)
            # Item 7's: 200 connections that reset, to each port.
            assert resets(probe_port, 200) == 200
            assert resets(metrics_port, 200) == 200
            assert probe.done.wait(60) and healthz.done.wait(60)
        errors = http_errors(metrics_port)
        assert fw.alive
        log = fw.stderr_text()
    assert probe.failures() == [] and healthz.failures() == [], (probe.answers, healthz.answers)
    lines = log.splitlines()
    not_json = [line for line in lines if not is_json_object(line)]
    assert not_json == [], not_json[:5]
    from_servers = [
        entry
        for entry in map(json.loads, lines)
        if entry["logger"] in ("forwarder.drain-probe", "forwarder.metrics")
        and "summed up" in entry["message"]
    ]
    # One line per server and reason at most, in a test shorter than LOG_EVERY.
    keys = [(e["logger"], e["message"].split(";")[0]) for e in from_servers]
    assert len(keys) == len(set(keys)) and len(keys) <= 2 * len(ERROR_REASONS), from_servers
    assert set(errors) == {(s, r) for s in ("metrics", "drain-probe") for r in ERROR_REASONS}
    assert errors[("drain-probe", "reset")] > 0 and errors[("metrics", "reset")] > 0


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def ask_text(port: int, path: str) -> str:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().read().decode()
    finally:
        connection.close()
