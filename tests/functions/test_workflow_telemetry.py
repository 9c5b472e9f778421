"""Telemetry: every Service Bus invocation logs exactly one structured line, so one event can
be followed through every workflow (functions/shared/invocations.py)."""

from __future__ import annotations

import inspect
import json
import logging
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.functions.servicebus import ServiceBusMessage

from functions.adapters.retry import TransientHttpError
from functions.shared.invocations import INVOCATION_PREFIX, LOGGER_NAME
from sebridge.contract.events import Envelope
from tests.fixtures import golden
from tests.functions.support import EVENT_ID, App, envelope, sb_message, web_vm

FIELDS = {
    "function",
    "messageId",
    "eventId",
    "transition",
    "eventType",
    "vmName",
    "deliveryCount",
    "outcome",
    "durationMs",
    "traceId",
}


def service_bus_message(
    message: Envelope, *, body: bytes | None = None, **overrides: Any
) -> func.ServiceBusMessage:
    """``sb_message`` with some of the worker's fields replaced."""
    base = sb_message(message, body=body)
    fields = {
        "body": base.get_body(),
        "message_id": base.message_id,
        "session_id": base.session_id,
        "content_type": base.content_type,
        "application_properties": base.application_properties,
        "user_properties": base.user_properties,
        "delivery_count": base.delivery_count,
    }
    return ServiceBusMessage(**{**fields, **overrides})


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    found = []
    for record in caplog.records:
        if record.name != LOGGER_NAME:
            continue
        text = record.getMessage()
        assert text.startswith(INVOCATION_PREFIX)
        fields = json.loads(text.removeprefix(INVOCATION_PREFIX))
        # The same fields ride along as `extra` (customDimensions under OpenTelemetry).
        assert {k: getattr(record, k) for k in fields} == fields
        found.append(fields)
    return found


@pytest.fixture
def full_app(make_app: Callable[..., App]) -> App:
    """Every Service Bus trigger registered: the custom subscriber and webhooks too."""
    return make_app(
        CUSTOM_SUBSCRIBER_ENABLED="true",
        CustomSubscriptionName="vm-loss",
        WebhooksSubscriptionName="webhooks",
    )


def _service_bus_functions(app: App) -> list[str]:
    return sorted(
        name
        for name, fn in app.functions.items()
        if any(json.loads(b)["type"] == "serviceBusTrigger" for b in fn.get_raw_bindings())
    )


def test_every_service_bus_trigger_logs_its_invocations(full_app: App) -> None:
    names = _service_bus_functions(full_app)
    assert names == ["approval_gate", "custom_example", "lb_pools", "teams", "webhooks"]
    for name in names:
        user = full_app.functions[name].get_user_function()
        assert getattr(user, "__wrapped__", None) is not None, f"{name} lacks @log_invocation"
        # What the Functions worker reads to bind the message survives the decorator.
        assert list(inspect.signature(user).parameters) == ["msg"]
        assert typing.get_type_hints(user)["msg"] is func.ServiceBusMessage


