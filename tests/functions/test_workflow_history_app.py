"""history through the Function App's own function objects, its table in Azurite: the trigger,
the three HTTP endpoints, and lb-pools recording what reaches no topic (the VMs put back)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func
import icalendar
import pytest

from emulators.azurite import Azurite
from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from tests.fixtures import golden
from tests.functions.history_support import Lifecycle
from tests.functions.support import EVENT_ID, RG, SUB, App, web_vm
from tests.functions.test_workflow_app_guard import EXPECTED, _bindings, _sb
from tests.support.storage import azurite_storage, unique

__all__ = ["azurite_storage"]
pytestmark = pytest.mark.timeout(120)


def _http(route: str) -> list[dict[str, object]]:
    return [
        {
            "direction": "IN",
            "type": "httpTrigger",
            "name": "req",
            "methods": ["GET"],
            "authLevel": "FUNCTION",
            "route": route,
        },
        {"direction": "OUT", "type": "http", "name": "$return"},
    ]


@pytest.fixture
def history_app(
    azurite_storage: tuple[Azurite, FakeIdentity], make_app: Callable[..., App], arm_fake: FakeArm
) -> App:
    """The history on Azurite, in the golden world: the observer web-1 and web-2 exist in ARM,
    so the golden messages pass the trust boundary the history's trigger enforces."""
    storage, _ = azurite_storage
    for vm in ("web-1", "web-2"):
        web_vm(arm_fake, vm, [])
    app = make_app(
        HistorySubscriptionName="history",
        HISTORY_TABLE_URL=storage.table_url(unique("history")),
        CALENDAR_WINDOW_DAYS="30",
    )
    app.clock.now = golden.OBSERVED_AT + timedelta(minutes=1)
    return app


def _get(app: App, name: str, url: str, **route: str) -> func.HttpResponse:
    params = dict(parse_qsl(urlsplit(url).query))  # as the host hands them over
    request = func.HttpRequest("GET", url, body=b"", route_params=route, params=params)
    response = app.call(name, request)
    assert isinstance(response, func.HttpResponse)
    return response


def test_history_registers_only_when_its_subscription_is_set(history_app: App) -> None:
    assert _bindings(history_app) == {
        **EXPECTED,
        "history": _sb("%HistorySubscriptionName%"),
        "events": _http("events"),
        "event_timeline": _http("events/{eventId}"),
        "calendar": _http("calendar.ics"),
    }


def test_an_event_is_listed_shown_and_in_the_calendar(history_app: App) -> None:
    life = Lifecycle()
    life.transition("Scheduled", DurationInSeconds=600)
    for message in life.messages * 2:  # each delivered twice
        history_app.deliver("history", message)
    listed = _get(history_app, "events", "http://127.0.0.1/api/events?state=Scheduled&vm=web-2")
    assert listed.status_code == 200 and listed.mimetype == "application/json"
    document = json.loads(listed.get_body())
    assert [e["eventId"] for e in document["events"]] == [golden.EVENT_ID]
    assert document["events"][0]["impact"]["announcedSeconds"] == 600
    none = _get(history_app, "events", "http://127.0.0.1/api/events?state=Completed")
    assert json.loads(none.get_body())["events"] == []

    feed = _get(history_app, "calendar", "http://127.0.0.1/api/calendar.ics")
    assert feed.status_code == 200 and feed.mimetype == "text/calendar"
    calendar = icalendar.Calendar.from_ical(feed.get_body().decode("utf-8"))
    (vevent,) = calendar.walk("VEVENT")  # type: ignore[union-attr]
    scope = document["events"][0]["id"]
    assert scope.startswith(f"{EVENT_ID}.")  # the event as the observer's scope saw it
    assert str(vevent["UID"]) == f"{scope}-1@sebridge"

    life.transition("Started")
    life.transition("Completed")
    for message in life.messages[1:]:
        history_app.deliver("history", message)
    shown = _get(
        history_app, "event_timeline", f"http://127.0.0.1/api/events/{EVENT_ID}", eventId=EVENT_ID
    )
    (timeline,) = json.loads(shown.get_body())["scopes"]
    assert [row["name"] for row in timeline["timeline"]] == ["Scheduled", "Started", "Completed"]
    assert timeline["event"]["state"] == "Completed"
    assert timeline["event"]["impact"]["measured"] is False


@pytest.mark.parametrize(
    ("url", "route", "status"),
    [
        ("http://127.0.0.1/api/events?state=Nope", {}, 400),
        ("http://127.0.0.1/api/events?vm=a%27%20or%20%271", {}, 400),
        ("http://127.0.0.1/api/events/x", {"eventId": "../summaries"}, 400),
        ("http://127.0.0.1/api/events/x", {"eventId": "00000000-0000-4000-8000-00000000dead"}, 404),
    ],
)
def test_bad_requests_never_reach_the_table(
    history_app: App, url: str, route: dict[str, str], status: int
) -> None:
    name = "event_timeline" if route else "events"
    response = _get(history_app, name, url, **route)
    assert response.status_code == status
    assert "error" in json.loads(response.get_body())


def test_lb_pools_records_the_vms_it_put_back(history_app: App, arm_fake: FakeArm) -> None:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"])
    pool = f"{lb}/backendAddressPools/pool-a"
    for vm in ("web-1", "web-2", "web-3"):
        web_vm(arm_fake, vm, [pool])
    messages = golden.build()
    for name in ("scheduled", "completed"):
        history_app.deliver("lb_pools", messages[name])
        history_app.deliver("history", messages[name])
    history_app.deliver("history", history_app.publisher.published[0])  # the Prepared
    shown = _get(
        history_app, "event_timeline", f"http://127.0.0.1/api/events/{EVENT_ID}", eventId=EVENT_ID
    )
    (scope,) = json.loads(shown.get_body())["scopes"]
    rows = scope["timeline"]
    assert [(r["name"], r["source"]) for r in rows if r["kind"] == "action"] == [
        ("Prepared", "lb-pools"),
        ("Restored", "lb-pools"),
    ]
    history_app.deliver("lb_pools", messages["completed"])  # a redelivery restores nothing more
    again = _get(
        history_app, "event_timeline", f"http://127.0.0.1/api/events/{EVENT_ID}", eventId=EVENT_ID
    )
    assert len(json.loads(again.get_body())["scopes"][0]["timeline"]) == len(rows)
