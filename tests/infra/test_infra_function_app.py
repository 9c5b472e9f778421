"""The Function App in Bicep matches the code: bindings, entities, settings, Flex Consumption.

Bindings come from the real app (`function_app.py`, `app.get_functions()`) as soon as it
exists, otherwise from infra_helpers.EXPECTED_BINDINGS. Setting names come from
functions/settings.py once it exists.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import pytest
from infra_helpers import (
    INFRA,
    SETTINGS_MODULE,
    app_settings,
    emulator_namespace,
    function_app_bindings,
    module,
    parse,
    property_path,
    resources_of_type,
    teams_settings,
    unwrap,
)

SETTING_REF = re.compile(r"^%(\w+)%$")
SB = "Microsoft.ServiceBus/namespaces"
# Flex Consumption manages these itself and rejects them as app settings.
FLEX_RESERVED = {
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_EXTENSION_VERSION",
    "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_CONTENTSHARE",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "AzureWebJobsStorage",
}


# --- resolving a setting to the entity name the deployment gives it -----------------------


def _main_module_param(name: str) -> Any:
    return unwrap(parse(INFRA / "main.bicep")["modules"]["functionApp"])["params"][name]


def resolve_setting(setting: str) -> str:
    """The value main.bicep gives an entity-name setting, followed back to Config.json."""
    expression = app_settings()[setting]
    assert isinstance(expression, str), f"{setting} is not a plain parameter: {expression}"
    passed = _main_module_param(expression)
    main = parse(INFRA / "main.bicep")
    if isinstance(passed, str) and passed in main["variables"]:
        return main["variables"][passed]["value"]
    path = property_path(passed)
    assert path and path[:2] == ["serviceBus", "outputs"], f"{setting}: unexpected source {passed}"
    sb = module("servicebus.bicep")
    output = property_path(sb["outputs"][path[2]]["value"])
    assert output and output[1] == "name", output
    resource = unwrap(sb["resources"][output[0]])
    source = property_path(resource["name"])
    ns = emulator_namespace()
    if source == ["topicConfig", "Name"]:
        return ns["Topics"][0]["Name"]
    if source == ["queueConfig", "Name"]:
        return ns["Queues"][0]["Name"]
    if source == ["drainQueueConfig", "Name"]:
        return ns["Queues"][1]["Name"]
    raise AssertionError(f"{setting}: cannot follow {source}")


def _subscriptions() -> dict[str, dict[str, Any]]:
    return {s["Name"]: s for s in emulator_namespace()["Topics"][0]["Subscriptions"]}


def _service_bus_bindings() -> list[dict[str, Any]]:
    _, bindings = function_app_bindings()
    return [b for b in bindings if b["type"] in {"serviceBusTrigger", "serviceBus"}]


def _setting_of(value: str) -> str:
    match = SETTING_REF.match(value)
    assert match, f"binding names must come from settings (%Name%), got {value!r}"
    return match.group(1)


def test_bindings_source_is_reported() -> None:
    source, bindings = function_app_bindings()
    assert source in {"app", "fallback"}
    assert any(b["type"] == "serviceBusTrigger" for b in bindings), bindings


@pytest.mark.parametrize(
    "binding", _service_bus_bindings(), ids=lambda b: f"{b['function']}-{b['type']}"
)
def test_service_bus_binding_targets_a_deployed_entity(binding: dict[str, Any]) -> None:
    settings = app_settings()
    assert binding["connection"] == "ServiceBusConnection"
    assert "ServiceBusConnection__fullyQualifiedNamespace" in settings
    ns = emulator_namespace()
    if "queueName" in binding:
        queue = resolve_setting(_setting_of(binding["queueName"]))
        assert queue in {q["Name"] for q in ns["Queues"]}
        if binding["type"] == "serviceBusTrigger":
            q = next(q for q in ns["Queues"] if q["Name"] == queue)
            assert binding.get("isSessionsEnabled", False) == q["Properties"]["RequiresSession"]
        return
    topic = resolve_setting(_setting_of(binding["topicName"]))
    assert topic == ns["Topics"][0]["Name"]
    if binding["type"] == "serviceBusTrigger":
        setting = _setting_of(binding["subscriptionName"])
        if setting == "CustomSubscriptionName":
            # Deployment-chosen (main.bicep customSubscriptionName): checked by the roles test.
            assert app_settings()[setting] == "customSubscriptionName"
            return
        subscription = resolve_setting(setting)
        subs = _subscriptions()
        assert subscription in subs, f"{subscription} is not in Config.json/Bicep"
        # A session-enabled subscription needs a session receiver, and the other way round.
        assert (
            binding.get("isSessionsEnabled", False)
            == subs[subscription]["Properties"]["RequiresSession"]
        )


def test_app_receives_from_exactly_the_subscriptions_it_has_roles_on() -> None:
    triggered = {
        _setting_of(b["subscriptionName"])
        for b in _service_bus_bindings()
        if b["type"] == "serviceBusTrigger" and "subscriptionName" in b
    }
    main = parse(INFRA / "main.bicep")
    variables = main["variables"]
    assert variables["functionAppSubscriptionNames"]["value"]["function"] == {
        "type": "concat",
        "parameters": {
            "arg_1": "teamsSubscriptionNames",
            "arg_2": "builtInSubscriptionNames",
            "arg_3": "customSubscriptionNames",
        },
    }
    granted = {variables[n]["value"] for n in variables["builtInSubscriptionNames"]["value"]}
    # Teams: granted only while it is on, like the subscription itself (see the Teams test).
    teams = variables["teamsSubscriptionNames"]["value"]["operator"]["operands"]
    assert teams["condition"] == "teamsEnabled" and teams["false_value"] == []
    (teams_name,) = teams["true_value"]
    granted.add(variables[teams_name]["value"])
    built_in = {resolve_setting(s) for s in triggered - {"CustomSubscriptionName"}}
    assert built_in == granted, "Data Receiver scopes must equal the subscriptions the app binds"
    # Your own subscriber: granted only while enabled, on the subscription its setting names.
    custom = variables["customSubscriptionNames"]["value"]["operator"]["operands"]
    assert custom["true_value"] == ["customSubscriptionName"] and custom["false_value"] == []
    assert "customSubscriberEnabled" in str(custom["condition"])
    assert _main_module_param("customSubscriptionName") == "customSubscriptionName"
    assert app_settings()["CustomSubscriptionName"] == "customSubscriptionName"


def test_without_teams_no_teams_setting_secret_subscription_or_grant_is_deployed() -> None:
    # teamsEnabled = false (a Slack- or PagerDuty-only setup): the app then runs no teams
    # workflow, so nothing of Teams may be deployed: no setting naming a secret nobody sets, no
    # subscription filling up unread (its expired messages would fire the dead-letter alert).
    main = parse(INFRA / "main.bicep")
    assert main["parameters"]["teamsEnabled"]["default"] is True
    assert _main_module_param("teamsEnabled") == "teamsEnabled"
    assert set(teams_settings()) == {"TEAMS_WEBHOOK_URL", "TeamsSubscriptionName"}
    required = module("functionapp.bicep")["variables"]["requiredSettings"]["value"]
    assert not {"TEAMS_WEBHOOK_URL", "TeamsSubscriptionName"} & set(required)
    # The subscription: main.bicep tells servicebus.bicep to leave it out, and it does.
    sb_params = unwrap(main["modules"]["serviceBus"])["params"]
    omitted = sb_params["omittedSubscriptionNames"]["operator"]["operands"]
    assert omitted["condition"] == "teamsEnabled" and omitted["true_value"] == []
    assert omitted["false_value"] == ["teamsSubscriptionName"]
    subs = module("servicebus.bicep")["modules"]["subscriptions"]
    loop_item = subs["config"]["loop_type"]["detail"]["item_name"]
    deploy = str(unwrap(subs)["params"]["deploy"])
    assert "omittedSubscriptionNames" in deploy and loop_item in deploy and "not" in deploy
    subscription = module("servicebus-subscription.bicep")
    assert subscription["parameters"]["deploy"]["default"] is True
    (sub,) = resources_of_type(subscription, f"{SB}/topics/subscriptions").values()
    assert sub["config"]["condition"] == "deploy"
    (rules,) = resources_of_type(subscription, f"{SB}/topics/subscriptions/rules").values()
    rules_over = rules["config"]["loop_type"]["detail"]["array_name"]["operator"]["operands"]
    assert rules_over["condition"] == "deploy" and rules_over["false_value"] == []
    # The secret's name is given out only when someone must set it.
    secret = main["outputs"]["keyVaultSecretNames"]["value"]["teamsWebhookUrl"]
    assert secret["operator"]["operands"]["condition"] == "teamsEnabled"
    assert secret["operator"]["operands"]["false_value"] == ""


def test_entity_name_settings_match_the_deployed_entities() -> None:
    subs = _subscriptions()
    assert resolve_setting("TopicName") == "scheduled-events"
    assert resolve_setting("ApprovalsQueueName") == "approvals"
    for setting, name in {
        "TeamsSubscriptionName": "teams",
        "LbPoolsSubscriptionName": "lb-pools",
        "ApprovalGateSubscriptionName": "approval-gate",
        "WebhooksSubscriptionName": "webhooks",
    }.items():
        assert resolve_setting(setting) == name
        assert name in subs


# --- settings the code reads -----------------------------------------------------------------


def _constant_tuple(source: str, name: str) -> tuple[str, ...] | None:
    """A module-level `NAME = (...)` / `NAME: T = (...)` literal, read without importing."""
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return tuple(ast.literal_eval(node.value))
    return None


def _names_looked_up(source: str) -> set[str]:
    """String keys the module looks up: env["X"], env.get("X"), get("X"), required("X")."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in {"get", "getenv", "required"}:
                key = node.args[0].value
        # Setting names start with a capital; data keys (eventType) do not.
        if isinstance(key, str) and re.fullmatch(r"[A-Z][A-Za-z0-9_]*", key):
            names.add(key)
    return names


