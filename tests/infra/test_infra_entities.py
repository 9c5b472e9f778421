"""The Service Bus entities in Bicep are the emulator's Config.json, property for property.

servicebus.bicep loads infra/servicebus-emulator/Config.json with loadJsonContent and maps each
emulator property to its ARM name. These tests prove the load points at that file, that every
property present in Config.json is mapped to the right ARM property (a new one fails here until
the Bicep maps it), and that nothing else is set on the entities, so the two cannot differ.

Your own subscriber adds its subscription to Config.json (README, "Subscribe your own
function"): the checks below take any Config.json, and one test runs them on a copy with the
README's example added, as a user following the procedure would.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
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

from tests.support import docs

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

# The subscriptions the bridge itself relies on, each with its one filter: the functions bind to
# all but the last, and audit takes everything. Others are allowed (your own subscriber).
BUILT_IN_SUBSCRIPTIONS = {
    "teams": "transition NOT IN ('Heartbeat', 'Measured')",
    "lb-pools": "transition IN ('Scheduled', 'Updated', 'Started', 'Completed', 'Cancelled')",
    "approval-gate": "transition IN ('Scheduled', 'Updated', 'Prepared', 'Heartbeat')",
    "webhooks": "transition NOT IN ('Heartbeat', 'Measured')",
    "history": "transition <> 'Heartbeat'",
    "audit": "1=1",
}
# Service Bus subscription names: 1-50 letters, digits, periods, hyphens and underscores,
# starting and ending with a letter or digit.
SUBSCRIPTION_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,48}[A-Za-z0-9])?")

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


def check_subscription(sub: dict[str, Any]) -> None:
    """One subscription as servicebus-subscription.bicep can deploy it and the bridge can use it."""
    name = sub.get("Name", "")
    assert SUBSCRIPTION_NAME.fullmatch(name), f"{name!r} is not a Service Bus subscription name"
    props = sub["Properties"]
    # The Bicep reads every mapped property: a missing one fails the deployment, an unmapped
    # one would be silently left out of Azure.
    assert set(props) == set(SUBSCRIPTION_PROPERTIES), (
        f"{name}: properties must be exactly {sorted(SUBSCRIPTION_PROPERTIES)}, "
        f"missing {sorted(set(SUBSCRIPTION_PROPERTIES) - set(props))}, "
        f"unmapped {sorted(set(props) - set(SUBSCRIPTION_PROPERTIES))}"
    )
    # The bridge relies on sessions (per-event order) everywhere; triggers receive by session.
    assert props["RequiresSession"] is True, f"{name}: RequiresSession must be true"
    assert sub.get("Rules"), f"{name} has no rule: ARM would leave its 1=1 $Default"
    for rule in sub["Rules"]:
        where = f"{name}, rule {rule['Name']}"
        # Only SQL filters are mapped (servicebus-subscription.bicep).
        assert rule["Properties"].get("FilterType") == "Sql", f"{where}: FilterType must be Sql"
        assert set(rule["Properties"]) == {"FilterType", "SqlFilter"}, f"{where}: {rule}"
        assert rule["Properties"]["SqlFilter"]["SqlExpression"].strip(), f"{where}: empty filter"


def check_entities(ns: dict[str, Any]) -> None:
    """What servicebus.bicep deploys and the functions bind to, for any Config.json namespace."""
    # servicebus.bicep deploys Topics[0], Queues[0] and Queues[1]: more would be left out.
    assert len(ns["Topics"]) == 1, "servicebus.bicep deploys only the first topic"
    assert len(ns["Queues"]) == 2, "servicebus.bicep deploys only the first two queues"
    assert ns["Topics"][0]["Name"] == "scheduled-events"
    assert ns["Queues"][0]["Name"] == "approvals"
    # lb-pools' drain moments: scheduled to itself, no sessions; no duplicate detection (a
    # moment moved away and back is scheduled again with the same id); kept past 7 days.
    drains = ns["Queues"][1]
    assert drains["Name"] == "drain-moments"
    assert drains["Properties"]["RequiresSession"] is False
    assert drains["Properties"]["RequiresDuplicateDetection"] is False
    assert drains["Properties"]["DefaultMessageTimeToLive"] == "P14D"
    subscriptions = ns["Topics"][0]["Subscriptions"]
    names = [s["Name"].lower() for s in subscriptions]
    assert len(names) == len(set(names)), f"subscription names used twice: {names}"
    by_name = {s["Name"]: s for s in subscriptions}
    for name, expression in BUILT_IN_SUBSCRIPTIONS.items():
        assert name in by_name, f"built-in subscription {name} is missing"
        filters = [r["Properties"]["SqlFilter"]["SqlExpression"] for r in by_name[name]["Rules"]]
        assert filters == [expression], f"{name}: its filter changed: {filters}"
    for sub in subscriptions:
        check_subscription(sub)


def check_custom_subscription(bicepparam: str, ns: dict[str, Any]) -> None:
    """With customSubscriberEnabled, customSubscriptionName names its own Config.json entry.

    Only literal values can be checked here; an expression (readEnvironmentVariable(...)) is
    left to the deployment, which fails on a subscription that does not exist.
    """
    params = dict(re.findall(r"^param (\w+) = (.+?)\s*$", bicepparam, re.M))
    if params.get("customSubscriberEnabled") != "true":
        return  # off (the default) or not a literal
    value = params.get("customSubscriptionName")
    assert value, "customSubscriberEnabled = true needs customSubscriptionName"
    literal = re.fullmatch(r"'([^']*)'", value)
    if literal is None:
        return
    name = literal.group(1)
    assert name, "customSubscriberEnabled = true needs customSubscriptionName"
    assert name not in BUILT_IN_SUBSCRIPTIONS, (
        f"{name} belongs to the bridge: your subscriber needs a subscription of its own"
    )
    subscriptions = {s["Name"] for s in ns["Topics"][0]["Subscriptions"]}
    assert name in subscriptions, (
        f"customSubscriptionName {name!r} is not in Config.json: add it there first"
    )


def test_emulator_config_has_what_the_bicep_reads() -> None:
    check_entities(emulator_namespace())


@pytest.mark.parametrize(
    "path", sorted(INFRA.rglob("*.bicepparam")), ids=lambda p: p.relative_to(INFRA).as_posix()
)
def test_custom_subscription_parameter_names_a_config_entry(path: Path) -> None:
    check_custom_subscription(path.read_text(), emulator_namespace())


@pytest.mark.parametrize(
    ("kind", "mapping"),
    [("queue", QUEUE_PROPERTIES), ("drain-queue", QUEUE_PROPERTIES), ("topic", TOPIC_PROPERTIES)],
)
def test_every_emulator_property_is_mapped(kind: str, mapping: dict[str, str]) -> None:
    ns = emulator_namespace()
    entity = {"queue": ns["Queues"][0], "drain-queue": ns["Queues"][1]}.get(kind, ns["Topics"][0])
    tree = module("servicebus.bicep")
    arm_type = f"{SB}/topics" if kind == "topic" else f"{SB}/queues"
    config = {"queue": "queueConfig", "drain-queue": "drainQueueConfig"}.get(kind, "topicConfig")
    (resource,) = [
        unwrap(r)
        for r in resources_of_type(tree, arm_type).values()
        if property_path(unwrap(r)["name"]) == [config, "Name"]
    ]
    source = [config]
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
    """The module maps each known property, and nothing else (check_subscription holds
    Config.json to exactly these)."""
    tree = module("servicebus-subscription.bicep")
    sub = unwrap(_only(resources_of_type(tree, f"{SB}/topics/subscriptions")))
    assert property_path(sub["name"]) == ["subscription", "Name"]
    props = sub["properties"]
    for key, arm in SUBSCRIPTION_PROPERTIES.items():
        assert arm in props and _maps_from(props[arm], ["subscription"], key), (key, arm)
    assert set(props) == set(SUBSCRIPTION_PROPERTIES.values())


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
    # `deploy ? subscription.Rules : []`: nothing for a subscription the deployment leaves out.
    rules_over = rule_loop["array_name"]["operator"]["operands"]
    assert rules_over["condition"] == "deploy" and rules_over["false_value"] == []
    assert property_path(rules_over["true_value"]) == ["subscription", "Rules"]
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


# --- the README's procedure for your own subscriber ------------------------------------------


def _readme_procedure() -> tuple[dict[str, Any], str]:
    """(the Config.json entry, the customSubscriptionName) README tells a user to add."""
    section = docs.section(docs.page("extending"), "## Subscribe your own function")
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block, "the subscriber procedure shows no Config.json entry"
    name = re.search(r"customSubscriptionName = '([^']+)'", section)
    assert name, "the subscriber procedure does not say what customSubscriptionName to deploy"
    return json.loads(block.group(1)), name.group(1)


def _config_with(tmp_path: Path, entry: dict[str, Any]) -> Path:
    config = json.loads(EMULATOR_CONFIG.read_text())
    config["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"].append(entry)
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _bicepparam_enabling(name: str) -> str:
    text = (INFRA / "main.bicepparam").read_text()
    assert "\nparam customSubscriberEnabled = false\n" in text
    return text.replace(
        "\nparam customSubscriberEnabled = false\n",
        f"\nparam customSubscriberEnabled = true\nparam customSubscriptionName = '{name}'\n",
    )


def test_following_the_subscriber_procedure_passes_the_checks(tmp_path: Path) -> None:
    entry, name = _readme_procedure()
    assert entry["Name"] == name
    path = _config_with(tmp_path, entry)
    ns = emulator_namespace(path)
    check_entities(ns)
    check_custom_subscription(_bicepparam_enabling(name), ns)
    # The local side agrees: the emulator loads the same file, filter compiled.
    from emulators.servicebus.config import load_config

    (topic,) = load_config(path).topics
    assert name in {s.name for s in topic.subscriptions}
    # Skipping the Config.json step is caught before a deployment fails on it.
    with pytest.raises(AssertionError, match=r"not in Config\.json"):
        check_custom_subscription(_bicepparam_enabling(name), emulator_namespace())


def _break_sessions(entry: dict[str, Any]) -> None:
    entry["Properties"]["RequiresSession"] = False


def _drop_rules(entry: dict[str, Any]) -> None:
    entry["Rules"] = []


def _drop_property(entry: dict[str, Any]) -> None:
    del entry["Properties"]["ForwardTo"]


def _correlation_filter(entry: dict[str, Any]) -> None:
    entry["Rules"][0]["Properties"] = {"FilterType": "Correlation", "CorrelationFilter": {}}


def _reuse_a_name(entry: dict[str, Any]) -> None:
    entry["Name"] = "Audit"


def _invalid_name(entry: dict[str, Any]) -> None:
    entry["Name"] = "vm loss"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_break_sessions, "RequiresSession must be true"),
        (_drop_rules, "has no rule"),
        (_drop_property, "missing \\['ForwardTo'\\]"),
        (_correlation_filter, "FilterType must be Sql"),
        (_reuse_a_name, "used twice"),
        (_invalid_name, "not a Service Bus subscription name"),
    ],
    ids=[
        "no-sessions",
        "no-rule",
        "missing-property",
        "correlation-filter",
        "name-used-twice",
        "invalid-name",
    ],
)
def test_a_subscription_the_bridge_cannot_use_is_refused(
    tmp_path: Path, mutate: Any, message: str
) -> None:
    entry, _ = _readme_procedure()
    mutate(entry)
    with pytest.raises(AssertionError, match=message):
        check_entities(emulator_namespace(_config_with(tmp_path, entry)))


@pytest.mark.parametrize("name", sorted(BUILT_IN_SUBSCRIPTIONS))
def test_the_built_in_subscriptions_keep_their_filters(name: str) -> None:
    ns = copy.deepcopy(emulator_namespace())
    subscriptions = ns["Topics"][0]["Subscriptions"]
    (sub,) = [s for s in subscriptions if s["Name"] == name]
    sub["Rules"][0]["Properties"]["SqlFilter"]["SqlExpression"] = "1=0"
    with pytest.raises(AssertionError, match="filter changed"):
        check_entities(ns)
    subscriptions.remove(sub)
    with pytest.raises(AssertionError, match="is missing"):
        check_entities(ns)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("param customSubscriberEnabled = true\n", "needs customSubscriptionName"),
        (
            "param customSubscriberEnabled = true\nparam customSubscriptionName = ''\n",
            "needs customSubscriptionName",
        ),
        (
            "param customSubscriberEnabled = true\nparam customSubscriptionName = 'teams'\n",
            "belongs to the bridge",
        ),
        (
            "param customSubscriberEnabled = true\nparam customSubscriptionName = 'nope'\n",
            "not in Config.json",
        ),
    ],
    ids=["no-name", "empty-name", "built-in", "not-in-config"],
)
def test_custom_subscription_check_catches_mistakes(params: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_custom_subscription(params, emulator_namespace())


def test_custom_subscription_check_leaves_what_it_cannot_read() -> None:
    ns = emulator_namespace()
    check_custom_subscription("param customSubscriberEnabled = false\n", ns)
    check_custom_subscription("using './main.bicep'\n", ns)
    check_custom_subscription(
        "param customSubscriberEnabled = true\n"
        "param customSubscriptionName = readEnvironmentVariable('SUB')\n",
        ns,
    )
