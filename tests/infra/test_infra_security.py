"""Secure by default: local auth off, no secret in infra/, least-privilege role assignments."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from infra_helpers import (
    INFRA,
    bicep_files,
    module,
    parse,
    property_path,
    resources_of_type,
    role_assignments,
    unwrap,
)

# Built-in role definition GUIDs, from Microsoft's "Azure built-in roles" reference.
SERVICE_BUS_DATA_RECEIVER = "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"
SERVICE_BUS_DATA_SENDER = "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"
KEY_VAULT_SECRETS_USER = "4633458b-17de-408a-b874-0445c86b69e6"
KEY_VAULT_SECRETS_OFFICER = "b86a8fe4-44ce-4948-aee5-eccb2c155cd7"
STORAGE_BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
MONITORING_METRICS_PUBLISHER = "3913510d-42f4-4e42-8a64-420c390055eb"
NETWORK_CONTRIBUTOR = "4d97b98b-1d4f-4787-a291-c67834d212e7"
SCHEDULED_EVENTS_CONTRIBUTOR = "b67fe603-310e-4889-b9ee-8257d09d353d"
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
STORAGE_TABLE_DATA_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
SCALE_SET_INSTANCE_READER = "custom:scaleSetInstanceReader"  # defined in managed-group-roles
ROLE_NAMES = {
    SCALE_SET_INSTANCE_READER: "Scale-set instance reader (custom)",
    SERVICE_BUS_DATA_RECEIVER: "Azure Service Bus Data Receiver",
    SERVICE_BUS_DATA_SENDER: "Azure Service Bus Data Sender",
    KEY_VAULT_SECRETS_USER: "Key Vault Secrets User",
    KEY_VAULT_SECRETS_OFFICER: "Key Vault Secrets Officer",
    STORAGE_BLOB_DATA_OWNER: "Storage Blob Data Owner",
    MONITORING_METRICS_PUBLISHER: "Monitoring Metrics Publisher",
    NETWORK_CONTRIBUTOR: "Network Contributor",
    SCHEDULED_EVENTS_CONTRIBUTOR: "Scheduled Events Contributor",
    STORAGE_BLOB_DATA_CONTRIBUTOR: "Storage Blob Data Contributor",
    STORAGE_TABLE_DATA_CONTRIBUTOR: "Storage Table Data Contributor",
}
# Broad roles nobody here may get.
FORBIDDEN_ROLES = {
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "090c5cfd-751d-490a-894a-3ce6f1109419": "Azure Service Bus Data Owner",
    "00482a5a-887f-4fb3-b363-3b7fe8e74483": "Key Vault Administrator",
}

SB = "Microsoft.ServiceBus/namespaces"
# (principal parameter, scope resource type) -> the least-privileged role for what the code does.
EXPECTED_ROLES = {
    # Function App: triggers on its own subscriptions, Prepared to the topic, commands to approvals.
    ("functionAppPrincipalId", f"{SB}/topics/subscriptions"): SERVICE_BUS_DATA_RECEIVER,
    ("functionAppPrincipalId", f"{SB}/topics"): SERVICE_BUS_DATA_SENDER,
    # ... and on the drain-moments queue: schedules its drain moments and receives them.
    ("functionAppPrincipalId", f"{SB}/queues"): [
        SERVICE_BUS_DATA_SENDER,
        SERVICE_BUS_DATA_SENDER,
        SERVICE_BUS_DATA_RECEIVER,
    ],
    ("functionAppPrincipalId", "Microsoft.Storage/storageAccounts"): STORAGE_BLOB_DATA_OWNER,
    # The history's entities, on its one table.
    (
        "functionAppPrincipalId",
        "Microsoft.Storage/storageAccounts/tableServices/tables",
    ): STORAGE_TABLE_DATA_CONTRIBUTOR,
    ("functionAppPrincipalId", "Microsoft.KeyVault/vaults"): KEY_VAULT_SECRETS_USER,
    ("functionAppPrincipalId", "Microsoft.Insights/components"): MONITORING_METRICS_PUBLISHER,
    # Managed resource groups only: NIC pool membership; reading VMs and acknowledging events.
    ("functionAppPrincipalId", "resourceGroup"): [
        NETWORK_CONTRIBUTOR,
        SCHEDULED_EVENTS_CONTRIBUTOR,
        SCALE_SET_INSTANCE_READER,
    ],
    # Forwarders: publish to the topic, receive approve commands.
    ("forwarderPrincipalId", f"{SB}/topics"): SERVICE_BUS_DATA_SENDER,
    ("forwarderPrincipalId", f"{SB}/queues"): SERVICE_BUS_DATA_RECEIVER,
    # Operators named in approvalSenderPrincipalIds (a loop): send commands by hand, nothing else.
    ("principalId", f"{SB}/queues"): SERVICE_BUS_DATA_SENDER,
    # Agentless mode: the Event Grid system topic dead-letters into one container.
    (
        "systemTopicPrincipalId",
        "Microsoft.Storage/storageAccounts/blobServices/containers",
    ): STORAGE_BLOB_DATA_CONTRIBUTOR,
    # Operator who sets the two secret values after deployment (optional).
    ("secretsOfficerPrincipalId", "Microsoft.KeyVault/vaults"): KEY_VAULT_SECRETS_OFFICER,
}


def _all_assignments() -> list[dict[str, Any]]:
    return [a for path in bicep_files() for a in role_assignments(path)]


def test_role_assignments_are_exactly_the_least_privileged_table() -> None:
    found = Counter((a["principal"], a["scope_type"], a["role_guid"]) for a in _all_assignments())
    expected = Counter(
        (p, scope, role)
        for (p, scope), roles in EXPECTED_ROLES.items()
        for role in (roles if isinstance(roles, list) else [roles])
    )
    assert found == expected


def test_no_broad_role_anywhere() -> None:
    text = "\n".join(p.read_text() for p in bicep_files()).lower()
    for guid, name in FORBIDDEN_ROLES.items():
        assert guid not in text, name


@pytest.mark.parametrize("assignment", _all_assignments(), ids=lambda a: a["symbol"])
def test_assignment_is_named_by_scope_principal_and_role(assignment: dict[str, Any]) -> None:
    assert assignment["name_function"] == "guid"
    scope_part, principal_part, role_part = assignment["name_parts"]
    assert principal_part == assignment["principal"]
    assert role_part == assignment["role_var"]
    path = property_path(scope_part)
    if assignment["scope_symbol"] is None:
        assert scope_part["operator"]["operands"]["operand_1"]["function"]["type"] == (
            "resource_group"
        )
    else:
        assert str(scope_part).count(assignment["scope_symbol"]) == 1, scope_part
        assert path is None or path == [assignment["scope_symbol"], "id"], path


@pytest.mark.parametrize("assignment", _all_assignments(), ids=lambda a: a["symbol"])
def test_assignment_names_its_role_in_a_comment(assignment: dict[str, Any]) -> None:
    path = INFRA / "modules" / assignment["file"]
    lines = path.read_text().splitlines()
    role_name = ROLE_NAMES[assignment["role_guid"]]
    index = next(
        i for i, line in enumerate(lines) if line.startswith(f"resource {assignment['symbol']} ")
    )
    # The comment block right above the resource opens with the role's name.
    start = index
    while lines[start - 1].startswith("//"):
        start -= 1
    assert start < index, f"{assignment['symbol']}: no comment above it"
    assert lines[start].startswith(f"// {role_name}"), (assignment["symbol"], lines[start])
    var_line = next(
        i for i, line in enumerate(lines) if line.startswith(f"var {assignment['role_var']} ")
    )
    assert lines[var_line - 1] == f"// {role_name}"


def test_service_bus_roles_are_scoped_to_entities_not_the_namespace() -> None:
    tree = module("servicebus-roles.bicep")
    queue = unwrap(tree["resources"]["approvalsQueue"])
    assert queue["name"] == "approvalsQueueName"
    subs = tree["resources"]["appSubscriptions"]["config"]["loop_type"]["detail"]
    assert subs["array_name"] == "functionAppSubscriptionNames"
    for a in role_assignments(INFRA / "modules" / "servicebus-roles.bicep"):
        assert a["scope_type"] != SB


def test_approval_senders_get_data_sender_on_the_approvals_queue_only() -> None:
    # `sebridge approve` by hand: the forwarders' identity may only receive on approvals, so an
    # operator needs a grant of their own, and it must not reach the topic or any subscription.
    path = INFRA / "modules" / "servicebus-roles.bicep"
    tree = parse(path)
    (grant,) = [a for a in role_assignments(path) if a["symbol"] == "operatorsSendApprovals"]
    assert grant["is_loop"] and grant["principal"] == "principalId"
    loop = tree["resources"]["operatorsSendApprovals"]["config"]["loop_type"]["detail"]
    assert loop == {**loop, "item_name": "principalId", "array_name": "approvalSenderPrincipalIds"}
    assert grant["scope_symbol"] == "approvalsQueue"
    assert grant["scope_type"] == f"{SB}/queues"
    assert grant["role_guid"] == SERVICE_BUS_DATA_SENDER
    assert tree["parameters"]["approvalSenderPrincipalIds"]["default"] == []
    main = parse(INFRA / "main.bicep")
    assert main["parameters"]["approvalSenderPrincipalIds"]["default"] == []
    # Nobody else is granted anything through that parameter.
    users = [
        a
        for p in bicep_files()
        for a in role_assignments(p)
        if "approvalSender" in str(a) or a["principal"] == "principalId"
    ]
    assert users == [grant]


def test_principals_are_wired_to_the_right_identities() -> None:
    main = parse(INFRA / "main.bicep")
    modules = main["modules"]
    app = ["functionApp", "outputs", "principalId"]
    forwarder = ["forwarderIdentity", "outputs", "principalId"]
    for name in ("functionAppRoles", "serviceBusRoles", "poolRoles"):
        assert property_path(unwrap(modules[name])["params"]["functionAppPrincipalId"]) == app
    assert (
        property_path(unwrap(modules["serviceBusRoles"])["params"]["forwarderPrincipalId"])
        == forwarder
    )
    params = unwrap(modules["keyVault"])["params"]
    assert params["secretsOfficerPrincipalId"] == "secretsOfficerPrincipalId"
    sb_params = unwrap(modules["serviceBusRoles"])["params"]
    assert sb_params["approvalSenderPrincipalIds"] == "approvalSenderPrincipalIds"
    assert main["parameters"]["secretsOfficerPrincipalId"]["default"] == ""


# --- local auth and transport ---------------------------------------------------------------


def _only_body(file: str, arm_type: str) -> dict[str, Any]:
    (resource,) = resources_of_type(module(file), arm_type).values()
    return unwrap(resource)


def test_local_auth_is_disabled_everywhere() -> None:
    assert _only_body("servicebus.bicep", SB)["properties"]["disableLocalAuth"] is True
    assert (
        _only_body("monitoring.bicep", "Microsoft.Insights/components")["properties"][
            "DisableLocalAuth"
        ]
        is True
    )
    storage = _only_body("storage.bicep", "Microsoft.Storage/storageAccounts")["properties"]
    assert storage["allowSharedKeyAccess"] is False
    assert storage["allowBlobPublicAccess"] is False
    assert storage["minimumTlsVersion"] == "TLS1_2"
    assert storage["defaultToOAuthAuthentication"] is True


def test_key_vault_is_rbac_with_soft_delete_and_purge_protection() -> None:
    vault = _only_body("keyvault.bicep", "Microsoft.KeyVault/vaults")["properties"]
    assert vault["enableRbacAuthorization"] is True
    assert vault["enableSoftDelete"] is True
    assert vault["enablePurgeProtection"] is True
    assert "accessPolicies" not in vault
    # Secret values are set after deployment, never through the template.
    for path in bicep_files():
        assert not resources_of_type(parse(path), "Microsoft.KeyVault/vaults/secrets"), path.name


# --- no secret literal in infra/ ------------------------------------------------------------

SECRET_PATTERNS = {
    "storage or SB key": re.compile(r"(AccountKey|SharedAccessKey)\s*=\s*[A-Za-z0-9+/]{20,}", re.I),
    "connection string": re.compile(r"(DefaultEndpointsProtocol=|Endpoint=sb://)", re.I),
    "SAS token": re.compile(r"[?&]sig=[A-Za-z0-9%+/]{20,}", re.I),
    "instrumentation key": re.compile(r"InstrumentationKey=[0-9a-f-]{36}", re.I),
    # A name that *is* a secret (adminPassword, clientSecret, ...) given a literal value other
    # than a Key Vault reference.
    "password literal": re.compile(
        r"(password|passwd|secret|token|key)\b(\s+string)?['\"]?\s*[:=]\s*['\"](?!@Microsoft\.KeyVault\()[^'\"$]{6,}",
        re.I,
    ),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    # 40+ base64 characters with digits and both cases (keys); resource types have no digits.
    "base64 key": re.compile(
        r"(?<![A-Za-z0-9+/])(?=[A-Za-z0-9+/]*\d)(?=[A-Za-z0-9+/]*[A-Z])(?=[A-Za-z0-9+/]*[a-z])"
        r"[A-Za-z0-9+/]{40,}={0,2}(?![A-Za-z0-9+/])"
    ),
    "key listing": re.compile(
        r"\b(listKeys|listConnectionStrings|listAccountSas|listServiceSas)\("
    ),
}


def _secret_findings(text: str) -> list[str]:
    return [name for name, pattern in SECRET_PATTERNS.items() if pattern.search(text)]


def test_secret_scanner_catches_planted_secrets() -> None:
    planted = [
        "var c = 'DefaultEndpointsProtocol=https;AccountName=x;AccountKey=" + "QUJD" * 22 + "=='",
        "value: 'Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=a;SharedAccessKey=k'",
        "url: 'https://x.blob.core.windows.net/c/p.whl?sv=2022&sig=" + "abcd" * 8 + "'",
        "param adminPassword string = 'Hunter2Hunter2'",
        "key: storage.listKeys().keys[0].value",
    ]
    for sample in planted:
        assert _secret_findings(sample), sample
    assert _secret_findings("param teamsWebhookSecretName string") == []
    assert _secret_findings("  APPROVAL_SIGNING_KEY: '@Microsoft.KeyVault(SecretUri=x)'") == []


def _infra_text_files() -> list[Path]:
    skip_suffixes = {".pyc"}
    return [p for p in sorted(INFRA.rglob("*")) if p.is_file() and p.suffix not in skip_suffixes]


@pytest.mark.parametrize("path", _infra_text_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_no_secret_literal_in_infra(path: Path) -> None:
    assert _secret_findings(path.read_text()) == []


def test_secure_parameters_have_no_default() -> None:
    for path in bicep_files():
        for name, param in parse(path).get("parameters", {}).items():
            if any(d["type"] == "secure" for d in param["decorators"]):
                assert param.get("default") in (None, ""), f"{path.name}: {name}"


def test_checkov_secrets_scan_finds_nothing(checkov_reports: dict[str, dict[str, Any]]) -> None:
    secrets = checkov_reports.get("secrets")
    # checkov omits the secrets report when it has nothing to say.
    failed = secrets["results"]["failed_checks"] if secrets else []
    assert [(c["check_id"], c["file_path"]) for c in failed] == []


def test_the_custom_role_holds_exactly_the_two_instance_reads() -> None:
    """Least privilege: the one custom role reads Uniform instances and their NICs, nothing
    else, and can be assigned only in the managed group it is defined in."""
    from tests.infra.infra_helpers import module, resources_of_type, unwrap

    tree = module("managed-group-roles.bicep")
    (definition,) = resources_of_type(tree, "Microsoft.Authorization/roleDefinitions").values()
    properties = unwrap(definition)["properties"]
    (permission,) = properties["permissions"]
    assert sorted(permission["actions"]) == [
        "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read",
        "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    ]
    assert not any(permission[k] for k in ("notActions", "dataActions", "notDataActions"))
    assert "*" not in str(permission)
    (scope,) = properties["assignableScopes"]
    assert "resource_group" in str(scope)
