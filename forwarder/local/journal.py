"""The journal of the forwarder's actions on the VM itself (SQLite in the state directory): the
durable mirror of :class:`~sebridge.forwarder.local.store.LocalStore`.

Three tables:

- ``view``: the local actions' own view of the events (the last document's events and what is
  remembered of each EventId for its message ids), the base the next document is diffed
  against. Because it is written in the same transaction as the hook runs and preparations
  that the transitions since the previous view call for, a crash can never separate "seen"
  from "acted on": before the commit, the same transitions (same ids) are derived again from
  the older view after the restart; after it, the pending runs resume.
- ``hook_runs``: one row per (transition message id, hook), ``pending``, ``running`` (with its
  attempt) or how it ended (``succeeded``, ``failed``, ``timed-out``, ``not-started``,
  ``skipped``). A row still ``pending`` or ``running`` at start was cut short by a crash, a
  reboot or a stop and runs again (at least once: hooks must be idempotent).
- ``preparations``: per event that affects this VM, its latest snapshot (the event and the
  observer), the Scheduled/Updated the VM prepares for (its message id, the ``cause`` of
  Prepared), the cause Prepared was durably handed to the outbox for, and whether it ended.

Every write is :meth:`Journal.commit`: one transaction (:func:`sebridge.forwarder.durable.
transaction`) with ``synchronous=FULL``. A file SQLite cannot open is moved aside and a fresh
journal started (logged), so a damaged journal costs at most a re-run. Finished runs and ended
preparations are bounded (:data:`MAX_FINISHED`, :data:`MAX_PREPARATIONS`); unfinished ones are
never dropped.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sebridge.forwarder.durable import transaction

log = logging.getLogger("forwarder.hooks")

JOURNAL_FILE = "local-actions.sqlite"
MEMORY = ":memory:"
MAX_FINISHED = 5000  # finished hook runs kept (the newest); ~1 KB each
MAX_PREPARATIONS = 1000  # ended preparations kept

UNFINISHED = ("pending", "running")
FAILED = ("failed", "timed-out", "not-started")
SUCCEEDED = "succeeded"


class JournalError(Exception):
    """The journal could not be read or written (disk full, I/O error)."""


@dataclass(frozen=True)
class Run:
    """One hook for one transition: what is needed to run it again after a restart."""

    message_id: str
    hook: str
    event_key: str
    transition: str
    prepare: bool
    payload: dict[str, Any]  # {"event": IMDS fields, "observer": ..., "incarnation": n}
    status: str = "pending"
    attempts: int = 0
    detail: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.message_id, self.hook)

    @property
    def finished(self) -> bool:
        return self.status not in UNFINISHED


@dataclass(frozen=True)
class Preparation:
    event_key: str
    cause: str | None  # the message id of the Scheduled/Updated the VM prepares for
    payload: dict[str, Any]  # {"event": IMDS fields, "observer": ..., "incarnation": n}
    published: str | None  # the cause Prepared was durably handed to the outbox for
    ended: bool


@dataclass
class Snapshot:
    """Everything the journal holds, as read at start."""

    view: dict[str, Any] | None = None
    runs: list[Run] = field(default_factory=list)  # in the order they were first recorded
    preparations: list[Preparation] = field(default_factory=list)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class Journal:
    def __init__(self, directory: Path | str) -> None:
        """The journal in ``directory`` (``":memory:"``: one that lives as long as this object,
        for in-process tests)."""
        self.path: Path | str = MEMORY if directory == MEMORY else Path(directory) / JOURNAL_FILE
        self._lock = threading.Lock()
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            self._move_aside(exc)
            try:
                self._db = self._open()
            except sqlite3.Error as again:
                raise JournalError(f"cannot create {self.path}: {again}") from again
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open {self.path}: {exc}") from exc

    def _move_aside(self, exc: sqlite3.Error) -> None:
        if not isinstance(self.path, Path):
            raise JournalError(f"cannot open the journal: {exc}") from exc
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = self.path.with_name(f"{JOURNAL_FILE}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            try:
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
            except FileNotFoundError:
                pass
            except OSError as move:
                raise JournalError(f"cannot move {self.path} aside: {move}") from exc
        log.warning(
            "hook journal %s is unreadable (%s); kept as %s, starting a fresh one: hooks "
            "that were cut short before are not run again",
            self.path,
            exc,
            aside,
        )

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS hook_runs ("
                " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                " message_id TEXT NOT NULL, hook TEXT NOT NULL, event_key TEXT NOT NULL,"
                " transition TEXT NOT NULL, prepare INTEGER NOT NULL, payload TEXT NOT NULL,"
                " status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
                " detail TEXT NOT NULL DEFAULT '', updated_at TEXT NOT NULL,"
                " UNIQUE (message_id, hook))"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS preparations ("
                " event_key TEXT PRIMARY KEY, cause TEXT, payload TEXT NOT NULL,"
                " published TEXT, ended INTEGER NOT NULL DEFAULT 0, updated_at TEXT NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS view ("
                " id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL,"
                " updated_at TEXT NOT NULL)"
            )
            db.execute("SELECT count(*) FROM hook_runs").fetchone()  # a damaged file fails here
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _error(self, text: str) -> JournalError:
        return JournalError(f"{self.path}: {text}")

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return list(self._db.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise JournalError(f"{self.path}: {exc}") from exc

    # -- the one write ----------------------------------------------------------------------
    def commit(
        self,
        *,
        view: dict[str, Any] | None = None,
        runs: Sequence[Run] = (),
        preparations: Sequence[Preparation] = (),
    ) -> None:
        """Write ``view`` (if given), and each run and preparation as it is now, in one
        transaction: all of it or none. Raises JournalError (disk full, I/O error)."""
        now = _now()
        with transaction(self._db, self._lock, "journal", self._error) as db:
            if view is not None:
                db.execute(
                    "INSERT OR REPLACE INTO view (id, body, updated_at) VALUES (1, ?, ?)",
                    (_dumps(view), now),
                )
            for run in runs:
                db.execute(
                    "INSERT INTO hook_runs (message_id, hook, event_key, transition, prepare,"
                    " payload, status, attempts, detail, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    # The payload too: a run judged again (this VM's identity resolved) is
                    # run after a restart with the observer it was judged by last.
                    " ON CONFLICT (message_id, hook) DO UPDATE SET status = excluded.status,"
                    " attempts = excluded.attempts, detail = excluded.detail,"
                    " payload = excluded.payload, updated_at = excluded.updated_at",
                    (
                        run.message_id,
                        run.hook,
                        run.event_key,
                        run.transition,
                        int(run.prepare),
                        _dumps(run.payload),
                        run.status,
                        run.attempts,
                        run.detail[:1000],
                        now,
                    ),
                )
            for item in preparations:
                db.execute(
                    "INSERT OR REPLACE INTO preparations (event_key, cause, payload, published,"
                    " ended, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        item.event_key,
                        item.cause,
                        _dumps(item.payload),
                        item.published,
                        int(item.ended),
                        now,
                    ),
                )
            if runs:
                self._bound(
                    db, "hook_runs", "seq", "status NOT IN ('pending', 'running')", MAX_FINISHED
                )
            if preparations:
                self._bound(db, "preparations", "updated_at", "ended = 1", MAX_PREPARATIONS)

    @staticmethod
    def _bound(db: sqlite3.Connection, table: str, order: str, where: str, keep: int) -> None:
        (count,) = db.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()  # noqa: S608
        if count > keep:
            key = "seq" if table == "hook_runs" else "event_key"
            db.execute(
                f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table}"  # noqa: S608
                f" WHERE {where} ORDER BY {order} LIMIT ?)",
                (count - keep,),
            )

    # -- reading ------------------------------------------------------------------------------
    def load(self) -> Snapshot:
        """Everything, at start. A damaged record is left out (logged): a damaged view starts
        the view afresh, a damaged run is not run again."""
        snapshot = Snapshot()
        rows = self._read("SELECT body FROM view WHERE id = 1")
        if rows:
            try:
                view = json.loads(rows[0][0])
            except ValueError:
                view = None
            if isinstance(view, dict):
                snapshot.view = view
            else:
                log.error("the local actions' view in %s is damaged: started afresh", self.path)
        snapshot.runs = self.runs()
        snapshot.preparations = self.preparations()
        return snapshot

    def runs(self, message_id: str | None = None) -> list[Run]:
        """Every recorded run (of one transition), oldest first."""
        rows = self._read(
            "SELECT message_id, hook, event_key, transition, prepare, payload, status, attempts,"
            " detail FROM hook_runs WHERE ? IS NULL OR message_id = ? ORDER BY seq",
            (message_id, message_id),
        )
        out = []
        for (
            message_id_,
            hook,
            event_key,
            transition,
            prepare,
            payload,
            status,
            attempts,
            detail,
        ) in rows:
            try:
                data = json.loads(payload)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                log.error("hook run %s/%s has a damaged record: left out", message_id_, hook)
                continue
            out.append(
                Run(
                    message_id_,
                    hook,
                    event_key,
                    transition,
                    bool(prepare),
                    data,
                    status,
                    attempts,
                    detail,
                )
            )
        return out

    def preparations(self) -> list[Preparation]:
        rows = self._read(
            "SELECT event_key, cause, payload, published, ended FROM preparations"
            " ORDER BY updated_at"
        )
        out = []
        for event_key, cause, payload, published, ended in rows:
            try:
                data = json.loads(payload)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                log.error("preparation of %s has a damaged record: left out", event_key)
                continue
            out.append(Preparation(event_key, cause, data, published, bool(ended)))
        return out

    def preparation(self, event_key: str) -> Preparation | None:
        return next((p for p in self.preparations() if p.event_key == event_key), None)

    def close(self) -> None:
        with self._lock:
            self._db.close()
