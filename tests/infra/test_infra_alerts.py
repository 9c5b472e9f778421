"""The opt-in alert rules and the webhooks workflow's settings in Bicep agree with the code.

alerts.bicep reads what the Function App writes: its heartbeat query parses the invocation line
(functions/shared/invocations.py), so the prefix and the field names are checked against the
code that writes them. functionapp.bicep turns each webhook secret setting into a Key Vault
reference by building a JSON object as text; the text is evaluated here for sample names.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from infra_helpers import INFRA, app_settings, module, parse, property_path, unwrap

from functions.shared.invocations import INVOCATION_PREFIX, _Invocation, invocation_fields
from functions.webhooks.config import SETTING_NAME
from sebridge.contract.events import Transition

KEY_VAULT_SECRET_NAME = re.compile(r"[0-9a-zA-Z-]{1,127}")


def _alerts() -> dict[str, Any]:
    return module("alerts.bicep")


def _resource(name: str) -> dict[str, Any]:
    return unwrap(_alerts()["resources"][name])


def test_alerts_are_opt_in_and_wired_to_the_deployment() -> None:
    main = parse(INFRA / "main.bicep")
    assert main["parameters"]["alertsEnabled"]["default"] is False
    assert main["parameters"]["alertActionGroupIds"]["default"] == []
    alerts = main["modules"]["alerts"]
    assert alerts["config"]["condition"] == "alertsEnabled"
    params = unwrap(alerts)["params"]
    assert property_path(params["namespaceName"]) == ["serviceBus", "outputs", "namespaceName"]
    assert property_path(params["topicName"]) == ["serviceBus", "outputs", "topicName"]
    assert property_path(params["approvalsQueueName"]) == [
        "serviceBus",
        "outputs",
        "approvalsQueueName",
    ]
    assert property_path(params["appInsightsName"]) == ["monitoring", "outputs", "appInsightsName"]
    # The same staleness the gate's acknowledge fallback uses.
    assert params["heartbeatStaleSeconds"] == "heartbeatStaleSeconds"
    assert params["actionGroupIds"] == "alertActionGroupIds"


def test_dead_letter_alert_watches_the_topic_and_the_approvals_queue() -> None:
    tree = _alerts()
    resource = tree["resources"]["deadLetters"]
    assert (resource["type"], resource["api_version"]) == (
        "Microsoft.Insights/metricAlerts",
        "2018-03-01",
    )
    body = unwrap(resource)
    assert body["location"] == "global"
    props = body["properties"]
    assert property_path(props["scopes"][0]) == ["namespace", "id"]
    assert tree["resources"]["namespace"]["type"] == "Microsoft.ServiceBus/namespaces"
    assert props["autoMitigate"] is True
    criteria = props["criteria"]
    # pycep keeps the quotes of a quoted key
    odata = criteria["'odata.type'"]
    assert odata == "Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria"
    (criterion,) = criteria["allOf"]
    assert criterion["metricNamespace"] == "Microsoft.ServiceBus/namespaces"
    assert criterion["metricName"] == "DeadletteredMessages"
    # A gauge with Average/Minimum/Maximum only: anything there in the window fires.
    assert (criterion["timeAggregation"], criterion["operator"]) == ("Maximum", "GreaterThan")
    assert criterion["threshold"] == "deadLetterThreshold"
    assert tree["parameters"]["deadLetterThreshold"]["default"] == 0
    (dimension,) = criterion["dimensions"]
    assert dimension["name"] == "EntityName" and dimension["operator"] == "Include"
    assert dimension["values"] == ["topicName", "approvalsQueueName"]
    actions = props["actions"]
    assert actions["loop_type"]["detail"]["array_name"] == "actionGroupIds"


def _query() -> str:
    (criterion,) = _resource("heartbeatStopped")["properties"]["criteria"]["allOf"]
    return str(criterion["query"])


def test_heartbeat_alert_reads_the_invocation_lines_the_app_writes() -> None:
    tree = _alerts()
    assert tree["variables"]["invocationPrefix"]["value"] == INVOCATION_PREFIX
    query = _query()
    assert 'startswith "${invocationPrefix}"' in query
    assert 'substring(message, strlen("${invocationPrefix}"))' in query
    # The fields it reads are those the line carries, for the transition the gate receives.
    record = _Invocation("approval_gate", "heartbeat:web-1:20261122T012000Z", 1, 0.0)
    fields = invocation_fields(record, error=None, duration_seconds=0.0)
    for name in re.findall(r"line\.(\w+)", query):
        assert name in fields, name
    assert f'== "{Transition.HEARTBEAT.value}"' in query
    assert query.endswith("where lastHeartbeat < ago(${heartbeatStaleSeconds}s)")
    assert "summarize lastHeartbeat = max(timestamp) by vmName" in query


def test_heartbeat_alert_is_one_alert_per_vm_over_app_insights() -> None:
    resource = _alerts()["resources"]["heartbeatStopped"]
    assert (resource["type"], resource["api_version"]) == (
        "Microsoft.Insights/scheduledQueryRules",
        "2023-12-01",
    )
    body = unwrap(resource)
    props = body["properties"]
    assert body["kind"] == "LogAlert"
    assert property_path(props["scopes"][0]) == ["appInsights", "id"]
    assert _alerts()["resources"]["appInsights"]["type"] == "Microsoft.Insights/components"
    (criterion,) = props["criteria"]["allOf"]
    assert criterion["dimensions"] == [{"name": "vmName", "operator": "Include", "values": ["*"]}]
    assert (criterion["timeAggregation"], criterion["operator"], criterion["threshold"]) == (
        "Count",
        "GreaterThan",
        0,
    )
    # The look-back must outlast the staleness it looks for; Azure allows at most two days.
    assert props["overrideQueryTimeRange"] == "P2D"
    assert _alerts()["parameters"]["heartbeatStaleSeconds"]["decorators"][-1] == {
        "type": "min_value",
        "argument": 60,
    }
    assert props["actions"] == {"actionGroups": "actionGroupIds"}
    assert props["autoMitigate"] is True


# --- webhooks ---------------------------------------------------------------------------------


def test_webhooks_settings_are_set_from_parameters() -> None:
    settings = app_settings()
    assert settings["WebhooksSubscriptionName"] == "webhooksSubscriptionName"
    assert settings["WEBHOOKS"] == {
        "function": {"type": "string", "parameters": {"value_to_convert": "webhookEndpoints"}}
    }
    main = parse(INFRA / "main.bicep")
    params = unwrap(main["modules"]["functionApp"])["params"]
    assert params["webhookEndpoints"] == "webhookEndpoints"
    assert params["webhookSecretSettings"] == "webhookSecretSettings"
    assert main["parameters"]["webhookEndpoints"]["default"] == []
    assert main["parameters"]["webhookSecretSettings"]["default"] == []


def _evaluate_secret_settings(names: list[str], vault: str) -> dict[str, str]:
    """functionapp.bicep's webhookSecretAppSettings for ``names``, evaluated as ARM would."""
    variables = module("functionapp.bicep")["variables"]
    entries = variables["webhookSecretEntries"]["value"]
    assert entries["loop_type"]["detail"] == {
        "item_name": "setting",
        "array_name": "webhookSecretSettings",
    }
    template = entries["config"]
    texts = []
    for name in names:
        text = template.replace(
            "${toLower(replace(setting, '_', '-'))}", name.lower().replace("_", "-")
        )
        text = text.replace("${setting}", name).replace("${keyVaultUri}", vault)
        assert "${" not in text, text
        texts.append(text)
    outer = variables["webhookSecretAppSettings"]["value"]["function"]
    assert outer["type"] == "json"
    assert outer["parameters"]["arg_1"] == "{${join(webhookSecretEntries, ',')}}"
    parsed: dict[str, str] = json.loads("{" + ",".join(texts) + "}")
    return parsed


