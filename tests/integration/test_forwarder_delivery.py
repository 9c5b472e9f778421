"""The real `sebridge forwarder` publishing to the Service Bus emulator, read back with the real
SDK: what reaches the subscriptions when messages are too large, cannot be encoded, or pile up
during an outage (item 2), and how message ids keep distinct transitions apart while duplicate
detection collapses the copies of one (item 3).

IMDS is tests/support/imds_stub.py, which serves any document (EventIds and values the
simulator's scenarios would refuse). Until the emulator enforces a maximum message size of its
own, the forwarder's own --max-message-size is lowered to make messages too large.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.processes import ChildProcess, forwarder
from emulators.servicebus.testing import running_emulator
from sebridge import lifecycle
from sebridge.contract.events import Observer, Transition, event_message, parse_message
from sebridge.forwarder.delivery.outbox import Outbox
from sebridge.imds import ScheduledEvent
from tests.support.bus import receive_all
from tests.support.imds_stub import ImdsStub
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "infra" / "servicebus-emulator" / "Config.json"


@pytest.fixture
def bus() -> Iterator[Any]:
    with running_emulator(CONFIG) as emulator:
        yield emulator


@pytest.fixture
def imds() -> Iterator[ImdsStub]:
    with ImdsStub() as stub:
        yield stub


def rfc1123(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


NB_A = rfc1123(datetime.now(UTC) + timedelta(hours=2))
NB_B = rfc1123(datetime.now(UTC) + timedelta(hours=3))


def reboot(event_id: str | None = None, **fields: Any) -> dict[str, Any]:
    event = {
        "EventId": event_id or str(uuid.uuid4()),
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["stub-vm"],
        "EventStatus": "Scheduled",
        "NotBefore": NB_A,
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    return event | fields


def availability_set(size: int, name_length: int = 60) -> list[str]:
    return [f"vm-{i:04d}-".ljust(name_length, "x") for i in range(size)]


def publishing(
    imds: ImdsStub, bus: Any, state: Path, *extra: str, heartbeat: float = 0
) -> ChildProcess:
    return forwarder(
        imds.url,
        state,
        "--connection-string",
        bus.connection_string,
        *extra,
        dry_run=False,
        heartbeat_interval=heartbeat,
    )


def logged(fw: ChildProcess, text: str, count: int = 1, timeout: float = 20) -> None:
    assert fw.wait_for(lambda _: fw.stderr_text().count(text) >= count, timeout), (
        f"{text!r} x{count} not logged:\n{fw.stderr_text()[-3000:]}"
    )


def sessions(messages: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for message in messages:
        out.setdefault(message["session_id"], []).append(message["subject"])
    return out


# -- item 2: one unsendable message never blocks the rest -------------------------------------


@pytest.mark.timeout(150)
def test_a_message_too_large_even_alone_is_set_aside_and_a_later_event_is_delivered(
    imds: ImdsStub, bus: Any, tmp_path: Path
) -> None:
    large = reboot(Resources=availability_set(400))  # ~25 KB of names
    small = reboot()
    imds.set_events([large])
    with publishing(imds, bus, tmp_path, "--max-message-size", "16384", heartbeat=2) as fw:
        logged(fw, "SET ASIDE")
        imds.set_events([large, small])
        lb = receive_all(bus.connection_string, "lb-pools", want=1, timeout=30)
        audit = receive_all(bus.connection_string, "audit", want=3, timeout=30)
        log = fw.stderr_text()
        assert fw.alive
    assert [(m["subject"], m["session_id"]) for m in lb] == [
        ("Scheduled", small["EventId"].lower())
    ]
    set_aside = [line for line in log.splitlines() if "SET ASIDE" in line]
    assert len(set_aside) == 1 and " ERROR " in set_aside[0]
    assert f"{large['EventId'].lower()}:Scheduled:1" in set_aside[0]
    assert "larger than the maximum message size" in set_aside[0]
    beats = [parse_message(m["body"]) for m in audit if m["subject"] == "Heartbeat"]
    assert any(b.data["heartbeat"].get("health", {}).get("setAside") == 1 for b in beats)
    (row,) = Outbox(tmp_path).aside()
    assert row.message_id == f"{large['EventId'].lower()}:Scheduled:1"


def _planted(event: dict[str, Any], breakage: str) -> dict[str, Any]:
    """An outbox row as an older forwarder wrote it: a value the SDK cannot encode."""
    envelope = event_message(
        Transition.SCHEDULED,
        ScheduledEvent.from_imds(event),
        Observer(vm_name="old-version"),
        1,
        datetime.now(UTC),
    ).to_dict()
    if breakage == "int-beyond-int32":
        envelope["application_properties"]["durationInSeconds"] = 3_000_000_000
    elif breakage == "lone-surrogate":
        envelope["application_properties"]["eventType"] = "Reboot\ud800"
    else:  # an id over Service Bus's 128 characters
        envelope["message_id"] = "x" * 200
    return envelope


@pytest.mark.timeout(150)
def test_messages_the_sdk_cannot_encode_are_set_aside_across_a_restart(
    imds: ImdsStub, bus: Any, tmp_path: Path
) -> None:
    """Rows written by an older version, pending when the new one starts: each is refused
    alone and set aside; the genuine Reboot behind them is delivered."""
    import sqlite3

    breakages = ["int-beyond-int32", "lone-surrogate", "id-too-long"]
    planted = [_planted(reboot(), b) for b in breakages]
    Outbox(tmp_path).close()
    db = sqlite3.connect(tmp_path / "outbox.sqlite3")
    for i, envelope in enumerate(planted):
        db.execute(
            "INSERT INTO outbox (message_id, heartbeat, envelope, enqueued_at, ready)"
            " VALUES (?, 0, ?, '', 1)",
            (f"planted-{i}", json.dumps(envelope)),
        )
    db.commit()
    db.close()
    genuine = reboot()
    imds.set_events([genuine])
    with publishing(imds, bus, tmp_path) as fw:
        lb = receive_all(bus.connection_string, "lb-pools", want=1, timeout=40)
        logged(fw, "SET ASIDE", count=3)
        log = fw.stderr_text()
    assert [(m["subject"], m["session_id"]) for m in lb] == [
        ("Scheduled", genuine["EventId"].lower())
    ]
    reasons = [row.reason for row in Outbox(tmp_path).aside()]
    assert len(reasons) == 3 and all("cannot encode" in r for r in reasons), reasons
    assert "Traceback" not in log


@pytest.mark.timeout(240)
def test_large_messages_pending_after_an_outage_go_out_in_batches_that_fit(
    imds: ImdsStub, bus: Any, tmp_path: Path
) -> None:
    """Six ~25 KB Scheduled pile up while the broker is down; a 64 KiB limit takes two at a
    time. Sent as one batch of six they would be refused on every retry, forever."""
    with publishing(
        imds, bus, tmp_path, "--max-message-size", "65536", "--log-level", "DEBUG"
    ) as fw:
        wait_until(lambda: len(imds.gets()) >= 2, 20, "the first polls")
        bus.stop()
        events = [reboot(Resources=availability_set(400)) for _ in range(6)]
        imds.set_events(events)
        logged(fw, "forwarder: Scheduled ", count=6)
        time.sleep(3)
        bus.start()
        lb = receive_all(bus.connection_string, "lb-pools", want=6, timeout=90)
        log = fw.stderr_text()
    assert sorted(m["session_id"] for m in lb) == sorted(e["EventId"].lower() for e in events)
    assert "SET ASIDE" not in log
    batches = [line for line in log.splitlines() if "sent " in line and " message(s): [" in line]
    sizes = [int(line.split("sent ")[1].split(" ")[0]) for line in batches]
    assert sum(sizes) >= 6 and max(sizes) <= 2, sizes


# -- item 3: ids keep distinct transitions apart, and collapse the copies of one --------------


def wait_observed(fws: list[ChildProcess], transition: str, count: int) -> None:
    for fw in fws:
        logged(fw, f"forwarder: {transition} ", count=count)


@pytest.mark.timeout(200)
def test_a_b_a_b_and_a_comeback_reach_subscribers_once_each_from_two_vms(
    imds: ImdsStub, bus: Any, tmp_path: Path
) -> None:
    """Two forwarders (two VMs of an availability set) see NotBefore A -> B -> A -> B, then
    the event vanish and come back with the same EventId, and vanish again. Each subscriber
    gets every transition exactly once: three Updated (the third is not the first one's
    duplicate) and a second Scheduled after the Cancelled."""
    event_id = str(uuid.uuid4())
    expected = ["Scheduled", "Updated", "Updated", "Updated", "Cancelled", "Scheduled", "Cancelled"]
    first = publishing(imds, bus, tmp_path / "a", "--vm-name", "vm-a")
    second = publishing(imds, bus, tmp_path / "b", "--vm-name", "vm-b")
    with first, second:
        fws = [first, second]
        wait_until(lambda: len(imds.gets()) >= 4, 20, "both forwarders polling")
        imds.set_events([reboot(event_id, NotBefore=NB_A)])
        wait_observed(fws, "Scheduled", 1)
        for i, not_before in enumerate([NB_B, NB_A, NB_B], start=1):
            imds.set_events([reboot(event_id, NotBefore=not_before)])
            wait_observed(fws, "Updated", i)
        imds.set_events([])
        wait_observed(fws, "Cancelled", 1)
        imds.set_events([reboot(event_id, NotBefore=NB_B)])
        wait_observed(fws, "Scheduled", 2)
        imds.set_events([])
        wait_observed(fws, "Cancelled", 2)
        lb = receive_all(bus.connection_string, "lb-pools", want=len(expected), timeout=60)
        time.sleep(1)
        late = receive_all(bus.connection_string, "lb-pools", want=0, timeout=3)
    assert sessions(lb) == {event_id: expected}, lb
    assert late == []  # the other VM's copies: dropped by duplicate detection
    ids = [m["message_id"] for m in lb]
    assert len(set(ids)) == len(ids)
    # The ids the documented scheme gives (sebridge.lifecycle), with no per-VM fact in them.
    lives: dict[str, lifecycle.Life] = {}
    for message in lb:
        event = ScheduledEvent.from_imds(parse_message(message["body"]).data)
        life, expected_id = lifecycle.advance(lives.get(event.key), message["subject"], event)
        lives[event.key] = life
        assert message["message_id"] == expected_id
        assert "vm-a" not in expected_id and "vm-b" not in expected_id
    assert ids[4:] == [
        f"{event_id}:Cancelled:1",
        f"{event_id}:Scheduled:2",
        f"{event_id}:Cancelled:2",
    ]


@pytest.mark.timeout(120)
def test_sigterm_ends_the_process_within_5_seconds_with_service_bus_links_open(
    imds: ImdsStub, bus: Any, tmp_path: Path
) -> None:
    """As on a VM: the topic sender open and the approvals receiver waiting for commands
    (a receive blocks up to 5 s), while IMDS is in the middle of a stalled body."""
    import signal

    with publishing(imds, bus, tmp_path) as fw:
        logged(fw, "receiving commands on approvals")
        imds.set_events([reboot()])
        receive_all(bus.connection_string, "lb-pools", want=1, timeout=30)
        imds.mode = "stall-body"
        count = len(imds.gets())
        wait_until(lambda: len(imds.gets()) > count, 10, "a poll with a stalled body")
        time.sleep(1)
        assert fw.process is not None
        started = time.monotonic()
        fw.process.send_signal(signal.SIGTERM)
        code = fw.process.wait(timeout=30)
        took = time.monotonic() - started
        log = fw.stderr_text()
    assert took < 5.0, (took, log[-2000:])
    assert code == 0, log[-2000:]
