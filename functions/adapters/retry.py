"""Bounded retries with backoff, jitter and Retry-After for HTTP calls made with requests."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import requests

from sebridge.retry import Backoff, parse_retry_after

log = logging.getLogger("sebridge.functions.http")


class TransientHttpError(Exception):
    """Still failing after the last allowed attempt (the message will be redelivered)."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3
    max_total_wait: float = 30.0  # seconds of sleeping across all attempts
    base_delay: float = 1.0
    max_delay: float = 10.0
    timeout: float = 10.0  # per request (connect and read)
    statuses: Collection[int] = (429, 500, 502, 503, 504)


class RedactQueryStrings(logging.Filter):
    """Cut query strings out of urllib3's request log lines (a webhook's signature is there)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                a.split("?", 1)[0] + "?<redacted>" if isinstance(a, str) and "?" in a else a
                for a in record.args
            )
        return True


_REDACTOR = RedactQueryStrings()


def redact_urllib3_logs() -> None:
    """Idempotent: urllib3 logs every request's URL at DEBUG, query string included."""
    logger = logging.getLogger("urllib3.connectionpool")
    if _REDACTOR not in logger.filters:
        logger.addFilter(_REDACTOR)


def retry_after(response: requests.Response, now: Callable[[], float] = time.time) -> float | None:
    """Retry-After in seconds (delta-seconds or an HTTP date), or None."""
    return parse_retry_after(response.headers.get("Retry-After"), now())


def send(
    session: requests.Session,
    method: str,
    url: str,
    *,
    policy: RetryPolicy,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    before_attempt: Callable[[float], float | None] | None = None,
    **kwargs: object,
) -> requests.Response:
    """One request, retried on ``policy.statuses`` and connection errors.

    ``what`` names the call in logs: URLs are never logged, since some carry a secret (the
    Teams webhook's signature) in their query string.

    ``before_attempt`` (a write under a pool's lease: functions.shared.write_window) is asked
    before every attempt, and raises when the write may no longer go out; before a wait it
    says how long one may still be (None: no limit), and a retry that would wait longer is not
    waited for: the request fails at once and the message comes back later.
    """
    waited = 0.0
    backoff = Backoff(policy.base_delay, max(policy.base_delay, policy.max_delay), floor=0.0)
    for attempt in range(1, policy.attempts + 1):
        problem: str
        delay: float | None = None
        if before_attempt is not None:
            before_attempt(policy.timeout)  # the attempt must end while the lease is held
        try:
            response = session.request(method, url, timeout=policy.timeout, **kwargs)  # type: ignore[arg-type]
        except (requests.ConnectionError, requests.Timeout) as exc:
            problem = type(exc).__name__
        else:
            if response.status_code not in policy.statuses:
                return response
            problem = f"HTTP {response.status_code}"
            delay = retry_after(response)
        if attempt == policy.attempts:
            break
        if delay is None:
            delay = backoff.next_delay()
        elif delay > policy.max_delay:
            # Honour the server: rather than call again too early, give the message back to
            # Service Bus, which redelivers it later.
            problem += f" (Retry-After {delay:.0f} s)"
            break
        if waited + delay > policy.max_total_wait:
            break
        # The attempt after the wait is asked again (with its whole timeout) before it starts.
        allowed = before_attempt(0.0) if before_attempt is not None else None
        if allowed is not None and delay >= allowed:
            problem += f" (a retry in {delay:.1f} s would outlast the pool's lease)"
            break
        log.warning("%s: %s, retry %d in %.1f s", what, problem, attempt, delay)
        sleep(delay)
        waited += delay
    raise TransientHttpError(f"{what}: {problem} after {attempt} attempt(s)")
