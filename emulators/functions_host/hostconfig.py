"""host.json: the options the local host honours, with the Functions defaults (pure).

Both the Service Bus extension v5 layout (flat options under extensions.serviceBus) and the
older v4 layout (messageHandlerOptions / sessionHandlerOptions / batchOptions) are read; keys
are matched case-insensitively like .NET configuration. Every option that is not honoured is
reported in `ignored` so the host can log it once instead of silently pretending.

Local defaults that differ from Azure, and why:
- maxConcurrentCalls: Azure uses 16 x cores; locally 4, since every concurrent receiver is its
  own AMQP connection to an emulator sharing two cores with everything else.
- sessionIdleTimeout: Azure waits up to the SDK try timeout (60 s) for the next message of an
  idle session; locally 2 s so a handful of session slots are not parked on finished sessions.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

DEFAULT_ROUTE_PREFIX = "api"
DEFAULT_MAX_CONCURRENT_CALLS = 4
# Hard cap per trigger: every receiver is a thread and an AMQP connection of its own here (the
# sync SDK shares neither). host.json's maxConcurrentSessions (64, sized for a burst of events)
# must fit, or the local host would not run what Azure runs.
MAX_CONCURRENT_RECEIVERS = 64
DEFAULT_MAX_CONCURRENT_SESSIONS = 8  # the extension's own default
DEFAULT_MAX_MESSAGE_BATCH_SIZE = 1000
DEFAULT_LOCK_RENEWAL = timedelta(minutes=5)
DEFAULT_SESSION_IDLE = timedelta(seconds=2)
# clientRetryOptions.tryTimeout: how long one operation may take, and so how long an accept of
# the next available session waits on the broker (AcceptNextSessionAsync waits TryTimeout).
DEFAULT_TRY_TIMEOUT = timedelta(minutes=1)

_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d{1,7}))?$")


class HostConfigError(ValueError):
    """host.json holds a value the host cannot use."""


def parse_timespan(text: Any, *, what: str) -> timedelta:
    """A .NET TimeSpan string ("[d.]hh:mm:ss[.fffffff]") as used throughout host.json."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return timedelta(seconds=text)
    match = _TIMESPAN.match(str(text).strip())
    if not match:
        raise HostConfigError(f"host.json {what}: {text!r} is not a TimeSpan like '00:05:00'")
    days, hours, minutes, seconds, fraction = match.groups()
    return timedelta(
        days=int(days or 0),
        hours=int(hours),
        minutes=int(minutes),
        seconds=int(seconds),
        microseconds=int((fraction or "0").ljust(7, "0")[:6]),
    )


@dataclass(frozen=True)
class ServiceBusOptions:
    prefetch_count: int = 0
    auto_complete: bool = True
    max_concurrent_calls: int = DEFAULT_MAX_CONCURRENT_CALLS
    max_concurrent_sessions: int = DEFAULT_MAX_CONCURRENT_SESSIONS
    max_message_batch_size: int = DEFAULT_MAX_MESSAGE_BATCH_SIZE
    max_lock_renewal: timedelta = DEFAULT_LOCK_RENEWAL
    session_idle_timeout: timedelta = DEFAULT_SESSION_IDLE
    try_timeout: timedelta = DEFAULT_TRY_TIMEOUT


@dataclass(frozen=True)
class HostConfig:
    route_prefix: str = DEFAULT_ROUTE_PREFIX
    service_bus: ServiceBusOptions = field(default_factory=ServiceBusOptions)
    functions: tuple[str, ...] | None = None  # host.json "functions": the ones to run
    ignored: tuple[str, ...] = ()  # dotted paths of options present but not honoured


def _lower_keys(section: Any, path: str) -> dict[str, Any]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise HostConfigError(f"host.json {path}: expected an object")
    return {str(k).lower(): v for k, v in section.items()}


