"""Durable state (atomic JSON) and the SQLite outbox, on a real temporary directory."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sebridge.contract.events import Observer, Transition, event_message, heartbeat_message
from sebridge.forwarder.outbox import Outbox
from sebridge.forwarder.state import STATE_FILE, ForwarderState, StateStore
from sebridge.imds import Document

EVENT = {
    "EventId": "3F1C2C3E-5B7A-4C1D-9E8F-0A1B2C3D4E5F",
    "EventType": "Reboot",
    "ResourceType": "VirtualMachine",
    "Resources": ["vm1"],
    "EventStatus": "Scheduled",
    "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
}
OBSERVER = Observer(vm_name="vm1")
NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def test_state_round_trips(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    document = Document.from_imds({"DocumentIncarnation": 7, "Events": [EVENT]})
    store.save(ForwarderState(7, {e.key: e for e in document.events}))
    loaded = StateStore(tmp_path).load()
    assert loaded.incarnation == 7
    (event,) = loaded.events.values()
    assert event.to_imds() == EVENT
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]  # no temp files left behind


def test_missing_state_is_a_fresh_start(tmp_path: Path) -> None:
    state = StateStore(tmp_path).load()
    assert state.incarnation is None and state.events == {}


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"version": 99}', b'{"version": 1, "events": [{"x": 1}]}', b"\xff\xfe"],
)
def test_corrupt_state_warns_and_starts_fresh(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING):
        state = StateStore(tmp_path).load()
    assert state.events == {}
    assert "unreadable" in caplog.text
    kept = list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == content


def _envelopes(n: int) -> list:
    document = Document.from_imds(
        {
            "DocumentIncarnation": 1,
            "Events": [dict(EVENT, EventId=f"00000000-0000-4000-8000-{i:012d}") for i in range(n)],
        }
    )
    return [event_message(Transition.SCHEDULED, e, OBSERVER, 1, NOW) for e in document.events]


def test_outbox_keeps_order_and_survives_reopen(tmp_path: Path) -> None:
    messages = _envelopes(5)
    outbox = Outbox(tmp_path)
    assert outbox.put(messages) == 5  # the row number of the last one
    outbox.close()
    reopened = Outbox(tmp_path)
    pending = reopened.peek(10)
    assert [e.message_id for _, e in pending] == [m.message_id for m in messages]
    assert pending[0][1] == messages[0]
    reopened.remove([seq for seq, _ in pending[:2]])
    assert reopened.depth() == 3
    assert [e.message_id for _, e in reopened.peek(10)] == [m.message_id for m in messages[2:]]


def test_outbox_ignores_a_pending_duplicate(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    messages = _envelopes(2)
    highest = outbox.put(messages)
    assert outbox.put(messages) == highest  # the rows already there, not new ones
    assert outbox.depth() == 2


def test_outbox_overflow_drops_heartbeats_first_then_oldest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path, max_rows=4)
    beat = heartbeat_message(
        OBSERVER,
        NOW,
        forwarder_version="t",
        last_incarnation=1,
        outbox_depth=0,
        last_successful_poll=None,
    )
    messages = _envelopes(5)
    outbox.put([beat, *messages[:3]])
    with caplog.at_level(logging.ERROR):
        outbox.put(messages[3:])
    kept = [e.message_id for _, e in outbox.peek(10)]
    assert kept == [m.message_id for m in messages[1:]]
    assert outbox.dropped_total == 2
    assert "OUTBOX FULL" in caplog.text


def test_outbox_rows_are_plain_json(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.put(_envelopes(1))
    ((_, envelope),) = outbox.peek(1)
    assert json.loads(json.dumps(envelope.to_dict())) == envelope.to_dict()


def test_held_rows_are_invisible_until_released(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    highest = outbox.put(_envelopes(2), hold=True)
    assert highest > 0 and outbox.peek(10) == []
    outbox.release(highest)
    assert len(outbox.peek(10)) == 2


def test_recover_releases_what_the_saved_state_covers_and_drops_the_rest(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    first, second = _envelopes(2)
    covered = outbox.put([first], hold=True)  # its state was saved, then the crash
    outbox.put([second], hold=True)  # the crash came before its state was saved
    outbox.close()
    reopened = Outbox(tmp_path)
    assert reopened.recover(covered) == (1, 1)
    assert [e.message_id for _, e in reopened.peek(10)] == [first.message_id]


def test_state_remembers_the_outbox_row_it_covers(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(ForwarderState(3, {}, outbox_seq=42))
    assert store.load().outbox_seq == 42
