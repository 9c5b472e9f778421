"""The Approve link's endpoint: check the signed token, ask the capacity decision, then approve
(core).

GET only shows a confirmation page with a form; POST approves. Link-preview bots and mail
scanners fetch URLs with GET, so following a link never approves anything by itself.

A valid token is not enough: the link approves only what the gate would let start early now.
On POST the VMs the token names, and those the event names now (its record: an Updated may have
added VMs since the card was made, functions.shared.event_record), are read again in ARM and the
capacity decision (functions.lb_pools.guard) is asked, under the pools' leases: an event held by
lb-pools, or one whose VMs are still healthy members a pool cannot spare, is not approved, and
the page says why (409). Every token version takes that one path (:func:`_clear`): a link
signed before links named their VMs (v1, v2) finds them in the event's record, in the scope
where its VM was verified, and is refused while the app knows none ("not decided yet").
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from functions.approval_gate import tokens
from functions.lb_pools.guard import CapacityGuard, Clearance
from functions.shared import event_record
from functions.shared import scope as trust
from functions.shared.names import same
from functions.shared.ports import ArmClient, CommandSender, PermissionDenied, PoolStore, VmRecord
from functions.shared.verified import scoped_event_key
from functions.shared.vms import ResolvedVm, VmKind, affected_vms, lookup
from sebridge.contract.commands import approve_command
from sebridge.contract.events import Observer

log = logging.getLogger("sebridge.functions.approve")

REQUESTED_BY = "teams-approval-link"
# How long an event approved from a link keeps its VMs down at most (the token knows no
# duration): an hour after NotBefore and a margin, unless its Completed comes first.
LINK_MAINTENANCE = timedelta(hours=1, minutes=30)


@dataclass(frozen=True)
class Page:
    status: int
    html: str


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='robots' content='noindex'>"
        f"<title>{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1>"
        f"{body}</body></html>"
    )


def _check(key: bytes, token: str, event_id: str | None, now: datetime) -> tokens.ApprovalClaims:
    return tokens.verify(key, token, now, expected_event_id=event_id or None)


def confirm_page(key: bytes, token: str, event_id: str | None, now: datetime) -> Page:
    try:
        claims = _check(key, token, event_id, now)
    except tokens.TokenError as exc:
        log.warning("approval link refused: %s", exc)
        return Page(403, _page("Link not valid", f"<p>{html.escape(str(exc))}.</p>"))
    form = (
        f"<p>Start maintenance event <code>{html.escape(claims.event_id)}</code> on the VMs "
        f"reported by <code>{html.escape(claims.vm_name)}</code> now, instead of at "
        f"{html.escape(claims.expires_at.isoformat())}?</p>"
        "<form method='post'>"
        f"<input type='hidden' name='token' value='{html.escape(token, quote=True)}'>"
        f"<input type='hidden' name='eventId' value='{html.escape(claims.event_id)}'>"
        "<button type='submit'>Approve</button></form>"
    )
    return Page(200, _page("Approve maintenance", form))


def approve(
    key: bytes,
    token: str,
    event_id: str | None,
    now: datetime,
    commands: CommandSender,
    arm: ArmClient | None = None,
    guard: CapacityGuard | None = None,
) -> Page:
    try:
        claims = _check(key, token, event_id, now)
    except tokens.TokenError as exc:
        log.warning("approval refused: %s", exc)
        return Page(403, _page("Not approved", f"<p>{html.escape(str(exc))}.</p>"))
    if claims.acknowledge_on and arm is None:
        raise RuntimeError("an ARM client is needed to approve through ARM")
    done: list[Page] = []

    def act() -> None:
        if claims.acknowledge_on:
            # No forwarder takes a command for this VM (agentless): ARM's acknowledge API, on
            # the id the app signed into the token (never one from the request).
            assert arm is not None
            arm.acknowledge_event(claims.acknowledge_on, claims.event_id)
            log.info(
                "approved from Teams through ARM",
                extra={"eventId": claims.event_id, "vm": claims.vm_name},
            )
            done.append(Page(200, _page("Approved", "<p>Azure has the approval.</p>")))
            return
        command = approve_command(
            claims.event_id, REQUESTED_BY, "approved from the Teams card", claims.expires_at
        )
        commands.send(command, claims.vm_name)  # message_id approve:<id>: a 2nd click is a no-op
        log.info("approved from Teams", extra={"eventId": claims.event_id, "vm": claims.vm_name})
        done.append(Page(200, _page("Approved", "<p>The approval is on its way to the VM.</p>")))

    if guard is None:
        guard = CapacityGuard(arm) if arm is not None else None
    if guard is None:
        act()
        return done[0]
    clearance = _clear(guard, claims, now, act)
    if not clearance.allowed:
        return Page(
            409,
            _page(
                "Not approved now",
                f"<p>{html.escape(clearance.reason)}.</p><p>Nothing was sent: the event stays "
                "scheduled, and Azure starts it at its NotBefore time if nothing approves it "
                "earlier.</p>",
            ),
        )
    return done[0]


def _clear(
    guard: CapacityGuard, claims: tokens.ApprovalClaims, now: datetime, act: Callable[[], None]
) -> Clearance:
    """The one capacity check of every Approve link, whatever its token's version: the event's
    VMs (the token's and those the event's verified record names in its scope; a token signed
    without its VMs, v1 or v2, finds its scope in the record), each either out of its pools
    (claimed for this event) or one its pool can spare, under the pools' leases
    (:meth:`CapacityGuard.clear`, the check the gate's own early approvals ask). An event the
    app knows no VMs of (no verified message about it yet) is not approved: not decided yet."""
    until = claims.expires_at + LINK_MAINTENANCE
    if not guard.guarded:
        return guard.clear(claims.event_id, (), now, until, act)
    scoped = claims if claims.scoped else _scope_from_record(guard.pools, claims)
    if scoped is None:
        return guard.refuse(claims.event_id, NOT_DECIDED)
    try:
        vms = _affected(guard.arm, scoped, guard.pools)
    except _Unverifiable as exc:
        vms = [ResolvedVm("?", VmKind.FORBIDDEN, problem=str(exc))]
    # The event in the token's scope (its observer's placement, as ARM says now): holds,
    # leaving members and NIC claims are kept per scope (functions.shared.verified).
    placement = _placement(guard.arm, scoped)
    if placement is None:
        vms = [ResolvedVm(scoped.vm_name, VmKind.FORBIDDEN, problem="its VM is not found")]
    key = scoped_event_key(claims.event_id, placement or "")
    return guard.clear(key, vms, now, until, act)


NOT_DECIDED = (
    "the bridge has not decided this event yet (no verified message names its VMs): "
    "try again in a minute"
)
# An ARM id of a VM: a VM resource, or a Uniform scale set's instance.
_VM_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/providers/microsoft\.compute/"
    r"(?:virtualmachinescalesets/(?P<ss>[^/]+)/virtualmachines/(?P<n>\d+)|"
    r"virtualmachines/(?P<vm>[^/]+))$",
    re.IGNORECASE,
)


def _scope_from_record(
    pools: PoolStore | None, claims: tokens.ApprovalClaims
) -> tokens.ApprovalClaims | None:
    """A token signed without its VMs (v1, v2) completed from the event's verified record: the
    one scope in which its VM (the token's observer, or the ARM id it acknowledges on) was
    verified for this event, with the VMs that scope names now. None when no scope (or more
    than one) knows it: its VMs cannot be told."""
    if pools is None:
        return None
    record = pools.read_event(claims.event_id)
    scopes = record.get("scopes")
    found: list[tokens.ApprovalClaims] = []
    for placement in sorted(scopes) if isinstance(scopes, dict) else []:
        view = event_record.scope_of(record, str(placement))
        if view is None:
            continue
        target = claims.acknowledge_on.lower()
        for member in sorted(view.members):
            parsed = _VM_ID.match(member)
            if parsed is None:
                continue
            name = parsed["vm"] or f"{parsed['ss']}_{parsed['n']}"
            if not same(name, claims.vm_name) and target not in (member, view.placement):
                continue
            where = Observer(
                vm_name=claims.vm_name,
                subscription_id=parsed["sub"],
                resource_group=parsed["rg"],
                vm_scale_set_name=parsed["ss"] or "",
            )
            vms = affected_vms(view.resources, where)
            found.append(
                replace(
                    claims,
                    subscription=where.subscription_id,
                    resource_group=where.resource_group,
                    scale_set=where.vm_scale_set_name,
                    vms=tuple(vms),
                )
            )
            break
    if len(found) != 1:
        if found:
            log.warning(
                "approval link for %s: its VM is known in %d scopes of the event",
                claims.event_id,
                len(found),
                extra={"eventId": claims.event_id},
            )
        return None
    return found[0]


def _affected(
    arm: ArmClient, claims: tokens.ApprovalClaims, pools: PoolStore | None = None
) -> list[ResolvedVm]:
    """The VMs the token names, and those the event names now in the same scope (its record,
    functions.shared.event_record: an Updated may have added VMs since the card was made), as
    ARM knows them now. A VM the app may not read is ``forbidden``, and then nothing is
    approved: what cannot be checked is not approved. Both lists, because the token knows no
    time to tell which is newer; a VM the event no longer names is back in its pool and asks
    the capacity decision for nothing it cannot spare."""
    where = Observer(
        vm_name=claims.vm_name,
        subscription_id=claims.subscription,
        resource_group=claims.resource_group,
        vm_scale_set_name=claims.scale_set,
    )
    names = list(claims.vms)
    for name in _recorded(arm, claims, where, pools):
        if all(not same(name, known) for known in names):
            names.append(name)
    resolved: list[ResolvedVm] = []
    for name in names:
        try:
            record = lookup(arm, where, name)
        except PermissionDenied as exc:
            resolved.append(ResolvedVm(name, VmKind.FORBIDDEN, problem=str(exc)))
            continue
        resolved.append(ResolvedVm.of(name, record) if record else ResolvedVm(name, VmKind.GONE))
    return resolved


def _recorded(
    arm: ArmClient, claims: tokens.ApprovalClaims, where: Observer, pools: PoolStore | None
) -> list[str]:
    """The VMs the event's record names now in the scope of the token's observer, checked in
    that scope (a name that no longer checks out makes the whole list unusable, so it is
    named and refuses: ``forbidden``)."""
    if pools is None:
        return []
    observer = _observer(arm, claims)
    if observer is None:
        return []  # the token's own VMs are checked (and refused) on their own
    placement = (observer.availability_set or observer.scale_set or observer.id).lower()
    view = event_record.scope_of(pools.read_event(claims.event_id), placement)
    if view is None:
        return []
    named = affected_vms(view.resources, where)
    checked = trust.resolve_names(arm, observer, where, named)
    if isinstance(checked, trust.Refusal):
        log.warning("the event's current VMs cannot be checked: %s", checked.reason)
        raise _Unverifiable(checked.reason)
    return list(named)


def _placement(arm: ArmClient, claims: tokens.ApprovalClaims) -> str | None:
    """The placement of the token's observer as ARM says now (VerifiedMessage.placement), or
    None when it cannot be read or is gone."""
    observer = _observer(arm, claims)
    if observer is None:
        return None
    return (observer.availability_set or observer.scale_set or observer.id).lower()


def _observer(arm: ArmClient, claims: tokens.ApprovalClaims) -> VmRecord | None:
    """The token's observer as ARM knows it now (None: gone, or not readable)."""
    where = Observer(
        vm_name=claims.vm_name,
        subscription_id=claims.subscription,
        resource_group=claims.resource_group,
        vm_scale_set_name=claims.scale_set,
    )
    try:
        observer = lookup(arm, where, claims.vm_name)
    except PermissionDenied:
        return None
    return observer


class _Unverifiable(Exception):
    """The event's record names VMs that no longer check out in the token's scope."""
