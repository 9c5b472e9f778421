"""The local actions as the forwarder's loop sees them: flags, composition, the listener."""

from __future__ import annotations

import argparse
import os
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sebridge.contract.events import Transition
from sebridge.forwarder.durable import boundaries
from sebridge.forwarder.local.actions import (
    LocalActions,
    LocalActionsError,
    LocalSettings,
    add_arguments,
    build_local_actions,
    settings_from_args,
)
from sebridge.imds import Document
from sebridge.timing import DEFAULT_LEADS
from tests.forwarder.local_support import (
    OBSERVER,
    Recorder,
    document,
    imds_event,
    root_dir,
    script,
    write_hooks,
)
from tests.support.root import skip_unless_root
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def wall() -> datetime:
    """The real time: the local actions' and the probe's own clock (no clock is injected)."""
    return datetime.now(UTC)


A = "aaaaaaaa-0000-4000-8000-000000000001"
B = "bbbbbbbb-0000-4000-8000-000000000002"


def parse(argv: list[str], env: dict[str, str] | None = None) -> LocalSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser, env or {})
    return settings_from_args(parser.parse_args(argv))


def test_everything_is_off_by_default() -> None:
    settings = parse([])
    assert not settings.enabled
    assert settings.probe_address == "0.0.0.0" and settings.drain_seconds == 30
    assert settings.impact.impactful_event_types == {"Reboot", "Redeploy", "Preempt", "Terminate"}
    assert settings.impact.freeze_threshold_seconds == 9
    assert settings.leads == DEFAULT_LEADS and settings.probe_max_unhealthy == 510


