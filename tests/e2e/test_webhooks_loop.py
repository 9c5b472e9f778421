"""webhooks end to end: a real `sebridge functions-host` process runs function_app.py against
the Service Bus emulator (the project's Config.json, webhooks subscription included); Slack and
PagerDuty are the recording loopback receivers of emulators/fakes/webhooks.py.

A Scheduled and then a Completed message on the topic must give two Slack messages and one
PagerDuty alert triggered and resolved under one dedup key, and the host's log must carry one
invocation line per message for the webhooks function (lb-pools' Prepared for the event reaches
the function too, and both endpoints' filters let it pass by).
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.teams import FakeTeams
from emulators.fakes.webhooks import PAGERDUTY, SLACK, FakeWebhooks
from emulators.processes import server
from emulators.servicebus.testing import running_emulator
from functions.shared.invocations import INVOCATION_PREFIX
from sebridge.contract.events import Transition, event_message
from sebridge.imds import Document
from sebridge.servicebus import envelope_message as to_service_bus_message
from tests.fixtures import golden
from tests.functions.support import pagerduty_dedup_key, web_vm
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

REPO = Path(__file__).resolve().parents[2]
ROUTING_KEY = "E2eRoutingKey0000000000000000000"
SLACK_TOKEN = "e2e-slack-token-0042"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    hooks = FakeWebhooks(slack_tokens=(SLACK_TOKEN,))
    teams, arm, identity = FakeTeams(), FakeArm(), FakeIdentity()
    fakes = (hooks, teams, arm, identity)
    for fake in fakes:
        fake.start()
    # The golden observer and web-2 exist: the messages pass the scope check at the trigger.
    web_vm(arm, "web-1", [])
    web_vm(arm, "web-2", [])
    endpoints = [
        # Not Prepared: lb-pools publishes it at a time this test does not control.
        {
            "name": "ops-slack",
            "preset": "slack",
            "urlSetting": "WEBHOOK_SLACK_URL",
            "transitions": ["Scheduled", "Started", "Completed", "Cancelled"],
        },
        {
            "name": "oncall",
            "preset": "pagerduty",
            "urlSetting": "WEBHOOK_PD_URL",
            "routingKeySetting": "WEBHOOK_PD_ROUTING_KEY",
        },
    ]
    try:
        with running_emulator(REPO / "infra" / "servicebus-emulator" / "Config.json") as bus:
            settings = tmp_path_factory.mktemp("host") / "local.settings.json"
            settings.write_text(
                json.dumps(
                    {
                        "IsEncrypted": False,
                        "Values": {
                            "ServiceBusConnection": bus.connection_string,
                            "TopicName": "scheduled-events",
                            "TeamsSubscriptionName": "teams",
                            "LbPoolsSubscriptionName": "lb-pools",
                            "ApprovalGateSubscriptionName": "approval-gate",
                            "WebhooksSubscriptionName": "webhooks",
                            "ApprovalsQueueName": "approvals",
                            "TEAMS_WEBHOOK_URL": teams.webhook_url,
                            "APPROVAL_SIGNING_KEY": secrets.token_urlsafe(32),
                            "APPROVAL_BASE_URL": "http://127.0.0.1:9",
                            "ARM_ENDPOINT": arm.url,
                            "LB_MIN_HEALTHY": "0",  # the capacity guard is not tested here
                            "WEBHOOKS": json.dumps(endpoints),
                            "WEBHOOK_SLACK_URL": hooks.slack_url(SLACK_TOKEN),
                            "WEBHOOK_PD_URL": hooks.pagerduty_url,
                            "WEBHOOK_PD_ROUTING_KEY": ROUTING_KEY,
                            **identity.environ(),
                        },
                    }
                )
            )
            host, _ = server(
                "functions-host",
                "--app",
                str(REPO / "function_app.py"),
                "--settings",
                str(settings),
            )
            try:
                yield {"bus": bus, "hooks": hooks, "host": host}
            finally:
                host.close()
    finally:
        for fake in fakes:
            fake.stop()


def publish(bus: Any, transition: Transition, fields: dict[str, Any], incarnation: int) -> str:
    (event,) = Document.from_imds({"DocumentIncarnation": incarnation, "Events": [fields]}).events
    envelope = event_message(transition, event, golden.OBSERVER, incarnation, datetime.now(UTC))
    with (
        ServiceBusClient.from_connection_string(bus.connection_string) as client,
        client.get_topic_sender("scheduled-events") as sender,
    ):
        sender.send_messages(to_service_bus_message(envelope), timeout=10)
    return envelope.message_id


def invocation_lines(host: Any, function: str) -> list[dict[str, Any]]:
    found = []
    for line in host.stderr_text().splitlines():
        if INVOCATION_PREFIX in line:
            text = line.split(INVOCATION_PREFIX, 1)[1]
            fields = json.loads(text[: text.rindex("}") + 1])
            if fields["function"] == function:
                found.append(fields)
    return found


@pytest.mark.timeout(180)
def test_slack_and_pagerduty_through_the_functions_host(world: dict[str, Any]) -> None:
    bus, hooks, host = world["bus"], world["hooks"], world["host"]
    event_id = str(uuid.uuid4())
    not_before = datetime.now(UTC) + timedelta(minutes=10)
    scheduled = dict(
        golden.SCHEDULED,
        EventId=event_id,
        NotBefore=not_before.strftime("%a, %d %b %Y %H:%M:%S GMT"),
    )
    started = dict(scheduled, EventStatus="Started", NotBefore="")
    first = publish(bus, Transition.SCHEDULED, scheduled, 21)
    wait_until(lambda: len(hooks.bodies(PAGERDUTY)) >= 1, 60, "the PagerDuty trigger")
    last = publish(bus, Transition.COMPLETED, started, 22)
    wait_until(lambda: len(hooks.bodies(PAGERDUTY)) >= 2, 60, "the PagerDuty resolve")
    wait_until(lambda: len(hooks.bodies(SLACK)) >= 2, 60, "two Slack messages")

    key = pagerduty_dedup_key(event_id)
    assert [(b["event_action"], b["dedup_key"]) for b in hooks.bodies(PAGERDUTY)] == [
        ("trigger", key),
        ("resolve", key),
    ]
    assert hooks.alerts == {key: "resolved"}
    texts = [b["text"].split("\n")[0] for b in hooks.bodies(SLACK)]
    assert texts == ["*Reboot Scheduled*: web-1, web-2", "*Reboot Completed*: web-1, web-2"]

    def lines_of_ours() -> list[dict[str, Any]]:
        return [f for f in invocation_lines(host, "webhooks") if f["messageId"] in (first, last)]

    wait_until(lambda: len(lines_of_ours()) >= 2, 30, "invocation lines")
    lines = lines_of_ours()
    assert [(f["messageId"], f["outcome"], f["posted"]) for f in lines] == [
        (first, "ok", 2),
        (last, "ok", 2),
    ]
    assert {f["eventId"] for f in lines} == {event_id}
    for secret in (SLACK_TOKEN, ROUTING_KEY):
        assert secret not in host.stderr_text()
