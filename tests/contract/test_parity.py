"""Behaviours where the local emulator used to differ from Service Bus.

Each was found by running azure-servicebus's own test suite against the emulator (make
peer-suite); each test here states what Service Bus does, through the real SDK, so it runs
unchanged against a real namespace.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

QUEUE = "contract-queue"
SESSION_QUEUE = "contract-sessions"


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("sessions_purged")
def test_message_without_session_id_to_a_session_queue_is_refused_at_once(
    client: ServiceBusClient,
) -> None:
    """Service Bus rejects the transfer (amqp:not-allowed, with its usual error info); the SDK
    raises at once. An error without ``info`` made the SDK wait out its send timeout."""
    with client.get_queue_sender(SESSION_QUEUE) as sender:
        started = time.monotonic()
        with pytest.raises(ServiceBusError, match="SessionId"):
            sender.send_messages(ServiceBusMessage("no session"), timeout=30)
        assert time.monotonic() - started < 5
        # the link is still usable: a message with a session id goes through
        session = f"s-{uuid.uuid4()}"
        sender.send_messages(ServiceBusMessage("with session", session_id=session))
    with client.get_queue_receiver(SESSION_QUEUE, session_id=session, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(got) == "with session"
        receiver.complete_message(got)  # next-available tests must not find it


@pytest.mark.timeout(30)
def test_value_body_map_with_binary_keys_round_trips(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    body = {b"binary-key": b"v", "text": [b"a", {b"nested": 1}], b"\x00\xff": None}
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(AmqpAnnotatedMessage(value_body=body), timeout=10)
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert got.body_type == AmqpMessageBodyType.VALUE
        assert got.body == {b"binary-key": b"v", b"text": [b"a", {b"nested": 1}], b"\x00\xff": None}
        receiver.complete_message(got)


@pytest.mark.timeout(30)
def test_decimal_application_properties_arrive_as_decimals(client: ServiceBusClient, drain) -> None:
    """Service Bus re-encodes decimal properties in the layout the SDK decodes; the client's own
    IEEE encoding comes back undecodable and the SDK drops the message (in receive-and-delete
    mode it is then lost)."""
    drain(QUEUE)
    properties = {"price": Decimal("1.2345"), "delta": Decimal("-7.5"), "whole": Decimal("12")}
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("priced", application_properties=properties))
        sender.send_messages(ServiceBusMessage("priced-2", application_properties=properties))
    with client.get_queue_receiver(
        QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
    ) as receiver:
        got = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        if len(got) < 2:
            got += receiver.receive_messages(max_message_count=1, max_wait_time=2)
        assert [str(m) for m in got] == ["priced", "priced-2"]
        for message in got:
            props = {k.decode(): v for k, v in message.application_properties.items()}
            assert props == properties


@pytest.mark.timeout(30)
def test_decimal_property_survives_dead_lettering(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    drain(QUEUE, dead_letter=True)
    marker = f"dlq-decimal-{uuid.uuid4()}"
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(
            ServiceBusMessage(
                "x", message_id=marker, application_properties={"amount": Decimal("0.25")}
            )
        )
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.dead_letter_message(got, reason="bad-amount")
    with client.get_queue_receiver(QUEUE, sub_queue="deadletter", max_wait_time=5) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert dead.message_id == marker
        assert dead.application_properties[b"amount"] == Decimal("0.25")
        assert dead.dead_letter_reason == "bad-amount"
        receiver.complete_message(dead)


@pytest.mark.timeout(30)
def test_peek_lock_delivery_carries_its_lock_token_in_delivery_annotations(
    client: ServiceBusClient, drain
) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("annotated"))
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        annotations = got.raw_amqp_message.delivery_annotations or {}
        token = annotations.get(b"x-opt-lock-token")
        assert token is not None
        assert str(token) == str(got.lock_token)
        receiver.complete_message(got)


@pytest.mark.timeout(30)
def test_integer_session_id_is_refused(client: ServiceBusClient) -> None:
    """Session ids are strings: Service Bus refuses a receiver whose session filter holds an int
    (the SDK's test_session_by_session_client_conn_str_receive_handler_peeklock)."""
    with pytest.raises(ServiceBusError):
        with client.get_queue_receiver(SESSION_QUEUE, session_id=1, max_wait_time=1):
            pass


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("sessions_purged")
def test_list_sessions_honours_state_updated_after(client: ServiceBusClient, namespace) -> None:
    # a margin on each side of the cutoff for the clock skew between this host and Azure
    margin = 0.3 if namespace.kind == "local" else 10.0
    old, new = f"old-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    with client.get_queue_sender(SESSION_QUEUE) as sender:
        sender.send_messages([ServiceBusMessage(s, session_id=s) for s in (old, new)])
    try:
        with client.get_queue_receiver(SESSION_QUEUE, session_id=old) as receiver:
            receiver.session.set_state("old-state")
        time.sleep(margin)
        cutoff = dt.datetime.now(dt.UTC)
        time.sleep(margin)
        with client.get_queue_receiver(SESSION_QUEUE, session_id=new) as receiver:
            receiver.session.set_state("new-state")
        updated = list(client.list_queue_sessions(SESSION_QUEUE, state_updated_after=cutoff))
        assert new in updated
        assert old not in updated
        holding_messages = list(client.list_queue_sessions(SESSION_QUEUE))
        assert old in holding_messages and new in holding_messages
    finally:
        for session in (old, new):
            with client.get_queue_receiver(
                SESSION_QUEUE, session_id=session, max_wait_time=2
            ) as receiver:
                for message in receiver.receive_messages(max_message_count=1, max_wait_time=2):
                    receiver.complete_message(message)
                receiver.session.set_state(None)


@pytest.mark.timeout(60)
def test_concurrent_lock_renewals_and_settlements_keep_the_connection(
    client: ServiceBusClient, drain
) -> None:
    """Renewals and settlements from several threads at once (AutoLockRenewer with several
    workers does this): the SDK's transfers then reach the broker with delivery-ids out of
    order, which Service Bus accepts. Every operation must succeed on the one connection."""
    drain(QUEUE)
    count = 24
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages([ServiceBusMessage(f"c-{i}") for i in range(count)])
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        got: list = []
        deadline = time.monotonic() + 15
        while len(got) < count and time.monotonic() < deadline:
            got += receiver.receive_messages(max_message_count=count - len(got), max_wait_time=2)
        assert len(got) == count
        with ThreadPoolExecutor(max_workers=8) as pool:
            for _round in range(3):
                renewed = list(pool.map(receiver.renew_message_lock, got))
                assert all(until is not None for until in renewed)
            first = min(m.sequence_number for m in got)
            pages = list(
                pool.map(
                    lambda _: receiver.peek_messages(max_message_count=2, sequence_number=first),
                    range(8),
                )
            )
            assert all([m.sequence_number for m in page] == [first, first + 1] for page in pages)
            list(pool.map(receiver.complete_message, got))
        assert receiver.receive_messages(max_wait_time=1) == []


@pytest.mark.timeout(60)
def test_round_trip_over_websockets(namespace, drain) -> None:
    """TransportType.AmqpOverWebsocket (port 443 in Azure, what a forwarder behind a proxy
    uses): send, receive, settle and a 200 KiB message (several WebSocket frames)."""
    drain(QUEUE)
    marker = f"ws-{uuid.uuid4()}"
    large = bytes(range(256)) * 800
    with namespace.websocket_client() as ws_client:
        with ws_client.get_queue_sender(QUEUE) as sender:
            sender.send_messages(ServiceBusMessage("over websockets", message_id=marker))
            sender.send_messages(ServiceBusMessage(large, message_id=f"{marker}-large"))
        with ws_client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
            got: list = []
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                got += receiver.receive_messages(max_message_count=2 - len(got), max_wait_time=2)
            assert [m.message_id for m in got] == [marker, f"{marker}-large"]
            assert str(got[0]) == "over websockets"
            assert b"".join(got[1].body) == large
            for message in got:
                receiver.complete_message(message)


@pytest.mark.timeout(60)
def test_messages_and_batches_obey_the_tier_size_limit(
    client: ServiceBusClient, namespace, drain
) -> None:
    """Standard: 256 KB for a message and for a batch, advertised on the sender link (the SDK
    sizes ServiceBusMessageBatch from it) and enforced: a larger message is rejected with
    amqp:link:message-size-exceeded, which the SDK raises as MessageSizeExceededError."""
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        batch = sender.create_message_batch()
        limit = batch.max_size_in_bytes
        if namespace.kind == "local":
            assert limit == 256 * 1024  # the default tier is Standard, as in Azure
        started = time.monotonic()
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * (limit + 1024)), timeout=30)
        assert time.monotonic() - started < 10
        sender.send_messages(ServiceBusMessage(b"x" * (limit - 1024), message_id="just-under"))
        added = 0
        with pytest.raises(MessageSizeExceededError):
            while added < 100:
                batch.add_message(ServiceBusMessage(b"b" * 16 * 1024))
                added += 1
        assert 0 < added < 100
        sender.send_messages(batch)  # the fullest batch the SDK builds is accepted
    with client.get_queue_receiver(
        QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
    ) as receiver:
        got: list = []
        deadline = time.monotonic() + 15
        while len(got) < added + 1 and time.monotonic() < deadline:
            got += receiver.receive_messages(max_message_count=added + 1, max_wait_time=2)
        assert len(got) == added + 1
        assert got[0].message_id == "just-under"


