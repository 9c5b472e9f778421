"""The hooks file (``--hooks-file``, e.g. ``/etc/sebridge/hooks.json``): what runs on the VM
when one of its events changes. Loading, validation and the ownership check; no process here
(:mod:`sebridge.forwarder.local.runner` runs them).

    {
      "schemaVersion": 1,
      "hooks": [
        {"name": "checkpoint", "on": ["Scheduled", "Updated"],
         "eventTypes": ["Reboot", "Redeploy", "Freeze"],
         "command": ["/usr/local/bin/app-checkpoint", "--fast"],
         "timeoutSeconds": 300, "prepare": true},
        {"name": "log-all", "on": ["Scheduled", "Started", "Completed", "Cancelled"],
         "command": ["/usr/local/bin/log-event"], "allEvents": true}
      ]
    }

A hook runs for the transitions in ``on`` of events whose type is in ``eventTypes`` (all types
when left out) and that affect this VM (its name in Resources, or no Resources); with
``allEvents`` for every event the VM sees (its availability set's or scale set's neighbours
too). ``command`` is an argv list run without a shell; its first element is an absolute path.
A *prepare* hook gets the VM ready for the event (checkpoint, drain the application): it runs
on Scheduled or Updated only, and when every prepare hook of a transition has succeeded the
forwarder publishes ``Prepared`` for the event.

The file decides what the forwarder runs, so a file that anyone but root could change is
refused at start (:func:`read_checked`): it and every directory above it must be owned by root
and not writable by group or others (a directory with the sticky bit, like /tmp, may be
world-writable: nobody but root can rename the root-owned entry in it). The checks cannot be
raced: the path is walked from ``/`` one component at a time, each opened relative to the one
before without following a symbolic link (``O_NOFOLLOW``; a link anywhere is refused), each
checked on its open descriptor (``fstat``), and the content is read from the very descriptor
that was checked. Nothing is ever opened again by name.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sebridge.impact import KNOWN_EVENT_TYPES

SCHEMA_VERSION = 1
MAX_FILE_BYTES = 64 * 1024
MAX_HOOKS = 32
MAX_ARGS = 64
MAX_ARG_LENGTH = 4096
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 3600.0
HOOK_TRANSITIONS = ("Scheduled", "Updated", "Started", "Completed", "Cancelled")
PREPARE_TRANSITIONS = frozenset({"Scheduled", "Updated"})
_HOOK_KEYS = frozenset(
    {"name", "on", "eventTypes", "command", "timeoutSeconds", "prepare", "allEvents"}
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class HooksFileError(ValueError):
    """The hooks file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Hook:
    name: str
    on: frozenset[str]  # transitions
    command: tuple[str, ...]
    timeout: float = DEFAULT_TIMEOUT
    event_types: frozenset[str] | None = None  # lower-case; None: every type
    prepare: bool = False
    all_events: bool = False

    def applies(self, transition: str, event_type: str, affects_this_vm: bool) -> bool:
        if transition not in self.on:
            return False
        if self.event_types is not None and event_type.lower() not in self.event_types:
            return False
        return affects_this_vm or self.all_events


@dataclass(frozen=True)
class HooksFile:
    hooks: tuple[Hook, ...]
    path: str = ""

    def matching(self, transition: str, event_type: str, affects_this_vm: bool) -> list[Hook]:
        """The hooks to run, in file order."""
        return [h for h in self.hooks if h.applies(transition, event_type, affects_this_vm)]

    def describe(self) -> dict[str, Any]:
        """For the start-up log line (the commands are the operator's own: no secrets in argv)."""
        return {
            "path": self.path,
            "hooks": [
                {
                    "name": h.name,
                    "on": sorted(h.on),
                    "prepare": h.prepare,
                    "allEvents": h.all_events,
                    "timeoutSeconds": h.timeout,
                }
                for h in self.hooks
            ],
        }


