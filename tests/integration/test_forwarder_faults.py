"""The real `sebridge forwarder` process under the faults of issue 10, over loopback.

IMDS is tests/support/imds_stub.py (a document the test sets, and bodies that trickle, never
end, are huge or stall); the state directory is a real file system, a small tmpfs mounted for
the test where it must fill up or be read-only (CI runs as root; without the right to mount,
those tests skip and say so). Output is the dry-run's JSON lines.

- item 1: a full disk (no space, no inodes) holds a notice back only until the disk recovers:
  it goes out within the next poll, and Heartbeats report the failure while it lasts;
- item 5: out-of-range and odd field values never blind the forwarder to the other events;
- item 6: every IMDS request ends by its deadline, bodies are capped, SIGTERM ends the
  process within 5 s in every state, and commands share the 5 requests/s with the poller;
- item 7: a damaged state directory never crash-loops the forwarder; an unusable one exits
  with one clear line and exit code 73; leftovers of interrupted saves are removed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.ports import refused_port
from emulators.processes import ChildProcess, forwarder
from sebridge.contract import commands
from sebridge.contract.events import Observer, parse_message
from sebridge.forwarder.approvals.handler import CommandHandler
from sebridge.forwarder.delivery.outbox import OUTBOX_FILE, Outbox
from sebridge.forwarder.imds.client import ImdsClient
from sebridge.forwarder.imds.ratelimit import RequestLimit
from sebridge.forwarder.main import EXIT_STATE_DIR
from sebridge.forwarder.state import STATE_FILE
from tests.support.imds_stub import ImdsStub, max_in_any_window
from tests.support.root import skip_needing_root
from tests.support.waiting import wait_until

STOP_WITHIN = 5.0  # seconds from SIGTERM to exit, in every state


def reboot(event_id: str | None = None, **fields: Any) -> dict[str, Any]:
    event = {
        "EventId": event_id or str(uuid.uuid4()),
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["stub-vm"],
        "EventStatus": "Scheduled",
        "NotBefore": (datetime.now(UTC) + timedelta(minutes=10)).strftime(
            "%a, %d %b %Y %H:%M:%S GMT"
        ),
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    return event | fields


def messages(fw: ChildProcess, subject: str | None = None) -> list[dict[str, Any]]:
    return [
        m
        for m in fw.json_lines()
        if m.get("subject") != "Heartbeat" and (subject is None or m.get("subject") == subject)
    ]


def heartbeats(fw: ChildProcess) -> list[dict[str, Any]]:
    return [m for m in fw.json_lines() if m.get("subject") == "Heartbeat"]


def wait_for_message(fw: ChildProcess, event_id: str, timeout: float, subject: str = "") -> None:
    def seen() -> bool:
        return any(
            m["session_id"] == event_id.lower() and (not subject or m["subject"] == subject)
            for m in messages(fw)
        )

    assert fw.wait_for(lambda _: seen(), timeout), (
        f"no {subject or 'message'} for {event_id} in {timeout} s:\n{fw.stderr_text()[-3000:]}"
    )


def sigterm(fw: ChildProcess) -> tuple[float, int]:
    """SIGTERM; (seconds until the process exited, its exit code)."""
    assert fw.process is not None
    started = time.monotonic()
    fw.process.send_signal(signal.SIGTERM)
    code = fw.process.wait(timeout=30)
    return time.monotonic() - started, code


def peak_rss_mib(fw: ChildProcess) -> float:
    assert fw.process is not None
    for line in Path(f"/proc/{fw.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def imds() -> Iterator[ImdsStub]:
    with ImdsStub() as stub:
        yield stub


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``path`` for the block (a real small or read-only file system)."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        skip_needing_root("no mount command: cannot make a real full or read-only file system")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        skip_needing_root(f"cannot mount a tmpfs (CAP_SYS_ADMIN): {result.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(directory: Path, *, inodes: bool) -> Path:
    """Use up the file system's space (or its inodes); returns what to remove to free it."""
    filler = directory / "filler"
    filler.mkdir()
    if inodes:
        for i in range(100_000):
            try:
                (filler / str(i)).touch()
            except OSError:
                break
        else:
            raise AssertionError("the inodes never ran out")
    else:
        fd = os.open(filler / "space", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for _ in range(100_000):
                try:
                    os.write(fd, b"\0" * 4096)
                except OSError:
                    break
            else:
                raise AssertionError("the space never ran out")
        finally:
            os.close(fd)
    return filler


# -- item 1: a full state file system ----------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("options", "inodes"),
    [
        pytest.param("size=4m,mode=0700", False, id="no-space"),
        pytest.param("size=16m,nr_inodes=64,mode=0700", True, id="no-inodes"),
    ],
)
def test_a_full_disk_holds_the_notice_only_until_it_recovers(
    imds: ImdsStub, tmp_path: Path, options: str, inodes: bool
) -> None:
    with tmpfs(tmp_path / "state", options) as state:
        with forwarder(imds.url, state, heartbeat_interval=1) as fw:
            wait_until(lambda: (state / STATE_FILE).exists(), 20, "the first state save")
            filler = fill(state, inodes=inodes)
            event = reboot()
            imds.set_events([event])
            # The disk stays full for a while: many polls, and the notice must not go out.
            assert fw.wait_for(lambda _: "cannot" in fw.stderr_text(), 20), fw.stderr_text()
            time.sleep(3)
            assert messages(fw) == [], "sent before its state was durable"
            during = [h["body"]["data"]["heartbeat"].get("health", {}) for h in heartbeats(fw)]
            assert any(
                h.get("stateSaveFailing") or h.get("outboxWriteFailing") for h in during[-2:]
            ), during
            gets_before = len(imds.gets())
            shutil.rmtree(filler)
            freed = time.monotonic()
            wait_for_message(fw, event["EventId"], 20, "Scheduled")
            arrived = next(line.at for line in fw.lines if event["EventId"].lower() in line.text)
            polls = [t for t in imds.gets()[gets_before:] if freed <= t <= arrived]
            # Within the poll during which the disk recovered, or the one after it.
            assert len(polls) <= 2, (len(polls), arrived - freed)
            wait_until(
                lambda: "health" not in heartbeats(fw)[-1]["body"]["data"]["heartbeat"],
                10,
                "a healthy Heartbeat",
            )
            log = fw.stderr_text()
    assert [m["subject"] for m in messages(fw)] == ["Scheduled"]
    assert log.count("cannot save the state file") + log.count("cannot write the outbox") <= 2
    assert "Traceback" not in log


