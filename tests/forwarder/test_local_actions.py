"""The local actions as the forwarder's loop sees them: flags, composition, the listener."""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from sebridge.contract.events import Transition, event_message, heartbeat_message
from sebridge.forwarder.local.actions import (
    LocalActions,
    LocalActionsError,
    LocalSettings,
    add_arguments,
    build_local_actions,
    settings_from_args,
)
from tests.forwarder.local_support import (
    OBSERVER,
    Recorder,
    imds_event,
    root_dir,
    script,
    write_hooks,
)
from tests.support.root import skip_unless_root
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
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


def test_flags_and_their_environment_variables() -> None:
    env = {
        "SEBRIDGE_HOOKS_FILE": "/etc/sebridge/hooks.json",
        "SEBRIDGE_DRAIN_PROBE_PORT": "8642",
        "SEBRIDGE_DRAIN_PROBE_ADDRESS": "10.0.0.4",
        "SEBRIDGE_DRAIN_PROBE_UPSTREAM": "http://127.0.0.1:8080/healthz",
        "SEBRIDGE_DRAIN_SECONDS": "45",
        "SEBRIDGE_DRAIN_IMPACTFUL_EVENT_TYPES": "reboot, Freeze",
        "SEBRIDGE_DRAIN_FREEZE_THRESHOLD_SECONDS": "0",
    }
    settings = parse([], env)
    assert settings.hooks_file == Path("/etc/sebridge/hooks.json")
    assert (settings.probe_port, settings.probe_address) == (8642, "10.0.0.4")
    assert settings.probe_upstream == "http://127.0.0.1:8080/healthz"
    assert settings.drain_seconds == 45
    assert settings.impact.impactful_event_types == {"Reboot", "Freeze"}
    assert settings.impact.freeze_threshold_seconds == 0
    assert parse(["--drain-probe-port", "9000"], env).probe_port == 9000  # the flag wins
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
    stop = threading.Event()
    threads = [threading.Thread(target=w, daemon=True) for w in actions.workers(stop)]
    for thread in threads:
        thread.start()
    yield actions, outbox, log
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    actions.close()


def envelope(transition: Transition, event_id: str, **fields: object):  # type: ignore[no-untyped-def]
    status = "Started" if transition in (Transition.STARTED, Transition.COMPLETED) else "Scheduled"
    return event_message(
        transition, imds_event(event_id, status=status, **fields), OBSERVER, 3, NOW
    )  # type: ignore[arg-type]


def test_the_listener_hands_each_transition_to_the_hooks_and_the_probe(
    local: tuple[LocalActions, Recorder, Path],
) -> None:
    actions, outbox, log = local
    assert actions.probe is not None
    heartbeat = heartbeat_message(
        OBSERVER,
        NOW,
        forwarder_version="x",
        last_incarnation=1,
        outbox_depth=0,
        last_successful_poll=NOW,
    )
    actions.transitions_recorded([heartbeat, envelope(Transition.SCHEDULED, A)])
    assert actions.probe.draining
    wait_until(lambda: log.exists() and f"Scheduled {A}" in log.read_text(), 10, "the hook")
    wait_until(lambda: outbox.envelopes, 10, "Prepared after the drain time")
    assert [e.subject for e in outbox.envelopes] == ["Prepared"]
    actions.transitions_recorded([envelope(Transition.COMPLETED, A)])
    assert not actions.probe.draining
    wait_until(lambda: f"Completed {A}" in log.read_text(), 10, "the Completed hook")
    assert actions.heartbeat_health() == {}


def test_reconcile_closes_the_window_between_state_file_and_journal(
    local: tuple[LocalActions, Recorder, Path],
) -> None:
    actions, _, _ = local
    assert actions.probe is not None
    actions.transitions_recorded([envelope(Transition.SCHEDULED, A)])
    assert actions.probe.draining
    # The forwarder's state says A is gone and B (this VM's, impactful) is on, though the
    # journal never heard of either change: a crash between the two writes.
    b = imds_event(B, event_type="Redeploy")
    actions.current = lambda: ({b.key: b}, OBSERVER)
    actions.polled(SimpleNamespace(last_successful_poll=None))  # a failed poll: not yet
    assert actions.probe.preparation_status(A.lower()) is not None
    actions.polled(SimpleNamespace(last_successful_poll=NOW))
    assert actions.probe.preparation_status(A.lower()) is None
    assert actions.probe.preparation_status(B.lower()) is not None
    assert actions.probe.draining
    record = actions.journal.preparation(A.lower())
    assert record is not None and record.ended
