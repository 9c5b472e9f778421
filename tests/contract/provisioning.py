"""Create the contract suite's entities in a real namespace from tests/contract/Config.json.

Only for a real namespace: the local emulator, and Microsoft's, load Config.json themselves.

* ``admin_calls(document)`` (pure) maps Microsoft's emulator Config.json format to the
  azure.servicebus.management.ServiceBusAdministrationClient calls that create the same
  entities: create_queue, create_topic, create_subscription and create_rule, with their
  keyword arguments.
* ``provision(admin, calls)`` creates what is missing and never changes what exists: an entity
  that exists with other properties or rules than Config.json asks for is reported (delete it
  and the next run creates it again), since some properties (sessions, duplicate detection)
  cannot be changed after creation.
* ``azure_limit_violations(document)`` lists the values Azure would refuse, so the local suite
  cannot come to rely on one (a unit test keeps Config.json within the limits).

Reading and creating entity descriptions needs Manage rights (a SAS policy with Manage, or the
"Azure Service Bus Data Owner" role for Entra ID); without them ``provision`` raises
ProvisioningError saying so. The entities need the Standard or Premium tier (topics, sessions).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.servicebus.management import CorrelationRuleFilter, SqlRuleFilter

from emulators.servicebus.config import parse_config
from emulators.servicebus.durations import parse_duration

DEFAULT_RULE = "$Default"  # what Azure gives a new subscription: a TrueFilter rule

# Config.json property -> ServiceBusAdministrationClient keyword (queues, topics, subscriptions)
ENTITY_KEYWORDS = {
    "DeadLetteringOnMessageExpiration": "dead_lettering_on_message_expiration",
    "DefaultMessageTimeToLive": "default_message_time_to_live",
    "DuplicateDetectionHistoryTimeWindow": "duplicate_detection_history_time_window",
    "ForwardDeadLetteredMessagesTo": "forward_dead_lettered_messages_to",
    "ForwardTo": "forward_to",
    "LockDuration": "lock_duration",
    "MaxDeliveryCount": "max_delivery_count",
    "MaxMessageSizeInKilobytes": "max_message_size_in_kilobytes",  # Premium namespaces only
    "RequiresDuplicateDetection": "requires_duplicate_detection",
    "RequiresSession": "requires_session",
}
DURATIONS = {"DefaultMessageTimeToLive", "DuplicateDetectionHistoryTimeWindow", "LockDuration"}
# CorrelationFilter key -> CorrelationRuleFilter keyword (Label is Subject's older name)
CORRELATION_KEYWORDS = {
    "CorrelationId": "correlation_id",
    "MessageId": "message_id",
    "To": "to",
    "ReplyTo": "reply_to",
    "Label": "label",
    "Subject": "label",
    "SessionId": "session_id",
    "ReplyToSessionId": "reply_to_session_id",
    "ContentType": "content_type",
}

# What Azure accepts (seconds; None: no upper limit that matters here). Sources: the
# ServiceBusAdministrationClient / ARM property docs and the Service Bus quotas page.
AZURE_DURATION_LIMITS: dict[str, tuple[float, float | None]] = {
    "LockDuration": (5, 5 * 60),
    "DuplicateDetectionHistoryTimeWindow": (20, 7 * 86400),
    "DefaultMessageTimeToLive": (1, None),
}
AZURE_NAME_LIMITS = {"queue": 260, "topic": 260, "subscription": 50, "rule": 50}


class ProvisioningError(RuntimeError):
    """The namespace cannot be made to match Config.json (the message says why and what to do)."""


@dataclass(frozen=True)
class AdminCall:
    """One ServiceBusAdministrationClient call: ``getattr(admin, method)(*args, **kwargs)``."""

    method: str  # create_queue | create_topic | create_subscription | create_rule
    args: tuple[str, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def entity(self) -> str:
        return "/".join(self.args)


class AdminClient(Protocol):
    """The part of ServiceBusAdministrationClient that ``provision`` uses."""

    def get_queue(self, queue_name: str) -> Any: ...
    def get_topic(self, topic_name: str) -> Any: ...
    def get_subscription(self, topic_name: str, subscription_name: str) -> Any: ...
    def list_rules(self, topic_name: str, subscription_name: str) -> Iterable[Any]: ...
    def create_queue(self, queue_name: str, **kwargs: Any) -> Any: ...
    def create_topic(self, topic_name: str, **kwargs: Any) -> Any: ...
    def create_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> Any: ...
    def create_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> Any: ...
    def delete_rule(self, topic_name: str, subscription_name: str, rule_name: str) -> None: ...


def _namespace(document: Mapping[str, Any]) -> Mapping[str, Any]:
    namespace: Mapping[str, Any] = document["UserConfig"]["Namespaces"][0]
    return namespace


def _entity_kwargs(properties: Mapping[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for key, value in properties.items():
        if key in ("ForwardTo", "ForwardDeadLetteredMessagesTo") and value in ("", None):
            continue  # Microsoft's emulator writes "" for "not forwarded"
        if key in DURATIONS:
            value = dt.timedelta(seconds=parse_duration(value))
        kwargs[ENTITY_KEYWORDS[key]] = value
    return kwargs


def rule_filter(properties: Mapping[str, Any]) -> SqlRuleFilter | CorrelationRuleFilter:
    """The admin client's filter for one Config.json rule's Properties."""
    if properties["FilterType"] == "Sql":
        return SqlRuleFilter(properties["SqlFilter"]["SqlExpression"])
    correlation = dict(properties["CorrelationFilter"])
    app = correlation.pop("Properties", None)
    keywords = {CORRELATION_KEYWORDS[key]: value for key, value in correlation.items()}
    return CorrelationRuleFilter(properties=dict(app) if app else None, **keywords)


def admin_calls(document: Mapping[str, Any]) -> list[AdminCall]:
    """The calls that create every entity of a Config.json document, parents first.

    The document is validated as the emulator validates it first, so a config is never
    created half-way. A subscription with rules also needs its ``$Default`` rule removed
    after they are created; ``provision`` does that.
    """
    parse_config(document)  # raises ConfigError naming the entity
    ns = _namespace(document)
    calls: list[AdminCall] = []
    for queue in ns.get("Queues", []):
        properties = queue.get("Properties", {})
        calls.append(AdminCall("create_queue", (queue["Name"],), _entity_kwargs(properties)))
    for topic in ns.get("Topics", []):
        name = topic["Name"]
        calls.append(
            AdminCall("create_topic", (name,), _entity_kwargs(topic.get("Properties", {})))
        )
        for sub in topic.get("Subscriptions", []):
            kwargs = _entity_kwargs(sub.get("Properties", {}))
            calls.append(AdminCall("create_subscription", (name, sub["Name"]), kwargs))
            for rule in sub.get("Rules", []):
                filter_ = rule_filter(rule["Properties"])
                calls.append(
                    AdminCall("create_rule", (name, sub["Name"], rule["Name"]), {"filter": filter_})
                )
    return calls


def describe_filter(filter_: Any) -> tuple[str, Any]:
    """A comparable form of a rule filter (the SDK's filter classes have no ``__eq__``)."""
    if isinstance(filter_, CorrelationRuleFilter):
        fields = {k: v for k, v in vars(filter_).items() if v is not None and k != "properties"}
        return ("Correlation", (sorted(fields.items()), sorted((filter_.properties or {}).items())))
    if isinstance(filter_, SqlRuleFilter):
        return ("Sql", " ".join(str(filter_.sql_expression).split()))
    return (type(filter_).__name__, None)


def azure_limit_violations(document: Mapping[str, Any]) -> list[str]:
    """Values in a Config.json document that Azure Service Bus would refuse."""
    problems: list[str] = []

    def check(kind: str, name: str, properties: Mapping[str, Any]) -> None:
        where = f"{kind} {name!r}"
        if len(name) > AZURE_NAME_LIMITS[kind]:
            problems.append(f"{where}: name longer than {AZURE_NAME_LIMITS[kind]} characters")
        for key, (low, high) in AZURE_DURATION_LIMITS.items():
            if key in properties:
                seconds = parse_duration(properties[key])
                if seconds < low or (high is not None and seconds > high):
                    top = "" if high is None else f" and at most {high:g} s"
                    problems.append(
                        f"{where}: {key} {properties[key]} must be at least {low:g} s{top}"
                    )
        if properties.get("MaxDeliveryCount", 1) < 1:
            problems.append(f"{where}: MaxDeliveryCount must be at least 1")

    ns = _namespace(document)
    for queue in ns.get("Queues", []):
        check("queue", queue["Name"], queue.get("Properties", {}))
    for topic in ns.get("Topics", []):
        check("topic", topic["Name"], topic.get("Properties", {}))
        for sub in topic.get("Subscriptions", []):
            check("subscription", sub["Name"], sub.get("Properties", {}))
            for rule in sub.get("Rules", []):
                check("rule", rule["Name"], {})
    return problems


def _existing(admin: AdminClient, call: AdminCall) -> Any | None:
    getters: dict[str, Callable[..., Any]] = {
        "create_queue": admin.get_queue,
        "create_topic": admin.get_topic,
        "create_subscription": admin.get_subscription,
    }
    getter = getters[call.method]
    try:
        return getter(*call.args)
    except ResourceNotFoundError:
        return None


def _differences(call: AdminCall, existing: Any) -> list[str]:
    found = []
    for key, wanted in call.kwargs.items():
        if key == "duplicate_detection_history_time_window" and not call.kwargs.get(
            "requires_duplicate_detection"
        ):
            continue  # no effect without duplicate detection; Azure may report its default
        actual = getattr(existing, key, None)
        if actual != wanted:
            found.append(f"{call.entity}: {key} is {actual!r}, Config.json wants {wanted!r}")
    return found


@contextmanager
def _manage_rights(where: str) -> Iterator[None]:
    try:
        yield
    except (ClientAuthenticationError, HttpResponseError) as exc:
        if isinstance(exc, ResourceNotFoundError):
            raise
        status = getattr(exc, "status_code", None)
        if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
            raise ProvisioningError(
                f"the credential for {where} lacks Manage rights (HTTP {status}): the contract "
                "suite reads and creates the entities of tests/contract/Config.json. Use a SAS "
                "policy with Manage (e.g. RootManageSharedAccessKey) or grant the 'Azure Service "
                "Bus Data Owner' role; or create the entities beforehand and set "
                f"SEBRIDGE_CONTRACT_PROVISION=0. ({exc.message})"
            ) from exc
        raise


def provision(
    admin: AdminClient, calls: Sequence[AdminCall], where: str = "the namespace"
) -> list[str]:
    """Create the entities of ``calls`` that do not exist yet; return what was created.

    Raises ProvisioningError when the credential lacks Manage rights, or when existing entities
    differ from what the calls ask for (listing every difference).
    """
    created: list[str] = []
    differences: list[str] = []
    new_subscriptions: set[tuple[str, ...]] = set()
    rules: dict[tuple[str, ...], list[AdminCall]] = {}
    with _manage_rights(where):
        for call in calls:
            if call.method == "create_rule":
                rules.setdefault(call.args[:2], []).append(call)
                continue
            if call.method == "create_subscription":
                rules.setdefault(call.args, [])
            existing = _existing(admin, call)
            if existing is None:
                getattr(admin, call.method)(*call.args, **call.kwargs)
                created.append(call.entity)
                if call.method == "create_subscription":
                    new_subscriptions.add(call.args)
            else:
                differences += _differences(call, existing)
        for subscription, rule_calls in rules.items():
            wanted = {c.args[2]: describe_filter(c.kwargs["filter"]) for c in rule_calls}
            if not wanted:
                wanted = {DEFAULT_RULE: describe_filter(SqlRuleFilter("1=1"))}
            if subscription in new_subscriptions:
                for call in rule_calls:
                    admin.create_rule(*call.args, **call.kwargs)
                    created.append(call.entity)
                if DEFAULT_RULE not in wanted:
                    topic, name = subscription
                    admin.delete_rule(topic, name, DEFAULT_RULE)
                continue
            actual = {r.name: describe_filter(r.filter) for r in admin.list_rules(*subscription)}
            if actual != wanted:
                differences.append(
                    f"{'/'.join(subscription)}: rules are {actual}, Config.json wants {wanted}"
                )
    if differences:
        raise ProvisioningError(
            f"entities in {where} differ from tests/contract/Config.json (delete them and the "
            "next run creates them again):\n  " + "\n  ".join(differences)
        )
    return created
