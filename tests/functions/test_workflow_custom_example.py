"""The example subscriber: registered on demand, bound to its own subscription, tested alike."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from emulators.fakes.arm import FakeArm
from functions.custom_example import summary
from sebridge.contract.events import parse_message
from tests.functions.support import App, envelope, web_vm

pytestmark = pytest.mark.timeout(20)


def test_summary_is_one_line_about_the_event() -> None:
    message = parse_message(envelope("Scheduled", EventType="Preempt").body_bytes())
    assert summary(message) == "Preempt scheduled for web-1, web-2 at 2026-11-22T01:35:00+00:00"


def test_the_function_logs_the_summary(
    make_app: Callable[..., App], arm_fake: FakeArm, caplog: pytest.LogCaptureFixture
) -> None:
    web_vm(arm_fake, "web-1", [])
    web_vm(arm_fake, "web-2", [])
    app = make_app(CUSTOM_SUBSCRIBER_ENABLED="true", CustomSubscriptionName="vm-loss")
    app.deliver("custom_example", envelope("Scheduled", EventType="Terminate"))
    assert "VM loss ahead: Terminate scheduled for web-1, web-2" in caplog.text
    assert not app.teams.requests
    # It touches nothing else: ARM saw only the scope check's reads of the two VMs.
    assert {(r.method, r.path.rsplit("/", 1)[-1]) for r in app.arm.requests} == {
        ("GET", "web-1"),
        ("GET", "web-2"),
    }


def test_a_message_that_fails_the_scope_check_never_reaches_it(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    """No VM exists in ARM: the trigger layer refuses the message (a security event) and the
    subscriber's own code never runs."""
    app = make_app(CUSTOM_SUBSCRIBER_ENABLED="true", CustomSubscriptionName="vm-loss")
    app.deliver("custom_example", envelope("Scheduled", EventType="Terminate"))
    assert "VM loss ahead" not in caplog.text
    assert any(getattr(r, "securityEvent", False) for r in caplog.records)
