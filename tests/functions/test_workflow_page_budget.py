"""Pages a compromised VM can cause are bounded (hostile review of issue 23c, break 2).

web-1 is verified (its real identity) but compromised: it reports invented Terminates about
itself, each with a new EventId. Through the real webhooks function, the loopback ARM, blob
storage (the budget's records, under their ETags) and the recording webhook receivers.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from emulators.fakes.webhooks import PAGERDUTY, SLACK, FakeWebhooks
from functions.adapters.pool_state import BlobPoolStore
from functions.webhooks.budget import PageBudget, spend
from sebridge.imds import isoformat_utc
from tests.functions.support import NOW, POOL_CONTAINER, App, at_once, envelope
from tests.functions.test_workflow_webhooks_trust import (  # noqa: F401 - fixtures
    ENDPOINTS,
    hooks,
    make_hooks_app,
    world,
)

pytestmark = pytest.mark.timeout(60)

OBSERVER = "/subscriptions/x/resourcegroups/rg/providers/microsoft.compute/virtualmachines/web-1"


def actions(server: FakeWebhooks) -> list[str]:
    return [body["event_action"] for body in server.bodies(PAGERDUTY)]


def invented(event_id: str, transition: str = "Scheduled") -> object:
    return envelope(transition, EventId=event_id, EventType="Terminate", Resources=["web-1"])


def test_a_compromised_vm_pages_at_most_its_budget(
    make_hooks_app: Callable[..., App],  # noqa: F811 - the fixture
    hooks: FakeWebhooks,  # noqa: F811
    world: dict[str, str],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reviewer's row: 5 invented Terminates opened 5 critical incidents. With a budget of 2
    an hour: 2 incidents, 3 suppressed with one WARNING each saying why; the Slack channel still
    hears of all 5; the opened ones' later transitions and every resolve pass; an hour later the
    observer may page again."""
    app = make_hooks_app(ENDPOINTS, WEBHOOK_PAGES_PER_OBSERVER_HOUR="2")
    events = [str(uuid.uuid4()) for _ in range(5)]
    with caplog.at_level(logging.WARNING, logger="sebridge.functions.webhooks"):
        for event_id in events:
            app.deliver("webhooks", invented(event_id))
    assert actions(hooks) == ["trigger", "trigger"]
    suppressed = [r for r in caplog.records if "page suppressed" in r.getMessage()]
    assert len(suppressed) == 3
    assert all("WEBHOOK_PAGES_PER_OBSERVER_HOUR=2" in str(r.reason) for r in suppressed)
    assert len(hooks.bodies(SLACK)) == 5
    # An opened incident's Started still reaches on-call (the same incident, no new one).
    app.deliver("webhooks", invented(events[0], "Started"))
    assert actions(hooks).count("trigger") == 3
    for event_id in events:
        app.deliver("webhooks", invented(event_id, "Cancelled"))
    assert actions(hooks).count("resolve") == 5
    app.clock.now = NOW + timedelta(hours=1, minutes=1)
    app.deliver("webhooks", invented(str(uuid.uuid4())))
    assert actions(hooks).count("trigger") == 4


def test_instances_share_one_budget(
    identity_fake: FakeIdentity, storage_fake: FakeBlobStorage
) -> None:
    """Two app instances (each its own store client) spend one observer's budget at once:
    under the record's ETag, exactly the budget is spent, whatever the interleaving."""
    url = storage_fake.container_url(POOL_CONTAINER)
    budgets = [PageBudget(BlobPoolStore(url, ManagedIdentityCredential()), 3) for _ in range(2)]
    answers: list[bool] = []

    def spend(budget: PageBudget, first: int) -> None:
        for n in range(first, first + 4):
            answers.append(budget.admit(OBSERVER, f"event-{n}", NOW).allowed)

    errors = at_once(lambda: spend(budgets[0], 0), lambda: spend(budgets[1], 10))
    assert not errors, errors
    assert sorted(answers) == [False] * 5 + [True] * 3
    # A repeat of an event that paged passes; another observer has a budget of its own.
    assert budgets[1].admit(OBSERVER, "event-0", NOW).allowed == ("event-0" in admitted(budgets))
    assert budgets[0].admit(OBSERVER.replace("web-1", "web-2"), "event-0", NOW).allowed


def admitted(budgets: list[PageBudget]) -> set[str]:
    record = budgets[0].store.read_event("page-budget:" + OBSERVER)  # type: ignore[attr-defined]
    return {entry["event"] for entry in record["pages"]}


@pytest.mark.parametrize("at", ["2026-11-26T10:00:00", "1969-01-01T00:00:00Z", "not a time", 7])
def test_a_damaged_entry_in_a_budget_record_is_dropped_not_raised(at: object) -> None:
    """A page budget record is read back from the blob store: an entry whose time has no zone
    (the bridge never writes one) used to be compared with the aware clock and raise, failing
    every webhook delivery of that observer. It is dropped, and the budget counts on."""
    record: dict[str, object] = {"pages": [{"event": "old", "at": at}]}
    changed, answer = spend(record, "new", NOW, 2)
    assert answer.allowed and changed
    assert record["pages"] == [{"event": "new", "at": isoformat_utc(NOW)}]
