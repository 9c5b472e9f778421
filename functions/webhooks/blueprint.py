"""webhooks: every transition to the configured endpoints, on the webhooks subscription.

Registered by function_app.py when ``WebhooksSubscriptionName`` is set (always in Azure: the
Bicep sets it, so the subscription is always drained, with no endpoint configured too). Verified
messages go to every endpoint whose filter takes them; a message that failed the scope check only
to the endpoints that ask for unverified messages (``"unverified": true``, never PagerDuty),
marked as such (functions.webhooks.core).
"""

from __future__ import annotations

import azure.functions as func

from functions.shared import composition
from functions.shared.triggers import note, service_bus_function
from functions.shared.verified import UnverifiedMessage, VerifiedMessage
from functions.webhooks import core as webhooks_core

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@service_bus_function(bp, "webhooks", "%WebhooksSubscriptionName%", unverified=True)
def webhooks(message: VerifiedMessage | UnverifiedMessage) -> None:
    if message.message.event is None:
        return
    deps = composition.dependencies()
    key = message.scoped_key if isinstance(message, VerifiedMessage) else None
    drain = deps.drain_plan.for_message(message.message, deps.clock(), key)
    try:
        results = webhooks_core.deliver(
            message,
            endpoints=deps.settings.webhooks,
            poster=deps.webhooks,
            impact=deps.impact,
            drain=drain,
        )
    except webhooks_core.DeliveryFailed as exc:
        note(**webhooks_core.counts(exc.results))
        raise
    tally = webhooks_core.counts(results)
    note("rejected" if tally[webhooks_core.REJECTED] else None, **tally)
