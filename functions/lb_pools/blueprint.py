"""lb-pools: drain and restore backend pools on the lb-pools subscription."""

from __future__ import annotations

import azure.functions as func

from functions.shared import composition
from functions.shared.triggers import decode, log_invocation

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@bp.function_name("lb_pools")
@bp.service_bus_topic_trigger(
    arg_name="msg",
    topic_name="%TopicName%",
    subscription_name="%LbPoolsSubscriptionName%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
@log_invocation
def lb_pools(msg: func.ServiceBusMessage) -> None:
    message = decode(msg, "lb_pools")
    if message is None:
        return
    deps = composition.dependencies()
    deps.lb_pools.handle(message, deps.clock())
