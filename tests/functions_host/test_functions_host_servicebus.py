"""The functions host against the real local Service Bus emulator, with the real SDK.

Each test starts the host in process on the test apps (tests/functions_host/apps) and talks
to the emulator with azure-servicebus as any sender would.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps import sb_app
from apps import sb_blueprint as recorded
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from conftest import APPS, HERE

from emulators.functions_host.host import FunctionsHost
from emulators.functions_host.hostconfig import HostConfig, ServiceBusOptions

testing = pytest.importorskip("emulators.servicebus.testing")

CONFIG = HERE / "emulator-config.json"
TOPIC = "fh-events"
OPTIONS = ServiceBusOptions(
    max_concurrent_calls=1,
    max_concurrent_sessions=2,
    session_idle_timeout=dt.timedelta(seconds=1),
)


@pytest.fixture(scope="module")
def emulator() -> Iterator[Any]:
    with testing.running_emulator(CONFIG) as running:
        yield running


def _host(emulator: Any, *functions: str, options: ServiceBusOptions = OPTIONS) -> FunctionsHost:
    settings = {"FhServiceBus": emulator.connection_string, "FhTopicName": TOPIC}
    return FunctionsHost(
        sb_app, settings, host_config=HostConfig(service_bus=options), functions=list(functions)
    )


@pytest.fixture(scope="module")
def shared_host(emulator: Any) -> Iterator[FunctionsHost]:
    """One host for the tests that only send and observe (each on its own entity)."""
    names = ("capture", "always_fails", "ordered", "relay", "async_handler")
    with _host(emulator, *names) as host:
        yield host


def _send(emulator: Any, entity: str, *messages: ServiceBusMessage, topic: bool = False) -> None:
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        sender = client.get_topic_sender(entity) if topic else client.get_queue_sender(entity)
        with sender:
            sender.send_messages(list(messages))


def _peek(emulator: Any, queue: str, *, sub_queue: str | None = None) -> list[Any]:
    """What a queue (or its dead-letter queue) holds, without taking it."""
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver,
    ):
        return list(receiver.peek_messages(max_message_count=10))


def _peek_subscription(emulator: Any, subscription: str) -> list[Any]:
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_subscription_receiver(TOPIC, subscription) as receiver,
    ):
        return list(receiver.peek_messages(max_message_count=10))


@pytest.mark.timeout(40)
def test_topic_trigger_sees_every_message_property(
    emulator: Any, shared_host: FunctionsHost
) -> None:
    recorded.captured.clear()
    sent_at = dt.datetime.now(dt.UTC)
    message = ServiceBusMessage(
        b'{"eventId": "e-1"}',
        message_id="capture-1",
        correlation_id="corr-1",
        subject="Scheduled",
        content_type="application/json",
        reply_to="replies",
        reply_to_session_id="reply-session",
        to="somebody",
        time_to_live=dt.timedelta(hours=2),
        application_properties={"kind": "capture", "transition": "Scheduled", "count": 3},
    )
    _send(emulator, TOPIC, message, topic=True)
    (seen,) = recorded.captured.wait_for(1, timeout=20)
    time.sleep(0.5)  # let the completion reach the broker

    assert seen["function_name"] == "capture"
    assert seen["body"] == b'{"eventId": "e-1"}'
    assert seen["message_id"] == "capture-1"
    assert seen["correlation_id"] == "corr-1"
    assert seen["subject"] == seen["label"] == "Scheduled"
    assert seen["content_type"] == "application/json"
    assert seen["reply_to"] == "replies"
    assert seen["reply_to_session_id"] == "reply-session"
    assert seen["to"] == "somebody"
    assert seen["session_id"] is None
    assert seen["time_to_live"] == dt.timedelta(hours=2)
    assert seen["delivery_count"] == 1
    expected = {"kind": "capture", "transition": "Scheduled", "count": 3}
    assert seen["application_properties"] == seen["user_properties"] == expected
    enqueued = seen["enqueued_time_utc"]
    assert abs(enqueued - sent_at) < dt.timedelta(seconds=10)
    assert seen["expires_at_utc"] == enqueued + dt.timedelta(hours=2)
    assert seen["locked_until"] > enqueued
    assert seen["lock_token"] and isinstance(seen["sequence_number"], int)
    assert seen["state"] == 0
    assert seen["metadata"]["MessageId"] == "capture-1"
    assert seen["metadata"]["sys"]["MethodName"] == "capture"
    # Completed on success: nothing is left on the subscription.
    assert _peek_subscription(emulator, "capture") == []


@pytest.mark.timeout(40)
def test_exception_abandons_until_the_broker_dead_letters(
    emulator: Any, shared_host: FunctionsHost
) -> None:
    recorded.failures.clear()
    _send(emulator, "failing", ServiceBusMessage("poison", message_id="poison-1"))
    attempts = recorded.failures.wait_for(3, timeout=25)
    time.sleep(0.5)
    # MaxDeliveryCount is 3 in the test config: three attempts, counted as Functions counts them.
    assert attempts[:3] == [("poison-1", 1), ("poison-1", 2), ("poison-1", 3)]
    dead = _peek(emulator, "failing", sub_queue="deadletter")
    assert [m.message_id for m in dead] == ["poison-1"]
    assert dead[0].dead_letter_reason == "MaxDeliveryCountExceeded"
    assert _peek(emulator, "failing") == []
    assert len(recorded.failures.items()) == 3


@pytest.mark.timeout(40)
def test_sessions_are_processed_in_order_per_session(
    emulator: Any, shared_host: FunctionsHost
) -> None:
    recorded.ordered.clear()
    sessions = ["vm-a", "vm-b", "vm-c"]
    messages = [
        ServiceBusMessage(f"{sid}:{i}", session_id=sid, application_properties={"kind": "ordered"})
        for i in range(5)
        for sid in sessions
    ]
    _send(emulator, TOPIC, *messages, topic=True)
    seen = recorded.ordered.wait_for(len(messages), timeout=30)
    assert len(seen) == len(messages)
    for sid in sessions:
        bodies = [body for session, body in seen if session == sid]
        assert bodies == [f"{sid}:{i}" for i in range(5)]


@pytest.mark.timeout(40)
def test_output_binding_sends_and_async_functions_run(
    emulator: Any, shared_host: FunctionsHost
) -> None:
    recorded.relayed.clear()
    recorded.async_seen.clear()
    _send(emulator, "relay-in", ServiceBusMessage("hello", message_id="relay-1"))
    _send(emulator, "async-in", ServiceBusMessage("from-async"))
    assert recorded.relayed.wait_for(1, timeout=20) == ["relay-1"]
    assert recorded.async_seen.wait_for(1, timeout=20) == ["from-async"]
    deadline = time.monotonic() + 10
    while not (out := _peek(emulator, "relay-out")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [str(m) for m in out] == ["relayed:hello"]
    assert out[0].content_type == "text/plain"


@pytest.mark.timeout(40)
def test_cardinality_many_receives_a_list(emulator: Any) -> None:
    recorded.batches.clear()
    messages = [ServiceBusMessage(f"b{i}", message_id=f"batch-{i}") for i in range(6)]
    # Queue everything before the host starts, so one receive can take several messages.
    _send(emulator, "batch-in", *messages)
    with _host(emulator, "batch"):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if sum(len(b) for b in recorded.batches.items()) >= len(messages):
                break
            recorded.batches.wait_for(len(recorded.batches.items()) + 1, timeout=0.5)
        time.sleep(0.5)
    batches = recorded.batches.items()
    flat = [item for batch in batches for item in batch]
    assert sorted(flat) == sorted((f"batch-{i}", f"b{i}") for i in range(6))
    assert any(len(batch) > 1 for batch in batches)
    assert _peek(emulator, "batch-in") == []


@pytest.mark.timeout(40)
def test_stop_lets_the_invocation_in_flight_finish_and_complete(emulator: Any) -> None:
    recorded.slow_started.clear()
    recorded.slow_finished.clear()
    host = _host(emulator, "slow").start()
    try:
        _send(emulator, "slow-in", ServiceBusMessage("slow", message_id="slow-1"))
        assert recorded.slow_started.wait_for(1, timeout=20) == ["slow-1"]
    finally:
        host.stop()
    assert recorded.slow_finished.items() == ["slow-1"]
    # It was completed, not left for redelivery.
    assert _peek(emulator, "slow-in") == []


@pytest.mark.timeout(60)
def test_host_survives_an_emulator_restart(caplog: pytest.LogCaptureFixture) -> None:
    recorded.captured.clear()

    def capture(message_id: str) -> ServiceBusMessage:
        return ServiceBusMessage(
            "x", message_id=message_id, application_properties={"kind": "capture"}
        )

    with testing.running_emulator(CONFIG) as emulator, _host(emulator, "capture"):
        _send(emulator, TOPIC, capture("before"), topic=True)
        assert [s["message_id"] for s in recorded.captured.wait_for(1, timeout=20)] == ["before"]
        with caplog.at_level(logging.WARNING, logger="functions_host"):
            emulator.restart(down_for=1.5)
            _send(emulator, TOPIC, capture("after"), topic=True)
            seen = recorded.captured.wait_for(2, timeout=30)
        assert [s["message_id"] for s in seen] == ["before", "after"]
    assert any("reconnecting" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_cli_runs_service_bus_triggers_and_stops_on_sigterm(tmp_path: Path) -> None:
    # Its own emulator: the module's shared host would otherwise take the message.
    with testing.running_emulator(CONFIG) as emulator:
        _run_cli_against(emulator, tmp_path)


def _run_cli_against(emulator: Any, tmp_path: Path) -> None:
    settings = tmp_path / "local.settings.json"
    settings.write_text(
        json.dumps(
            {
                "IsEncrypted": False,
                "Values": {"FhServiceBus": emulator.connection_string, "FhTopicName": TOPIC},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("Fh")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    command = [
        sys.executable,
        "-m",
        "sebridge.cli",
        "functions-host",
        "--app",
        str(APPS / "sb_app.py"),
    ]
    command += ["--settings", str(settings), "--port", "0", "--functions", "capture,ping"]
    command += ["--log-format", "json"]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        message = ServiceBusMessage(
            "cli", message_id="cli-1", application_properties={"kind": "capture"}
        )
        _send(emulator, TOPIC, message, topic=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _peek_subscription(emulator, "capture"):
            time.sleep(0.3)
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
    assert process.returncode == 0, err
    assert out == ""
    events = [json.loads(raw) for raw in err.splitlines() if raw.startswith("{")]
    started = [e for e in events if e.get("event") == "function"]
    assert {(e["function"], e["trigger"]) for e in started} == {
        ("capture", "serviceBusTrigger"),
        ("ping", "httpTrigger"),
    }
    capture = next(e for e in started if e["function"] == "capture")
    assert capture["entity"] == f"{TOPIC}/Subscriptions/capture"
    invocations = [e for e in events if e.get("event") == "invocation"]
    assert [(e["function"], e["message_id"], e["outcome"]) for e in invocations] == [
        ("capture", "cli-1", "succeeded")
    ]
    assert invocations[0]["duration_ms"] >= 0
    assert "SharedAccessKey" not in err
