"""Posting cards to a Teams Workflows webhook (requests)."""

from __future__ import annotations

import logging
from typing import Any

import requests

from functions.adapters.retry import RetryPolicy, redact_urllib3_logs, send
from functions.adapters.sessions import Session
from functions.teams.cards import teams_payload

log = logging.getLogger("sebridge.functions.teams")


class TeamsRejected(Exception):
    """Teams answered with a permanent error (4xx other than 429)."""


class TeamsWebhookPoster:
    def __init__(
        self, url: str, *, session: requests.Session | None = None, policy: RetryPolicy
    ) -> None:
        self._url = url  # a secret: its query string carries the workflow's signature
        self._session = session or Session()
        self._policy = policy
        redact_urllib3_logs()

    def __repr__(self) -> str:
        return "TeamsWebhookPoster(url=<secret>)"

    def post(self, card: dict[str, Any]) -> None:
        response = send(
            self._session,
            "POST",
            self._url,
            policy=self._policy,
            what="Teams webhook",
            json=teams_payload(card),
        )
        if response.status_code >= 400:
            # The body may echo the request; keep the log to the status.
            raise TeamsRejected(f"Teams webhook answered HTTP {response.status_code}")


class TeamsOff:
    """Teams is not configured (no TEAMS_WEBHOOK_URL, another notifier is): the teams function
    is not registered, so nothing posts here; anything that tried would fail loudly rather than
    drop a card."""

    def post(self, card: dict[str, Any]) -> None:
        raise RuntimeError("Teams is off: TEAMS_WEBHOOK_URL is not set")
