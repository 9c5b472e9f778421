"""A body that breaks the contract is a contract error: logged with its reason and completed,
never an exception the runtime would retry ten times. Through the real trigger functions.

The named cases come from the issue; the generated ones put values of every JSON type where the
contract expects something else, and require that no trigger raises (an exception here would
be a retry loop in Azure) whatever the body holds, and that a body the contract refuses changes
nothing anywhere: no card, no ARM write (DELETE included), no blob written (pool state,
leases), no approve command, nothing published, no webhook called, no history row.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators.fakes.arm import FakeArm
from emulators.fakes.webhooks import FakeWebhooks
from sebridge.contract.events import ContractError, Envelope, parse_message
from tests.fixtures import golden
from tests.functions.history_support import MemoryHistoryStore
from tests.functions.support import RG, SUB, App, envelope, sb_message, web_vm
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(120)

# Every trigger of the topic: the app below registers the webhooks and the history too.
FUNCTIONS = ("teams", "lb_pools", "approval_gate", "webhooks", "history")
MANUAL = json.dumps({"rules": [], "default": "manual"})
SLACK_TOKEN = "slack-secret-token-0001"
ROUTING_KEY = "R0uting0Key0For0The0Fake0Service"


@pytest.fixture
def hooks() -> Iterator[FakeWebhooks]:
    server = FakeWebhooks(slack_tokens=(SLACK_TOKEN,))
    server.start()
    yield server
    server.stop()


HistoryWhere = tuple[dict[str, str], dict[str, Any]]  # (settings, composition overrides)


@pytest.fixture
def history_store() -> HistoryWhere:
    """Where the app below keeps its history: here the in-memory store of the history's own
    tests, since what this module checks is decided before any store is written (a refused
    body reaches none; through Azurite, the history was half of this module's CPU). The table
    adapter is tested against Azurite (tests/integration/test_history_azurite.py,
    test_workflow_history_app.py), and test_workflow_odd_times.py, whose odd times do reach
    the table, puts this app's history there."""
    return (
        {"HISTORY_TABLE_URL": "https://history.invalid/sebridgehistory"},  # never reached
        {"history_store": MemoryHistoryStore()},
    )


@pytest.fixture
def make_app(
    make_app: Callable[..., App], hooks: FakeWebhooks, history_store: HistoryWhere
) -> Callable[..., App]:
    """The functions app with every workflow of the topic registered: Teams, lb-pools, the
    approval gate, webhooks (Slack, PagerDuty, generic, at the fake) and the history (in
    ``history_store``)."""
    history_settings, overrides = history_store

    def make(**extra: str) -> App:
        endpoints = [
            {"name": "chat", "preset": "slack", "urlSetting": "WEBHOOK_SLACK_URL"},
            {
                "name": "oncall",
                "preset": "pagerduty",
                "urlSetting": "WEBHOOK_PD_URL",
                "routingKeySetting": "WEBHOOK_PD_ROUTING_KEY",
            },
            {"name": "cmdb", "preset": "generic", "urlSetting": "WEBHOOK_GENERIC_URL"},
        ]
        settings = {
            "WebhooksSubscriptionName": "webhooks",
            "WEBHOOKS": json.dumps(endpoints),
            "WEBHOOK_SLACK_URL": hooks.slack_url(SLACK_TOKEN),
            "WEBHOOK_PD_URL": hooks.pagerduty_url,
            "WEBHOOK_PD_ROUTING_KEY": ROUTING_KEY,
            "WEBHOOK_GENERIC_URL": hooks.generic_url("hook-secret-path-42"),
            "HistorySubscriptionName": "history",
            **history_settings,
        }
        app = make_app(overrides=overrides, **{**settings, **extra})
        EFFECTS_OF[id(app)] = (hooks,)
        return app

    return make


EFFECTS_OF: dict[int, tuple[FakeWebhooks]] = {}  # an app's fakes beyond App's own


@pytest.fixture
def world(arm_fake: FakeArm) -> None:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    for vm in ("web-1", "web-2", "web-3", "web-4"):
        web_vm(arm_fake, vm, [pool])


def body_of(name: str = "scheduled") -> dict[str, Any]:
    return copy.deepcopy(golden.build()[name].body)


def deliver_raw(app: App, body: dict[str, Any] | bytes, name: str = "scheduled") -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    for function in FUNCTIONS:
        app.call(function, sb_message(golden.build()[name], body=raw))


@dataclass(frozen=True)
class Effects:
    """What the workflows have done so far: counts of the fakes' records, and the history's
    listing."""

    cards: int
    arm_writes: int
    blob_writes: int
    commands: int
    published: int
    webhook_calls: int
    history: str  # the history's listing

    @classmethod
    def of(cls, app: App) -> Effects:
        (hooks,) = EFFECTS_OF[id(app)]
        assert app.storage is not None
        blob_writes = [r for r in app.storage.requests if r.method in {"PUT", "DELETE", "POST"}]
        return cls(
            len(app.teams.cards),
            len(app.arm.writes()),
            len(blob_writes),
            len(app.commands.sent),
            len(app.publisher.published),
            len(hooks.requests),
            history_listing(app),
        )


def history_listing(app: App) -> str:
    """What the history shows of every event (its own listing: one request, so that the
    exhaustive tests stay quick): a row a refused body wrote would add an event or change one's
    summary (state, lastSeen, appearances)."""
    listed = _get(app, "events", "http://127.0.0.1/api/events")
    assert listed.status_code == 200, listed.get_body()
    return json.dumps(json.loads(listed.get_body())["events"], sort_keys=True)


def _get(app: App, name: str, url: str, **route: str) -> func.HttpResponse:
    params = dict(parse_qsl(urlsplit(url).query))  # as the host hands them over
    request = func.HttpRequest("GET", url, body=b"", route_params=route, params=params)
    response = app.call(name, request)
    assert isinstance(response, func.HttpResponse)
    return response


NONE_MORE = "a body the contract refuses changed something"


def refused(raw: bytes, message_id: str) -> bool:
    try:
        parse_message(raw, message_id)
    except ContractError:
        return True
    return False


def deliver_and_check(app: App, raw: bytes, template: Envelope, where: str) -> None:
    """Through all three triggers: none raises, and a refused body has no effect at all."""
    before = Effects.of(app) if refused(raw, template.message_id) else None  # counting costs
    for function in FUNCTIONS:
        try:
            app.call(function, sb_message(template, body=raw))
        except Exception as exc:
            raise AssertionError(f"{function} raised on {where}") from exc
    if before is not None:
        assert Effects.of(app) == before, f"{NONE_MORE}: {where}"


def with_data(**changes: Any) -> dict[str, Any]:
    body = body_of()
    body["data"].update(changes)
    return body


CONTRACT_ERRORS = [
    pytest.param(with_data(), "", id="control-valid"),
    pytest.param({**body_of(), "type": 7}, "attribute 'type'", id="type-not-a-string"),
    pytest.param({**body_of(), "type": ["x"]}, "attribute 'type'", id="type-a-list"),
    # Normalised by the one tolerant reader (issue 22, item 3): read, named in the message's
    # warnings, and handed to the workflows.
    pytest.param({**body_of(), "time": "9999-12-31T23:59:59-01:00"}, "", id="time-out-of-range"),
    pytest.param({**body_of(), "specversion": 1.0}, "specversion", id="specversion-number"),
    pytest.param(with_data(schemaVersion=True), "schemaVersion", id="schema-version-bool"),
    pytest.param(with_data(observer=["web-1"]), "observer", id="observer-a-list"),
    pytest.param(with_data(Resources="web-1"), "", id="resources-a-string"),
    pytest.param(with_data(Resources=["web-1", 2]), "", id="resources-with-a-number"),
    pytest.param(with_data(EventId=None), "EventId", id="event-id-null"),
    pytest.param(with_data(EventStatus=5), "", id="status-a-number"),
    pytest.param(with_data(documentIncarnation="11"), "", id="incarnation"),
    pytest.param(b"\xff\xfe not json", "not JSON", id="not-utf8"),
    pytest.param(b"[" * 100_000, "not JSON", id="deep-nesting"),
]


@pytest.mark.parametrize(("body", "reason"), CONTRACT_ERRORS)
def test_a_body_that_breaks_the_contract_is_completed_not_raised(
    app: App, world: None, caplog: pytest.LogCaptureFixture, body: Any, reason: str
) -> None:
    deliver_raw(app, body)  # none of the three raises
    if not reason:
        # A valid (or normalised) body does reach the workflows, and each counter sees it.
        effects = Effects.of(app)
        assert effects.cards and effects.webhook_calls and effects.history != "[]", effects
        assert effects.arm_writes and effects.blob_writes, effects
        return
    broken = [r for r in caplog.records if "breaks contract v1" in r.getMessage()]
    assert len(broken) == len(FUNCTIONS)
    assert all(reason in str(getattr(r, "reason", "")) for r in broken)
    assert Effects.of(app) == Effects(0, 0, 0, 0, 0, 0, "[]")


NOT_BEFORE_OUT_OF_RANGE = "9999-12-31T23:59:59-01:00"


def test_an_out_of_range_not_before_is_read_as_unknown(
    make_app: Callable[..., App], world: None
) -> None:
    """NotBefore that cannot be expressed in UTC parses to None (the verbatim value is kept):
    no trigger raises, the card says '-', and no human is asked to approve a moment that
    does not exist."""
    app = make_app(APPROVAL_POLICY=MANUAL)
    body = with_data(NotBefore=NOT_BEFORE_OUT_OF_RANGE, notBefore=None)
    deliver_raw(app, body)
    (card,) = app.teams.cards
    assert "actions" not in card
    assert "Not before (UTC): " in json.dumps(card)
    assert not app.commands.sent


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"changes": "NotBefore"}, id="changes-a-string"),
        pytest.param({"changes": {"Resources": ["web-2"]}}, id="changes-without-from-to"),
        pytest.param(
            {"changes": {"Resources": {"from": "web-2", "to": None}}}, id="changes-bad-types"
        ),
        pytest.param(
            {"changes": {"Resources": {"from": ["web-2", 7, None], "to": []}}},
            id="changes-mixed-list",
        ),
    ],
)
def test_an_updated_with_odd_changes_is_handled(
    app: App, world: None, changes: dict[str, Any]
) -> None:
    body = copy.deepcopy(golden.build()["updated"].body)
    body["data"].update(changes)
    deliver_raw(app, body, "updated")
    assert app.teams.cards


