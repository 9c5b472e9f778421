"""What the webhooks core needs from outside: one POST per endpoint (the adapter retries)."""

from __future__ import annotations

from typing import Any, Protocol


class WebhookRejected(Exception):
    """The endpoint answered with a permanent error (a 4xx other than 429, or a redirect):
    no retry can change that answer."""

    def __init__(self, endpoint: str, status: int) -> None:
        self.endpoint = endpoint
        self.status = status
        super().__init__(f"webhook {endpoint} answered HTTP {status}")


class WebhookPoster(Protocol):
    def post(self, endpoint: str, url: str, body: Any) -> None:
        """POST ``body`` as JSON to ``url`` (a secret: never logged).

        Returns once the endpoint took it (2xx). Raises :class:`WebhookRejected` for a
        permanent refusal, anything else when it still failed after bounded retries.
        """
