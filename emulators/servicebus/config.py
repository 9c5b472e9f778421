"""Load entities from Microsoft's Service Bus emulator Config.json format.

UserConfig -> Namespaces[0] -> Queues, Topics -> Subscriptions -> Rules. Every property is
checked: an unknown key, a bad duration, unsupported SQL or a feature this emulator does not
implement (ForwardTo, rule actions) fails at load with ConfigError naming the entity, so a
config is never honoured half-way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from emulators.servicebus.durations import DurationError, parse_duration
from emulators.servicebus.sqlfilter import (
    CorrelationFilter,
    FalseFilter,
    FilterSyntaxError,
    MessageFacts,
    TrueFilter,
    compile_sql_filter,
)

# Defaults of Microsoft's emulator / Azure when a property is absent.
DEFAULT_LOCK_DURATION = 60.0
DEFAULT_MAX_DELIVERY_COUNT = 10
DEFAULT_TTL = 14 * 86400.0  # Azure allows more; 14 days is the emulator's documented maximum
DEFAULT_DUPLICATE_WINDOW = 20.0
# Message size limits by tier (Service Bus quotas): Standard 256 KB for a message and for a
# batch; Premium the entity's MaxMessageSizeInKilobytes (1 MB by default, up to 100 MB) for a
# message and 1 MB for a batch.
TIERS = ("Standard", "Premium")
STANDARD_MAX_MESSAGE_SIZE = 256 * 1024
PREMIUM_DEFAULT_MAX_MESSAGE_KB = 1024
PREMIUM_MAX_MESSAGE_KB = 100 * 1024
PREMIUM_MAX_BATCH_SIZE = 1024 * 1024
MIN_MESSAGE_SIZE_LIMIT = 256  # --max-message-size below this could not carry any message

_QUEUE_KEYS = {
    "DeadLetteringOnMessageExpiration",
    "MaxMessageSizeInKilobytes",
    "DefaultMessageTimeToLive",
    "DuplicateDetectionHistoryTimeWindow",
    "ForwardDeadLetteredMessagesTo",
    "ForwardTo",
    "LockDuration",
    "MaxDeliveryCount",
    "RequiresDuplicateDetection",
    "RequiresSession",
}
_TOPIC_KEYS = {
    "DefaultMessageTimeToLive",
    "MaxMessageSizeInKilobytes",
    "DuplicateDetectionHistoryTimeWindow",
    "RequiresDuplicateDetection",
}
_SUBSCRIPTION_KEYS = {
    "DeadLetteringOnMessageExpiration",
    "DefaultMessageTimeToLive",
    "ForwardDeadLetteredMessagesTo",
    "ForwardTo",
    "LockDuration",
    "MaxDeliveryCount",
    "RequiresSession",
}
_CORRELATION_KEYS = {
    "CorrelationId": "correlation_id",
    "MessageId": "message_id",
    "To": "to",
    "ReplyTo": "reply_to",
    "Label": "subject",
    "Subject": "subject",
    "SessionId": "session_id",
    "ReplyToSessionId": "reply_to_session_id",
    "ContentType": "content_type",
}


class ConfigError(ValueError):
    """A config this emulator cannot honour."""


class Filter:
    """Anything with ``matches(MessageFacts) -> bool``."""

    def matches(self, facts: MessageFacts) -> bool:  # pragma: no cover - protocol
        raise NotImplementedError


@dataclass(frozen=True)
class RuleConfig:
    name: str
    filter: Any  # SqlFilter | CorrelationFilter | TrueFilter | FalseFilter


@dataclass(frozen=True)
class ReceiverSettings:
    """What a queue or subscription needs to hand out messages."""

    lock_duration: float = DEFAULT_LOCK_DURATION
    max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT
    requires_session: bool = False
    default_ttl: float = DEFAULT_TTL
    dead_letter_on_expiration: bool = False


@dataclass(frozen=True)
class SenderSettings:
    """What a queue or topic needs to accept messages."""

    requires_duplicate_detection: bool = False
    duplicate_window: float = DEFAULT_DUPLICATE_WINDOW
    default_ttl: float = DEFAULT_TTL
    max_message_size: int = STANDARD_MAX_MESSAGE_SIZE  # bytes of one message's transfer
    max_batch_size: int = STANDARD_MAX_MESSAGE_SIZE  # bytes of one batch's transfer


@dataclass(frozen=True)
class QueueConfig:
    name: str
    sending: SenderSettings
    receiving: ReceiverSettings


@dataclass(frozen=True)
class SubscriptionConfig:
    name: str
    receiving: ReceiverSettings
    rules: tuple[RuleConfig, ...]


@dataclass(frozen=True)
class TopicConfig:
    name: str
    sending: SenderSettings
    subscriptions: tuple[SubscriptionConfig, ...]


@dataclass(frozen=True)
class NamespaceConfig:
    name: str
    queues: tuple[QueueConfig, ...] = ()
    topics: tuple[TopicConfig, ...] = field(default_factory=tuple)
    tier: str = "Standard"


def with_max_message_size(config: NamespaceConfig, limit: int) -> NamespaceConfig:
    """``config`` with every entity's message and batch size limit lowered to ``limit`` bytes
    (``--max-message-size``: exercise a sender's size handling without 256 KB messages)."""
    largest = max(
        [q.sending.max_message_size for q in config.queues]
        + [t.sending.max_message_size for t in config.topics]
        + [STANDARD_MAX_MESSAGE_SIZE]
    )
    if not MIN_MESSAGE_SIZE_LIMIT <= limit <= largest:
        raise ConfigError(
            f"the maximum message size can only be lowered: {limit} bytes is outside "
            f"{MIN_MESSAGE_SIZE_LIMIT}..{largest} ({config.tier} tier)"
        )

    def lowered(settings: SenderSettings) -> SenderSettings:
        return replace(
            settings,
            max_message_size=min(settings.max_message_size, limit),
            max_batch_size=min(settings.max_batch_size, limit),
        )

    return replace(
        config,
        queues=tuple(replace(q, sending=lowered(q.sending)) for q in config.queues),
        topics=tuple(replace(t, sending=lowered(t.sending)) for t in config.topics),
    )


def load_config(path: str | Path) -> NamespaceConfig:
    """Read and validate a Config.json file."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    return parse_config(document)


def parse_config(document: Any) -> NamespaceConfig:
    user = _mapping(document, "the document").get("UserConfig")
    user = _mapping(user, "UserConfig")
    namespaces = user.get("Namespaces")
    if not isinstance(namespaces, list) or len(namespaces) != 1:
        raise ConfigError("UserConfig.Namespaces must be a list with exactly one namespace")
    ns = _mapping(namespaces[0], "the namespace")
    _only(ns, {"Name", "Queues", "Topics", "Tier"}, "namespace")
    tier = ns.get("Tier", "Standard")
    if tier not in TIERS:
        raise ConfigError(f"namespace: Tier must be one of {list(TIERS)}, got {tier!r}")
    queues = tuple(_queue(q, tier) for q in _list(ns.get("Queues", []), "Queues"))
    topics = tuple(_topic(t, tier) for t in _list(ns.get("Topics", []), "Topics"))
    names = [q.name.lower() for q in queues] + [t.name.lower() for t in topics]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"entity names used twice (names are case-insensitive): {duplicates}")
    return NamespaceConfig(str(ns.get("Name", "sbemulatorns")), queues, topics, tier)


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what} must be a JSON object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(f"{what} must be a JSON list")
    return value


def _only(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unsupported keys {unknown} (supported: {sorted(allowed)})")


def _name(obj: Mapping[str, Any], kind: str) -> str:
    name = obj.get("Name")
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(f"{kind} needs a non-empty Name without '/', got {name!r}")
    return name


def _duration(props: Mapping[str, Any], key: str, default: float, where: str) -> float:
    if key not in props:
        return default
    try:
        seconds = parse_duration(props[key])
    except DurationError as exc:
        raise ConfigError(f"{where}: {key}: {exc}") from exc
    if seconds <= 0:
        raise ConfigError(f"{where}: {key} must be positive, got {props[key]!r}")
    return seconds


def _bool(props: Mapping[str, Any], key: str, where: str) -> bool:
    value = props.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _no_forwarding(props: Mapping[str, Any], where: str) -> None:
    for key in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
        if props.get(key, "") not in ("", None):
            raise ConfigError(
                f"{where}: {key} is not supported by this emulator (got {props[key]!r})"
            )


def _receiving(props: Mapping[str, Any], where: str) -> ReceiverSettings:
    max_count = props.get("MaxDeliveryCount", DEFAULT_MAX_DELIVERY_COUNT)
    if not isinstance(max_count, int) or isinstance(max_count, bool) or max_count < 1:
        raise ConfigError(
            f"{where}: MaxDeliveryCount must be a positive integer, got {max_count!r}"
        )
    _no_forwarding(props, where)
    return ReceiverSettings(
        lock_duration=_duration(props, "LockDuration", DEFAULT_LOCK_DURATION, where),
        max_delivery_count=max_count,
        requires_session=_bool(props, "RequiresSession", where),
        default_ttl=_duration(props, "DefaultMessageTimeToLive", DEFAULT_TTL, where),
        dead_letter_on_expiration=_bool(props, "DeadLetteringOnMessageExpiration", where),
    )


def _size_limits(props: Mapping[str, Any], tier: str, where: str) -> tuple[int, int]:
    """(max message size, max batch size) in bytes for an entity of ``tier``."""
    kilobytes = props.get("MaxMessageSizeInKilobytes")
    if tier == "Standard":
        if kilobytes is not None:
            raise ConfigError(
                f"{where}: MaxMessageSizeInKilobytes needs the Premium tier "
                "(Standard is fixed at 256 KB; lower it for tests with --max-message-size)"
            )
        return STANDARD_MAX_MESSAGE_SIZE, STANDARD_MAX_MESSAGE_SIZE
    if kilobytes is None:
        kilobytes = PREMIUM_DEFAULT_MAX_MESSAGE_KB
    if (
        not isinstance(kilobytes, int)
        or isinstance(kilobytes, bool)
        or not PREMIUM_DEFAULT_MAX_MESSAGE_KB <= kilobytes <= PREMIUM_MAX_MESSAGE_KB
    ):
        raise ConfigError(
            f"{where}: MaxMessageSizeInKilobytes must be an integer in "
            f"{PREMIUM_DEFAULT_MAX_MESSAGE_KB}..{PREMIUM_MAX_MESSAGE_KB}, got {kilobytes!r}"
        )
    return kilobytes * 1024, PREMIUM_MAX_BATCH_SIZE


def _sending(props: Mapping[str, Any], where: str, tier: str) -> SenderSettings:
    message_size, batch_size = _size_limits(props, tier, where)
    return SenderSettings(
        requires_duplicate_detection=_bool(props, "RequiresDuplicateDetection", where),
        duplicate_window=_duration(
            props, "DuplicateDetectionHistoryTimeWindow", DEFAULT_DUPLICATE_WINDOW, where
        ),
        default_ttl=_duration(props, "DefaultMessageTimeToLive", DEFAULT_TTL, where),
        max_message_size=message_size,
        max_batch_size=batch_size,
    )


def _queue(raw: Any, tier: str = "Standard") -> QueueConfig:
    obj = _mapping(raw, "a queue")
    name = _name(obj, "a queue")
    where = f"queue {name!r}"
    _only(obj, {"Name", "Properties"}, where)
    props = _mapping(obj.get("Properties", {}), f"{where} Properties")
    _only(props, _QUEUE_KEYS, f"{where} Properties")
    return QueueConfig(name, _sending(props, where, tier), _receiving(props, where))


def _topic(raw: Any, tier: str = "Standard") -> TopicConfig:
    obj = _mapping(raw, "a topic")
    name = _name(obj, "a topic")
    where = f"topic {name!r}"
    _only(obj, {"Name", "Properties", "Subscriptions"}, where)
    props = _mapping(obj.get("Properties", {}), f"{where} Properties")
    _only(props, _TOPIC_KEYS, f"{where} Properties")
    subs = tuple(_subscription(s, name) for s in _list(obj.get("Subscriptions", []), where))
    names = [s.name.lower() for s in subs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: subscription names used twice")
    return TopicConfig(name, _sending(props, where, tier), subs)


def _subscription(raw: Any, topic: str) -> SubscriptionConfig:
    obj = _mapping(raw, f"a subscription of topic {topic!r}")
    name = _name(obj, f"a subscription of topic {topic!r}")
    where = f"subscription {topic}/{name}"
    _only(obj, {"Name", "Properties", "Rules"}, where)
    props = _mapping(obj.get("Properties", {}), f"{where} Properties")
    _only(props, _SUBSCRIPTION_KEYS, f"{where} Properties")
    rules = tuple(_rule(r, where) for r in _list(obj.get("Rules", []), f"{where} Rules"))
    if not rules:
        # Azure creates a $Default TrueFilter rule for a subscription made without rules.
        rules = (RuleConfig("$Default", TrueFilter()),)
    return SubscriptionConfig(name, _receiving(props, where), rules)


def _rule(raw: Any, where: str) -> RuleConfig:
    obj = _mapping(raw, f"{where}: a rule")
    name = _name(obj, f"{where}: a rule")
    here = f"{where} rule {name!r}"
    _only(obj, {"Name", "Properties"}, here)
    props = _mapping(obj.get("Properties", {}), f"{here} Properties")
    _only(props, {"FilterType", "SqlFilter", "CorrelationFilter", "Action"}, f"{here} Properties")
    if props.get("Action"):
        raise ConfigError(f"{here}: rule actions are not supported by this emulator")
    kind = props.get("FilterType")
    if kind == "Sql":
        sql = _mapping(props.get("SqlFilter"), f"{here} SqlFilter")
        _only(sql, {"SqlExpression"}, f"{here} SqlFilter")
        expression = sql.get("SqlExpression")
        if not isinstance(expression, str):
            raise ConfigError(f"{here}: SqlFilter.SqlExpression must be a string")
        stripped = expression.strip().upper()
        if stripped in {"TRUEFILTER", "1=1"}:
            return RuleConfig(name, TrueFilter())
        if stripped in {"FALSEFILTER", "1=0"}:
            return RuleConfig(name, FalseFilter())
        try:
            return RuleConfig(name, compile_sql_filter(expression))
        except FilterSyntaxError as exc:
            raise ConfigError(f"{here}: SQL filter {expression!r}: {exc}") from exc
    if kind == "Correlation":
        corr = _mapping(props.get("CorrelationFilter"), f"{here} CorrelationFilter")
        _only(corr, set(_CORRELATION_KEYS) | {"Properties"}, f"{here} CorrelationFilter")
        system = {_CORRELATION_KEYS[k]: v for k, v in corr.items() if k != "Properties"}
        for key, value in system.items():
            if not isinstance(value, str):
                raise ConfigError(f"{here}: CorrelationFilter {key} must be a string")
        application = dict(_mapping(corr.get("Properties", {}), f"{here} Properties"))
        if not system and not application:
            raise ConfigError(f"{here}: CorrelationFilter needs at least one property")
        return RuleConfig(name, CorrelationFilter(system, application))
    raise ConfigError(f"{here}: FilterType must be 'Sql' or 'Correlation', got {kind!r}")
