"""Binding discovery: function metadata + settings -> trigger and output specs (pure).

The input is what the Python worker reports to the Functions host when it indexes a v2 app:
per function, its name and its bindings as function.json-style dicts (azure.functions'
`Function.get_raw_bindings()`). The output is the list of things the local host must do.
Every problem is collected and reported at once with the function's name, so a bad app fails
at start with a clear message rather than at the first message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from emulators.functions_host.connection import (
    Connection,
    MissingConnectionError,
    resolve_connection,
)
from emulators.functions_host.settings import SettingsError, resolve_expression

RETURN = "$return"
A = TypeVar("A")
B = TypeVar("B")
SUPPORTED_TRIGGERS = ("serviceBusTrigger", "httpTrigger", "eventGridTrigger")
SUPPORTED_OUTPUTS = ("serviceBus", "http")
ALL_HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE")


class BindingError(ValueError):
    """One or more functions use bindings the local host cannot honour."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class FunctionMetadata:
    """A function as the worker indexes it: name and function.json-style binding dicts."""

    name: str
    bindings: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class ServiceBusTrigger:
    param: str
    connection: Connection
    queue: str | None
    topic: str | None
    subscription: str | None
    sessions: bool
    cardinality: str  # "one" or "many"
    data_type: str | None
    auto_complete: bool | None  # None: the host.json default applies

    @property
    def entity(self) -> str:
        if self.queue is not None:
            return self.queue
        return f"{self.topic}/Subscriptions/{self.subscription}"

    @property
    def kind(self) -> str:
        return "serviceBusTrigger"


@dataclass(frozen=True)
class HttpTrigger:
    param: str
    route: str
    methods: tuple[str, ...]
    auth_level: str | None

    @property
    def entity(self) -> str:
        return self.route

    @property
    def kind(self) -> str:
        return "httpTrigger"


@dataclass(frozen=True)
class EventGridTrigger:
    """Served at /runtime/webhooks/EventGrid?functionName=<name> (see eventgrid.py)."""

    param: str
    function_name: str

    @property
    def entity(self) -> str:
        return f"/runtime/webhooks/EventGrid?functionName={self.function_name}"

    @property
    def kind(self) -> str:
        return "eventGridTrigger"


@dataclass(frozen=True)
class ServiceBusOutput:
    param: str
    connection: Connection
    queue: str | None
    topic: str | None

    @property
    def entity(self) -> str:
        return self.queue if self.queue is not None else str(self.topic)


@dataclass(frozen=True)
class HttpOutput:
    param: str


Trigger = ServiceBusTrigger | HttpTrigger | EventGridTrigger
Output = ServiceBusOutput | HttpOutput


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    trigger: Trigger
    outputs: tuple[Output, ...]

    @property
    def binding_names(self) -> tuple[str, ...]:
        return (self.trigger.param, *(o.param for o in self.outputs))


def discover(
    functions: Iterable[FunctionMetadata], settings: Mapping[str, str]
) -> list[FunctionSpec]:
    """Turn indexed functions into specs; raise BindingError listing every problem found."""
    specs: list[FunctionSpec] = []
    problems: list[str] = []
    for function in functions:
        try:
            specs.append(_discover_one(function, settings))
        except BindingError as exc:
            problems.extend(exc.problems)
    if problems:
        raise BindingError(problems)
    return specs


def select(
    functions: Sequence[FunctionMetadata], names: Iterable[str] | None
) -> list[FunctionMetadata]:
    """Keep the named functions (all when names is None); unknown names are an error."""
    if names is None:
        return list(functions)
    wanted = list(dict.fromkeys(names))
    known = {f.name for f in functions}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        listing = ", ".join(sorted(known)) or "none"
        raise BindingError([f"no function named {n!r} (the app has: {listing})" for n in unknown])
    return [f for f in functions if f.name in wanted]


def _discover_one(function: FunctionMetadata, settings: Mapping[str, str]) -> FunctionSpec:
    where = f"function {function.name!r}"
    problems: list[str] = []
    trigger: Trigger | None = None
    outputs: list[Output] = []
    for raw in function.bindings:
        binding = {str(k): v for k, v in raw.items()}
        kind = str(binding.get("type", ""))
        name = str(binding.get("name", ""))
        direction = str(binding.get("direction", "")).lower()
        label = f"{where} binding {name or '?'} ({kind or 'no type'})"
        try:
            if not name:
                raise BindingError([f"{label}: binding has no name"])
            if kind.endswith("Trigger") or kind.endswith("trigger"):
                if trigger is not None:
                    raise BindingError([f"{label}: a function has exactly one trigger"])
                trigger = _trigger(kind, name, binding, settings, label, function.name)
            elif direction == "out":
                outputs.append(_output(kind, name, binding, settings, label))
            else:
                raise BindingError(
                    [
                        f"{label}: {direction or 'unknown'}-direction {kind!r} bindings are not "
                        f"supported by the local functions host (supported outputs: "
                        f"{', '.join(SUPPORTED_OUTPUTS)})"
                    ]
                )
        except BindingError as exc:
            problems.extend(exc.problems)
    if trigger is None and not problems:
        problems.append(f"{where}: no trigger binding")
    if problems:
        raise BindingError(problems)
    assert trigger is not None
    if not isinstance(trigger, HttpTrigger) and any(isinstance(o, HttpOutput) for o in outputs):
        raise BindingError([f"{where}: an http output binding needs an httpTrigger"])
    return FunctionSpec(name=function.name, trigger=trigger, outputs=tuple(outputs))


