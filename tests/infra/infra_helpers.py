"""Read the Bicep under infra/ as data (pycep-parser's JSON tree) for the infra tests.

No Bicep CLI runs here, so the tests reason about the parsed templates: which resources exist,
what their properties refer to, which role each assignment grants to whom on what.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pycep import BicepParser

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
MODULES = INFRA / "modules"
EMULATOR_CONFIG = INFRA / "servicebus-emulator" / "Config.json"
FUNCTION_APP = REPO / "function_app.py"
SETTINGS_MODULE = REPO / "functions" / "shared" / "settings.py"


def bicep_files() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


@functools.cache
def _parser() -> BicepParser:
    # Building the parser (lark loading its grammar) costs three times as much as parsing all
    # 24 files with it, and every test process collects the infra tests: one parser each.
    return BicepParser()


@functools.cache
def parse(path: Path) -> dict[str, Any]:
    return _parser().parse(file_path=path)


def module(name: str) -> dict[str, Any]:
    return parse(MODULES / name)


def emulator_namespace(path: Path = EMULATOR_CONFIG) -> dict[str, Any]:
    """The one namespace of a Config.json (the repository's unless told otherwise)."""
    return json.loads(path.read_text())["UserConfig"]["Namespaces"][0]


def unwrap(element: dict[str, Any]) -> dict[str, Any]:
    """The body of a resource or module, looking through `[for ...]` and `if (...)`."""
    config = element["config"]
    while isinstance(config, dict) and ("loop_type" in config or "condition" in config):
        config = config["config"]
    return config


def resources_of_type(tree: dict[str, Any], arm_type: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in tree.get("resources", {}).items() if r["type"] == arm_type}


def property_path(node: Any) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"] (pycep nests property accessors to the right)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict) and "operator" in node:
        op = node["operator"]
        if op["type"] == "property_accessor":
            left = property_path(op["operands"]["operand_1"])
            right = property_path(op["operands"]["operand_2"])
            if left is not None and right is not None:
                return left + right
    return None


def walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def referenced_paths(node: Any) -> list[list[str]]:
    """Every dotted property path mentioned anywhere inside an expression."""
    found = []
    for sub in walk(node):
        if isinstance(sub, dict) and sub.get("operator", {}).get("type") == "property_accessor":
            path = property_path(sub)
            if path is not None:
                found.append(path)
    return found


def string_value(tree: dict[str, Any], node: Any) -> Any:
    """Resolve a bare identifier to its variable's literal value (one level)."""
    if isinstance(node, str) and node in tree.get("variables", {}):
        return tree["variables"][node]["value"]
    return node


def symbol_of(node: Any) -> str | None:
    """The resource symbol an expression like `vault`, `subs[i]` or `vault.id` starts from."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "operator" in node:
        op = node["operator"]
        if op["type"] in {"index_accessor", "property_accessor"}:
            return symbol_of(op["operands"]["operand_1"])
    return None


def role_assignments(path: Path) -> list[dict[str, Any]]:
    """Each role assignment of a file: scope type, principal parameter, role GUID, name parts."""
    tree = parse(path)
    found = []
    for symbol, resource in resources_of_type(
        tree, "Microsoft.Authorization/roleAssignments"
    ).items():
        body = unwrap(resource)
        scope_symbol = symbol_of(body.get("scope")) if "scope" in body else None
        if scope_symbol is None:
            scope_type = "resourceGroup"  # no scope: the deployment's resource group
        else:
            scope_type = tree["resources"][scope_symbol]["type"]
        role_definition = body["properties"]["roleDefinitionId"]["function"]
        assert role_definition["type"] == "subscription_resource_id", symbol
        role_var = role_definition["parameters"]["resource_name_1"]
        guid_call = body["name"]["function"]
        found.append(
            {
                "file": path.name,
                "symbol": symbol,
                "scope_symbol": scope_symbol,
                "scope_type": scope_type,
                "principal": body["properties"]["principalId"],
                "role_var": role_var,
                # A built-in role's GUID literal, or "custom:<var>" for a role defined here.
                "role_guid": (
                    value
                    if isinstance(value := string_value(tree, role_var), str)
                    else f"custom:{role_var}"
                ),
                "name_function": guid_call["type"],
                "name_parts": list(guid_call["parameters"].values()),
                "is_loop": "loop_type" in resource["config"],
            }
        )
    return found


def app_settings() -> dict[str, Any]:
    """Setting name -> Bicep expression, from the one list in functionapp.bicep."""
    tree = module("functionapp.bicep")
    settings: dict[str, Any] = {}
    settings.update(tree["variables"]["requiredSettings"]["value"])
    optional = tree["variables"]["optionalSettings"]["value"]
    # `empty(x) ? {} : { ... }`: the names are in the false branch.
    settings.update(optional["operator"]["operands"]["false_value"])
    # `teamsEnabled ? { ... } : {}`: the names are in the true branch.
    settings.update(teams_settings())
    return settings


def teams_settings() -> dict[str, Any]:
    """The settings functionapp.bicep sets only while teamsEnabled is true."""
    teams = module("functionapp.bicep")["variables"]["teamsSettings"]["value"]["operator"]
    assert teams["operands"]["condition"] == "teamsEnabled", teams
    assert teams["operands"]["false_value"] == {}, teams
    settings: dict[str, Any] = teams["operands"]["true_value"]
    return settings


# The bindings function_app.py is expected to register, used until it exists. Same shape as
# azure.functions' Binding.get_dict_repr().
EXPECTED_BINDINGS: list[dict[str, Any]] = [
    {
        "function": "teams",
        "type": "serviceBusTrigger",
        "connection": "ServiceBusConnection",
        "topicName": "%TopicName%",
        "subscriptionName": "%TeamsSubscriptionName%",
        "isSessionsEnabled": True,
    },
    {
        "function": "lb_pools",
        "type": "serviceBusTrigger",
        "connection": "ServiceBusConnection",
        "topicName": "%TopicName%",
        "subscriptionName": "%LbPoolsSubscriptionName%",
        "isSessionsEnabled": True,
    },
    {
        "function": "approval_gate",
        "type": "serviceBusTrigger",
        "connection": "ServiceBusConnection",
        "topicName": "%TopicName%",
        "subscriptionName": "%ApprovalGateSubscriptionName%",
        "isSessionsEnabled": True,
    },
    {
        "function": "approval_gate",
        "type": "serviceBus",
        "connection": "ServiceBusConnection",
        "queueName": "%ApprovalsQueueName%",
    },
]

_DUMP_BINDINGS = """
import json
from function_app import app
out = []
for f in app.get_functions():
    for b in f.get_bindings():
        d = {k: (v.value if hasattr(v, "value") else v) for k, v in b.get_dict_repr().items()}
        d["function"] = f.get_function_name()
        out.append(d)
print(json.dumps(out, default=lambda v: getattr(v, "value", str(v))))
"""

# Test values for the settings the Bicep sets, to import the real app with (it validates its
# settings at import). Placeholders, not secrets: nothing here reaches Azure.
_PLACEHOLDERS = {
    "AzureWebJobsStorage__accountName": "sttest",
    "APPLICATIONINSIGHTS_CONNECTION_STRING": "",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING": "Authorization=AAD",
    "ServiceBusConnection__fullyQualifiedNamespace": "sbns-test.servicebus.windows.net",
    "TEAMS_WEBHOOK_URL": "https://teams.invalid/workflows/placeholder",
    "APPROVAL_SIGNING_KEY": "placeholder-" + "x" * 32,
    "APPROVAL_BASE_URL": "https://func-test.azurewebsites.net",
    "LB_MANAGED_RESOURCE_GROUPS": "rg-web-test",
    "ARM_ENDPOINT": "https://management.azure.com",
    "HEARTBEAT_STORE_URL": "https://sttest.blob.core.windows.net/sebridge-heartbeats",
    # On, so the optional subscriber's bindings are checked too (the name of README's example).
    "CUSTOM_SUBSCRIBER_ENABLED": "true",
    "CustomSubscriptionName": "vm-loss",
    # Agentless mode: values main.bicep computes or passes through.
    "EVENTGRID_STATE_URL": "https://sttest.blob.core.windows.net/sebridge-eventgrid-state",
    "AGENTLESS_RESOURCE_GROUPS": "rg-batch-test",
    "AGENTLESS_VM_PATTERNS": "batch-*",
}


def app_environment() -> dict[str, str]:
    """One value for every setting functionapp.bicep sets, and only for those."""
    tree = module("functionapp.bicep")
    main = parse(INFRA / "main.bicep")
    passed = unwrap(main["modules"]["functionApp"])["params"]
    topic = emulator_namespace()["Topics"][0]["Name"]
    queue = emulator_namespace()["Queues"][0]["Name"]
    drain_queue = emulator_namespace()["Queues"][1]["Name"]
    env = {}
    for name, expression in app_settings().items():
        if name in _PLACEHOLDERS:
            env[name] = _PLACEHOLDERS[name]
        elif name == "TopicName":
            env[name] = topic
        elif name == "ApprovalsQueueName":
            env[name] = queue
        elif name == "DrainMomentsQueueName":
            env[name] = drain_queue
        elif isinstance(expression, str) and passed.get(expression) in main["variables"]:
            # A subscription name main.bicep passes from one of its variables.
            env[name] = main["variables"][passed[expression]]["value"]
        elif isinstance(expression, str) and not any(p in expression for p in tree["parameters"]):
            env[name] = expression  # a literal (PYTHON_THREADPOOL_THREAD_COUNT)
        else:
            # A setting from a parameter's default: LB_*, HEARTBEAT_*, flags.
            param = next(p for p in tree["parameters"] if p in str(expression))
            default = tree["parameters"][param]["default"]
            env[name] = str(default).lower() if isinstance(default, bool) else str(default)
    # Optional settings the Bicep leaves unset when empty (APPROVAL_POLICY) stay unset here.
    return {k: v for k, v in env.items() if v or k not in _optional_settings()}


def _optional_settings() -> set[str]:
    optional = module("functionapp.bicep")["variables"]["optionalSettings"]["value"]
    return set(optional["operator"]["operands"]["false_value"])


@functools.cache
def function_app_bindings() -> tuple[str, list[dict[str, Any]]]:
    """("app", bindings of the real app) once function_app.py exists, else ("fallback", ...).

    A subprocess with only the Bicep's settings in its environment: the app validates them at
    import (so a setting it needs and the Bicep lacks fails here), and importing registers its
    functions once per process. Once per test process: collection needs the bindings too.
    """
    if not FUNCTION_APP.exists():
        return "fallback", EXPECTED_BINDINGS
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env.update(app_environment())
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-c", _DUMP_BINDINGS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, (
        f"cannot load function_app.py with the Bicep settings:\n{proc.stderr}"
    )
    return "app", json.loads(proc.stdout)
