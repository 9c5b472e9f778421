"""lb-pools: take affected VMs out of load balancer backend pools and put them back (core).

Scheduled, Updated and Started of an impactful event drain every NIC of every affected VM;
once all of them are out of all pools (or gone), a Scheduled or Updated publishes ``Prepared``
for the approval gate. Completed and Cancelled restore what the NIC's tag recorded, except
after a Terminate or Preempt that completed (the VM is gone; a cancelled one is restored).
Every step reads ARM first, so a replay finds the work done and changes nothing. Faults
propagate: Service Bus redelivers the message. A missing permission (ARM 403) is not a fault
a retry repairs: it is logged at ERROR naming the permission and scope, the VM stays in its
pools (no Prepared) and the message completes.

Trust: nothing is done before the message passed the scope check (functions.shared.scope):
the observer is who it claims to be and every affected VM shares its availability set or scale
set. A refused message is logged as a security event and changes nothing.

Capacity (``LB_MIN_HEALTHY``, functions.lb_pools.capacity): a drain (Scheduled, Updated or
Started alike: a forged Started gains nothing) takes the locks of every pool its VMs are in
(functions.adapters.pool_state), reads the pools' health under them (members that events
approved early take down count as gone), and drains only if no pool is left with fewer healthy
members than the minimum.
Otherwise the VMs stay in their pools, the event is remembered in the blocking pool's state
(functions.lb_pools.held) and a ``Held`` transition is published (the card says why; the gate
sees the VMs still in their pools and does not approve early). When an event completes and its
VMs go back into their pools, the held events of those pools are tried again in NotBefore order; a
restored member that the probe does not report Up yet is waited for (bounded), because the
held event needs it healthy. A held event's Started stays held while its VM is a healthy
member: a VM that is really going down is probed Down soon, and a Down member leaves without
counting. When an event that was approved early ends, the members it took down serve again and
the pools' held events are tried again the same way.

Bursts (functions.shared.batching): the drains that wait for the same pools in one process are
decided together, by one of their invocations, under one lease: the events that queued up while
one batch was being decided form the next, are decided in the order they came (each as if the
ones before it were already out) and their NICs are written side by side. So the tenth event of
a pool waits for one batch, not for nine leases taken and given back, each with a NIC write
that waits for ARM's long-running operation. Instances of the app still take turns on the
pool's lease.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from functions.approval_gate.policy import Policy
from functions.lb_pools import capacity, held, moments, nic_pools
from functions.shared import deliveries, event_record, write_window
from functions.shared import scope as trust
from functions.shared.drain_plan import DrainPlan
from functions.shared.impact import ImpactRules, restores_afterwards
from functions.shared.ports import (
    ActionRecorder,
    ArmClient,
    ArmDocument,
    MomentScheduler,
    NoActions,
    PermissionDenied,
    PoolLease,
    PoolStore,
    PreconditionFailed,
    ReferenceMissing,
    TeamsPoster,
    TopicPublisher,
    WriteRefused,
)
from functions.shared.verified import (
    Checked,
    UnverifiedMessage,
    VerifiedMessage,
    verify_and_log,
)
from functions.shared.vms import ResolvedVm, VmKind
from functions.teams.cards import not_restored_card
from sebridge.contract.events import (
    ContractError,
    Transition,
    TransitionMessage,
    held_message,
    parse_message,
    prepared_message,
)

log = logging.getLogger("sebridge.functions.lb_pools")

SOURCE = "urn:sebridge:function:lb-pools"
DRAIN_ON = (Transition.SCHEDULED, Transition.UPDATED, Transition.STARTED)
PREPARED_AFTER = (Transition.SCHEDULED, Transition.UPDATED)
RESTORE_ON = (Transition.COMPLETED, Transition.CANCELLED)
MAX_ETAG_RETRIES = 3
MAX_LOCK_ROUNDS = 3
SETTLE_SECONDS = 60.0  # how long a restore waits for its members to be probed Up again
SETTLE_POLL_SECONDS = 5.0
PROBE_MAX_AGE_SECONDS = capacity.PROBE_MAX_AGE_SECONDS  # older verdicts are asked for again
PARALLEL_WRITES = 16  # NIC writes of one batch of decisions under way at once (in the app)

Restored = dict[str, set[str]]  # lower-case pool id -> ip configuration ids put back


@dataclass
class LbOutcome:
    action: str  # "drain", "defer" (drained at ``drain_at``), "restore" or "ignore"
    changed: list[str] = field(default_factory=list)  # NIC ids that were PUT
    not_ready: list[str] = field(default_factory=list)  # VMs still in a pool
    published_prepared: bool = False
    held: capacity.Blocked | None = None
    refused: str = ""
    resumed: list[str] = field(default_factory=list)  # held events drained after a restore
    reason: str = ""
    # (VM, pool id) not put back: the pool (or its load balancer) no longer exists
    not_restored: list[tuple[str, str]] = field(default_factory=list)
    # (VM, ip configuration, pool id) not put back: the NIC no longer has that configuration
    vanished: list[tuple[str, str, str]] = field(default_factory=list)
    kept_out: list[str] = field(default_factory=list)  # VMs another event still has out
    # (VM, NIC id, ARM's error code) not put back: ARM refused the NIC's restore for good (a
    # lasting 4xx); the NIC keeps its record, for an operator to put it back by hand
    refused_restores: list[tuple[str, str, str]] = field(default_factory=list)
    drain_at: datetime | None = None  # "defer": the drain moment scheduled

    @property
    def not_restored_count(self) -> int:
        """Everything recorded that could not be put back (the invocation line's notRestored)."""
        return len(self.not_restored) + len(self.vanished) + len(self.refused_restores)


def _change_nic(
    arm: ArmClient,
    nic_id: str,
    plan: Callable[[dict[str, object], str], nic_pools.NicChange | None],
    read: ArmDocument | None = None,
) -> tuple[nic_pools.NicChange | None, bool]:
    """(the change made or None, gone): read (or take ``read``, just read), plan, PUT with
    If-Match; re-read when someone else wrote first."""
    for _ in range(MAX_ETAG_RETRIES):
        nic, read = read or arm.get_nic(nic_id), None
        if nic is None:
            return None, True
        change = plan(nic.body, nic_id)
        if change is None:
            return None, False
        try:
            arm.put_nic(nic_id, change.body, nic.etag)
        except PreconditionFailed:
            log.info("NIC changed while we wrote it, re-reading", extra={"nic": nic_id})
            continue
        log.info("NIC pools changed", extra={"nic": nic_id, "pools": change.pools})
        return change, False
    raise PreconditionFailed(f"{nic_id}: still changing after {MAX_ETAG_RETRIES} attempts")


def claim_of(verified: VerifiedMessage, now: datetime) -> nic_pools.Claim:
    """The claim a drain for ``verified`` puts on each NIC it takes out: its event in its
    verified scope (VerifiedMessage.scoped_key: another scope's end never drops it), until the
    event ends at the latest (from the message's own time, so a replay claims the same)."""
    message = verified.message
    event = message.event
    assert event is not None
    return nic_pools.Claim(verified.scoped_key, held.maintenance_until(event, message.time or now))


def dropped_resources(message: TransitionMessage) -> list[str]:
    """VMs an Updated transition removed from Resources (from the ``changes`` field)."""
    changes = message.data.get("changes")
    change = changes.get("Resources") if isinstance(changes, dict) else None
    if not isinstance(change, dict):
        return []
    before, after = change.get("from"), change.get("to")
    if not isinstance(before, list) or not isinstance(after, list):
        return []
    kept = {name.lower() for name in after if isinstance(name, str)}
    return [name for name in before if isinstance(name, str) and name.lower() not in kept]


def _event_grid(message: TransitionMessage) -> dict[str, Any] | None:
    """An event observed through Event Grid stays so in what lb-pools reports on it (the gate
    then approves it the agentless way)."""
    provenance = message.data.get("eventGrid")
    return dict(provenance) if isinstance(provenance, dict) else None


@dataclass
class DrainRequest:
    """One event's drain, waiting for (or in) a batch of decisions on its pools."""

    verified: VerifiedMessage
    vms: list[ResolvedVm]
    outcome: LbOutcome
    now: datetime
    resume_pool: str | None  # a held event tried again because this pool got members back
    check: bool  # the capacity guard applies
    probes: capacity.Probes  # verdicts asked for before the locks (with when)
    probed_at: float

    @property
    def message(self) -> TransitionMessage:
        return self.verified.message

    @property
    def key(self) -> str:
        """The event in its verified scope: what the pools keep of it is kept under this."""
        return self.verified.scoped_key


@dataclass
class Verdict:
    relock: dict[str, set[str]] | None = None  # the VMs are in other pools now: lock those
    held: capacity.Blocked | None = None
    held_vms: list[str] = field(default_factory=list)
    unreadable: str = ""  # the pools' health could not be read (ARM 403): nothing drained


def _names_in(vms: list[ResolvedVm], in_pool: set[str]) -> list[str]:
    """The VMs with an ip configuration among ``in_pool`` (lower-case ip configuration ids)."""
    return [
        vm.name
        for vm in vms
        if any(
            ipc.startswith(f"{nic.lower()}/ipconfigurations/")
            for nic in vm.nic_ids
            for ipc in in_pool
        )
    ]


PoolKey = tuple[str, ...]  # the lower-case ids of the pools a decision locks, sorted
Decide = Callable[[PoolKey, list[DrainRequest]], Sequence[Verdict | BaseException]]


class DecisionBatches(Protocol):
    """Where decisions on the same pools wait to be decided together (the process's one
    functions.shared.batching.Batcher in the app): ``decide`` is called with the requests of
    one batch, by one of the waiting threads."""

    def submit(self, key: PoolKey, request: DrainRequest, serve: Decide) -> Verdict: ...


class OneAtATime:
    """Each decision in a batch of its own (tests that need no threads; the core's default)."""

    def submit(self, key: PoolKey, request: DrainRequest, serve: Decide) -> Verdict:
        (result,) = serve(key, [request])
        if isinstance(result, BaseException):
            raise result
        return result


SideBySide = Callable[[Sequence[Callable[[], None]]], list[BaseException | None]]


def one_after_another(calls: Sequence[Callable[[], None]]) -> list[BaseException | None]:
    """Run ``calls`` in turn: what each raised, or None (the core's default; the app runs a
    batch's NIC writes side by side, functions.shared.batching.side_by_side)."""
    errors: list[BaseException | None] = []
    for call in calls:
        try:
            call()
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - that call's own failure
            errors.append(exc)
    return errors


@dataclass(frozen=True)
class LbPools:
    arm: ArmClient
    publisher: TopicPublisher
    impact: ImpactRules
    rules: trust.TrustRules = field(default_factory=trust.TrustRules)
    pools: PoolStore | None = None  # None: no capacity guard (LB_MIN_HEALTHY=0)
    min_healthy: int = 0
    # Disruption budgets (LB_MAX_UNAVAILABLE, LB_POOL_BUDGETS); None: LB_MIN_HEALTHY alone.
    budgets: capacity.Budgets | None = None
    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    settle_seconds: float | None = None  # None: SETTLE_SECONDS
    settle_poll_seconds: float | None = None  # None: SETTLE_POLL_SECONDS
    # Decisions on the same pools from concurrent invocations are batched, and a batch's NIC
    # writes run side by side: composition passes the process's one Batcher and a thread pool;
    # the defaults do neither (one decision at a time, writes in turn).
    decisions: DecisionBatches = field(default_factory=OneAtATime)
    side_by_side: SideBySide = one_after_another
    alerts: TeamsPoster | None = None  # a card for what could not be restored
    # Drain at the moment (functions.lb_pools.moments): the drain-moments queue (None: every
    # drain at first sight) and when (APPROVAL_POLICY leadSeconds, functions.shared.drain_plan).
    scheduler: MomentScheduler | None = None
    plan: DrainPlan = field(default_factory=lambda: DrainPlan(Policy(rules=()), True))
    # What reaches no topic, for the event's history (functions/history): the VMs put back.
    actions: ActionRecorder = field(default_factory=NoActions)

    @property
    def guarded(self) -> bool:
        active = self.budgets.active if self.budgets is not None else self.min_healthy > 0
        return self.pools is not None and active

    @property
    def minimum(self) -> int | capacity.Budgets:
        """What the capacity decision keeps in each pool."""
        return self.budgets if self.budgets is not None else self.min_healthy

    # ---- entry ---------------------------------------------------------------------------
    @staticmethod
    def _action(message: TransitionMessage, impact: ImpactRules) -> tuple[str, str]:
        """("drain", "restore" or "ignore", why it is ignored)."""
        event = message.event
        if event is None:
            return "ignore", "no event"
        if message.transition in DRAIN_ON:
            if not impact.is_impactful(event):
                return "ignore", f"{event.event_type} is not impactful"
            return "drain", ""
        if message.transition in RESTORE_ON:
            return "restore", ""
        return "ignore", f"{message.transition.value} needs nothing"

    def handle(
        self,
        message: TransitionMessage,
        now: datetime,
        *,
        resume_pool: str | None = None,
        due: bool = False,
    ) -> LbOutcome:
        """Verify ``message`` (the trigger layer does this before :meth:`handle_verified`;
        a held event tried again is verified anew), then handle it.

        ``resume_pool``: this is a held event tried again because that pool got members
        back; it is drained only if that pool still lists it as held (under the pool's lock).
        ``due``: its drain moment arrived (:meth:`fire`): drained now."""
        action, reason = self._action(message, self.impact)
        if action == "ignore":
            return LbOutcome(action, reason=reason)
        checked = verify_and_log("lb_pools", self.arm, message, self.rules, records=self.pools)
        if isinstance(checked, UnverifiedMessage):
            return LbOutcome(action, refused=checked.reason)
        return self.handle_verified(checked, now, resume_pool=resume_pool, due=due)

    def handle_verified(
        self,
        verified: VerifiedMessage,
        now: datetime,
        *,
        resume_pool: str | None = None,
        due: bool = False,
    ) -> LbOutcome:
        message = verified.message
        action, reason = self._action(message, self.impact)
        if action == "ignore":
            return LbOutcome(action, reason=reason)
        event = message.event
        assert event is not None
        outcome = LbOutcome(action)
        vms = self._allowed(message, list(verified.scope.vms), outcome)
        if outcome.refused:
            return outcome
        if action == "drain":
            if resume_pool is None and self._deferred(verified, outcome, now, due=due):
                if message.transition is Transition.UPDATED:
                    self._restore_dropped(verified, outcome, now)
                return outcome
            self._drain(verified, vms, outcome, now, resume_pool)
            if outcome.reason:
                return outcome
            if message.transition in PREPARED_AFTER and not outcome.not_ready and not outcome.held:
                self._publish_prepared(message, vms, now)
                outcome.published_prepared = True
            if message.transition is Transition.UPDATED:
                self._restore_dropped(verified, outcome, now)
            return outcome
        # A cancelled Terminate or Preempt never happened: the VM is still there, put it back.
        self._drop_moment(verified.scoped_key)
        restore = message.transition is Transition.CANCELLED or restores_afterwards(event)
        self._end(verified, vms, outcome, now, restore=restore)
        return outcome

    # ---- the drain moment (functions.lb_pools.moments) --------------------------------------
    def drain_at(self, message: TransitionMessage, now: datetime) -> datetime:
        """When the event of ``message`` is drained, planned at ``now`` (the drain plan)."""
        assert message.event is not None
        return self.plan.moment(message.event, message.observer, now)

    def _book(self, kind: str = moments.KEY) -> moments.MomentBook | None:
        """The event records' moments of ``kind`` (None: no drain-moments queue)."""
        if self.scheduler is None or self.pools is None:
            return None
        command = moments.DUE_COMMAND if kind == moments.KEY else moments.DECIDE_COMMAND
        return moments.MomentBook(self.pools, self.scheduler, kind, command)

    def _deferred(
        self, verified: VerifiedMessage, outcome: LbOutcome, now: datetime, *, due: bool = False
    ) -> bool:
        """Whether the drain waits for its moment (scheduled, or already scheduled); False:
        drain now (the moment has come, or there is no drain-moments queue). A drain now is
        remembered as spent, so a later Updated never undoes it. The moment is planned at
        ``now`` (the app's clock, as the gate decides), never at the message's time: a message
        that arrives after its window closed is planned for the next window or NotBefore.
        ``due``: its scheduled moment arrived; drained unless the plan moved it later (the
        window it was for closed meanwhile), then scheduled again."""
        message = verified.message
        event = message.event
        assert event is not None
        book = self._book()
        if book is None:
            return False
        key = verified.scoped_key  # this scope's moment: another's never moves or spends it
        entry = book.read(key)
        if message.transition is Transition.STARTED:
            if entry is not None and not entry.fired:
                book.spend(key, now)
            return False
        if entry is not None and entry.fired:
            return False  # drained already: this drains again (idempotent), Prepared again
        at = self.drain_at(message, now)
        body, message_id = held.body_of(message), message.message_id or event.key
        if due and entry is not None and at <= entry.at:
            return False  # its moment came (a delivery a little early drains all the same)
        if at <= now:
            book.spend(key, at, message_id, body)
            return False
        book.set(key, at, message_id, body)
        log.info(
            "event %s: %s drained at %s (its drain moment), not now",
            event.key,
            event.event_type,
            at.isoformat(),
            extra={"eventId": event.key, "drainAt": at.isoformat()},
        )
        outcome.action, outcome.drain_at = "defer", at
        return True

    def replan(self, key: str, now: datetime) -> LbOutcome:
        """The gate found the event outside its windows, unapproved: if lb-pools drained it
        for a window that closed (or one that moved), its plan at ``now`` says a later
        moment, so its VMs go back into their pools now and are drained again then (the lead
        before the next window that opens before NotBefore, else before NotBefore). Never
        out of their pools for days waiting for nothing. A drain the plan still wants now
        (the lead before NotBefore has come) is left alone. ``key``: the verified scope the
        gate decided in (its moments are that scope's only)."""
        book = self._book()
        if book is None:
            return LbOutcome("ignore", reason="no drain moments configured")
        entry = book.read(key)
        if entry is None or not entry.fired:
            return LbOutcome("ignore", reason="not drained by lb-pools")
        try:
            body = json.dumps(dict(entry.body), separators=(",", ":")).encode("utf-8")
            message = parse_message(body, entry.message_id)
        except ContractError as exc:
            log.error("drain not planned again: its message is unreadable: %s", exc)
            return LbOutcome("ignore", reason="unreadable")
        if message.event is None or message.event.is_started:
            return LbOutcome("ignore", reason="started")
        at = self.drain_at(message, now)
        if at <= now:
            return LbOutcome("ignore", reason="drained for its moment")
        checked = self._verify(message)
        if isinstance(checked, UnverifiedMessage):
            return LbOutcome("restore", refused=checked.reason)
        if checked.scoped_key != key:
            return LbOutcome("ignore", reason="another scope's drain")
        outcome = LbOutcome("restore")
        vms = self._allowed(message, list(checked.scope.vms), outcome)
        if outcome.refused:
            return outcome
        log.warning(
            "event %s was drained for a maintenance window that closed without an approval: "
            "its VMs go back into their pools until %s",
            message.event.key,
            at.isoformat(),
            extra={"eventId": message.event.key, "drainAt": at.isoformat()},
        )
        # The new moment first: a crash after it leaves the VMs out until it (bounded), and
        # the gate's next look plans again; then the VMs back, as at the event's end.
        book.drop(key)
        book.set(key, at, entry.message_id, entry.body)
        self._end(checked, vms, outcome, now, restore=True)
        outcome.drain_at = at
        return outcome

    def _drop_moment(self, key: str) -> None:
        """The event ended in the scope ``key`` names (Completed, Cancelled): that scope's
        moments go (the drain's and the gate's decision at a window's start), and their
        scheduled messages."""
        for kind in (moments.KEY, moments.DECIDE_KEY):
            book = self._book(kind)
            if book is not None:
                book.drop(key)

    def fire(self, due: moments.Due, now: datetime) -> LbOutcome:
        """A scheduled drain arrived: drain the event in the scope ``due`` names if its token
        is still that scope's moment and has not fired, its stored message verified again in
        that scope (like a held event); otherwise nothing. Faults propagate (the message is
        redelivered)."""
        book = self._book()
        if book is None:
            return LbOutcome("ignore", reason="no drain moments configured")
        taken = book.take(due, self._verify)
        if isinstance(taken, str):
            return LbOutcome("ignore", reason=taken)
        log.info("drain moment of event %s has come", due.key, extra={"eventId": due.event_id})
        outcome = self.handle_verified(taken, now, due=True)
        book.done(due)
        return outcome

    def _verify(self, message: TransitionMessage) -> Checked:
        return verify_and_log("lb_pools", self.arm, message, self.rules, records=self.pools)

    def _restore_dropped(
        self, verified: VerifiedMessage, outcome: LbOutcome, now: datetime
    ) -> None:
        """A VM dropped from Resources by an Updated is no longer affected: put it back now,
        since the Completed of this event will not name it (checked against the scope too)."""
        message = verified.message
        dropped = dropped_resources(message)
        if not dropped:
            return
        observer = verified.scope.observer
        resolved = trust.resolve_names(self.arm, observer, message.observer, dropped)
        if isinstance(resolved, trust.Refusal):
            trust.log_refusal("lb_pools", message, resolved)
            return
        restored: Restored = {}
        failures = self._restore_all(
            self._allowed(message, list(resolved), outcome),
            outcome,
            restored,
            event_id=verified.scoped_key,
            now=now,
        )
        if restored and self.guarded:
            self._resume(restored, outcome, now, skip=verified.scoped_key)
        self._report_not_restored(verified, outcome)
        if failures:
            raise failures[0]

    def _allowed(
        self, message: TransitionMessage, vms: list[ResolvedVm], outcome: LbOutcome
    ) -> list[ResolvedVm]:
        """With LB_MANAGED_RESOURCE_GROUPS set, a NIC in another group refuses the message."""
        for vm in vms:
            for nic_id in vm.nic_ids:
                if not trust.nic_allowed(nic_id, self.rules):
                    refusal = trust.Refusal(
                        f"NIC {nic_id} of {vm.name} is in a resource group outside "
                        "LB_MANAGED_RESOURCE_GROUPS"
                    )
                    trust.log_refusal("lb_pools", message, refusal)
                    outcome.refused = refusal.reason
                    return []
        return vms

    def _publish_prepared(
        self, message: TransitionMessage, vms: list[ResolvedVm], now: datetime
    ) -> None:
        event = message.event
        assert event is not None
        self.publisher.publish(
            prepared_message(
                event,
                message.observer,
                message.incarnation,
                now,
                source=SOURCE,
                prepared_vms=[vm.name for vm in vms],
                cause=message.message_id or event.key,
                prepared_by="lb-pools",
                event_grid=_event_grid(message),
            )
        )

    # ---- draining ------------------------------------------------------------------------
    def _drain(
        self,
        verified: VerifiedMessage,
        vms: list[ResolvedVm],
        outcome: LbOutcome,
        now: datetime,
        resume_pool: str | None = None,
    ) -> None:
        changeable = [vm for vm in vms if self._drainable(vm, outcome)]
        claim = claim_of(verified, now)
        if self.pools is None:
            for vm in changeable:
                self._drain_vm(vm, outcome, claim=claim)
            return
        changeable, outside = self._readable(changeable, outcome)
        # Started is decided like Scheduled: a forged Started gains nothing, and a VM that is
        # really going down is probed Down soon, and then leaves without counting.
        check = self.guarded
        for _ in range(MAX_LOCK_ROUNDS):
            wanted = set(outside) | ({resume_pool} if resume_pool else set())
            if not wanted:
                for vm in changeable:  # in no pool: nothing to decide, nothing to lock
                    self._drain_vm(vm, outcome, claim=claim)  # out already: claim it too
                self._unhold_elsewhere(verified, set(), now)
                return
            # The probe verdicts are asked for before the locks are taken (the health API is a
            # long-running operation in Azure: it must not lengthen the time a pool is locked);
            # membership is read again under them (capacity.measure says why that is sound).
            probes = capacity.Probes(clock=self.monotonic)
            probed_at = self.monotonic()
            if check:
                early = capacity.measured(self.arm, wanted, probes)
                if isinstance(early, capacity.Unreadable):
                    self._unreadable(changeable, outcome, early.problem)
                    return
            request = DrainRequest(
                verified, changeable, outcome, now, resume_pool, check, probes, probed_at
            )
            verdict = self.decisions.submit(tuple(sorted(wanted)), request, self._decide)
            if verdict.relock is not None:
                log.info("the VMs joined other pools meanwhile, locking again")
                outside = verdict.relock
                continue
            if verdict.unreadable:
                self._unreadable(changeable, outcome, verdict.unreadable)
                return
            if not outcome.reason:
                keep = {verdict.held.pool_id.lower()} if verdict.held else set()
                self._unhold_elsewhere(verified, keep, now)
            return
        raise PreconditionFailed("pool membership kept changing while the pools were locked")

    @staticmethod
    def _unreadable(vms: list[ResolvedVm], outcome: LbOutcome, problem: str) -> None:
        """ARM refused the pools' load balancer or rule health (403): the capacity decision
        cannot be made, so the VMs stay in their pools, no Prepared, and the message completes
        (no retry grants the role)."""
        names = [vm.name for vm in vms]
        log.error(
            "VMs %s left in their pools, no Prepared: %s",
            ", ".join(names),
            problem,
            extra={"vms": names, "reason": "PermissionDenied"},
        )
        outcome.not_ready.extend(names)

    def _decide(
        self, pools: tuple[str, ...], requests: list[DrainRequest]
    ) -> list[Verdict | BaseException]:
        """Decide and drain, under the locks of ``pools``, the events queued for those pools
        (in the order they came): one lease, one read of each pool's held list and health, the
        drains written side by side, each pool's list written once, then Held published for
        the held ones. Each event is decided as if the ones before it in the batch were already
        out; a failed drain (or Held) fails only its own event (its message is redelivered;
        the others are done)."""
        assert self.pools is not None
        verdicts: list[Verdict | BaseException] = [Verdict() for _ in requests]
        with self.pools.hold(list(pools)) as lease:
            states = {pool: held.PoolState.load(lease.state(pool)) for pool in pools}
            lists = {pool: states[pool].held for pool in pools}
            ready: list[tuple[int, DrainRequest, dict[str, set[str]], dict[str, ArmDocument]]] = []
            for index, request in enumerate(requests):
                fresh: dict[str, ArmDocument] = {}
                try:
                    members = self._memberships(request.vms, read=fresh)  # again, under the locks
                except Exception as exc:  # noqa: BLE001 - this event's own failure
                    verdicts[index] = exc
                    continue
                if not set(members) <= set(pools):
                    verdicts[index] = Verdict(relock=members)
                elif request.resume_pool and request.key not in lists[request.resume_pool.lower()]:
                    # Its Cancelled or Completed (or another resume) came first: nothing to do.
                    request.outcome.reason = "no longer held"
                else:
                    ready.append((index, request, members, fresh))
            changed: set[str] = set()
            touched: set[str] = set()  # events held or held no more: the index changes
            health = self._batch_health(
                pools, [r for _, r, _, _ in ready if r.check], states, requests[0].now
            )
            drains: list[tuple[int, DrainRequest, dict[str, ArmDocument]]] = []
            # per request: the pools it reserved members in, and what they said of it before
            reservations: dict[int, dict[str, held.Leaving | None]] = {}
            drained_from: dict[int, dict[str, set[str]]] = {}
            for index, request, members, fresh in ready:
                if request.check and health is not None:
                    decision = capacity.decide(health, members, self.minimum)
                    if decision.unreadable:
                        verdicts[index] = Verdict(unreadable=decision.unreadable)
                        continue
                    blocked = decision.blocked
                    if blocked is not None:
                        pool_key = blocked.pool_id.lower()
                        lists[pool_key][request.key] = held.entry_for(
                            request.message, request.now, key=request.key
                        )
                        changed.add(pool_key)
                        for other in pools:  # held in one pool: the one that blocks it now
                            if other == pool_key:
                                continue
                            if lists[other].pop(request.key, None) is not None:
                                changed.add(other)
                        touched.add(request.key)
                        names = _names_in(request.vms, members.get(pool_key, set()))
                        verdicts[index] = Verdict(held=blocked, held_vms=names)
                        continue
                    assert not isinstance(health, capacity.Unreadable)
                    health = capacity.after_leaving(health, members)
                    reservations[index] = self._reserve(states, request, members)
                    changed |= set(reservations[index])
                drains.append((index, request, fresh))
                drained_from[index] = members
            # What the drains take down is in the pools' state before the first write: a slow
            # write that lands after the leases lapsed still counts as gone for the decision
            # another instance takes under the next lease.
            for pool in sorted(changed):
                lease.check()
                lease.save(pool, states[pool].dump())
            changed = set()
            # Every NIC write attempt (and every retry ARM asks for) goes out only while the
            # leases are provably held: a throttled PUT never lands after they lapsed, and an
            # attempt starts only if it ends (its whole timeout) while they are held.
            with write_window.lease_window(lease.allowance):
                failures = self._drain_all(lease, drains)
            for index, error in failures.items():
                verdicts[index] = error
            for index, request, _ in drains:
                if isinstance(verdicts[index], BaseException):
                    continue  # its reservation stays: its write may still land
                # Out of the pools now: the reservation has done its work.
                for pool, before in reservations.get(index, {}).items():
                    if before is None:
                        states[pool].leaving.pop(request.key, None)
                    else:
                        states[pool].leaving[request.key] = before
                    changed.add(pool)
                # What it took out counts in the pools' size until the event ends (budgets of
                # maximum unavailable members only: otherwise nothing reads it).
                until = claim_of(request.verified, request.now).until
                sized = self.budgets is not None and self.budgets.sized
                for pool, ipcs in drained_from[index].items() if sized else ():
                    if pool in states and ipcs:
                        entry = held.Leaving(request.key, frozenset(ipcs), until)
                        if states[pool].out.get(request.key) != entry:
                            states[pool].out[request.key] = entry
                            changed.add(pool)
                for pool in pools:
                    if lists[pool].pop(request.key, None) is not None:
                        changed.add(pool)
                        touched.add(request.key)
                        log.info(
                            "held event is held no more",
                            extra={"eventId": request.key, "pool": pool},
                        )
            for pool in sorted(changed):
                lease.check()
                lease.save(pool, states[pool].dump())
            self._index(pools, states, touched)
            # Held goes out while the pools are still locked, so that a restore that drains a
            # held event (under the same lease) cannot publish its Prepared before the Held.
            for index, request in enumerate(requests):
                verdict = verdicts[index]
                if isinstance(verdict, Verdict) and verdict.held is not None:
                    try:
                        self._announce_hold(request, verdict.held, verdict.held_vms)
                    except Exception as exc:  # noqa: BLE001 - this event's own failure
                        verdicts[index] = exc
        return verdicts

    @staticmethod
    def _reserve(
        states: dict[str, held.PoolState], request: DrainRequest, members: dict[str, set[str]]
    ) -> dict[str, held.Leaving | None]:
        """Write the members ``request`` drains into its pools' leaving members (until its
        event ends at the latest), before any NIC write: the pools that changed, with what
        they said of the event before (put back once the drain is done)."""
        event = request.message.event
        assert event is not None
        until = held.maintenance_until(event, request.message.time or request.now)
        changed: dict[str, held.Leaving | None] = {}
        for pool, ipcs in members.items():
            state = states.get(pool)
            if state is None or not ipcs:
                continue
            before = state.leaving.get(request.key)
            going = frozenset(i.lower() for i in ipcs) | (
                before.ip_configurations if before else frozenset()
            )
            if before is None or before.ip_configurations != going or before.until < until:
                state.leaving[request.key] = held.Leaving(request.key, going, until)
                changed[pool] = before
        return changed

    def _batch_health(
        self,
        pools: tuple[str, ...],
        checked: list[DrainRequest],
        states: dict[str, held.PoolState],
        now: datetime,
    ) -> dict[str, capacity.PoolHealth] | capacity.Unreadable | None:
        """The pools' health for a batch's guarded decisions (None: no decision is guarded):
        membership read now, the probe verdicts the freshest request brought (capacity.Probes
        asks again for any older than PROBE_MAX_AGE_SECONDS: the batch may have waited long
        for the locks), and the members that events approved early take down (the pools'
        leaving members); Unreadable when ARM refuses them (403)."""
        if not checked:
            return None
        freshest = max(checked, key=lambda r: r.probed_at)
        reserved = {pool: states[pool].reserved(now) for pool in pools}
        absent = {pool: states[pool].absent(now) for pool in pools}
        return capacity.measured(self.arm, pools, freshest.probes, reserved, absent)

    def _index(
        self, pools: Iterable[str], states: dict[str, held.PoolState], events: set[str]
    ) -> None:
        """Keep the pool store's index of held events true for ``events``, held or held no
        more in ``pools`` (the guard and an Approve link read it; lb-pools drops stale entries
        by it): what it says of other pools stays."""
        for event_id in sorted(events):
            holding = {p for p in pools if event_id in states[p].held}
            self._reindex(event_id, set(pools) - holding, holding)

    def _reindex(self, event_id: str, released: set[str], holding: set[str]) -> None:
        """The index of held events: ``event_id`` held in ``holding`` now, no longer in
        ``released``, and as before in every other pool (one read and conditional write)."""
        assert self.pools is not None

        def change(record: dict[str, Any]) -> bool:
            known = {p.lower() for p in event_record.held_pools(record, event_id)}
            wanted = (known - {p.lower() for p in released}) | {p.lower() for p in holding}
            return event_record.with_held_pools(record, event_id, wanted)

        self.pools.update_event(event_record.event_of(event_id), change)

    def _drain_all(
        self, lease: PoolLease, drains: list[tuple[int, DrainRequest, dict[str, ArmDocument]]]
    ) -> dict[int, BaseException]:
        """Write the drains of a batch (side by side in the app: each NIC write waits for
        ARM's long-running operation): the failures, by the request's index."""

        def drain(request: DrainRequest, fresh: dict[str, ArmDocument]) -> Callable[[], None]:
            def run() -> None:
                claim = claim_of(request.verified, request.now)
                for vm in request.vms:
                    lease.check()
                    self._drain_vm(vm, request.outcome, fresh, claim=claim)
                # Still held once the writes returned, or no Prepared goes out on their
                # strength: the message comes back and is decided under a fresh lease.
                lease.check()

            return run

        calls = [drain(request, fresh) for _, request, fresh in drains]
        errors = self.side_by_side(calls) if len(calls) > 1 else one_after_another(calls)
        return {
            index: error
            for (index, _, _), error in zip(drains, errors, strict=True)
            if error is not None
        }

    def _drainable(self, vm: ResolvedVm, outcome: LbOutcome) -> bool:
        if vm.kind is VmKind.GONE:
            log.warning("VM not found in ARM, nothing to drain", extra={"vm": vm.name})
            return False
        if vm.kind is VmKind.FORBIDDEN:
            log.error(
                "VM %s left in its pools, no Prepared: %s",
                vm.name,
                vm.problem,
                extra={"vm": vm.name, "reason": "PermissionDenied"},
            )
            outcome.not_ready.append(vm.name)
            return False
        if vm.kind is VmKind.UNIFORM:
            # Pool membership of a Uniform instance is the scale-set model's: not ours to change.
            log.warning("Uniform scale-set instance: pools left as they are", extra={"vm": vm.name})
            outcome.not_ready.append(vm.name)
            return False
        return True

    def _readable(
        self, vms: list[ResolvedVm], outcome: LbOutcome
    ) -> tuple[list[ResolvedVm], dict[str, set[str]]]:
        """The VMs whose NICs the app may read (the others are left in their pools), and the
        pools those NICs are in."""
        readable = []
        members: dict[str, set[str]] = {}
        for vm in vms:
            try:
                vm_members = self._memberships([vm])
            except PermissionDenied as exc:
                log.error(
                    "VM %s left in its pools, no Prepared: %s",
                    vm.name,
                    exc,
                    extra={"vm": vm.name, "reason": "PermissionDenied"},
                )
                outcome.not_ready.append(vm.name)
                continue
            readable.append(vm)
            for pool_id, ipcs in vm_members.items():
                members.setdefault(pool_id, set()).update(ipcs)
        return readable, members

    def _memberships(
        self,
        vms: Iterable[ResolvedVm],
        *,
        skip_forbidden: bool = False,
        read: dict[str, ArmDocument] | None = None,
    ) -> dict[str, set[str]]:
        return capacity.memberships(self.arm, vms, skip_forbidden=skip_forbidden, read=read)

    def _drain_vm(
        self,
        vm: ResolvedVm,
        outcome: LbOutcome,
        read: dict[str, ArmDocument] | None = None,
        *,
        claim: nic_pools.Claim | None = None,
    ) -> None:
        """Take every NIC of ``vm`` out of its pools, recording what was removed and
        ``claim`` (the event that has it out: nic_pools)."""

        def plan(nic: dict[str, object], nic_id: str) -> nic_pools.NicChange | None:
            return nic_pools.plan_drain(nic, nic_id, claim)

        for nic_id in vm.nic_ids:
            try:
                change, gone = _change_nic(self.arm, nic_id, plan, (read or {}).pop(nic_id, None))
            except nic_pools.RecordTooLarge as exc:
                log.error("NIC left in its pools: %s", exc, extra={"vm": vm.name, "nic": nic_id})
                outcome.not_ready.append(vm.name)
                continue
            except PermissionDenied as exc:
                # Denied once for this VM: touch none of its other NICs either.
                log.error(
                    "VM %s left in its pools, no Prepared: %s",
                    vm.name,
                    exc,
                    extra={"vm": vm.name, "nic": nic_id, "reason": "PermissionDenied"},
                )
                outcome.not_ready.append(vm.name)
                break
            if gone:
                log.warning("NIC not found in ARM", extra={"vm": vm.name, "nic": nic_id})
            if change is not None:
                outcome.changed.append(nic_id)

    def _announce_hold(
        self, request: DrainRequest, blocked: capacity.Blocked, names: list[str]
    ) -> None:
        """The hold is saved in the blocking pool's list: say so, and publish Held (under the
        pool's lease)."""
        message, event = request.message, request.message.event
        assert event is not None
        log.warning(
            "event %s held, VMs %s left in their pools: %s",
            event.key,
            ", ".join(names),
            blocked.describe(),
            extra={"eventId": event.key, "pool": blocked.pool_id, "minimum": blocked.minimum},
        )
        self.publisher.publish(
            held_message(
                event,
                message.observer,
                message.incarnation,
                request.now,
                source=SOURCE,
                event_grid=_event_grid(message),
                cause=message.message_id or event.key,
                pool=blocked.pool_id,
                healthy=blocked.healthy_after,
                minimum=blocked.minimum,
                vms=names or [vm.name for vm in request.vms],
            )
        )
        request.outcome.held = blocked
        request.outcome.not_ready.extend(vm.name for vm in request.vms)

    def _forget(
        self, lease: PoolLease, pools: Iterable[str], event_id: str, now: datetime
    ) -> Restored:
        """Drop ``event_id`` from the held lists and the leaving members of ``pools`` (held by
        ``lease``), and say so in the index of held events. Returns the members its early
        approval had taken down: they serve again (their pools' held events may go now)."""
        assert self.pools is not None
        released: Restored = {}
        for pool_id in pools:
            state = held.PoolState.load(lease.state(pool_id))
            was_held = event_id in state.held
            leaving = state.leaving.get(event_id)
            if leaving is not None:
                released[pool_id.lower()] = set(leaving.ip_configurations)
            if state.forget(event_id, now):
                lease.save(pool_id, state.dump())
                log.info("event forgotten", extra={"eventId": event_id, "pool": pool_id})
            if was_held:
                self._reindex(event_id, {pool_id}, set())
        return released

    # ---- the end of an event: restore, forget, resume ---------------------------------------
    def _end(
        self,
        verified: VerifiedMessage,
        vms: list[ResolvedVm],
        outcome: LbOutcome,
        now: datetime,
        *,
        restore: bool,
    ) -> None:
        event = verified.message.event
        assert event is not None
        key = verified.scoped_key  # what this scope keeps of the event: never another's
        restored: Restored = {}
        if self.pools is not None:
            # Forget before restoring: a resume of this event that races us either drained
            # before we forget (and we restore it below) or finds it forgotten. Members its
            # early approval took down serve again: like restored ones, for held events.
            # The pools its VMs are in, and those the index says hold it (a held VM may have
            # left its pool for another event meanwhile: the entry must go all the same).
            changeable = [vm for vm in vms if vm.kind is VmKind.VM]
            pools = set(self._memberships(changeable, skip_forbidden=True))
            pools |= {p.lower() for p in self.pools.held_pools(key)}
            pools |= self._recorded_pools(changeable)
            restored = self._forget_unlocked(pools, key, now)
        failures: list[BaseException] = []
        if restore:
            failures = self._restore_all(vms, outcome, restored, event_id=key, now=now)
        else:
            log.info("the VMs are gone after %s: nothing to restore", event.event_type)
        if outcome.changed:
            self.actions.record(
                verified, "Restored", now, {"by": "lb-pools", "nics": len(outcome.changed)}
            )
        if outcome.not_restored_count:
            self.actions.record(verified, "NotRestored", now, _not_restored_details(outcome))
        if restored and self.guarded:
            self._resume(restored, outcome, now, skip=key)
        self._report_not_restored(verified, outcome)
        if failures:
            raise failures[0]

    def _unhold_elsewhere(self, verified: VerifiedMessage, keep: set[str], now: datetime) -> None:
        """The event was just decided for the VMs it names now (drained, or held in ``keep``):
        a held entry of it in any other pool is stale (an Updated moved its Resources), and
        would drain VMs the event no longer names when that pool gets members back. Drop those
        entries (under their pools' leases), and say so in the index of held events."""
        if self.pools is None or verified.message.event is None:
            return
        key = verified.scoped_key
        hinted = {p.lower() for p in self.pools.held_pools(key)} - keep
        stale = sorted(p for p in hinted if key in held.read(self.pools.peek(p)))
        if not stale:
            if hinted:
                self.pools.index_held(key, sorted(keep))
            return
        with self.pools.hold(stale) as lease:
            for pool_id in stale:
                state = held.PoolState.load(lease.state(pool_id))
                if state.held.pop(key, None) is None:
                    continue
                lease.save(pool_id, state.dump())
                log.info(
                    "held event %s dropped from %s: it is decided for other VMs now",
                    key,
                    capacity.short_pool(pool_id),
                    extra={"eventId": key, "pool": pool_id},
                )
            self.pools.index_held(key, sorted(keep))

    def _recorded_pools(self, vms: Iterable[ResolvedVm]) -> set[str]:
        """The pools the NICs of ``vms`` were drained from (their records, lower case): where a
        drain whose lease lapsed before its write returned left what it reserved."""
        pools: set[str] = set()
        for vm in vms:
            for nic_id in vm.nic_ids:
                try:
                    nic = self.arm.get_nic(nic_id)
                except PermissionDenied:
                    continue  # the restore says so
                if nic is not None:
                    pools |= nic_pools.recorded_pools(nic.body, nic_id)
        return pools

    def _forget_unlocked(self, pools: Iterable[str], event_id: str, now: datetime) -> Restored:
        assert self.pools is not None
        holding = [
            p for p in sorted(pools) if held.PoolState.load(self.pools.peek(p)).mentions(event_id)
        ]
        if not holding:
            return {}
        with self.pools.hold(holding) as lease:
            return self._forget(lease, holding, event_id, now)

    def _restore_all(
        self,
        vms: Iterable[ResolvedVm],
        outcome: LbOutcome,
        restored: Restored,
        *,
        event_id: str,
        now: datetime,
    ) -> list[BaseException]:
        """Restore each VM on its own: one that fails (ARM 5xx, a timeout) does not keep the
        others out. The failures, to raise once every VM was tried (the redelivery finds the
        restored NICs without a record and changes nothing on them)."""
        failures: list[BaseException] = []
        for vm in vms:
            try:
                self._restore_vm(vm, outcome, restored, event_id=event_id, now=now)
            except Exception as exc:  # noqa: BLE001 - this VM's own failure, raised afterwards
                log.warning(
                    "VM %s not restored yet (tried again on redelivery): %s",
                    vm.name,
                    type(exc).__name__,
                    extra={"vm": vm.name, "reason": type(exc).__name__},
                )
                failures.append(exc)
        return failures

    def _restore_vm(
        self,
        vm: ResolvedVm,
        outcome: LbOutcome,
        restored: Restored,
        *,
        event_id: str,
        now: datetime,
    ) -> None:
        """Put each NIC of ``vm`` back into the pools its record names, each NIC on its own,
        unless another event than ``event_id`` still has it out (its claim, nic_pools); raises
        the first NIC's failure once every NIC was tried."""
        restore_by_hand = f"its NICs keep what was removed in the tag {nic_pools.TAG}"
        if vm.kind is VmKind.FORBIDDEN:
            log.error(
                "VM %s cannot be restored to its pools: %s; %s",
                vm.name,
                vm.problem,
                restore_by_hand,
                extra={"vm": vm.name, "reason": "PermissionDenied"},
            )
            return
        if vm.kind is not VmKind.VM:
            log.info("nothing to restore", extra={"vm": vm.name, "kind": vm.kind.value})
            return
        failures: list[BaseException] = []
        for nic_id in vm.nic_ids:
            try:
                change, gone = self._restore_nic(nic_id, event_id, now)
            except PermissionDenied as exc:
                log.error(
                    "NIC %s cannot be restored to its pools: %s; %s",
                    nic_id,
                    exc,
                    restore_by_hand,
                    extra={"vm": vm.name, "nic": nic_id, "reason": "PermissionDenied"},
                )
                continue
            except WriteRefused as exc:
                if not deliveries.is_last():
                    failures.append(exc)  # redelivered: ARM may take it yet
                    continue
                # The last delivery: said loudly, once, and the message completes (the NIC
                # keeps its record, for the operator the card and the ERROR line tell).
                log.error(
                    "VM %s not restored: ARM refused the restore of NIC %s (%s): %s; %s: put "
                    "it back by hand",
                    vm.name,
                    nic_id,
                    exc.code,
                    exc,
                    restore_by_hand,
                    extra={"vm": vm.name, "nic": nic_id, "reason": exc.code},
                )
                outcome.refused_restores.append((vm.name, nic_id, exc.code))
                continue
            except Exception as exc:  # noqa: BLE001 - raised once the other NICs were tried
                failures.append(exc)
                continue
            if gone:
                log.warning("NIC not found in ARM, nothing to restore", extra={"nic": nic_id})
            if change is None:
                continue
            outcome.changed.append(nic_id)
            if change.kept_for:
                log.info(
                    "VM %s stays out of its pools: event(s) %s still have it out",
                    vm.name,
                    ", ".join(change.kept_for),
                    extra={"vm": vm.name, "nic": nic_id, "keptFor": list(change.kept_for)},
                )
                outcome.kept_out.append(vm.name)
                continue
            for ipc, pools in change.pools.items():
                for pool_id in pools:
                    restored.setdefault(pool_id.lower(), set()).add(
                        capacity.ip_configuration_id(nic_id, ipc)
                    )
            for pools in change.skipped.values():
                for pool_id in pools:
                    outcome.not_restored.append((vm.name, pool_id))
                    log.error(
                        "VM %s not put back into %s: the pool no longer exists (deleted, or its "
                        "load balancer); its other pools are restored",
                        vm.name,
                        capacity.short_pool(pool_id),
                        extra={"vm": vm.name, "nic": nic_id, "pool": pool_id},
                    )
            for ipc, pools in change.vanished.items():
                for pool_id in pools:
                    outcome.vanished.append((vm.name, ipc, pool_id))
                    log.error(
                        "VM %s not put back into %s: its NIC no longer has the ip configuration "
                        "%s (replaced while the VM was out); put its new one into the pool if "
                        "it belongs there",
                        vm.name,
                        capacity.short_pool(pool_id),
                        ipc,
                        extra={"vm": vm.name, "nic": nic_id, "pool": pool_id, "ipConfig": ipc},
                    )
        if failures:
            raise failures[0]

    def _restore_nic(
        self, nic_id: str, event_id: str, now: datetime
    ) -> tuple[nic_pools.NicChange | None, bool]:
        """(the change made or None, the NIC is gone): the recorded pools back, leaving out
        those ARM says no longer exist (a 400 InvalidResourceReference, confirmed by reading
        their load balancers), or only ``event_id``'s claim dropped while another event still
        has the NIC out. Re-read on a 412."""
        gone_pools: set[str] = set()
        for _ in range(2 * MAX_ETAG_RETRIES):
            nic = self.arm.get_nic(nic_id)
            if nic is None:
                return None, True
            change = nic_pools.plan_restore(
                nic.body, nic_id, gone_pools, event_id=event_id, now=now
            )
            if change is None:
                return None, False
            try:
                self.arm.put_nic(nic_id, change.body, nic.etag)
            except PreconditionFailed:
                log.info("NIC changed while we wrote it, re-reading", extra={"nic": nic_id})
                continue
            except ReferenceMissing as exc:
                found = self._missing_pools(nic_pools.recorded_pools(nic.body, nic_id))
                if not found - gone_pools:
                    # ARM misses something that is not a pool the record names (an inbound NAT
                    # rule, say): no retry of this restore repairs it.
                    raise WriteRefused(
                        400, "InvalidResourceReference", str(exc), what="restore NIC"
                    ) from exc
                gone_pools |= found
                continue
            log.info("NIC pools changed", extra={"nic": nic_id, "pools": change.pools})
            return change, False
        raise PreconditionFailed(f"{nic_id}: still changing after {2 * MAX_ETAG_RETRIES} attempts")

    def _missing_pools(self, pool_ids: Iterable[str]) -> set[str]:
        """The pools (lower case) that no longer exist: their load balancer is gone (404), or
        it no longer lists them."""
        return capacity.gone_pools(self.arm, pool_ids)

    def _report_not_restored(self, verified: VerifiedMessage, outcome: LbOutcome) -> None:
        """Operators see what could not go back: a card (when Teams is wired), beside the
        ERROR lines and the invocation line's ``notRestored`` count."""
        if not outcome.not_restored_count or self.alerts is None:
            return
        missing = sorted(set(outcome.not_restored))
        vanished = sorted(set(outcome.vanished))
        refused = sorted(set(outcome.refused_restores))
        vms_back = sorted(
            ({vm for vm, _ in missing} | {vm for vm, _, _ in vanished})
            & {vm.name for vm in verified.scope.vms if vm.kind is VmKind.VM}
        )
        try:
            card = not_restored_card(verified.message, missing, vms_back, vanished, refused)
            self.alerts.post(card)
        except Exception as exc:  # noqa: BLE001 - the restore is done; the log line says it all
            log.error("the not-restored card could not be posted: %s", type(exc).__name__)

    def _resume(self, restored: Restored, outcome: LbOutcome, now: datetime, *, skip: str) -> None:
        """Try the held events of the pools that got members back; wait (bounded) for those
        members to be probed Up while an event is still held because of them."""
        assert self.pools is not None
        settle = SETTLE_SECONDS if self.settle_seconds is None else self.settle_seconds
        poll = SETTLE_POLL_SECONDS if self.settle_poll_seconds is None else self.settle_poll_seconds
        deadline = self.monotonic() + settle
        decided_settled = False
        while True:
            still_held = self._resume_once(sorted(restored), outcome, now, skip=skip)
            if not still_held:
                return
            health = capacity.measured(self.arm, still_held)
            if isinstance(health, capacity.Unreadable):
                log.error("held events not tried again: %s", health.problem)
                return
            settling = any(restored[p] - health[p].healthy for p in still_held if p in health)
            if not settling:
                # Every restored member is Up now, but it may have come Up only after the held
                # events were decided: decide once more, then they are held for good reasons.
                if decided_settled:
                    return
                decided_settled = True
                continue
            if self.monotonic() + poll > deadline:
                return
            log.info("waiting for restored members to be probed Up before resuming held events")
            self.sleep(poll)

    def _resume_once(
        self, pools: list[str], outcome: LbOutcome, now: datetime, *, skip: str
    ) -> list[str]:
        """One pass over the held events of ``pools``, in one order over all of them
        (NotBefore, then the oldest hold: the event Azure starts first drains first, whichever
        pool held it); the pools still holding some."""
        assert self.pools is not None
        still: list[str] = []
        waiting = [
            (entry, pool_id)
            for pool_id in pools
            for entry in held.read(self.pools.peek(pool_id)).values()
        ]
        waiting.sort(key=lambda item: (*_held_order(item[0]), item[1]))
        for entry, pool_id in waiting:
            if entry.event_id == skip:
                continue
            if entry.expired(now):
                log.info(
                    "held event dropped: its NotBefore passed",
                    extra={"eventId": entry.event_id},
                )
                self._forget_unlocked([pool_id], entry.event_id, now)
                continue
            try:
                message = parse_message(entry.body, entry.message_id)
            except ContractError as exc:
                log.error("unreadable held event dropped: %s", exc, extra={"pool": pool_id})
                self._forget_unlocked([pool_id], entry.event_id, now)
                continue
            log.info(
                "trying held event %s again: %s got members back",
                entry.event_id,
                capacity.short_pool(pool_id),
                extra={"eventId": entry.event_id},
            )
            result = self.handle(message, now, resume_pool=pool_id)
            if result.held is not None:
                still.append(result.held.pool_id.lower())
            elif result.refused:
                self._forget_unlocked([pool_id], entry.event_id, now)
            elif not result.reason:
                outcome.resumed.append(entry.event)
        return sorted(set(still) & set(pools))


def _not_restored_details(outcome: LbOutcome) -> dict[str, Any]:
    """The history's NotRestored action: how many, which VMs, ARM's codes for refused ones."""
    names = sorted(
        {vm for vm, _ in outcome.not_restored}
        | {vm for vm, _, _ in outcome.vanished}
        | {vm for vm, _, _ in outcome.refused_restores}
    )
    codes = sorted({code for _, _, code in outcome.refused_restores})
    return {
        "by": "lb-pools",
        "count": outcome.not_restored_count,
        "vms": ", ".join(names),
        "codes": ", ".join(codes),
    }


def _held_order(entry: held.HeldEvent) -> tuple[datetime, datetime]:
    """Held events go in NotBefore order (the one Azure starts first drains first), then the
    oldest hold; one without a NotBefore last."""
    return (entry.not_before or datetime.max.replace(tzinfo=UTC), entry.held_at)
