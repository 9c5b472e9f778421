"""A small fleet: N forwarders see one event; exactly one message per transition per subscription.

The CI-sized version of benchmarks/fleet.py (same code): 5 real `sebridge forwarder` processes
poll one IMDS simulator through its /vm/<name>/ prefix (so each names itself vm-000..vm-004)
and publish to one Service Bus emulator; one event goes Scheduled -> Started -> Completed.
Every forwarder publishes every transition with the same message id, and the topic's
duplicate detection must leave exactly one copy on each subscription that wants it.
"""

from __future__ import annotations

import pytest

from benchmarks.fleet import EXPECTED, TRANSITIONS, report, run_fleet

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

FORWARDERS = 5


@pytest.mark.timeout(120)
def test_one_message_per_transition_per_subscription_from_a_fleet() -> None:
    lines: list[str] = []
    result = run_fleet(
        FORWARDERS, wave=FORWARDERS, timeout=90.0, step_timeout=20.0, say=lines.append
    )
    text = "\n".join(lines + report(result, []))

    assert result.polling == FORWARDERS, text
    for step in result.steps:
        assert (step.detected, step.published) == (FORWARDERS, FORWARDERS), text
    assert [step.transition for step in result.steps] == list(TRANSITIONS), text
    assert result.published_total() == FORWARDERS * len(TRANSITIONS), text
    assert result.subscriptions == EXPECTED, text
    assert result.message_ids_ok, text
    assert result.ok, text