@pytest.mark.parametrize(
    "names",
    [[], ["WEBHOOK_OPS_SLACK_URL"], ["WEBHOOK_OPS_SLACK_URL", "WEBHOOK_ONCALL_ROUTING_KEY"]],
)
def test_each_webhook_secret_is_a_key_vault_reference(names: list[str]) -> None:
    vault = "https://kv-prod-abc.vault.azure.net/"
    settings = _evaluate_secret_settings(names, vault)
    assert list(settings) == names
    for name, value in settings.items():
        assert SETTING_NAME.fullmatch(name)
        secret = name.lower().replace("_", "-")
        assert KEY_VAULT_SECRET_NAME.fullmatch(secret)
        assert value == f"@Microsoft.KeyVault(SecretUri={vault}secrets/{secret})"


def test_webhook_secrets_cannot_replace_the_bridges_own_settings() -> None:
    props = unwrap(module("functionapp.bicep")["resources"]["appSettings"])["properties"]
    union = props["function"]
    assert union["type"] == "union"
    # union(): later objects win, so the bridge's settings come after the webhook secrets.
    assert list(union["parameters"].values()) == [
        "webhookSecretAppSettings",
        "requiredSettings",
        "teamsSettings",
        "optionalSettings",
    ]


def test_the_secret_names_to_set_are_an_output() -> None:
    output = parse(INFRA / "main.bicep")["outputs"]["keyVaultSecretNames"]["value"]["webhooks"]
    assert output["loop_type"]["detail"]["array_name"] == "webhookSecretSettings"
    assert output["config"]["function"]["type"] == "to_lower"