# -- item 5: one event's odd values never fail the poll for the others -------------------------

ODD_NOT_BEFORES = {
    "iso-9999-negative-offset": "9999-12-31T23:59:59-01:00",
    "rfc1123-9999-negative-offset": "Fri, 31 Dec 9999 23:59:59 -0100",
    "rfc1123-20-digit-year": "Mon, 11 Apr 20222222222222222222 22:26:58 GMT",
    "iso-20-digit-year": "20222222222222222222-04-11T22:26:58Z",
}


@pytest.mark.timeout(60)
def test_out_of_range_and_odd_values_never_blind_the_forwarder(
    imds: ImdsStub, tmp_path: Path
) -> None:
    odd = [reboot(NotBefore=value, Description=name) for name, value in ODD_NOT_BEFORES.items()]
    odd += [
        reboot(EventType=42, Resources="stub-vm", Description="non-string type"),
        reboot(EventStatus=None, DurationInSeconds=3_000_000_000, Description="no status"),
        reboot(EventSource=["x"], Description="\ud800 a lone surrogate"),
    ]
    genuine = reboot()
    imds.set_events([*odd, genuine])
    with forwarder(imds.url, tmp_path) as fw:
        for event in [*odd, genuine]:
            wait_for_message(fw, event["EventId"], 20, "Scheduled")
        time.sleep(1)
        log = fw.stderr_text()
        got = {m["session_id"]: m for m in messages(fw)}
    assert "poll failed" not in log and "Traceback" not in log
    assert len(messages(fw)) == len(odd) + 1
    for event in odd[:4]:
        data = got[event["EventId"].lower()]["body"]["data"]
        assert data["notBefore"] is None and data["NotBefore"] == event["NotBefore"]
    assert got[genuine["EventId"].lower()]["body"]["data"]["notBefore"] is not None
    props = got[odd[5]["EventId"].lower()]["application_properties"]
    assert "durationInSeconds" not in props  # outside int32: left out, not sent broken
    # Published with the IMDS values verbatim; a consumer reads every one (issue 22, item 3:
    # the one tolerant reader), and names each value it normalised in the message's warnings.
    odd_fields = {
        odd[4]["EventId"].lower(): ["data.EventType: 42", 'data.Resources: "stub-vm"'],
        odd[5]["EventId"].lower(): ["data.EventStatus: missing"],
        odd[6]["EventId"].lower(): ['data.EventSource: ["x"] is not a string: dropped'],
    }
    odd_fields |= {e["EventId"].lower(): ["data.NotBefore: "] for e in odd[:4]}
    for key, message in got.items():
        parsed = parse_message(json.dumps(message["body"]).encode())
        assert parsed.event is not None and parsed.event.key == key
        for expected in odd_fields.get(key, []):
            assert any(w.startswith(expected) for w in parsed.warnings), (expected, parsed.warnings)
    assert parse_message(json.dumps(got[genuine["EventId"].lower()]["body"])).warnings == ()
    # The forwarder says each odd value once (not at every poll), naming the event and field.
    for expected in ("EventType: 42 is not a string", 'Resources: "stub-vm" is not a list'):
        assert log.count(expected) == 1, log[-3000:]


