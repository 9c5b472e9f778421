"""The message-id scheme (sebridge.lifecycle) driven through the forwarder's own diff: ids never
collapse two distinct transitions, and always collapse copies of one transition (N observers of
an availability set, a restart from the saved state, a second source deriving the same)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sebridge import lifecycle
from sebridge.forwarder.imds.diff import diff, index
from sebridge.forwarder.state import ForwarderState, StateStore, bounded_lives
from sebridge.imds import Document, ScheduledEvent
from tests.support.budget import examples

GUID = "3F1C2C3E-5B7A-4C1D-9E8F-0A1B2C3D4E5F"
REF = GUID.lower()
T0 = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
NB_A = "Mon, 23 Nov 2026 10:00:00 GMT"
NB_B = "Mon, 23 Nov 2026 11:00:00 GMT"


def event(status: str = "Scheduled", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "EventId": GUID,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm1", "vm2"],
        "EventStatus": status,
        "NotBefore": "" if status == "Started" else NB_A,
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    return base | fields


class Observer:
    """One forwarder's memory (known events and lives) and what it reported, in order."""

    def __init__(self) -> None:
        self.known: dict[str, ScheduledEvent] = {}
        self.lives: dict[str, lifecycle.Life] = {}
        self.seen_at: datetime | None = None
        self.reported: list[tuple[str, str]] = []  # (transition, message id)

    def observe(self, events: list[dict[str, Any]], at: datetime) -> list[tuple[str, str]]:
        document = Document.from_imds({"DocumentIncarnation": 1, "Events": events})
        out = []
        for change in diff(self.known, document, at, last_seen=self.seen_at):
            life, message_id = lifecycle.advance(
                self.lives.get(change.event.key), change.transition.value, change.event
            )
            self.lives[change.event.key] = life
            out.append((change.transition.value, message_id))
        self.known, self.seen_at = index(document.events), at
        self.reported += out
        return out


def run(observer: Observer, documents: list[list[dict[str, Any]]]) -> list[tuple[str, str]]:
    for i, events in enumerate(documents):
        observer.observe(events, T0 + timedelta(seconds=i))
    return observer.reported


def test_not_before_a_b_a_b_is_three_updates_with_three_ids() -> None:
    reported = run(
        Observer(),
        [
            [event(NotBefore=NB_A)],
            [event(NotBefore=NB_B)],
            [event(NotBefore=NB_A)],
            [event(NotBefore=NB_B)],
        ],
    )
    assert [t for t, _ in reported] == ["Scheduled", "Updated", "Updated", "Updated"]
    ids = [i for _, i in reported]
    assert len(set(ids)) == 4, ids
    digest_a = lifecycle.content_digest(ScheduledEvent.from_imds(event(NotBefore=NB_A)))
    digest_b = lifecycle.content_digest(ScheduledEvent.from_imds(event(NotBefore=NB_B)))
    assert ids == [
        f"{REF}:Scheduled:1",
        f"{REF}:Updated:1:{digest_b}:1",
        f"{REF}:Updated:1:{digest_a}:2",  # A is current for the second time
        f"{REF}:Updated:1:{digest_b}:2",
    ]


def test_an_event_that_vanishes_and_comes_back_is_scheduled_again_under_a_new_id() -> None:
    reported = run(Observer(), [[event()], [], [event()], [], [event(status="Started")], []])
    assert reported == [
        ("Scheduled", f"{REF}:Scheduled:1"),
        ("Cancelled", f"{REF}:Cancelled:1"),
        ("Scheduled", f"{REF}:Scheduled:2"),
        ("Cancelled", f"{REF}:Cancelled:2"),
        ("Started", f"{REF}:Started:3"),
        ("Completed", f"{REF}:Completed:3"),
    ]


def test_the_observers_of_an_availability_set_give_every_transition_the_same_id() -> None:
    """N VMs see the same documents at different moments (and different incarnations)."""
    documents = [
        [event()],
        [event(Resources=["VM2", "vm1"])],  # order and case of names: the same content
        [event(NotBefore=NB_B)],
        [event(status="Started")],
        [],
    ]
    first = run(Observer(), documents)
    second = Observer()
    for i, events in enumerate(documents):
        second.observe(events, T0 + timedelta(seconds=i, milliseconds=370))
    assert second.reported == first
    assert [t for t, _ in first] == ["Scheduled", "Updated", "Started", "Completed"]


