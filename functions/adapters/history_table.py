"""The history in Azure Table storage (azure-data-tables, an Entra token; Azurite locally).

One table (``HISTORY_TABLE_URL``, by default ``sebridgehistory`` in the host storage account).
An event as one scope saw it (functions.history.core) has the key ``<event key>.<scope
digest>``; its rows:

- its entries in the partition ``event-<key>``, one row per entry, RowKey the entry's key
  (``<kind>-<appearance>-<digest of the message id>``: a redelivery finds its row and writes
  nothing), its fields in the string properties core.entry_properties makes;
- its summary in the partition ``summaries``, RowKey the key, the properties
  core.summary_properties makes (each string within the service's 32,767 UTF-16 units by
  construction) plus where its index rows are; written with ``If-Match`` on its ETag (or as a
  new entity), so a writer that lost the race gets SummaryConflict and derives it again;
- two index rows, copies of the summary under a RowKey that sorts by its time (``when``):
  ``when-desc`` (the latest first: the listing, the calendar's past) and ``when-asc`` (the
  earliest first: the calendar's upcoming events). A listing is then one range query that stops
  at its limit, right however many events the table holds. The summary row names the times it
  has index rows at (``indexedAt``) *before* they are written and is marked settled once the
  old ones are gone, so a crash between the writes leaves work the next write finishes, never a
  row nobody knows of.

Reads of an event's entries take one page of :data:`READ_ALL` rows; an event scope with more
(only a flood) is read again kind by kind, :data:`READ_PER_KIND` rows each, so the lifecycle
rows are never crowded out by Prepared, Held or Restored rows.

Keys are the core's keys (GUIDs and digests), so nothing from a message reaches a key or a URL;
filters are OData parameters, which the SDK quotes. Faults that may pass (no answer, 408, 429,
5xx) are raised as core.StoreUnavailable without the SDK's own retries: the core retries the
whole (idempotent) write within its window. A table that is gone is created again.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.credentials import TokenCredential
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import TableClient, UpdateMode

from functions.history.core import (
    LATEST,
    NAMES,
    Entry,
    EntryRead,
    EventQuery,
    EventSummary,
    Listing,
    StoredSummary,
    StoreUnavailable,
    SummaryConflict,
    entry_from_properties,
    entry_properties,
    summary_from_properties,
    summary_properties,
    time_rank,
    vm_column,
)

log = logging.getLogger("sebridge.functions.history_table")

SUMMARIES = "summaries"
LATEST_FIRST = "when-desc"
EARLIEST_FIRST = "when-asc"
READ_ALL = 1000  # an event scope's entries read in one go
READ_PER_KIND = 300  # then, per kind, when it has more (a flood from its own scope)
MAX_SCOPES = 20  # scopes of one event shown by the timeline
LISTING_PAGES = 20  # pages (of up to 1,000 rows the service scans) one listing reads at most
DELETE_BATCH = 100  # entities per transaction, the service's limit
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_LAST_RANK = time_rank(LATEST)

T = TypeVar("T")


def entries_partition(key: str) -> str:
    return f"event-{key}"


def _rank(moment: datetime) -> str:
    return f"{time_rank(moment):019d}"


def _index_rows(key: str, rank: str) -> list[tuple[str, str]]:
    """(partition, row key) of a summary's two index rows for the time ``rank``."""
    inverted = _LAST_RANK - int(rank)
    return [(EARLIEST_FIRST, f"{rank}.{key}"), (LATEST_FIRST, f"{inverted:019d}.{key}")]


def split_table_url(url: str) -> tuple[str, str]:
    """(account endpoint, table name) of ``https://<account>.table.core.windows.net/<table>``
    or Azurite's ``https://127.0.0.1:<port>/<account>/<table>``."""
    parts = urlsplit(url.rstrip("/"))
    path, _, table = parts.path.rpartition("/")
    if not table:
        raise ValueError("the history table URL names no table")
    return f"{parts.scheme}://{parts.netloc}{path}", table


@contextlib.contextmanager
def _faults(what: str) -> Iterator[None]:
    """The SDK's faults that may pass as StoreUnavailable; the rest as they are."""
    try:
        yield
    except (ServiceRequestError, ServiceResponseError) as exc:
        raise StoreUnavailable(f"{what}: {type(exc).__name__}") from exc
    except HttpResponseError as exc:
        code = getattr(exc, "error_code", None)
        if exc.status_code in TRANSIENT_STATUSES or code == "TableBeingDeleted":
            raise StoreUnavailable(f"{what}: HTTP {exc.status_code} {code or ''}".strip()) from exc
        raise


def _table_missing(exc: ResourceNotFoundError) -> bool:
    """Whether a 404 says the table is gone (not an entity): the SDK sets ``error_code`` on
    some paths only, so the service's header and body are read too."""
    if getattr(exc, "error_code", None) == "TableNotFound":
        return True
    response = getattr(exc, "response", None)
    if response is None:
        return False
    if response.headers.get("x-ms-error-code") == "TableNotFound":
        return True
    try:
        return "TableNotFound" in response.text()
    except Exception:  # noqa: BLE001 - an unreadable body says nothing
        return False


