"""Issue 24: forwarder.bicep refuses a drain probe on a scale set whose automatic instance repairs
watch that same probe (they would replace, reimage or restart a draining instance).

No Bicep CLI or ARM runs here, so the test evaluates the guard's own lines from pycep-parser's
trees of `modules/forwarder-vmss.bicep` (what it hands the guard) and
`modules/drain-probe-guard.bicep` (the check) against scale sets and load balancer probes given
as data (what `vmss.properties` and `reference(probeId)` return in ARM), with ARM's rules for
the operators used: `?:` evaluates only the branch it takes, `??` and `&&`/`||` short-circuit,
and `fail()` stops the deployment with its message. It also checks that the guard cannot be
left out: what the scale set's deployment writes waits for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest
from infra_helpers import INFRA, module, parse, property_path, unwrap

VMSS = "forwarder-vmss.bicep"
GUARD = "drain-probe-guard.bicep"
PROBE_ID = (
    "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb"
    "/probes/{name}"
)


class DeploymentFailed(Exception):
    """fail('...') was reached: ARM stops the deployment with this message."""


class Guard:
    """Evaluates variables of a parsed Bicep file, the ARM way, for the subset the guard uses."""

    def __init__(
        self,
        tree: dict[str, Any],
        params: Mapping[str, Any],
        symbols: Mapping[str, Any],
        probes: Mapping[str, Mapping[str, Any]],
    ) -> None:
        self.tree = tree
        self.params = params
        self.symbols = symbols  # resource symbols: what ARM reads for them
        self.probes = probes  # resource id -> the probe's properties, for reference()
        self.referenced: list[str] = []
        self.scope: dict[str, Any] = {}  # a lambda's variable while its body is evaluated

    def var(self, name: str) -> Any:
        return self.eval(self.tree["variables"][name]["value"])

    def name(self, name: str) -> Any:
        if name in self.scope:
            return self.scope[name]
        if name in self.params:
            return self.params[name]
        if name in self.symbols:
            return self.symbols[name]
        if name in self.tree.get("variables", {}):
            return self.var(name)
        return name  # a property name on the right of an accessor

    def access(self, base: Any, node: Any) -> Any:
        """`base.node` where node is a name or a further accessor (pycep nests to the right)."""
        if isinstance(node, str):
            return base.get(node) if isinstance(base, Mapping) else None
        op = node["operator"]
        assert op["type"] == "property_accessor", op
        return self.access(
            self.access(base, op["operands"]["operand_1"]), op["operands"]["operand_2"]
        )

    def call(self, function: Mapping[str, Any], item: Any) -> Any:
        """A lambda (``x => ...``) applied to ``item``."""
        assert function["type"] == "lambda_expression", function
        detail = function["detail"]
        saved, self.scope = self.scope, {**self.scope, detail["var_1"]: item}
        try:
            return self.eval(detail["expression"])
        finally:
            self.scope = saved

    def eval(self, node: Any) -> Any:
        if isinstance(node, bool | int | float) or node is None:
            return node
        if isinstance(node, list):
            return [self.eval(item) for item in node]
        if isinstance(node, str):
            if "${" in node:
                return re.sub(r"\$\{(\w+)\}", lambda m: str(self.name(m.group(1))), node)
            return self.name(node)
        if isinstance(node, dict) and not node:
            return {}
        if "function" in node:
            fn = node["function"]
            args = fn["parameters"]
            if fn["type"] == "fail":
                raise DeploymentFailed(self.eval(args["arg_1"]).replace("\\'", "'"))
            if fn["type"] == "empty":
                return not self.eval(args["item_to_test"])
            if fn["type"] == "filter":
                items = self.eval(args["input_array"])
                return [item for item in items if self.call(args["expression"], item)]
            if fn["type"] == "map":
                return [self.call(args["arg_2"], item) for item in self.eval(args["arg_1"])]
            if fn["type"] == "contains":
                return self.eval(args["item_to_find"]) in self.eval(args["container"])
            if fn["type"] == "starts_with":
                text = self.eval(args["string_to_search"])
                return text.lower().startswith(self.eval(args["string_to_find"]).lower())
            if fn["type"] == "to_lower":
                return self.eval(args["string_to_change"]).lower()
            if fn["type"] == "string":
                value = self.eval(args["value_to_convert"])
                return value if isinstance(value, str) else json.dumps(value)
            if fn["type"] == "reference":
                resource_id = self.eval(args["resource_identifier"])
                self.referenced.append(resource_id)
                return self.probes[resource_id]  # KeyError: ARM would fail too
            raise AssertionError(f"function not modelled: {fn['type']}")
        op = node["operator"]
        kind, ops = op["type"], op["operands"]
        if kind == "property_accessor":
            return self.access(self.eval(ops["operand_1"]), ops["operand_2"])
        if kind == "coalesce":
            left = self.eval(ops["operand_1"])
            return left if left is not None else self.eval(ops["operand_2"])
        if kind == "conditional":
            taken = "true_value" if self.eval(ops["condition"]) else "false_value"
            return self.eval(ops[taken])
        if kind == "and":
            return bool(self.eval(ops["operand_1"])) and bool(self.eval(ops["operand_2"]))
        if kind == "or":
            return bool(self.eval(ops["operand_1"])) or bool(self.eval(ops["operand_2"]))
        if kind == "not":
            return not self.eval(ops["bool_value"])
        if kind == "equals":
            return self.eval(ops["operand_1"]) == self.eval(ops["operand_2"])
        if kind == "equals_case_insensitive":  # =~ (strings; ARM compares them ignoring case)
            left, right = self.eval(ops["operand_1"]), self.eval(ops["operand_2"])
            if isinstance(left, str) and isinstance(right, str):
                return left.lower() == right.lower()
            return bool(left == right)
        if kind == "not_equals":
            return self.eval(ops["operand_1"]) != self.eval(ops["operand_2"])
        raise AssertionError(f"operator not modelled: {kind}")


def scale_set(
    *, repairs: bool | None, probe: str | None, extensions: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    properties: dict[str, Any] = {"virtualMachineProfile": {"networkProfile": {}}}
    if repairs is not None:
        properties["automaticRepairsPolicy"] = {"enabled": repairs, "gracePeriod": "PT10M"}
    if probe is not None:
        properties["virtualMachineProfile"]["networkProfile"]["healthProbe"] = {
            "id": PROBE_ID.format(name=probe)
        }
    if extensions is not None:
        properties["virtualMachineProfile"]["extensionProfile"] = {"extensions": extensions}
    return {"name": "web", "location": "westeurope", "properties": properties}


def extension(
    settings: dict[str, Any],
    *,
    kind: str = "ApplicationHealthLinux",
    publisher: str = "Microsoft.ManagedServices",
) -> dict[str, Any]:
    """A scale set's VM extension as ARM returns it in extensionProfile.extensions."""
    return {
        "name": "HealthExtension",
        "properties": {
            "publisher": publisher,
            "type": kind,
            "typeHandlerVersion": "2.0",
            "autoUpgradeMinorVersion": True,
            "settings": settings,
        },
    }