@pytest.mark.timeout(30)
def test_one_event_can_be_followed_through_every_workflow(
    full_app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for vm in ("web-1", "web-2"):  # the golden event's VMs exist: the message is verified
        web_vm(full_app.arm, vm, [])
    scheduled = golden.build()["scheduled"]
    for name in _service_bus_functions(full_app):
        full_app.deliver(name, scheduled)
    found = lines(caplog)
    assert sorted(f["function"] for f in found) == _service_bus_functions(full_app)
    for fields in found:
        counts = (
            {"posted", "skipped", "rejected", "failed", "suppressed"}
            if fields["function"] == "webhooks"
            else set()
        )
        assert set(fields) == FIELDS | counts
        assert fields["eventId"] == EVENT_ID and fields["messageId"] == scheduled.message_id
        # The trace the forwarder's message names: from a log line to the event's spans.
        assert fields["traceId"] == str(scheduled.application_properties["traceparent"])[3:35]
        assert (fields["transition"], fields["eventType"], fields["vmName"]) == (
            "Scheduled",
            "Reboot",
            "web-1",
        )
        assert fields["outcome"] == "ok" and fields["deliveryCount"] == 1
        assert isinstance(fields["durationMs"], float) and fields["durationMs"] >= 0


@pytest.mark.timeout(30)
def test_heartbeats_name_their_forwarder(app: App, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    heartbeat = golden.build()["heartbeat"]
    app.deliver("approval_gate", heartbeat)
    (fields,) = lines(caplog)
    assert fields["transition"] == "Heartbeat" and fields["vmName"] == "web-1"
    assert fields["eventId"] is None and fields["messageId"] == heartbeat.message_id
    assert fields["traceId"] is None


@pytest.mark.timeout(30)
def test_a_failing_invocation_logs_its_error_class_and_still_raises(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app.teams.fail(503, times=3, retry_after="0")
    # The last delivery before the dead-letter queue (MaxDeliveryCount 10).
    message = service_bus_message(envelope("Scheduled"), delivery_count=10)
    with pytest.raises(TransientHttpError):
        app.call("teams", message)
    (fields,) = lines(caplog)
    assert (fields["outcome"], fields["error"], fields["deliveryCount"]) == (
        "error",
        "TransientHttpError",
        10,
    )
    record = next(r for r in caplog.records if r.name == LOGGER_NAME)
    assert record.levelno == logging.WARNING
    assert "fake-secret-signature" not in record.getMessage()  # never the exception's text


@pytest.mark.timeout(30)
def test_a_message_that_breaks_the_contract_is_logged_as_dropped(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app.call("lb_pools", sb_message(envelope("Scheduled"), body=b"{not json"))
    (fields,) = lines(caplog)
    assert fields["outcome"] == "dropped" and fields["function"] == "lb_pools"
    assert fields["messageId"] == envelope("Scheduled").message_id
    assert fields["eventId"] is None and fields["transition"] is None


@pytest.mark.timeout(30)
def test_hostile_ids_are_cut_and_cleaned(app: App, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    message = service_bus_message(
        envelope("Scheduled"), body=b"{}", message_id="m" * 5000 + "\ud800"
    )
    app.call("teams", message)
    (fields,) = lines(caplog)
    assert len(fields["messageId"]) == 128 and fields["messageId"].endswith("\u2026")


def test_note_refuses_names_that_would_break_the_log_record() -> None:
    from functions.shared.invocations import note

    with pytest.raises(ValueError, match="may not be named"):
        note(None, msg="x")
    with pytest.raises(ValueError, match="may not be named"):
        note(None, outcome="x")
    note("ignored outside an invocation", posted=1)  # no invocation: nothing happens


def test_invocation_lines_are_never_sampled_away() -> None:
    """Adaptive sampling would drop lines at random: an event's path would have gaps and the
    heartbeat alert would see a live forwarder as silent."""
    host = json.loads((Path(__file__).resolve().parents[2] / "host.json").read_text())
    sampling = host["logging"]["applicationInsights"]["samplingSettings"]
    assert sampling.get("isEnabled") is False or "Trace" in sampling["excludedTypes"].split(";")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("function", ["lb_pools", "approval_gate", "teams"])
def test_a_message_refused_by_verification_is_logged_as_refused(
    app: App, caplog: pytest.LogCaptureFixture, function: str
) -> None:
    """A message that fails the scope check changed nothing: its line must not say ``ok``
    (lead's review of issue 23, item b). The observer web-1 does not exist in this ARM."""
    caplog.set_level(logging.INFO)
    app.deliver(function, envelope("Scheduled"))
    (fields,) = lines(caplog)
    assert (fields["outcome"], fields["refusal"]) == ("refused", "security")
    assert fields["function"] == function and fields["eventId"] == EVENT_ID