class TableHistoryStore:
    def __init__(self, table_url: str, credential: TokenCredential, **client_options: Any) -> None:
        endpoint, table = split_table_url(table_url)
        options: dict[str, Any] = {
            # No SDK retries: the core retries the whole write within its window, and an
            # attempt that hangs ends after these timeouts (not 3 x 15 s of retried reads).
            "retry_total": 0,
            "connection_timeout": 5,
            "read_timeout": 10,
            **client_options,
        }
        self._client = TableClient(endpoint, table, credential=credential, **options)
        self._url = f"{endpoint}/{table}"

    def __repr__(self) -> str:
        return f"TableHistoryStore({self._url})"

    def close(self) -> None:
        self._client.close()

    def _create_table(self) -> None:
        try:
            self._client.create_table()
            log.info("history table created")
        except ResourceExistsError:
            pass

    def _write(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A write; when the table is gone (never made, or deleted since), it is created and
        the write tried once more."""
        with _faults("history write"):
            try:
                return call(*args, **kwargs)
            except ResourceNotFoundError as exc:
                if not _table_missing(exc):
                    raise
                self._create_table()
                return call(*args, **kwargs)

    def _query(
        self, query: str, parameters: dict[str, Any], limit: int, **options: Any
    ) -> tuple[list[Any], bool]:
        """Up to ``limit`` entities in key order, and whether that was all of them."""
        found: list[Any] = []
        with _faults("history read"):
            try:
                for entity in self._client.query_entities(
                    query, parameters=parameters, results_per_page=min(limit + 1, 1000), **options
                ):
                    if len(found) == limit:
                        return found, False
                    found.append(entity)
            except ResourceNotFoundError as exc:
                if not _table_missing(exc):
                    raise
                return [], True
        return found, True

    # ---- entries ---------------------------------------------------------------------------
    def add(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            entity = {
                "PartitionKey": entries_partition(entry.summary_key),
                "RowKey": entry.key,
                "at": entry.at,
                "recorded": entry.recorded_at,
                **entry_properties(entry),
            }
            with contextlib.suppress(ResourceExistsError):  # a redelivery: the row is there
                self._write(self._client.create_entity, entity)

    def entries(self, key: str) -> EntryRead:
        partition = entries_partition(key)
        rows, complete = self._query("PartitionKey eq @pk", {"pk": partition}, READ_ALL)
        if not complete:
            log.warning("history of %s has more than %d entries: read kind by kind", key, READ_ALL)
            rows, complete = [], True
            for name in NAMES:
                kind = name.lower()
                found, whole = self._query(
                    "PartitionKey eq @pk and RowKey gt @lo and RowKey lt @hi",
                    {"pk": partition, "lo": f"{kind}-", "hi": f"{kind}."},
                    READ_PER_KIND,
                )
                rows += found
                complete = complete and whole
                if not whole:
                    log.warning("history of %s: only %d %s entries read", key, len(found), name)
        found_entries: list[Entry] = []
        for entity in rows:
            try:
                found_entries.append(entry_from_properties(entity))
            except (ValueError, TypeError, KeyError) as exc:
                log.error("history entry %s unreadable, skipped: %s", entity.get("RowKey"), exc)
        return EntryRead(found_entries, complete)

    # ---- summaries -------------------------------------------------------------------------
    def summary(self, key: str) -> StoredSummary | None:
        with _faults("history read"):
            try:
                entity = self._client.get_entity(SUMMARIES, key)
            except ResourceNotFoundError:
                return None
        return StoredSummary(
            _summary_of(entity),
            str(entity.metadata.get("etag")),
            settled=entity.get("indexPending") is not True,
            marks=_marks(entity),
        )

    def save_summary(self, summary: EventSummary, stored: StoredSummary | None) -> None:
        properties = summary_properties(summary)
        rank = _rank(summary.latest.when)
        marks = sorted({*(stored.marks if stored else ()), rank})
        entity = {
            "PartitionKey": SUMMARIES,
            "RowKey": summary.key,
            **properties,
            "indexedAt": json.dumps(marks),
            "indexPending": True,
        }
        try:
            if stored is None:
                written = self._write(self._client.create_entity, entity)
            else:
                written = self._write(
                    self._client.update_entity,
                    entity,
                    mode=UpdateMode.REPLACE,
                    etag=stored.etag,
                    match_condition=MatchConditions.IfNotModified,
                )
        except (ResourceExistsError, ResourceModifiedError) as exc:
            raise SummaryConflict(f"{summary.key}: {type(exc).__name__}") from exc
        except HttpResponseError as exc:
            if exc.status_code in (409, 412) or (stored and exc.status_code == 404):
                raise SummaryConflict(f"{summary.key}: HTTP {exc.status_code}") from exc
            raise
        for partition, row in _index_rows(summary.key, rank):
            index = {"PartitionKey": partition, "RowKey": row, "summary": summary.key}
            self._write(
                self._client.upsert_entity, {**properties, **index}, mode=UpdateMode.REPLACE
            )
        for old in marks:
            if old != rank:
                self._delete_index(summary.key, old)
        settled = {
            "PartitionKey": SUMMARIES,
            "RowKey": summary.key,
            "indexedAt": json.dumps([rank]),
            "indexPending": False,
        }
        etag = written.get("etag") if isinstance(written, dict) else None
        if etag is None:
            return  # left pending: the next write of this event finishes it
        # Someone wrote it since: their write carries the marks and finishes the work.
        with (
            contextlib.suppress(ResourceModifiedError, ResourceNotFoundError),
            _faults("history write"),
        ):
            self._client.update_entity(
                settled,
                mode=UpdateMode.MERGE,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
            )

    def _delete_index(self, key: str, rank: str) -> None:
        for partition, row in _index_rows(key, rank):
            with _faults("history write"), contextlib.suppress(ResourceNotFoundError):
                self._client.delete_entity(partition, row)

    def scopes(self, event: str) -> list[str]:
        rows, complete = self._query(
            "PartitionKey eq @pk and RowKey gt @lo and RowKey lt @hi",
            {"pk": SUMMARIES, "lo": f"{event}.", "hi": f"{event}/"},
            MAX_SCOPES,
            select=["RowKey"],
        )
        if not complete:
            log.warning("event %s has more than %d scopes: the first shown", event, MAX_SCOPES)
        return [str(row["RowKey"]) for row in rows]

    def _listed(
        self, partition: str, lo: str, hi: str, limit: int, extra: str, parameters: dict[str, Any]
    ) -> Listing:
        """Up to ``limit`` summaries from an index, in key order, reading at most
        :data:`LISTING_PAGES` pages."""
        query = f"PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi{extra}"
        found: list[EventSummary] = []
        with _faults("history read"):
            try:
                pages = self._client.query_entities(
                    query,
                    parameters={"pk": partition, "lo": lo, "hi": hi, **parameters},
                    results_per_page=min(limit, 1000),
                ).by_page()
                for number, page in enumerate(pages):
                    if number == LISTING_PAGES:
                        log.warning("history listing stopped after %d pages", LISTING_PAGES)
                        return Listing(found, complete=False)
                    for entity in page:
                        summary = _summary_of(entity)
                        if summary is not None:
                            found.append(summary)
                        if len(found) == limit:
                            return Listing(found)
            except ResourceNotFoundError as exc:
                if not _table_missing(exc):
                    raise
        return Listing(found)

    def latest(self, query: EventQuery) -> Listing:
        lo = "0" * 19
        hi = "9" * 19 + "/"
        if query.end is not None:
            lo = f"{_LAST_RANK - time_rank(query.end):019d}"
        if query.start is not None:
            hi = f"{_LAST_RANK - time_rank(query.start) + 1:019d}"
        extra = ""
        parameters: dict[str, Any] = {}
        if query.state is not None:
            extra += " and state eq @state"
            parameters["state"] = query.state
        if query.resource_group is not None:
            extra += " and resourceGroup eq @group"
            parameters["group"] = query.resource_group.lower()
        if query.vm is not None:
            extra += f" and {vm_column(query.vm)} eq @vm"  # a digest: a safe property name
            parameters["vm"] = query.vm.lower()
        return self._listed(LATEST_FIRST, lo, hi, query.limit, extra, parameters)

    def upcoming(self, start: datetime, end: datetime, limit: int) -> list[EventSummary]:
        lo, hi = _rank(start), f"{time_rank(end) + 1:019d}"
        return self._listed(EARLIEST_FIRST, lo, hi, limit, "", {}).summaries

    # ---- retention -------------------------------------------------------------------------
    def expired(self, before: datetime, limit: int) -> list[str]:
        rows, _ = self._query(
            "PartitionKey eq @pk and lastRecorded lt @before",
            {"pk": SUMMARIES, "before": before},
            limit,
            select=["RowKey"],
        )
        return [str(row["RowKey"]) for row in rows]

    def delete(self, key: str) -> None:
        """Index rows first, then the entries, the summary last: a run cut short is found
        again by :meth:`expired` and finished."""
        stored = self.summary(key)
        if stored is not None:
            ranks = set(stored.marks)
            if stored.summary is not None:
                ranks.add(_rank(stored.summary.latest.when))
            for rank in sorted(ranks):
                self._delete_index(key, rank)
        partition = entries_partition(key)
        with _faults("history delete"):
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
                self._client.delete_entity(SUMMARIES, key)


def _marks(entity: Any) -> tuple[str, ...]:
    try:
        marks = json.loads(entity.get("indexedAt") or "[]")
    except ValueError:
        return ()
    if not isinstance(marks, list):
        return ()
    return tuple(m for m in marks if isinstance(m, str) and m.isdigit() and len(m) == 19)


def _summary_of(entity: Any) -> EventSummary | None:
    try:
        return summary_from_properties(entity)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error("history summary %s unreadable, skipped: %s", entity.get("RowKey"), exc)
        return None
