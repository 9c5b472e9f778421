"""A recording Teams Workflows webhook: answers 202 Accepted, keeps every card.

Fault injection: ``fail(status, times, retry_after=None)`` makes the next ``times`` posts
answer ``status`` (429 with Retry-After, or a 5xx). ``card_lines`` renders a card as text for
the demo.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from emulators.fakes._server import LoopbackServer, Reply, Request

# What Teams Workflows takes: a message with one Adaptive Card attachment.
ATTACHMENT_TYPE = "application/vnd.microsoft.card.adaptive"
# The bridge's cards put each fact in a RichTextBlock whose id starts so (functions/teams/cards.py).
FACT_PREFIX = "fact-"
WEBHOOK_PATH = "/workflows/sebridge/triggers/manual/paths/invoke"


class FakeTeams(LoopbackServer):
    def __init__(self, *, print_cards: bool = False) -> None:
        super().__init__()
        self.cards: list[dict[str, Any]] = []
        self.print_cards = print_cards
        self._faults: deque[tuple[int, str | None]] = deque()

    @property
    def webhook_url(self) -> str:
        # Like a real Workflows URL, it carries a signature in the query: the code must not log it.
        return f"{self.url}{WEBHOOK_PATH}?api-version=2016-06-01&sig=fake-secret-signature"

    def fail(self, status: int, times: int = 1, retry_after: str | None = None) -> None:
        with self.lock:
            self._faults.extend([(status, retry_after)] * times)

    def handle(self, request: Request) -> Reply:
        if request.method != "POST" or request.path != WEBHOOK_PATH:
            return Reply(404, {"error": {"code": "NotFound"}})
        if self._faults:
            status, retry_after = self._faults.popleft()
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return Reply(status, {"error": {"code": "Injected", "status": status}}, headers)
        try:
            payload = request.json()
            attachment = payload["attachments"][0]
            if payload.get("type") != "message" or attachment["contentType"] != ATTACHMENT_TYPE:
                raise ValueError("not an Adaptive Card message")
            card = attachment["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return Reply(400, {"error": {"code": "InvalidRequest", "message": str(exc)}})
        self.cards.append(card)
        if self.print_cards:
            print("[teams] " + "\n[teams] ".join(card_lines(card)), flush=True)
        return Reply(202, b"")


def card_lines(card: dict[str, Any]) -> list[str]:
    """A card as readable lines (for the demo and for logs): title, facts, text, buttons."""
    lines: list[str] = []

    def walk(items: list[Any]) -> None:
        for item in items:
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "TextBlock":
                lines.append(str(item.get("text", "")))
            elif kind == "RichTextBlock":
                text = "".join(
                    i if isinstance(i, str) else str(i.get("text", ""))
                    for i in item.get("inlines", [])
                    if isinstance(i, str | dict)
                )
                lines.append(
                    ("  " if str(item.get("id", "")).startswith(FACT_PREFIX) else "") + text
                )
            elif kind == "FactSet":
                lines.extend(f"  {f.get('title')}: {f.get('value')}" for f in item.get("facts", []))
            elif kind == "Container":
                walk(item.get("items", []))

    walk(card.get("body", []))
    for action in card.get("actions", []):
        # The URL carries a signed token: show that there is a button, not the credential.
        lines.append(f"  [{action.get('title')}] ({action.get('type')})")
    return lines
