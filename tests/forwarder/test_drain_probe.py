"""The drain probe over loopback HTTP: what the load balancer gets, when, and nothing more."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sebridge.contract.events import Transition, parse_message
from sebridge.forwarder.local import drain_probe
from sebridge.forwarder.local.drain_probe import DrainProbe, ProbeError
from sebridge.forwarder.local.journal import Journal
from sebridge.imds import Document
from sebridge.impact import DEFAULT_RULES, ImpactRules
from tests.forwarder.local_support import OBSERVER, Parts, document, imds_event
from tests.support.budget import examples
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
A = "aaaaaaaa-0000-4000-8000-000000000001"
B = "bbbbbbbb-0000-4000-8000-000000000002"
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def wall() -> datetime:
    """The real time: the local actions' and the probe's own clock (no clock is injected)."""
    return datetime.now(UTC)


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


def show(probe: DrainProbe, *events: Any) -> None:
    """The current document holds ``events`` (what a poll hands the probe)."""
    probe.follow(events, OBSERVER)


def test_200_normally_503_while_an_impactful_event_of_this_vm_is_in_the_document() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        assert get(port)[:2] == (200, b"ok\n")
        show(probe, imds_event(A))
        assert get(port)[:2] == (503, b"unavailable\n")
        show(probe, imds_event(A, status="Started"))
        assert get(port)[0] == 503
        show(probe)  # gone: Completed
        assert get(port)[:2] == (200, b"ok\n")
        show(probe, imds_event(A))  # back
        assert get(port)[0] == 503
        show(probe)
        assert get(port)[0] == 200


def test_a_hardware_failure_first_seen_started_drains_too() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        show(probe, imds_event(A, status="Started"))
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
        show(probe, imds_event(A, **fields))
        assert get(port)[0] == (503 if drains else 200)


def test_the_rules_come_from_settings() -> None:
    probe = DrainProbe(ImpactRules(frozenset({"Freeze"}), 9), 30)
    with serving(probe) as port:
        show(probe, imds_event(A, event_type="Reboot"))
        assert get(port)[0] == 200
        show(
            probe,
            imds_event(A, event_type="Reboot"),
            imds_event(B, event_type="Freeze", duration=1),
        )
        assert get(port)[0] == 503


def test_an_updated_that_drops_this_vm_or_makes_it_harmless_ends_the_drain() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        show(probe, imds_event(A))
        show(probe, imds_event(A, resources=["web-2"]))
        assert get(port)[0] == 200
        show(probe, imds_event(A))  # listed again
        assert get(port)[0] == 503
        show(probe, imds_event(A, event_type="Freeze", duration=2))
        assert get(port)[0] == 200


def test_two_events_the_probe_is_healthy_only_when_both_are_gone() -> None:
    probe = DrainProbe(DEFAULT_RULES, 30)
    with serving(probe) as port:
        show(probe, imds_event(A), imds_event(B))
        show(probe, imds_event(B))
        assert get(port)[0] == 503
        show(probe)
        assert get(port)[0] == 200


def test_a_drain_that_goes_on_keeps_its_start() -> None:
    now = [NOW]
    probe = DrainProbe(DEFAULT_RULES, 30, now=lambda: now[0])
    show(probe, imds_event(A))
    now[0] += timedelta(seconds=20)
    show(probe, imds_event(A))  # the next documents do not restart it
    assert probe.preparation_status(A) == "pending"
    now[0] += timedelta(seconds=10)
    assert probe.preparation_status(A) == "succeeded"
    show(probe, imds_event(A, status="Started"))
    assert probe.preparation_status(A) == "succeeded"


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
        show(probe, imds_event(A))
        assert get(port)[0] == 503  # draining: at once, whatever the application says
        show(probe)
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
        show(probe, imds_event(A))
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


@pytest.mark.parametrize("path", ["/sant\u00e9", "/a b", "/a\tb"])
def test_an_upstream_no_check_could_be_sent_to_is_refused_at_start(path: str) -> None:
    """Such a URL once started fine, and every check then failed (outside ASCII: the checks
    ended for good): the probe answered 503 while the application was healthy."""
    with pytest.raises(ProbeError, match="--drain-probe-upstream cannot be asked"):
        DrainProbe(DEFAULT_RULES, 30, upstream=f"http://127.0.0.1:8080{path}")


def test_a_check_that_fails_unforeseen_is_unhealthy_and_the_checks_go_on(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks run on a thread of their own: one that ended would leave the probe at 503
    for good (the last verdict goes stale), draining a healthy VM."""
    check = drain_probe.Upstream.check
    calls: list[float] = []
    failing = threading.Event()
    failing.set()

    def faulty(self: drain_probe.Upstream, http: Any) -> bool:
        calls.append(time.monotonic())
        if failing.is_set():
            raise RuntimeError("a bug")
        return check(self, http)

    monkeypatch.setattr(drain_probe.Upstream, "check", faulty)
    probe = DrainProbe(DEFAULT_RULES, 30, upstream=upstream.url, upstream_timeout=1.0)
    with serving(probe) as port:
        wait_until(lambda: len(calls) >= 3, 10, "the checks to go on after one failed")
        assert get(port)[0] == 503
        failing.clear()
        wait_answer(port, 200)


def test_a_port_in_use_fails_clearly() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ProbeError, match=r"cannot listen on 127\.0\.0\.1"):
            DrainProbe(DEFAULT_RULES, 30).bind("127.0.0.1", taken.getsockname()[1])


