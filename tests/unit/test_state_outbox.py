"""Durable state (atomic JSON) and the SQLite outbox, on a real temporary directory."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sebridge.contract.events import Observer, Transition, event_message, heartbeat_message
from sebridge.forwarder.delivery.outbox import MEMORY, OUTBOX_FILE, Outbox, OutboxError
from sebridge.forwarder.durable import boundaries
from sebridge.forwarder.state import (
    MAX_TRANSITIONS,
    STATE_FILE,
    ForwarderState,
    RecentTransition,
    StateStore,
    recent_transitions,
)
from sebridge.imds import Document
from tests.support.budget import examples

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


# -- a damaged state directory never crash-loops the forwarder (issue 10, item 7) -------------

DEEP = b'{"version": 1, "events": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(
            b'{"version": 1, "incarnation": 1, "outboxSeq": 100000000000000000000, "events": []}',
            id="outbox-seq-10-to-the-20",
        ),
        pytest.param(b'{"version": 1, "outboxSeq": -1, "events": []}', id="negative-seq"),
        pytest.param(b'{"version": 1, "incarnation": true, "events": []}', id="bool-incarnation"),
        pytest.param(DEEP, id="100000-nesting-levels"),
        pytest.param(b'{"version": 1, "events": [], "lives": {"a": {"appearance": 0}}}', id="life"),
        pytest.param(b'{"version": 1, "events": [], "lives": []}', id="lives-not-object"),
        pytest.param(b'{"version": 1, "events": [{"EventId": 7}]}', id="event-without-id"),
        pytest.param(b"", id="empty"),
        pytest.param(b'{"version": 1, "events": [', id="truncated"),
        pytest.param(b'"' + b"x" * 100 + b'"', id="a-string"),
    ],
)
def test_a_damaged_state_file_is_moved_aside_and_the_forwarder_starts_fresh(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING):
        state = StateStore(tmp_path).load()
    assert state == ForwarderState()
    assert "unreadable" in caplog.text
    (kept,) = tmp_path.glob(f"{STATE_FILE}.corrupt-*")
    assert kept.read_bytes() == content
    assert not (tmp_path / STATE_FILE).exists()


def test_absurd_but_tolerable_values_load(tmp_path: Path) -> None:
    """A year-9999 time with a negative offset cannot be expressed in UTC: kept verbatim,
    parsed to null (an event's NotBefore), or taken as unknown (the last observation)."""
    event = dict(EVENT, NotBefore="9999-12-31T23:59:59-01:00")
    body = {
        "version": 1,
        "incarnation": 10**30,
        "outboxSeq": 2**63 - 1,
        "observedAt": "9999-12-31T23:59:59-01:00",
        "events": [event],
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(body))
    state = StateStore(tmp_path).load()
    (loaded,) = state.events.values()
    assert loaded.not_before is None and loaded.raw["NotBefore"] == event["NotBefore"]
    assert state.observed_at is None and state.outbox_seq == 2**63 - 1


def test_too_large_a_state_file_is_damaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sebridge.forwarder import state as state_module

    monkeypatch.setattr(state_module, "MAX_STATE_BYTES", 100)
    (tmp_path / STATE_FILE).write_text(json.dumps({"version": 1, "events": [EVENT]}))
    assert StateStore(tmp_path).load() == ForwarderState()
    assert list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))


def test_a_directory_in_place_of_the_state_file_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).mkdir()
    assert StateStore(tmp_path).load() == ForwarderState()
    assert not (tmp_path / STATE_FILE).exists()


def test_leftovers_of_interrupted_saves_are_removed_at_start(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(ForwarderState(3, {}))
    for i in range(5):
        (tmp_path / f".{STATE_FILE}.abc{i}.tmp").write_bytes(b"half a sta")
    (tmp_path / "unrelated.tmp").write_bytes(b"x")
    assert store.load().incarnation == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE, "unrelated.tmp"]


def test_only_the_latest_damaged_copies_are_kept(tmp_path: Path) -> None:
    from sebridge.forwarder.state import KEEP_DAMAGED

    for _ in range(KEEP_DAMAGED + 3):
        (tmp_path / STATE_FILE).write_bytes(b"{")
        StateStore(tmp_path).load()
    assert len(list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))) == KEEP_DAMAGED


def test_a_state_directory_that_is_a_file_is_unusable(tmp_path: Path) -> None:
    from sebridge.forwarder.state import StateDirUnusable, ensure_dir

    (tmp_path / "file").write_text("x")
    with pytest.raises(StateDirUnusable, match=r"File exists|Not a directory"):
        ensure_dir(tmp_path / "file")
    with pytest.raises(StateDirUnusable):
        ensure_dir(tmp_path / "file" / "sub")


