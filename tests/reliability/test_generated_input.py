"""Generated input (hypothesis, thousands of cases): nothing an IMDS body or a command holds can
crash the forwarder, and every invalid command gets a dead-letter reason.

The documents go through exactly what a poll does (parse, diff against the last known events,
build contract messages, persist state); the commands through the command parser and the
decision. The network version of the command property is in test_commands_over_the_wire.py.
"""

from __future__ import annotations

import itertools
import json
import string
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sebridge.contract import commands
from sebridge.contract.events import Observer, Transition, event_message, parse_message
from sebridge.forwarder.approvals.decision import Action, decide
from sebridge.forwarder.imds.diff import diff, index
from sebridge.forwarder.state import ForwarderState, StateStore
from sebridge.imds import Document, InvalidDocument, ScheduledEvent
from tests.support.budget import examples

NOW = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
OBSERVER = Observer(vm_name="vm1", resource_group="rg")
REASONS = {
    commands.INVALID_JSON,
    commands.UNSUPPORTED_SCHEMA_VERSION,
    commands.UNKNOWN_COMMAND,
    commands.INVALID_FIELD,
    commands.INVALID_EVENT_ID,
    commands.EXPIRED,
}

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False),
    st.text(max_size=30),
)
json_any = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
guids = st.uuids().map(str).flatmap(lambda g: st.sampled_from([g, g.upper(), "{" + g + "}"]))
not_before = st.one_of(
    st.just(""),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT")),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.text(max_size=20),
)
plausible_event = st.fixed_dictionaries(
    {
        "EventId": guids,
        "EventType": st.sampled_from(["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"]),
        "ResourceType": st.just("VirtualMachine"),
        "Resources": st.lists(
            st.text(string.ascii_lowercase + "_-0123456789", max_size=8), max_size=3
        ),
        "EventStatus": st.sampled_from(["Scheduled", "Started"]),
        "NotBefore": not_before,
    },
    optional={
        "Description": st.text(max_size=40),
        "EventSource": st.sampled_from(["Platform", "User"]),
        "DurationInSeconds": st.one_of(st.integers(-1, 10_000), st.text(max_size=4)),
    },
)
# Mostly plausible events, sometimes anything at all in their place.
event_or_junk = st.one_of(plausible_event, plausible_event, plausible_event, json_any)
documents = st.one_of(
    st.fixed_dictionaries(
        {
            "DocumentIncarnation": st.integers(0, 10_000),
            "Events": st.lists(event_or_junk, max_size=4),
        }
    ),
    json_any,
)


def poll(known: dict[str, ScheduledEvent], body: object) -> tuple[dict[str, ScheduledEvent], list]:
    """What one poll of the forwarder does with a body, minus the HTTP."""
    try:
        document = Document.from_imds(body)
    except InvalidDocument:
        return known, []  # rejected whole: the known events stay as they were
    changes = diff(known, document)
    envelopes = [
        event_message(c.transition, c.event, OBSERVER, document.incarnation, NOW, changes=c.changes)
        for c in changes
    ]
    for envelope in envelopes:
        assert parse_message(envelope.body_bytes()).transition.value == envelope.subject
        json.dumps(envelope.to_dict())  # what the dry-run prints and the outbox stores
    return index(document.events), envelopes


@pytest.mark.slow
@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents, min_size=1, max_size=6))
def test_any_sequence_of_bodies_is_handled_without_crashing(bodies: list[object]) -> None:
    known: dict[str, ScheduledEvent] = {}
    history: dict[str, list[str]] = {}
    for body in bodies:
        known, envelopes = poll(known, body)
        for envelope in envelopes:
            history.setdefault(envelope.session_id, []).append(envelope.subject)
    for transitions in history.values():
        # Lifecycle grammar per event: a terminal transition is followed only by a new life.
        for before, after in itertools.pairwise(transitions):
            if before in ("Completed", "Cancelled"):
                assert after in ("Scheduled", "Started")
            if before == "Started":
                assert after in ("Completed",)


@pytest.mark.slow
@settings(max_examples=examples(500), deadline=None)
@given(st.lists(plausible_event, max_size=4), st.integers(0, 10_000))
def test_state_round_trips_whatever_imds_sent(
    tmp_path_factory: Any, events: list[dict[str, Any]], incarnation: int
) -> None:
    document = Document.from_imds({"DocumentIncarnation": incarnation, "Events": events})
    store = StateStore(Path(tmp_path_factory.mktemp("state")))
    store.save(ForwarderState(incarnation, index(document.events)))
    loaded = store.load()
    assert loaded.incarnation == incarnation
    assert diff(loaded.events, document) == []  # a restart re-derives nothing


VALID_COMMAND: dict[str, Any] = {
    "schemaVersion": 1,
    "command": "approve",
    "eventId": "8b95c271-2b77-4243-ad1a-585faa9cd908",
    "requestedBy": "someone",
    "reason": "because",
    "expiresAt": "2099-01-01T00:00:00Z",
}
# A valid command with one field broken or removed: reaches the later checks of the parser.
near_valid_commands = st.tuples(
    st.sampled_from(sorted(VALID_COMMAND)), st.one_of(st.just(None), json_leaf, guids, not_before)
).map(
    lambda change: json.dumps(
        {k: v for k, v in VALID_COMMAND.items() if k != change[0]}
        | ({} if change[1] is None else {change[0]: change[1]})
    ).encode()
)
command_bodies = st.one_of(
    near_valid_commands,
    near_valid_commands,
    st.binary(max_size=200),
    json_any.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {},
        optional={
            "schemaVersion": st.one_of(st.just(1), json_leaf),
            "command": st.one_of(st.just("approve"), json_leaf),
            "eventId": st.one_of(guids, json_leaf),
            "requestedBy": st.one_of(st.text(max_size=600), json_leaf),
            "reason": st.one_of(st.text(max_size=600), json_leaf),
            "expiresAt": st.one_of(
                st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()), json_leaf
            ),
        },
    ).map(lambda d: json.dumps(d).encode()),
)


@pytest.mark.slow
@settings(max_examples=examples(3000), deadline=None)
@given(command_bodies)
def test_every_command_is_either_valid_or_rejected_with_a_known_reason(body: bytes) -> None:
    try:
        command = commands.parse_command(body, NOW)
    except commands.CommandError as exc:
        assert exc.reason in REASONS
        assert exc.description
        return
    # A valid command: canonical id, an expiry in the future, and a decision that never raises.
    assert command.event_id == command.event_id.lower()
    assert command.expires_at > NOW
    document = Document.from_imds({"DocumentIncarnation": 1, "Events": []})
    assert decide(command, document, vm_name="vm1").action is Action.DEAD_LETTER


def test_transition_names_cover_the_lifecycle() -> None:
    assert {t.value for t in Transition} >= {
        "Scheduled",
        "Updated",
        "Started",
        "Completed",
        "Cancelled",
    }