def test_flags_and_their_environment_variables() -> None:
    env = {
        "SEBRIDGE_HOOKS_FILE": "/etc/sebridge/hooks.json",
        "SEBRIDGE_DRAIN_PROBE_PORT": "8642",
        "SEBRIDGE_DRAIN_PROBE_ADDRESS": "10.0.0.4",
        "SEBRIDGE_DRAIN_PROBE_UPSTREAM": "http://127.0.0.1:8080/healthz",
        "SEBRIDGE_DRAIN_SECONDS": "45",
        "SEBRIDGE_DRAIN_IMPACTFUL_EVENT_TYPES": "reboot, Freeze",
        "SEBRIDGE_DRAIN_FREEZE_THRESHOLD_SECONDS": "0",
        "SEBRIDGE_DRAIN_LEAD": "Reboot=600,Freeze=first-sight",
        "SEBRIDGE_DRAIN_PROBE_MAX_UNHEALTHY_SECONDS": "300",
    }
    settings = parse([], env)
    assert settings.hooks_file == Path("/etc/sebridge/hooks.json")
    assert (settings.probe_port, settings.probe_address) == (8642, "10.0.0.4")
    assert settings.probe_upstream == "http://127.0.0.1:8080/healthz"
    assert settings.drain_seconds == 45
    assert settings.impact.impactful_event_types == {"Reboot", "Freeze"}
    assert settings.impact.freeze_threshold_seconds == 0
    assert settings.leads.describe() == {
        "Freeze": "first-sight",
        "Reboot": 600,
        "Redeploy": 300,
        "Preempt": "first-sight",
        "Terminate": "first-sight",
    }
    assert settings.probe_max_unhealthy == 300
    assert parse(["--drain-probe-port", "9000"], env).probe_port == 9000  # the flag wins
    assert parse(["--drain-lead", "Redeploy=60"], env).leads.lead("Reboot") == 300
    described = settings.describe()
    assert (
        described["drainProbePort"] == 8642 and described["hooksFile"] == "/etc/sebridge/hooks.json"
    )


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--drain-probe-port", "0"], "--drain-probe-port must be between 1 and 65535"),
        (["--drain-probe-port", "70000"], "--drain-probe-port must be between"),
        (["--drain-probe-port", "80.5"], "whole number"),
        (["--drain-probe-port", "http"], "must be a number"),
        (["--drain-probe-upstream", "http://127.0.0.1/"], "needs --drain-probe-port"),
        (["--drain-probe-port", "9000", "--drain-probe-upstream", "file:///etc/passwd"], "http"),
        (
            ["--drain-probe-port", "9000", "--drain-probe-upstream", "http://u:p@127.0.0.1/"],
            "credentials",
        ),
        (["--drain-seconds", "-1"], "--drain-seconds must be between 0"),
        (["--drain-impactful-event-types", "Reboot,Nap"], "unknown event types ['Nap']"),
        (["--drain-freeze-threshold-seconds", "x"], "must be a number"),
        (["--drain-probe-port", "9000", "--drain-probe-address", " "], "must not be empty"),
        (["--drain-lead", "Reboot:300"], "--drain-lead: 'Reboot:300' is not TYPE=SECONDS"),
        (["--drain-lead", "Nap=30"], "--drain-lead: unknown event type 'Nap'"),
        (["--drain-lead", "Reboot=-5"], "must be between 0 and 604800"),
        (["--drain-probe-max-unhealthy-seconds", "600"], "must be below 600 seconds"),
        (["--drain-probe-max-unhealthy-seconds", "0"], "must be more than 0"),
        (["--drain-probe-max-unhealthy-seconds", "x"], "must be a number"),
        (
            ["--drain-probe-port", "9000", "--drain-seconds", "510"],
            "must be shorter than --drain-probe-max-unhealthy-seconds",
        ),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(argv: list[str], problem: str) -> None:
    with pytest.raises(LocalActionsError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse(argv)


def test_nothing_is_built_when_nothing_is_configured(tmp_path: Path) -> None:
    assert build_local_actions(LocalSettings(), tmp_path, Recorder()) is None


def test_a_refused_hooks_file_or_a_taken_port_stops_the_start(tmp_path: Path) -> None:
    skip_unless_root("a hooks file must be root-owned")
    etc = root_dir(tmp_path)
    hooks = write_hooks(etc, [{"name": "x", "on": ["Scheduled"], "command": ["/bin/true"]}])
    os.chmod(hooks, 0o666)
    with pytest.raises(LocalActionsError, match="refused"):
        build_local_actions(LocalSettings(hooks_file=hooks), tmp_path, Recorder())
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = LocalSettings(probe_port=taken.getsockname()[1], probe_address="127.0.0.1")
        with pytest.raises(LocalActionsError, match="cannot listen"):
            build_local_actions(settings, tmp_path, Recorder())


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[LocalActions, Recorder, Path]]:
    skip_unless_root("a hooks file must be root-owned")
    etc = root_dir(tmp_path)
    log = etc / "ran.log"
    hook = script(etc, "mark.sh", f'echo "$SEBRIDGE_EVENT_TRANSITION $SEBRIDGE_EVENT_ID" >> {log}')
    hooks = write_hooks(
        etc,
        [{"name": "mark", "on": ["Scheduled", "Completed"], "command": [hook], "prepare": False}],
    )
    outbox = Recorder()
    settings = LocalSettings(
        hooks_file=hooks, probe_port=0, probe_address="127.0.0.1", drain_seconds=0.5
    )
    state_dir = tmp_path / "state-dir"
    state_dir.mkdir()
    actions = build_local_actions(settings, state_dir, outbox)
    assert actions is not None
    actions.start()
    stop = threading.Event()
    threads = [threading.Thread(target=w, daemon=True) for w in actions.workers(stop)]
    for thread in threads:
        thread.start()
    yield actions, outbox, log
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    actions.close()


def test_each_document_drives_the_hooks_the_probe_and_prepared(
    local: tuple[LocalActions, Recorder, Path],
) -> None:
    actions, outbox, log = local
    assert actions.probe is not None
    derived = actions.document_observed(document(imds_event(A)), OBSERVER, wall())
    assert [(o.transition, o.message_id) for o in derived] == [
        (Transition.SCHEDULED, f"{A}:Scheduled:1")  # the forwarder's id for the same transition
    ]
    assert actions.probe.draining
    wait_until(lambda: log.exists() and f"Scheduled {A}" in log.read_text(), 10, "the hook")
    wait_until(lambda: outbox.envelopes, 10, "Prepared after the drain time")
    assert [e.subject for e in outbox.envelopes] == ["Prepared"]
    assert actions.document_observed(document(imds_event(A)), OBSERVER, wall()) == []  # no change
    actions.document_observed(document(imds_event(A, status="Started")), OBSERVER, wall())
    assert actions.probe.draining
    actions.document_observed(document(), OBSERVER, wall())
    assert not actions.probe.draining
    wait_until(lambda: f"Completed {A}" in log.read_text(), 10, "the Completed hook")
    assert log.read_text().count(f"Scheduled {A}") == 1
    assert actions.heartbeat_health() == {}


