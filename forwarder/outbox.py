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
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from sebridge.contract.events import Envelope, Transition

log = logging.getLogger(__name__)

OUTBOX_FILE = "outbox.sqlite3"
DEFAULT_MAX_ROWS = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL UNIQUE,
    heartbeat INTEGER NOT NULL,
    envelope TEXT NOT NULL,
    enqueued_at TEXT NOT NULL,
    ready INTEGER NOT NULL DEFAULT 1
)
"""


class Outbox:
    def __init__(self, directory: Path, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        if max_rows < 1:
            raise ValueError("the outbox must hold at least one message")
        self.path = directory / OUTBOX_FILE
        self.max_rows = max_rows
        self.dropped_total = 0
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a reported transition must survive power loss
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

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
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT OR IGNORE INTO outbox"
                    " (message_id, heartbeat, envelope, enqueued_at, ready)"
                    " VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
                dropped = self._enforce_bound()
                (highest,) = self._db.execute(
                    f"SELECT COALESCE(MAX(seq), 0) FROM outbox WHERE message_id IN ({marks})",  # noqa: S608
                    ids,
                ).fetchone()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
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
        with self._lock:
            self._db.execute("UPDATE outbox SET ready = 1 WHERE ready = 0 AND seq <= ?", (up_to,))

    def recover(self, saved_up_to: int) -> tuple[int, int]:
        """After a crash: release what the saved state covers, drop the rest.
        Returns (released, dropped)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            released = self._db.execute(
                "UPDATE outbox SET ready = 1 WHERE ready = 0 AND seq <= ?", (saved_up_to,)
            ).rowcount
            dropped = self._db.execute(
                "DELETE FROM outbox WHERE ready = 0 AND seq > ?", (saved_up_to,)
            ).rowcount
            self._db.execute("COMMIT")
        return int(released), int(dropped)

    def _enforce_bound(self) -> int:
        (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        excess = count - self.max_rows
        if excess <= 0:
            return 0
        self._db.execute(
            "DELETE FROM outbox WHERE seq IN ("
            " SELECT seq FROM outbox ORDER BY heartbeat DESC, seq ASC LIMIT ?)",
            (excess,),
        )
        return int(excess)

    def peek(self, limit: int) -> list[tuple[int, Envelope]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, envelope FROM outbox WHERE ready = 1 ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return [(seq, Envelope.from_dict(json.loads(text))) for seq, text in rows]

    def remove(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        marks = ",".join("?" * len(seqs))
        with self._lock:
            self._db.execute(f"DELETE FROM outbox WHERE seq IN ({marks})", tuple(seqs))  # noqa: S608

    def depth(self) -> int:
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return int(count)
