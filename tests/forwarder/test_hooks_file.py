"""The hooks file: what it may say, and the refusal of a file anyone but root could change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
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
from tests.support.waiting import wait_until

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


def test_a_symbolic_link_anywhere_on_the_path_is_refused(safe_dir: Path, tmp_path: Path) -> None:
    """A link can be pointed elsewhere after it was checked: the file is named by its real
    path, whoever owns the link (root's included), and whatever it points at."""
    target = write(safe_dir, GOOD)
    links = tmp_path / "links"
    links.mkdir(mode=0o755)
    (links / "hooks.json").symlink_to(target)
    with pytest.raises(HooksFileError, match=r"links/hooks\.json is a symbolic link"):
        load_hooks(links / "hooks.json")
    (tmp_path / "dir-link").symlink_to(safe_dir)  # a link to a directory above the file
    with pytest.raises(HooksFileError, match="dir-link is a symbolic link"):
        load_hooks(tmp_path / "dir-link" / "hooks.json")
    assert load_hooks(target).hooks  # the real path is fine


def test_a_fifo_is_refused_without_waiting_for_a_writer(safe_dir: Path) -> None:
    os.mkfifo(safe_dir / "hooks.json", 0o644)
    with pytest.raises(HooksFileError, match="not a regular file"):
        load_hooks(safe_dir / "hooks.json")


ATTACKER = """
import os, sys, time
sticky, evil, good, stop = sys.argv[1:5]
link = os.path.join(sticky, "hooks.json")
tmp = os.path.join(sticky, ".flip")
deadline = time.monotonic() + 60
for i in range(1_000_000):
    if os.path.exists(stop) or time.monotonic() > deadline:
        break
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(evil if i % 2 else good, tmp)
    os.replace(tmp, link)
"""


def test_a_user_flipping_a_symlink_never_gets_their_file_loaded(
    safe_dir: Path, tmp_path: Path
) -> None:
    """Issue 22, item 6: a symlink owned by another user in a sticky world-writable directory
    was accepted (the check skipped links and judged the target), and the file was opened again
    by name after the check: flipping the link, a non-root user had their file loaded (77 to
    851 of 3,000 loads). Here a real other user (nobody) flips it while root loads 3,000 times:
    not one load takes their file."""
    good = write(safe_dir, GOOD)
    reachable = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own directories are 0700
    os.chmod(reachable, 0o755)
    sticky = reachable / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    evil = sticky / "evil.json"
    evil_hooks = {"hooks": [{"name": "evil", "on": ["Scheduled"], "command": ["/tmp/evil"]}]}
    evil.write_text(json.dumps(evil_hooks))
    os.chown(evil, NOBODY, NOBODY)
    os.chmod(evil, 0o644)
    link = sticky / "hooks.json"
    link.symlink_to(good)
    os.lchown(link, NOBODY, NOBODY)
    stop = reachable / "stop"
    python = shutil.which("python3", path="/usr/bin:/bin")  # one another user may run
    if python is None:
        pytest.skip("no system python3 for the other user to run")
    attacker = subprocess.Popen(
        [python, "-I", "-c", ATTACKER, str(sticky), str(evil), str(good), str(stop)],
        user=NOBODY,
        group=NOBODY,
        cwd="/",
    )
    loaded: list[str] = []
    refused: list[str] = []
    try:
        wait_until(lambda: (sticky / ".flip").exists() or attacker.poll() is not None, 10, "flips")
        assert attacker.poll() is None, "the attacker could not run"
        for _ in range(3000):
            try:
                loaded.append(load_hooks(link).hooks[0].name)
            except HooksFileError as exc:
                refused.append(str(exc))
    finally:
        stop.touch()
        attacker.wait(timeout=30)
        shutil.rmtree(reachable, ignore_errors=True)
    assert "evil" not in loaded
    assert loaded == [] and all("symbolic link" in r for r in refused)


def test_a_missing_file_or_a_directory_is_refused(safe_dir: Path) -> None:
    with pytest.raises(HooksFileError, match="cannot check"):
        check_ownership(safe_dir / "missing.json")
    with pytest.raises(HooksFileError, match="not a regular file"):
        check_ownership(safe_dir)
