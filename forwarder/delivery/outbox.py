"""Durable local outbox (SQLite): transitions wait here until Service Bus has them.

The poller appends, the sender drains in order. Rows survive restarts and reboots, so nothing
observed while the broker is unreachable is lost. The outbox is bounded: when full it drops
Heartbeats first (they are only liveness), then the oldest transitions, and says so loudly.
Re-appending a message id that is still pending is a no-op.

Transitions and the state that produced them must become durable together, or a crash between
the two could publish a Scheduled whose event the saved state never knew (its end would then
never be reported). So transitions go in *held* (invisible to the sender), the state file is
saved with the highest row it covers, and only then are the rows released. On start,
:meth:`recover` releases held rows the saved state covers and drops the others: the next
poll re-derives them from the saved state, or rightly never reports them.

A message that cannot be sent even alone (too large, or a value the SDK cannot encode: a row
written by an older version) is *set aside*: moved to the ``aside`` table with the reason,
where it is kept (the newest :data:`MAX_ASIDE`) for an operator or ``sebridge status``, so that
delivery of everything behind it goes on. A row that cannot even be read back is set aside too.

A damaged database file (not a database, malformed) is moved aside with a warning and the
outbox starts empty; a directory the database cannot be opened in raises
:class:`OutboxUnusable`. Every other failure of an operation raises :class:`OutboxError` with
the original SQLite error (a failed COMMIT's ROLLBACK never hides it).
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

from sebridge.contract.events import Envelope, Transition
from sebridge.forwarder.durable import transaction

log = logging.getLogger(__name__)

OUTBOX_FILE = "outbox.sqlite3"
DEFAULT_MAX_ROWS = 10_000
MAX_ASIDE = 1_000
MEMORY = ":memory:"

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id TEXT NOT NULL UNIQUE,
        heartbeat INTEGER NOT NULL,
        envelope TEXT NOT NULL,
        enqueued_at TEXT NOT NULL,
        ready INTEGER NOT NULL DEFAULT 1
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS aside (
        seq INTEGER PRIMARY KEY,
        message_id TEXT NOT NULL,
        envelope TEXT NOT NULL,
        enqueued_at TEXT NOT NULL,
        reason TEXT NOT NULL,
        set_aside_at TEXT NOT NULL
    )
    """,
)
# SQLite's names for "this file is not a usable database" (as opposed to "cannot write here").
_DAMAGED = frozenset({"SQLITE_NOTADB", "SQLITE_CORRUPT"})


# A row's session (None for a row that is not JSON: peek sets it aside).
_SESSION = "CASE WHEN json_valid({0}.envelope) THEN json_extract({0}.envelope, '$.session_id') END"
# Ready rows in order, leaving out any behind a held row of the same session.
_PEEK = (
    "SELECT seq, envelope FROM outbox o WHERE ready = 1 AND NOT EXISTS ("  # noqa: S608
    "SELECT 1 FROM outbox h WHERE h.ready = 0 AND h.seq < o.seq AND "
    f"{_SESSION.format('h')} = {_SESSION.format('o')}) ORDER BY seq LIMIT ?"
)


class OutboxError(Exception):
    """An outbox operation failed (disk full, I/O error); nothing of it took effect."""


class OutboxUnusable(OutboxError):
    """The outbox cannot be opened in its directory (read-only, no permission)."""


@dataclass(frozen=True)
class AsideRow:
    seq: int
    message_id: str
    reason: str
    set_aside_at: str


def _error_name(exc: sqlite3.Error) -> str:
    return str(getattr(exc, "sqlite_errorname", ""))


