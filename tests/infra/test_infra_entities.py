"""The Service Bus entities in Bicep are the emulator's Config.json, property for property.

servicebus.bicep loads infra/servicebus-emulator/Config.json with loadJsonContent and maps each
emulator property to its ARM name. These tests prove the load points at that file, that every
property present in Config.json is mapped to the right ARM property (a new one fails here until
the Bicep maps it), and that nothing else is set on the entities, so the two cannot differ.
"""

from __future__ import annotations

from typing import Any

import pytest
from infra_helpers import (
    EMULATOR_CONFIG,
    INFRA,
    emulator_namespace,
    module,
    parse,
    property_path,
    referenced_paths,
    resources_of_type,
    unwrap,
)

# Emulator property -> ARM property, per entity kind.
QUEUE_PROPERTIES = {
    "DeadLetteringOnMessageExpiration": "deadLetteringOnMessageExpiration",
    "DefaultMessageTimeToLive": "defaultMessageTimeToLive",
    "DuplicateDetectionHistoryTimeWindow": "duplicateDetectionHistoryTimeWindow",
    "ForwardDeadLetteredMessagesTo": "forwardDeadLetteredMessagesTo",
    "ForwardTo": "forwardTo",
    "LockDuration": "lockDuration",
    "MaxDeliveryCount": "maxDeliveryCount",
    "RequiresDuplicateDetection": "requiresDuplicateDetection",
    "RequiresSession": "requiresSession",
}
TOPIC_PROPERTIES = {
    "DefaultMessageTimeToLive": "defaultMessageTimeToLive",
    "DuplicateDetectionHistoryTimeWindow": "duplicateDetectionHistoryTimeWindow",
    "RequiresDuplicateDetection": "requiresDuplicateDetection",
}
SUBSCRIPTION_PROPERTIES = {
    "DeadLetteringOnMessageExpiration": "deadLetteringOnMessageExpiration",
    "DefaultMessageTimeToLive": "defaultMessageTimeToLive",
    "LockDuration": "lockDuration",
    "MaxDeliveryCount": "maxDeliveryCount",
    "ForwardDeadLetteredMessagesTo": "forwardDeadLetteredMessagesTo",
    "ForwardTo": "forwardTo",
    "RequiresSession": "requiresSession",
}
# The topic's window is a parameter (issue: "window a parameter, default P1D"); its default
# must be the emulator's value.
TOPIC_WINDOW_PARAM = "topicDuplicateDetectionWindow"

SB = "Microsoft.ServiceBus/namespaces"


def _only(resources: dict[str, Any]) -> dict[str, Any]:
    assert len(resources) == 1, list(resources)
    return next(iter(resources.values()))


def _maps_from(expression: Any, source: list[str], key: str) -> bool:
    """Does the expression read `<source>.Properties.<key>` (possibly inside empty()/?:)?"""
    return [*source, "Properties", key] in referenced_paths({"x": expression}) or (
        property_path(expression) == [*source, "Properties", key]
    )


def test_servicebus_module_loads_the_emulator_config() -> None:
    tree = module("servicebus.bicep")
    load = tree["variables"]["entities"]["value"]["function"]
    assert load["type"] == "load_json_content"
    params = list(load["parameters"].values())
    assert (INFRA / "modules" / params[0]).resolve() == EMULATOR_CONFIG.resolve()
    assert params[1] == "$.UserConfig.Namespaces[0]"
    assert property_path(tree["variables"]["topicConfig"]["value"]) is None  # Topics[0]
    assert "Topics" in str(tree["variables"]["topicConfig"]["value"])
    assert "Queues" in str(tree["variables"]["queueConfig"]["value"])


def test_emulator_config_has_what_the_bicep_reads() -> None:
    ns = emulator_namespace()
    # servicebus.bicep deploys Topics[0] and Queues[0]: more would be silently left out.
    assert len(ns["Topics"]) == 1, "servicebus.bicep deploys only the first topic"
    assert len(ns["Queues"]) == 1, "servicebus.bicep deploys only the first queue"
    assert {s["Name"] for s in ns["Topics"][0]["Subscriptions"]} == {
        "teams",
        "lb-pools",
        "approval-gate",
        "audit",
    }
    assert ns["Topics"][0]["Name"] == "scheduled-events"
    assert ns["Queues"][0]["Name"] == "approvals"


