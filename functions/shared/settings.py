"""The Function App's settings: read once, validated, at start (pure: takes a mapping).

A bad setting raises :class:`SettingsError` naming the setting, so the app fails while the
host indexes it (visible in the deployment log) rather than at the first message. Secrets
(TEAMS_WEBHOOK_URL, APPROVAL_SIGNING_KEY, a ServiceBusConnection string) are kept out of
``repr`` and are never logged.

Which workflows run follows from the settings alone (:func:`workflows`): function_app.py
registers those that are on and logs, at start, why any is off.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from functions.approval_gate.policy import Policy, PolicyError, default_policy, parse_policy
from functions.lb_pools.capacity import Budgets, parse_budgets
from functions.shared import names
from functions.shared.impact import DEFAULT_FREEZE_THRESHOLD, DEFAULT_IMPACTFUL, ImpactRules
from functions.webhooks.config import Endpoint, load_endpoints
from sebridge.values import is_loopback, parse_bool

# Every app setting the Function App reads, for the Bicep tests and the README.
APP_SETTING_NAMES: tuple[str, ...] = (
    "ServiceBusConnection__fullyQualifiedNamespace",
    "TopicName",
    "TeamsSubscriptionName",
    "LbPoolsSubscriptionName",
    "ApprovalGateSubscriptionName",
    "ApprovalsQueueName",
    "DrainMomentsQueueName",
    "CustomSubscriptionName",
    "TEAMS_WEBHOOK_URL",
    "APPROVAL_SIGNING_KEY",
    "APPROVAL_BASE_URL",
    "APPROVAL_POLICY",
    "LB_IMPACTFUL_EVENT_TYPES",
    "LB_FREEZE_THRESHOLD_SECONDS",
    "LB_MANAGED_RESOURCE_GROUPS",
    "ARM_ENDPOINT",
    "ACKNOWLEDGE_FALLBACK_ENABLED",
    "HEARTBEAT_STALE_SECONDS",
    "HEARTBEAT_STORE_URL",
    "CUSTOM_SUBSCRIBER_ENABLED",
    "WebhooksSubscriptionName",
    "WEBHOOKS",
    "WEBHOOK_PAGES_PER_OBSERVER_HOUR",
    "EVENTGRID_INGEST_ENABLED",
    "EVENTGRID_STATE_URL",
    "AGENTLESS_RESOURCE_GROUPS",
    "AGENTLESS_VM_PATTERNS",
    "LB_MIN_HEALTHY",
    "LB_MAX_UNAVAILABLE",
    "LB_POOL_BUDGETS",
    "HistorySubscriptionName",
    "HISTORY_RETENTION_DAYS",
    "CALENDAR_WINDOW_DAYS",
)
# Read but never set by the Bicep: a local emulator connection string, and what the platform
# sets by itself (WEBSITE_HOSTNAME for the approval link, the host storage account name for the
# heartbeat store and pool state defaults); LB_POOL_STATE_URL and HISTORY_TABLE_URL only where
# there is no host storage account to default to (local runs).
LOCAL_OR_PLATFORM_SETTING_NAMES: tuple[str, ...] = (
    "ServiceBusConnection",
    "WEBSITE_HOSTNAME",
    "AzureWebJobsStorage__accountName",
    "LB_POOL_STATE_URL",
    "HISTORY_TABLE_URL",
)

DEFAULT_ARM_ENDPOINT = "https://management.azure.com"
DEFAULT_HEARTBEAT_STALE = 900
HEARTBEAT_CONTAINER = "sebridge-heartbeats"
POOL_STATE_CONTAINER = "sebridge-pools"
DEFAULT_MIN_HEALTHY = 1
# New incidents (PagerDuty triggers) one observer may open in an hour (functions.webhooks.budget).
DEFAULT_PAGES_PER_OBSERVER_HOUR = 10
MIN_SIGNING_KEY_LENGTH = 32
KNOWN_EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
EVENTGRID_STATE_CONTAINER = "sebridge-eventgrid-state"
HISTORY_TABLE = "sebridgehistory"
DEFAULT_HISTORY_RETENTION_DAYS = 90
DEFAULT_CALENDAR_WINDOW_DAYS = 30
# AGENTLESS_VM_PATTERNS: shell-style patterns (fnmatch) over VM and scale-set names.
_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]!-]{1,80}")


class SettingsError(ValueError):
    """One or more app settings are missing or invalid; the message names each one."""


@dataclass(frozen=True)
class Settings:
    topic_name: str
    teams_subscription: str
    lb_pools_subscription: str
    approval_gate_subscription: str
    approvals_queue: str
    custom_subscription: str
    servicebus_namespace: str  # fully qualified, identity-based; "" when a string is used
    approval_base_url: str
    policy: Policy
    impactful_event_types: frozenset[str]
    freeze_threshold_seconds: int
    managed_resource_groups: tuple[str, ...]
    arm_endpoint: str
    acknowledge_fallback_enabled: bool
    heartbeat_stale_seconds: int
    heartbeat_store_url: str  # "" unless the fallback is enabled
    custom_subscriber_enabled: bool
    # The capacity guard: fewest healthy members lb-pools leaves in a backend pool (0: off),
    # and the blob container holding each pool's lock and held events.
    min_healthy: int = DEFAULT_MIN_HEALTHY
    pool_state_url: str = ""
    # Disruption budgets: LB_MIN_HEALTHY with LB_MAX_UNAVAILABLE and LB_POOL_BUDGETS.
    budgets: Budgets = field(default_factory=Budgets)
    # lb-pools drains at the event's drain moment, through messages scheduled on this queue
    # (functions.lb_pools.moments); "": every drain at first sight.
    drain_moments_queue: str = ""
    teams_webhook_url: str = field(repr=False, default="")
    approval_signing_key: bytes = field(repr=False, default=b"")
    servicebus_connection_string: str = field(repr=False, default="")
    # webhooks (functions/webhooks/config.py): the function is registered when the
    # subscription is set; endpoint secrets stay out of repr (Endpoint hides them).
    webhooks_subscription: str = ""
    webhooks: tuple[Endpoint, ...] = ()
    pages_per_observer_hour: int = DEFAULT_PAGES_PER_OBSERVER_HOUR
    # Agentless mode (Event Grid ingestion) and which VMs run without a forwarder.
    eventgrid_ingest_enabled: bool = False
    eventgrid_state_url: str = ""  # "" unless the ingestion is enabled
    agentless_resource_groups: tuple[str, ...] = ()
    agentless_vm_patterns: tuple[str, ...] = ()
    # history (functions/history): registered when its subscription is set; the table of
    # every event's entries and summary, how long they are kept, and the calendar's window.
    history_subscription: str = ""
    history_table_url: str = ""
    history_retention_days: int = DEFAULT_HISTORY_RETENTION_DAYS
    calendar_window_days: int = DEFAULT_CALENDAR_WINDOW_DAYS

    @property
    def teams_enabled(self) -> bool:
        """Teams cards are posted: a Teams Workflows webhook URL is set."""
        return bool(self.teams_webhook_url)

    def describe(self) -> dict[str, object]:
        """The effective configuration without secrets, for the start-up log line."""
        return {
            "topic": self.topic_name,
            "subscriptions": [
                *([self.teams_subscription] if self.teams_enabled else []),
                self.lb_pools_subscription,
                self.approval_gate_subscription,
            ],
            "approvalsQueue": self.approvals_queue,
            "serviceBus": self.servicebus_namespace or "connection string",
            "policyRules": len(self.policy.rules),
            "impactfulEventTypes": sorted(self.impactful_event_types),
            "freezeThresholdSeconds": self.freeze_threshold_seconds,
            "armEndpoint": self.arm_endpoint,
            "acknowledgeFallback": self.acknowledge_fallback_enabled,
            "customSubscriber": self.custom_subscriber_enabled,
            "webhooks": [f"{e.name} ({e.preset})" for e in self.webhooks]
            if self.webhooks_subscription
            else "off",
            "eventGridIngest": self.eventgrid_ingest_enabled,
            "agentlessResourceGroups": list(self.agentless_resource_groups),
            "agentlessVmPatterns": list(self.agentless_vm_patterns),
            "managedResourceGroups": list(self.managed_resource_groups),
            "minHealthy": self.min_healthy,
            "budgets": {
                "default": self.budgets.default.describe(),
                **{pool: b.describe() for pool, b in sorted(self.budgets.per_pool.items())},
            },
            "poolState": self.pool_state_url,
            "drainMoments": self.drain_moments_queue or "off (drain at first sight)",
            "leadSeconds": self.policy.leads.describe(),
            "history": self.history_table_url if self.history_subscription else "off",
            "historyRetentionDays": self.history_retention_days,
            "calendarWindowDays": self.calendar_window_days,
        }


def _url(name: str, value: str, problems: list[str]) -> str:
    """https anywhere; plain http only for loopback stand-ins."""
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        problems.append(f"{name}: not an http(s) URL")
        return value
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        problems.append(f"{name}: must use https (plain http is allowed for loopback only)")
    return value.rstrip("/")


def _bool(name: str, value: str, problems: list[str]) -> bool:
    try:
        return parse_bool(value)
    except ValueError as exc:
        problems.append(f"{name}: {exc}")
        return False


def _int(name: str, value: str, problems: list[str], *, minimum: int, maximum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        problems.append(f"{name}: {value!r} is not an integer")
        return minimum
    if not minimum <= number <= maximum:
        problems.append(f"{name}: {number} is outside {minimum}..{maximum}")
    return number


def _list(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def load_settings(env: Mapping[str, str]) -> Settings:
    """Validate every setting and report all problems at once."""
    problems: list[str] = []

    def get(name: str, default: str = "") -> str:
        return env.get(name, default).strip() or default

    def required(name: str) -> str:
        value = get(name)
        if not value:
            problems.append(f"{name}: required but not set")
        return value

    namespace = get("ServiceBusConnection__fullyQualifiedNamespace")
    connection_string = get("ServiceBusConnection")
    if not namespace and not connection_string:
        problems.append(
            "ServiceBusConnection__fullyQualifiedNamespace: required (or, locally, "
            "ServiceBusConnection with a connection string)"
        )

    # Teams is optional when another notifier (a WEBHOOKS endpoint) is configured; at least one
    # is checked once the webhooks are read.
    webhook = get("TEAMS_WEBHOOK_URL")
    if webhook:
        _url("TEAMS_WEBHOOK_URL", webhook, problems)
    key = required("APPROVAL_SIGNING_KEY")
    if key and len(key) < MIN_SIGNING_KEY_LENGTH:
        problems.append(f"APPROVAL_SIGNING_KEY: shorter than {MIN_SIGNING_KEY_LENGTH} characters")

    base_url = get("APPROVAL_BASE_URL")
    if not base_url and get("WEBSITE_HOSTNAME"):
        base_url = f"https://{get('WEBSITE_HOSTNAME')}"
    if not base_url:
        problems.append("APPROVAL_BASE_URL: required when WEBSITE_HOSTNAME is not set")
    else:
        base_url = _url("APPROVAL_BASE_URL", base_url, problems)

    impactful = _list(get("LB_IMPACTFUL_EVENT_TYPES", DEFAULT_IMPACTFUL))
    unknown = [t for t in impactful if t not in KNOWN_EVENT_TYPES]
    if unknown:
        problems.append(
            f"LB_IMPACTFUL_EVENT_TYPES: unknown event types {unknown} "
            f"(known: {', '.join(KNOWN_EVENT_TYPES)})"
        )
    threshold = _int(
        "LB_FREEZE_THRESHOLD_SECONDS",
        get("LB_FREEZE_THRESHOLD_SECONDS", str(DEFAULT_FREEZE_THRESHOLD)),
        problems,
        minimum=0,
        maximum=86_400,
    )
    # Without a policy of its own the app takes the default, kept in step with what lb-pools
    # drains (see functions.policy.default_policy); a policy that is set is used as written.
    default = default_policy(ImpactRules(frozenset(impactful), max(0, threshold)))
    policy_text = get("APPROVAL_POLICY")
    try:
        policy = parse_policy(policy_text or default)
    except PolicyError as exc:
        problems.append(f"APPROVAL_POLICY: {exc}")
        policy = parse_policy(default)
    arm_endpoint = _url("ARM_ENDPOINT", get("ARM_ENDPOINT", DEFAULT_ARM_ENDPOINT), problems)
    fallback = _bool("ACKNOWLEDGE_FALLBACK_ENABLED", get("ACKNOWLEDGE_FALLBACK_ENABLED"), problems)
    stale = _int(
        "HEARTBEAT_STALE_SECONDS",
        get("HEARTBEAT_STALE_SECONDS", str(DEFAULT_HEARTBEAT_STALE)),
        problems,
        minimum=60,
        maximum=7 * 86_400,
    )
    store_url = get("HEARTBEAT_STORE_URL")
    if not store_url and get("AzureWebJobsStorage__accountName"):
        account = get("AzureWebJobsStorage__accountName")
        store_url = f"https://{account}.blob.core.windows.net/{HEARTBEAT_CONTAINER}"
    if fallback and not store_url:
        problems.append(
            "HEARTBEAT_STORE_URL: required when ACKNOWLEDGE_FALLBACK_ENABLED is true "
            "(or set AzureWebJobsStorage__accountName)"
        )
    elif store_url:
        store_url = _url("HEARTBEAT_STORE_URL", store_url, problems)

    eventgrid = _bool("EVENTGRID_INGEST_ENABLED", get("EVENTGRID_INGEST_ENABLED"), problems)
    state_url = get("EVENTGRID_STATE_URL")
    if not state_url and get("AzureWebJobsStorage__accountName"):
        account = get("AzureWebJobsStorage__accountName")
        state_url = f"https://{account}.blob.core.windows.net/{EVENTGRID_STATE_CONTAINER}"
    if eventgrid and not state_url:
        problems.append(
            "EVENTGRID_STATE_URL: required when EVENTGRID_INGEST_ENABLED is true "
            "(or set AzureWebJobsStorage__accountName)"
        )
    elif state_url:
        state_url = _url("EVENTGRID_STATE_URL", state_url, problems)
    agentless_groups = _resource_groups("AGENTLESS_RESOURCE_GROUPS", get, problems)
    managed_groups = _resource_groups("LB_MANAGED_RESOURCE_GROUPS", get, problems)
    agentless_patterns = _list(get("AGENTLESS_VM_PATTERNS"))
    for pattern in agentless_patterns:
        if not _PATTERN.fullmatch(pattern):
            problems.append(
                f"AGENTLESS_VM_PATTERNS: {pattern[:100]!r} is not a VM name pattern "
                "(letters, digits, _ . - and the wildcards * ? [ ] !)"
            )
    min_healthy = _int(
        "LB_MIN_HEALTHY",
        get("LB_MIN_HEALTHY", str(DEFAULT_MIN_HEALTHY)),
        problems,
        minimum=0,
        maximum=1000,
    )
    try:
        budgets = parse_budgets(
            max(min_healthy, 0), get("LB_MAX_UNAVAILABLE"), get("LB_POOL_BUDGETS")
        )
    except ValueError as exc:
        problems.append(str(exc))
        budgets = Budgets()
    pool_state_url = get("LB_POOL_STATE_URL")
    if not pool_state_url and get("AzureWebJobsStorage__accountName"):
        account = get("AzureWebJobsStorage__accountName")
        pool_state_url = f"https://{account}.blob.core.windows.net/{POOL_STATE_CONTAINER}"
    if (min_healthy > 0 or budgets.active) and not pool_state_url:
        problems.append(
            "LB_POOL_STATE_URL: required while LB_MIN_HEALTHY is above 0 or a budget is set (or "
            "set AzureWebJobsStorage__accountName): the capacity guard locks each pool there"
        )
    elif pool_state_url:
        pool_state_url = _url("LB_POOL_STATE_URL", pool_state_url, problems)
    moments_queue = get("DrainMomentsQueueName")
    if moments_queue and not pool_state_url:
        problems.append(
            "LB_POOL_STATE_URL: required while DrainMomentsQueueName is set (or set "
            "AzureWebJobsStorage__accountName): each event's drain moment is kept there"
        )

    history_subscription = get("HistorySubscriptionName")
    history_url = get("HISTORY_TABLE_URL")
    if not history_url and get("AzureWebJobsStorage__accountName"):
        account = get("AzureWebJobsStorage__accountName")
        history_url = f"https://{account}.table.core.windows.net/{HISTORY_TABLE}"
    if history_subscription and not history_url:
        problems.append(
            "HISTORY_TABLE_URL: required when HistorySubscriptionName is set "
            "(or set AzureWebJobsStorage__accountName)"
        )
    elif history_url:
        history_url = _url("HISTORY_TABLE_URL", history_url, problems)
        if not urlsplit(history_url).path.strip("/"):
            problems.append("HISTORY_TABLE_URL: names no table (.../<table name>)")
    retention = _int(
        "HISTORY_RETENTION_DAYS",
        get("HISTORY_RETENTION_DAYS", str(DEFAULT_HISTORY_RETENTION_DAYS)),
        problems,
        minimum=1,
        maximum=3650,
    )
    window = _int(
        "CALENDAR_WINDOW_DAYS",
        get("CALENDAR_WINDOW_DAYS", str(DEFAULT_CALENDAR_WINDOW_DAYS)),
        problems,
        minimum=1,
        maximum=366,
    )

    settings = Settings(
        topic_name=required("TopicName"),
        teams_subscription=required("TeamsSubscriptionName")
        if webhook
        else get("TeamsSubscriptionName"),
        lb_pools_subscription=required("LbPoolsSubscriptionName"),
        approval_gate_subscription=required("ApprovalGateSubscriptionName"),
        approvals_queue=required("ApprovalsQueueName"),
        custom_subscription=get("CustomSubscriptionName"),
        servicebus_namespace=namespace,
        approval_base_url=base_url,
        policy=policy,
        impactful_event_types=frozenset(impactful),
        freeze_threshold_seconds=threshold,
        managed_resource_groups=managed_groups,
        arm_endpoint=arm_endpoint,
        acknowledge_fallback_enabled=fallback,
        heartbeat_stale_seconds=stale,
        heartbeat_store_url=store_url if fallback else "",
        custom_subscriber_enabled=_bool(
            "CUSTOM_SUBSCRIBER_ENABLED", get("CUSTOM_SUBSCRIBER_ENABLED"), problems
        ),
        min_healthy=min_healthy,
        pool_state_url=pool_state_url,
        budgets=budgets,
        drain_moments_queue=moments_queue,
        teams_webhook_url=webhook,
        approval_signing_key=key.encode("utf-8"),
        servicebus_connection_string=connection_string,
        eventgrid_ingest_enabled=eventgrid,
        eventgrid_state_url=state_url if eventgrid else "",
        agentless_resource_groups=agentless_groups,
        agentless_vm_patterns=agentless_patterns,
        history_subscription=history_subscription,
        history_table_url=history_url if history_subscription else "",
        history_retention_days=retention,
        calendar_window_days=window,
    )
    settings = _with_webhooks(settings, env, problems)
    if not settings.teams_enabled and not settings.webhooks and not env.get("WEBHOOKS", "").strip():
        problems.append(
            "no notifier: set TEAMS_WEBHOOK_URL (a Teams Workflows webhook URL) or list an "
            "endpoint in WEBHOOKS (Slack, PagerDuty or generic JSON, with "
            "WebhooksSubscriptionName); people must hear about maintenance one way or the other"
        )
    if settings.custom_subscriber_enabled and not settings.custom_subscription:
        problems.append("CustomSubscriptionName: required when CUSTOM_SUBSCRIBER_ENABLED is true")
    if problems:
        raise SettingsError("invalid app settings: " + "; ".join(problems))
    return settings


def _resource_groups(name: str, get: Callable[..., str], problems: list[str]) -> tuple[str, ...]:
    """A comma-separated list of resource groups, each checked against Azure's rule (a name
    no group can have would never match, and an allow-list that silently matches nothing
    refuses every message as a security event)."""
    groups = _list(get(name))
    for group in groups:
        if not names.RESOURCE_GROUP.valid(group):
            problems.append(f"{name}: {group[:100]!r} is not a resource group name")
    return groups


def _with_webhooks(settings: Settings, env: Mapping[str, str], problems: list[str]) -> Settings:
    """The webhooks workflow's settings (WebhooksSubscriptionName, WEBHOOKS and the secret
    settings its endpoints name), validated by functions/webhooks/config.py."""
    subscription = env.get("WebhooksSubscriptionName", "").strip()
    endpoints = load_endpoints(
        env, problems, subscription=subscription, known_event_types=KNOWN_EVENT_TYPES
    )
    pages = _int(
        "WEBHOOK_PAGES_PER_OBSERVER_HOUR",
        env.get("WEBHOOK_PAGES_PER_OBSERVER_HOUR", str(DEFAULT_PAGES_PER_OBSERVER_HOUR)),
        problems,
        minimum=1,
        maximum=1000,
    )
    return replace(
        settings,
        webhooks_subscription=subscription,
        webhooks=endpoints,
        pages_per_observer_hour=pages,
    )


@dataclass(frozen=True)
class Workflow:
    """One workflow of the app: whether it runs and, if not, the setting that turns it on."""

    name: str  # the blueprint's, as function_app.py registers it
    on: bool
    detail: str = ""  # on: what it does with the settings; off: why, and how to turn it on

    def describe(self) -> str:
        state = "on" if self.on else "off"
        return f"{self.name} {state}" + (f" ({self.detail})" if self.detail else "")


def workflows(settings: Settings) -> tuple[Workflow, ...]:
    """Every workflow in the order function_app.py registers them, on or off by ``settings``."""
    endpoints = ", ".join(f"{e.name} ({e.preset})" for e in settings.webhooks)
    return (
        Workflow(
            "teams",
            settings.teams_enabled,
            "cards to the Teams Workflows webhook"
            if settings.teams_enabled
            else "TEAMS_WEBHOOK_URL is not set: a Teams Workflows webhook URL turns it on",
        ),
        Workflow("lb_pools", True, f"LB_MIN_HEALTHY {settings.min_healthy}"),
        Workflow("approval_gate", True, "with the approve link"),
        Workflow(
            "drain_moments",
            bool(settings.drain_moments_queue),
            f"lb-pools drains at NotBefore minus the lead, queue {settings.drain_moments_queue}"
            if settings.drain_moments_queue
            else "DrainMomentsQueueName is not set: lb-pools drains at first sight",
        ),
        Workflow(
            "webhooks",
            bool(settings.webhooks_subscription),
            (f"endpoints: {endpoints}" if endpoints else "WEBHOOKS lists no endpoint")
            if settings.webhooks_subscription
            else "WebhooksSubscriptionName is not set: the subscription's name turns it on",
        ),
        Workflow(
            "custom_example",
            settings.custom_subscriber_enabled,
            f"subscription {settings.custom_subscription}"
            if settings.custom_subscriber_enabled
            else "CUSTOM_SUBSCRIBER_ENABLED is not true",
        ),
        Workflow(
            "eventgrid_ingest",
            settings.eventgrid_ingest_enabled,
            "" if settings.eventgrid_ingest_enabled else "EVENTGRID_INGEST_ENABLED is not true",
        ),
        Workflow(
            "history",
            bool(settings.history_subscription),
            f"retention {settings.history_retention_days} days"
            if settings.history_subscription
            else "HistorySubscriptionName is not set: the subscription's name turns it on",
        ),
    )


def workflows_line(settings: Settings) -> str:
    """The start-up line: each workflow, on or off, and why any is off."""
    return "workflows: " + "; ".join(w.describe() for w in workflows(settings))
