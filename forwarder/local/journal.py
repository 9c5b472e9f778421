"""The journal of the forwarder's actions on the VM itself (SQLite in the state directory).

Two tables:

- ``hook_runs``: one row per (transition message id, hook). A row is written ``pending`` when
  the transition is observed, ``running`` (attempt + 1) just before the process starts, and
  ``succeeded``/``failed``/``timed-out``/``not-started`` when it ends. Message ids are
  deterministic, so the same transition derived again after a restart finds its row and runs
  nothing twice; a row still ``pending`` or ``running`` at start was cut short by a crash, a
  reboot or a stop and runs again (at least once: hooks must be idempotent).
- ``preparations``: per event that affects this VM, its latest snapshot (the event and the
  observer as reported), the Scheduled/Updated the VM prepares for (its message id, the
  ``cause`` of Prepared), the cause Prepared was published for, and whether the event ended
  (Completed or Cancelled). The drain probe restores its draining from here after a restart.

Every write is a committed transaction with ``synchronous=FULL``: a crash or a power loss
leaves it before or after, never half. A file SQLite cannot open is moved aside and a fresh
journal started (logged), so a damaged journal costs at most a re-run. Rows of finished runs
are bounded (:data:`MAX_FINISHED`); unfinished ones are never dropped.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("forwarder.hooks")

JOURNAL_FILE = "local-actions.sqlite"
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
    payload: dict[str, Any]  # {"event": IMDS fields, "vmName": ...}
    status: str = "pending"
    attempts: int = 0


@dataclass(frozen=True)
class Preparation:
    event_key: str
    cause: str | None  # the message id of the Scheduled/Updated the VM prepares for
    payload: dict[str, Any]  # {"event": IMDS fields, "observer": ..., "incarnation": n}
    published: str | None  # the cause Prepared was published for
    ended: bool


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Journal:
    def __init__(self, directory: Path) -> None:
        self.path = directory / JOURNAL_FILE
        self._lock = threading.Lock()
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
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
            try:
                self._db = self._open()
            except sqlite3.Error as again:
                raise JournalError(f"cannot create {self.path}: {again}") from again
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open {self.path}: {exc}") from exc

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
            db.execute("SELECT count(*) FROM hook_runs").fetchone()  # a damaged file fails here
        except sqlite3.Error:
            db.close()
            raise
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise JournalError(f"{self.path}: {exc}") from exc

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return list(self._db.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise JournalError(f"{self.path}: {exc}") from exc

    # -- hook runs ------------------------------------------------------------------------
    def record(self, runs: Sequence[Run]) -> list[Run]:
        """Write ``runs`` as pending; returns those that were new (the others ran, or are
        queued, already)."""
        new: list[Run] = []
        with self._write() as db:
            for run in runs:
                cursor = db.execute(
                    "INSERT OR IGNORE INTO hook_runs (message_id, hook, event_key, transition,"
                    " prepare, payload, status, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run.message_id,
                        run.hook,
                        run.event_key,
                        run.transition,
                        int(run.prepare),
                        json.dumps(run.payload, separators=(",", ":")),
                        "pending",
                        _now(),
                    ),
                )
                if cursor.rowcount:
                    new.append(run)
        return new

    def start(self, message_id: str, hook: str) -> int:
        """Mark the run as running; returns its attempt number (1 the first time)."""
        with self._write() as db:
            db.execute(
                "UPDATE hook_runs SET status = 'running', attempts = attempts + 1, updated_at = ?"
                " WHERE message_id = ? AND hook = ?",
                (_now(), message_id, hook),
            )
            row = db.execute(
                "SELECT attempts FROM hook_runs WHERE message_id = ? AND hook = ?",
                (message_id, hook),
            ).fetchone()
        return int(row[0]) if row else 1

    def finish(self, message_id: str, hook: str, status: str, detail: str) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE hook_runs SET status = ?, detail = ?, updated_at = ?"
                " WHERE message_id = ? AND hook = ?",
                (status, detail[:1000], _now(), message_id, hook),
            )
            finished = db.execute(
                "SELECT count(*) FROM hook_runs WHERE status NOT IN ('pending', 'running')"
            ).fetchone()[0]
            if finished > MAX_FINISHED:
                db.execute(
                    "DELETE FROM hook_runs WHERE seq IN (SELECT seq FROM hook_runs"
                    " WHERE status NOT IN ('pending', 'running') ORDER BY seq LIMIT ?)",
                    (finished - MAX_FINISHED,),
                )

    def unfinished(self) -> list[Run]:
        """Runs a crash, reboot or stop cut short (or never started), in the order observed."""
        rows = self._read(
            "SELECT message_id, hook, event_key, transition, prepare, payload, status, attempts"
            " FROM hook_runs WHERE status IN ('pending', 'running') ORDER BY seq"
        )
        out = []
        for message_id, hook, event_key, transition, prepare, payload, status, attempts in rows:
            try:
                data = json.loads(payload)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                log.error("hook run %s/%s has a damaged record: dropped", message_id, hook)
                self.finish(message_id, hook, "not-started", "damaged journal record")
                continue
            out.append(
                Run(message_id, hook, event_key, transition, bool(prepare), data, status, attempts)
            )
        return out

    def runs(self, message_id: str | None = None) -> list[Run]:
        """Every recorded run (of one transition), oldest first: for tests and diagnostics."""
        rows = self._read(
            "SELECT message_id, hook, event_key, transition, prepare, payload, status, attempts"
            " FROM hook_runs WHERE ? IS NULL OR message_id = ? ORDER BY seq",
            (message_id, message_id),
        )
        return [Run(m, h, k, t, bool(p), json.loads(d), s, a) for m, h, k, t, p, d, s, a in rows]

    def prepare_status(self, event_key: str) -> str | None:
        """The prepare hooks of the event's latest transition that had any: ``pending``,
        ``failed`` or ``succeeded``; None when no prepare hook ever ran for it."""
        rows = self._read(
            "SELECT status FROM hook_runs WHERE prepare = 1 AND event_key = ? AND message_id ="
            " (SELECT message_id FROM hook_runs WHERE prepare = 1 AND event_key = ?"
            "  ORDER BY seq DESC LIMIT 1)",
            (event_key, event_key),
        )
        if not rows:
            return None
        statuses = {row[0] for row in rows}
        if statuses & set(UNFINISHED):
            return "pending"
        if statuses & set(FAILED):
            return "failed"
        return SUCCEEDED

    # -- preparations ---------------------------------------------------------------------
    def observe(self, event_key: str, cause: str | None, payload: dict[str, Any]) -> None:
        """The event's latest snapshot; ``cause``: the VM now prepares for this Scheduled or
        Updated (None keeps the cause it had: Started)."""
        with self._write() as db:
            db.execute(
                "INSERT INTO preparations (event_key, cause, payload, published, ended,"
                " updated_at) VALUES (?, ?, ?, NULL, 0, ?) ON CONFLICT (event_key) DO UPDATE SET"
                " cause = COALESCE(excluded.cause, preparations.cause), payload = excluded.payload,"
                " ended = 0, updated_at = excluded.updated_at",
                (event_key, cause, json.dumps(payload, separators=(",", ":")), _now()),
            )

    def end(self, event_key: str) -> None:
        """The event ended (Completed or Cancelled)."""
        with self._write() as db:
            db.execute(
                "UPDATE preparations SET ended = 1, updated_at = ? WHERE event_key = ?",
                (_now(), event_key),
            )
            ended = db.execute("SELECT count(*) FROM preparations WHERE ended = 1").fetchone()[0]
            if ended > MAX_PREPARATIONS:
                db.execute(
                    "DELETE FROM preparations WHERE event_key IN (SELECT event_key FROM"
                    " preparations WHERE ended = 1 ORDER BY updated_at LIMIT ?)",
                    (ended - MAX_PREPARATIONS,),
                )

    def published(self, event_key: str, cause: str) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE preparations SET published = ?, updated_at = ? WHERE event_key = ?",
                (cause, _now(), event_key),
            )

    def preparation(self, event_key: str) -> Preparation | None:
        rows = self._read(
            "SELECT event_key, cause, payload, published, ended FROM preparations"
            " WHERE event_key = ?",
            (event_key,),
        )
        return self._preparation(rows[0]) if rows else None

    def open_preparations(self) -> list[Preparation]:
        rows = self._read(
            "SELECT event_key, cause, payload, published, ended FROM preparations"
            " WHERE ended = 0 ORDER BY updated_at"
        )
        out = []
        for row in rows:
            preparation = self._preparation(row)
            if preparation is not None:
                out.append(preparation)
        return out

    @staticmethod
    def _preparation(row: tuple[Any, ...]) -> Preparation | None:
        event_key, cause, payload, published, ended = row
        try:
            data = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        return Preparation(event_key, cause, data, published, bool(ended))

    def close(self) -> None:
        with self._lock:
            self._db.close()
