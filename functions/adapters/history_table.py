"""The history in Azure Table storage (azure-data-tables, an Entra token; Azurite locally).

One table (``HISTORY_TABLE_URL``, by default ``sebridgehistory`` in the host storage account):

- an event's entries in the partition ``event-<key>``, one row per entry, RowKey the entry's
  key (derived from the message id: a redelivery upserts the same row), the entry as JSON in
  ``record``;
- every event's summary in the partition ``summaries``, RowKey the event's key, with the
  columns a listing filters on (``state``, ``eventType``, ``resourceGroup`` in lower case,
  ``when``, ``lastSeen``) and the summary as JSON in ``body``; written with ``If-Match`` on
  its ETag (or as a new entity), so a writer that lost the race gets
  :class:`~functions.history.core.SummaryConflict` and derives it again.

Why a table here when the ingestion's records are blobs: the history is read by filter (every
event of a state, a resource group, a time range) and an event has many small rows; a blob
per event could not be listed by column. Keys are the core's event keys (a GUID, or a digest),
so nothing from a message reaches a key or a URL; filters are sent as OData parameters, which
the SDK quotes. Transient faults are retried by the SDK (bounded); anything left raises, and
Service Bus redelivers the message.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.credentials import TokenCredential
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, UpdateMode

from functions.history.core import (
    MAX_ENTRIES,
    Entry,
    EventQuery,
    EventSummary,
    SummaryConflict,
    event_key,
)

log = logging.getLogger("sebridge.functions.history_table")

SUMMARIES = "summaries"
MAX_SCAN = 5000  # summaries read for one listing (a bound on the work of one request)
MAX_TEXT_CHARS = 30_000  # a string property holds 64 KiB of UTF-16
DELETE_BATCH = 100  # entities per transaction, the service's limit


def entries_partition(key: str) -> str:
    return f"event-{key}"


def split_table_url(url: str) -> tuple[str, str]:
    """(account endpoint, table name) of ``https://<account>.table.core.windows.net/<table>``
    or Azurite's ``https://127.0.0.1:<port>/<account>/<table>``."""
    parts = urlsplit(url.rstrip("/"))
    path, _, table = parts.path.rpartition("/")
    if not table:
        raise ValueError("the history table URL names no table")
    return f"{parts.scheme}://{parts.netloc}{path}", table