def test_the_settings_scanner_finds_names() -> None:
    sample = (
        "import os\nAPP_SETTING_NAMES: tuple[str, ...] = ('TopicName', 'ARM_ENDPOINT')\n"
        "def load(env):\n    return env['ARM_ENDPOINT'], os.environ.get('HEARTBEAT_STALE_SECONDS'),"
        " env.get('eventType'), required('TopicName')\n"
    )
    assert _constant_tuple(sample, "APP_SETTING_NAMES") == ("TopicName", "ARM_ENDPOINT")
    assert _names_looked_up(sample) == {"TopicName", "ARM_ENDPOINT", "HEARTBEAT_STALE_SECONDS"}


# The shared list from the issue, used only until functions/settings.py exists.
ISSUE_SETTING_NAMES = (
    "ServiceBusConnection__fullyQualifiedNamespace", "TopicName", "TeamsSubscriptionName",
    "LbPoolsSubscriptionName", "ApprovalGateSubscriptionName", "ApprovalsQueueName",
    "TEAMS_WEBHOOK_URL", "APPROVAL_SIGNING_KEY", "APPROVAL_BASE_URL", "APPROVAL_POLICY",
    "LB_IMPACTFUL_EVENT_TYPES", "LB_FREEZE_THRESHOLD_SECONDS", "LB_MANAGED_RESOURCE_GROUPS",
    "ARM_ENDPOINT", "ACKNOWLEDGE_FALLBACK_ENABLED", "HEARTBEAT_STALE_SECONDS",
    "CUSTOM_SUBSCRIBER_ENABLED",
)  # fmt: skip