def _resolved(
    binding: Mapping[str, Any], key: str, settings: Mapping[str, str], label: str
) -> str | None:
    value = binding.get(key)
    if value is None or value == "":
        return None
    try:
        return resolve_expression(str(value), settings, what=f"{label} {key}")
    except SettingsError as exc:
        raise BindingError([str(exc)]) from exc


def _connection(binding: Mapping[str, Any], label: str, settings: Mapping[str, str]) -> Connection:
    try:
        return resolve_connection(binding.get("connection") or None, settings)
    except MissingConnectionError as exc:
        raise BindingError([f"{label}: {exc}"]) from exc


def _entity(
    binding: Mapping[str, Any], settings: Mapping[str, str], label: str, *, needs_subscription: bool
) -> tuple[str | None, str | None, str | None]:
    problems: list[str] = []
    queue = topic = subscription = None
    for key in ("queueName", "topicName", "subscriptionName"):
        try:
            value = _resolved(binding, key, settings, label)
        except BindingError as exc:
            problems.extend(exc.problems)
            continue
        if key == "queueName":
            queue = value
        elif key == "topicName":
            topic = value
        else:
            subscription = value
    if problems:
        raise BindingError(problems)
    if (queue is None) == (topic is None):
        raise BindingError([f"{label}: set exactly one of queueName or topicName"])
    if needs_subscription and topic is not None and subscription is None:
        raise BindingError([f"{label}: a topic trigger needs subscriptionName"])
    return queue, topic, subscription


def _trigger(
    kind: str,
    name: str,
    binding: Mapping[str, Any],
    settings: Mapping[str, str],
    label: str,
    function_name: str = "",
) -> Trigger:
    if kind == "serviceBusTrigger":
        connection, (queue, topic, subscription) = _both(
            lambda: _connection(binding, label, settings),
            lambda: _entity(binding, settings, label, needs_subscription=True),
        )
        cardinality = str(binding.get("cardinality") or "one").lower()
        if cardinality not in {"one", "many"}:
            raise BindingError([f"{label}: cardinality must be 'one' or 'many': {cardinality!r}"])
        data_type = binding.get("dataType")
        auto_complete = binding.get("autoCompleteMessages")
        return ServiceBusTrigger(
            param=name,
            connection=connection,
            queue=queue,
            topic=topic,
            subscription=subscription if topic is not None else None,
            sessions=_truthy(binding.get("isSessionsEnabled")),
            cardinality=cardinality,
            data_type=str(data_type).lower() if data_type else None,
            auto_complete=None if auto_complete is None else _truthy(auto_complete),
        )
    if kind == "httpTrigger":
        route = str(binding.get("route") or "").strip("/")
        methods_raw = binding.get("methods") or ALL_HTTP_METHODS
        methods = tuple(sorted({str(m).upper() for m in methods_raw}))
        auth = binding.get("authLevel")
        return HttpTrigger(
            param=name, route=route, methods=methods, auth_level=str(auth).lower() if auth else None
        )
    if kind == "eventGridTrigger":
        return EventGridTrigger(param=name, function_name=function_name)
    raise BindingError(
        [
            f"{label}: trigger type {kind!r} is not supported by the local functions host "
            f"(supported: {', '.join(SUPPORTED_TRIGGERS)}); leave it out with --functions"
        ]
    )


def _output(
    kind: str, name: str, binding: Mapping[str, Any], settings: Mapping[str, str], label: str
) -> Output:
    if kind == "http":
        return HttpOutput(param=name)
    if kind == "serviceBus":
        connection, (queue, topic, _) = _both(
            lambda: _connection(binding, label, settings),
            lambda: _entity(binding, settings, label, needs_subscription=False),
        )
        return ServiceBusOutput(param=name, connection=connection, queue=queue, topic=topic)
    raise BindingError(
        [
            f"{label}: output binding type {kind!r} is not supported by the local functions "
            f"host (supported: {', '.join(SUPPORTED_OUTPUTS)})"
        ]
    )


def _both(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """Run both resolutions and report the problems of both, not just the first."""
    problems: list[str] = []
    results: list[Any] = []
    for step in (first, second):
        try:
            results.append(step())
        except BindingError as exc:
            problems.extend(exc.problems)
    if problems:
        raise BindingError(problems)
    return results[0], results[1]


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)
