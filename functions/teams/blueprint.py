"""teams: a card per transition on the teams subscription (sessions: per-event order).

Every message gets a card: one that failed the scope check too, marked as unverified and
without an Approve button (operators see what a VM claims, and that nothing acted on it).
"""

from __future__ import annotations

import azure.functions as func

from functions.shared import composition
from functions.shared.triggers import service_bus_function
from functions.shared.verified import UnverifiedMessage, VerifiedMessage
from functions.teams import core as notify

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@service_bus_function(bp, "teams", "%TeamsSubscriptionName%", unverified=True)
def teams(message: VerifiedMessage | UnverifiedMessage) -> None:
    if message.message.event is None or message.message.transition.is_report:
        return  # a VM's own report (Measured) is no card: its Completed had one
    deps = composition.dependencies()
    notify.notify(
        message,
        poster=deps.teams,
        policy=deps.settings.policy,
        signing_key=deps.settings.approval_signing_key,
        base_url=deps.settings.approval_base_url,
        now=deps.clock(),
        route=deps.gate.acknowledge_target,
        plan=deps.drain_plan,
    )
