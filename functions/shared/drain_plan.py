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
from functions.shared.impact import DEFAULT_RULES, ImpactRules
from sebridge.contract.events import Observer, Transition, TransitionMessage
from sebridge.imds import ScheduledEvent
from sebridge.timing import drain_moment


@dataclass(frozen=True)
class DrainPlan:
    policy: Policy
    at_the_moment: bool  # a drain-moments queue is configured: drain at the moment
    impact: ImpactRules = field(default=DEFAULT_RULES)  # which events lb-pools drains at all

    def moment(self, event: ScheduledEvent, observer: Observer, seen: datetime) -> datetime:
        """When ``event`` (seen first at ``seen``, observed by ``observer``) is drained."""
        if not self.at_the_moment:
            return seen
        moment = drain_moment(event, seen, self.policy.leads)
        lead = self.policy.leads.lead(event.event_type)
        if event.is_started or event.not_before is None or lead is None:
            return moment
        rule_windows = self.policy.decide(event, observer).windows
        opening = windows.current_or_next(rule_windows, seen) if rule_windows else None
        if opening is None or opening.start >= event.not_before:
            return moment
        return max(seen, min(moment, opening.start - timedelta(seconds=lead)))

    def describe(
        self, event: ScheduledEvent, observer: Observer, seen: datetime, now: datetime
    ) -> str | None:
        """``now``, or ``at 01:30 UTC`` (with the day when it is not today's); None when
        lb-pools does not drain the event (not impactful)."""
        if not self.impact.is_impactful(event):
            return None
        at = self.moment(event, observer, min(seen, now))
        if at <= now:
            return "now"
        day = "" if at.date() == now.date() else f" on {at:%a %d %b}"
        return f"at {at:%H:%M} UTC{day}"

    def for_message(self, message: TransitionMessage, now: datetime) -> str | None:
        """:meth:`describe` for a Scheduled or Updated of an event not started (None for
        every other message: the card or webhook of those says nothing of a drain to come)."""
        event = message.event
        if event is None or event.is_started:
            return None
        if message.transition not in (Transition.SCHEDULED, Transition.UPDATED):
            return None
        return self.describe(event, message.observer, message.time or now, now)