@pytest.mark.timeout(60)
def test_a_document_incarnation_that_is_not_an_integer_hides_no_event(
    imds: ImdsStub, tmp_path: Path
) -> None:
    """Issue 22, item 14: one odd DocumentIncarnation used to refuse the whole document (every
    poll failed, no event was reported); now it reads as null, said once, and nothing is lost."""
    event = reboot()
    imds.incarnation_as = "seven"
    imds.set_events([event])
    with forwarder(imds.url, tmp_path) as fw:
        wait_for_message(fw, event["EventId"], 20, "Scheduled")
        wait_until(lambda: len(imds.gets()) >= 4, 20, "more polls")
        log = fw.stderr_text()
        (message,) = messages(fw)
    assert message["body"]["data"]["documentIncarnation"] is None
    assert "poll failed" not in log and "Traceback" not in log
    assert log.count('DocumentIncarnation: "seven" is not an integer: read as null') == 1, log


# -- item 6: bounded IMDS requests and a bounded stop -------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_trickling_body_ends_by_the_deadline_and_polling_goes_on(
    imds: ImdsStub, tmp_path: Path
) -> None:
    with forwarder(imds.url, tmp_path) as fw:
        wait_until(lambda: len(imds.gets()) >= 2, 20, "the first polls")
        imds.trickle_every = 3.0
        imds.mode = "trickle"
        started = time.monotonic()
        assert fw.wait_for(lambda _: "did not answer within 10.0 s" in fw.stderr_text(), 25), (
            fw.stderr_text()[-2000:]
        )
        took = time.monotonic() - started
        imds.mode = "normal"
        event = reboot()
        imds.set_events([event])
        wait_for_message(fw, event["EventId"], 20, "Scheduled")
    assert took <= 10 + 5, took  # one 10 s deadline (and the poll interval before it)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["endless", "huge"])
def test_an_endless_or_huge_body_is_refused_at_the_cap(
    imds: ImdsStub, tmp_path: Path, mode: str
) -> None:
    with forwarder(imds.url, tmp_path) as fw:
        wait_until(lambda: len(imds.gets()) >= 2, 20, "the first polls")
        imds.mode = mode
        assert fw.wait_for(lambda _: fw.stderr_text().count("IMDS body refused") >= 3, 40), (
            fw.stderr_text()[-2000:]
        )
        rss = peak_rss_mib(fw)
        imds.mode = "normal"
        event = reboot()
        imds.set_events([event])
        wait_for_message(fw, event["EventId"], 20, "Scheduled")
    assert rss < 120, f"peak RSS {rss:.0f} MiB"  # a 1 MiB cap; about 35 MiB is the baseline


