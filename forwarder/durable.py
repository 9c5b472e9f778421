"""The one way the forwarder persists: a file replaced atomically, or a SQLite transaction.

Every durable store of the forwarder goes through here: the state file (:func:`atomic_write`),
the outbox and the local actions' journal (:func:`transaction`). A crash or a power loss leaves
each write before or after, never half: the file is written to a temp file in the same
directory, fsynced, renamed over the old one, and the directory fsynced; a transaction runs
under ``synchronous=FULL`` and is committed whole or rolled back.

Each step that makes something durable is a named **write boundary** (``state.json:write``,
``state.json:rename``, ``state.json:dirsync``, ``outbox:commit``, ``journal:commit``), announced
to :func:`boundary` just before it happens. Production has no hook there; a crash test installs
one (:func:`boundaries`) that ends the process model at the k-th boundary, for every k of a
scenario in turn, or that fails a commit as a full disk would.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

BoundaryHook = Callable[[str], None]
_hook: BoundaryHook | None = None


def boundary(name: str) -> None:
    """Called just before the durable step ``name``; a test's hook may raise there."""
    hook = _hook
    if hook is not None:
        hook(name)


@contextmanager
def boundaries(hook: BoundaryHook) -> Iterator[None]:
    """Install ``hook`` at every write boundary for the ``with`` block (tests only)."""
    global _hook
    previous, _hook = _hook, hook
    try:
        yield
    finally:
        _hook = previous


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory."""
    boundary(f"{path.name}:write")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # A crash here leaves the temp file behind, as a kill would (removed at the next start).
    boundary(f"{path.name}:rename")
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    boundary(f"{path.name}:dirsync")
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


@contextmanager
def transaction(
    db: sqlite3.Connection,
    lock: threading.Lock | threading.RLock,
    store: str,
    error: Callable[[str], Exception],
) -> Iterator[sqlite3.Connection]:
    """One write transaction on ``db`` under ``lock``: committed whole at the end of the block,
    or rolled back. A SQLite failure is raised as ``error(text)`` carrying the original error
    (never the ROLLBACK's own); anything else (a crash test's) is raised as it is."""
    with lock:
        try:
            db.execute("BEGIN IMMEDIATE")
            yield db
            boundary(f"{store}:commit")
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:  # SQLite may have rolled back already (disk full)
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error as rollback_error:
                    log.debug("ROLLBACK after %r failed too: %s", exc, rollback_error)
            if isinstance(exc, sqlite3.Error):
                raise error(f"{type(exc).__name__}: {exc}") from exc
            raise
