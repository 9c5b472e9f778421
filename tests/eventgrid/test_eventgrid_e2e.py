"""Agentless mode end to end, through the Service Bus emulator.

A `sebridge functions-host` process runs the real function_app.py with only the ingestion
function enabled (the workflow subscriptions stay unread, so each can be counted); the fake
Event Grid delivers to its webhook; the per-event record lives in the blob fake behind a
managed-identity token. With a real `sebridge forwarder` watching the same simulated event,
every subscription of the topic must hold exactly one message per transition.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from emulators.demo.sources import PlatformEventGrid, one_message_per_transition, webhook_url
from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from emulators.fakes.eventgrid import EventGridPublisher
from emulators.fakes.identity import FakeIdentity
from emulators.imds.testing import expected_transitions, running_simulator
from emulators.processes import forwarder, server
from emulators.servicebus.testing import running_emulator
from sebridge.contract.events import parse_message
from tests.eventgrid.conftest import STATE_CONTAINER
from tests.eventgrid.support import RG, SUB, documented_sample
from tests.support.bus import receive_all
from tests.support.waiting import wait_until
from tests.unit.test_contract import DATA_SCHEMA, FORMATS

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

REPO = Path(__file__).resolve().parents[2]
SUBSCRIPTIONS = ("audit", "teams", "lb-pools", "approval-gate")
# Which transitions each subscription's SQL filter admits (infra/servicebus-emulator/Config.json).
ADMITS = {
    "audit": {"Scheduled", "Updated", "Started", "Completed", "Cancelled"},
    "teams": {"Scheduled", "Updated", "Started", "Completed", "Cancelled"},
    "lb-pools": {"Scheduled", "Updated", "Started", "Completed", "Cancelled"},
    "approval-gate": {"Scheduled", "Updated"},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    storage, identity = FakeConditionalBlobStorage(), FakeIdentity()
    for fake in (storage, identity):
        fake.start()
    try:
        with running_emulator(REPO / "infra" / "servicebus-emulator" / "Config.json") as bus:
            settings = {
                "ServiceBusConnection": bus.connection_string,
                "TopicName": "scheduled-events",
                "TeamsSubscriptionName": "teams",
                "LbPoolsSubscriptionName": "lb-pools",
                "ApprovalGateSubscriptionName": "approval-gate",
                "ApprovalsQueueName": "approvals",
                "TEAMS_WEBHOOK_URL": "http://127.0.0.1:9/teams",
                "APPROVAL_SIGNING_KEY": secrets.token_urlsafe(32),
                "APPROVAL_BASE_URL": "http://127.0.0.1:9",
                "ARM_ENDPOINT": "http://127.0.0.1:9",
                "EVENTGRID_INGEST_ENABLED": "true",
                "EVENTGRID_STATE_URL": storage.container_url(STATE_CONTAINER),
                "LB_MIN_HEALTHY": "0",  # only the ingestion runs here
                **identity.environ(),
            }
            path = tmp_path_factory.mktemp("host") / "local.settings.json"
            path.write_text(json.dumps({"IsEncrypted": False, "Values": settings}))
            host, url = server(
                "functions-host",
                "--app",
                str(REPO / "function_app.py"),
                "--settings",
                str(path),
                "--functions",
                "eventgrid_ingest",
            )
            try:
                yield {"bus": bus, "host_url": url, "host": host, "storage": storage}
            finally:
                host.close()
    finally:
        for fake in (storage, identity):
            fake.stop()


def event_grid_published(storage: FakeConditionalBlobStorage) -> list[str]:
    ids = []
    for request in list(storage.requests):
        if request.method == "PUT" and request.path.endswith(".json"):
            ids += [p["message_id"] for p in json.loads(request.body).get("pending", [])]
    for body, _etag in storage.blobs.get(STATE_CONTAINER, {}).values():
        assert json.loads(body)["pending"] == []
    return ids


def drain(bus: Any, subscription: str, want: int, timeout: float = 30) -> list[dict[str, Any]]:
    return receive_all(bus.connection_string, subscription, want=want, timeout=timeout)


@pytest.mark.timeout(120)
def test_the_documented_sample_reaches_the_topic_once(world: dict[str, Any]) -> None:
    publisher = EventGridPublisher(webhook_url(world["host_url"]))
    publisher.validate()
    sample = documented_sample()
    assert publisher.deliver([sample]) == [202]
    assert publisher.deliver([sample]) == [202]  # Event Grid's double notification
    (message,) = drain(world["bus"], "audit", want=1)
    assert message["message_id"] == "3da1b9aa-5204-4335-8c33-c54e315dcffe:Started:1"
    assert message["session_id"] == "3da1b9aa-5204-4335-8c33-c54e315dcffe"
    assert message["subject"] == "Started"
    assert message["properties"]["vmScaleSetName"] == "myvmss"
    body = json.loads(message["body"])
    jsonschema.validate(body["data"], DATA_SCHEMA, format_checker=FORMATS)
    assert body["source"].endswith("/virtualMachineScaleSets/myvmss")
    for subscription in ("teams", "lb-pools"):
        assert len(drain(world["bus"], subscription, want=1)) == 1


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", ["multiple-events", "canceled-maintenance"])
def test_forwarder_and_event_grid_together_one_message_per_transition(
    world: dict[str, Any], scenario: str, tmp_path: Path
) -> None:
    """The same events observed by a forwarder (IMDS, 0.2 s polls) and published by Event Grid
    (every state, each delivered twice): one message per transition on every subscription."""
    expected = Counter((e["eventId"], e["transition"]) for e in expected_transitions(scenario))
    bus, storage = world["bus"], world["storage"]
    speed = 4.0
    with running_simulator(scenario, speed=speed, extra_args=["--start-on-first-poll"]) as sim:
        publisher = EventGridPublisher(webhook_url(world["host_url"]))
        publisher.validate()
        platform = PlatformEventGrid(
            sim, publisher, subscription=SUB, group=RG, vm_name="web-1", duplicates=True
        )
        platform.start()
        fw = forwarder(
            sim.base_url,
            tmp_path / "state",
            "--connection-string",
            bus.connection_string,
            dry_run=False,
        )
        try:
            with fw:
                wait_until(lambda: sim.state()["finished"], 90, "the scenario's end")
                wait_until(
                    lambda: len(platform.delivered) >= sum(expected.values()),
                    30,
                    "Event Grid's notifications",
                )
                audit = drain(bus, "audit", want=sum(expected.values()), timeout=40)
        finally:
            platform.stop()
    assert not platform.failures, (platform.failures, world["host"].stderr_text()[-3000:])

    def transitions(messages: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        for m in messages:
            parsed = parse_message(m["body"], m["message_id"])
            if parsed.event is not None and not parsed.transition.is_report:
                out[(parsed.event.key, parsed.transition.value)] += 1
        return out

    assert transitions(audit) == expected
    # The forwarder's Measured (its own report of an ended event, issue 26) is no transition:
    # at most one per event appearance from this one VM, and only from the forwarder.
    reports = Counter(m["message_id"] for m in audit if m["subject"] == "Measured")
    assert all(n == 1 for n in reports.values()), reports
    audit = [m for m in audit if m["subject"] != "Measured"]
    # Both sources published: Event Grid's ids are the forwarder's (else there would be more).
    # The ingestion clears a record's pending envelopes only after publishing them, so every id
    # written as pending into a record that is now clear went out from the Event Grid side.
    assert set(event_grid_published(storage)) >= {
        m["message_id"] for m in audit if m["subject"] != "Heartbeat"
    }
    assert not one_message_per_transition(
        [
            {
                "event": parse_message(m["body"]).event,
                "transition": m["subject"],
                "message_id": m["message_id"],
            }
            for m in audit
            if m["subject"] != "Heartbeat"
        ]
    )
    for subscription in SUBSCRIPTIONS[1:]:
        want = Counter({k: n for k, n in expected.items() if k[1] in ADMITS[subscription]})
        got = transitions(drain(bus, subscription, want=sum(want.values()), timeout=40))
        assert got == want, subscription