STOP_STATES = [
    pytest.param("normal", False, id="idle"),
    pytest.param("trickle", True, id="mid-trickle"),
    pytest.param("stall-body", True, id="body-stalled"),
    pytest.param("stall", False, id="first-call-stalled-125s-allowance"),
]


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize(("mode", "after_first_poll"), STOP_STATES)
def test_sigterm_ends_the_process_within_5_seconds(
    imds: ImdsStub, tmp_path: Path, mode: str, after_first_poll: bool
) -> None:
    fw = forwarder(imds.url, tmp_path, poll_interval=1.0)
    if not after_first_poll:
        imds.mode = mode
    with fw:
        wait_until(lambda: len(imds.gets()) >= 1, 20, "the first poll")
        if after_first_poll:
            imds.mode = mode
            count = len(imds.gets())
            wait_until(lambda: len(imds.gets()) > count, 10, "a poll in the new mode")
        time.sleep(2)  # well inside the stalled request
        took, code = sigterm(fw)
        log = fw.stderr_text()
    assert took < STOP_WITHIN, (took, log[-2000:])
    assert code == 0, log[-2000:]
    assert "stopping" in log


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_sigterm_ends_the_process_while_service_bus_is_unreachable(
    imds: ImdsStub, tmp_path: Path
) -> None:
    """Not dry-run: the sender and the approvals receiver keep trying a broker that is not
    there (a closed loopback port), with an event pending."""
    with refused_port() as port:
        _sigterm_while_unreachable(imds, tmp_path, port)


def _sigterm_while_unreachable(imds: ImdsStub, tmp_path: Path, port: int) -> None:
    connection = (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey=x;"
        "UseDevelopmentEmulator=true"
    )
    imds.set_events([reboot()])
    fw = forwarder(
        imds.url, tmp_path, "--connection-string", connection, dry_run=False, poll_interval=1.0
    )
    with fw:
        assert fw.wait_for(lambda _: "publish failed" in fw.stderr_text(), 40), fw.stderr_text()[
            -2000:
        ]
        time.sleep(1)
        took, code = sigterm(fw)
        log = fw.stderr_text()
    assert took < STOP_WITHIN, (took, log[-2000:])
    assert code == 0, log[-2000:]


def _command(event_id: str) -> bytes:
    expires = datetime.now(UTC) + timedelta(minutes=10)
    return commands.approve_command(event_id, "ops", "flood", expires).body_bytes()


class _Sink:
    observer = Observer(vm_name="stub-vm")

    def enqueue(self, envelope: Any) -> None:
        return None

    def life_of(self, key: str) -> None:
        return None


@pytest.mark.timeout(60)
def test_a_command_spends_at_most_its_budget_on_a_trickling_imds(imds: ImdsStub) -> None:
    imds.set_events([reboot()])
    imds.mode = "trickle"
    handler = CommandHandler(_Sink(), ImdsClient(imds.url), budget=3.0)
    started = time.monotonic()
    outcome = handler.handle(_command(str(uuid.uuid4())))
    took = time.monotonic() - started
    assert outcome.action == "abandon" and outcome.reason == "ImdsUnavailable"
    assert took <= 3.0 + 0.5, took  # the whole budget, however slowly IMDS answers


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_flood_of_commands_never_drives_imds_above_5_per_second(imds: ImdsStub) -> None:
    """The poller and the approvals handler share one limit (as main.py wires them): 60
    commands for unknown events, each re-reading the document, while the poller polls at
    1 Hz. At most 5 requests start in any one second, and the poller is never starved."""
    limit = RequestLimit()
    stop = threading.Event()
    poller = ImdsClient(imds.url, limit=limit, priority=True, cancel=stop)
    polled: list[float] = []

    def poll() -> None:
        while not stop.wait(max(0.0, (polled[-1] + 1.0 if polled else 0) - time.monotonic())):
            poller.get_document()
            polled.append(time.monotonic())

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    handler = CommandHandler(_Sink(), ImdsClient(imds.url, limit=limit, cancel=stop))
    outcomes = [handler.handle(_command(str(uuid.uuid4()))) for _ in range(60)]
    stop.set()
    thread.join(5)
    assert {o.reason for o in outcomes} == {commands.EVENT_NOT_FOUND}
    assert max_in_any_window(imds.gets()) <= 5
    gaps = [b - a for a, b in itertools.pairwise(polled)]
    assert len(polled) >= 10 and max(gaps) < 1.5, gaps


