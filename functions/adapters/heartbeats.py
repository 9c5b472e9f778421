"""Last Heartbeat per VM, one small blob each, through the Blob REST API (requests).

Why a blob: the Function App has no database, but it always has a storage account (the host's
own). One ``<vm>.json`` per forwarder, overwritten every heartbeat (every 5 min by default),
costs next to nothing, survives restarts and scale-out, and needs no new runtime package: the
Blob REST API takes the same kind of Entra bearer token as ARM (scope storage.azure.com).
Locally the container URL points at emulators/fakes/storage.py. A blob input/output binding
would need the local functions host to emulate blob bindings, and the gate would still need
to read the blob of whichever VM a message names (bindings are fixed per invocation).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from urllib.parse import quote

import requests

from functions.adapters.arm import TokenCredential
from functions.adapters.retry import RetryPolicy, send
from functions.adapters.sessions import Session
from sebridge.imds import isoformat_utc
from sebridge.times import stored

log = logging.getLogger("sebridge.functions.heartbeats")

STORAGE_SCOPE = "https://storage.azure.com/.default"
STORAGE_API_VERSION = "2023-11-03"


class HeartbeatStoreError(Exception):
    pass


class BlobHeartbeatStore:
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
        self._policy = policy or RetryPolicy(attempts=3, max_total_wait=10.0)
        self._sleep = sleep

    def _headers(self) -> dict[str, str]:
        token = self._credential.get_token(STORAGE_SCOPE).token
        return {"Authorization": f"Bearer {token}", "x-ms-version": STORAGE_API_VERSION}

    def _blob_url(self, vm_name: str) -> str:
        return f"{self._container}/{quote(vm_name.lower(), safe='')}.json"

    def record(self, vm_name: str, at: datetime) -> None:
        body = json.dumps({"vmName": vm_name, "lastHeartbeat": isoformat_utc(at)}).encode()
        for _ in range(2):
            response = send(
                self._session,
                "PUT",
                self._blob_url(vm_name),
                policy=self._policy,
                what="heartbeat store write",
                sleep=self._sleep,
                data=body,
                headers={
                    **self._headers(),
                    "x-ms-blob-type": "BlockBlob",
                    "Content-Type": "application/json",
                },
            )
            if response.status_code == 201:
                return
            if response.headers.get("x-ms-error-code") == "ContainerNotFound":
                self._create_container()
                continue
            break
        raise HeartbeatStoreError(f"heartbeat store write: HTTP {response.status_code}")

    def _create_container(self) -> None:
        response = send(
            self._session,
            "PUT",
            self._container,
            policy=self._policy,
            what="heartbeat store create container",
            sleep=self._sleep,
            params={"restype": "container"},
            headers=self._headers(),
        )
        if response.status_code not in (201, 409):  # 409: someone else created it first
            raise HeartbeatStoreError(f"create container: HTTP {response.status_code}")
        log.info("heartbeat container created")

    def last(self, vm_name: str) -> datetime | None:
        response = send(
            self._session,
            "GET",
            self._blob_url(vm_name),
            policy=self._policy,
            what="heartbeat store read",
            sleep=self._sleep,
            headers=self._headers(),
        )
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise HeartbeatStoreError(f"heartbeat store read: HTTP {response.status_code}")
        try:
            text = json.loads(response.content)["lastHeartbeat"]
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable heartbeat record for %s: %s", vm_name, exc)
            return None
        moment = stored(text)
        if moment is None:
            log.warning("unreadable heartbeat record for %s: lastHeartbeat is not a time", vm_name)
        return moment