def test_a_held_or_approved_with_odd_details_still_makes_a_card(app: App, world: None) -> None:
    from tests.functions.test_workflow_cards import assert_valid

    held = copy.deepcopy(golden.build()["held"].body)
    held["data"]["held"] = {"pool": 5, "vms": "web-1", "healthy": "x"}
    approved = copy.deepcopy(golden.build()["approved"].body)
    approved["data"]["approval"] = ["not", "an", "object"]
    for body, name in ((held, "held"), (approved, "approved")):
        app.call("teams", sb_message(golden.build()[name], body=json.dumps(body).encode()))
    assert len(app.teams.cards) == 2
    for card in app.teams.cards:
        assert_valid(card)


def test_an_event_id_that_is_not_a_guid_is_never_approved(
    make_app: Callable[..., App], world: None, caplog: pytest.LogCaptureFixture
) -> None:
    """IMDS EventIds are GUIDs; the contract carries anything (a digest names it). Neither an
    approve command nor an Approve link can be made for it: logged, completed."""
    for policy in (None, MANUAL):
        app = make_app(**({"APPROVAL_POLICY": policy} if policy else {}))
        message = envelope(
            "Scheduled", EventId="not-a-guid", EventType="Freeze", DurationInSeconds=5
        )
        for function in FUNCTIONS:
            app.deliver(function, message)
        assert not app.commands.sent
        assert all("actions" not in card for card in app.teams.cards)
    assert "is not a GUID" in caplog.text


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=8,
)
DATA_FIELDS = [
    "EventId",
    "EventType",
    "ResourceType",
    "Resources",
    "EventStatus",
    "NotBefore",
    "Description",
    "EventSource",
    "DurationInSeconds",
    "notBefore",
    "documentIncarnation",
    "changes",
    "approval",
    "prepared",
    "held",
]
OBSERVER_FIELDS = [
    "vmName",
    "vmId",
    "resourceId",
    "subscriptionId",
    "resourceGroup",
    "vmScaleSetName",
]
ENVELOPE_FIELDS = ["type", "time", "id", "source", "subject", "specversion", "data"]