def test_an_odd_value_blinds_nothing(local: tuple[LocalActions, Recorder, Path]) -> None:
    """Issue 22, item 3: Resources ["<this vm>", 5] and EventStatus 1 used to make the strict
    reader refuse the transition: the probe stayed 200 and no hook ran, silently."""
    actions, _, log = local
    assert actions.probe is not None
    odd = imds_event(A, resources=[OBSERVER.vm_name, 5])
    actions.document_observed(document(odd), OBSERVER, wall())
    assert actions.probe.draining
    wait_until(lambda: log.exists() and f"Scheduled {A}" in log.read_text(), 10, "the hook")
    status = Document.from_imds(
        {"DocumentIncarnation": 2, "Events": [imds_event(B).to_imds() | {"EventStatus": 1}]}
    )
    actions.document_observed(status, OBSERVER, wall())
    wait_until(lambda: f"Scheduled {B}" in log.read_text(), 10, "the hook of the second")
    assert actions.probe.draining and actions.probe.preparation_status(B) is not None


def disk_full(where: str) -> None:
    if where == "journal:commit":
        raise sqlite3.OperationalError("database or disk is full")


def test_a_journal_that_cannot_be_written_delays_nothing_and_catches_up_whole(
    local: tuple[LocalActions, Recorder, Path],
) -> None:
    """Issue 22, item 5 (in-process): with the journal's disk full, the probe still drains, the
    hooks still run and Prepared still goes out; the first write that succeeds records the whole
    current state (level, not edge)."""
    actions, outbox, log = local
    assert actions.probe is not None
    with boundaries(disk_full):
        actions.document_observed(document(imds_event(A)), OBSERVER, wall())
        assert actions.probe.draining
        wait_until(lambda: log.exists() and f"Scheduled {A}" in log.read_text(), 10, "the hook")
        wait_until(lambda: outbox.envelopes, 10, "Prepared")
        assert actions.store.behind_since is not None
        assert actions.heartbeat_health()["journalWriteFailing"] is True
        assert actions.journal.runs() == []
        written = actions.journal.load().view  # only what the start wrote: when it started
        assert written is not None and written["events"] == [] and written["startedAt"]
    actions.polled(object())  # the next tick: written again, everything at once
    assert actions.store.behind_since is None
    snapshot = actions.journal.load()
    assert snapshot.view is not None and [e["EventId"] for e in snapshot.view["events"]] == [A]
    assert [(r.hook, r.status) for r in snapshot.runs] == [("mark", "succeeded")]
    (record,) = snapshot.preparations
    assert record.published == record.cause == f"{A}:Scheduled:1"


class Crash(BaseException):
    """kill -9 at a write boundary."""


def test_a_crash_before_the_journal_commit_derives_the_same_transitions_again(
    tmp_path: Path,
) -> None:
    """Issue 22, item 2 (in-process): the view and the hook runs it calls for are one
    transaction, so a crash can only come before it (the same transitions, same ids, are
    derived again from the older view) or after it (the runs are pending in the journal)."""
    skip_unless_root("a hooks file must be root-owned")
    etc = root_dir(tmp_path)
    hooks = write_hooks(
        etc, [{"name": "prep", "on": ["Scheduled"], "command": ["/bin/true"], "prepare": True}]
    )
    settings = LocalSettings(hooks_file=hooks)

    def crash(where: str) -> None:
        raise Crash(where)

    first = build_local_actions(settings, tmp_path, Recorder())
    assert first is not None and first.hooks is not None
    first.start()
    with boundaries(crash), pytest.raises(Crash):
        first.document_observed(document(imds_event(A)), OBSERVER, NOW)
    first.journal.close()
    again = build_local_actions(settings, tmp_path, Recorder())
    assert again is not None and again.hooks is not None
    again.start()
    assert again.hooks.pending() == 0  # nothing was recorded...
    derived = again.document_observed(document(imds_event(A)), OBSERVER, NOW)
    assert [o.message_id for o in derived] == [f"{A}:Scheduled:1"]  # ...so it comes again
    assert [(r.message_id, r.status) for r in again.journal.runs()] == [
        (f"{A}:Scheduled:1", "pending")
    ]
    again.journal.close()
    after = build_local_actions(settings, tmp_path, Recorder())  # a crash after the commit
    assert after is not None and after.hooks is not None
    after.start()
    assert after.hooks.pending() == 1  # the run resumes
    assert after.document_observed(document(imds_event(A)), OBSERVER, NOW) == []
    after.journal.close()
