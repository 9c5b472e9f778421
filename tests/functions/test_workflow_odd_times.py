"""Issue 24 review, item 1: a NotBefore (or a DurationInSeconds) at the edges of time never
makes a workflow raise. Before: lb-pools and Teams raised OverflowError on a Scheduled whose
NotBefore was year 1 (redelivered until dead-lettered: no card, no drain).

Through the real trigger functions of every workflow of the topic (Teams, lb-pools, the
approval gate, webhooks at the fake, the history in Azurite), with a drain-moments queue and
an approval policy, so that the timing, the drain plan and the gate all run.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators.azurite import Azurite
from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from tests.functions.support import RG, SUB, App, envelope, web_vm
from tests.functions.test_workflow_contract_errors import (
    FUNCTIONS,
    HistoryWhere,
    hooks,
    make_app,
)
from tests.support.budget import examples
from tests.support.storage import azurite_storage, unique
from tests.unit.test_times import EDGE, rfc1123

__all__ = ["azurite_storage", "hooks", "make_app"]


@pytest.fixture
def history_store(azurite_storage: tuple[Azurite, FakeIdentity]) -> HistoryWhere:
    """The history in a table of its own in Azurite: odd times reach the table here."""
    storage, _ = azurite_storage
    return {"HISTORY_TABLE_URL": storage.table_url(unique("history"))}, {}


pytestmark = pytest.mark.timeout(300)

POLICY = json.dumps(
    {
        "rules": [{"name": "all", "match": {}, "action": "approve-when-prepared"}],
        "leadSeconds": {"Reboot": 600, "Freeze": "first-sight"},
    }
)
COUNTER = itertools.count(1)


@pytest.fixture
def app(make_app: Callable[..., App], arm_fake: FakeArm) -> App:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    for vm in ("web-1", "web-2", "web-3", "web-4"):
        web_vm(arm_fake, vm, [pool])
    return make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)


@pytest.mark.parametrize(
    "not_before",
    [
        "0001-01-01T00:00:00Z",
        "Mon, 01 Jan 0001 00:00:00 GMT",
        "9999-12-31T23:59:59Z",
        "Fri, 31 Dec 9999 23:59:59 GMT",
    ],
)
def test_the_reviewers_notbefore_reaches_every_workflow(app: App, not_before: str) -> None:
    deliver_all(app, "Scheduled", not_before, -1, "Reboot")


def deliver_all(app: App, first: str, not_before: str, duration: object, kind: str) -> None:
    event_id = f"{next(COUNTER):08x}-0000-4000-8000-00000000a24c"
    cards = len(app.teams.cards)
    for transition in (first, "Started"):
        started = transition == "Started"
        message = envelope(
            transition,
            EventId=event_id,
            EventType=kind,
            EventStatus="Started" if started else "Scheduled",
            NotBefore="" if started else not_before,
            DurationInSeconds=duration,
        )
        for function in FUNCTIONS:
            try:
                app.deliver(function, message)
            except Exception as exc:
                raise AssertionError(
                    f"{function} raised on {transition} NotBefore={not_before!r} "
                    f"DurationInSeconds={duration!r}"
                ) from exc
        app.fire_due()
    assert len(app.teams.cards) > cards  # the notification went out


@pytest.mark.slow  # about 10 s on its own (each example runs every workflow over Azurite)
@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    moment=EDGE,
    offset=st.sampled_from([UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=14))]),
    rfc=st.booleans(),
    first=st.sampled_from(["Scheduled", "Updated"]),
    duration=st.sampled_from([-1, 0, 5, 86_400 * 400, 10**30]),
    kind=st.sampled_from(["Reboot", "Freeze", "Redeploy"]),
    advance=st.sampled_from([0, 600, 86_400 * 8]),
)
def test_any_time_at_the_edges_through_every_workflow(
    app: App,
    moment: datetime,
    offset: timezone,
    rfc: bool,
    first: str,
    duration: int,
    kind: str,
    advance: int,
) -> None:
    text = (
        rfc1123(moment.replace(microsecond=0)) if rfc else moment.replace(tzinfo=offset).isoformat()
    )
    app.clock.now += timedelta(seconds=advance)
    deliver_all(app, first, text, duration, kind)