class Outbox:
    def __init__(self, directory: Path | str, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        """The outbox in ``directory`` (``":memory:"``: a database that lives as long as this
        object, for in-process tests)."""
        if max_rows < 1:
            raise ValueError("the outbox must hold at least one message")
        self.path: Path | str = MEMORY if directory == MEMORY else Path(directory) / OUTBOX_FILE
        self.max_rows = max_rows
        self.dropped_total = 0
        self.set_aside_total = 0  # since start
        self._lock = threading.RLock()
        # (pending rows, set-aside rows) as of the last write, or None: the forwarder asks
        # for both on every poll (status.json, metrics, /healthz), while an idle outbox does not
        # change; every write transaction forgets them.
        self._counts: tuple[int, int] | None = None
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            if _error_name(exc) not in _DAMAGED and not _malformed(exc):
                raise OutboxUnusable(f"cannot open {self.path}: {exc}") from exc
            self._move_damaged_aside(exc)
            try:
                self._db = self._open()
            except sqlite3.Error as again:
                raise OutboxUnusable(f"cannot open {self.path}: {again}") from again

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a reported transition must survive power loss
            (verdict,) = db.execute("PRAGMA quick_check").fetchone()
            if verdict != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {str(verdict)[:200]}")
            for statement in _SCHEMA:
                db.execute(statement)
            columns = {row[1] for row in db.execute("PRAGMA table_info(outbox)")}
            if "ready" not in columns:  # an outbox from before transitions were held
                db.execute("ALTER TABLE outbox ADD COLUMN ready INTEGER NOT NULL DEFAULT 1")
        except BaseException:
            db.close()
            raise
        return db

    def _move_damaged_aside(self, exc: sqlite3.Error) -> None:
        assert isinstance(self.path, Path)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        aside = self.path.with_name(f"{OUTBOX_FILE}.corrupt-{stamp}")
        try:
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        except OSError as move_error:
            raise OutboxUnusable(f"cannot move {self.path} aside: {move_error}") from exc
        log.warning(
            "outbox %s is damaged (%s); kept as %s, starting with an empty outbox: messages "
            "that were pending in it are not sent",
            self.path,
            exc,
            aside,
        )
        copies = sorted(self.path.parent.glob(f"{OUTBOX_FILE}.corrupt-*"))
        for old in copies[:-3]:
            old.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (:func:`sebridge.forwarder.durable.transaction`); any failure
        rolls back and is re-raised as :class:`OutboxError` carrying the original error."""
        with self._lock:
            self._counts = None  # whatever happens below, count again next time
            with transaction(self._db, self._lock, "outbox", OutboxError) as db:
                yield db

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise OutboxError(f"{type(exc).__name__}: {exc}") from exc

    def put(self, envelopes: Sequence[Envelope], *, hold: bool = False) -> int:
        """Append in order; returns the highest row number now holding one of them (0 if
        none). ``hold`` keeps them from the sender until :meth:`release`."""
        if not envelopes:
            return 0
        now = datetime.now(UTC).isoformat()
        rows = [
            (
                e.message_id,
                int(e.subject == Transition.HEARTBEAT.value),
                json.dumps(e.to_dict(), separators=(",", ":")),
                now,
                0 if hold else 1,
            )
            for e in envelopes
        ]
        ids = [e.message_id for e in envelopes]
        marks = ",".join("?" * len(ids))
        with self._transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO outbox"
                " (message_id, heartbeat, envelope, enqueued_at, ready)"
                " VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            dropped = self._enforce_bound(db)
            (highest,) = db.execute(
                f"SELECT COALESCE(MAX(seq), 0) FROM outbox WHERE message_id IN ({marks})",  # noqa: S608
                ids,
            ).fetchone()
        if dropped:
            self.dropped_total += dropped
            log.error(
                "OUTBOX FULL (%d messages): dropped the %d oldest pending messages (Heartbeats "
                "first); %d dropped since start. Service Bus has been unreachable for a long "
                "time: check connectivity and the forwarder identity's role assignments",
                self.max_rows,
                dropped,
                self.dropped_total,
            )
        return int(highest)

    def release(self, up_to: int) -> None:
        """Make held rows up to ``up_to`` visible to the sender (their state is saved)."""
        with self._transaction() as db:
            db.execute("UPDATE outbox SET ready = 1 WHERE ready = 0 AND seq <= ?", (up_to,))

    def recover(self, saved_up_to: int) -> tuple[int, int]:
        """After a crash: release what the saved state covers, drop the rest.
        Returns (released, dropped)."""
        with self._transaction() as db:
            released = db.execute(
                "UPDATE outbox SET ready = 1 WHERE ready = 0 AND seq <= ?", (saved_up_to,)
            ).rowcount
            dropped = db.execute(
                "DELETE FROM outbox WHERE ready = 0 AND seq > ?", (saved_up_to,)
            ).rowcount
        return int(released), int(dropped)

    def _enforce_bound(self, db: sqlite3.Connection) -> int:
        (count,) = db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        excess = count - self.max_rows
        if excess <= 0:
            return 0
        db.execute(
            "DELETE FROM outbox WHERE seq IN ("
            " SELECT seq FROM outbox ORDER BY heartbeat DESC, seq ASC LIMIT ?)",
            (excess,),
        )
        return int(excess)

    def peek(self, limit: int) -> list[tuple[int, Envelope]]:
        """The oldest ``limit`` rows ready to send, in order, none behind a held row of its
        session (per-session order: a Prepared put while its Scheduled is held, the state file
        failing, waits for it). A row that cannot be read back is set aside on the way (it
        would block everything behind it forever)."""
        with self._reading() as db:
            rows = db.execute(_PEEK, (limit,)).fetchall()
        out: list[tuple[int, Envelope]] = []
        for seq, text in rows:
            try:
                out.append((seq, Envelope.from_dict(json.loads(text))))
            except (ValueError, TypeError, KeyError, RecursionError) as exc:
                self.set_aside(seq, f"unreadable outbox row: {type(exc).__name__}: {exc}")
        return out

    def remove(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        marks = ",".join("?" * len(seqs))
        with self._transaction() as db:
            db.execute(f"DELETE FROM outbox WHERE seq IN ({marks})", tuple(seqs))  # noqa: S608

    def set_aside(self, seq: int, reason: str) -> None:
        """Move row ``seq`` to the aside table with ``reason`` (kept, never sent)."""
        now = datetime.now(UTC).isoformat()
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO aside"
                " (seq, message_id, envelope, enqueued_at, reason, set_aside_at)"
                " SELECT seq, message_id, envelope, enqueued_at, ?, ? FROM outbox WHERE seq = ?",
                (reason[:2000], now, seq),
            )
            db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))
            db.execute(
                "DELETE FROM aside WHERE seq NOT IN"
                " (SELECT seq FROM aside ORDER BY seq DESC LIMIT ?)",
                (MAX_ASIDE,),
            )
        self.set_aside_total += 1

    def aside(self, limit: int = 100) -> list[AsideRow]:
        """The most recently set aside messages, newest first."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT seq, message_id, reason, set_aside_at FROM aside ORDER BY seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [AsideRow(int(s), str(m), str(r), str(t)) for s, m, r, t in rows]

    def aside_count(self) -> int:
        return self._count()[1]

    def depth(self) -> int:
        return self._count()[0]

    def _count(self) -> tuple[int, int]:
        with self._reading() as db:
            if self._counts is None:
                (depth,) = db.execute("SELECT COUNT(*) FROM outbox").fetchone()
                (aside,) = db.execute("SELECT COUNT(*) FROM aside").fetchone()
                self._counts = (int(depth), int(aside))
            return self._counts


def _malformed(exc: sqlite3.DatabaseError) -> bool:
    """A damaged file on a Python whose sqlite3 errors carry no error name."""
    text = str(exc).lower()
    return any(s in text for s in ("not a database", "malformed", "quick_check"))
