"""The Event Grid ingestion's memory: one JSON blob per EventId, written under its ETag.

Why a blob per event rather than Table storage: the app already speaks Blob REST with an Entra
token to its own storage account (the heartbeat store), its identity already holds Storage
Blob Data Owner there (host storage), and a blob gives exactly what the ingestion needs:
read with its ``ETag``, write with ``If-Match`` (or ``If-None-Match: *`` for a new one), a
412/409 when someone else wrote first. Table storage offers the same optimistic concurrency
but would add a second REST dialect (OData entities, 64 KiB property limit for the record) and
a Storage Table Data Contributor grant, for no gain at one row per event.

No retry of a lost race here: :class:`StateConflict` goes back to the core, which re-reads and
decides again. 429/5xx and connection errors are retried with backoff (bounded); anything else
raises :class:`EventStateError` and Event Grid redelivers the notification.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import requests

from functions.adapters.arm import TokenCredential
from functions.adapters.retry import RetryPolicy, send
from functions.adapters.sessions import Session
from functions.eventgrid_ingest.core import StateConflict

log = logging.getLogger("sebridge.functions.event_state")

STORAGE_SCOPE = "https://storage.azure.com/.default"
STORAGE_API_VERSION = "2023-11-03"
MAX_RECORD_BYTES = 1024 * 1024


class EventStateError(Exception):
    """Storage refused a read or write for a reason other than a lost race."""


class BlobEventStateStore:
    def __init__(
        self,
        container_url: str,
        credential: TokenCredential,
        *,
        session: requests.Session | None = None,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._container = container_url.rstrip("/")
        self._credential = credential
        self._session = session or Session()
        self._policy = policy or RetryPolicy(attempts=3, max_total_wait=5.0, base_delay=0.2)
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"BlobEventStateStore({self._container})"

    def _headers(self) -> dict[str, str]:
        token = self._credential.get_token(STORAGE_SCOPE).token
        return {"Authorization": f"Bearer {token}", "x-ms-version": STORAGE_API_VERSION}

    def _blob_url(self, key: str) -> str:
        return f"{self._container}/{quote(key, safe='')}.json"

    def read(self, key: str) -> tuple[Mapping[str, Any] | None, str | None]:
        response = send(
            self._session,
            "GET",
            self._blob_url(key),
            policy=self._policy,
            what="event state read",
            sleep=self._sleep,
            headers=self._headers(),
        )
        if response.status_code == 404:
            return None, None  # BlobNotFound, or ContainerNotFound before the first write
        if response.status_code != 200:
            raise EventStateError(f"event state read: HTTP {response.status_code}")
        etag = response.headers.get("ETag")
        if not etag:
            raise EventStateError("event state read: no ETag in the answer")
        try:
            document = json.loads(response.content[:MAX_RECORD_BYTES])
        except (ValueError, UnicodeDecodeError) as exc:
            log.error("event state for %s is not JSON (%s); it will be overwritten", key, exc)
            return None, etag
        if not isinstance(document, dict):
            log.error("event state for %s is not an object; it will be overwritten", key)
            return None, etag
        return document, etag

    def write(self, key: str, document: Mapping[str, Any], etag: str | None) -> str:
        body = json.dumps(document, separators=(",", ":"), sort_keys=True).encode("utf-8")
        if len(body) > MAX_RECORD_BYTES:
            raise EventStateError(f"event state for {key} would be {len(body)} bytes")
        condition = {"If-Match": etag} if etag else {"If-None-Match": "*"}
        for _ in range(2):
            response = send(
                self._session,
                "PUT",
                self._blob_url(key),
                policy=self._policy,
                what="event state write",
                sleep=self._sleep,
                data=body,
                headers={
                    **self._headers(),
                    **condition,
                    "x-ms-blob-type": "BlockBlob",
                    "Content-Type": "application/json",
                },
            )
            code = response.headers.get("x-ms-error-code", "")
            if response.status_code == 201:
                new_etag = response.headers.get("ETag")
                if not new_etag:
                    raise EventStateError("event state write: no ETag in the answer")
                return new_etag
            if code == "ContainerNotFound":
                self._create_container()
                continue
            if response.status_code in (409, 412) or (etag and code == "BlobNotFound"):
                # ConditionNotMet, BlobAlreadyExists, or deleted since read: someone else won.
                raise StateConflict(f"{key}: {code or response.status_code}")
            break
        raise EventStateError(f"event state write: HTTP {response.status_code} {code}".strip())

    def _create_container(self) -> None:
        response = send(
            self._session,
            "PUT",
            self._container,
            policy=self._policy,
            what="event state create container",
            sleep=self._sleep,
            params={"restype": "container"},
            headers=self._headers(),
        )
        if response.status_code not in (201, 409):  # 409: someone else created it first
            raise EventStateError(f"create container: HTTP {response.status_code}")
        log.info("event state container created")