@pytest.mark.timeout(60)
def test_settling_a_deferred_message_with_a_null_lock_token_gets_an_answer(
    client: ServiceBusClient, drain
) -> None:
    """azure-servicebus settles deferred messages through $management and sends
    ``lock-tokens: [null]`` when it has lost the token (as after the SDK suite's own
    test_queue_receive_handler_peek_check_uniq_corr_id, which leaves a lock-token-dropping
    parser patched in). That array of nulls is valid AMQP that Proton refuses to decode: the
    emulator answered amqp:internal-error. It must answer the request itself, promptly."""
    drain(QUEUE)
    marker = f"null-token-{uuid.uuid4()}"
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("deferred", message_id=marker))
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        sequence_number = message.sequence_number
        receiver.defer_message(message)
        (deferred,) = receiver.receive_deferred_messages([sequence_number])
        locked_until = deferred.locked_until_utc
        deferred._received_lock_token = None  # what the SDK has after losing the token
        started = time.monotonic()
        with pytest.raises(ServiceBusError) as refused:
            receiver.complete_message(deferred)
        assert time.monotonic() - started < 10
        assert "internal" not in str(refused.value).lower()
    # the message is still there: deferred again once its lock runs out
    time.sleep(max(0.0, (locked_until - dt.datetime.now(dt.UTC)).total_seconds()) + 0.5)
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (again,) = receiver.receive_deferred_messages([sequence_number])
        assert again.message_id == marker
        receiver.complete_message(again)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("sessions_purged")
def test_session_lock_is_held_while_its_receiver_waits_for_messages(
    client: ServiceBusClient,
) -> None:
    """contract-sessions has a 5 s lock. A session receiver waiting for messages (link credit
    outstanding) longer than that keeps its session, as Service Bus does (azure-service-bus#694;
    the SDK's test_session_by_queue_client_conn_str_receive_handler_receiveanddelete relies on
    it); the emulator used to take the session away and fail the receive."""
    session = f"waiting-{uuid.uuid4().hex[:8]}"
    with client.get_queue_sender(SESSION_QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("only", session_id=session))
    with client.get_queue_receiver(
        SESSION_QUEUE,
        session_id=session,
        receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
        max_wait_time=8,
    ) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(got) == "only"
        # past the 5 s lock: an empty answer, not com.microsoft:session-lock-lost (the SDK
        # itself refuses session operations once its copy of locked_until has passed)
        assert receiver.receive_messages(max_wait_time=6) == []
