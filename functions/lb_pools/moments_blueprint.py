"""The app's moments: the messages it scheduled to itself on the drain-moments queue.

Registered only with ``DrainMomentsQueueName`` (functions.shared.settings.workflows). The
message names a command, an event in its verified scope and a moment
(functions.lb_pools.moments): ``drain-due``,
lb-pools drains the event; ``decide-due``, a maintenance window opened and the gate decides
again. Nothing else in it is trusted: the event's record says what to act on, and that
contract message is verified again (seal and scope check, as the trigger layer does for the
topic) before anything is done. A message that is not one the app scheduled is logged and
completed.
"""

from __future__ import annotations

import logging

import azure.functions as func

from functions.lb_pools.moments import DECIDE_COMMAND, DueError, parse_due
from functions.shared import composition
from functions.shared.invocations import DROPPED, log_invocation, note
from functions.shared.triggers import VERIFICATION_ATTRIBUTE

log = logging.getLogger("sebridge.functions.lb_pools")

bp = func.Blueprint()  # type: ignore[no-untyped-call]


def drain_moment(msg: func.ServiceBusMessage) -> None:
    try:
        due = parse_due(msg.get_body())
    except DueError as exc:
        log.error(
            "drain_moment: message %s is not a drain lb-pools scheduled and is dropped: %s",
            msg.message_id,
            exc,
            extra={"messageId": msg.message_id, "reason": str(exc)},
        )
        note(DROPPED)
        return
    deps = composition.dependencies()
    if due.command == DECIDE_COMMAND:
        decided = deps.gate.fire(due, deps.clock())
        note(eventId=due.event_id, decide=str(decided))
        return
    outcome = deps.lb_pools.fire(due, deps.clock())
    note(eventId=due.event_id, drain=outcome.action, reason=outcome.reason or outcome.refused)


_logged = log_invocation(drain_moment)
# The stored contract message is verified in LbPools.fire (LbPools.handle), not here.
setattr(_logged, VERIFICATION_ATTRIBUTE, "verified")
bp.function_name("drain_moment")(
    bp.service_bus_queue_trigger(
        arg_name="msg",
        queue_name="%DrainMomentsQueueName%",
        connection="ServiceBusConnection",
    )(_logged)
)