@pytest.mark.parametrize(
    ("kind", "mapping"),
    [("queue", QUEUE_PROPERTIES), ("topic", TOPIC_PROPERTIES)],
)
def test_every_emulator_property_is_mapped(kind: str, mapping: dict[str, str]) -> None:
    ns = emulator_namespace()
    entity = ns["Queues"][0] if kind == "queue" else ns["Topics"][0]
    tree = module("servicebus.bicep")
    arm_type = f"{SB}/queues" if kind == "queue" else f"{SB}/topics"
    resource = unwrap(_only(resources_of_type(tree, arm_type)))
    source = ["queueConfig"] if kind == "queue" else ["topicConfig"]
    assert property_path(resource["name"]) == [*source, "Name"]
    props = resource["properties"]
    unmapped = set(entity["Properties"]) - set(mapping)
    assert not unmapped, f"Config.json {kind} properties the Bicep does not map: {unmapped}"
    for key in entity["Properties"]:
        arm = mapping[key]
        assert arm in props, f"{kind}: {key} -> {arm} not set"
        if kind == "topic" and key == "DuplicateDetectionHistoryTimeWindow":
            assert props[arm] == TOPIC_WINDOW_PARAM
            default = tree["parameters"][TOPIC_WINDOW_PARAM]["default"]
            assert default == entity["Properties"][key]
            assert (
                parse(INFRA / "main.bicep")["parameters"][TOPIC_WINDOW_PARAM]["default"] == default
            )
        else:
            assert _maps_from(props[arm], source, key), f"{kind}.{arm} does not read {key}"
    # Nothing set that Config.json does not define.
    assert set(props) <= {mapping[k] for k in entity["Properties"]}


def test_every_subscription_property_is_mapped() -> None:
    ns = emulator_namespace()
    tree = module("servicebus-subscription.bicep")
    sub = unwrap(_only(resources_of_type(tree, f"{SB}/topics/subscriptions")))
    assert property_path(sub["name"]) == ["subscription", "Name"]
    props = sub["properties"]
    for entity in ns["Topics"][0]["Subscriptions"]:
        unmapped = set(entity["Properties"]) - set(SUBSCRIPTION_PROPERTIES)
        assert not unmapped, f"{entity['Name']}: properties the Bicep does not map: {unmapped}"
        for key in entity["Properties"]:
            arm = SUBSCRIPTION_PROPERTIES[key]
            assert arm in props and _maps_from(props[arm], ["subscription"], key), (key, arm)
        assert set(props) <= {SUBSCRIPTION_PROPERTIES[k] for k in entity["Properties"]}
        # The bridge relies on sessions (per-event order) everywhere.
        assert entity["Properties"]["RequiresSession"] is True, entity["Name"]


def test_each_subscription_is_deployed_from_config_with_its_rules() -> None:
    sb = module("servicebus.bicep")
    subs = sb["modules"]["subscriptions"]
    loop = subs["config"]["loop_type"]["detail"]
    assert property_path(loop["array_name"]) == ["topicConfig", "Subscriptions"]
    assert unwrap(subs)["params"]["subscription"] == loop["item_name"]

    tree = module("servicebus-subscription.bicep")
    rules = resources_of_type(tree, f"{SB}/topics/subscriptions/rules")
    rule = _only(rules)
    rule_loop = rule["config"]["loop_type"]["detail"]
    assert property_path(rule_loop["array_name"]) == ["subscription", "Rules"]
    body = unwrap(rule)
    item = rule_loop["item_name"]
    assert property_path(body["name"]) == [item, "Name"]
    assert body["properties"]["filterType"] == "SqlFilter"
    assert property_path(body["properties"]["sqlFilter"]["sqlExpression"]) == [
        item,
        "Properties",
        "SqlFilter",
        "SqlExpression",
    ]
    assert set(body["properties"]) == {"filterType", "sqlFilter"}


def test_config_rules_are_sql_filters_the_bicep_can_express() -> None:
    for sub in emulator_namespace()["Topics"][0]["Subscriptions"]:
        assert sub["Rules"], f"{sub['Name']} has no rule: ARM would leave its 1=1 $Default"
        for rule in sub["Rules"]:
            assert rule["Properties"]["FilterType"] == "Sql", (sub["Name"], rule["Name"])
            assert set(rule["Properties"]) == {"FilterType", "SqlFilter"}, rule
            assert rule["Properties"]["SqlFilter"]["SqlExpression"].strip()


def test_no_entity_name_or_filter_is_written_twice() -> None:
    """The Bicep must not restate entity settings that live in Config.json."""
    ns = emulator_namespace()
    for path in (INFRA / "modules").glob("servicebus*.bicep"):
        # Code only: comments may explain the filters.
        text = "\n".join(line.split("//")[0] for line in path.read_text().splitlines())
        for sub in ns["Topics"][0]["Subscriptions"]:
            for rule in sub["Rules"]:
                assert rule["Properties"]["SqlFilter"]["SqlExpression"] not in text, path.name
        assert "'scheduled-events'" not in text and "'approvals'" not in text, path.name


def test_namespace_is_entra_only_with_tls_12() -> None:
    ns = unwrap(_only(resources_of_type(module("servicebus.bicep"), SB)))
    assert ns["properties"]["disableLocalAuth"] is True
    assert ns["properties"]["minimumTlsVersion"] == "1.2"
    decorators = module("servicebus.bicep")["parameters"]["skuName"]["decorators"]
    allowed = next(d for d in decorators if d["type"] == "allowed")["argument"]
    assert set(allowed) == {"Standard", "Premium"}
    assert module("servicebus.bicep")["parameters"]["skuName"]["default"] == "Standard"
