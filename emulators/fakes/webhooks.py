"""Recording stand-ins for webhook receivers: Slack incoming webhooks, PagerDuty Events API v2
and a generic JSON endpoint, on one loopback server.

Each checks what its real counterpart checks, answers as it does, and keeps what it accepted:

* Slack (``slack_url(token)``): a JSON object with a non-empty ``text`` or ``blocks``; 200
  ``ok``; ``400 invalid_payload`` / ``400 no_text``; ``404 no_service`` for an unknown token.
* PagerDuty (``pagerduty_url``, path ``/v2/enqueue``): ``routing_key`` of 32 characters,
  ``event_action`` trigger/acknowledge/resolve, ``dedup_key`` (at most 255) required except
  for trigger, a trigger's ``payload`` with ``summary`` (at most 1,024), ``source`` and a known
  ``severity``; ``202 {"status": "success", "dedup_key": ...}`` or ``400 {"status": "invalid
  event", "errors": [...]}``. :attr:`alerts` holds each dedup key's state (triggered or
  resolved), as PagerDuty would fold the events into one alert.
* generic (``generic_url(name)``): any JSON; 200.

Fault injection: ``fail(kind, status, times, retry_after, location)`` makes the next ``times``
requests of that kind (``slack``, ``pagerduty``, ``generic``) answer ``status`` (with a
Retry-After or a Location header).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from emulators.fakes._server import LoopbackServer, Reply, Request

SLACK_PREFIX = "/services/T0SEBRIDGE/B0SEBRIDGE/"
PAGERDUTY_PATH = "/v2/enqueue"
GENERIC_PREFIX = "/generic/"
SLACK, PAGERDUTY, GENERIC = "slack", "pagerduty", "generic"
SEVERITIES = {"critical", "error", "warning", "info"}
ACTIONS = {"trigger", "acknowledge", "resolve"}


@dataclass
class Accepted:
    kind: str
    path: str
    body: Any
    headers: dict[str, str]


class FakeWebhooks(LoopbackServer):
    def __init__(self, *, slack_tokens: tuple[str, ...] = ("fake-slack-token-0001",)) -> None:
        super().__init__()
        self.slack_tokens = list(slack_tokens)
        self.accepted: list[Accepted] = []
        self.alerts: dict[str, str] = {}  # dedup_key -> "triggered" | "acknowledged" | "resolved"
        self._faults: dict[str, deque[tuple[int, dict[str, str]]]] = {
            SLACK: deque(),
            PAGERDUTY: deque(),
            GENERIC: deque(),
        }

    # --- where to send -------------------------------------------------------------------

    def slack_url(self, token: str | None = None) -> str:
        """A Slack webhook URL (its last segment is the secret); the first known token."""
        return f"{self.url}{SLACK_PREFIX}{token or self.slack_tokens[0]}"

    @property
    def pagerduty_url(self) -> str:
        return f"{self.url}{PAGERDUTY_PATH}"

    def generic_url(self, name: str = "hook") -> str:
        return f"{self.url}{GENERIC_PREFIX}{name}"

    # --- what arrived --------------------------------------------------------------------

    def bodies(self, kind: str) -> list[Any]:
        with self.lock:
            return [a.body for a in self.accepted if a.kind == kind]

    def fail(
        self,
        kind: str,
        status: int,
        times: int = 1,
        retry_after: str | None = None,
        location: str | None = None,
    ) -> None:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        if location is not None:
            headers["Location"] = location
        with self.lock:
            self._faults[kind].extend([(status, headers)] * times)

    # --- the receivers ---------------------------------------------------------------------

    def handle(self, request: Request) -> Reply:
        kind = self._kind(request.path)
        if kind is None or request.method != "POST":
            return Reply(404, "no_service")
        if self._faults[kind]:
            status, headers = self._faults[kind].popleft()
            return Reply(status, {"status": "injected", "code": status}, dict(headers))
        try:
            body = json.loads(request.body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = _INVALID
        if kind == SLACK:
            return self._slack(request, body)
        if kind == PAGERDUTY:
            return self._pagerduty(request, body)
        if body is _INVALID:
            return Reply(400, {"error": "not JSON"})
        self.accepted.append(Accepted(GENERIC, request.path, body, request.headers))
        return Reply(200, {"received": True})

    def _kind(self, path: str) -> str | None:
        if path.startswith(SLACK_PREFIX):
            return SLACK
        if path == PAGERDUTY_PATH:
            return PAGERDUTY
        if path.startswith(GENERIC_PREFIX) and len(path) > len(GENERIC_PREFIX):
            return GENERIC
        return None

    def _slack(self, request: Request, body: Any) -> Reply:
        if request.path.removeprefix(SLACK_PREFIX) not in self.slack_tokens:
            return Reply(404, "no_service")
        if not isinstance(body, dict):
            return Reply(400, "invalid_payload")
        text, blocks = body.get("text"), body.get("blocks")
        if not (isinstance(text, str) and text.strip()) and not (
            isinstance(blocks, list) and blocks
        ):
            return Reply(400, "no_text")
        self.accepted.append(Accepted(SLACK, request.path, body, request.headers))
        return Reply(200, "ok")

    def _pagerduty(self, request: Request, body: Any) -> Reply:
        errors = pagerduty_errors(body)
        if errors:
            return Reply(
                400,
                {"status": "invalid event", "message": "Event object is invalid", "errors": errors},
            )
        key = body.get("dedup_key") or f"generated-{len(self.accepted)}"
        self.accepted.append(Accepted(PAGERDUTY, request.path, body, request.headers))
        action = body["event_action"]
        state = self.alerts.get(key)
        if action == "trigger":
            self.alerts[key] = "triggered" if state != "acknowledged" else state
        elif state in ("triggered", "acknowledged"):  # resolving an unknown key changes nothing
            self.alerts[key] = "resolved" if action == "resolve" else "acknowledged"
        return Reply(202, {"status": "success", "message": "Event processed", "dedup_key": key})


_INVALID = object()


def pagerduty_errors(body: Any) -> list[str]:
    """What the Events API v2 would refuse in ``body`` (empty: it would take it)."""
    if not isinstance(body, dict):
        return ["Event object format is unrecognized"]
    errors = []
    key = body.get("routing_key")
    if not isinstance(key, str) or len(key) != 32:
        errors.append("Length of 'routing_key' is incorrect (should be 32 characters)")
    action = body.get("event_action")
    if action not in ACTIONS:
        errors.append("'event_action' is invalid (must be one of trigger, acknowledge, resolve)")
    dedup = body.get("dedup_key")
    if dedup is not None and (not isinstance(dedup, str) or not 0 < len(dedup) <= 255):
        errors.append("'dedup_key' must be a string of at most 255 characters")
    if action in ("acknowledge", "resolve") and dedup is None:
        errors.append("'dedup_key' is required for acknowledge and resolve")
    if action == "trigger":
        payload = body.get("payload")
        if not isinstance(payload, dict):
            errors.append("'payload' is missing")
        else:
            summary = payload.get("summary")
            if not isinstance(summary, str) or not summary or len(summary) > 1024:
                errors.append("'payload.summary' is missing or longer than 1024 characters")
            if not isinstance(payload.get("source"), str) or not payload["source"]:
                errors.append("'payload.source' is missing")
            if payload.get("severity") not in SEVERITIES:
                errors.append("'payload.severity' is invalid")
    return errors