def affects(resources: Iterable[str], vm_name: str) -> bool:
    """The event names this VM (VM names are case-insensitive); no Resources means this VM."""
    names = [r.lower() for r in resources]
    return not names or vm_name.lower() in names


def _fail(where: str, problem: str) -> HooksFileError:
    return HooksFileError(f"{where}: {problem}")


def _string_list(value: object, where: str, field: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise _fail(where, f"{field} must be a non-empty list of strings")
    if not all(isinstance(item, str) and item for item in value):
        raise _fail(where, f"{field} must hold only non-empty strings")
    return list(value)


def parse_hook(obj: object, where: str) -> Hook:
    if not isinstance(obj, Mapping):
        raise _fail(where, "a hook must be a JSON object")
    unknown = sorted(set(obj) - _HOOK_KEYS)
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown} (known: {sorted(_HOOK_KEYS)})")
    name = obj.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= 64 or not set(name) <= _NAME_CHARS:
        raise _fail(where, "name must be 1-64 characters of letters, digits, '-', '_' or '.'")
    where = f"{where} ({name})"
    on = _string_list(obj.get("on"), where, "on")
    bad = [t for t in on if t not in HOOK_TRANSITIONS]
    if bad:
        raise _fail(where, f"on: unknown transition(s) {bad} (known: {list(HOOK_TRANSITIONS)})")
    event_types: frozenset[str] | None = None
    if "eventTypes" in obj:
        types = _string_list(obj["eventTypes"], where, "eventTypes")
        known = {t.lower() for t in KNOWN_EVENT_TYPES}
        unknown_types = [t for t in types if t.lower() not in known]
        if unknown_types:
            raise _fail(
                where,
                f"eventTypes: unknown event type(s) {unknown_types} "
                f"(known: {list(KNOWN_EVENT_TYPES)}; leave the key out for every type)",
            )
        event_types = frozenset(t.lower() for t in types)
    command = _string_list(obj.get("command"), where, "command")
    if len(command) > MAX_ARGS or any(len(arg) > MAX_ARG_LENGTH for arg in command):
        raise _fail(where, f"command: at most {MAX_ARGS} arguments of {MAX_ARG_LENGTH} characters")
    if any("\x00" in arg for arg in command):
        raise _fail(where, "command: an argument contains a NUL character")
    if not os.path.isabs(command[0]):
        raise _fail(
            where,
            f"command[0] must be an absolute path (no shell, no PATH lookup), not {command[0]!r}",
        )
    timeout = obj.get("timeoutSeconds", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise _fail(where, "timeoutSeconds must be a number")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise _fail(where, f"timeoutSeconds must be more than 0 and at most {MAX_TIMEOUT:g}")
    flags = {}
    for key in ("prepare", "allEvents"):
        value = obj.get(key, False)
        if not isinstance(value, bool):
            raise _fail(where, f"{key} must be true or false")
        flags[key] = value
    if flags["prepare"]:
        if not set(on) <= PREPARE_TRANSITIONS:
            raise _fail(
                where,
                "a prepare hook runs on Scheduled or Updated only (it prepares the VM before "
                f"the event starts), not on {sorted(set(on) - PREPARE_TRANSITIONS)}",
            )
        if flags["allEvents"]:
            raise _fail(where, "a prepare hook prepares this VM: it cannot set allEvents")
    return Hook(
        name=name,
        on=frozenset(on),
        command=tuple(command),
        timeout=float(timeout),
        event_types=event_types,
        prepare=flags["prepare"],
        all_events=flags["allEvents"],
    )


def parse_hooks(obj: object, where: str = "hooks file") -> HooksFile:
    if not isinstance(obj, Mapping):
        raise _fail(where, "the top level must be a JSON object")
    unknown = sorted(set(obj) - {"schemaVersion", "hooks"})
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown} (known: ['hooks', 'schemaVersion'])")
    version = obj.get("schemaVersion", SCHEMA_VERSION)
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise _fail(where, f"schemaVersion must be {SCHEMA_VERSION}")
    raw = obj.get("hooks")
    if not isinstance(raw, list):
        raise _fail(where, "hooks must be a list")
    if len(raw) > MAX_HOOKS:
        raise _fail(where, f"at most {MAX_HOOKS} hooks")
    hooks = tuple(parse_hook(item, f"{where}: hooks[{i}]") for i, item in enumerate(raw))
    names = [h.name for h in hooks]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise _fail(where, f"hook names must be unique: {doubled}")
    return HooksFile(hooks)


