"""The local functions host serves Event Grid triggers the way the Functions runtime does:
/runtime/webhooks/EventGrid?functionName=<name>, the handshakes, one invocation per event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest
import requests

from emulators.fakes.eventgrid import (
    CLOUD_EVENT_SCHEMA,
    EVENT_GRID_SCHEMA,
    EventGridDeliveryError,
    EventGridPublisher,
)
from emulators.functions_host.bindings import BindingError, FunctionMetadata, discover
from emulators.functions_host.host import FunctionsHost
from tests.eventgrid.apps import eg_app
from tests.eventgrid.support import event_json

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def host() -> Iterator[FunctionsHost]:
    eg_app.received.clear()
    running = FunctionsHost(eg_app, {}, port=0)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def webhook(host: FunctionsHost, name: str = "record") -> str:
    return f"{host.url}/runtime/webhooks/EventGrid?functionName={name}"


def post(url: str, body: Any, event_type: str | None = "Notification", **headers: str) -> Any:
    if event_type is not None:
        headers["aeg-event-type"] = event_type
    return requests.post(url, data=json.dumps(body), headers=headers, timeout=10)


def test_the_binding_is_indexed_as_the_runtime_indexes_it(host: FunctionsHost) -> None:
    local = func.FunctionApp()

    @local.function_name("f")
    @local.event_grid_trigger(arg_name="event")
    def f(event: func.EventGridEvent) -> None: ...

    (function,) = local.get_functions()
    (binding,) = [json.loads(b) for b in function.get_raw_bindings()]
    assert binding == {"direction": "IN", "type": "eventGridTrigger", "name": "event"}
    (spec,) = discover([FunctionMetadata("f", (binding,))], {})
    assert spec.trigger.entity == "/runtime/webhooks/EventGrid?functionName=f"
    assert [s.trigger.kind for s in host.specs] == ["eventGridTrigger"]


def test_unsupported_triggers_are_still_named() -> None:
    with pytest.raises(BindingError, match="supported: serviceBusTrigger, httpTrigger, event"):
        discover([FunctionMetadata("x", ({"type": "timerTrigger", "name": "t"},))], {})


def test_event_grid_schema_handshake_and_delivery(host: FunctionsHost) -> None:
    publisher = EventGridPublisher(webhook(host), schema=EVENT_GRID_SCHEMA)
    publisher.validate()
    events = [event_json("Scheduled", 0), event_json("Started", 10)]
    assert publisher.deliver(events) == [202]
    assert len(publisher.deliveries) == 1  # one request for the array
    got = sorted(eg_app.received, key=lambda e: e.event_time)
    assert all(isinstance(e, func.EventGridEvent) for e in got)
    assert [e.id for e in got] == [e["id"] for e in events]
    assert got[0].event_type == events[0]["eventType"] and got[0].topic == events[0]["topic"]
    assert got[0].get_json() == events[0]["data"]


def test_cloud_events_schema_handshake_and_delivery(host: FunctionsHost) -> None:
    publisher = EventGridPublisher(webhook(host), schema=CLOUD_EVENT_SCHEMA)
    publisher.validate()
    event = event_json("Scheduled", 0, schema=CLOUD_EVENT_SCHEMA)
    assert publisher.deliver([event]) == [202]
    (got,) = eg_app.received
    assert isinstance(got, func.CloudEvent)
    assert got.type == event["type"] and got.source == event["source"]
    assert got.get_json() == event["data"]
    headers = {"Content-Type": "application/cloudevents-batch+json; charset=utf-8"}
    batch = [event_json("Started", 5, schema=CLOUD_EVENT_SCHEMA) for _ in range(3)]
    assert post(webhook(host), batch, **headers).status_code == 202
    assert len(eg_app.received) == 4


def test_the_cloud_events_handshake_echoes_known_origins_only(host: FunctionsHost) -> None:
    def allowed(origin: str | None) -> str:
        headers = {"WebHook-Request-Origin": origin} if origin else {}
        response = requests.options(webhook(host), headers=headers, timeout=10)
        assert response.status_code == 200
        return response.headers["WebHook-Allowed-Origin"]

    assert allowed("eventgrid.azure.us") == "eventgrid.azure.us"
    assert allowed("evil.example") == "eventgrid.azure.net"
    assert allowed(None) == "eventgrid.azure.net"


def test_validation_of_a_single_cloud_event_object(host: FunctionsHost) -> None:
    """The extension also reads the code from one object whose data is a JSON string."""
    body = {"specversion": "1.0", "id": "1", "data": json.dumps({"validationCode": "abc"})}
    response = post(webhook(host), body, "SubscriptionValidation")
    assert response.status_code == 200 and response.json() == {"validationResponse": "abc"}
    assert eg_app.received == []  # a handshake invokes nothing


@pytest.mark.parametrize(
    ("event_type", "status"),
    [(None, 400), ("Something", 400), ("Unsubscribe", 202), ("notification", 202)],
)
def test_the_event_type_header_decides(host: FunctionsHost, event_type: str, status: int) -> None:
    assert post(webhook(host), [event_json()], event_type).status_code == status


def test_an_unknown_function_is_404(host: FunctionsHost) -> None:
    response = post(webhook(host, "nope"), [event_json()])
    assert response.status_code == 404 and "cannot find function: 'nope'" in response.text
    response = post(f"{host.url}/runtime/webhooks/eventgrid", [event_json()])
    assert response.status_code == 404  # no functionName at all


def test_a_failing_invocation_answers_500_and_event_grid_retries(host: FunctionsHost) -> None:
    failing = event_json()
    failing["data"] = {"fail": True}
    publisher = EventGridPublisher(webhook(host), max_attempts=3, retry_delays=(0.05,))
    with pytest.raises(EventGridDeliveryError, match="HTTP 500 after 3 attempt"):
        publisher.deliver([failing, event_json()])
    assert [a.status for a in publisher.deliveries] == [500, 500, 500]
    assert [a.delivery_count for a in publisher.deliveries] == [0, 1, 2]
    # The good event of the batch ran each time: Event Grid resends the whole request.
    assert len(eg_app.received) == 3


@pytest.mark.parametrize("body", [b"{not json", b"17", b'["x"]'])
def test_a_malformed_body_is_an_error_not_a_crash(host: FunctionsHost, body: bytes) -> None:
    response = requests.post(
        webhook(host), data=body, headers={"aeg-event-type": "Notification"}, timeout=10
    )
    assert response.status_code == 500
    assert requests.get(f"{host.url}/", timeout=10).status_code == 200  # still serving


def test_the_publisher_refuses_non_loopback_endpoints() -> None:
    with pytest.raises(ValueError, match="loopback"):
        EventGridPublisher("https://example.com/runtime/webhooks/EventGrid?functionName=x")
