"""`sebridge status`: what the forwarder on this VM knows and how it is doing, from its state
directory alone (no network, no IMDS call).

It reads ``state.json`` (the known events and the last transitions, saved with them, so they
survive restarts), ``outbox.sqlite3`` (pending and set-aside messages) and ``status.json`` (the
last poll and send, failures in progress, the last transition of recent events of the running
forwarder, approval commands seen; written by the forwarder every few seconds). An event is
matched to its transitions by its EventId as session ids carry it (an over-long or odd EventId
as its digest, :func:`sebridge.lifecycle.event_ref`), so each event is listed once.
Everything is read only: the database is opened with ``mode=ro`` (WAL readers never block the
writer), no file is created, moved or locked for writing, so it is safe while the forwarder
runs. A damaged or missing part is reported, never a crash.

Exit codes: 0 healthy; 1 degraded (the health rule of
:func:`~sebridge.forwarder.observability.observations.assess` fails, the forwarder is not
running, or a part of the state cannot be read); 2 no state
(the directory does not exist or holds none of the forwarder's files).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sebridge.forwarder.config import DEFAULT_STATE_DIR
from sebridge.forwarder.delivery.outbox import OUTBOX_FILE
from sebridge.forwarder.observability.observations import assess
from sebridge.forwarder.observability.status_file import STATUS_FILE, WRITE_EVERY
from sebridge.forwarder.state import MAX_STATE_BYTES, STATE_FILE, ForwarderState
from sebridge.imds import isoformat_utc
from sebridge.lifecycle import event_ref
from sebridge.text import printable
from sebridge.times import stored

EXIT_HEALTHY, EXIT_DEGRADED, EXIT_NO_STATE = 0, 1, 2
MAX_STATUS_BYTES = 1024 * 1024
ASIDE_SHOWN = 20
TRANSITIONS_SHOWN = 10  # of the last transitions, in the text report (--json: all kept)
READ_TIMEOUT_MS = 2000


@dataclass
class Report:
    state_dir: str
    reasons: list[str] = field(default_factory=list)  # why degraded
    problems: list[str] = field(default_factory=list)  # parts that could not be read
    events: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)  # newest first
    outbox_depth: int | None = None
    aside_count: int | None = None
    aside: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] | None = None
    running: bool | None = None
    no_state: bool = False

    @property
    def verdict(self) -> str:
        if self.no_state:
            return "no-state"
        return "degraded" if self.reasons or self.problems else "healthy"

    @property
    def exit_code(self) -> int:
        return {"healthy": EXIT_HEALTHY, "degraded": EXIT_DEGRADED}.get(self.verdict, EXIT_NO_STATE)

    def to_json(self) -> dict[str, Any]:
        status = self.status or {}
        return {
            "verdict": self.verdict,
            "healthy": self.verdict == "healthy",
            "reasons": self.reasons + self.problems,
            "stateDir": self.state_dir,
            "forwarder": {
                "running": self.running,
                "pid": status.get("pid"),
                "version": status.get("forwarderVersion"),
                "startedAt": status.get("startedAt"),
                "statusWrittenAt": status.get("writtenAt"),
                "lastPoll": status.get("lastPoll"),
                "lastSuccessfulPoll": status.get("lastSuccessfulPoll"),
                "pollFailures": status.get("pollFailures"),
                "lastSuccessfulSend": status.get("lastSuccessfulSend"),
                "publishFailingSince": status.get("publishFailingSince"),
                "stateSaveFailingSince": status.get("stateSaveFailingSince"),
                "outboxWriteFailingSince": status.get("outboxWriteFailingSince"),
                "lastError": status.get("lastError"),
            },
            "events": self.events,
            "lastTransitions": self.transitions,
            "outbox": {
                "depth": self.outbox_depth,
                "setAsideCount": self.aside_count,
                "setAside": self.aside,
            },
            "approvals": status.get("approvals", []),
        }


def _read_bounded(path: Path, limit: int) -> bytes:
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


def read_state(path: Path, report: Report) -> ForwarderState | None:
    try:
        return ForwarderState.from_json(json.loads(_read_bounded(path, MAX_STATE_BYTES)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, RecursionError, UnicodeDecodeError) as exc:
        report.problems.append(f"{STATE_FILE} unreadable: {type(exc).__name__}: {exc}"[:300])
        return None


def read_status(path: Path, report: Report) -> dict[str, Any] | None:
    try:
        document = json.loads(_read_bounded(path, MAX_STATUS_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, UnicodeDecodeError) as exc:
        report.problems.append(f"{STATUS_FILE} unreadable: {type(exc).__name__}: {exc}"[:300])
        return None
    if not isinstance(document, dict) or document.get("version") != 1:
        report.problems.append(f"{STATUS_FILE} is not a version 1 status document")
        return None
    return document


def _connect_ro(path: Path, *, immutable: bool) -> sqlite3.Connection:
    uri = f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")
    db = sqlite3.connect(uri, uri=True, timeout=READ_TIMEOUT_MS / 1000, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout={READ_TIMEOUT_MS}")
    db.execute("PRAGMA query_only=1")
    return db


def read_outbox(path: Path, report: Report) -> None:
    """Depth and set-aside rows, read only. A WAL database whose writer is gone has no -wal
    and -shm files, and a read-only connection may not create them: then it is opened
    ``immutable`` (nobody writes it: no locking needed)."""
    if not path.exists():
        return
    wal_present = Path(f"{path}-shm").exists()
    try:
        db = _connect_ro(path, immutable=not wal_present)
        try:
            (depth,) = db.execute("SELECT COUNT(*) FROM outbox").fetchone()
            (aside,) = db.execute("SELECT COUNT(*) FROM aside").fetchone()
            rows = db.execute(
                "SELECT message_id, reason, set_aside_at, enqueued_at FROM aside"
                " ORDER BY seq DESC LIMIT ?",
                (ASIDE_SHOWN,),
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        report.problems.append(f"{OUTBOX_FILE} unreadable: {type(exc).__name__}: {exc}"[:300])
        return
    report.outbox_depth = int(depth)
    report.aside_count = int(aside)
    report.aside = [
        {"messageId": str(m), "reason": str(r), "setAsideAt": str(t), "enqueuedAt": str(e)}
        for m, r, t, e in rows
    ]


def _alive(pid: object) -> bool | None:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process exists
    except OSError:
        return None
    return True


def collect(state_dir: Path, now: datetime | None = None) -> Report:
    now = now or datetime.now(UTC)
    report = Report(str(state_dir))
    files = [state_dir / name for name in (STATE_FILE, OUTBOX_FILE, STATUS_FILE)]
    try:
        present = state_dir.is_dir() and any(f.exists() for f in files)
    except OSError as exc:
        report.no_state = True
        report.problems.append(f"cannot look into {state_dir}: {exc}")
        return report
    if not present:
        report.no_state = True
        report.problems.append(f"no forwarder state in {state_dir}")
        return report
    state = read_state(state_dir / STATE_FILE, report)
    read_outbox(state_dir / OUTBOX_FILE, report)
    status = read_status(state_dir / STATUS_FILE, report)
    report.status = status
    # The last transition of each event, by its EventId as session ids carry it: those saved
    # with the state (every run's), then the running forwarder's (status.json) when later.
    recent: dict[str, dict[str, Any]] = {}
    if state is not None:
        for saved in state.transitions:
            recent.pop(saved.event_ref, None)
            recent[saved.event_ref] = {
                "eventId": saved.event_id,
                "transition": saved.transition,
                "messageId": saved.message_id,
                "at": isoformat_utc(saved.at),
            }
        report.transitions = [
            {
                "eventId": saved.event_id,
                "transition": saved.transition,
                "messageId": saved.message_id,
                "at": isoformat_utc(saved.at),
            }
            for saved in reversed(state.transitions)
        ]
    if status is not None:
        for item in status.get("lastTransitions") or []:
            if isinstance(item, dict) and isinstance(item.get("eventId"), str):
                ref = item["eventId"].lower()
                known = recent.get(ref)
                if known is None or _later(item.get("at"), known.get("at")):
                    recent[ref] = {**item, "eventId": (known or item)["eventId"]}
        report.running = _alive(status.get("pid"))
        if report.running is False:
            report.reasons.append(f"the forwarder (pid {status.get('pid')}) is not running")
        report.reasons += assess(status, now, slack=WRITE_EVERY + 1)
    elif not report.problems:
        report.reasons.append(
            f"no {STATUS_FILE}: the forwarder has not run with this version, or not yet"
        )
    present_refs = set()
    if state is not None:
        for event in state.events.values():
            ref = event_ref(event.event_id)
            present_refs.add(ref)
            last = recent.get(ref, {})
            report.events.append(
                {
                    "eventId": event.event_id,
                    "eventType": event.event_type,
                    "status": event.status,
                    "notBefore": isoformat_utc(event.not_before) if event.not_before else None,
                    "resources": list(event.resources),
                    "present": True,
                    "lastTransition": last.get("transition"),
                    "lastTransitionAt": last.get("at"),
                }
            )
    for ref, item in recent.items():
        if ref not in present_refs:
            report.events.append(
                {
                    "eventId": item.get("eventId") or ref,
                    "present": False,
                    "lastTransition": item.get("transition"),
                    "lastTransitionAt": item.get("at"),
                }
            )
    return report


def _later(value: object, than: object) -> bool:
    """Whether the time ``value`` is after ``than`` (an unreadable one is never later)."""
    first, second = stored(value), stored(than)
    return first is not None and (second is None or first > second)


def _ago(value: object, now: datetime) -> str:
    if not isinstance(value, str):
        return "never"
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return f"{value} ({(now - moment).total_seconds():.0f} s ago)"
    except (ValueError, TypeError):
        return value


def render(report: Report, now: datetime) -> str:
    """The report for a person: one field per line, and every line shown with its control,
    escape and bidi characters escaped (event fields, errors and reasons come from IMDS, from
    commands and from files anyone could have damaged)."""
    return "\n".join(printable(line) for line in _lines(report, now))


def _lines(report: Report, now: datetime) -> list[str]:
    data = report.to_json()
    fw = data["forwarder"]
    lines = [f"{report.verdict.upper()}  state directory {report.state_dir}"]
    lines += [f"  ! {reason}" for reason in data["reasons"]]
    if report.no_state:
        return lines
    running = {True: "running", False: "not running", None: "unknown"}[report.running]
    lines.append(f"forwarder: pid {fw['pid']} ({running}), version {fw['version']}")
    last_poll = fw.get("lastPoll") or {}
    lines.append(f"last poll: {_ago(last_poll.get('at'), now)}, result {last_poll.get('result')}")
    lines.append(f"last successful poll: {_ago(fw['lastSuccessfulPoll'], now)}")
    lines.append(f"last successful send: {_ago(fw['lastSuccessfulSend'], now)}")
    if fw.get("lastError"):
        lines.append(f"last error: {fw['lastError']}")
    outbox = data["outbox"]
    lines.append(f"outbox: {outbox['depth']} pending, {outbox['setAsideCount']} set aside")
    for row in outbox["setAside"]:
        lines.append(f"  set aside {row['messageId']} at {row['setAsideAt']}: {row['reason']}")
    lines.append(f"events: {len(data['events'])}")
    for event in data["events"]:
        what = f"{event.get('eventType')} {event.get('status')}" if event["present"] else "(gone)"
        lines.append(
            f"  {event['eventId']}  {what}  last transition {event['lastTransition']}"
            f" at {event['lastTransitionAt']}"
        )
    shown = data["lastTransitions"][:TRANSITIONS_SHOWN]
    lines.append(f"last transitions (newest first, {len(shown)} of {len(report.transitions)}):")
    for item in shown:
        lines.append(f"  {item['at']}  {item['transition']}  {item['eventId']}")
    lines.append(f"approvals seen: {len(data['approvals'])}")
    for item in data["approvals"]:
        if isinstance(item, dict):
            reason = f" ({item.get('reason')})" if item.get("reason") else ""
            lines.append(
                f"  {item.get('eventId')}: {item.get('outcome')}{reason} at {item.get('at')}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sebridge status",
        description="Show the forwarder's events, outbox, set-aside messages, last poll and "
        "send, and approvals, from its state directory (read only). Exit 0 healthy, "
        "1 degraded, 2 no state.",
    )
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("SEBRIDGE_STATE_DIR", DEFAULT_STATE_DIR),
        help="the forwarder's state directory [SEBRIDGE_STATE_DIR] (default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    now = datetime.now(UTC)
    report = collect(Path(args.state_dir), now)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(render(report, now))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
