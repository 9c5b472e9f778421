"""Session receivers: named and next-available, exclusivity, lock renewal, session state.

Each test uses fresh session ids. Next-available receivers get any session that has messages,
so the queue is purged of earlier runs' sessions before the first test here (``sessions_purged``
in conftest.py; a no-op locally, where the emulator starts empty).
"""

from __future__ import annotations

import time
import uuid

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    SessionCannotBeLockedError,
)

from tests.contract.cleanup import purge_sessions

QUEUE = "contract-sessions"  # RequiresSession, LockDuration PT5S

pytestmark = pytest.mark.usefixtures("sessions_purged")


def _send(client: ServiceBusClient, *pairs: tuple[str, str]) -> None:
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages([ServiceBusMessage(body, session_id=sid) for sid, body in pairs])


def _receive_all(receiver, expected: int) -> list:
    got: list = []
    deadline = time.monotonic() + 8
    while len(got) < expected and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=expected - len(got), max_wait_time=2)
    return got


@pytest.mark.timeout(30)
def test_named_session_gets_only_its_messages_in_order(client: ServiceBusClient) -> None:
    a, b = f"vm-a-{uuid.uuid4().hex[:6]}", f"vm-b-{uuid.uuid4().hex[:6]}"
    _send(client, (a, "a1"), (b, "b1"), (a, "a2"), (a, "a3"))
    with client.get_queue_receiver(QUEUE, session_id=a) as receiver:
        assert receiver.session.session_id == a
        assert receiver.session.locked_until_utc is not None
        got = _receive_all(receiver, 3)
        assert [str(m) for m in got] == ["a1", "a2", "a3"]
        assert all(m.session_id == a for m in got)
        for message in got:
            receiver.complete_message(message)
        assert receiver.receive_messages(max_wait_time=0.5) == []
    with client.get_queue_receiver(QUEUE, session_id=b) as receiver:
        got = _receive_all(receiver, 1)
        assert [str(m) for m in got] == ["b1"]
        receiver.complete_message(got[0])


@pytest.mark.timeout(30)
def test_next_available_session_and_exclusivity(client: ServiceBusClient) -> None:
    sid = f"vm-n-{uuid.uuid4().hex[:6]}"
    _send(client, (sid, "n1"))
    with client.get_queue_receiver(
        QUEUE, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as receiver:
        assert receiver.session.session_id == sid
        with pytest.raises(SessionCannotBeLockedError):
            with client.get_queue_receiver(QUEUE, session_id=sid) as second:
                second.receive_messages(max_wait_time=1)
        (message,) = _receive_all(receiver, 1)
        assert str(message) == "n1"
        receiver.complete_message(message)


@pytest.mark.timeout(30)
def test_purge_removes_what_earlier_runs_left_in_any_session(namespace) -> None:
    """What the session-start purge of a shared namespace relies on (conftest.py)."""
    run = uuid.uuid4().hex[:6]
    with namespace.client(retry_total=0) as client:
        _send(client, (f"old-a-{run}", "a1"), (f"old-a-{run}", "a2"), (f"old-b-{run}", "b1"))
        assert purge_sessions(client, QUEUE, accept_wait=0.5) == 3


@pytest.mark.timeout(30)
def test_next_available_with_no_session_times_out(namespace) -> None:
    with namespace.client(retry_total=0) as client:
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError):
            with client.get_queue_receiver(
                QUEUE, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
            ) as receiver:
                receiver.receive_messages(max_wait_time=2)
        elapsed = time.monotonic() - started
        assert 1.5 <= elapsed < 15, elapsed


@pytest.mark.timeout(30)
def test_session_state_and_lock_renewal(client: ServiceBusClient) -> None:
    sid = f"vm-s-{uuid.uuid4().hex[:6]}"
    with client.get_queue_receiver(QUEUE, session_id=sid) as receiver:
        session = receiver.session
        assert session.get_state() in (None, b"")
        session.set_state(b'{"approved": ["e1"]}')
        assert session.get_state() == b'{"approved": ["e1"]}'
        before = session.locked_until_utc
        time.sleep(0.2)
        after = session.renew_lock()
        assert after > before
        assert session.locked_until_utc == after
    # state outlives the receiver
    with client.get_queue_receiver(QUEUE, session_id=sid) as receiver:
        assert receiver.session.get_state() == b'{"approved": ["e1"]}'
        receiver.session.set_state(None)


@pytest.mark.timeout(30)
def test_session_message_abandon_and_redelivery(client: ServiceBusClient) -> None:
    sid = f"vm-r-{uuid.uuid4().hex[:6]}"
    _send(client, (sid, "r1"))
    with client.get_queue_receiver(QUEUE, session_id=sid) as receiver:
        (first,) = _receive_all(receiver, 1)
        assert first.locked_until_utc is None  # session messages are locked by the session
        receiver.abandon_message(first)
        (second,) = _receive_all(receiver, 1)
        assert str(second) == "r1"
        assert second.delivery_count == 1
        receiver.complete_message(second)
