"""teams: a card per transition on the teams subscription (sessions: per-event order)."""

from __future__ import annotations

import azure.functions as func

from functions.shared import composition
from functions.shared.triggers import decode, log_invocation
from functions.teams import core as notify

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@bp.function_name("teams")
@bp.service_bus_topic_trigger(
    arg_name="msg",
    topic_name="%TopicName%",
    subscription_name="%TeamsSubscriptionName%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
@log_invocation
def teams(msg: func.ServiceBusMessage) -> None:
    message = decode(msg, "teams")
    if message is None or message.event is None:
        return
    deps = composition.dependencies()
    notify.notify(
        message,
        poster=deps.teams,
        policy=deps.settings.policy,
        signing_key=deps.settings.approval_signing_key,
        base_url=deps.settings.approval_base_url,
        now=deps.clock(),
        arm=deps.arm,
        rules=deps.trust,
        route=deps.gate.acknowledge_target,
    )
