"""The VM's managed identity: Entra ID tokens from IMDS's identity endpoint (an adapter).

On a VM a managed identity has one way in: ``GET {IMDS}/metadata/identity/oauth2/token?
api-version=2018-02-01&resource=<resource>[&client_id=<id>]`` with ``Metadata: true``.
azure-identity's ManagedIdentityCredential asks there too, but importing it imports every
credential of the package (the certificate ones import cryptography) and msal: 10.7 MiB of the
forwarder's 40 MiB (docs/performance.md). :class:`ImdsTokenCredential` does what azure-identity's
ImdsCredential (1.27) does on a VM, for the azure-core TokenCredential protocol that the Service
Bus SDK calls (``get_token``; ``get_token_info`` as well, for azure-core's own policies):

- the authority is ``AZURE_POD_IDENTITY_AUTHORITY_HOST`` when set, as azure-identity reads it
  (the project's identity fake and benchmarks use it), else http://169.254.169.254;
- one token per resource, cached, refreshed when within 5 minutes of ``expires_on`` or past
  ``refresh_in`` (IMDS's, else half the lifetime of a token of 2 hours or more, as
  azure-identity sets it); while the token is still valid a refresh is one attempt (one
  request's deadline) and nobody waits for it: a failed one keeps the token and the next is
  30 s after it ended (azure-core's convention); with ``claims`` the cache is skipped;
- one request at a time per resource: without a valid token, callers that arrive meanwhile
  wait for the answer it brings and share it, a failure too (:meth:`ImdsTokenCredential._get`);
- transient answers (404: the identity is not ready yet, 408, 410: IMDS is being updated, 429,
  5xx; connection errors, timeouts, a cut body) are retried with exponential backoff and full
  jitter, 429's Retry-After honoured, within :data:`RETRY_SECONDS` in all (IMDS asks for 70 s on
  410), then a :class:`TokenError`;
- permanent ones (400: no such identity on this VM, 401, 403, any other status; a body over
  64 KiB or not a JSON object, a token that is not a non-empty string, an ``expires_on`` that
  is not a sane epoch) raise a :class:`TokenError` at once, naming the status and IMDS's
  ``error_description``, never the token;
- every request goes through :class:`DeadlineHttp` (one deadline, a bounded body) and ends at
  once when ``cancel`` is set, as do the pauses between attempts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from azure.core.credentials import AccessToken, AccessTokenInfo
from azure.core.exceptions import ClientAuthenticationError

from sebridge.forwarder.client_id import check_client_id
from sebridge.forwarder.net.client import (
    BodyTooLarge,
    DeadlineExceeded,
    DeadlineHttp,
    RequestCancelled,
    TransportError,
)
from sebridge.retry import Backoff, parse_retry_after

log = logging.getLogger(__name__)

IMDS_AUTHORITY = "http://169.254.169.254"
AUTHORITY_SETTING = "AZURE_POD_IDENTITY_AUTHORITY_HOST"
TOKEN_PATH = "/metadata/identity/oauth2/token"  # noqa: S105 - a URL path
TOKEN_API = "2018-02-01"  # noqa: S105 - an api-version
REQUEST_TIMEOUT = 10.0  # the whole of one request: connect, send, status, headers, body
RETRY_SECONDS = 70.0  # every attempt and pause of one token request together
MAX_BODY_BYTES = 64 * 1024  # an answer is about 2 KB
REFRESH_BEFORE = 300  # seconds before expires_on (azure-core's DEFAULT_REFRESH_OFFSET)
REFRESH_RETRY_AFTER = 30  # seconds between refresh attempts of a still valid token
LONGEST_LIFETIME = 7 * 86_400  # an expires_on further away is not a token's (IMDS's: ~24 h)
TRANSIENT_STATUSES = frozenset({404, 408, 410, 429, *range(500, 600)})

_DIGITS = re.compile(r"[0-9]{1,12}")


class TokenError(ClientAuthenticationError):
    """No token: ``status`` is IMDS's HTTP status (None when there was no answer); ``transient``
    whether asking again later may succeed. The message never carries a token."""

    def __init__(self, message: str, *, status: int | None = None, transient: bool = False):
        super().__init__(message=message)
        self.status = status
        self.transient = transient


@dataclass(frozen=True)
class _Token:
    token: str
    expires_on: int
    refresh_on: int | None
    token_type: str


@dataclass
class _Flight:
    """One token request under way: who waits for it takes its answer, a failure too."""

    done: threading.Event = field(default_factory=threading.Event)
    token: _Token | None = None
    error: TokenError | None = None


def _resource(scopes: tuple[str, ...]) -> str:
    """The v1 resource of the one scope (``https://servicebus.azure.net//.default`` ->
    ``https://servicebus.azure.net/``), as azure-identity converts it."""
    if len(scopes) != 1 or not isinstance(scopes[0], str) or not scopes[0]:
        raise ValueError("a managed identity's token is for exactly one scope")
    return scopes[0].removesuffix("/.default")


def _integer(value: object) -> int | None:
    """An integer given as a JSON number or a string of ASCII digits (IMDS sends strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return None


def _error_text(body: bytes) -> str:
    """IMDS's ``error`` and ``error_description`` of a refusal, else a short excerpt, one line."""
    try:
        content = json.loads(body)
    except ValueError:
        content = None
    if isinstance(content, dict):
        parts = [content.get("error"), content.get("error_description")]
        text = ": ".join(str(p) for p in parts if isinstance(p, str) and p)
    else:
        text = body[:200].decode("utf-8", "replace")
    text = " ".join(text.split())[:300]
    return text or "(no description)"


def parse_token(body: bytes, now: int) -> _Token:
    """An answer's token, or a permanent TokenError saying what is wrong with the answer (the
    token itself never in the message)."""
    try:
        content = json.loads(body)
    except ValueError:
        raise TokenError("IMDS answered 200 with a body that is not JSON", status=200) from None
    if not isinstance(content, dict):
        raise TokenError("IMDS answered 200 with JSON that is not an object", status=200)
    token = content.get("access_token")
    if not isinstance(token, str) or not token or not token.isascii():
        raise TokenError("IMDS answered 200 without an access token string", status=200)
    expires_on = _integer(content.get("expires_on"))
    if expires_on is None and content.get("expires_on") in (None, ""):
        expires_in = _integer(content.get("expires_in"))
        expires_on = None if expires_in is None else now + expires_in
    if expires_on is None or not now < expires_on <= now + LONGEST_LIFETIME:
        shown = repr(content.get("expires_on", content.get("expires_in")))[:40]
        raise TokenError(
            f"IMDS answered 200 with expires_on {shown}: not a time within "
            f"{LONGEST_LIFETIME // 86_400} days from now",
            status=200,
        )
    refresh_in = _integer(content.get("refresh_in"))
    lifetime = expires_on - now
    if refresh_in is None and lifetime >= 7200:
        refresh_in = lifetime // 2
    refresh_on = now + refresh_in if refresh_in is not None and refresh_in > 0 else None
    token_type = content.get("token_type")
    return _Token(
        token,
        expires_on,
        refresh_on,
        token_type if isinstance(token_type, str) and token_type else "Bearer",
    )


class ImdsTokenCredential:
    """A TokenCredential for the VM's managed identity (``client_id``: a user-assigned one;
    None: the system-assigned one), from IMDS's identity endpoint. Thread-safe."""

    def __init__(
        self,
        client_id: str | None = None,
        *,
        authority: str | None = None,
        environ: Mapping[str, str] | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        retry_seconds: float = RETRY_SECONDS,
        cancel: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
        backoff: Backoff | None = None,
    ) -> None:
        self.client_id = check_client_id(client_id) if client_id else None
        if authority is None:
            env = os.environ if environ is None else environ
            authority = env.get(AUTHORITY_SETTING, "").strip() or IMDS_AUTHORITY
        self.authority = authority.strip().rstrip("/")
        if any(c.isspace() or not c.isprintable() for c in self.authority):
            raise ValueError(f"{AUTHORITY_SETTING}: a URL has no spaces or control characters")
        self.request_timeout = request_timeout
        self.retry_seconds = retry_seconds
        self._cancel = cancel
        self._wait = (cancel or threading.Event()).wait
        self._clock = clock
        self._backoff = backoff or Backoff(1.0, 16.0, floor=0.0)
        try:
            self._http = DeadlineHttp(self.authority, max_body=MAX_BODY_BYTES, cancel=cancel)
        except ValueError as exc:
            raise ValueError(f"{AUTHORITY_SETTING}: {exc}") from exc
        self._lock = threading.Lock()
        self._tokens: dict[str, _Token] = {}
        self._last_attempt: dict[str, float] = {}  # when the last request for a resource ended
        self._flights: dict[str, _Flight] = {}  # the request under way for a resource
        self.requests = 0  # token requests sent (attempts), for tests and logs

    # -- the azure-core protocol ------------------------------------------------------------
    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        token = self._get(_resource(scopes), claims)
        return AccessToken(token.token, token.expires_on)

    def get_token_info(self, *scopes: str, options: Mapping[str, Any] | None = None) -> Any:
        token = self._get(_resource(scopes), (options or {}).get("claims"))
        return AccessTokenInfo(
            token.token,
            token.expires_on,
            token_type=token.token_type,
            refresh_on=token.refresh_on,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ImdsTokenCredential:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the cache --------------------------------------------------------------------------
    def _get(self, resource: str, claims: str | None) -> _Token:
        """The cached token, or one request's: never more than one request at a time for a
        resource, and never a wait while a valid token is cached.

        - A valid token, due for a refresh: one caller makes one attempt (one request's
          deadline, not the whole retry budget: the Service Bus SDK calls this on its send
          path), and everyone, that caller too should the attempt fail, keeps the valid token
          meanwhile; the next attempt is 30 s after this one ended.
        - No valid token: one caller asks within the whole retry budget; callers that arrive
          meanwhile wait for that answer and share it, the failure too (each starting a budget
          of its own made the last of N callers wait N budgets).
        """
        if claims:  # a challenge: a token for these claims, never cached nor shared
            return self._request(resource)
        with self._lock:
            now = self._clock()
            cached = self._tokens.get(resource)
            if cached is not None and not self._refresh_due(cached, now):
                return cached
            flight = self._flights.get(resource)
            valid = cached if cached is not None and cached.expires_on > now else None
            if valid is not None and (
                flight is not None
                or now - self._last_attempt.get(resource, -REFRESH_RETRY_AFTER)
                < REFRESH_RETRY_AFTER
            ):
                return valid
            leads = flight is None
            if flight is None:
                flight = self._flights[resource] = _Flight()
        if not leads:
            flight.done.wait()  # the leader's request ends within its budget
            if flight.token is not None:
                return flight.token
            raise flight.error or TokenError("no managed identity token", transient=True)
        token: _Token | None = None
        error: TokenError | None = None
        try:
            if valid is not None:
                token = self._attempt(resource, self.request_timeout)
            else:
                token = self._request(resource)
        except TokenError as exc:
            error = exc
        finally:
            with self._lock:
                self._last_attempt[resource] = self._clock()
                self._flights.pop(resource, None)
                if token is not None:
                    self._tokens[resource] = token
            flight.token = token
            flight.error = error if token is None else None
            flight.done.set()
        if token is not None:
            return token
        assert error is not None
        if valid is not None:
            log.warning("managed identity token refresh failed, still valid: %s", error)
            return valid
        raise error

    @staticmethod
    def _refresh_due(token: _Token, now: float) -> bool:
        if now >= token.expires_on - REFRESH_BEFORE:
            return True
        return token.refresh_on is not None and now >= token.refresh_on

    # -- IMDS -------------------------------------------------------------------------------
    def _target(self, resource: str) -> str:
        query = {"api-version": TOKEN_API, "resource": resource}
        if self.client_id:
            query["client_id"] = self.client_id
        return f"{TOKEN_PATH}?{urlencode(query)}"

    def _request(self, resource: str) -> _Token:
        """A fresh token, retrying transient failures within the retry budget."""
        give_up = time.monotonic() + self.retry_seconds
        self._backoff.reset()
        answered: TokenError | None = None  # the last attempt IMDS answered (with a status)
        while True:
            left = give_up - time.monotonic()
            try:
                return self._attempt(resource, min(self.request_timeout, max(left, 0.001)))
            except TokenError as exc:
                if not exc.transient:
                    raise
                if exc.status is not None:
                    answered = exc
                retry_after = exc.retry_after if isinstance(exc, _Retry) else None
                delay = self._backoff.next_delay(retry_after or 0.0)
                left = give_up - time.monotonic()
                if delay >= left:
                    # The last attempt may have had only the budget's last milliseconds: say
                    # what IMDS last answered too, which is what an operator can act on.
                    also = f"; before it: {answered}" if answered not in (None, exc) else ""
                    raise TokenError(
                        f"no managed identity token within {self.retry_seconds:g} s "
                        f"({self._backoff.failures} attempts); last: {exc}{also}",
                        status=exc.status if answered is None else answered.status,
                        transient=True,
                    ) from exc
                log.info("managed identity token: %s; retry in %.1f s", exc, delay)
                if self._wait(delay):
                    raise TokenError("stopping", transient=True) from exc

    def _attempt(self, resource: str, timeout: float) -> _Token:
        self.requests += 1
        request_time = int(self._clock())
        try:
            answer = self._http.request(
                "GET", self._target(resource), timeout=timeout, headers={"Metadata": "true"}
            )
        except RequestCancelled as exc:
            raise TokenError("stopping", transient=True) from exc
        except BodyTooLarge as exc:  # IMDS's are about 2 KB: this is not IMDS
            raise TokenError(f"IMDS's answer is larger than {MAX_BODY_BYTES} bytes") from exc
        except (DeadlineExceeded, TransportError) as exc:  # a cut body is no answer either
            what = f"{type(exc).__name__}: {exc}"
            raise TokenError(f"IMDS did not answer ({what})", transient=True) from exc
        if answer.status == 200:
            return parse_token(answer.body, request_time)
        text = _error_text(answer.body)
        if answer.status in TRANSIENT_STATUSES:
            retry_after = None
            if answer.status == 429:
                retry_after = parse_retry_after(answer.headers.get("retry-after"), time.time())
            raise _Retry(f"IMDS answered {answer.status}: {text}", answer.status, retry_after)
        hint = ""
        if answer.status == 400:  # azure-identity: "No identity has been assigned"
            hint = (
                f" (is the identity with client id {self.client_id} assigned to this VM?)"
                if self.client_id
                else " (is a system-assigned identity enabled on this VM?)"
            )
        raise TokenError(f"IMDS answered {answer.status}: {text}{hint}", status=answer.status)


class _Retry(TokenError):
    def __init__(self, message: str, status: int, retry_after: float | None) -> None:
        super().__init__(message, status=status, transient=True)
        self.retry_after = retry_after
