"""webhooks: post each transition to every configured endpoint that wants it (core).

For one message, each endpoint's filter and preset decide whether it gets a body (a message
that failed the scope check goes only to endpoints with ``unverified: true``, marked so, never
to PagerDuty: an unverified message triggers, resolves or closes nothing); the bodies
are posted side by side (the adapter retries each within its bound), so a slow endpoint does
not hold the others back and the invocation stays within one retry budget however many
endpoints there are. Then:

* every endpoint took it, or refused it for good (a 4xx: wrong URL, archived channel, invalid
  routing key): the message completes. A refusal is logged at ERROR naming the endpoint and
  the status; retrying would repeat the refusal and post duplicates to every other endpoint.
* an endpoint still failed after its retries (429, 5xx, timeouts, a long Retry-After):
  :class:`DeliveryFailed` is raised, Service Bus redelivers the message, and the redelivery
  posts to every endpoint that takes it again. PagerDuty folds that into the same alert (one
  dedup key per event); Slack shows the message twice; a generic receiver can drop it by
  ``messageId``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from functions.shared import seal
from functions.shared.impact import ImpactRules
from functions.shared.verified import UnverifiedMessage, VerifiedMessage
from functions.webhooks.budget import PageBudget
from functions.webhooks.config import Endpoint
from functions.webhooks.ports import WebhookPoster, WebhookRejected
from functions.webhooks.presets import PAGERDUTY, Skip, build_body
from functions.webhooks.templates import message_fields

log = logging.getLogger("sebridge.functions.webhooks")

POSTED, SKIPPED, REJECTED, FAILED = "posted", "skipped", "rejected", "failed"
SUPPRESSED = "suppressed"  # a trigger beyond its observer's page budget (functions.webhooks.budget)
MAX_PARALLEL = 4


@dataclass(frozen=True)
class Result:
    endpoint: str
    status: str  # posted | skipped | rejected | failed | suppressed
    reason: str = ""


class DeliveryFailed(Exception):
    """An endpoint still failed after its retries: the message goes back to Service Bus."""

    def __init__(self, results: Sequence[Result]) -> None:
        self.results = list(results)
        failed = [r for r in results if r.status == FAILED]
        names = ", ".join(f"{r.endpoint} ({r.reason})" for r in failed)
        super().__init__(
            f"webhooks: {len(failed)} of {len(results)} endpoint(s) failed: {names}; "
            "the message will be redelivered"
        )


def counts(results: Sequence[Result]) -> dict[str, int]:
    return {
        status: sum(r.status == status for r in results)
        for status in (POSTED, SKIPPED, REJECTED, FAILED, SUPPRESSED)
    }


def plan(
    checked: VerifiedMessage | UnverifiedMessage,
    endpoints: Sequence[Endpoint],
    impact: ImpactRules,
    drain: str | None = None,
) -> list[tuple[Endpoint, Any] | Result]:
    """Per endpoint, in order: the body to post, or why it is skipped (pure). ``drain``: when
    lb-pools drains the event (the ``drainText`` field)."""
    message = checked.message
    event = message.event
    if event is None:
        raise ValueError("webhooks get no Heartbeat (the subscription filter drops them)")
    unverified = checked.reason if isinstance(checked, UnverifiedMessage) else None
    fields = message_fields(message, impact, unverified=unverified, drain=drain)
    planned: list[tuple[Endpoint, Any] | Result] = []
    for endpoint in endpoints:
        if unverified is not None and not endpoint.unverified:
            planned.append(Result(endpoint.name, SKIPPED, "unverified"))
            continue
        if not endpoint.accepts(message.transition, event.event_type, bool(fields["impactful"])):
            planned.append(Result(endpoint.name, SKIPPED, "filter"))
            continue
        body = build_body(endpoint.preset, checked, fields, endpoint.template, endpoint.routing_key)
        if isinstance(body, Skip):
            planned.append(Result(endpoint.name, SKIPPED, body.reason))
        else:
            planned.append((endpoint, body))
    return planned


def within_budget(
    checked: VerifiedMessage | UnverifiedMessage,
    planned: list[tuple[Endpoint, Any] | Result],
    budget: PageBudget | None,
    now: datetime,
) -> list[tuple[Endpoint, Any] | Result]:
    """The plan with its PagerDuty triggers suppressed when the observer has no incident left
    in its hour (functions.webhooks.budget): one WARNING with the reason, each such endpoint a
    ``suppressed`` result. Resolves, other endpoints and sealed messages (Event Grid) pass."""
    triggers = [
        i
        for i, item in enumerate(planned)
        if not isinstance(item, Result)
        and item[0].preset == PAGERDUTY
        and isinstance(item[1], dict)
        and item[1].get("event_action") == "trigger"
    ]
    if not triggers or budget is None or not isinstance(checked, VerifiedMessage):
        return planned
    if seal.is_sealed(checked.message):
        return planned  # the app's own word (Event Grid): not a VM's claim
    observer = checked.scope.observer.id
    admission = budget.admit(observer, checked.scoped_key, now)
    if admission.allowed:
        return planned
    log.warning(
        "page suppressed for %s from %s: %s",
        checked.message.event_id,
        checked.message.observer.vm_name,
        admission.reason,
        extra={
            "eventId": checked.message.event_id,
            "observer": observer,
            "reason": admission.reason,
        },
    )
    result = list(planned)
    for index in triggers:
        endpoint = planned[index]
        assert not isinstance(endpoint, Result)
        result[index] = Result(endpoint[0].name, SUPPRESSED, admission.reason)
    return result


def _post(poster: WebhookPoster, endpoint: Endpoint, body: Any, what: str) -> Result:
    try:
        poster.post(endpoint.name, endpoint.url, body)
    except WebhookRejected as exc:
        # The body may echo the request (a routing key): keep the log to the status.
        log.error(
            "webhook %s refused %s with HTTP %d; not retried (check its URL, key and payload)",
            endpoint.name,
            what,
            exc.status,
            extra={"endpoint": endpoint.name, "status": exc.status},
        )
        return Result(endpoint.name, REJECTED, f"HTTP {exc.status}")
    except Exception as exc:  # noqa: BLE001 - the port's transient failures, reported below
        log.warning("webhook %s: %s not delivered: %s", endpoint.name, what, exc)
        return Result(endpoint.name, FAILED, type(exc).__name__)
    log.info("webhook %s: %s posted", endpoint.name, what, extra={"endpoint": endpoint.name})
    return Result(endpoint.name, POSTED)


def deliver(
    checked: VerifiedMessage | UnverifiedMessage,
    *,
    endpoints: Sequence[Endpoint],
    poster: WebhookPoster | None,
    impact: ImpactRules,
    drain: str | None = None,
    budget: PageBudget | None = None,
    now: datetime | None = None,
) -> list[Result]:
    """Post the message to every endpoint that takes it, PagerDuty triggers within the
    observer's page budget; raise DeliveryFailed if one failed."""
    message = checked.message
    planned = plan(checked, endpoints, impact, drain)
    if budget is not None:
        if now is None:
            raise ValueError("a page budget needs the app's clock")
        planned = within_budget(checked, planned, budget, now)
    jobs = [(i, item) for i, item in enumerate(planned) if not isinstance(item, Result)]
    results: list[Result | None] = [item if isinstance(item, Result) else None for item in planned]
    if jobs and poster is None:
        raise RuntimeError("webhook endpoints are configured but no poster was wired")
    what = f"{message.transition.value} of {message.event_id}"
    if len(jobs) == 1:
        index, (endpoint, body) = jobs[0]
        assert poster is not None
        results[index] = _post(poster, endpoint, body, what)
    elif jobs:
        assert poster is not None
        with ThreadPoolExecutor(
            max_workers=min(len(jobs), MAX_PARALLEL), thread_name_prefix="webhook"
        ) as pool:
            futures = {i: pool.submit(_post, poster, e, body, what) for i, (e, body) in jobs}
            for index, future in futures.items():
                results[index] = future.result()
    done = [r for r in results if r is not None]
    if any(r.status == FAILED for r in done):
        raise DeliveryFailed(done)
    return done
