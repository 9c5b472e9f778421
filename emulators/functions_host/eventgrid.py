"""Event Grid triggers, served the way the Functions host's Event Grid extension serves them.

Event Grid delivers to a function's webhook, ``/runtime/webhooks/EventGrid?functionName=<name>``
(the path is matched without regard to case; in Azure the request also carries the
``eventgrid_extension`` system key as ``code``, which Core Tools does not check locally and
neither does this host). What the extension does (Microsoft.Azure.WebJobs.Extensions.EventGrid,
``HttpRequestProcessor`` and ``EventGridExtensionConfigProvider``), and so what this does:

- unknown or missing ``functionName``: 404 ``cannot find function: '<name>'``;
- ``OPTIONS`` (the CloudEvents abuse-protection handshake): 200 with ``WebHook-Allowed-Origin``
  echoing ``WebHook-Request-Origin`` when it is one of Event Grid's clouds' origins, else
  ``eventgrid.azure.net``;
- ``aeg-event-type: SubscriptionValidation``: 200 with ``{"validationResponse": <code>}``, the
  code from ``data.validationCode`` of the first event of the array (or, for a single object,
  from its ``data``, which may be a JSON string);
- ``aeg-event-type: Notification``: the body is an array of events or one event (CloudEvents
  structured mode); each event is one invocation (single dispatch: a Python function takes one
  event), run concurrently; the answer is 202 when every invocation succeeded, else 500 with
  the first failure's message, and Event Grid redelivers the whole request;
- ``aeg-event-type: Unsubscribe``: 202; any other or no ``aeg-event-type``: 400.

Each event reaches the function through azure.functions' own ``EventGridEventInConverter`` as
the JSON the host sends the worker: an ``EventGridEvent`` for the Event Grid schema, a
``CloudEvent`` when the event carries ``specversion``.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from azure.functions import meta
from azure.functions.eventgrid import EventGridEventInConverter

from emulators.functions_host.bindings import EventGridTrigger, FunctionSpec
from emulators.functions_host.dispatcher import describe_error
from emulators.functions_host.http_server import Response
from emulators.functions_host.invoke import FunctionInvoker
from emulators.functions_host.logs import event as log_event
from emulators.functions_host.sbclient import OutputSender

WEBHOOK_PATH = "/runtime/webhooks/eventgrid"
PUBLIC_ORIGIN = "eventgrid.azure.net"
ORIGINS = frozenset(
    {
        PUBLIC_ORIGIN,
        "eventgrid.azure.us",
        "eventgrid.azure.eaglex.ic.gov",
        "eventgrid.azure.microsoft.scloud",
        "eventgrid.azure.cn",
    }
)
MAX_PARALLEL = 8
_TEXT = [("Content-Type", "text/plain; charset=utf-8")]


@dataclass(frozen=True)
class EventGridFunction:
    spec: FunctionSpec
    trigger: EventGridTrigger
    invoker: FunctionInvoker


def to_function_event(event: Any, function_name: str) -> Any:
    """One event as the worker hands it to the function (azure.functions' own converter)."""
    datum = meta.Datum(type="json", value=json.dumps(event))
    metadata = {
        "data": meta.Datum(type="json", value=json.dumps(event.get("data"))),
        "sys": meta.Datum(
            type="json",
            value=json.dumps({"MethodName": function_name, "RandomGuid": str(uuid.uuid4())}),
        ),
    }
    return EventGridEventInConverter.decode(datum, trigger_metadata=metadata)


class EventGridWebhook:
    def __init__(
        self,
        functions: Sequence[EventGridFunction],
        outputs: OutputSender,
        logger: logging.Logger,
    ) -> None:
        self.functions = {f.spec.name: f for f in functions}
        self.outputs = outputs
        self.logger = logger
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=MAX_PARALLEL, thread_name_prefix="functions-host-eventgrid"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)

    def handle(self, method: str, url: str, headers: dict[str, str], body: bytes) -> Response:
        name = (parse_qs(urlsplit(url).query).get("functionName") or [""])[0]
        function = self.functions.get(name)
        if function is None:
            known = ", ".join(sorted(self.functions))
            log_event(
                self.logger,
                logging.INFO,
                "eventgrid_unknown_function",
                f"cannot find function: '{name}', available function names: [{known}]",
            )
            return Response(404, _TEXT, f"cannot find function: '{name}'".encode())
        if method.upper() == "OPTIONS":
            origin = headers.get("webhook-request-origin", "")
            allowed = origin if origin in ORIGINS else PUBLIC_ORIGIN
            return Response(200, [("WebHook-Allowed-Origin", allowed)], b"")
        kind = headers.get("aeg-event-type", "").split(",")[0].strip().lower()
        try:
            if kind == "subscriptionvalidation":
                return self._validate(name, body)
            if kind == "notification":
                return self._notify(function, body)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            # The extension throws on a body it cannot parse, and the host answers 500.
            return Response(500, _TEXT, f"malformed Event Grid request: {exc}"[:500].encode())
        if kind == "unsubscribe":
            return Response(202, [], b"")
        return Response(400, [], b"")

    def _validate(self, name: str, body: bytes) -> Response:
        events = json.loads(body)
        if isinstance(events, list):
            code = events[0]["data"]["validationCode"]
        elif isinstance(events, dict):
            data = events["data"]
            data = json.loads(data) if isinstance(data, str) else data
            code = data["validationCode"]
        else:
            raise ValueError(f"a JSON object or array was expected, not {type(events).__name__}")
        log_event(
            self.logger,
            logging.INFO,
            "eventgrid_handshake",
            f"perform handshake with eventGrid for function: {name}",
            function=name,
        )
        document = json.dumps({"validationResponse": str(code)}).encode()
        return Response(200, [("Content-Type", "application/json; charset=utf-8")], document)

    def _notify(self, function: EventGridFunction, body: bytes) -> Response:
        token = json.loads(body)
        if isinstance(token, dict):
            events = [token]
        elif isinstance(token, list):
            events = token
        else:
            raise ValueError(f"a JSON object or array was expected, not {type(token).__name__}")
        if not all(isinstance(e, dict) for e in events):
            raise ValueError("every event must be a JSON object")
        if len(events) == 1:
            errors = [self._invoke(function, events[0])]
        else:
            errors = list(self._pool.map(lambda e: self._invoke(function, e), events))
        failed = [e for e in errors if e is not None]
        if failed:
            return Response(500, _TEXT, failed[0][:1000].encode())
        return Response(202, [], b"")

    def _invoke(self, function: EventGridFunction, event: dict[str, Any]) -> str | None:
        """Run the function for one event; the failure's message, or None."""
        started = time.perf_counter()
        error: str | None = None
        try:
            value = to_function_event(event, function.spec.name)
            result = function.invoker.invoke(value)
            for output in function.invoker.service_bus_outputs:
                self.outputs.send(output, function.invoker.output_value(result, output.param))
        except Exception as exc:  # noqa: BLE001 - a failing function answers 500, never kills the host
            error = describe_error(exc)
        log_event(
            self.logger,
            logging.INFO if error is None else logging.ERROR,
            "invocation",
            f"{function.spec.name} {'succeeded' if error is None else 'failed'}",
            function=function.spec.name,
            trigger="eventGridTrigger",
            eventGridId=str(event.get("id"))[:100],
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
            outcome="succeeded" if error is None else "failed",
            error=error,
        )
        return error
