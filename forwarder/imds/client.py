"""The IMDS adapter: scheduled events (GET and the StartRequests POST) and instance metadata.

Every request is bounded in time and size, whatever the peer does (see
:mod:`sebridge.forwarder.net.client`): an overall deadline (the slow first call's 125 s until
IMDS has answered once, then 10 s, or the caller's own, shorter budget), a body cap of
:data:`MAX_BODY_BYTES` (real documents are a few KB), and an immediate end when the forwarder
stops. Every request first takes a slot of the shared :class:`RequestLimit` (IMDS throttles above
5 requests/s per VM), the poller with priority.

Every failure is turned into an :class:`ImdsError` whose ``transient`` flag tells the caller
whether to retry; nothing here sleeps or retries itself, so the loops stay in charge of pacing.
One connection per client, kept alive while IMDS allows it (a server that closes after each
answer, such as Microsoft's mock server, is read just as well), no proxy, no redirects.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from sebridge.contract.events import Observer
from sebridge.forwarder.imds.ratelimit import RequestLimit
from sebridge.forwarder.net.client import (
    Answer,
    BodyTooLarge,
    DeadlineExceeded,
    DeadlineHttp,
    RequestCancelled,
    TransportError,
)
from sebridge.forwarder.ports import ImdsError
from sebridge.imds import Document, InvalidDocument
from sebridge.retry import parse_retry_after

log = logging.getLogger(__name__)

__all__ = ["ApprovalResponse", "ImdsClient", "ImdsError", "hostname_observer"]

DEFAULT_ENDPOINT = "http://169.254.169.254"
SCHEDULED_EVENTS_API = "2020-07-01"
INSTANCE_API = "2021-02-01"
CONNECT_TIMEOUT = 2.0
# The first call after the feature is (re-)enabled can take up to 2 minutes.
FIRST_CALL_READ_TIMEOUT = 125.0
READ_TIMEOUT = 10.0  # the whole of any later request (connect, send, headers, body)
MAX_BODY_BYTES = 1024 * 1024  # real documents are a few KB


@dataclass(frozen=True)
class ApprovalResponse:
    status: int
    body: str

    @property
    def accepted(self) -> bool:
        return self.status == 200


_TAG = re.compile(r"<[^>]*>")


def _excerpt(body: bytes | str, limit: int = 200) -> str:
    """A short, one-line excerpt of a body for a log line (HTML tags dropped)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = " ".join(_TAG.sub(" ", text[: limit * 20]).split())
    return text if len(text) <= limit else text[:limit] + "..."