def test_the_observation_time_round_trips(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(ForwarderState(1, {}, observed_at=NOW))
    assert store.load().observed_at == NOW


def _recent(index: int) -> RecentTransition:
    event_id = f"3f1c2c3e-5b7a-4c1d-9e8f-{index:012d}"
    return RecentTransition(event_id, event_id, "Scheduled", f"{event_id}:Scheduled:1", NOW)


def test_the_last_transitions_round_trip_bounded(tmp_path: Path) -> None:
    """Issue 22e, item 2a: kept with the state, at most MAX_TRANSITIONS, the newest."""
    store = StateStore(tmp_path)
    kept = recent_transitions((), [_recent(i) for i in range(MAX_TRANSITIONS + 5)])
    assert len(kept) == MAX_TRANSITIONS and kept[-1] == _recent(MAX_TRANSITIONS + 4)
    store.save(ForwarderState(1, {}, transitions=kept))
    assert store.load().transitions == kept


def test_a_state_file_without_or_with_damaged_transitions_loads(tmp_path: Path) -> None:
    """The tolerant reader: a state file from before they were kept has none; a damaged record
    is left out, the rest (and the state) kept; nothing is moved aside."""
    store = StateStore(tmp_path)
    store.save(ForwarderState(1, {}, transitions=(_recent(1), _recent(2))))
    document = json.loads(store.path.read_text())
    del document["transitions"]
    store.path.write_text(json.dumps(document))
    assert store.load() == ForwarderState(1, {}, observed_at=None, transitions=())
    good = _recent(2).to_data()
    for damaged in (
        {"transitions": "no"},
        {"transitions": [1, {"at": "x"}, good, {**good, "eventRef": ""}]},
    ):
        store.path.write_text(json.dumps({**document, **damaged}))
        assert store.load().transitions == (() if damaged["transitions"] == "no" else (_recent(2),))
    assert not list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda path: path.write_bytes(b"this is not a database" * 100), id="garbage"),
        pytest.param(lambda path: path.write_bytes(b""), id="empty"),  # SQLite takes it as new
        pytest.param(
            lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
            id="truncated",
        ),
        pytest.param(
            lambda path: path.write_bytes(path.read_bytes()[:100] + b"\xff" * 4000),
            id="header-then-junk",
        ),
    ],
)
def test_a_damaged_outbox_is_moved_aside_and_the_outbox_starts_empty(
    tmp_path: Path, damage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path)
    outbox.put(_envelopes(200))
    outbox._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    outbox.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp_path / OUTBOX_FILE}{suffix}").unlink(missing_ok=True)
    damage(tmp_path / OUTBOX_FILE)
    with caplog.at_level(logging.WARNING):
        reopened = Outbox(tmp_path)
    # Whatever could be made of it, the outbox works: it takes, keeps and gives back rows.
    reopened.put(_envelopes(1), hold=False)
    assert reopened.depth() >= 1
    assert reopened.peek(1)
    if "damaged" in caplog.text:
        (kept,) = tmp_path.glob(f"{OUTBOX_FILE}.corrupt-*")
        assert kept.stat().st_size > 0


def test_a_garbage_outbox_is_reported_as_damaged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / OUTBOX_FILE).write_bytes(b"\x00garbage" * 1000)
    with caplog.at_level(logging.WARNING):
        outbox = Outbox(tmp_path)
    assert "is damaged" in caplog.text
    assert outbox.depth() == 0


def test_a_failed_write_raises_the_original_error_not_the_rollbacks(tmp_path: Path) -> None:
    """A full database (SQLite's own limit, as a full disk makes it): the error says so."""
    outbox = Outbox(tmp_path)
    outbox.put(_envelopes(1))
    (pages,) = outbox._db.execute("PRAGMA page_count").fetchone()
    outbox._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(OutboxError, match="full") as caught:
        outbox.put(_envelopes(50))
    assert "rollback" not in str(caught.value).lower()
    assert outbox.depth() == 1  # nothing of the failed write took effect
    outbox._db.execute("PRAGMA max_page_count = 1000000")
    assert outbox.put(_envelopes(50)) > 0  # and it works again once there is room