LOGS = extension({"workspaceId": "x"}, kind="OmsAgentForLinux", publisher="Microsoft.Azure.Monitor")


PROBES = {
    PROBE_ID.format(name="tcp-on-drain-port"): {"protocol": "Tcp", "port": 8081},
    PROBE_ID.format(name="sebridge-drain"): {"protocol": "Http", "port": 8081, "requestPath": "/"},
    PROBE_ID.format(name="app-health"): {"protocol": "Http", "port": 8080, "requestPath": "/h"},
}


def deploy(vmss: dict[str, Any], drain_probe_port: int) -> tuple[str, Guard]:
    """The guard's output for this scale set (raises DeploymentFailed where ARM would)."""
    caller = module(VMSS)
    outer = Guard(
        caller, {"vmssName": "web", "drainProbePort": drain_probe_port}, {"vmss": vmss}, {}
    )
    given = unwrap(caller["modules"]["drainProbeGuard"])["params"]
    params = {name: outer.eval(value) for name, value in given.items()}
    tree = module(GUARD)
    assert set(params) == set(tree["parameters"])
    guard = Guard(tree, params, {}, PROBES)
    return guard.eval(tree["outputs"]["vmssName"]["value"]), guard


def test_a_scale_set_whose_repairs_watch_the_drain_probe_is_refused_with_the_fix() -> None:
    vmss = scale_set(repairs=True, probe="sebridge-drain")
    with pytest.raises(DeploymentFailed) as refused:
        deploy(vmss, 8081)
    message = str(refused.value)
    assert "web" in message and "8081" in message and "sebridge-drain" in message
    # The fix is in the message: the three ways out.
    assert "probe of their own" in message
    assert "Application Health extension" in message
    assert "disable automaticRepairsPolicy" in message


MS = "Microsoft.ManagedServices"


