"""teams: one Adaptive Card per transition, with an Approve link when a human decides (core).

Every card is built from untrusted text made inert (functions.teams.cards). The Approve link
sends a command to the observer's session when clicked, so it is offered only for a verified
message (functions.shared.verified); a message that failed the scope check still gets its card,
marked as unverified, saying why, and without the link.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from functions.approval_gate import tokens
from functions.approval_gate.policy import Action, Policy
from functions.shared.drain_plan import DrainPlan
from functions.shared.ports import TeamsPoster
from functions.shared.verified import UnverifiedMessage, VerifiedMessage
from functions.teams import cards
from sebridge.contract.commands import CommandError, canonical_event_id
from sebridge.contract.events import Transition, TransitionMessage

log = logging.getLogger("sebridge.functions.teams")

APPROVE_ROUTE = "approve"
ASKS_ON = (Transition.SCHEDULED, Transition.UPDATED, Transition.PREPARED)


# Where an approval goes (the gate's Gate.acknowledge_target): None for the command to the
# observer's forwarder, else the ARM id to acknowledge the event on.
Router = Callable[[VerifiedMessage, datetime], str | None]


def approve_link(
    base_url: str,
    key: bytes,
    event_id: str,
    vm_name: str,
    expires: datetime,
    acknowledge_on: str = "",
    *,
    subscription: str = "",
    resource_group: str = "",
    scale_set: str = "",
    vms: tuple[str, ...] = (),
) -> str:
    """The Approve link; with ``vms`` (and where they are) the link asks the capacity decision
    again for them when it is used."""
    claims = tokens.ApprovalClaims(
        event_id, vm_name, expires, acknowledge_on, subscription, resource_group, scale_set, vms
    )
    token = tokens.sign(key, claims)
    return f"{base_url}/api/{APPROVE_ROUTE}?{urlencode({'token': token})}"


def needs_human(message: TransitionMessage, policy: Policy, now: datetime) -> bool:
    """The same policy the gate applies: a card asks only when the gate would wait for one."""
    event = message.event
    if event is None or message.transition not in ASKS_ON or event.is_started:
        return False
    if event.not_before is None or event.not_before <= now:
        return False  # the token must expire by NotBefore; past it there is nothing to approve
    if policy.decide(event, message.observer).action is not Action.MANUAL:
        return False
    try:
        canonical_event_id(event.key)
    except CommandError as exc:
        log.error("no Approve link for message %s: %s", message.message_id, exc)
        return False
    return True


def notify(
    checked: VerifiedMessage | UnverifiedMessage,
    *,
    poster: TeamsPoster,
    policy: Policy,
    signing_key: bytes,
    base_url: str,
    now: datetime,
    route: Router | None = None,
    plan: DrainPlan | None = None,
) -> dict[str, Any]:
    message = checked.message
    event = message.event
    if event is None:
        raise ValueError("teams gets no Heartbeat (the subscription filter drops them)")
    url = unverified = None
    if isinstance(checked, UnverifiedMessage):
        unverified = checked.reason
    elif needs_human(message, policy, now):
        assert event.not_before is not None
        # The link approves the way the gate would: the command, or ARM for a VM that has
        # no forwarder to take it (agentless mode).
        target = route(checked, now) if route is not None else None
        observer = message.observer
        try:
            url = approve_link(
                base_url,
                signing_key,
                event.key,
                observer.vm_name,
                event.not_before,
                acknowledge_on=target or "",
                subscription=observer.subscription_id,
                resource_group=observer.resource_group,
                scale_set=observer.vm_scale_set_name,
                vms=tuple(vm.name for vm in checked.scope.vms),
            )
        except ValueError as exc:  # too many VMs for one link
            log.error("no Approve link for message %s: %s", message.message_id, exc)
    key = checked.scoped_key if isinstance(checked, VerifiedMessage) else None
    drain = plan.for_message(message, now, key) if plan is not None else None
    card = cards.build_card(message, now, approve_url=url, unverified=unverified, drain=drain)
    poster.post(card)
    log.info(
        "card posted",
        extra={
            "eventId": event.key,
            "transition": message.transition.value,
            "ask": bool(url),
            "verified": unverified is None,
        },
    )
    return card
