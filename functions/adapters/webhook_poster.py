"""POSTing webhook payloads with requests: the Teams workflow's retry rules, secrets kept out
of every log line and exception text."""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import urlsplit

import requests

from functions.adapters.retry import RetryPolicy, TransientHttpError, redact_urllib3_logs, send
from functions.adapters.sessions import Session
from functions.webhooks.ports import WebhookRejected

USER_AGENT = "sebridge-webhooks"
MIN_SECRET_FRAGMENT = 8  # shorter paths ("/", "/hook") are no secret and would redact too much


class RedactSecretFragments(logging.Filter):
    """urllib3 logs each request's path at DEBUG; a Slack webhook's secret is its path, not
    (only) its query string, so every registered URL's path and query are cut out too."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._fragments: set[str] = set()

    def add(self, url: str) -> None:
        parts = urlsplit(url)
        tail = parts.path + (f"?{parts.query}" if parts.query else "")
        with self._lock:
            for fragment in (url, tail, parts.path, parts.query):
                if len(fragment) >= MIN_SECRET_FRAGMENT:
                    self._fragments.add(fragment)

    def _redact(self, text: str) -> str:
        for fragment in sorted(self._fragments, key=len, reverse=True):
            if fragment in text:
                text = text.replace(fragment, "<redacted>")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            if isinstance(record.msg, str):
                record.msg = self._redact(record.msg)
            if isinstance(record.args, tuple):
                record.args = tuple(
                    self._redact(a) if isinstance(a, str) else a for a in record.args
                )
        return True


_REDACTOR = RedactSecretFragments()


def _install_redactor() -> None:
    logger = logging.getLogger("urllib3.connectionpool")
    if _REDACTOR not in logger.filters:
        logger.addFilter(_REDACTOR)


class HttpWebhookPoster:
    """One POST per call, retried by :func:`functions.adapters.retry.send` (429 and 5xx with
    backoff and jitter, Retry-After honoured, a long Retry-After raised at once).

    Redirects are not followed: a webhook that answers 3xx is refused (following one could
    carry a routing key in the body to another host). Every failure is raised with a text
    naming the endpoint and the status or the exception's class, never the URL (requests'
    own messages quote it).
    """

    def __init__(self, *, session: requests.Session | None = None, policy: RetryPolicy) -> None:
        self._session = session or Session()
        self._policy = policy
        redact_urllib3_logs()
        _install_redactor()

    def __repr__(self) -> str:
        return "HttpWebhookPoster()"

    def post(self, endpoint: str, url: str, body: Any) -> None:
        _REDACTOR.add(url)
        what = f"webhook {endpoint}"
        try:
            response = send(
                self._session,
                "POST",
                url,
                policy=self._policy,
                what=what,
                json=body,
                allow_redirects=False,
                headers={"User-Agent": USER_AGENT},
            )
        except TransientHttpError:
            raise
        except requests.RequestException as exc:
            # Not retried by send() (an invalid URL, a broken response): said without the URL.
            raise TransientHttpError(f"{what}: {type(exc).__name__}") from None
        response.close()  # the body may echo the request; nothing here reads it
        if not 200 <= response.status_code < 300:
            raise WebhookRejected(endpoint, response.status_code)
