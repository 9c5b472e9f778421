"""Service Bus triggered test functions, registered on sb_app's FunctionApp as a blueprint."""

from __future__ import annotations

import time
import typing

import azure.functions as func

from apps.recorder import Recorder

bp = func.Blueprint()
captured = Recorder()
failures = Recorder()
ordered = Recorder()
relayed = Recorder()
async_seen = Recorder()


def _snapshot(msg: func.ServiceBusMessage) -> dict[str, object]:
    return {
        "body": msg.get_body(),
        "message_id": msg.message_id,
        "session_id": msg.session_id,
        "content_type": msg.content_type,
        "correlation_id": msg.correlation_id,
        "subject": msg.subject,
        "label": msg.label,
        "reply_to": msg.reply_to,
        "reply_to_session_id": msg.reply_to_session_id,
        "to": msg.to,
        "time_to_live": msg.time_to_live,
        "delivery_count": msg.delivery_count,
        "enqueued_time_utc": msg.enqueued_time_utc,
        "expires_at_utc": msg.expires_at_utc,
        "locked_until": msg.locked_until,
        "lock_token": msg.lock_token,
        "sequence_number": msg.sequence_number,
        "enqueued_sequence_number": msg.enqueued_sequence_number,
        "dead_letter_source": msg.dead_letter_source,
        "application_properties": msg.application_properties,
        "user_properties": msg.user_properties,
        "partition_key": msg.partition_key,
        "scheduled_enqueue_time_utc": msg.scheduled_enqueue_time_utc,
        "state": msg.state,
        "metadata": msg.metadata,
    }


@bp.function_name("capture")
@bp.service_bus_topic_trigger(
    arg_name="msg",
    connection="FhServiceBus",
    topic_name="%FhTopicName%",
    subscription_name="capture",
)
def capture(msg: func.ServiceBusMessage, context: func.Context) -> None:
    captured.add({**_snapshot(msg), "function_name": context.function_name})


@bp.function_name("always_fails")
@bp.service_bus_queue_trigger(arg_name="msg", connection="FhServiceBus", queue_name="failing")
def always_fails(msg: func.ServiceBusMessage) -> None:
    failures.add((msg.message_id, msg.delivery_count))
    raise RuntimeError(f"refusing {msg.message_id} on purpose")


@bp.function_name("ordered")
@bp.service_bus_topic_trigger(
    arg_name="msg",
    connection="FhServiceBus",
    topic_name="%FhTopicName%",
    subscription_name="ordered",
    is_sessions_enabled=True,
)
def ordered_handler(msg: func.ServiceBusMessage) -> None:
    # A short pause widens the window in which out-of-order handling would show.
    time.sleep(0.01)
    ordered.add((msg.session_id, msg.get_body().decode()))


@bp.function_name("relay")
@bp.service_bus_queue_trigger(arg_name="msg", connection="FhServiceBus", queue_name="relay-in")
@bp.service_bus_queue_output(arg_name="out", connection="FhServiceBus", queue_name="relay-out")
def relay(msg: func.ServiceBusMessage, out: func.Out[str]) -> None:
    relayed.add(msg.message_id)
    out.set("relayed:" + msg.get_body().decode())


@bp.function_name("async_handler")
@bp.service_bus_queue_trigger(arg_name="msg", connection="FhServiceBus", queue_name="async-in")
async def async_handler(msg: func.ServiceBusMessage) -> None:
    import asyncio

    await asyncio.sleep(0)
    async_seen.add(msg.get_body().decode())


slow_started = Recorder()
slow_finished = Recorder()


@bp.function_name("slow")
@bp.service_bus_queue_trigger(arg_name="msg", connection="FhServiceBus", queue_name="slow-in")
def slow(msg: func.ServiceBusMessage) -> None:
    # Long enough for a test to ask the host to stop while this invocation is in flight.
    slow_started.add(msg.message_id)
    time.sleep(1.5)
    slow_finished.add(msg.message_id)


batches = Recorder()


@bp.function_name("batch")
@bp.service_bus_queue_trigger(
    arg_name="msgs", connection="FhServiceBus", queue_name="batch-in", cardinality="many"
)
def batch(msgs: typing.List[func.ServiceBusMessage]) -> None:  # noqa: UP006
    # typing.List, not list[...]: azure.functions' converter (and so the worker) only
    # recognises typing generics for cardinality many.
    batches.add([(m.message_id, m.get_body().decode()) for m in msgs])