def _int(value: Any, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise HostConfigError(f"host.json {what}: expected an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError as exc:
        raise HostConfigError(f"host.json {what}: expected an integer, got {value!r}") from exc
    if number < minimum:
        raise HostConfigError(f"host.json {what}: must be at least {minimum}, got {number}")
    return number


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    raise HostConfigError(f"host.json {what}: expected true or false, got {value!r}")


OVERRIDE_PREFIX = "AzureFunctionsJobHost__"


def with_overrides(document: Any, environ: Mapping[str, str]) -> Any:
    """host.json with the app settings that override it applied, as the Functions host does:
    ``AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentSessions=1`` sets that value
    (the path case-insensitive, the value a string, as .NET configuration reads it). A copy:
    ``document`` is not changed."""
    overrides = [
        (key[len(OVERRIDE_PREFIX) :].split("__"), value)
        for key, value in sorted(environ.items())
        if key.lower().startswith(OVERRIDE_PREFIX.lower()) and len(key) > len(OVERRIDE_PREFIX)
    ]
    if not overrides:
        return document
    result = copy.deepcopy(document) if isinstance(document, dict) else {}
    for path, value in overrides:
        section = result
        for name in path[:-1]:
            existing = next((k for k in section if str(k).lower() == name.lower()), None)
            if existing is None or not isinstance(section[existing], dict):
                existing = existing or name
                section[existing] = {}
            section = section[existing]
        leaf = next((k for k in section if str(k).lower() == path[-1].lower()), path[-1])
        section[leaf] = value
    return result


def parse_host_json(document: Any) -> HostConfig:
    """Read the options the local host honours from a parsed host.json document."""
    root = _lower_keys(document, "(root)")
    extensions = _lower_keys(root.get("extensions"), "extensions")
    ignored: list[str] = []

    http = _lower_keys(extensions.get("http"), "extensions.http")
    route_prefix = DEFAULT_ROUTE_PREFIX
    for key, value in http.items():
        if key == "routeprefix":
            route_prefix = str(value).strip("/")
        else:
            ignored.append(f"extensions.http.{key}")

    options: dict[str, Any] = {}
    sb = _lower_keys(extensions.get("servicebus"), "extensions.serviceBus")
    for key, value in sb.items():
        where = f"extensions.serviceBus.{key}"
        if key == "prefetchcount":
            options["prefetch_count"] = _int(value, where, minimum=0)
        elif key == "autocompletemessages":
            options["auto_complete"] = _bool(value, where)
        elif key == "maxconcurrentcalls":
            options["max_concurrent_calls"] = _int(value, where, minimum=1)
        elif key == "maxconcurrentsessions":
            options["max_concurrent_sessions"] = _int(value, where, minimum=1)
        elif key == "maxmessagebatchsize":
            options["max_message_batch_size"] = _int(value, where, minimum=1)
        elif key in {"maxautolockrenewalduration", "maxautorenewduration"}:
            options["max_lock_renewal"] = parse_timespan(value, what=where)
        elif key == "sessionidletimeout":
            options["session_idle_timeout"] = parse_timespan(value, what=where)
        elif key in {"messagehandleroptions", "sessionhandleroptions", "batchoptions"}:
            _read_v4_section(key, _lower_keys(value, where), where, options, ignored)
        elif key == "clientretryoptions":
            for retry_key, retry_value in _lower_keys(value, where).items():
                if retry_key == "trytimeout":
                    timeout = parse_timespan(retry_value, what=f"{where}.{retry_key}")
                    if timeout <= timedelta(0):
                        raise HostConfigError(f"host.json {where}.{retry_key}: must be positive")
                    options["try_timeout"] = timeout
                else:
                    ignored.append(f"{where}.{retry_key}")
        else:
            ignored.append(where)

    functions: tuple[str, ...] | None = None
    if "functions" in root:
        listed = root["functions"]
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            raise HostConfigError("host.json functions: expected a list of function names")
        functions = tuple(listed)

    return HostConfig(
        route_prefix=route_prefix,
        service_bus=ServiceBusOptions(**options),
        functions=functions,
        ignored=tuple(ignored),
    )


def _read_v4_section(
    section: str, values: dict[str, Any], where: str, options: dict[str, Any], ignored: list[str]
) -> None:
    # Extension v4 spelled the same knobs per handler; map them onto the v5 names.
    for key, value in values.items():
        path = f"{where}.{key}"
        if key == "autocomplete":
            options["auto_complete"] = _bool(value, path)
        elif key == "maxconcurrentcalls" and section == "messagehandleroptions":
            options["max_concurrent_calls"] = _int(value, path, minimum=1)
        elif key == "maxconcurrentsessions" and section == "sessionhandleroptions":
            options["max_concurrent_sessions"] = _int(value, path, minimum=1)
        elif key == "maxautorenewduration":
            options["max_lock_renewal"] = parse_timespan(value, what=path)
        elif key == "messagewaittimeout" and section == "sessionhandleroptions":
            options["session_idle_timeout"] = parse_timespan(value, what=path)
        elif key == "maxmessagecount" and section == "batchoptions":
            options["max_message_batch_size"] = _int(value, path, minimum=1)
        else:
            ignored.append(path)
