"""The example subscriber: registered on demand, bound to its own subscription, tested alike."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from functions.custom_example import summary
from sebridge.contract.events import parse_message
from tests.functions.support import App, envelope

pytestmark = pytest.mark.timeout(20)


def test_summary_is_one_line_about_the_event() -> None:
    message = parse_message(envelope("Scheduled", EventType="Preempt").body_bytes())
    assert summary(message) == "Preempt scheduled for web-1, web-2 at 2026-11-22T01:35:00+00:00"


def test_the_function_logs_the_summary(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(CUSTOM_SUBSCRIBER_ENABLED="true", CustomSubscriptionName="vm-loss")
    app.deliver("custom_example", envelope("Scheduled", EventType="Terminate"))
    assert "VM loss ahead: Terminate scheduled for web-1, web-2" in caplog.text
    assert not app.teams.requests and not app.arm.requests  # it touches nothing else
