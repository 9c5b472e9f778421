"""webhooks: every transition to the configured endpoints, on the webhooks subscription.

Registered by function_app.py when ``WebhooksSubscriptionName`` is set (always in Azure: the
Bicep sets it, so the subscription is always drained, with no endpoint configured too).
"""

from __future__ import annotations

import azure.functions as func

from functions.shared import composition
from functions.shared.triggers import decode, log_invocation, note
from functions.webhooks import core as webhooks_core

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@bp.function_name("webhooks")
@bp.service_bus_topic_trigger(
    arg_name="msg",
    topic_name="%TopicName%",
    subscription_name="%WebhooksSubscriptionName%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
@log_invocation
def webhooks(msg: func.ServiceBusMessage) -> None:
    message = decode(msg, "webhooks")
    if message is None or message.event is None:
        return
    deps = composition.dependencies()
    try:
        results = webhooks_core.deliver(
            message, endpoints=deps.settings.webhooks, poster=deps.webhooks, impact=deps.impact
        )
    except webhooks_core.DeliveryFailed as exc:
        note(**webhooks_core.counts(exc.results))
        raise
    tally = webhooks_core.counts(results)
    note("rejected" if tally[webhooks_core.REJECTED] else None, **tally)