def _settings_the_app_needs() -> tuple[set[str], set[str]]:
    """(names the Bicep must set, names the platform or local runs provide)."""
    if not SETTINGS_MODULE.exists():
        return set(ISSUE_SETTING_NAMES), set()
    source = SETTINGS_MODULE.read_text()
    declared = _constant_tuple(source, "APP_SETTING_NAMES")
    assert declared, "functions/settings.py should declare APP_SETTING_NAMES"
    exempt = set(_constant_tuple(source, "LOCAL_OR_PLATFORM_SETTING_NAMES") or ())
    # The declared list must cover what the module really reads.
    undeclared = _names_looked_up(source) - set(declared) - exempt
    assert not undeclared, f"functions/settings.py reads names it does not declare: {undeclared}"
    return set(declared), exempt


def test_every_setting_the_functions_read_is_set_by_bicep() -> None:
    settings = set(app_settings())
    needed, exempt = _settings_the_app_needs()
    needed |= {
        _setting_of(v)
        for b in function_app_bindings()[1]
        for v in b.values()
        if isinstance(v, str) and SETTING_REF.match(v)
    }
    missing = needed - exempt - settings
    assert not missing, f"read by the functions but not set in functionapp.bicep: {sorted(missing)}"
    assert "ServiceBusConnection" not in settings, "no connection strings in Azure"


