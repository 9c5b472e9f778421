"""Binding discovery, settings resolution and signature checks on the test apps (no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest
from apps import bad_app, http_app, sb_app

from emulators.functions_host import loader
from emulators.functions_host.bindings import (
    BindingError,
    HttpOutput,
    HttpTrigger,
    ServiceBusOutput,
    ServiceBusTrigger,
    discover,
    select,
)
from emulators.functions_host.connection import ConnectionStringConnection, IdentityConnection
from emulators.functions_host.invoke import FunctionInvoker, FunctionLoadError

SETTINGS = {
    "FhServiceBus": "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=secret",
    "FhTopicName": "fh-events",
}


def _indexed(module: object) -> list[loader.IndexedFunction]:
    return loader.index(loader.find_app(module), Path("."))  # type: ignore[arg-type]


def _specs(module: object, settings: dict[str, str]) -> dict[str, object]:
    return {s.name: s for s in discover([f.metadata for f in _indexed(module)], settings)}


def test_service_bus_triggers_are_discovered_with_settings_resolved() -> None:
    specs = _specs(sb_app, SETTINGS)
    assert set(specs) == {
        "capture",
        "always_fails",
        "ordered",
        "relay",
        "async_handler",
        "slow",
        "batch",
        "ping",
    }
    assert specs["batch"].trigger.cardinality == "many"  # type: ignore[attr-defined]

    capture = specs["capture"].trigger  # type: ignore[attr-defined]
    assert isinstance(capture, ServiceBusTrigger)
    assert (capture.topic, capture.subscription, capture.queue) == ("fh-events", "capture", None)
    assert capture.entity == "fh-events/Subscriptions/capture"
    assert capture.sessions is False and capture.cardinality == "one"
    assert isinstance(capture.connection, ConnectionStringConnection)

    ordered = specs["ordered"].trigger  # type: ignore[attr-defined]
    assert isinstance(ordered, ServiceBusTrigger) and ordered.sessions is True

    relay = specs["relay"]
    assert relay.trigger.queue == "relay-in"  # type: ignore[attr-defined]
    (output,) = relay.outputs  # type: ignore[attr-defined]
    assert isinstance(output, ServiceBusOutput)
    assert (output.param, output.queue, output.topic) == ("out", "relay-out", None)


def test_http_trigger_route_methods_and_return_binding() -> None:
    specs = _specs(http_app, {})
    echo = specs["echo"]
    assert isinstance(echo.trigger, HttpTrigger)  # type: ignore[attr-defined]
    assert echo.trigger.route == "echo/{name}/{id:int?}"  # type: ignore[attr-defined]
    assert echo.trigger.methods == ("GET", "POST")  # type: ignore[attr-defined]
    assert echo.outputs == (HttpOutput(param="$return"),)  # type: ignore[attr-defined]
    # No methods given: every method is allowed, as in Azure.
    assert "DELETE" in specs["boom"].trigger.methods  # type: ignore[attr-defined]


def test_unresolvable_setting_names_the_expression() -> None:
    with pytest.raises(BindingError) as info:
        _specs(sb_app, {"FhServiceBus": SETTINGS["FhServiceBus"]})
    assert "'%FhTopicName%' does not resolve to a value" in str(info.value)
    # Both topic triggers are reported, not only the first.
    assert sum("%FhTopicName%" in p for p in info.value.problems) == 2


def test_identity_connection_from_fully_qualified_namespace() -> None:
    settings = {
        "FhServiceBus__fullyQualifiedNamespace": "sb-prod.servicebus.windows.net",
        "FhServiceBus__clientId": "00000000-0000-0000-0000-000000000001",
        "FhTopicName": "t",
    }
    capture = _specs(sb_app, settings)["capture"].trigger  # type: ignore[attr-defined]
    assert capture.connection == IdentityConnection(
        setting="FhServiceBus",
        fully_qualified_namespace="sb-prod.servicebus.windows.net",
        client_id="00000000-0000-0000-0000-000000000001",
    )


def test_missing_connection_is_a_clear_error() -> None:
    with pytest.raises(BindingError) as info:
        _specs(sb_app, {"FhTopicName": "t"})
    assert "connection 'FhServiceBus' is not configured" in str(info.value)


def test_connection_string_never_appears_in_repr() -> None:
    capture = _specs(sb_app, SETTINGS)["capture"]
    assert "secret" not in repr(capture)
    assert "SharedAccessKey" not in repr(capture)


def test_unsupported_bindings_are_refused_with_reasons() -> None:
    with pytest.raises(BindingError) as info:
        _specs(bad_app, SETTINGS)
    text = "\n".join(info.value.problems)
    assert "trigger type 'timerTrigger' is not supported" in text
    assert "output binding type 'blob' is not supported" in text
    assert "'%NoSuch%' does not resolve" in text
    assert "connection 'Missing' is not configured" in text
    assert "'fine'" not in text


def test_selecting_functions_skips_the_unsupported_ones() -> None:
    metadata = [f.metadata for f in _indexed(bad_app)]
    specs = discover(select(metadata, ["fine"]), SETTINGS)
    assert [s.name for s in specs] == ["fine"]
    with pytest.raises(BindingError, match="no function named 'nope'"):
        select(metadata, ["nope"])


def test_parameter_names_must_match_bindings() -> None:
    indexed = {f.metadata.name: f for f in _indexed(bad_app)}
    (spec,) = discover([indexed["wrong_params"].metadata], SETTINGS)
    with pytest.raises(FunctionLoadError, match=r"bindings \['msg'\] have no matching"):
        FunctionInvoker(spec, indexed["wrong_params"].user_function, Path("."))
    (fine,) = discover([indexed["fine"].metadata], SETTINGS)
    FunctionInvoker(fine, indexed["fine"].user_function, Path("."))


def test_indexing_twice_reuses_the_first_index() -> None:
    # FunctionApp.get_functions() refuses a second call; the loader must not make one.
    first = [f.metadata.name for f in _indexed(http_app)]
    second = [f.metadata.name for f in _indexed(http_app)]
    assert first == second == ["echo", "boom", "plain", "files"]