def _fit(document: dict[str, Any], trim: str) -> str:
    """JSON within one string property; cut the list under ``trim`` while it is too long."""
    text = json.dumps(document, separators=(",", ":"), sort_keys=True)
    while len(text) > MAX_TEXT_CHARS and document.get(trim):
        items = document[trim]
        document[trim] = items[: len(items) // 2]
        text = json.dumps(document, separators=(",", ":"), sort_keys=True)
    return text


class TableHistoryStore:
    def __init__(self, table_url: str, credential: TokenCredential, **client_options: Any) -> None:
        endpoint, table = split_table_url(table_url)
        options: dict[str, Any] = {
            "retry_total": 3,
            "retry_backoff_factor": 0.5,
            "connection_timeout": 10,
            "read_timeout": 15,
            **client_options,
        }
        self._client = TableClient(endpoint, table, credential=credential, **options)
        self._url = f"{endpoint}/{table}"
        self._table_ready = False

    def __repr__(self) -> str:
        return f"TableHistoryStore({self._url})"

    def close(self) -> None:
        self._client.close()

    def _ensure_table(self) -> None:
        try:
            self._client.create_table()
            log.info("history table created")
        except ResourceExistsError:
            pass
        self._table_ready = True

    def _write(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """A write, creating the table on the first TableNotFound."""
        try:
            return call(*args, **kwargs)
        except ResourceNotFoundError as exc:
            if getattr(exc, "error_code", None) != "TableNotFound" or self._table_ready:
                raise
            self._ensure_table()
            return call(*args, **kwargs)

    # ---- entries ---------------------------------------------------------------------------
    def add(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            record = entry.to_record()
            entity = {
                "PartitionKey": entries_partition(_key_of(entry)),
                "RowKey": entry.key,
                "at": entry.at,
                "record": _fit(record, "resources"),
            }
            self._write(self._client.upsert_entity, entity, mode=UpdateMode.REPLACE)

    def entries(self, event_key: str) -> list[Entry]:
        found: list[Entry] = []
        try:
            pages = self._client.query_entities(
                "PartitionKey eq @pk",
                parameters={"pk": entries_partition(event_key)},
                select=["RowKey", "record"],
                results_per_page=MAX_ENTRIES,
            )
            for entity in pages:
                if len(found) >= MAX_ENTRIES:
                    log.warning("history of %s has more than %d entries", event_key, MAX_ENTRIES)
                    break
                try:
                    found.append(Entry.from_record(json.loads(entity["record"])))
                except (ValueError, TypeError, KeyError) as exc:
                    log.error("history entry %s unreadable, skipped: %s", entity.get("RowKey"), exc)
        except ResourceNotFoundError:
            return []
        return found

    # ---- summaries -------------------------------------------------------------------------
    def summary(self, event_key: str) -> tuple[EventSummary | None, str | None]:
        try:
            entity = self._client.get_entity(SUMMARIES, event_key)
        except ResourceNotFoundError:
            return None, None
        etag = entity.metadata.get("etag")
        return _summary_of(entity), etag

    def save_summary(self, summary: EventSummary, etag: str | None) -> None:
        latest = summary.latest
        document = summary.to_json()
        body = json.dumps(document, separators=(",", ":"), sort_keys=True)
        while len(body) > MAX_TEXT_CHARS and len(document["appearances"]) > 1:
            document["appearances"] = document["appearances"][1:]
            body = json.dumps(document, separators=(",", ":"), sort_keys=True)
        if len(body) > MAX_TEXT_CHARS:
            document["resources"] = document["resources"][:20]
            document["vms"] = document["vms"][:20]
            for appearance in document["appearances"]:
                appearance["resources"] = appearance["resources"][:20]
            body = json.dumps(document, separators=(",", ":"), sort_keys=True)
        entity = {
            "PartitionKey": SUMMARIES,
            "RowKey": summary.key,
            "state": latest.state,
            "eventType": latest.event_type,
            "resourceGroup": summary.resource_group.lower(),
            "when": latest.when,
            "lastSeen": summary.last_seen,
            "body": body,
        }
        try:
            if etag is None:
                self._write(self._client.create_entity, entity)
            else:
                self._client.update_entity(
                    entity,
                    mode=UpdateMode.REPLACE,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                )
        except (ResourceExistsError, ResourceModifiedError) as exc:
            raise SummaryConflict(f"{summary.key}: {type(exc).__name__}") from exc
        except HttpResponseError as exc:
            if exc.status_code in (409, 412) or (etag and exc.status_code == 404):
                raise SummaryConflict(f"{summary.key}: HTTP {exc.status_code}") from exc
            raise

    def summaries(self, query: EventQuery) -> list[EventSummary]:
        clauses = ["PartitionKey eq @pk"]
        parameters: dict[str, Any] = {"pk": SUMMARIES}
        if query.state is not None:
            clauses.append("state eq @state")
            parameters["state"] = query.state
        if query.resource_group is not None:
            clauses.append("resourceGroup eq @group")
            parameters["group"] = query.resource_group.lower()
        if query.start is not None:
            clauses.append("when ge @start")
            parameters["start"] = query.start
        if query.end is not None:
            clauses.append("when le @end")
            parameters["end"] = query.end
        found: list[EventSummary] = []
        scanned = 0
        try:
            for entity in self._client.query_entities(
                " and ".join(clauses),
                parameters=parameters,
                select=["RowKey", "body"],
                results_per_page=1000,
            ):
                scanned += 1
                if scanned > MAX_SCAN:
                    log.warning("history listing stopped after %d summaries", MAX_SCAN)
                    break
                summary = _summary_of(entity)
                if summary is not None:
                    found.append(summary)
        except ResourceNotFoundError:
            return []
        return found

    # ---- retention -------------------------------------------------------------------------
    def expired(self, before: datetime, limit: int) -> list[str]:
        keys: list[str] = []
        try:
            for entity in self._client.query_entities(
                "PartitionKey eq @pk and lastSeen lt @before",
                parameters={"pk": SUMMARIES, "before": before},
                select=["RowKey"],
                results_per_page=limit,
            ):
                keys.append(str(entity["RowKey"]))
                if len(keys) >= limit:
                    break
        except ResourceNotFoundError:
            return []
        return keys

    def delete(self, event_key: str) -> None:
        partition = entries_partition(event_key)
        rows = [
            str(entity["RowKey"])
            for entity in self._client.query_entities(
                "PartitionKey eq @pk", parameters={"pk": partition}, select=["RowKey"]
            )
        ]
        for start in range(0, len(rows), DELETE_BATCH):
            batch = rows[start : start + DELETE_BATCH]
            self._client.submit_transaction(
                [("delete", {"PartitionKey": partition, "RowKey": row}) for row in batch]
            )
        with contextlib.suppress(ResourceNotFoundError):
            self._client.delete_entity(SUMMARIES, event_key)


def _key_of(entry: Entry) -> str:
    return event_key(entry.event_id)


def _summary_of(entity: Any) -> EventSummary | None:
    try:
        return EventSummary.from_json(json.loads(entity["body"]))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error("history summary %s unreadable, skipped: %s", entity.get("RowKey"), exc)
        return None
