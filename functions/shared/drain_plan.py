"""When lb-pools drains an event, in one place (pure): lb-pools schedules by it, and the Teams
cards and webhooks say it ("drain at 01:30 UTC", or "now").

The rule itself is sebridge.timing.drain_moment (shared with the forwarder): NotBefore minus
the lead of the event type (APPROVAL_POLICY ``leadSeconds``), at first sight for short notices,
Preempt and Terminate. An event whose policy rule names maintenance windows drains the lead
before the next window opens, if it opens before NotBefore (the gate approves it inside the
window, functions.approval_gate.windows); else as above, and it waits for NotBefore. Without a
drain-moments queue (``DrainMomentsQueueName`` unset) lb-pools drains at first sight, and this
says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from functions.approval_gate import windows
from functions.approval_gate.policy import Policy
from functions.lb_pools import moments
from functions.shared.event_record import event_of
from functions.shared.impact import DEFAULT_RULES, ImpactRules
from functions.shared.ports import PoolStore
from sebridge.contract.events import Observer, Transition, TransitionMessage
from sebridge.imds import ScheduledEvent
from sebridge.timing import drain_moment


@dataclass(frozen=True)
class DrainPlan:
    policy: Policy
    at_the_moment: bool  # a drain-moments queue is configured: drain at the moment
    impact: ImpactRules = field(default=DEFAULT_RULES)  # which events lb-pools drains at all
    # The event records (functions.lb_pools.moments): a drain that fired is told as done.
    records: PoolStore | None = None

    def opening(
        self, event: ScheduledEvent, observer: Observer, now: datetime
    ) -> windows.Opening | None:
        """The maintenance window the event is drained for, decided at ``now`` (the app's
        clock): the one open now or the next, if it opens before NotBefore
        (:func:`windows.before`, which the gate asks too); None: the NotBefore rule."""
        lead = self.policy.leads.lead(event.event_type)
        if event.is_started or event.not_before is None or lead is None:
            return None
        rule_windows = self.policy.decide(event, observer).windows
        if not rule_windows:
            return None
        return windows.before(rule_windows, now, event.not_before)

    def moment(self, event: ScheduledEvent, observer: Observer, now: datetime) -> datetime:
        """When ``event`` (observed by ``observer``) is drained, decided at ``now``: the app's
        clock, never the message's time, so a message that arrives after its window closed
        is planned for the next window (or NotBefore), as the gate decides it."""
        if not self.at_the_moment:
            return now
        moment = drain_moment(event, now, self.policy.leads)
        lead = self.policy.leads.lead(event.event_type)
        opening = self.opening(event, observer, now)
        if opening is None or lead is None:
            return moment
        return max(now, min(moment, opening.start - timedelta(seconds=lead)))

    def describe(
        self, event: ScheduledEvent, observer: Observer, now: datetime, key: str | None = None
    ) -> str | None:
        """``now``, ``at 01:30 UTC`` (with the day when it is not today's), or, once lb-pools
        drained the event (its recorded drain moment fired), ``drained at 01:30 UTC``: what
        happened, never a time still to come. ``key``: the event's verified scope (its scoped
        key), whose recorded moment is read; None (an unverified message): only the plan.
        None when lb-pools does not drain the event (not impactful)."""
        if not self.impact.is_impactful(event):
            return None
        drained = self._drained_at(key) if key is not None else None
        if drained is not None:
            return f"drained at {_clock(drained, now)}"
        at = self.moment(event, observer, now)
        if at <= now:
            return "now"
        return f"at {_clock(at, now)}"

    def _drained_at(self, key: str) -> datetime | None:
        """When lb-pools drained the event (its recorded moment, fired), or None (not yet, or
        no record to read)."""
        if self.records is None or not self.at_the_moment:
            return None
        try:
            entry = moments.pending(self.records.read_event(event_of(key)), key)
        except Exception:  # noqa: BLE001 - a card says what it can; the store's fault is lb-pools'
            return None
        return entry.at if entry is not None and entry.fired else None

    def for_message(
        self, message: TransitionMessage, now: datetime, key: str | None = None
    ) -> str | None:
        """:meth:`describe` for a Scheduled or Updated of an event not started (None for
        every other message: the card or webhook of those says nothing of a drain to come).
        ``key``: the verified message's scoped key (None: unverified)."""
        event = message.event
        if event is None or event.is_started:
            return None
        if message.transition not in (Transition.SCHEDULED, Transition.UPDATED):
            return None
        return self.describe(event, message.observer, now, key)


def _clock(at: datetime, now: datetime) -> str:
    day = "" if at.date() == now.date() else f" on {at:%a %d %b}"
    return f"{at:%H:%M} UTC{day}"
