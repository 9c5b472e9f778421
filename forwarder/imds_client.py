"""The IMDS adapter: scheduled events (GET and the StartRequests POST) and instance metadata.

One keep-alive ``requests.Session``. Every failure is turned into an :class:`ImdsError` whose
``transient`` flag tells the caller whether to retry; nothing here sleeps or retries itself,
so the poll loop stays in charge of pacing (IMDS throttles above 5 requests/s per VM).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

import requests

from sebridge.contract.events import Observer
from sebridge.imds import Document, InvalidDocument
from sebridge.retry import parse_retry_after

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://169.254.169.254"
SCHEDULED_EVENTS_API = "2020-07-01"
INSTANCE_API = "2021-02-01"
CONNECT_TIMEOUT = 2.0
# The first call after the feature is (re-)enabled can take up to 2 minutes.
FIRST_CALL_READ_TIMEOUT = 125.0
READ_TIMEOUT = 10.0


class ImdsError(Exception):
    def __init__(self, message: str, *, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


@dataclass(frozen=True)
class ApprovalResponse:
    status: int
    body: str

    @property
    def accepted(self) -> bool:
        return self.status == 200


def _retry_after(response: requests.Response) -> float | None:
    return parse_retry_after(response.headers.get("Retry-After"), time.time())


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


class ImdsClient:
    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        api_version: str = SCHEDULED_EVENTS_API,
        instance_api_version: str = INSTANCE_API,
        session: requests.Session | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.api_version = api_version
        self.instance_api_version = instance_api_version
        self._session = session or requests.Session()
        self._session.headers["Metadata"] = "true"
        # IMDS must never be reached through a proxy (and a loopback simulator neither).
        self._session.trust_env = False
        self._answered = False
        # The poll sends this same GET every second: prepared once, it skips requests' merging
        # of settings and re-parsing of the URL, about a quarter of an idle poll's CPU.
        self._get_events = self._session.prepare_request(
            requests.Request(
                "GET", self.scheduled_events_url, params={"api-version": self.api_version}
            )
        )

    @property
    def scheduled_events_url(self) -> str:
        return f"{self.endpoint}/metadata/scheduledevents"

    def close(self) -> None:
        self._session.close()

    def _timeout(self, read_timeout: float | None = None) -> tuple[float, float]:
        if read_timeout is not None:  # the caller's own bound (approvals: a per-command budget)
            return (min(CONNECT_TIMEOUT, read_timeout), read_timeout)
        return (CONNECT_TIMEOUT, READ_TIMEOUT if self._answered else FIRST_CALL_READ_TIMEOUT)

    def _request(
        self, method: str, url: str, timeout: tuple[float, float] | None = None, **kwargs: Any
    ) -> requests.Response:
        prepared = self._session.prepare_request(requests.Request(method, url, **kwargs))
        return self._send(prepared, timeout)

    def _send(
        self, request: requests.PreparedRequest, timeout: tuple[float, float] | None = None
    ) -> requests.Response:
        try:
            # Never follow a redirect: IMDS does not send one, and nothing else may answer.
            return self._session.send(
                request, timeout=timeout or self._timeout(), allow_redirects=False
            )
        except requests.RequestException as exc:
            what = f"{request.method} {request.url}"
            if isinstance(exc, requests.Timeout):
                raise ImdsError(f"IMDS timed out ({what})", transient=True) from exc
            if isinstance(exc, requests.ConnectionError):
                raise ImdsError(f"IMDS unreachable ({what}): {exc}", transient=True) from exc
            raise ImdsError(f"IMDS request failed ({what}): {exc}", transient=True) from exc

    def _check_status(self, response: requests.Response, what: str) -> None:
        status = response.status_code
        if status == 200:
            return
        detail = _excerpt(response.text)
        if status == 429:
            raise ImdsError(
                f"IMDS throttled {what} (429)", transient=True, retry_after=_retry_after(response)
            )
        if status >= 500:
            raise ImdsError(f"IMDS answered {status} to {what}: {detail}", transient=True)
        raise ImdsError(f"IMDS answered {status} to {what}: {detail}", transient=False)

    def get_document(self, *, read_timeout: float | None = None) -> Document:
        """The scheduled events document. ``read_timeout`` replaces the default read timeout
        (which is the slow first-call one until IMDS has answered once)."""
        response = self._send(self._get_events, self._timeout(read_timeout))
        self._check_status(response, "GET scheduledevents")
        self._answered = True
        try:
            body = response.json()
        except ValueError as exc:
            raise ImdsError(
                f"IMDS body is not JSON: {_excerpt(response.text)!r}", transient=True
            ) from exc
        try:
            return Document.from_imds(body)
        except InvalidDocument as exc:
            raise ImdsError(f"IMDS body is not a valid document: {exc}", transient=True) from exc

    def approve(self, event_id: str, *, read_timeout: float | None = None) -> ApprovalResponse:
        """POST exactly ``{"StartRequests": [{"EventId": ...}]}``; 429/5xx/network raise."""
        body = json.dumps({"StartRequests": [{"EventId": event_id}]})
        response = self._request(
            "POST",
            self.scheduled_events_url,
            timeout=self._timeout(read_timeout),
            params={"api-version": self.api_version},
            data=body.encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )
        if response.status_code == 429 or response.status_code >= 500:
            self._check_status(response, "POST StartRequests")
        return ApprovalResponse(response.status_code, _excerpt(response.text, 500))

    def instance_metadata(self) -> Observer:
        response = self._request(
            "GET",
            f"{self.endpoint}/metadata/instance",
            # Only scheduled events has the slow first call (the feature being enabled).
            timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
            params={"api-version": self.instance_api_version},
        )
        self._check_status(response, "GET instance")
        try:
            compute = response.json()["compute"]
            name = compute["name"]
        except (ValueError, KeyError, TypeError) as exc:
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