class ImdsClient:
    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        api_version: str = SCHEDULED_EVENTS_API,
        instance_api_version: str = INSTANCE_API,
        limit: RequestLimit | None = None,
        priority: bool = False,
        cancel: threading.Event | None = None,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        """``limit`` is the request budget shared with the forwarder's other IMDS clients
        (the poller's has ``priority``); ``cancel`` ends any request at once when set."""
        self.endpoint = endpoint.rstrip("/")
        self.api_version = api_version
        self.instance_api_version = instance_api_version
        self.limit = limit
        self.priority = priority
        self.cancel = cancel
        self._http = DeadlineHttp(
            self.endpoint, max_body=max_body, connect_timeout=CONNECT_TIMEOUT, cancel=cancel
        )
        # Instance metadata on a connection of its own: one connection carries one request at a
        # time, and a lookup that hangs (on the identity thread) must never hold the polls.
        self._instance_http = DeadlineHttp(
            self.endpoint, max_body=max_body, connect_timeout=CONNECT_TIMEOUT, cancel=cancel
        )
        self._answered = False
        self._events_target = "/metadata/scheduledevents?" + urlencode(
            {"api-version": self.api_version}
        )

    @property
    def scheduled_events_url(self) -> str:
        return f"{self.endpoint}/metadata/scheduledevents"

    def close(self) -> None:
        self._http.close()
        self._instance_http.close()

    def _timeout(self, timeout: float | None) -> float:
        if timeout is not None:  # the caller's own bound (approvals: a per-command budget)
            return timeout
        return READ_TIMEOUT if self._answered else FIRST_CALL_READ_TIMEOUT

    def _request(
        self,
        method: str,
        target: str,
        timeout: float,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        http: DeadlineHttp | None = None,
    ) -> Answer:
        what = f"{method} {self.endpoint}{target}"
        deadline = time.monotonic() + timeout
        if self.limit is not None and not self.limit.acquire(
            priority=self.priority, deadline=deadline, cancel=self.cancel
        ):
            if self.cancel is not None and self.cancel.is_set():
                raise ImdsError(f"IMDS request abandoned: stopping ({what})", transient=True)
            raise ImdsError(
                f"no IMDS request slot within {timeout:.1f} s (5 requests/s shared) ({what})",
                transient=True,
            )
        left = max(0.001, deadline - time.monotonic())
        try:
            return (http or self._http).request(
                method,
                target,
                timeout=left,
                headers={"Metadata": "true", **(headers or {})},
                body=body,
            )
        except DeadlineExceeded as exc:
            raise ImdsError(
                f"IMDS did not answer within {timeout:.1f} s ({what})", transient=True
            ) from exc
        except RequestCancelled as exc:
            raise ImdsError(f"IMDS request abandoned: stopping ({what})", transient=True) from exc
        except BodyTooLarge as exc:
            raise ImdsError(f"IMDS body refused: {exc} ({what})", transient=True) from exc
        except TransportError as exc:
            raise ImdsError(f"IMDS unreachable ({what}): {exc}", transient=True) from exc

    def _check_status(self, answer: Answer, what: str) -> None:
        status = answer.status
        if status == 200:
            return
        detail = _excerpt(answer.body)
        if status == 429:
            raise ImdsError(
                f"IMDS throttled {what} (429)",
                transient=True,
                retry_after=parse_retry_after(answer.headers.get("retry-after"), time.time()),
                status=status,
            )
        text = f"IMDS answered {status} to {what}: {detail}"
        raise ImdsError(text, transient=status >= 500, status=status)

    def get_document(self, *, read_timeout: float | None = None) -> Document:
        """The scheduled events document. ``read_timeout`` replaces the default deadline of
        the whole request (the slow first call's until IMDS has answered once)."""
        answer = self._request("GET", self._events_target, self._timeout(read_timeout))
        self._check_status(answer, "GET scheduledevents")
        self._answered = True
        try:
            body = json.loads(answer.body)
        except (ValueError, RecursionError) as exc:
            raise ImdsError(
                f"IMDS body is not JSON: {_excerpt(answer.body)!r}", transient=True
            ) from exc
        try:
            return Document.from_imds(body)
        except InvalidDocument as exc:
            raise ImdsError(f"IMDS body is not a valid document: {exc}", transient=True) from exc

    def approve(self, event_id: str, *, read_timeout: float | None = None) -> ApprovalResponse:
        """POST exactly ``{"StartRequests": [{"EventId": ...}]}``; 429/5xx/network raise."""
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode("utf-8")
        answer = self._request(
            "POST",
            self._events_target,
            self._timeout(read_timeout),
            body=body,
            headers={"Content-Type": "application/json"},
        )
        if answer.status == 429 or answer.status >= 500:
            self._check_status(answer, "POST StartRequests")
        return ApprovalResponse(answer.status, _excerpt(answer.body, 500))

    def instance_metadata(self) -> Observer:
        target = "/metadata/instance?" + urlencode({"api-version": self.instance_api_version})
        # Only scheduled events has the slow first call (the feature being enabled).
        answer = self._request("GET", target, READ_TIMEOUT, http=self._instance_http)
        self._check_status(answer, "GET instance")
        try:
            compute = json.loads(answer.body)["compute"]
            name = compute["name"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ImdsError("instance metadata has no compute.name", transient=False) from exc
        if not isinstance(compute, dict) or not isinstance(name, str) or not name:
            raise ImdsError("instance metadata has no compute.name", transient=False)

        def text(key: str) -> str:
            value = compute.get(key)
            return value if isinstance(value, str) else ""

        return Observer(
            vm_name=name,
            vm_id=text("vmId"),
            resource_id=text("resourceId"),
            subscription_id=text("subscriptionId"),
            resource_group=text("resourceGroupName"),
            location=text("location"),
            zone=text("zone"),
            vm_scale_set_name=text("vmScaleSetName"),
        )


def hostname_observer() -> Observer:
    """Fallback identity when instance metadata is unavailable."""
    return Observer(vm_name=socket.gethostname().split(".")[0])