def test_a_message_set_aside_is_kept_with_its_reason_and_no_longer_sent(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    messages = _envelopes(3)
    outbox.put(messages)
    (first, _), *_ = outbox.peek(10)
    outbox.set_aside(first, "too large even alone")
    assert [e.message_id for _, e in outbox.peek(10)] == [m.message_id for m in messages[1:]]
    (row,) = outbox.aside()
    assert row.seq == first and row.message_id == messages[0].message_id
    assert row.reason == "too large even alone"
    assert outbox.aside_count() == 1 and outbox.depth() == 2
    outbox.close()
    assert Outbox(tmp_path).aside_count() == 1  # kept across restarts


def test_the_aside_table_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sebridge.forwarder.delivery import outbox as outbox_module

    monkeypatch.setattr(outbox_module, "MAX_ASIDE", 3)
    outbox = Outbox(tmp_path)
    outbox.put(_envelopes(5))
    for seq, _ in outbox.peek(10):
        outbox.set_aside(seq, "x")
    assert [row.seq for row in outbox.aside()] == [5, 4, 3]


def test_an_unreadable_row_is_set_aside_instead_of_blocking_the_rest(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    messages = _envelopes(3)
    outbox.put(messages)
    outbox._db.execute("UPDATE outbox SET envelope = '{\"half\": ' WHERE seq = 1")
    outbox._db.execute("UPDATE outbox SET envelope = '[]' WHERE seq = 2")
    assert [e.message_id for _, e in outbox.peek(10)] == [messages[2].message_id]
    reasons = [row.reason for row in outbox.aside()]
    assert len(reasons) == 2 and all(r.startswith("unreadable outbox row") for r in reasons)


def test_an_outbox_from_before_held_rows_gains_the_column(tmp_path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / OUTBOX_FILE)
    db.execute(
        "CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL"
        " UNIQUE, heartbeat INTEGER NOT NULL, envelope TEXT NOT NULL, enqueued_at TEXT NOT NULL)"
    )
    envelope = _envelopes(1)[0]
    db.execute(
        "INSERT INTO outbox (message_id, heartbeat, envelope, enqueued_at) VALUES (?, 0, ?, '')",
        (envelope.message_id, json.dumps(envelope.to_dict())),
    )
    db.commit()
    db.close()
    outbox = Outbox(tmp_path)
    assert [e.message_id for _, e in outbox.peek(10)] == [envelope.message_id]


def test_an_in_memory_outbox_works_like_the_file(tmp_path: Path) -> None:
    outbox = Outbox(MEMORY)
    highest = outbox.put(_envelopes(2), hold=True)
    assert outbox.peek(10) == []
    assert outbox.recover(highest) == (2, 0)
    assert len(outbox.peek(10)) == 2


@settings(max_examples=examples(60), deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["put", "put-held", "release", "remove", "aside"]), st.integers(0, 5)
        ),
        max_size=25,
    )
)
def test_the_cached_counts_are_the_database_counts(steps: list[tuple[str, int]]) -> None:
    """depth() and aside_count() are asked on every poll and answered from memory between
    writes: after any mix of writes they equal what a fresh connection counts."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        outbox = Outbox(directory, max_rows=8)
        made = 0
        for action, n in steps:
            if action.startswith("put"):
                envelopes = _envelopes(made + n + 1)[made:]
                made += len(envelopes)
                outbox.put(envelopes, hold=action == "put-held")
            elif action == "release":
                outbox.release(10**9)
            elif action == "remove":
                outbox.remove([seq for seq, _ in outbox.peek(n)])
            elif rows := outbox.peek(1):
                outbox.set_aside(rows[0][0], "too large")
            outbox.depth()  # fill the cache between writes
            fresh = Outbox(directory)
            assert (outbox.depth(), outbox.aside_count()) == (fresh.depth(), fresh.aside_count())
            fresh.close()
        outbox.close()


# -- write boundaries (sebridge.forwarder.durable): a crash at each leaves before or after --------


class Crash(BaseException):
    """kill -9 at a write boundary: nothing after it happens (no cleanup either)."""


def crash_at(name: str) -> Any:
    def hook(where: str) -> None:
        if where == name:
            raise Crash(where)

    return hook


def test_a_crash_at_each_state_file_boundary_leaves_the_old_or_the_new_state(
    tmp_path: Path,
) -> None:
    document = Document.from_imds({"DocumentIncarnation": 7, "Events": [EVENT]})
    old, new = ForwarderState(6), ForwarderState(7, {e.key: e for e in document.events})
    names: list[str] = []
    StateStore(tmp_path).save(old)
    with boundaries(names.append):
        StateStore(tmp_path).save(new)
    assert names == [f"{STATE_FILE}:write", f"{STATE_FILE}:rename", f"{STATE_FILE}:dirsync"]
    for name, expected in zip(names, (6, 6, 7), strict=True):
        StateStore(tmp_path).save(old)
        with boundaries(crash_at(name)), pytest.raises(Crash):
            StateStore(tmp_path).save(new)
        assert StateStore(tmp_path).load().incarnation == expected, name
        assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE], name  # leftovers removed


def test_a_crash_at_an_outbox_commit_leaves_nothing_of_the_transaction(tmp_path: Path) -> None:
    envelope = heartbeat_message(
        OBSERVER,
        NOW,
        forwarder_version="x",
        last_incarnation=1,
        outbox_depth=0,
        last_successful_poll=None,
    )
    outbox = Outbox(tmp_path)
    with boundaries(crash_at("outbox:commit")), pytest.raises(Crash):
        outbox.put([envelope])
    outbox.close()
    reopened = Outbox(tmp_path)
    assert reopened.depth() == 0
    reopened.put([envelope])
    assert reopened.depth() == 1
    reopened.close()
