"""Topic fan-out through SQL and correlation filters (from single messages, lists and batches),
and topic-level duplicate detection."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

TOPIC = "contract-topic"
FILTERS = "contract-filters"  # a topic of its own: nothing else sends there
SUBSCRIPTIONS = ("all", "sql-in", "sql-like", "sql-null", "sql-not-in", "correlation")


def _message(key: str, run: str, **kwargs: Any) -> ServiceBusMessage:
    props = kwargs.pop("props", {})
    props["key"] = key
    message_id = kwargs.pop("message_id", f"{run}-{key}")
    return ServiceBusMessage(key, message_id=message_id, application_properties=props, **kwargs)


def _collect(
    client: ServiceBusClient, sub: str, expected: int, topic: str = TOPIC, **kwargs: Any
) -> list[str]:
    """Keys of every message in a subscription, removed as they are read (bounded)."""
    keys: list[str] = []
    deadline = time.monotonic() + 10
    with client.get_subscription_receiver(
        topic, sub, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, **kwargs
    ) as receiver:
        while time.monotonic() < deadline:
            wait = 3 if len(keys) < expected else 0.5
            batch = receiver.receive_messages(max_message_count=50, max_wait_time=wait)
            if not batch and len(keys) >= expected:
                break
            keys += [m.application_properties[b"key"].decode() for m in batch]
    return sorted(keys)


@pytest.mark.timeout(60)
def test_sql_and_correlation_filters_fan_out(client: ServiceBusClient, drain) -> None:
    for sub in SUBSCRIPTIONS:
        drain(topic=TOPIC, subscription=sub)
    drain(topic=TOPIC, subscription="by-session", session_ids=("s-1",))
    run = uuid.uuid4().hex[:8]
    json = "application/json"
    messages = [
        _message(
            "m1",
            run,
            props={"transition": "Scheduled", "durationInSeconds": 60, "vmName": "web_1"},
            content_type=json,
        ),
        _message(
            "m2",
            run,
            props={
                "transition": "Started",
                "durationInSeconds": 10,
                "vmName": "webX1",
                "zone": "1",
            },
        ),
        _message(
            "m3",
            run,
            props={"transition": "Heartbeat", "priority": 5},
            content_type=json,
            subject="urgent",
        ),
        _message(
            "m4", run, props={"transition": "Completed", "priority": -3}, content_type="text/plain"
        ),
        _message("m5", run, props={"transition": "Completed", "urgent": True}, content_type=json),
        _message(
            "m6",
            run,
            props={"transition": "Approved", "vmName": "vm-7"},
            correlation_id="corr-1",
            subject="Approved",
        ),
        _message(
            "m7",
            run,
            props={"transition": "Approved", "vmName": "vm-8"},
            correlation_id="corr-1",
            subject="Approved",
        ),
        _message("m8", run, session_id="s-1", to="somebody"),
        _message("m9", run, session_id="s-1", to="somebody", message_id=f"skip-{run}"),
        _message("m10", run, session_id="s-1"),
    ]
    with client.get_topic_sender(TOPIC) as sender:
        sender.send_messages(messages)
    expected = {
        "all": [f"m{i}" for i in range(1, 11)],
        "sql-in": ["m1"],
        "sql-like": ["m1", "m3"],
        "sql-null": ["m1", "m4", "m5", "m6", "m7"],
        "sql-not-in": ["m3", "m5"],
        "correlation": ["m6"],
    }
    expected["by-session"] = ["m8"]
    with ThreadPoolExecutor(max_workers=len(expected)) as pool:  # receivers open in parallel
        futures = {
            sub: pool.submit(
                _collect,
                client,
                sub,
                len(keys),
                **({"session_id": "s-1"} if sub == "by-session" else {}),
            )
            for sub, keys in expected.items()
        }
        got = {sub: future.result(timeout=30) for sub, future in futures.items()}
    assert got == {sub: sorted(keys) for sub, keys in expected.items()}


@pytest.mark.timeout(30)
def test_topic_duplicate_detection_by_message_id(client: ServiceBusClient, drain) -> None:
    drain(topic=TOPIC, subscription="all")
    message_id = f"dup-{uuid.uuid4()}"
    with client.get_topic_sender(TOPIC) as sender:
        sender.send_messages(_message("first", "x", message_id=message_id))
        sender.send_messages(_message("second", "x", message_id=message_id))
        sender.send_messages([_message("third", "x", message_id=message_id)])
    assert _collect(client, "all", 1) == ["first"]


@pytest.mark.timeout(30)
def test_message_batch_to_a_topic_fans_out_through_filters(client: ServiceBusClient, drain) -> None:
    """A ServiceBusMessageBatch is one transfer to the topic; each message in it is filtered
    on its own: ``durationInSeconds <= 30`` and ``sys.CorrelationId = 'approve:e-1'``."""
    subscriptions = ("everything", "short-notice", "one-correlation-id")
    for sub in subscriptions:
        drain(topic=FILTERS, subscription=sub)
    run = uuid.uuid4().hex[:8]
    with client.get_topic_sender(FILTERS) as sender:
        batch = sender.create_message_batch()
        for message in [
            _message("b1", run, props={"durationInSeconds": 29}),
            _message("b2", run, props={"durationInSeconds": 30}, correlation_id="approve:e-1"),
            _message("b3", run, props={"durationInSeconds": 31}),
            _message("b4", run, props={"durationInSeconds": -1}),
            _message("b5", run, correlation_id="approve:e-1"),
            _message("b6", run, correlation_id="approve:e-10"),
        ]:
            batch.add_message(message)
        sender.send_messages(batch)
    expected = {
        "everything": [f"b{i}" for i in range(1, 7)],
        "short-notice": ["b1", "b2", "b4"],  # b5, b6: no durationInSeconds, unknown is not true
        "one-correlation-id": ["b2", "b5"],
    }
    with ThreadPoolExecutor(max_workers=len(expected)) as pool:  # receivers open in parallel
        futures = {
            sub: pool.submit(_collect, client, sub, len(keys), topic=FILTERS)
            for sub, keys in expected.items()
        }
        got = {sub: future.result(timeout=30) for sub, future in futures.items()}
    assert got == {sub: sorted(keys) for sub, keys in expected.items()}