# -- item 7: a damaged or unusable state directory ---------------------------------------------


def _valid_outbox(state: Path) -> None:
    outbox = Outbox(state)
    outbox.close()


DAMAGE = {
    "garbage-outbox": lambda state: (state / OUTBOX_FILE).write_bytes(b"\x00garbage" * 4096),
    "truncated-outbox": lambda state: (
        _valid_outbox(state),
        (state / OUTBOX_FILE).write_bytes((state / OUTBOX_FILE).read_bytes()[:1000]),
    ),
    "state-seq-10-to-the-20": lambda state: (state / STATE_FILE).write_text(
        '{"version": 1, "incarnation": 3, "outboxSeq": 100000000000000000000, "events": []}'
    ),
    "state-100000-levels": lambda state: (state / STATE_FILE).write_text(
        '{"version": 1, "events": ' + "[" * 100_000 + "]" * 100_000 + "}"
    ),
    "state-year-9999-with-an-offset": lambda state: (state / STATE_FILE).write_text(
        json.dumps(
            {
                "version": 1,
                "incarnation": 1,
                "outboxSeq": 0,
                "observedAt": "9999-12-31T23:59:59-01:00",
                "events": [reboot(NotBefore="9999-12-31T23:59:59-01:00")],
            }
        )
    ),
    "state-truncated": lambda state: (state / STATE_FILE).write_text('{"version": 1, "eve'),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_state_directory_starts_fresh_instead_of_crash_looping(
    imds: ImdsStub, tmp_path: Path, damage: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    DAMAGE[damage](state)
    for i in range(3):  # leftovers of saves a crash interrupted
        (state / f".{STATE_FILE}.x{i}.tmp").write_text("{")
    event = reboot()
    imds.set_events([event])
    with forwarder(imds.url, state) as fw:
        wait_for_message(fw, event["EventId"], 30, "Scheduled")
        log = fw.stderr_text()
        assert fw.alive
    assert "Traceback" not in log
    assert not list(state.glob(f".{STATE_FILE}.*.tmp"))
    if "outbox" in damage:
        assert "is damaged" in log and list(state.glob(f"{OUTBOX_FILE}.corrupt-*"))
    elif damage != "state-year-9999-with-an-offset":  # that one is absurd but readable
        assert "is unreadable" in log and list(state.glob(f"{STATE_FILE}.corrupt-*"))


@pytest.mark.timeout(60)
def test_a_read_only_state_directory_exits_73_with_one_clear_line(
    imds: ImdsStub, tmp_path: Path
) -> None:
    with tmpfs(tmp_path / "state", "ro,size=1m") as state:
        fw = forwarder(imds.url, state)
        with fw:
            assert fw.process is not None
            code = fw.process.wait(timeout=30)
            log = fw.stderr_text()
    assert code == EXIT_STATE_DIR, log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "cannot be used" in errors[0], log
    assert "Read-only file system" in errors[0]
    assert "Traceback" not in log


@pytest.mark.timeout(60)
def test_a_state_directory_that_is_a_file_exits_73(imds: ImdsStub, tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
    fw = forwarder(imds.url, tmp_path / "state")
    with fw:
        assert fw.process is not None
        assert fw.process.wait(timeout=30) == EXIT_STATE_DIR
        log = fw.stderr_text()
    assert "cannot be used" in log and "Traceback" not in log
