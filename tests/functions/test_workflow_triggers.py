"""The trigger layer (functions/shared/triggers.py): what every Service Bus function gets done
before its own code runs."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from functions.shared import triggers
from sebridge.contract.events import parse_message
from tests.functions.support import App, envelope, web_vm

pytestmark = pytest.mark.timeout(20)


@dataclasses.dataclass(frozen=True)
class Tolerant:
    """A parsed message with the tolerant parser's ``warnings`` (issue 22) beside it."""

    inner: Any
    warnings: tuple[str, ...]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_the_parsers_warnings_are_logged_once_per_invocation(
    app: App,
    arm_fake: FakeArm,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    web_vm(arm_fake, "web-1", [])
    web_vm(arm_fake, "web-2", [])

    def tolerant(body: bytes, message_id: str | None = None) -> Any:
        return Tolerant(parse_message(body, message_id), ("DurationInSeconds 'x' read as unknown",))

    monkeypatch.setattr(triggers, "parse_message", tolerant)
    caplog.set_level(logging.INFO)
    app.deliver("lb_pools", envelope("Scheduled"))
    warned = [r for r in caplog.records if "read as unknown" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "lb_pools" in warned[0].getMessage()


def test_a_refused_message_gets_a_card_marked_unverified(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """No VM exists in ARM: the card still goes out (teams shows everything), says so, and has
    no Approve button; nothing else acts on the message."""
    message = envelope("Scheduled")
    for function in ("teams", "lb_pools", "approval_gate"):
        app.deliver(function, message)
    (card,) = app.teams.cards
    text = str(card)
    assert "Unverified: this message did not pass the scope check" in text
    assert "does not exist" in text and "actions" not in card
    assert not app.arm.writes() and not app.commands.sent and not app.publisher.published