@pytest.mark.slow  # about 8 s or more: make check leaves it to make test
@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(["scheduled", "updated", "completed", "held", "prepared", "approved"]),
    where=st.sampled_from(["data", "observer", "envelope"]),
    field_index=st.integers(min_value=0, max_value=100),
    value=JSON_VALUES,
)
def test_no_body_makes_a_trigger_raise(
    make_app: Callable[..., App],
    world: None,
    name: str,
    where: str,
    field_index: int,
    value: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(APPROVAL_POLICY=MANUAL) if field_index % 2 else make_app()
    caplog.set_level(logging.CRITICAL, logger="sebridge")  # expected refusals by the hundred
    body = copy.deepcopy(golden.build()[name].body)
    if where == "data":
        body["data"][DATA_FIELDS[field_index % len(DATA_FIELDS)]] = value
    elif where == "observer":
        body["data"]["observer"][OBSERVER_FIELDS[field_index % len(OBSERVER_FIELDS)]] = value
    else:
        body[ENVELOPE_FIELDS[field_index % len(ENVELOPE_FIELDS)]] = value
    raw = json.dumps(body).encode()
    deliver_and_check(app, raw, golden.build()[name], f"{where} of {name} = {value!r}")


ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63,
    1.5,
    1e308,
    "",
    "x",
    "9999-12-31T23:59:59-01:00",
    [],
    ["web-2", 7, None],
    {},
    {"from": "a", "to": ["b"]},
    {"Resources": {"from": ["web-2"], "to": "web-1"}},
]


@pytest.mark.parametrize(
    "name", ["scheduled", "updated", "started", "completed", "held", "prepared", "approved"]
)
@pytest.mark.slow
def test_every_field_with_every_odd_value(
    make_app: Callable[..., App], world: None, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Exhaustive where the generated test samples: each field of data, of the observer and of
    the envelope, set to each odd value in turn, through all three triggers."""
    app = make_app(APPROVAL_POLICY=MANUAL)
    caplog.set_level(logging.CRITICAL, logger="sebridge")
    template = golden.build()[name]
    refusals = 0
    places = (
        [("data", f) for f in DATA_FIELDS]
        + [("observer", f) for f in OBSERVER_FIELDS]
        + [("envelope", f) for f in ENVELOPE_FIELDS]
    )
    for where, field in places:
        for value in ODD_VALUES:
            body = copy.deepcopy(template.body)
            target = {
                "data": body["data"],
                "observer": body["data"]["observer"],
                "envelope": body,
            }[where]
            target[field] = value
            raw = json.dumps(body).encode()
            deliver_and_check(app, raw, template, f"{where}.{field}={value!r}")
            refusals += refused(raw, template.message_id)
    assert refusals, "no odd value was refused: the check above never ran"
