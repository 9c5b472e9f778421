"""The capacity decision before maintenance starts early: may these VMs go down now? (core)

Approving an event early starts its maintenance now rather than at NotBefore. For VMs lb-pools
already drained that costs no capacity (the drain was decided under the guard). For VMs still
in a pool it does: a VM that prepared itself, an event whose drain is held, a link clicked
before lb-pools got to it. So every path that approves early asks :meth:`CapacityGuard.clear`
first: the gate's policy (the approve command and the ARM acknowledge, agentless or fallback),
the Approve link (command or acknowledge), and the gate's answer to a VM-side Prepared. It takes
the leases of the pools the VMs are in (the same leases lb-pools decides its drains under),
reads their health and held lists there, asks :func:`functions.lb_pools.capacity.decide`, and
only if that allows calls ``act`` (which sends the command or the acknowledge), still under the
leases. Healthy members that stay in their pools while their maintenance starts are written into
the pools' state as leaving (functions.lb_pools.held), so a drain that comes a moment later
counts them as gone.

The hold is the event's: whatever VMs an approval names, an event held in a pool is not approved
(the pools its record says hold it are locked and read too). And the VMs asked about are those
the event names now (:meth:`CapacityGuard.affected_now`, from the event's record that the gate
keeps, functions.shared.event_record), not those a late Prepared or an old link carried.

A VM the app may not read (403) cannot be checked, so nothing is approved early for it. An
Approve link of any token version asks :meth:`CapacityGuard.clear` too (one path,
functions.approval_gate.link): a link signed before links carried their VMs finds them in the
event's record, and is refused while the app knows none (hostile review of issue 23c, break 1).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from functions.lb_pools import capacity, held, nic_pools
from functions.shared import event_record, write_window
from functions.shared import scope as trust
from functions.shared.ports import ArmClient, PermissionDenied, PoolStore, PreconditionFailed
from functions.shared.verified import VerifiedMessage
from functions.shared.vms import ResolvedVm, VmKind, affected_vms
from sebridge.contract.events import TransitionMessage

log = logging.getLogger("sebridge.functions.capacity")


@dataclass(frozen=True)
class Clearance:
    """The guard's answer: ``allowed`` (and ``act`` was called), or why not."""

    allowed: bool
    reason: str = ""
    decision: capacity.Decision | None = None


ALLOWED = Clearance(True)
CLAIM_ATTEMPTS = 3  # reads and conditional writes of one NIC's claim


def _in(vm: ResolvedVm, members: dict[str, set[str]]) -> bool:
    """Is one of ``vm``'s NICs a member of a pool in ``members``?"""
    nics = [f"{nic.lower()}/ipconfigurations/" for nic in vm.nic_ids]
    return any(ipc.startswith(nic) for ipcs in members.values() for ipc in ipcs for nic in nics)


