"""The ingestion function inside the real function_app.py: registration, settings, every status.

The function is called as the worker calls it (the event through azure.functions' own
converter); the record goes to the loopback blob fake through the production adapter with a
managed-identity token; Service Bus is a recording publisher (the end-to-end tests use the
emulator).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from emulators.fakes.eventgrid import CLOUD_EVENT_SCHEMA
from emulators.functions_host.eventgrid import to_function_event
from functions.shared.invocations import INVOCATION_PREFIX, LOGGER_NAME
from functions.shared.settings import SettingsError, load_settings
from sebridge.contract.events import parse_message
from sebridge.lifecycle import event_ref
from tests.eventgrid.conftest import STATE_CONTAINER
from tests.eventgrid.support import EVENT_ID, documented_sample, event_json
from tests.functions.support import App
from tests.unit.test_contract import DATA_SCHEMA, FORMATS

REF = event_ref(EVENT_ID)
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ingest_app(make_app: Callable[..., App], state_storage: FakeConditionalBlobStorage) -> App:
    return make_app(
        EVENTGRID_INGEST_ENABLED="true",
        EVENTGRID_STATE_URL=state_storage.container_url(STATE_CONTAINER),
    )


def deliver(app: App, body: dict[str, Any]) -> None:
    app.call("eventgrid_ingest", to_function_event(body, "eventgrid_ingest"))


def test_registered_only_when_enabled(app: App, ingest_app: App) -> None:
    assert "eventgrid_ingest" not in app.functions
    bindings = [json.loads(b) for b in ingest_app.functions["eventgrid_ingest"].get_raw_bindings()]
    assert bindings == [{"direction": "IN", "type": "eventGridTrigger", "name": "event"}]
    assert set(ingest_app.functions) - set(app.functions) == {"eventgrid_ingest"}


def test_the_documented_sample_through_the_function(
    ingest_app: App, state_storage: FakeConditionalBlobStorage
) -> None:
    deliver(ingest_app, documented_sample())
    (envelope,) = ingest_app.publisher.published
    assert envelope.message_id == "3da1b9aa-5204-4335-8c33-c54e315dcffe:Started:1"
    assert envelope.application_properties["vmScaleSetName"] == "myvmss"
    assert envelope.application_properties["resources"] == "myvmss_1,myvmss_2"
    jsonschema.validate(envelope.body["data"], DATA_SCHEMA, format_checker=FORMATS)
    message = parse_message(envelope.body_bytes(), envelope.message_id)
    assert message.observer.vm_name == "myvmss" and message.event is not None
    assert message.source.endswith("/virtualMachineScaleSets/myvmss")
    record = json.loads(
        state_storage.read(STATE_CONTAINER, "3da1b9aa-5204-4335-8c33-c54e315dcffe.json") or b""
    )
    assert record["status"] == "Started" and record["pending"] == []


@pytest.mark.parametrize("schema", ["EventGridSchema", CLOUD_EVENT_SCHEMA])
def test_one_notification_per_status(ingest_app: App, schema: str) -> None:
    for at, status in enumerate(["Scheduled", "Started", "Completed"]):
        deliver(ingest_app, event_json(status, at * 10, schema=schema))
    deliver(ingest_app, event_json("Canceled", 40, schema=schema))  # after the end: nothing
    assert [e.message_id for e in ingest_app.publisher.published] == [
        f"{REF}:Scheduled:1",
        f"{REF}:Started:1",
        f"{REF}:Completed:1",
    ]


def test_canceled_becomes_cancelled(ingest_app: App) -> None:
    deliver(ingest_app, event_json("Scheduled", 0))
    deliver(ingest_app, event_json("Canceled", 10))
    last = ingest_app.publisher.published[-1]
    assert last.subject == "Cancelled" and last.message_id == f"{REF}:Cancelled:1"
    assert last.application_properties["eventStatus"] == "Canceled"  # verbatim, as sent


def test_duplicates_and_late_deliveries_change_nothing(ingest_app: App) -> None:
    scheduled, started, completed = (
        event_json(s, i * 10) for i, s in enumerate(["Scheduled", "Started", "Completed"])
    )
    for body in (scheduled, scheduled, completed, started, scheduled, completed):
        deliver(ingest_app, body)
    assert [e.message_id for e in ingest_app.publisher.published] == [
        f"{REF}:Scheduled:1",
        f"{REF}:Completed:1",
    ]


def test_a_forged_notification_is_logged_as_a_security_event_and_dropped(
    ingest_app: App, caplog: pytest.LogCaptureFixture
) -> None:
    body = event_json()
    body["data"]["resourceInfo"]["id"] = body["data"]["resourceInfo"]["id"].replace(
        "web-1", "web-1/../../x"
    )
    with caplog.at_level(logging.WARNING, logger="sebridge.functions.security"):
        deliver(ingest_app, body)  # returns: no retry can repair it
    assert ingest_app.publisher.published == []
    (record,) = [r for r in caplog.records if r.name == "sebridge.functions.security"]
    assert record.getMessage().startswith("security: Event Grid notification refused")


def test_a_storage_outage_raises_so_event_grid_redelivers(
    ingest_app: App, state_storage: FakeConditionalBlobStorage
) -> None:
    state_storage.fail(503, times=100)
    with pytest.raises(Exception, match="503"):
        deliver(ingest_app, event_json())
    assert ingest_app.publisher.published == []


def test_each_notification_logs_one_invocation_line(
    ingest_app: App, state_storage: FakeConditionalBlobStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """The same structured line as every Service Bus trigger (functions/shared/invocations.py),
    so an event that came through Event Grid can be followed into the workflows: applied,
    duplicate, forged (dropped) and a storage outage (error, raised for Event Grid's retry)."""
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    scheduled = event_json("Scheduled", 0)
    forged = event_json("Started", 10)
    forged["data"]["resourceInfo"]["id"] += "/../../x"
    deliver(ingest_app, scheduled)
    deliver(ingest_app, scheduled)
    deliver(ingest_app, forged)
    state_storage.fail(503, times=100)
    with pytest.raises(Exception, match="503"):
        deliver(ingest_app, event_json("Started", 20))
    found = []
    for record in caplog.records:
        if record.name == LOGGER_NAME:
            text = record.getMessage()
            assert text.startswith(INVOCATION_PREFIX)
            found.append(json.loads(text.removeprefix(INVOCATION_PREFIX)))
    applied, duplicate, dropped, failed = found
    assert {line["function"] for line in found} == {"eventgrid_ingest"}
    assert applied["eventGridId"] == scheduled["id"] and applied["messageId"] is None
    assert (applied["outcome"], applied["verdict"], applied["published"]) == ("ok", "applied", 1)
    assert applied["eventId"] == EVENT_ID.lower() and applied["transition"] == "Scheduled"
    assert applied["vmName"] == "web-1" and applied["eventType"] == "Reboot"
    assert (duplicate["verdict"], duplicate["published"]) == ("duplicate", 0)
    assert duplicate["transition"] is None and duplicate["eventId"] == EVENT_ID.lower()
    assert (dropped["outcome"], dropped["verdict"]) == ("dropped", "invalid")
    assert dropped["eventId"] is None and dropped["eventGridId"] == forged["id"]
    # The error's kind, not its message (no peer's text in the log). The ids are left out of
    # the check: a random Event Grid id once held "503" itself (05035551575d).
    assert failed["outcome"] == "error" and failed["error"] == "TransientHttpError"
    told = {
        key: value
        for key, value in failed.items()
        if key not in ("eventGridId", "traceId", "durationMs")  # ids and a time may hold 503
    }
    assert "503" not in json.dumps(told)


# -- settings -----------------------------------------------------------------------------
BASE = {
    "ServiceBusConnection__fullyQualifiedNamespace": "x.servicebus.windows.net",
    "TopicName": "scheduled-events",
    "TeamsSubscriptionName": "teams",
    "LbPoolsSubscriptionName": "lb-pools",
    "ApprovalGateSubscriptionName": "approval-gate",
    "ApprovalsQueueName": "approvals",
    "TEAMS_WEBHOOK_URL": "https://teams.invalid/x",
    "APPROVAL_SIGNING_KEY": "k" * 40,
    "APPROVAL_BASE_URL": "https://func.example",
    "LB_POOL_STATE_URL": "https://account.blob.core.windows.net/sebridge-pools",
}


def test_the_state_container_defaults_to_the_host_storage_account() -> None:
    settings = load_settings(
        {**BASE, "EVENTGRID_INGEST_ENABLED": "true", "AzureWebJobsStorage__accountName": "st1"}
    )
    assert (
        settings.eventgrid_state_url == "https://st1.blob.core.windows.net/sebridge-eventgrid-state"
    )
    assert load_settings(BASE).eventgrid_ingest_enabled is False


@pytest.mark.parametrize(
    ("extra", "complaint"),
    [
        ({"EVENTGRID_INGEST_ENABLED": "true"}, "EVENTGRID_STATE_URL: required"),
        ({"EVENTGRID_INGEST_ENABLED": "maybe"}, "EVENTGRID_INGEST_ENABLED: not a boolean"),
        (
            {"EVENTGRID_INGEST_ENABLED": "true", "EVENTGRID_STATE_URL": "http://st.example/c"},
            "EVENTGRID_STATE_URL: must use https",
        ),
        ({"AGENTLESS_RESOURCE_GROUPS": "rg-ok,rg bad"}, "AGENTLESS_RESOURCE_GROUPS: 'rg bad'"),
        ({"AGENTLESS_VM_PATTERNS": "web-*,a/b"}, "AGENTLESS_VM_PATTERNS: 'a/b'"),
    ],
)
def test_bad_agentless_settings_are_named(extra: dict[str, str], complaint: str) -> None:
    with pytest.raises(SettingsError, match=complaint.replace("*", r"\*")):
        load_settings({**BASE, **extra})


def test_agentless_settings_are_read() -> None:
    settings = load_settings(
        {**BASE, "AGENTLESS_RESOURCE_GROUPS": "rg-a, rg-b", "AGENTLESS_VM_PATTERNS": "batch-*"}
    )
    assert settings.agentless_resource_groups == ("rg-a", "rg-b")
    assert settings.agentless_vm_patterns == ("batch-*",)
    assert settings.describe()["agentlessVmPatterns"] == ["batch-*"]
