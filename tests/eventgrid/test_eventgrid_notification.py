"""Reading one Event Grid notification: the documented sample, both schemas, hostile input."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulators.fakes.eventgrid import CLOUD_EVENT_SCHEMA
from functions.eventgrid_ingest.notification import (
    CANCELED,
    InvalidNotification,
    RawNotification,
    parse_notification,
    parse_time,
    raw_from_json,
)
from tests.eventgrid.support import EVENT_ID, RG, SUB, VM, documented_sample, event_json


def parse(body: dict[str, Any]):  # type: ignore[no-untyped-def]
    return parse_notification(raw_from_json(body))


def test_the_documented_sample_payload() -> None:
    n = parse(documented_sample())
    assert n.id == "3da1b9aa-5204-4335-8c33-c54e315dcffe"
    assert n.status == "Started"
    assert n.time == datetime(2017, 6, 26, 18, 41, 0, 958410, tzinfo=UTC)  # eventTime
    assert n.event.event_type == "Freeze" and n.event.duration_in_seconds == 5
    assert n.event.resources == ("myvmss_1", "myvmss_2")
    # The IMDS fields only: ScheduledEventApiVersion is Event Grid's, not IMDS's.
    assert "ScheduledEventApiVersion" not in n.event.raw
    assert n.event.not_before == datetime(2025, 9, 19, 18, 29, 47, tzinfo=UTC)
    # A scale set's event: the scale set is the observer, its id the CloudEvent source.
    observer = n.observer
    assert observer.vm_name == "myvmss" and observer.vm_scale_set_name == "myvmss"
    assert observer.subscription_id == SUB and observer.resource_group == RG
    assert observer.resource_id == (
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/"
        "virtualMachineScaleSets/myvmss"
    )
    assert observer.source == observer.resource_id
    assert observer.location == "eastus" and observer.vm_id == "" and observer.zone == ""
    assert n.provenance()["resourceId"] == documented_sample()["data"]["resourceInfo"]["id"]


def test_a_vm_event_in_azures_lower_case_spelling() -> None:
    """As captured from a live subscription: lower-case provider segments, the VM's id as the
    subject, operationalInfo.resourceEventTime without a zone (UTC)."""
    body = event_json("Completed", 0)
    info = body["data"]["resourceInfo"]
    info["id"] = (
        info["id"]
        .replace("resourceGroups", "resourcegroups")
        .replace("Microsoft.Compute/virtualMachines", "microsoft.compute/virtualmachines")
    )
    body["data"]["operationalInfo"] = {"resourceEventTime": "2024-12-04T18:01:13.2675752"}
    n = parse(body)
    assert n.status == "Completed"
    assert n.time == datetime(2024, 12, 4, 18, 1, 13, 267575, tzinfo=UTC)  # resourceEventTime
    assert n.observer.vm_name == VM and n.observer.vm_scale_set_name == ""
    assert n.observer.resource_id == (
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{VM}"
    )


def test_cloud_events_schema_reads_the_same() -> None:
    grid = parse(event_json("Scheduled", 5, event_grid_id="abc"))
    cloud = parse(event_json("Scheduled", 5, schema=CLOUD_EVENT_SCHEMA, event_grid_id="abc"))
    assert grid == cloud


def test_canceled_and_cancelled_are_one_status() -> None:
    assert parse(event_json("Canceled")).status == CANCELED
    assert parse(event_json("Cancelled")).status == CANCELED


def test_an_availability_set_event() -> None:
    body = event_json()
    info = body["data"]["resourceInfo"]
    info["id"] = info["id"].replace("virtualMachines/web-1", "availabilitySets/as-web")
    n = parse(body)
    assert n.observer.vm_name == "as-web" and n.observer.vm_scale_set_name == ""
    assert n.observer.resource_id.endswith("/Microsoft.Compute/availabilitySets/as-web")


def _with_id(resource_id: str) -> dict[str, Any]:
    body = event_json()
    body["data"]["resourceInfo"]["id"] = resource_id
    body["subject"] = resource_id
    return body


PREFIX = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute"
SUFFIX = f"providers/Microsoft.Maintenance/scheduledEvents/{EVENT_ID}"
HOSTILE_IDS = {
    "path traversal": f"{PREFIX}/virtualMachines/../{SUFFIX}",
    "encoded slash": f"{PREFIX}/virtualMachines/web%2F1/{SUFFIX}",
    "query in a name": f"{PREFIX}/virtualMachines/web-1?api-version=1/{SUFFIX}",
    "name ends in a hyphen": f"{PREFIX}/virtualMachines/web-/{SUFFIX}",
    "name too long": f"{PREFIX}/virtualMachines/{'a' * 65}/{SUFFIX}",
    "group ends in a period": PREFIX.replace(RG, "rg.") + f"/virtualMachines/web-1/{SUFFIX}",
    "subscription not a GUID": PREFIX.replace(SUB, "not-a-guid")
    + f"/virtualMachines/web-1/{SUFFIX}",
    "another provider": PREFIX.replace("Microsoft.Compute", "Microsoft.Web")
    + f"/sites/web-1/{SUFFIX}",
    "a VM, no event": f"{PREFIX}/virtualMachines/web-1",
    "another host": f"https://evil.example/{PREFIX}/virtualMachines/web-1/{SUFFIX}",
    "event id not a GUID": f"{PREFIX}/virtualMachines/web-1/"
    "providers/Microsoft.Maintenance/scheduledEvents/x",
    "another EventId": f"{PREFIX}/virtualMachines/web-1/providers/Microsoft.Maintenance/"
    "scheduledEvents/00000000-0000-0000-0000-000000000000",
    "too long": f"{PREFIX}/virtualMachines/web-1/{SUFFIX}" + "/x" * 600,
}


@pytest.mark.parametrize("resource_id", HOSTILE_IDS.values(), ids=HOSTILE_IDS.keys())
def test_a_forged_or_malformed_resource_id_is_a_security_refusal(resource_id: str) -> None:
    with pytest.raises(InvalidNotification) as refused:
        parse(_with_id(resource_id))
    assert refused.value.security


@pytest.mark.parametrize(
    "resources", [["web 1"], ["web-1", "../arm"], ["x" * 65], ["web-1;rm"], [""]]
)
def test_hostile_resources_are_refused(resources: list[str]) -> None:
    with pytest.raises(InvalidNotification) as refused:
        parse(event_json(Resources=resources))
    assert refused.value.security


def test_a_topic_of_another_subscription_is_refused() -> None:
    body = event_json()
    body["topic"] = "/subscriptions/11111111-1111-4111-8111-111111111111"
    with pytest.raises(InvalidNotification) as refused:
        parse(body)
    assert refused.value.security


def _without(path: list[str]) -> dict[str, Any]:
    body = copy.deepcopy(event_json())
    node = body
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return body


@pytest.mark.parametrize(
    "body",
    [
        _without(["data"]),
        _without(["data", "resourceInfo", "properties"]),
        _without(["data", "resourceInfo", "properties", "EventStatus"]),
        _without(["data", "resourceInfo", "properties", "EventType"]),
        dict(event_json(), eventType="Microsoft.Storage.BlobCreated"),
        dict(event_json(), id=""),
        event_json("Frozen"),
        event_json(Resources="web-1"),
        event_json(Description="x" * 70_000),
    ],
    ids=[
        "no data",
        "no properties",
        "no status",
        "no type",
        "another event type",
        "no id",
        "unknown status",
        "resources not a list",
        "huge description",
    ],
)
def test_unreadable_notifications_say_why(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidNotification) as refused:
        parse(body)
    assert refused.value.reason


def test_a_type_left_out_by_an_older_binding_is_accepted() -> None:
    """azure-functions before CloudEvent support decodes a CloudEvent as an EventGridEvent with
    no eventType: the data decides."""
    body = event_json()
    raw = raw_from_json(body)
    n = parse_notification(RawNotification(raw.id, None, raw.time, None, None, raw.data))
    assert n.status == "Scheduled"


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_anything_else_is_refused_never_raised_otherwise(data: Any) -> None:
    """Whatever ``data`` holds that is not a notification is refused with a reason: an
    InvalidNotification (which the ingestion logs and drops), never another exception and
    never a notification read out of it."""
    raw = RawNotification("x", None, None, None, None, data)
    with pytest.raises(InvalidNotification) as refused:
        parse_notification(raw)
    assert refused.value.reason


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2017-06-26T18:41:00.9584103Z", datetime(2017, 6, 26, 18, 41, 0, 958410, tzinfo=UTC)),
        ("2024-04-16T22:17:12.1032748", datetime(2024, 4, 16, 22, 17, 12, 103274, tzinfo=UTC)),
        ("2024-04-16T23:17:12+01:00", datetime(2024, 4, 16, 22, 17, 12, tzinfo=UTC)),
        ("yesterday", None),
        ("", None),
        (17, None),
        # Hostile review 29: outside the bridge's readable range (sebridge.times), a recorded
        # time of 9999 made every later notification of the event stale (its Completed too).
        ("9999-12-31T23:59:59Z", None),
        ("0001-01-02T00:00:00Z", None),
        ("1969-12-31T23:59:59Z", None),
    ],
)
def test_event_grid_times(text: object, expected: datetime | None) -> None:
    assert parse_time(text) == expected