def _mode_problem(path: Path, st: os.stat_result, trusted: Collection[int], *, is_dir: bool) -> str:
    if st.st_uid not in trusted:
        return f"{path} is owned by uid {st.st_uid}, not root"
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (is_dir and st.st_mode & stat.S_ISVTX):
        who = (
            "group and others"
            if writable == stat.S_IWGRP | stat.S_IWOTH
            else ("its group" if writable == stat.S_IWGRP else "others")
        )
        return f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def _refused(path: Path, problem: str, what: str = "hooks file") -> HooksFileError:
    if what != "hooks file":
        return HooksFileError(
            f"{what} {path} refused: {problem}. The forwarder runs it, so only root (or the "
            "forwarder's own user) may be able to change it (chown root:root, chmod go-w on "
            "the file and its directories)"
        )
    return HooksFileError(
        f"hooks file {path} refused: {problem}. It decides what the forwarder runs, so only "
        "root may be able to change it (chown root:root, chmod go-w on the file and its "
        "directories)"
    )


def _open_in(
    directory: int | None,
    name: str,
    flags: int,
    path: Path,
    shown: Path,
    what: str = "hooks file",
) -> int:
    try:
        return os.open(name, flags, dir_fd=directory)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) or (
            exc.errno == errno.ENOTDIR and os.path.islink(shown)
        ):
            raise _refused(
                path,
                f"{shown} is a symbolic link: give the real path of the file "
                f"({os.path.realpath(path)}), so that nobody can point it elsewhere",
                what,
            ) from exc
        raise HooksFileError(f"{what} {path}: cannot check {shown}: {exc}") from exc