@dataclass(frozen=True)
class CapacityGuard:
    arm: ArmClient
    pools: PoolStore | None = None  # None: no guard (LB_MIN_HEALTHY=0, or no pool store)
    min_healthy: int = 0
    monotonic: Callable[[], float] = time.monotonic  # how old probe verdicts are
    budgets: capacity.Budgets | None = None  # LB_MAX_UNAVAILABLE, LB_POOL_BUDGETS

    @property
    def guarded(self) -> bool:
        active = self.budgets.active if self.budgets is not None else self.min_healthy > 0
        return self.pools is not None and active

    @property
    def minimum(self) -> int | capacity.Budgets:
        return self.budgets if self.budgets is not None else self.min_healthy

    def clear(
        self,
        event_id: str,
        vms: Sequence[ResolvedVm],
        now: datetime,
        until: datetime,
        act: Callable[[], None],
    ) -> Clearance:
        """May ``vms`` go down now for ``event_id`` (the event in its verified scope,
        VerifiedMessage.scoped_key: holds and leaving members are kept under it)? If so, ``act``
        is called (under the pools' leases), their healthy members are remembered as leaving
        until ``until``, and their NICs that are out already (another event's drain) are claimed
        for this event too (nic_pools), so that the other event's end does not put them back
        while this one has them down."""
        if not self.guarded:
            act()
            return ALLOWED
        assert self.pools is not None
        forbidden = [vm for vm in vms if vm.kind is VmKind.FORBIDDEN]
        if forbidden:
            vm = forbidden[0]
            return self._refused(
                event_id, f"{vm.name} cannot be checked: {vm.problem}", permission=True
            )
        try:
            members = capacity.memberships(self.arm, [vm for vm in vms if vm.nic_ids])
        except PermissionDenied as exc:
            return self._refused(event_id, f"the pools cannot be checked: {exc}", permission=True)
        # The hold is the event's, not its VMs': an event held in a pool is not approved early
        # whatever VMs this approval names (a Prepared or a link from before an Updated that
        # added VMs names fewer than the event does now). So the pools that hold it are locked
        # and read too, even when the VMs named here are in none.
        holding = {p.lower() for p in self.pools.held_pools(event_id)}
        claim = nic_pools.Claim(event_id, until)
        if not members and not holding:
            # In no pool and held nowhere: nothing stops serving, once this event's claim
            # keeps out the NICs another event took out.
            back = self._claim_out(vms, claim)
            if back:
                return self._refused(event_id, back)
            act()
            return ALLOWED
        pools = sorted(set(members) | holding)
        probes = capacity.Probes(clock=self.monotonic)
        # Before the leases (a long-running call); under them, verdicts older than the one
        # freshness rule allows are asked for again (capacity.Probes).
        early = capacity.measured(self.arm, pools, probes)
        if isinstance(early, capacity.Unreadable):
            decision = capacity.decide(early, members, self.minimum)
            return self._refused(event_id, decision.describe(), decision)
        with self.pools.hold(pools) as lease:
            states = {pool: held.PoolState.load(lease.state(pool)) for pool in pools}
            held_in = next((p for p in pools if event_id in states[p].held), "")
            reserved = {p: states[p].reserved(now, besides=event_id) for p in pools}
            absent = {p: states[p].absent(now) for p in pools}
            health = capacity.measured(self.arm, pools, probes, reserved, absent)
            decision = capacity.decide(health, members, self.minimum, held_in=held_in)
            if not decision.allowed:
                return self._refused(event_id, decision.describe(), decision)
            assert not isinstance(health, capacity.Unreadable)
            back = self._claim_out([vm for vm in vms if not _in(vm, members)], claim)
            if back:
                return self._refused(event_id, back)
            for pool in pools:
                going = frozenset(members[pool]) & health[pool].healthy
                if going:
                    states[pool].leaving[event_id] = held.Leaving(event_id, going, until)
                    lease.check()
                    lease.save(pool, states[pool].dump())
            lease.check()
            # The command's send and the acknowledge (and ARM's retries of it) go out only
            # while the leases are provably held (functions.shared.write_window).
            with write_window.lease_window(lease.allowance):
                act()
        return Clearance(True, decision=decision)

    def _claim_out(self, vms: Sequence[ResolvedVm], claim: nic_pools.Claim) -> str:
        """Claim for ``claim``'s event every NIC of ``vms`` that is out of its pools with a
        record (another event's drain): "" once done, else why not (a NIC back in a pool since
        it was read, too many claims, a missing permission). A NIC never drained (no record)
        needs no claim: nothing puts it into a pool."""
        for vm in vms:
            for nic_id in vm.nic_ids:
                try:
                    problem = self._claim_nic(nic_id, claim)
                except (PermissionDenied, nic_pools.RecordTooLarge) as exc:
                    problem = f"the NIC of {vm.name} cannot be claimed for the event: {exc}"
                if problem:
                    return problem.replace("{vm}", vm.name)
        return ""

    def _claim_nic(self, nic_id: str, claim: nic_pools.Claim) -> str:
        for _ in range(CLAIM_ATTEMPTS):
            nic = self.arm.get_nic(nic_id)
            if nic is None:
                return ""
            if nic_pools.in_any_pool(nic.body):
                return "{vm} is back in a pool since its pools were read: decided again later"
            change = nic_pools.plan_drain(nic.body, nic_id, claim)
            if change is None:
                return ""
            try:
                self.arm.put_nic(nic_id, change.body, nic.etag)
            except PreconditionFailed:
                continue
            log.info(
                "NIC claimed for an early approval: another event took it out",
                extra={"nic": nic_id, "eventId": claim.event_id},
            )
            return ""
        return "{vm}'s NIC kept changing while it was claimed for the event"

    # ---- what the event names now (functions.shared.event_record) -------------------------------
    def remember(self, verified: VerifiedMessage, now: datetime) -> None:
        """Note a verified lifecycle transition in its event's record: the Resources its scope
        names now, and the VMs verified there. No pool store: nothing to note in."""
        message, event = verified.message, verified.message.event
        if self.pools is None or event is None or message.transition not in event_record.NOTED:
            return
        observer = verified.scope.observer
        members = [observer.id] if observer.vm_id else []
        members += [vm.record.id for vm in verified.scope.vms if vm.record is not None]
        self.pools.update_event(
            event.key,
            lambda record: event_record.note(
                record,
                placement=verified.placement,
                resources=event.resources,
                observed_at=message.time or now,
                transition=message.transition,
                members=members,
                now=now,
                message_id=message.message_id,
            ),
        )

    def affected_now(self, verified: VerifiedMessage) -> tuple[ResolvedVm, ...]:
        """The VMs the event names now in the message's scope: the newest Resources its record
        holds for that scope when they are newer than the message's (a Prepared, which repeats
        the Resources of the message lb-pools drained for, is never newer), resolved and checked
        in the verified observer's scope again; else the message's own. Approving early starts
        maintenance on every VM IMDS lists at that moment, so every early approval asks about
        these, not about what the message happened to carry."""
        message, event = verified.message, verified.message.event
        if self.pools is None or event is None:
            return verified.scope.vms
        view = event_record.scope_of(self.pools.read_event(event.key), verified.placement)
        if view is None or not _newer(view, message):
            return verified.scope.vms
        named = affected_vms(view.resources, message.observer)
        if {n.casefold() for n in named} == {vm.name.casefold() for vm in verified.scope.vms}:
            return verified.scope.vms
        resolved = trust.resolve_names(self.arm, verified.scope.observer, message.observer, named)
        if isinstance(resolved, trust.Refusal):
            # What the scope said before no longer checks out: approve nothing early.
            log.warning("the event's current VMs cannot be checked: %s", resolved.reason)
            return (ResolvedVm("?", VmKind.FORBIDDEN, problem=resolved.reason),)
        log.info(
            "event %s names %s now (the message: %s)",
            event.key,
            ", ".join(named),
            ", ".join(vm.name for vm in verified.scope.vms),
            extra={"eventId": event.key},
        )
        return resolved

    def refuse(self, event_id: str, reason: str) -> Clearance:
        """Not approved early, for ``reason`` found before the pools could be asked (an
        approval whose VMs cannot be told yet), logged as every refusal is."""
        return self._refused(event_id, reason)

    @staticmethod
    def _refused(
        event_id: str,
        reason: str,
        decision: capacity.Decision | None = None,
        *,
        permission: bool = False,
    ) -> Clearance:
        # A missing permission (ARM 403) is an operator's problem to fix: ERROR, like every 403.
        permission = permission or (decision is not None and bool(decision.unreadable))
        log.log(
            logging.ERROR if permission else logging.WARNING,
            "event %s not approved early: %s",
            event_id,
            reason,
            extra={"eventId": event_id, "reason": reason},
        )
        return Clearance(False, reason, decision)


def _newer(view: event_record.ScopeView, message: TransitionMessage) -> bool:
    """Is the record's view newer than what ``message`` says of the event (by their places in
    the event's life, never the observers' clocks: event_record.position)? A message that is
    not a lifecycle transition (a Prepared) only repeats what it was caused by."""
    if message.transition not in event_record.NOTED:
        return True
    return view.newer_than(event_record.position(message.transition.value, message.message_id))
