"""The Held transition in contract v1: its `held` details in the data schema, the golden file,
and what lb-pools really publishes, all checked against the schema."""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any

import jsonschema
import pytest

from emulators.fakes.arm import FakeArm
from sebridge.contract.events import Transition, parse_message
from tests.fixtures import golden
from tests.functions.support import RG, SUB, App, envelope, web_vm

pytestmark = pytest.mark.timeout(30)

SCHEMA = json.loads(
    resources.files("sebridge.contract")
    .joinpath("schemas", "scheduled-event-data.v1.json")
    .read_text()
)
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def validate(data: dict[str, Any]) -> None:
    jsonschema.validate(data, SCHEMA, format_checker=FORMATS)


def test_the_schema_describes_held() -> None:
    held = SCHEMA["properties"]["held"]
    assert set(held["required"]) == {"pool", "healthy", "minimum", "vms"}
    assert held["additionalProperties"] is False


def test_the_golden_held_file_fits_the_schema_and_parses() -> None:
    on_disk = json.loads((golden.HERE / "held.json").read_text("utf-8"))
    validate(on_disk["body"]["data"])
    message = parse_message(json.dumps(on_disk["body"]).encode(), on_disk["message_id"])
    assert message.transition is Transition.HELD
    assert set(message.data["held"]) == {"pool", "healthy", "minimum", "vms"}
    assert (
        on_disk["subject"] == "Held" and on_disk["application_properties"]["transition"] == "Held"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"minimum": None},
        {"healthy": -1},
        {"minimum": 0},
        {"vms": []},
        {"pool": ""},
        {"extra": 1},
    ],
)
def test_the_schema_refuses_broken_held_details(change: dict[str, Any]) -> None:
    data = copy.deepcopy(golden.build()["held"].body["data"])
    data["held"].update(change)
    data["held"] = {k: v for k, v in data["held"].items() if v is not None}
    with pytest.raises(jsonschema.ValidationError):
        validate(data)


def test_what_lb_pools_publishes_fits_the_schema(app: App, arm_fake: FakeArm) -> None:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    web_vm(arm_fake, "web-1", [pool])
    web_vm(arm_fake, "web-2", [pool])
    app.deliver("lb_pools", envelope("Scheduled", Resources=["web-1", "web-2"]))
    (held,) = app.publisher.published
    assert held.subject == "Held"
    validate(held.body["data"])
    assert held.body["data"]["held"] == {
        "pool": pool,
        "healthy": 0,
        "minimum": 1,
        "vms": ["web-1", "web-2"],
    }
    assert held.application_properties["transition"] == "Held"