def test_prepared_after_the_drain_time_and_not_before(tmp_path: Path) -> None:
    probe = DrainProbe(DEFAULT_RULES, 1.5)
    parts = Parts(tmp_path, probe=probe)
    with serving(probe):
        parts.actions.document_observed(document(imds_event(A)), OBSERVER, wall())
        flipped = time.monotonic()
        time.sleep(1.0)
        assert parts.outbox.envelopes == []
        wait_until(lambda: parts.outbox.envelopes, 5, "Prepared")
        assert time.monotonic() - flipped >= 1.5
    (prepared,) = parts.outbox.envelopes
    message = parse_message(prepared.body, prepared.message_id)
    assert message.transition is Transition.PREPARED
    assert message.data["prepared"] == {"vms": ["web-1"], "preparedBy": "drain-probe"}
    parts.journal.close()


def test_after_a_restart_the_probe_drains_again_from_the_journal(tmp_path: Path) -> None:
    first = Parts(tmp_path, probe=DrainProbe(DEFAULT_RULES, 30))
    doc = document(imds_event(A), imds_event(B, resources=["web-2"]))
    first.actions.document_observed(doc, OBSERVER, wall())
    first.journal.close()  # kill -9: nothing more is written
    probe = DrainProbe(DEFAULT_RULES, 30)
    restarted = Parts(tmp_path, probe=probe)
    with serving(probe) as port:
        assert get(port)[0] == 200
        restarted.actions.start()  # before the first poll
        assert probe.draining and probe.preparation_status(A) == "pending"
        assert probe.preparation_status(B) is None  # web-2's event is not this VM's to drain
        assert get(port)[0] == 503
    restarted.journal.close()


class ProbeModel(RuleBasedStateMachine):
    """Any sequence of documents of three events: 503 exactly while one of them is in the
    document, impactful and lists this VM."""

    def __init__(self) -> None:
        super().__init__()
        # No healthy gap between runs (its model: tests/forwarder/test_probe_bound.py): the
        # level follows each document exactly.
        self.probe = DrainProbe(DEFAULT_RULES, 30, min_healthy=0)
        self.events: dict[str, Any] = {}

    @rule(
        event=st.sampled_from([A, B, "cccccccc-0000-4000-8000-000000000003"]),
        present=st.booleans(),
        status=st.sampled_from(["Scheduled", "Started", 1]),
        event_type=st.sampled_from(["Reboot", "Freeze", "Terminate"]),
        duration=st.sampled_from([-1, 3, 30]),
        mine=st.booleans(),
    )
    def document(
        self, event: str, present: bool, status: Any, event_type: str, duration: int, mine: bool
    ) -> None:
        if present:
            raw = imds_event(
                event,
                event_type=event_type,
                duration=duration,
                resources=["web-1"] if mine else ["web-9", 5],
            ).to_imds() | {"EventStatus": status}
            self.events[event] = (raw, mine and (event_type != "Freeze" or duration != 3))
        else:
            self.events.pop(event, None)
        doc = Document.from_imds(
            {"DocumentIncarnation": 1, "Events": [raw for raw, _ in self.events.values()]}
        )
        self.probe.follow(doc.events, OBSERVER)

    @invariant()
    def answers_as_the_model_says(self) -> None:
        expected = 503 if any(drains for _, drains in self.events.values()) else 200
        assert self.probe.answer()[0] == expected


ProbeModel.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=25, deadline=None
)
test_probe_model = ProbeModel.TestCase


def test_a_crash_between_the_outbox_write_and_the_journal_mark_republishes_the_same_id(
    tmp_path: Path,
) -> None:
    """The window the restart test cannot hit on purpose: Prepared went into the outbox, and
    the process died before the journal marked it published. After the restart, Prepared goes
    out again, with the same message id (derived from its cause), so the topic's duplicate
    detection keeps one; and once marked, never again."""
    first = Parts(tmp_path, probe=DrainProbe(DEFAULT_RULES, 0))
    first.actions.document_observed(document(imds_event(A)), OBSERVER, wall())
    (lost,) = first.outbox.envelopes  # drained at once (0 s): Prepared is in the outbox...
    first.journal.close()  # ...and the mark never reached the journal (kill -9)
    reopened = Journal(tmp_path)
    record = reopened.preparation(A)
    assert record is not None and record.cause is not None
    reopened.commit(preparations=[replace(record, published=None)])
    reopened.close()

    restarted = Parts(tmp_path, probe=DrainProbe(DEFAULT_RULES, 0))
    restarted.actions.start()
    (again,) = restarted.outbox.envelopes
    assert again.message_id == lost.message_id and again.subject == "Prepared"
    assert restarted.preparations.check_all() == 0 and len(restarted.outbox.envelopes) == 1
    restarted.journal.close()


def test_prepared_waits_for_an_outbox_that_can_take_it(tmp_path: Path) -> None:
    """A full disk: the outbox refuses Prepared. Nothing is marked, and every poll tries again
    until it is durably taken, under the same id."""
    parts = Parts(tmp_path, probe=DrainProbe(DEFAULT_RULES, 0))
    parts.outbox.full = True
    doc = document(imds_event(A))
    parts.actions.document_observed(doc, OBSERVER, wall())
    parts.actions.document_observed(doc, OBSERVER, wall())
    assert parts.outbox.envelopes == [] and parts.outbox.refused == 2
    record = parts.store.preparation(A)
    assert record is not None and record.published is None
    parts.outbox.full = False
    parts.actions.document_observed(doc, OBSERVER, wall())
    assert len(parts.outbox.envelopes) == 1
    assert parts.journal.preparation(A).published == record.cause  # type: ignore[union-attr]
    parts.actions.document_observed(doc, OBSERVER, wall())
    assert len(parts.outbox.envelopes) == 1
    parts.journal.close()
