"""Settings precedence, `%Setting%` expressions, local.settings.json and host.json parsing."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from emulators.functions_host.hostconfig import (
    DEFAULT_MAX_CONCURRENT_SESSIONS,
    HostConfigError,
    parse_host_json,
    parse_timespan,
)
from emulators.functions_host.settings import (
    EnvironOverlay,
    SettingsError,
    load_local_settings,
    merge_settings,
    parse_local_settings,
    resolve_expression,
)


def test_environment_wins_over_the_file_like_core_tools() -> None:
    merged = merge_settings({"A": "file", "B": "file", "C": "file"}, {"A": "env", "C": ""})
    assert merged.values["A"] == "env"
    assert merged.values["B"] == "file"
    assert merged.values["C"] == "file"  # an empty environment value does not shadow
    assert merged.shadowed == ("A",)


def test_in_process_settings_can_win_over_the_environment() -> None:
    merged = merge_settings({"A": "mine"}, {"A": "env"}, file_wins=True)
    assert merged.values["A"] == "mine" and merged.shadowed == ()


def test_expressions_resolve_anywhere_in_the_text() -> None:
    settings = {"Prefix": "dev-", "Topic": "events"}
    assert resolve_expression("%Prefix%%Topic%-x", settings) == "dev-events-x"
    assert resolve_expression("plain", settings) == "plain"
    with pytest.raises(SettingsError, match="'%Nope%' does not resolve to a value"):
        resolve_expression("%Nope%", settings)
    with pytest.raises(SettingsError):
        resolve_expression("%Empty%", {"Empty": ""})


def test_local_settings_format(tmp_path: Path) -> None:
    path = tmp_path / "local.settings.json"
    document = {
        "IsEncrypted": False,
        "Values": {"A": "x", "N": 3, "B": True},
        "Host": {"LocalHttpPort": 7072},
        "ConnectionStrings": {},
    }
    path.write_text(json.dumps(document))
    local = load_local_settings(path)
    assert local.values == {"A": "x", "N": "3", "B": "true"}
    assert local.local_http_port == 7072
    assert local.ignored_sections == ("ConnectionStrings",)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"IsEncrypted": True, "Values": {}}, "IsEncrypted is true"),
        ({"Values": {"A": {"nested": 1}}}, "setting 'A' must be a string"),
        ({"Values": []}, "'Values' must be an object"),
        ([], "expected a JSON object"),
    ],
)
def test_local_settings_errors_are_clear(document: object, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_local_settings(document)


def test_local_settings_bad_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "local.settings.json"
    path.write_text("{not json")
    with pytest.raises(SettingsError, match="not valid JSON"):
        load_local_settings(path)


def test_environ_overlay_restores_what_was_there() -> None:
    environ = {"KEEP": "1", "CHANGE": "old"}
    overlay = EnvironOverlay(environ)
    overlay.apply({"CHANGE": "new", "ADD": "x"})
    assert environ == {"KEEP": "1", "CHANGE": "new", "ADD": "x"}
    overlay.restore()
    assert environ == {"KEEP": "1", "CHANGE": "old"}


def test_host_json_defaults() -> None:
    config = parse_host_json({"version": "2.0"})
    assert config.route_prefix == "api"
    assert config.service_bus.auto_complete is True
    assert config.service_bus.max_concurrent_sessions == DEFAULT_MAX_CONCURRENT_SESSIONS
    assert config.functions is None and config.ignored == ()


def test_host_json_v5_flat_options() -> None:
    config = parse_host_json(
        {
            "version": "2.0",
            "functions": ["a", "b"],
            "extensions": {
                "http": {"routePrefix": "/v1/", "maxConcurrentRequests": 10},
                "serviceBus": {
                    "prefetchCount": 5,
                    "autoCompleteMessages": False,
                    "maxConcurrentCalls": 2,
                    "maxConcurrentSessions": 3,
                    "maxMessageBatchSize": 50,
                    "maxAutoLockRenewalDuration": "00:10:00",
                    "sessionIdleTimeout": "00:00:05",
                    "clientRetryOptions": {"mode": "exponential", "tryTimeout": "00:00:30"},
                },
            },
        }
    )
    sb = config.service_bus
    assert config.route_prefix == "v1"
    assert config.functions == ("a", "b")
    assert (sb.prefetch_count, sb.auto_complete, sb.max_concurrent_calls) == (5, False, 2)
    assert (sb.max_concurrent_sessions, sb.max_message_batch_size) == (3, 50)
    assert sb.max_lock_renewal == timedelta(minutes=10)
    assert sb.session_idle_timeout == timedelta(seconds=5)
    assert sb.try_timeout == timedelta(seconds=30)
    assert set(config.ignored) == {
        "extensions.http.maxconcurrentrequests",
        "extensions.serviceBus.clientretryoptions.mode",
    }


def test_host_json_v4_handler_options_map_to_the_same_knobs() -> None:
    config = parse_host_json(
        {
            "extensions": {
                "serviceBus": {
                    "sessionHandlerOptions": {
                        "maxConcurrentSessions": 2,
                        "autoComplete": False,
                        "messageWaitTimeout": "00:00:03",
                        "maxAutoRenewDuration": "00:55:00",
                    },
                    "messageHandlerOptions": {"maxConcurrentCalls": 7, "somethingElse": 1},
                }
            }
        }
    )
    sb = config.service_bus
    assert (sb.max_concurrent_sessions, sb.auto_complete, sb.max_concurrent_calls) == (2, False, 7)
    assert sb.session_idle_timeout == timedelta(seconds=3)
    assert sb.max_lock_renewal == timedelta(minutes=55)
    assert config.ignored == ("extensions.serviceBus.messagehandleroptions.somethingelse",)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"extensions": {"serviceBus": {"maxConcurrentSessions": 0}}}, "at least 1"),
        ({"extensions": {"serviceBus": {"autoCompleteMessages": "maybe"}}}, "true or false"),
        ({"extensions": {"serviceBus": {"sessionIdleTimeout": "soon"}}}, "not a TimeSpan"),
        ({"extensions": []}, "expected an object"),
        ({"functions": "a"}, "list of function names"),
    ],
)
def test_host_json_errors_are_clear(document: object, message: str) -> None:
    with pytest.raises(HostConfigError, match=message):
        parse_host_json(document)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00:05:00", timedelta(minutes=5)),
        ("1.02:03:04", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("00:00:01.5", timedelta(seconds=1.5)),
        (30, timedelta(seconds=30)),
    ],
)
def test_timespans(text: object, expected: timedelta) -> None:
    assert parse_timespan(text, what="x") == expected


def test_reconnect_backoff_grows_with_jitter_and_is_capped() -> None:
    from sebridge.retry import Backoff

    backoff = Backoff(0.5, 4.0, floor=0.25)
    delays = [backoff.next_delay() for _ in range(8)]
    ceilings = [min(4.0, 0.5 * 2 ** (i + 1)) for i in range(8)]
    assert all(0.25 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert max(delays) <= 4.0
    backoff.reset()
    assert backoff.next_delay() <= 1.0


def test_app_settings_override_host_json_as_in_azure() -> None:
    """``AzureFunctionsJobHost__<path>`` app settings override host.json values (path case-
    insensitive, value a string), and only those; the document itself is not changed."""
    from emulators.functions_host.hostconfig import with_overrides

    document = {"version": "2.0", "extensions": {"serviceBus": {"maxConcurrentSessions": 64}}}
    environ = {
        "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentSessions": "1",
        "azurefunctionsjobhost__Extensions__ServiceBus__sessionIdleTimeout": "00:00:03",
        "AzureFunctionsJobHost__extensions__http__routePrefix": "x",
        "OTHER__extensions__serviceBus__maxConcurrentCalls": "2",
    }
    config = parse_host_json(with_overrides(document, environ))
    assert config.service_bus.max_concurrent_sessions == 1
    assert config.service_bus.session_idle_timeout == timedelta(seconds=3)
    assert config.route_prefix == "x"
    assert config.service_bus.max_concurrent_calls != 2
    assert document["extensions"]["serviceBus"]["maxConcurrentSessions"] == 64
    assert with_overrides(document, {}) is document
    with pytest.raises(HostConfigError, match="at least 1"):
        parse_host_json(
            with_overrides(
                document,
                {"AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentSessions": "0"},
            )
        )
