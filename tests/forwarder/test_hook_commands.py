"""Hostile review item 5: a hook's command that another user could replace was run (as the
forwarder's user, root in the review): only the hooks file and its directories were checked
for ownership, command[0] only for being executable. Now the command is checked as the hooks
file is, at load (the forwarder and doctor's hooks check refuse the file) and at each run, on
the file it opens and executes from that descriptor. Each test fails on the code before."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sebridge.forwarder.local.containment import Containment
from sebridge.forwarder.local.hooks_file import Hook, HooksFileError, load_hooks
from sebridge.forwarder.local.runner import Invocation, Outcome, run_hook
from sebridge.imds import ScheduledEvent
from tests.forwarder.local_support import root_dir, script, write_hooks
from tests.support.root import requires_root

NOBODY = 65534
EVENT = ScheduledEvent.from_imds(
    {"EventId": "e-1", "EventType": "Reboot", "ResourceType": "VirtualMachine",
     "Resources": ["web-1"], "EventStatus": "Scheduled", "NotBefore": ""}
)  # fmt: skip
pytestmark = requires_root("hooks files and their commands must be root-owned")


def hooks_naming(etc: Path, command: str) -> Path:
    return write_hooks(etc, [{"name": "h", "on": ["Scheduled"], "command": [command]}])


def test_a_command_owned_by_another_user_is_refused_at_load(tmp_path: Path) -> None:
    etc = root_dir(tmp_path)
    command = script(etc, "hook.sh", "true")
    os.chown(command, NOBODY, NOBODY)
    with pytest.raises(HooksFileError, match="owned by uid 65534"):
        load_hooks(hooks_naming(etc, command))


def test_a_command_writable_by_others_or_in_an_open_directory_is_refused(tmp_path: Path) -> None:
    etc = root_dir(tmp_path)
    command = script(etc, "hook.sh", "true")
    os.chmod(command, 0o777)
    with pytest.raises(HooksFileError, match="writable by group and others"):
        load_hooks(hooks_naming(etc, command))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # no sticky bit: anyone may replace what is in it
    command = script(open_dir, "hook.sh", "true")
    with pytest.raises(HooksFileError, match="writable by"):
        load_hooks(hooks_naming(etc, command))


def test_a_command_replaced_after_load_is_not_run(tmp_path: Path) -> None:
    etc = root_dir(tmp_path)
    ran = tmp_path / "ran"
    command = script(etc, "hook.sh", f"touch {ran}")
    load_hooks(hooks_naming(etc, command))  # accepted
    os.chown(command, NOBODY, NOBODY)  # then handed to someone else
    hook = Hook("h", frozenset({"Scheduled"}), (command,), 10)
    invocation = Invocation(hook, "Scheduled", "x:Scheduled:1", EVENT, "web-1")
    result = run_hook(
        invocation,
        now=datetime.now(UTC),
        base_env={},
        containment=Containment(cgroups=False, subreaper=False),
    )
    assert result.outcome is Outcome.NOT_STARTED
    assert "owned by uid 65534" in (result.detail or "")
    assert not ran.exists()


def test_a_root_owned_command_through_a_root_owned_link_still_runs(tmp_path: Path) -> None:
    etc = root_dir(tmp_path)
    ran = tmp_path / "ran"
    command = script(etc, "hook.sh", f"touch {ran}")
    link = etc / "hook-link"
    link.symlink_to(command)
    load_hooks(hooks_naming(etc, str(link)))
    hook = Hook("h", frozenset({"Scheduled"}), (str(link),), 10)
    invocation = Invocation(hook, "Scheduled", "x:Scheduled:1", EVENT, "web-1")
    result = run_hook(invocation, now=datetime.now(UTC), base_env={})
    assert result.outcome is Outcome.SUCCEEDED, result.detail
    assert ran.exists()