def test_an_observer_that_missed_a_change_drops_its_late_copy_instead_of_undoing_it() -> None:
    """VM 1 sees A -> B -> A; VM 2 polls between the changes only once, at B: its Updated to B
    has the id of VM 1's first Updated, so duplicate detection drops it rather than letting it
    arrive after VM 1's return to A."""
    one = run(Observer(), [[event(NotBefore=NB_A)], [event(NotBefore=NB_B)], [event()]])
    two = run(Observer(), [[event(NotBefore=NB_A)], [event(NotBefore=NB_B)]])
    assert two[-1] == one[1]
    assert one[2][1] not in {i for _, i in two}


def test_a_restart_from_the_saved_state_gives_the_same_ids(tmp_path: Path) -> None:
    documents = [
        [event()],
        [event(NotBefore=NB_B)],
        [],
        [event()],
        [event(NotBefore=NB_B)],
        [event(NotBefore=NB_A)],
    ]
    continuous = run(Observer(), documents)
    for cut in range(1, len(documents)):
        restarted = Observer()
        run(restarted, documents[:cut])
        store = StateStore(tmp_path)
        store.save(ForwarderState(1, restarted.known, 0, dict(restarted.lives), restarted.seen_at))
        loaded = store.load()
        after = Observer()
        after.known, after.lives, after.seen_at = loaded.events, loaded.lives, loaded.observed_at
        after.reported = list(restarted.reported)
        for i, events in enumerate(documents[cut:], start=cut):
            after.observe(events, T0 + timedelta(seconds=i))
        assert after.reported == continuous, cut


# A small world of contents, so that returns to an earlier content are frequent.
contents = st.fixed_dictionaries(
    {
        "NotBefore": st.sampled_from([NB_A, NB_B, "9999-12-31T23:59:59-01:00"]),
        "DurationInSeconds": st.sampled_from([-1, 30, 3_000_000_000]),
        "Description": st.sampled_from(["x", "y"]),
    }
)
steps = st.one_of(
    contents.map(lambda fields: [event(**fields)]),
    st.just([event(status="Started")]),
    st.just([]),
)