@pytest.mark.parametrize(
    ("settings", "kind", "port", "publisher"),
    [
        (
            {"protocol": "http", "port": 8081, "requestPath": "/"},
            "ApplicationHealthLinux",
            8081,
            MS,
        ),
        ({"protocol": "http", "port": 8081}, "ApplicationHealthWindows", 8081, MS),
        ({"protocol": "http", "requestPath": "/"}, "ApplicationHealthLinux", 80, MS),  # default
        ({"protocol": "https", "requestPath": "/"}, "ApplicationHealthLinux", 443, MS),
        # A port written as a string names the same port.
        ({"protocol": "http", "port": "8081"}, "ApplicationHealthLinux", 8081, MS),
        # ARM returns the publisher as it was written: any case names the same publisher.
        ({"port": 8081}, "ApplicationHealthLinux", 8081, "microsoft.managedservices"),
    ],
    ids=[
        "http",
        "windows",
        "http-default-port",
        "https-default-port",
        "port-text",
        "publisher-case",
    ],
)
def test_repairs_that_watch_the_health_extension_on_the_drain_probe_port_are_refused(
    settings: dict[str, Any], kind: str, port: int, publisher: str
) -> None:
    """The Application Health extension probes from inside the VM, so it reaches the drain
    probe as well as the load balancer does: repairs watching it would see the drain's 503."""
    health = extension(settings, kind=kind, publisher=publisher)
    vmss = scale_set(repairs=True, probe=None, extensions=[LOGS, health])
    with pytest.raises(DeploymentFailed) as refused:
        deploy(vmss, port)
    message = str(refused.value)
    assert "web" in message and str(port) in message and "Application Health extension" in message
    assert "settings.port" in message and "disable automaticRepairsPolicy" in message


@pytest.mark.parametrize(
    ("vmss", "port", "reads_the_probe"),
    [
        # A TCP probe or extension on the port sees it open, not the 503: no hazard.
        (scale_set(repairs=True, probe="tcp-on-drain-port"), 8081, True),
        (
            scale_set(
                repairs=True, probe=None, extensions=[extension({"protocol": "tcp", "port": 8081})]
            ),
            8081,
            False,
        ),
        (scale_set(repairs=True, probe="app-health"), 8081, True),  # repairs watch another probe
        (scale_set(repairs=False, probe="sebridge-drain"), 8081, False),  # repairs off
        (scale_set(repairs=None, probe="sebridge-drain"), 8081, False),  # no repairs policy
        (scale_set(repairs=True, probe=None), 8081, False),  # repairs on the health extension
        (scale_set(repairs=True, probe="sebridge-drain"), 0, False),  # no drain probe
        (  # repairs on the health extension, which probes the application's own port
            scale_set(
                repairs=True,
                probe=None,
                extensions=[LOGS, extension({"protocol": "http", "port": 8080})],
            ),
            8081,
            False,
        ),
        (  # the extension probes the drain probe's port, but repairs are off
            scale_set(repairs=False, probe=None, extensions=[extension({"port": 8081})]),
            8081,
            False,
        ),
        (  # no port: https probes 443, not the drain probe's 80
            scale_set(repairs=True, probe=None, extensions=[extension({"protocol": "https"})]),
            80,
            False,
        ),
        (  # another extension with a "port" setting is not what repairs watch
            scale_set(
                repairs=True,
                probe=None,
                extensions=[extension({"port": 8081}, kind="CustomScript")],
            ),
            8081,
            False,
        ),
    ],
    ids=[
        "tcp-probe",
        "tcp-extension",
        "other-probe",
        "repairs-off",
        "no-policy",
        "health-extension",
        "probe-off",
        "extension-other-port",
        "extension-repairs-off",
        "extension-https-default",
        "not-a-health-extension",
    ],
)
def test_other_scale_sets_are_accepted(
    vmss: dict[str, Any], port: int, reads_the_probe: bool
) -> None:
    checked, guard = deploy(vmss, port)
    assert checked == "web"
    # The load balancer is read only when repairs watch a probe and a drain probe is asked for.
    assert bool(guard.referenced) == reads_the_probe


def test_nothing_is_written_to_the_scale_set_before_the_guard_passed() -> None:
    tree = module(VMSS)
    identity = unwrap(tree["modules"]["identity"])
    assert property_path(identity["params"]["vmssName"]) == [
        "drainProbeGuard",
        "outputs",
        "vmssName",
    ]
    installer = unwrap(tree["resources"]["installer"])
    assert "drainProbeGuard" in installer["dependsOn"]
    # The guard and the identity module are the only modules; the installer the only resource
    # written (the scale set itself is `existing`).
    assert set(tree["modules"]) == {"drainProbeGuard", "identity"}
    written = {n for n, r in tree["resources"].items() if not r.get("existing")}
    assert written == {"installer"}


def test_forwarder_bicep_gives_the_scale_sets_the_drain_probe_port() -> None:
    scale_sets = unwrap(parse(INFRA / "forwarder.bicep")["modules"]["scaleSets"])
    assert scale_sets["params"]["drainProbePort"] == "drainProbePort"
    param = module(VMSS)["parameters"]["drainProbePort"]
    assert param["default"] == 0