def open_checked(
    path: Path | str, trusted: Collection[int] = (0,), what: str = "hooks file"
) -> int:
    """A descriptor (close-on-exec) of the regular file ``path``, opened by a walk from ``/``
    that checks what it opens, not a name that could be swapped after the check: every
    directory and the file itself owned by a ``trusted`` uid and not writable by group or
    others (a sticky directory may be), no symbolic link anywhere. Raises
    :class:`HooksFileError` with the reason. The hooks file is read from it, and each hook's
    command is executed from it (``/proc/self/fd``)."""
    absolute = Path(os.path.abspath(path))
    parts = absolute.parts  # ("/", "etc", "sebridge", "hooks.json")
    if len(parts) < 2:
        raise HooksFileError(f"{what} {path}: not a file path")
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = _open_in(None, "/", dir_flags, absolute, Path("/"), what)
    shown = Path("/")
    try:
        for index, name in enumerate(parts[1:], start=1):
            problem = _mode_problem(shown, os.fstat(fd), trusted, is_dir=True)
            if problem:
                raise _refused(absolute, problem, what)
            last = index == len(parts) - 1
            shown = shown / name
            flags = (
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
                if last
                else dir_flags
            )
            child = _open_in(fd, name, flags, absolute, shown, what)
            os.close(fd)
            fd = child
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HooksFileError(f"{what} {path}: {shown} is not a regular file")
        problem = _mode_problem(shown, st, trusted, is_dir=False)
        if problem:
            raise _refused(absolute, problem, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_command(path: str, trusted: Collection[int] = (0,)) -> int:
    """A checked descriptor of a hook's command (:func:`open_checked` with the forwarder's own
    user trusted too). A symbolic link on the way (``/bin`` to ``usr/bin``) is allowed when
    every directory holding the path as written is trusted too, so nobody else can repoint
    it; the file it resolves to is walked and checked as the hooks file is."""
    owners = command_owners(trusted)
    absolute = Path(os.path.abspath(path))
    for directory in reversed(absolute.parents):
        try:
            st = os.stat(directory)
        except OSError as exc:
            raise HooksFileError(f"hook command {path}: cannot check {directory}: {exc}") from exc
        problem = _mode_problem(directory, st, owners, is_dir=True)
        if problem:
            raise _refused(absolute, problem, "hook command")
    return open_checked(os.path.realpath(absolute), owners, "hook command")


def command_owners(trusted: Collection[int] = (0,)) -> frozenset[int]:
    """Who may own a hook's command and its directories: the hooks file's owners (root) and
    the forwarder's own user."""
    return frozenset(trusted) | {os.geteuid()}


def check_command(path: str, trusted: Collection[int] = (0,)) -> None:
    """Refuse a hook command that someone else could replace (see :func:`open_checked`) or
    that is not executable."""
    fd = open_command(path, trusted)
    try:
        if not os.fstat(fd).st_mode & 0o111:
            raise HooksFileError(f"hook command {path}: not executable")
    finally:
        os.close(fd)


def read_checked(path: Path, trusted: Collection[int] = (0,)) -> bytes:
    """The hooks file's content, read from a descriptor that was checked
    (:func:`open_checked`)."""
    fd = open_checked(path, trusted)
    shown = Path(os.path.abspath(path))
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise HooksFileError(f"hooks file {path}: cannot read {shown}: {exc}") from exc
    finally:
        os.close(fd)


def check_ownership(path: Path, trusted: Collection[int] = (0,)) -> None:
    """Refuse a hooks file that anyone but root could change (see :func:`read_checked`)."""
    read_checked(path, trusted)


def load_hooks(path: Path, trusted: Collection[int] = (0,)) -> HooksFile:
    """Check, read (once, from the checked descriptor) and validate; :class:`HooksFileError`
    says what is wrong."""
    data = read_checked(path, trusted)
    if len(data) > MAX_FILE_BYTES:
        raise HooksFileError(f"hooks file {path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HooksFileError(f"hooks file {path}: not JSON: {exc}") from exc
    parsed = parse_hooks(obj, f"hooks file {path}")
    for hook in parsed.hooks:
        if not os.path.lexists(hook.command[0]):
            continue  # not installed yet: each run checks it again (and fails while missing)
        try:
            check_command(hook.command[0], trusted)
        except HooksFileError as exc:
            raise HooksFileError(f"hooks file {path}: hook {hook.name!r}: {exc}") from exc
    return HooksFile(parsed.hooks, str(path))


def main(argv: list[str] | None = None) -> int:
    """``python -m sebridge.forwarder.local.hooks_file [--content-only] FILE``: check a hooks
    file as the forwarder would at start (the installer runs it before installing one)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m sebridge.forwarder.local.hooks_file", description=main.__doc__
    )
    parser.add_argument("file", type=Path)
    parser.add_argument(
        "--content-only", action="store_true", help="skip the ownership check (not installed yet)"
    )
    args = parser.parse_args(argv)
    try:
        if args.content_only:
            with open(args.file, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise HooksFileError(f"{args.file}: larger than {MAX_FILE_BYTES} bytes")
            try:
                hooks = parse_hooks(json.loads(data), str(args.file))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise HooksFileError(f"{args.file}: not JSON: {exc}") from exc
        else:
            hooks = load_hooks(args.file)
    except (HooksFileError, OSError) as exc:
        print(f"hooks file refused: {exc}", file=sys.stderr)
        return 1
    print(f"hooks file ok: {len(hooks.hooks)} hook(s): {', '.join(h.name for h in hooks.hooks)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