def as_imds_does(documents: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """IMDS never takes a Started event back to Scheduled: it stays Started until it is gone."""
    out, started = [], False
    for events in documents:
        if started and events:
            events = [event(status="Started")]
        started = bool(events) and events[0]["EventStatus"] == "Started"
        out.append(events)
    return out


@pytest.mark.slow
@settings(max_examples=examples(500), deadline=None)
@given(st.lists(steps, min_size=1, max_size=12).map(as_imds_does))
def test_distinct_transitions_never_share_an_id(documents: list[list[dict[str, Any]]]) -> None:
    reported = run(Observer(), documents)
    ids = [i for _, i in reported]
    assert len(ids) == len(set(ids)), reported
    assert all(len(i) <= 128 for i in ids)
    # ...and a second observer of the same documents derives exactly the same.
    assert run(Observer(), documents) == reported


def test_ids_carry_no_per_vm_fact() -> None:
    """Incarnation and observation time differ between VMs; the ids do not."""
    a, b = Observer(), Observer()
    for i, events in enumerate([[event()], [event(NotBefore=NB_B)], []]):
        a.observe(events, T0 + timedelta(seconds=i))
        b.observe(events, T0 + timedelta(hours=1, seconds=i * 7))
    assert a.reported == b.reported
    for _, message_id in a.reported:
        assert "vm" not in message_id and "2026" not in message_id


def test_bounded_lives_keeps_present_events_and_the_most_recent_past_ones() -> None:
    lives = {f"past-{i}": lifecycle.Life() for i in range(1200)}
    lives |= {"present": lifecycle.Life(appearance=3)}
    kept = bounded_lives(lives, {"present"})
    assert len(kept) == 1000 and kept["present"].appearance == 3
    assert "past-1199" in kept and "past-0" not in kept
    assert next(iter(kept)) != "past-0"


# -- pinned by hand: the literals below are worked out from the documented rules, not from the
# module's constants, so that a change to those rules fails here --------------------------------

# The content digests of event(NotBefore=NB_A), 37404333c19f, and of NB_B, b159ecf12414: the
# first 12 hex characters of SHA-256 over the JSON (no spaces) of [NotBefore ISO 8601, sorted
# lower-case Resources, Duration, Description, lower-case EventType, lower-case EventSource]:
# ["2026-11-23T10:00:00+00:00",["vm1","vm2"],-1,null,"reboot","platform"] (11:00 for B).


def test_a_returning_event_counts_its_contents_afresh() -> None:
    """Scheduled A, Cancelled, Scheduled A (appearance 2), Updated B, Updated A: the last is
    A's second time current in appearance 2, A#2 (the first appearance's A does not count)."""
    reported = run(
        Observer(),
        [
            [event(NotBefore=NB_A)],
            [],
            [event(NotBefore=NB_A)],
            [event(NotBefore=NB_B)],
            [event(NotBefore=NB_A)],
        ],
    )
    assert [i for _, i in reported] == [
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Scheduled:1",
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Cancelled:1",
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Scheduled:2",
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Updated:2:b159ecf12414:1",
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Updated:2:37404333c19f:2",
    ]


def test_a_returning_event_forgets_the_contents_of_its_last_appearance() -> None:
    """B was current once in appearance 1; in appearance 2 it is B#1 again, not B#2."""
    reported = run(
        Observer(),
        [
            [event(NotBefore=NB_A)],
            [event(NotBefore=NB_B)],
            [],
            [event(NotBefore=NB_A)],
            [event(NotBefore=NB_B)],
        ],
    )
    assert [i for _, i in reported] == [
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Scheduled:1",
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Updated:1:b159ecf12414:1",
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Cancelled:1",
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Scheduled:2",
        "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f:Updated:2:b159ecf12414:1",
    ]


@pytest.mark.parametrize(
    ("event_id", "ref"),
    [
        # "x-" and the first 32 hex characters of SHA-256 over the lower-cased, stripped id.
        ("Not a GUID: maintenance #7", "x-5ec37cc36a06b36769b8df96623191da"),
        # A safe token of 64 characters is kept; 65 are too long for an id.
        ("A" * 64, "a" * 64),
        ("a" * 65, "x-635361c48bb9eab14198e76ea8ab7f1a"),
    ],
)
def test_an_event_id_that_is_not_a_guid_becomes_a_fixed_ref(event_id: str, ref: str) -> None:
    assert lifecycle.event_ref(event_id) == ref


def version(n: int) -> ScheduledEvent:
    """Content n of the event: distinct contents by Description (a watched field)."""
    return ScheduledEvent.from_imds(event(Description=f"content {n}"))


def occurrences(life: lifecycle.Life, *ns: int) -> list[int]:
    """What the next Updated to each content would count, in turn (updating ``life``)."""
    out = []
    for n in ns:
        life, message_id = lifecycle.advance(life, "Updated", version(n))
        out.append(int(message_id.rsplit(":", 1)[1]))
    return out


def fill(count: int, reuse: int | None = None) -> lifecycle.Life:
    """Scheduled with content 0, then Updated to contents 1..count-1 (count distinct), with
    content ``reuse`` current once more at the end."""
    life, _ = lifecycle.advance(None, "Scheduled", version(0))
    for n in range(1, count):
        life, _ = lifecycle.advance(life, "Updated", version(n))
    if reuse is not None:
        life, _ = lifecycle.advance(life, "Updated", version(reuse))
    return life


def test_256_contents_are_all_remembered() -> None:
    life = fill(256)
    assert len(life.versions) == 256
    assert occurrences(life, 0) == [2]  # the oldest of exactly 256 is still known


def test_the_257th_content_forgets_the_oldest() -> None:
    life = fill(257)
    assert len(life.versions) == 256
    assert occurrences(life, 1) == [2]  # the second oldest is kept
    assert occurrences(life, 0) == [1]  # the oldest was forgotten: counted afresh


def test_a_content_current_again_is_forgotten_last() -> None:
    life = fill(256, reuse=0)  # content 0 is now the most recent
    life, _ = lifecycle.advance(life, "Updated", version(256))  # forgets one: content 1
    assert len(life.versions) == 256
    assert occurrences(life, 0) == [3]
    assert occurrences(life, 1) == [1]
