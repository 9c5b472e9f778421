"""Microsoft's IMDS mock server's scenarios, replayed through a server that closes every
connection after its answer, as the mock server does (issue 22, item 12).

The recorded documents are /work/shared/mock-server-scenarios/observed (tests/fixtures keeps
no copy; the test skips when the folder is absent): six kinds of maintenance, three flows each
(run automatically, with an approval, by hand with an unknown and a right EventId). The mock
server (Werkzeug) answers HTTP/1.1 with ``Connection: close``, its headers and body in writes of
their own. Before the client was rebuilt on urllib3, that failed most requests with ``OSError
[Errno 9] Bad file descriptor``: 113 of 207 polls, 7 of 12 scenarios read right, an approval the
mock accepted reported as failed.

- every document of every flow is read exactly as recorded, and every POST answered 200, by the
  production ImdsClient;
- an approval command goes through the production CommandHandler: re-read, POST answered 200
  then closed, completed, Approved enqueued, the POST sent once;
- the real `sebridge forwarder` reading each kind's documents publishes exactly the transitions
  the documents make, with no failed poll.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.processes import forwarder
from sebridge.contract import commands
from sebridge.contract.events import Envelope, Observer
from sebridge.forwarder.approvals.handler import CommandHandler
from sebridge.forwarder.imds.client import ImdsClient
from sebridge.forwarder.imds.diff import diff, index
from sebridge.imds import Document
from tests.support.http_peers import HttpPeer, Request, Style

pytestmark = pytest.mark.timeout(120)
RECORDED = Path("/work/shared/mock-server-scenarios/observed")
# How the mock server (Werkzeug's dev server) answers: HTTP/1.1, Connection: close, the body in
# a write of its own. HTTP/1.0 as well, for servers that close without keep-alive at all.
MOCK_STYLES = [
    Style(version="HTTP/1.1", close=True, writes="many", pause=0.01),
    Style(version="HTTP/1.0", close=True, writes="many", pause=0.01),
]


def recorded() -> dict[str, dict[str, Any]]:
    if not RECORDED.is_dir():
        pytest.skip(f"{RECORDED} is not here (the recorded mock-server scenarios)")
    return {
        path.name.removesuffix(".observed.json"): json.loads(path.read_text())
        for path in sorted(RECORDED.glob("*.observed.json"))
    }


def flows() -> list[tuple[str, str]]:
    if not RECORDED.is_dir():
        return []
    return [
        (kind, flow)
        for kind, scenario in recorded().items()
        for flow in scenario
        if flow != "scenario"
    ]


class MockServer:
    """Answers GET with the current document, POST with 200 (and the document after it, as the
    recording has it), anything else with 404 (the mock serves no instance metadata), closing
    the connection after each."""

    def __init__(self, style: Style) -> None:
        self.document: dict[str, Any] = {"DocumentIncarnation": 0, "Events": []}
        self.post_answer: dict[str, Any] = self.document
        self.served = 0  # GETs answered with the current document
        self.lock = threading.Lock()
        self.peer = HttpPeer(self.respond, style)

    def respond(self, request: Request) -> tuple[int, bytes]:
        if not request.target.startswith("/metadata/scheduledevents"):
            return 404, b"<!doctype html><title>404 Not Found</title>"  # no instance metadata
        with self.lock:
            if request.method == "POST":
                return 200, json.dumps(self.post_answer).encode()
            self.served += 1
            return 200, json.dumps(self.document).encode()

    def show(self, document: dict[str, Any]) -> None:
        with self.lock:
            self.document = document
            self.served = 0

    def __enter__(self) -> MockServer:
        self.peer.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.peer.__exit__(*exc)


@pytest.fixture(params=MOCK_STYLES, ids=str)
def mock(request: pytest.FixtureRequest) -> Iterator[MockServer]:
    with MockServer(request.param) as server:
        yield server


@pytest.mark.parametrize(("kind", "flow"), flows())
def test_every_recorded_flow_is_read_right(mock: MockServer, kind: str, flow: str) -> None:
    client = ImdsClient(mock.peer.url)
    try:
        for step in recorded()[kind][flow]:
            if step["action"].startswith("POST"):
                mock.post_answer = step["document"]
                (start,) = step["request"]["StartRequests"]
                answer = client.approve(start["EventId"])
                assert answer.accepted, (step["action"], answer)
                sent = json.loads(mock.peer.requests[-1].body)
                assert sent == step["request"]
            else:
                mock.show(step["document"])
                assert client.get_document() == Document.from_imds(step["document"])
    finally:
        client.close()
    # One connection per request: the server closed each one, and the client never failed.
    assert mock.peer.connections == len(mock.peer.requests) == len(recorded()[kind][flow])


class _Sink:
    observer = Observer(vm_name="vmss_vm1")

    def __init__(self) -> None:
        self.enqueued: list[Envelope] = []

    def enqueue(self, envelope: Envelope) -> None:
        self.enqueued.append(envelope)

    def life_of(self, key: str) -> None:
        return None


APPROVALS = [
    (kind, flow)
    for kind, flow in flows()
    if any(
        s["action"] in ("POST", "POST (approve current EventId)") for s in recorded()[kind][flow]
    )
]


@pytest.mark.parametrize(("kind", "flow"), APPROVALS)
def test_an_approval_answered_200_then_closed_completes(
    mock: MockServer, kind: str, flow: str
) -> None:
    steps = recorded()[kind][flow]
    post = next(s for s in steps if s["action"] in ("POST", "POST (approve current EventId)"))
    before = steps[steps.index(post) - 1]  # the document the approval was made on
    mock.show(before["document"])
    mock.post_answer = post["document"]
    (start,) = post["request"]["StartRequests"]
    expires = datetime.now(UTC) + timedelta(minutes=10)
    command = commands.approve_command(start["EventId"], "ops", "mock", expires)
    sink = _Sink()
    handler = CommandHandler(sink, ImdsClient(mock.peer.url))
    outcome = handler.handle(command.body_bytes(), command.message_id)
    assert (outcome.action, outcome.description) == ("complete", "approved"), outcome
    assert [e.subject for e in sink.enqueued] == ["Approved"]
    posts = [r for r in mock.peer.requests if r.method == "POST"]
    assert [json.loads(r.body) for r in posts] == [post["request"]]  # sent once


def expected_transitions(steps: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """What the documents make, in order (the pure diff, no network)."""
    known: dict[str, Any] = {}
    out: list[tuple[str, str]] = []
    for step in steps:
        document = Document.from_imds(step["document"])
        out += [(c.transition.value, c.event.key) for c in diff(known, document)]
        known = index(document.events)
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", sorted(recorded()) if RECORDED.is_dir() else [])
def test_the_forwarder_reads_every_document_of_a_kind(kind: str, tmp_path: Path) -> None:
    """The real forwarder (dry run) polls the mock server's documents of every flow of one
    kind, in the recorded order, each shown until the forwarder has read it."""
    steps = [
        step
        for flow, flow_steps in recorded()[kind].items()
        if flow != "scenario"
        for step in flow_steps
    ]
    expected = expected_transitions(steps)
    with MockServer(MOCK_STYLES[0]) as mock:
        mock.show(steps[0]["document"])
        with forwarder(mock.peer.url, tmp_path / "state", "--vm-name", "vmss_vm1") as fw:
            for step in steps:
                mock.show(step["document"])
                assert fw.wait_for(lambda _: mock.served >= 2, 30), fw.stderr_text()[-3000:]

            def published() -> list[tuple[str, str]]:
                return [
                    (m["subject"], m["session_id"])
                    for m in fw.json_lines()
                    if m.get("subject") not in ("Heartbeat", "Measured")  # reports, not transitions
                ]

            fw.wait_for(lambda _: len(published()) >= len(expected), 30)
            log = fw.stderr_text()
            got = published()
    assert got == expected, log[-3000:]
    assert "poll failed" not in log, log[-3000:]
    assert all(len(str(uuid.UUID(event))) == 36 for _, event in got)
