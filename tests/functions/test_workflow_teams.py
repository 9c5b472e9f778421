"""teams: through the function object, posting to the recording Teams fake over real HTTP."""

from __future__ import annotations

import json
import logging
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from emulators.fakes.arm import FakeArm
from functions.adapters.retry import TransientHttpError
from functions.approval_gate import tokens
from tests.fixtures import golden
from tests.functions.support import (
    EVENT_ID,
    NOW,
    SIGNING_KEY,
    App,
    envelope,
    sb_message,
    web_vm,
)
from tests.functions.test_workflow_cards import assert_valid

MANUAL_POLICY = json.dumps({"rules": [], "default": "manual"})


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "name", ["scheduled", "updated", "started", "completed", "cancelled", "approved", "prepared"]
)
def test_one_valid_card_per_transition(app: App, name: str) -> None:
    app.deliver("teams", golden.build()[name])
    assert len(app.teams.cards) == 1
    card = app.teams.cards[0]
    assert_valid(card)
    assert "actions" not in card  # the default policy never waits for a human on a Reboot
    request = app.teams.requests[-1]
    assert request.headers["content-type"].startswith("application/json")


@pytest.mark.timeout(20)
def test_a_vms_measured_report_posts_no_card(app: App) -> None:
    """Every VM of a set sends its Measured (issue 26); the event's Completed had its card."""
    app.deliver("teams", golden.build()["completed"])
    app.deliver("teams", golden.build()["measured"])
    assert len(app.teams.cards) == 1


@pytest.fixture
def world(arm_fake: FakeArm) -> None:
    web_vm(arm_fake, "web-1", [])
    web_vm(arm_fake, "web-2", [])


@pytest.mark.timeout(20)
def test_a_manual_decision_adds_a_signed_approve_link(make_app, world) -> None:  # type: ignore[no-untyped-def]
    app = make_app(APPROVAL_POLICY=MANUAL_POLICY)
    app.deliver("teams", golden.build()["scheduled"])
    (card,) = app.teams.cards
    assert_valid(card)
    (action,) = card["actions"]
    assert action["type"] == "Action.OpenUrl" and action["title"] == "Approve"
    url = urlsplit(action["url"])
    assert (url.scheme, url.netloc, url.path) == ("http", "127.0.0.1:7071", "/api/approve")
    claims = tokens.verify(SIGNING_KEY.encode(), parse_qs(url.query)["token"][0], NOW)
    assert claims.event_id == EVENT_ID and claims.vm_name == "web-1"
    assert claims.expires_at.isoformat() == "2026-11-22T01:35:00+00:00"  # = NotBefore


@pytest.mark.timeout(20)
def test_no_link_once_started_or_past_not_before(make_app) -> None:  # type: ignore[no-untyped-def]
    app = make_app(APPROVAL_POLICY=MANUAL_POLICY)
    app.deliver("teams", golden.build()["started"])
    app.clock.now = NOW.replace(hour=2)  # after NotBefore
    app.deliver("teams", golden.build()["scheduled"])
    assert [("actions" in c) for c in app.teams.cards] == [False, False]


@pytest.mark.timeout(20)
def test_429_with_retry_after_is_honoured(app: App) -> None:
    app.teams.fail(429, times=2, retry_after="1")
    started = time.monotonic()
    app.deliver("teams", envelope("Scheduled"))
    elapsed = time.monotonic() - started
    assert len(app.teams.cards) == 1
    assert len(app.teams.requests) == 3
    assert elapsed >= 1.9  # two waits of Retry-After: 1


@pytest.mark.timeout(20)
def test_persistent_5xx_raises_so_service_bus_redelivers(app: App) -> None:
    app.teams.fail(503, times=5, retry_after="0")
    with pytest.raises(TransientHttpError, match="Teams webhook: HTTP 503 after 3"):
        app.deliver("teams", envelope("Scheduled"))
    assert len(app.teams.requests) == 3 and not app.teams.cards
    app.deliver("teams", envelope("Scheduled"))  # the redelivery: 2 more faults, then 202
    assert len(app.teams.requests) == 6 and len(app.teams.cards) == 1


@pytest.mark.timeout(20)
def test_the_webhook_url_never_reaches_the_logs(app: App, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    app.teams.fail(500, times=1, retry_after="0")
    app.deliver("teams", envelope("Scheduled"))
    assert app.teams.cards
    assert "fake-secret-signature" not in caplog.text


@pytest.mark.timeout(20)
def test_a_message_that_breaks_the_contract_is_logged_and_completed(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    message = sb_message(envelope("Scheduled"), body=b'{"specversion": "1.0"}')
    app.call("teams", message)  # no exception: completing it is the decision (see triggers.py)
    assert not app.teams.requests
    assert "breaks contract v1" in caplog.text and "body is not a CloudEvent" in caplog.text


@pytest.mark.timeout(20)
def test_a_long_retry_after_gives_the_message_back_at_once(app: App) -> None:
    app.teams.fail(429, times=1, retry_after="120")
    started = time.monotonic()
    with pytest.raises(TransientHttpError, match="Retry-After 120 s"):
        app.deliver("teams", envelope("Scheduled"))
    assert time.monotonic() - started < 2 and len(app.teams.requests) == 1


@pytest.mark.timeout(20)
def test_an_agentless_vm_gets_a_link_that_approves_through_arm(  # type: ignore[no-untyped-def]
    make_app, world, arm_fake: FakeArm
) -> None:
    """web-1 runs no forwarder (AGENTLESS_RESOURCE_GROUPS): the card's link carries the ARM id
    the gate would acknowledge on, and following it acknowledges there; no command is sent."""
    from functions.approval_gate import link

    app = make_app(APPROVAL_POLICY=MANUAL_POLICY, AGENTLESS_RESOURCE_GROUPS="rg-web")
    app.deliver("teams", golden.build()["scheduled"])
    (card,) = app.teams.cards
    (action,) = card["actions"]
    token = parse_qs(urlsplit(action["url"]).query)["token"][0]
    claims = tokens.verify(SIGNING_KEY.encode(), token, NOW)
    web_1 = arm_fake.resources[
        f"/subscriptions/{golden.SUBSCRIPTION}/resourcegroups/rg-web/providers/"
        "microsoft.compute/virtualmachines/web-1"
    ]["id"]
    assert claims.acknowledge_on == web_1 and claims.vm_name == "web-1"
    from functions.shared import composition

    page = link.approve(
        SIGNING_KEY.encode(), token, EVENT_ID, NOW, app.commands, composition.dependencies().arm
    )
    assert page.status == 200
    assert arm_fake.acknowledged == [(web_1, EVENT_ID)] and not app.commands.sent


def test_acknowledge_tokens_are_signed_over_their_arm_id() -> None:
    key = SIGNING_KEY.encode()
    target = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/v"
    claims = tokens.ApprovalClaims(EVENT_ID, "v", NOW.replace(year=2030), acknowledge_on=target)
    token = tokens.sign(key, claims)
    assert tokens.verify(key, token, NOW) == claims
    plain = tokens.sign(key, tokens.ApprovalClaims(EVENT_ID, "v", NOW.replace(year=2030)))
    assert tokens.verify(key, plain, NOW).acknowledge_on == ""
    # Another target under the same MAC is a forgery: the payload is what is signed.
    payload, mac = token.split(".")
    other = tokens.sign(key, tokens.ApprovalClaims(EVENT_ID, "v", claims.expires_at, target + "x"))
    with pytest.raises(tokens.TokenError):
        tokens.verify(key, f"{other.split('.')[0]}.{mac}", NOW)
    assert payload != other.split(".")[0]
