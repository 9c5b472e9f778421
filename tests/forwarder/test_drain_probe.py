"""The drain probe over loopback HTTP: what the load balancer gets, when, and nothing more."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sebridge.contract.events import Transition, parse_message
from sebridge.forwarder.local.drain_probe import DrainProbe, ProbeError
from sebridge.forwarder.local.journal import Journal
from sebridge.forwarder.local.preparation import Preparations
from sebridge.impact import DEFAULT_RULES, ImpactRules
from tests.forwarder.local_support import Recorder, observed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
A = "aaaaaaaa-0000-4000-8000-000000000001"
B = "bbbbbbbb-0000-4000-8000-000000000002"


def get(port: int, path: str = "/health", method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


@contextmanager
def serving(probe: DrainProbe) -> Iterator[int]:
    _, port = probe.bind("127.0.0.1", 0)
    stop = threading.Event()
    thread = threading.Thread(target=probe.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(timeout=5)
        assert not thread.is_alive()


class Upstream:
    """The application's own health check: a loopback server with a status we set, that can
    answer slowly or trickle its body a byte at a time."""

    def __init__(self) -> None:
        self.status = 200
        self.delay = 0.0
        self.trickle = 0.0  # seconds between the bytes of the body (0: all at once)
        self.requests = 0
        self.stopping = threading.Event()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                upstream.requests += 1
                upstream.stopping.wait(upstream.delay)
                body = b"details" * (20 if upstream.trickle else 1)
                self.send_response(upstream.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not upstream.trickle:
                    self.wfile.write(body)
                    return
                self.wfile.flush()
                for i in range(len(body)):
                    if upstream.stopping.wait(upstream.trickle):
                        return
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/healthz"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


def test_200_normally_503_from_scheduled_until_completed() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        assert get(port)[:2] == (200, b"ok\n")
        probe.observe(observed("Scheduled", A))
        assert get(port)[:2] == (503, b"unavailable\n")
        probe.observe(observed("Started", A))
        assert get(port)[0] == 503
        probe.observe(observed("Completed", A))
        assert get(port)[:2] == (200, b"ok\n")
        probe.observe(observed("Scheduled", A, appearance=2))
        assert get(port)[0] == 503
        probe.observe(observed("Cancelled", A, appearance=2))
        assert get(port)[0] == 200


def test_a_hardware_failure_first_seen_started_drains_too() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        probe.observe(observed("Started", A))
        assert get(port)[0] == 503


@pytest.mark.parametrize(
    ("fields", "drains"),
    [
        ({"event_type": "Reboot"}, True),
        ({"event_type": "Redeploy"}, True),
        ({"event_type": "Preempt"}, True),
        ({"event_type": "Terminate"}, True),
        ({"event_type": "Freeze", "duration": 5}, False),
        ({"event_type": "Freeze", "duration": 9}, True),
        ({"event_type": "Freeze", "duration": -1}, True),  # unknown length: drain
        ({"resources": ["web-2"]}, False),  # another VM's event
        ({"resources": []}, True),  # no Resources: this VM
        ({"resources": ["WEB-1", "web-2"]}, True),  # names are case-insensitive
    ],
)
def test_only_impactful_events_of_this_vm_drain(fields: dict[str, Any], drains: bool) -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        probe.observe(observed("Scheduled", A, **fields))
        assert get(port)[0] == (503 if drains else 200)


def test_the_rules_come_from_settings() -> None:
    probe = DrainProbe(ImpactRules(frozenset({"Freeze"}), 9), 30)
    with serving(probe) as port:
        probe.observe(observed("Scheduled", A, event_type="Reboot"))
        assert get(port)[0] == 200
        probe.observe(observed("Scheduled", B, event_type="Freeze", duration=1))
        assert get(port)[0] == 503


def test_an_updated_that_drops_this_vm_or_makes_it_harmless_ends_the_drain() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        probe.observe(observed("Scheduled", A))
        probe.observe(observed("Updated", A, resources=["web-2"]))
        assert get(port)[0] == 200
        probe.observe(observed("Updated", A, suffix="x"))  # listed again
        assert get(port)[0] == 503
        probe.observe(observed("Updated", A, event_type="Freeze", duration=2))
        assert get(port)[0] == 200


def test_two_events_the_probe_is_healthy_only_when_both_ended() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        probe.observe(observed("Scheduled", A))
        probe.observe(observed("Scheduled", B))
        probe.observe(observed("Cancelled", A))
        assert get(port)[0] == 503
        probe.observe(observed("Cancelled", B))
        assert get(port)[0] == 200


def wait_answer(port: int, status: int, timeout: float = 10) -> bytes:
    """Ask until the probe answers ``status`` (the upstream's verdict is refreshed every
    second); its body."""
    seen: list[tuple[int, bytes]] = []

    def answered() -> bool:
        seen.append(get(port)[:2])
        return seen[-1][0] == status

    wait_until(answered, timeout, f"the probe to answer {status} (it answered {seen[-3:]})")
    return seen[-1][1]


def test_with_an_upstream_its_answer_counts_unless_draining(upstream: Upstream) -> None:
    probe = DrainProbe(DEFAULT_RULES, 30, upstream=upstream.url, upstream_timeout=1.0)
    with serving(probe) as port:
        assert wait_answer(port, 200) == b"ok\n"
        upstream.status = 500
        assert wait_answer(port, 503) == b"unavailable\n"  # the upstream's body never passes
        upstream.status = 301
        wait_answer(port, 200)
        upstream.status = 200
        probe.observe(observed("Scheduled", A))
        assert get(port)[0] == 503  # draining: at once, whatever the application says
        probe.observe(observed("Completed", A))
        assert get(port)[0] == 200  # the application's verdict is fresh: no wait for it


def test_an_upstream_that_is_down_or_slow_is_unhealthy(upstream: Upstream) -> None:
    probe = DrainProbe(DEFAULT_RULES, 30, upstream=upstream.url, upstream_timeout=0.5)
    with serving(probe) as port:
        wait_answer(port, 200)
        upstream.delay = 3
        wait_answer(port, 503)
        upstream.delay = 0
        wait_answer(port, 200)
        upstream.close()
        wait_answer(port, 503)  # connection refused


def test_an_upstream_that_trickles_never_holds_the_probes_answer(upstream: Upstream) -> None:
    """Issue 22 item 10: an upstream that sends its body a byte every 0.4 s kept every read
    within the old per-read timeout, and the probe from answering for over 60 s. Now the check
    ends by its own deadline, and the probe answers from the last verdict at once."""
    probe = DrainProbe(DEFAULT_RULES, 30, upstream=upstream.url, upstream_timeout=1.0)
    with serving(probe) as port:
        wait_answer(port, 200)
        upstream.trickle = 0.4
        wait_answer(port, 503, timeout=20)  # the check in progress ends by its deadline
        for _ in range(10):
            started = time.monotonic()
            status, _, _ = get(port)
            assert status == 503
            assert time.monotonic() - started < 2.0  # the probe's one deadline
        upstream.trickle = 0
        wait_answer(port, 200)


def test_the_port_tells_nothing_but_the_health(upstream: Upstream) -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        probe.observe(observed("Scheduled", A))
        for path in ("/", "/health", "/events", "/../etc/passwd", "/?id=x"):
            status, body, headers = get(port, path)
            assert (status, body) == (503, b"unavailable\n")
            assert A[:8] not in body.decode() and "Python" not in headers.get("Server", "")
        assert get(port, method="HEAD")[:2] == (503, b"")
        assert get(port, method="POST")[0] == 501
        assert get(port, method="DELETE")[0] == 501


def test_idle_connections_are_dropped_and_the_probe_keeps_answering() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
        try:
            # Idle clients are dropped at their deadline, or to make room for this one.
            deadline = time.monotonic() + 20
            while True:
                try:
                    if get(port)[0] == 200:
                        break
                except (ConnectionError, http.client.HTTPException, TimeoutError):
                    pass
                assert time.monotonic() < deadline, "the probe never answered again"
                time.sleep(0.5)
        finally:
            for sock in idle:
                sock.close()


def test_a_port_in_use_fails_clearly() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ProbeError, match=r"cannot listen on 127\.0\.0\.1"):
            DrainProbe(DEFAULT_RULES, 30).bind("127.0.0.1", taken.getsockname()[1])


def test_prepared_after_the_drain_time_and_not_before(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    outbox = Recorder()
    preparations = Preparations(journal, outbox)
    probe = DrainProbe(DEFAULT_RULES, 1.5, preparations=preparations)
    preparations.preparers = [probe]
    scheduled = observed("Scheduled", A)
    with serving(probe):
        with preparations.observing():
            preparations.observe(scheduled)
            probe.observe(scheduled)
            preparations.check(scheduled.event.key)
        flipped = time.monotonic()
        time.sleep(1.0)
        assert outbox.envelopes == []
        wait_until(lambda: outbox.envelopes, 5, "Prepared")
        assert time.monotonic() - flipped >= 1.5
    (prepared,) = outbox.envelopes
    message = parse_message(prepared.body, prepared.message_id)
    assert message.transition is Transition.PREPARED
    assert message.data["prepared"] == {"vms": ["web-1"], "preparedBy": "drain-probe"}
    journal.close()


def test_after_a_restart_the_probe_drains_again_for_open_events(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    preparations = Preparations(journal, Recorder())
    preparations.observe(observed("Scheduled", A))
    preparations.observe(observed("Scheduled", B, resources=["web-2"]))
    journal.close()
    reopened = Journal(tmp_path)
    probe = DrainProbe(DEFAULT_RULES, 30)
    from sebridge.forwarder.local.preparation import Observed

    records = [
        Observed.from_payload(Transition.SCHEDULED, r.cause or "", r.payload)
        for r in reopened.open_preparations()
    ]
    with serving(probe) as port:
        assert probe.restore(records) == 1  # web-2's event is not this VM's to drain
        assert get(port)[0] == 503
    reopened.close()


class ProbeModel(RuleBasedStateMachine):
    """Any sequence of transitions of three events: 503 exactly while one of them is open,
    impactful and lists this VM."""

    def __init__(self) -> None:
        super().__init__()
        self.probe = DrainProbe(DEFAULT_RULES, 30)
        self.open: dict[str, bool] = {}

    @rule(
        event=st.sampled_from([A, B, "cccccccc-0000-4000-8000-000000000003"]),
        transition=st.sampled_from(["Scheduled", "Updated", "Started", "Completed", "Cancelled"]),
        event_type=st.sampled_from(["Reboot", "Freeze", "Terminate"]),
        duration=st.sampled_from([-1, 3, 30]),
        mine=st.booleans(),
    )
    def transition(
        self, event: str, transition: str, event_type: str, duration: int, mine: bool
    ) -> None:
        item = observed(
            transition,
            event,
            event_type=event_type,
            duration=duration,
            resources=["web-1"] if mine else ["web-9"],
        )
        self.probe.observe(item)
        ended = transition in ("Completed", "Cancelled")
        impactful = event_type != "Freeze" or duration != 3
        self.open[event] = not ended and mine and impactful

    @invariant()
    def answers_as_the_model_says(self) -> None:
        expected = 503 if any(self.open.values()) else 200
        assert self.probe.answer()[0] == expected


ProbeModel.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
test_probe_model = ProbeModel.TestCase


class _Done:
    """A preparer whose preparation is done."""

    name = "drain-probe"

    def preparation_status(self, event_key: str) -> str | None:
        return "succeeded"


def test_a_crash_between_the_outbox_write_and_the_journal_mark_republishes_the_same_id(
    tmp_path: Path,
) -> None:
    """The window the restart test cannot hit on purpose: Prepared went into the outbox, and
    the process died before the journal marked it published. After the restart, Prepared goes
    out again, with the same message id (derived from its cause), so the topic's duplicate
    detection keeps one; and once marked, never again."""
    journal = Journal(tmp_path)
    first: list[Any] = []

    def enqueue_then_die(envelope: Any) -> None:
        first.append(envelope)
        raise SystemExit("killed after the outbox write")  # not caught by check()

    crashed = Preparations(journal, enqueue_then_die, preparers=[_Done()])
    scheduled = observed("Scheduled", A)
    crashed.observe(scheduled)
    with pytest.raises(SystemExit):
        crashed.check(scheduled.event.key)
    journal.close()

    reopened = Journal(tmp_path)
    outbox = Recorder()
    restarted = Preparations(reopened, outbox, preparers=[_Done()])
    assert restarted.check_all() == 1
    (again,) = outbox.envelopes
    (lost,) = first
    assert again.message_id == lost.message_id and again.subject == "Prepared"
    assert restarted.check_all() == 0 and len(outbox.envelopes) == 1
    reopened.close()
