"""The hooks file: what it may say, and the refusal of a file anyone but root could change."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sebridge.forwarder.local.hooks_file import (
    HooksFileError,
    check_ownership,
    load_hooks,
    parse_hooks,
)
from tests.support.root import skip_unless_root

NOBODY = 65534
GOOD: dict[str, Any] = {
    "schemaVersion": 1,
    "hooks": [
        {
            "name": "checkpoint",
            "on": ["Scheduled", "Updated"],
            "eventTypes": ["Reboot", "freeze"],
            "command": ["/usr/local/bin/checkpoint", "--fast"],
            "timeoutSeconds": 120,
            "prepare": True,
        },
        {
            "name": "log",
            "on": ["Started", "Completed"],
            "command": ["/bin/true"],
            "allEvents": True,
        },
    ],
}


@pytest.fixture
def safe_dir(tmp_path: Path) -> Path:
    """A root-owned 0755 directory (the tests run as root, like the installer)."""
    skip_unless_root("ownership checks create root-owned files")
    directory = tmp_path / "etc-sebridge"
    directory.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    return directory


def write(directory: Path, obj: object, mode: int = 0o644) -> Path:
    path = directory / "hooks.json"
    path.write_text(json.dumps(obj))
    os.chmod(path, mode)
    return path


def test_a_good_file_loads_with_every_field(safe_dir: Path) -> None:
    loaded = load_hooks(write(safe_dir, GOOD))
    checkpoint, log_hook = loaded.hooks
    assert checkpoint.prepare and checkpoint.timeout == 120
    assert checkpoint.event_types == frozenset({"reboot", "freeze"})
    assert checkpoint.command == ("/usr/local/bin/checkpoint", "--fast")
    assert log_hook.all_events and log_hook.event_types is None and log_hook.timeout == 60
    assert [h.name for h in loaded.matching("Scheduled", "Reboot", True)] == ["checkpoint"]
    assert loaded.matching("Scheduled", "Reboot", False) == []  # not this VM's event
    assert loaded.matching("Scheduled", "Redeploy", True) == []
    assert [h.name for h in loaded.matching("Started", "Redeploy", False)] == ["log"]


@pytest.mark.parametrize(
    ("hook", "problem"),
    [
        ({"on": ["Scheduled"], "command": ["/bin/true"]}, "name must be"),
        ({"name": "a b", "on": ["Scheduled"], "command": ["/bin/true"]}, "name must be"),
        ({"name": "x", "on": ["Approved"], "command": ["/bin/true"]}, "unknown transition"),
        ({"name": "x", "on": [], "command": ["/bin/true"]}, "on must be a non-empty list"),
        ({"name": "x", "on": ["Scheduled"], "command": "/bin/true"}, "command must be"),
        ({"name": "x", "on": ["Scheduled"], "command": ["true"]}, "absolute path"),
        ({"name": "x", "on": ["Scheduled"], "command": ["/bin/true", "a\x00b"]}, "NUL"),
        (
            {"name": "x", "on": ["Scheduled"], "command": ["/bin/true"], "timeoutSeconds": 0},
            "timeout",
        ),
        (
            {"name": "x", "on": ["Scheduled"], "command": ["/bin/true"], "timeoutSeconds": 1e9},
            "timeout",
        ),
        (
            {"name": "x", "on": ["Scheduled"], "command": ["/bin/true"], "timeoutSeconds": True},
            "timeout",
        ),
        (
            {"name": "x", "on": ["Scheduled"], "command": ["/bin/true"], "eventTypes": ["Nap"]},
            "unknown event type",
        ),
        (
            {"name": "x", "on": ["Scheduled"], "command": ["/bin/true"], "prepare": "yes"},
            "true or false",
        ),
        (
            {"name": "x", "on": ["Started"], "command": ["/bin/true"], "prepare": True},
            "Scheduled or Updated only",
        ),
        (
            {
                "name": "x",
                "on": ["Scheduled"],
                "command": ["/bin/true"],
                "prepare": True,
                "allEvents": True,
            },
            "cannot set allEvents",
        ),
        (
            {"name": "x", "on": ["Scheduled"], "command": ["/bin/true"], "shell": True},
            "unknown key",
        ),
    ],
)
def test_a_bad_hook_is_refused_with_its_reason(hook: dict[str, Any], problem: str) -> None:
    with pytest.raises(HooksFileError, match=problem):
        parse_hooks({"hooks": [hook]})


def test_duplicate_names_an_unknown_version_and_unknown_keys_are_refused() -> None:
    one = {"name": "x", "on": ["Scheduled"], "command": ["/bin/true"]}
    with pytest.raises(HooksFileError, match="unique"):
        parse_hooks({"hooks": [one, one]})
    with pytest.raises(HooksFileError, match="schemaVersion"):
        parse_hooks({"schemaVersion": 2, "hooks": []})
    with pytest.raises(HooksFileError, match="unknown key"):
        parse_hooks({"hooks": [], "allEvents": True})
    with pytest.raises(HooksFileError, match="list"):
        parse_hooks({"hooks": {}})


def test_not_json_and_too_large_are_refused(safe_dir: Path) -> None:
    path = safe_dir / "hooks.json"
    path.write_text("{not json")
    with pytest.raises(HooksFileError, match="not JSON"):
        load_hooks(path)
    path.write_text(json.dumps({"hooks": [], "pad": "x" * 70_000}))
    with pytest.raises(HooksFileError, match="larger than"):
        load_hooks(path)


def test_a_file_owned_by_another_user_is_refused(safe_dir: Path) -> None:
    path = write(safe_dir, GOOD)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(HooksFileError, match=r"owned by uid 65534, not root"):
        load_hooks(path)


@pytest.mark.parametrize(
    ("mode", "who"), [(0o664, "its group"), (0o646, "others"), (0o666, "group and others")]
)
def test_a_file_writable_by_group_or_others_is_refused(safe_dir: Path, mode: int, who: str) -> None:
    path = write(safe_dir, GOOD, mode)
    with pytest.raises(HooksFileError, match=f"writable by {who}"):
        load_hooks(path)


def test_a_directory_writable_by_others_or_owned_by_another_user_is_refused(safe_dir: Path) -> None:
    path = write(safe_dir, GOOD)
    os.chmod(safe_dir, 0o777)
    with pytest.raises(HooksFileError, match=f"{safe_dir} is writable by group and others"):
        load_hooks(path)
    os.chmod(safe_dir, 0o755)
    os.chown(safe_dir, NOBODY, 0)
    with pytest.raises(HooksFileError, match="owned by uid 65534"):
        load_hooks(path)


def test_a_sticky_world_writable_directory_above_is_accepted(safe_dir: Path) -> None:
    # /tmp is 1777: nobody but root can rename the root-owned directory in it.
    path = write(safe_dir, GOOD)
    sticky = safe_dir.parent
    os.chmod(sticky, 0o1777)
    try:
        load_hooks(path)
        os.chmod(sticky, 0o0777)  # the same without the sticky bit is not safe
        with pytest.raises(HooksFileError, match="writable by group and others"):
            load_hooks(path)
    finally:
        os.chmod(sticky, 0o755)


def test_a_symlink_is_judged_by_its_target_and_the_link_directory(
    safe_dir: Path, tmp_path: Path
) -> None:
    target = write(safe_dir, GOOD)
    link_dir = tmp_path / "links"
    link_dir.mkdir(mode=0o755)
    link = link_dir / "hooks.json"
    link.symlink_to(target)
    assert load_hooks(link).hooks
    os.chown(target, NOBODY, NOBODY)
    with pytest.raises(HooksFileError, match="owned by uid 65534"):
        load_hooks(link)
    os.chown(target, 0, 0)
    os.chmod(link_dir, 0o777)
    with pytest.raises(HooksFileError, match="writable"):
        load_hooks(link)


def test_a_missing_file_or_a_directory_is_refused(safe_dir: Path) -> None:
    with pytest.raises(HooksFileError, match="cannot check"):
        check_ownership(safe_dir / "missing.json")
    with pytest.raises(HooksFileError, match="not a regular file"):
        check_ownership(safe_dir)