def test_secrets_are_key_vault_references() -> None:
    settings = app_settings()
    for name, secret_param in {
        "TEAMS_WEBHOOK_URL": "teamsWebhookSecretName",
        "APPROVAL_SIGNING_KEY": "approvalSigningKeySecretName",
    }.items():
        value = settings[name]
        assert isinstance(value, str)
        assert value.startswith("@Microsoft.KeyVault(SecretUri=${keyVaultUri}secrets/"), value
        assert value.endswith(f"${{{secret_param}}})"), value


def test_host_and_telemetry_use_the_identity() -> None:
    settings = app_settings()
    assert settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"] == "Authorization=AAD"
    assert settings["AzureWebJobsStorage__accountName"] == "storageAccountName"
    assert not FLEX_RESERVED & set(settings)
    assert not any(
        "connectionstring" in n.lower() and "APPLICATIONINSIGHTS" not in n for n in settings
    )


def test_defaults_match_the_shared_settings_list() -> None:
    params = module("functionapp.bicep")["parameters"]
    assert params["lbImpactfulEventTypes"]["default"] == "Reboot,Redeploy,Preempt,Terminate"
    assert params["lbFreezeThresholdSeconds"]["default"] == 9
    assert params["heartbeatStaleSeconds"]["default"] == 900
    assert params["acknowledgeFallbackEnabled"]["default"] is False
    assert params["customSubscriberEnabled"]["default"] is False
    assert params["approvalPolicy"]["default"] == ""
    settings = app_settings()
    assert "https://" in str(settings["APPROVAL_BASE_URL"])
    assert "defaultHostName" in str(settings["APPROVAL_BASE_URL"])
    assert "resourceManager" in str(module("functionapp.bicep")["variables"]["armEndpoint"])


def test_function_app_is_flex_consumption_python_311_with_identity_deployment() -> None:
    tree = module("functionapp.bicep")
    plan = unwrap(next(iter(resources_of_type(tree, "Microsoft.Web/serverfarms").values())))
    assert plan["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    site = unwrap(next(iter(resources_of_type(tree, "Microsoft.Web/sites").values())))
    assert site["identity"]["type"] == "SystemAssigned"
    props = site["properties"]
    assert props["httpsOnly"] is True
    assert props["siteConfig"]["minTlsVersion"] == "1.2"
    config = props["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": "3.11"}
    storage = config["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["authentication"] == {"type": "SystemAssignedIdentity"}
    policies = resources_of_type(tree, "Microsoft.Web/sites/basicPublishingCredentialsPolicies")
    assert {unwrap(p)["name"]: unwrap(p)["properties"]["allow"] for p in policies.values()} == {
        "ftp": False,
        "scm": False,
    }


def test_the_worker_threads_are_what_the_burst_benchmark_measured() -> None:
    """The burst figures in the README were measured with the worker's thread count the app is
    deployed with (benchmarks/burst.py --worker-threads defaults to it)."""
    import ast

    settings = app_settings()
    tree = ast.parse((INFRA.parent / "benchmarks" / "burst.py").read_text())
    default = next(
        kw.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "--worker-threads"
        for kw in node.keywords
        if kw.arg == "default" and isinstance(kw.value, ast.Constant)
    )
    assert settings["PYTHON_THREADPOOL_THREAD_COUNT"] == str(default) == "64"
    # As many threads as sessions the extension takes at once: no received message waits for one.
    host = json.loads((INFRA.parent / "host.json").read_text())
    sessions = host["extensions"]["serviceBus"]["maxConcurrentSessions"]
    assert settings["PYTHON_THREADPOOL_THREAD_COUNT"] == str(sessions)


def test_the_history_table_is_the_one_the_app_defaults_to() -> None:
    from functions.shared.settings import (
        DEFAULT_CALENDAR_WINDOW_DAYS,
        DEFAULT_HISTORY_RETENTION_DAYS,
        HISTORY_TABLE,
    )

    storage = module("storage.bicep")
    assert storage["parameters"]["historyTableName"]["default"] == HISTORY_TABLE
    tables = resources_of_type(storage, "Microsoft.Storage/storageAccounts/tableServices/tables")
    assert [unwrap(t)["name"] for t in tables.values()] == ["historyTableName"]
    params = module("functionapp.bicep")["parameters"]
    assert params["historyRetentionDays"]["default"] == DEFAULT_HISTORY_RETENTION_DAYS
    assert params["calendarWindowDays"]["default"] == DEFAULT_CALENDAR_WINDOW_DAYS
    assert "HISTORY_TABLE_URL" not in app_settings()  # defaults to the host storage account
