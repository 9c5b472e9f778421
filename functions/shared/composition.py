"""The composition root: settings in, production adapters out (the only place both meet).

Settings are read from the environment once, when function_app.py is imported, so a bad
setting fails the start. Adapters are built on first use and shared by every invocation of
the process. Tests hand in their own adapters with :func:`use` (recording fakes for
Service Bus) or let :func:`build` wire the real ones against loopback servers.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.adapters.sessions import Session
from functions.approval_gate.agentless import AgentlessRules
from functions.approval_gate.core import Fallback, Gate
from functions.eventgrid_ingest.core import EventStateStore, Ingestor
from functions.history.core import (
    History,
    HistoryStore,
    PendingEntries,
    PurgeSchedule,
    StoreRecorder,
)
from functions.lb_pools.core import PARALLEL_WRITES, DrainRequest, LbPools, PoolKey, Verdict
from functions.lb_pools.guard import CapacityGuard
from functions.shared import seal, tracing
from functions.shared.batching import Batcher, side_by_side
from functions.shared.drain_plan import DrainPlan
from functions.shared.impact import ImpactRules
from functions.shared.ports import (
    ActionRecorder,
    ArmClient,
    Clock,
    CommandSender,
    HeartbeatStore,
    MomentScheduler,
    NoActions,
    PoolStore,
    TeamsPoster,
    TopicPublisher,
)
from functions.shared.scope import TrustRules
from functions.shared.settings import Settings, load_settings
from functions.shared.transient import RetryWindow
from functions.webhooks.budget import PageBudget
from functions.webhooks.ports import WebhookPoster

log = logging.getLogger("sebridge.functions")

TEAMS_RETRY_ATTEMPTS = 3
TEAMS_RETRY_TOTAL_SECONDS = 30.0
# Webhook endpoints get the Teams workflow's retry rules, per endpoint.
WEBHOOK_RETRY_ATTEMPTS = TEAMS_RETRY_ATTEMPTS
WEBHOOK_RETRY_TOTAL_SECONDS = TEAMS_RETRY_TOTAL_SECONDS


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Dependencies:
    settings: Settings
    teams: TeamsPoster
    arm: ArmClient
    publisher: TopicPublisher
    commands: CommandSender
    heartbeats: HeartbeatStore | None
    clock: Clock = utcnow
    webhooks: WebhookPoster | None = None
    event_state: EventStateStore | None = None  # only with EVENTGRID_INGEST_ENABLED
    pools: PoolStore | None = None  # the capacity guard's locks and held events
    moments: MomentScheduler | None = None  # lb-pools' drain moments (DrainMomentsQueueName)
    # One per process: lb-pools decisions on the same pools, from concurrent invocations, are
    # taken together under one lease (functions.lb_pools.core, functions.shared.batching).
    pool_decisions: Batcher[PoolKey, DrainRequest, Verdict] = field(default_factory=Batcher)
    history_store: HistoryStore | None = None  # only with HistorySubscriptionName
    # One per process: the history's retention runs at most once per interval per process.
    history_purges: PurgeSchedule = field(default_factory=PurgeSchedule)
    # One per process: actions lb-pools could not record while the table was down.
    history_pending: PendingEntries = field(default_factory=PendingEntries)
    # How long one history write rides out storage faults (functions.shared.transient).
    history_window: RetryWindow = field(default_factory=RetryWindow)
    # How long lb-pools waits for restored members to be probed Up, and how often it looks
    # (None: its SETTLE_SECONDS and SETTLE_POLL_SECONDS, 60 s and 5 s).
    restore_settle_seconds: float | None = None
    restore_settle_poll_seconds: float | None = None

    @property
    def trust(self) -> TrustRules:
        return TrustRules.of(
            self.settings.managed_resource_groups,
            seal.app_key(self.settings.approval_signing_key),
        )

    @property
    def capacity_guard(self) -> CapacityGuard:
        """The capacity decision every early approval asks (functions.lb_pools.guard)."""
        return CapacityGuard(
            self.arm, self.pools, self.settings.min_healthy, budgets=self.settings.budgets
        )

    @property
    def lb_pools(self) -> LbPools:
        return LbPools(
            self.arm,
            self.publisher,
            self.impact,
            rules=self.trust,
            pools=self.pools,
            min_healthy=self.settings.min_healthy,
            budgets=self.settings.budgets,
            decisions=self.pool_decisions,
            side_by_side=side_by_side(PARALLEL_WRITES),
            alerts=self.teams,
            scheduler=self.moments,
            plan=self.drain_plan,
            actions=self.actions,
            settle_seconds=self.restore_settle_seconds,
            settle_poll_seconds=self.restore_settle_poll_seconds,
        )

    @property
    def drain_plan(self) -> DrainPlan:
        """When lb-pools drains an event (it schedules by it; cards and webhooks say it)."""
        return DrainPlan(
            self.settings.policy,
            bool(self.settings.drain_moments_queue),
            self.impact,
            records=self.pools,
        )

    @property
    def history(self) -> History:
        if self.history_store is None:
            raise RuntimeError("the history is not enabled (HistorySubscriptionName)")
        return History(
            self.history_store,
            timedelta(days=self.settings.history_retention_days),
            self.history_purges,
            window=self.history_window,
            pending=self.history_pending,
        )

    @property
    def actions(self) -> ActionRecorder:
        """Where lb-pools records what reaches no topic: the history, when it is on."""
        if self.history_store is None:
            return NoActions()
        return StoreRecorder(self.history, "lb-pools")

    @property
    def page_budget(self) -> PageBudget | None:
        """New incidents per observer and hour (functions.webhooks.budget), kept in the pool
        store; None without one (local runs without LB_POOL_STATE_URL)."""
        if self.pools is None:
            return None
        return PageBudget(self.pools, self.settings.pages_per_observer_hour)

    @property
    def impact(self) -> ImpactRules:
        return ImpactRules(
            self.settings.impactful_event_types, self.settings.freeze_threshold_seconds
        )

    @property
    def gate(self) -> Gate:
        fallback = None
        if self.settings.acknowledge_fallback_enabled and self.heartbeats is not None:
            fallback = Fallback(
                self.heartbeats, timedelta(seconds=self.settings.heartbeat_stale_seconds)
            )
        agentless = AgentlessRules.of(
            self.settings.agentless_resource_groups, self.settings.agentless_vm_patterns
        )
        return Gate(
            self.settings.policy,
            self.impact,
            self.arm,
            self.commands,
            fallback,
            rules=self.trust,
            agentless=agentless,
            guard=self.capacity_guard,
            scheduler=self.moments,
            replan=self._replan,
        )

    def _replan(self, event_id: str, now: datetime) -> object:
        """The gate found an event outside its windows: lb-pools puts back what it drained
        for a window that closed (functions.lb_pools.core.LbPools.replan)."""
        return self.lb_pools.replan(event_id, now)

    @property
    def eventgrid_ingest(self) -> Ingestor:
        if self.event_state is None:
            raise RuntimeError("the Event Grid ingestion is not enabled (EVENTGRID_INGEST_ENABLED)")
        return Ingestor(self.event_state, self.publisher, self.clock)


_lock = threading.Lock()
_settings: Settings | None = None
_deps: Dependencies | None = None


def settings() -> Settings:
    """The validated settings (read once); raises SettingsError naming every bad one."""
    global _settings
    with _lock:
        if _settings is None:
            _settings = load_settings(os.environ)
            log.info("settings loaded", extra={"settings": _settings.describe()})
        return _settings


def build(config: Settings, **overrides: Any) -> Dependencies:
    """Production adapters for ``config``; keyword arguments replace single adapters."""
    from azure.identity import DefaultAzureCredential

    from functions.adapters.arm import ArmRestClient
    from functions.adapters.arm_cache import CachedVmReads
    from functions.adapters.event_state import BlobEventStateStore
    from functions.adapters.heartbeats import BlobHeartbeatStore
    from functions.adapters.pool_state import BlobPoolStore
    from functions.adapters.retry import RetryPolicy
    from functions.adapters.servicebus import (
        SdkCommandSender,
        SdkMomentScheduler,
        SdkTopicPublisher,
        ServiceBusSender,
    )
    from functions.adapters.teams_webhook import TeamsOff, TeamsWebhookPoster

    credential = overrides.pop("credential", None) or DefaultAzureCredential()
    session = Session()
    parts: dict[str, Any] = {}
    if "teams" not in overrides and not config.teams_enabled:
        parts["teams"] = TeamsOff()
    elif "teams" not in overrides:
        parts["teams"] = TeamsWebhookPoster(
            config.teams_webhook_url,
            session=session,
            policy=RetryPolicy(
                attempts=TEAMS_RETRY_ATTEMPTS, max_total_wait=TEAMS_RETRY_TOTAL_SECONDS
            ),
        )
    if "arm" not in overrides:
        # The scope check reads the same VMs for every message: cached (bounded in time).
        parts["arm"] = CachedVmReads(
            ArmRestClient(config.arm_endpoint, credential, session=session)
        )
    wants_moments = bool(config.drain_moments_queue) and "moments" not in overrides
    if "publisher" not in overrides or "commands" not in overrides or wants_moments:
        sender = ServiceBusSender(
            namespace=config.servicebus_namespace,
            connection_string=config.servicebus_connection_string,
        )
        parts["publisher"] = SdkTopicPublisher(sender, config.topic_name)
        parts["commands"] = SdkCommandSender(sender, config.approvals_queue)
        if wants_moments:
            parts["moments"] = SdkMomentScheduler(sender, config.drain_moments_queue)
    parts["heartbeats"] = (
        BlobHeartbeatStore(config.heartbeat_store_url, credential, session=session)
        if config.heartbeat_store_url
        else None
    )
    if "webhooks" not in overrides:
        parts["webhooks"] = _webhook_poster(session)
    if config.eventgrid_ingest_enabled and "event_state" not in overrides:
        parts["event_state"] = BlobEventStateStore(
            config.eventgrid_state_url, credential, session=session
        )
    if config.history_subscription and "history_store" not in overrides:
        from functions.adapters.history_table import TableHistoryStore

        parts["history_store"] = TableHistoryStore(config.history_table_url, credential)
    if config.pool_state_url and "pools" not in overrides:
        parts["pools"] = BlobPoolStore(config.pool_state_url, credential, session=session)
    parts.update(overrides)
    # Whatever the app publishes to the topic carries its seal (functions.shared.seal).
    parts["publisher"] = seal.SealingPublisher(
        parts["publisher"], seal.app_key(config.approval_signing_key)
    )
    # ... and is sent in a span of the event's trace, whose context it carries (one trace per
    # event: functions.shared.tracing); so is every approve command.
    parts["publisher"] = tracing.TracingPublisher(parts["publisher"])
    parts["commands"] = tracing.TracingCommands(parts["commands"])
    return Dependencies(settings=config, **parts)


def _webhook_poster(session: Any) -> WebhookPoster:
    from functions.adapters.retry import RetryPolicy
    from functions.adapters.webhook_poster import HttpWebhookPoster

    policy = RetryPolicy(
        attempts=WEBHOOK_RETRY_ATTEMPTS, max_total_wait=WEBHOOK_RETRY_TOTAL_SECONDS
    )
    return HttpWebhookPoster(session=session, policy=policy)


def dependencies() -> Dependencies:
    global _deps
    config = settings()
    with _lock:
        if _deps is None:
            _deps = build(config)
        return _deps


def use(deps: Dependencies | None) -> None:
    """Tests: run the functions with these adapters (None: back to lazy production wiring)."""
    global _deps, _settings
    with _lock:
        _deps = deps
        _settings = deps.settings if deps is not None else None
