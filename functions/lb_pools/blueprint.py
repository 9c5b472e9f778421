"""lb-pools: drain and restore backend pools on the lb-pools subscription."""

from __future__ import annotations

import azure.functions as func

from functions.shared import composition
from functions.shared.triggers import note, service_bus_function
from functions.shared.verified import VerifiedMessage

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@service_bus_function(bp, "lb_pools", "%LbPoolsSubscriptionName%")
def lb_pools(message: VerifiedMessage) -> None:
    deps = composition.dependencies()
    outcome = deps.lb_pools.handle_verified(message, deps.clock())
    if outcome.not_restored_count:
        note(notRestored=outcome.not_restored_count)
