"""The trust boundary: a message is one VM's claim, and the workflows act only within its scope.

Every test runs the real function objects against the loopback ARM over HTTP. The forged cases
of the issue (A.1) must change nothing in ARM and send no command; a refusal is a security
event logged with the message id.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm, simulator_vm_id
from functions.adapters.arm import ArmError, ArmRestClient, checked_id
from functions.shared import names
from sebridge.contract.events import Envelope, Observer
from tests.fixtures import golden
from tests.functions.support import RG, SUB, App, envelope, sb_message, web_vm

pytestmark = pytest.mark.timeout(30)

PAYMENTS = "rg-payments"
MANUAL = json.dumps({"rules": [], "default": "manual"})


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    """web-1 and web-2 in rg-web's availability set as-web (pool-a, with web-3 to spare);
    db-1 in rg-payments, behind lb-pay's pool; db-2 in rg-web but in another availability set."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"])
    pay = arm_fake.add_load_balancer(SUB, PAYMENTS, "lb-pay", ["pool-db"])
    pool_a, pool_db = f"{lb}/backendAddressPools/pool-a", f"{pay}/backendAddressPools/pool-db"
    other_set = arm_fake.add_availability_set(SUB, RG, "as-db")
    return {
        "web-1": web_vm(arm_fake, "web-1", [pool_a]),
        "web-2": web_vm(arm_fake, "web-2", [pool_a]),
        "web-3": web_vm(arm_fake, "web-3", [pool_a]),
        "db-1": arm_fake.add_vm(SUB, PAYMENTS, "db-1", [pool_db]),
        "db-2": arm_fake.add_vm(SUB, RG, "db-2", [pool_a], availability_set=other_set),
        "pool-a": pool_a,
        "pool-db": pool_db,
    }


def pools(arm: FakeArm, world: dict[str, str]) -> dict[str, list[str]]:
    return {vm: arm.vm_pools(world[vm]) for vm in ("web-1", "web-2", "web-3", "db-1", "db-2")}


def deliver_everywhere(app: App, message: Envelope) -> None:
    for function in ("teams", "lb_pools", "approval_gate"):
        app.deliver(function, message)


def security_events(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "securityEvent", False)]


def assert_refused_and_untouched(
    app: App,
    world: dict[str, str],
    before: dict[str, list[str]],
    caplog: pytest.LogCaptureFixture,
    message: Envelope,
) -> None:
    assert pools(app.arm, world) == before, "a pool changed"
    assert not app.arm.writes(), "ARM was written"
    assert not app.commands.sent, "a command was sent"
    assert not app.publisher.published, "Prepared or Held was published"
    events = security_events(caplog)
    assert events, "no security event was logged"
    assert all(getattr(r, "messageId", None) == message.message_id for r in events)
    assert all(r.name == "sebridge.security" and r.levelno == logging.WARNING for r in events)


# ---- the forged cases of the issue ------------------------------------------------------------


def test_path_traversal_in_resources_drains_nothing_elsewhere(
    make_app: Callable[..., App], world: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(APPROVAL_POLICY=MANUAL)
    before = pools(app.arm, world)
    traversal = f"../../../../{PAYMENTS}/providers/Microsoft.Compute/virtualMachines/db-1"
    message = envelope("Scheduled", Resources=[traversal])
    deliver_everywhere(app, message)
    assert_refused_and_untouched(app, world, before, caplog, message)
    assert not any(PAYMENTS in r.path or "db-1" in r.path for r in app.arm.requests)
    (card,) = app.teams.cards
    assert "actions" not in card  # no Approve button for a refused message
    assert "Resources[] '../../../../rg-payments" in caplog.text


def test_a_forged_resource_group_changes_nothing(
    app: App, world: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """web-1's real identity, but claiming to live in rg-payments next to db-1."""
    before = pools(app.arm, world)
    forged = replace(golden.OBSERVER, resource_group=PAYMENTS, resource_id="")
    message = envelope("Scheduled", forged, Resources=["db-1"])
    deliver_everywhere(app, message)
    assert_refused_and_untouched(app, world, before, caplog, message)
    assert "does not exist in resource group 'rg-payments'" in caplog.text


def test_a_forged_observer_gets_no_approval_sent_to_its_session(
    app: App, world: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """An observer named db-1 (with EventSource User, which the default policy approves):
    the vmId is a guess, so no command reaches db-1's session."""
    before = pools(app.arm, world)
    forged = Observer(
        vm_name="db-1",
        vm_id="00000000-0000-4000-8000-00000000dead",
        resource_id=world["db-1"],
        subscription_id=SUB,
        resource_group=PAYMENTS,
    )
    message = envelope("Scheduled", forged, Resources=["db-1"], EventSource="User")
    deliver_everywhere(app, message)
    assert_refused_and_untouched(app, world, before, caplog, message)
    assert "claims vmId" in caplog.text


def test_a_vm_outside_the_observers_availability_set_refuses_the_message(
    app: App, world: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """web-1 is genuine, but db-2 (same resource group, another availability set) could never
    have been in an event IMDS showed web-1: nothing is drained, web-2 included."""
    before = pools(app.arm, world)
    message = envelope("Scheduled", Resources=["web-2", "db-2"])
    deliver_everywhere(app, message)
    assert_refused_and_untouched(app, world, before, caplog, message)
    assert "'db-2' is neither the observer" in caplog.text


def test_a_markdown_link_in_the_description_reaches_no_card_as_a_link(
    app: App, world: dict[str, str]
) -> None:
    from tests.functions.test_workflow_cards import assert_markup_free, assert_valid

    hostile = "Reboot [click here](https://evil.example/login) **now** <at>admin</at>"
    app.deliver("teams", envelope("Scheduled", Description=hostile))
    (card,) = app.teams.cards
    assert_valid(card)
    assert_markup_free(card, hostile=("click here", "evil.example", "admin", "**now**"))
    assert "https[:]//evil.example/login" in json.dumps(card)


# ---- names --------------------------------------------------------------------------------------

BAD_NAMES = [
    pytest.param("web/1", id="slash"),
    pytest.param("..", id="dot-dot"),
    pytest.param("web-1/../../db-1", id="traversal"),
    pytest.param("web\x00-1", id="nul"),
    pytest.param("web-1\r\nX-Injected: 1", id="crlf"),
    pytest.param("web\u202e1", id="bidi-override"),
    pytest.param("w" * 65, id="over-long"),
    pytest.param("web-1?api-version=1", id="query"),
    pytest.param("web-1#frag", id="fragment"),
    pytest.param("%2e%2e", id="percent-encoded"),
    pytest.param("", id="empty"),
]


PLACES = ["Resources", "vmName", "resourceGroup", "vmScaleSetName"]
NAME_CASES = [
    pytest.param(where, bad.values[0], id=f"{where}-{bad.id}")
    for where in PLACES
    for bad in BAD_NAMES
    # An empty vmName already breaks the contract; an empty vmScaleSetName means "none".
    if not (bad.values[0] == "" and where in ("vmName", "vmScaleSetName"))
]


@pytest.mark.parametrize(("where", "bad"), NAME_CASES)
def test_an_invalid_name_anywhere_is_refused_before_arm(
    app: App, world: dict[str, str], caplog: pytest.LogCaptureFixture, where: str, bad: str
) -> None:
    if where == "resourceGroup" and bad == "w" * 65:
        bad = "g" * 91  # a resource group may be 90 characters long
    observer = golden.OBSERVER
    fields: dict[str, Any] = {}
    if where == "Resources":
        fields["Resources"] = ["web-2", bad]
    elif where == "vmName":
        observer = replace(observer, vm_name=bad)
    elif where == "resourceGroup":
        observer = replace(observer, resource_group=bad)
    else:
        observer = replace(observer, vm_scale_set_name=bad)
    before = pools(app.arm, world)
    message = envelope("Scheduled", observer, **fields)
    for function in ("lb_pools", "approval_gate"):
        app.deliver(function, message)
    assert_refused_and_untouched(app, world, before, caplog, message)
    if where != "Resources":
        assert not app.arm.requests  # the observer is refused before any ARM call
    else:
        assert all(bad not in r.path for r in app.arm.requests if bad)


@pytest.mark.parametrize(
    "subscription", ["not-a-guid", "../" + SUB, SUB.upper() + "/x", "{" + SUB + "}"]
)
def test_an_invalid_subscription_is_refused(
    app: App, world: dict[str, str], caplog: pytest.LogCaptureFixture, subscription: str
) -> None:
    before = pools(app.arm, world)
    message = envelope("Scheduled", replace(golden.OBSERVER, subscription_id=subscription))
    app.deliver("lb_pools", message)
    assert_refused_and_untouched(app, world, before, caplog, message)
    assert not app.arm.requests


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (names.compute_name, "ss_3"),
        (names.compute_name, "a"),
        (names.compute_name, "w" * 64),
        (names.resource_group, "rg_(web).1"),
        (names.resource_group, "Ressourcengruppe-Ü"),
        (names.resource_group, "g" * 90),
        (names.subscription_id, SUB),
    ],
)
def test_valid_names_pass(check: Callable[[str], str], value: str) -> None:
    assert check(value) == value


def test_the_adapter_checks_and_quotes_names_itself(identity_fake: object) -> None:
    """Defence in depth: the ARM client refuses a bad name even if a caller forgot to check,
    and every id it is given must be a plain resource path."""
    from azure.identity import ManagedIdentityCredential

    client = ArmRestClient("http://127.0.0.1:9", ManagedIdentityCredential())
    with pytest.raises(names.InvalidName):
        client.get_vm(SUB, RG, "web-1/../db-1")
    with pytest.raises(names.InvalidName):
        client.get_vm(SUB, "rg-web/../rg-payments", "web-1")
    assert names.segment("a/b?c#d e") == "a%2Fb%3Fc%23d%20e"
    for bad in (
        f"/subscriptions/{SUB}/resourceGroups/rg-web/../rg-payments/x",
        f"/subscriptions/{SUB}/resourceGroups/rg-web/./x",
        f"/subscriptions/{SUB}/resourceGroups/rg-web/x?api-version=1",
        f"/subscriptions/{SUB}/resourceGroups/rg%2Fweb/x",
        "https://evil.example/subscriptions/x",
        "/tenants/x",
    ):
        with pytest.raises(ArmError, match="plain resource path"):
            checked_id(bad)


# ---- scope: standalone, availability set, Flexible and Uniform scale sets ------------------------


def observer_of(arm: FakeArm, vm_id: str, **extra: str) -> Observer:
    document = arm.resources[vm_id.lower()]
    parts = vm_id.split("/")
    return Observer(
        vm_name=document["name"],
        vm_id=document["properties"]["vmId"],
        resource_id=vm_id,
        subscription_id=parts[2],
        resource_group=parts[4],
        **extra,
    )


def drained(app: App, vm_id: str) -> bool:
    return app.arm.vm_pools(vm_id) == []


@pytest.fixture
def pool(arm_fake: FakeArm) -> str:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-scope", ["pool"])
    return f"{lb}/backendAddressPools/pool"


def spare(arm_fake: FakeArm, pool: str) -> None:
    arm_fake.add_vm(SUB, RG, "spare-1", [pool])
    arm_fake.add_vm(SUB, RG, "spare-2", [pool])


def test_a_standalone_vm_may_name_only_itself(
    app: App, arm_fake: FakeArm, pool: str, caplog: pytest.LogCaptureFixture
) -> None:
    spare(arm_fake, pool)
    alone = arm_fake.add_vm(SUB, RG, "alone", [pool])
    other = arm_fake.add_vm(SUB, RG, "other", [pool])
    observer = observer_of(arm_fake, alone)
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["other"]))
    assert not drained(app, other) and security_events(caplog)
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["alone"]))
    assert drained(app, alone) and not drained(app, other)
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=[]))  # = the observer
    assert drained(app, alone)


def test_an_availability_set_shares_events_with_its_members_only(
    app: App, arm_fake: FakeArm, pool: str, caplog: pytest.LogCaptureFixture
) -> None:
    spare(arm_fake, pool)
    as_a = arm_fake.add_availability_set(SUB, RG, "as-a")
    as_b = arm_fake.add_availability_set(SUB, RG, "as-b")
    a1 = arm_fake.add_vm(SUB, RG, "a1", [pool], availability_set=as_a)
    a2 = arm_fake.add_vm(SUB, RG, "a2", [pool], availability_set=as_a)
    b1 = arm_fake.add_vm(SUB, RG, "b1", [pool], availability_set=as_b)
    observer = observer_of(arm_fake, a1)
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["a2", "b1"]))
    assert not drained(app, a2) and not drained(app, b1) and security_events(caplog)
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["A2"]))  # any case
    assert drained(app, a2) and not drained(app, a1) and not drained(app, b1)


def test_a_flexible_scale_set_shares_events_with_its_members_only(
    app: App, arm_fake: FakeArm, pool: str, caplog: pytest.LogCaptureFixture
) -> None:
    spare(arm_fake, pool)
    flex = arm_fake.add_scale_set(SUB, RG, "flex")
    other = arm_fake.add_scale_set(SUB, RG, "flex2")
    f1 = arm_fake.add_vm(SUB, RG, "flex_a1b2c3", [pool], scale_set=flex)
    f2 = arm_fake.add_vm(SUB, RG, "flex_d4e5f6", [pool], scale_set=flex)
    g1 = arm_fake.add_vm(SUB, RG, "flex2_0001", [pool], scale_set=other)
    observer = observer_of(arm_fake, f1, vm_scale_set_name="flex")
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["flex2_0001"]))
    assert not drained(app, g1) and security_events(caplog)
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["flex_d4e5f6"]))
    assert drained(app, f2) and not drained(app, f1)
    # A member that claims another scale set than ARM knows it in is not believed.
    lying = observer_of(arm_fake, f1, vm_scale_set_name="flex2")
    message = envelope("Scheduled", lying, Resources=["flex2_0001"])
    app.deliver("lb_pools", message)
    assert not drained(app, g1)
    assert "claims scale set 'flex2', ARM says flex" in caplog.text


def test_a_uniform_scale_set_shares_events_with_its_instances_only(
    app: App, arm_fake: FakeArm, pool: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Uniform instances are verified through the scale-set VM API (and lb-pools then leaves
    their pools alone, the scale-set model owns them). A VM outside the set is refused; another
    set's instance cannot even be named from this set's scope (looked up as uni_<n> only)."""
    for scale_set, instance in (("uni", "3"), ("uni", "5"), ("uni2", "5")):
        arm_fake.add_vmss_instance(SUB, RG, scale_set, instance, [pool])
    loner = arm_fake.add_vm(SUB, RG, "loner", [pool])
    observer = Observer(
        vm_name="uni_3",
        vm_id=simulator_vm_id("uni_3"),
        subscription_id=SUB,
        resource_group=RG,
        vm_scale_set_name="uni",
    )
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["loner"]))
    assert security_events(caplog) and "'loner' is neither the observer" in caplog.text
    assert not drained(app, loner)
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["uni2_5"]))
    assert "VM not found in ARM" in caplog.text and not app.arm.writes()
    caplog.clear()
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["uni_3", "uni_5"]))
    assert not security_events(caplog)
    assert caplog.text.count("Uniform scale-set instance: pools left as they are") == 2
    assert not app.arm.writes()
    forged = replace(observer, vm_id=simulator_vm_id("uni_5"))
    app.deliver("lb_pools", envelope("Scheduled", forged, Resources=["uni_3"]))
    assert "claims vmId" in caplog.text


# ---- LB_MANAGED_RESOURCE_GROUPS: an allow-list ---------------------------------------------


def test_managed_resource_groups_is_an_allow_list(
    make_app: Callable[..., App], world: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(LB_MANAGED_RESOURCE_GROUPS=f"{PAYMENTS}, rg-other")
    before = pools(app.arm, world)
    message = golden.build()["scheduled"]
    deliver_everywhere(app, message)
    assert_refused_and_untouched(app, world, before, caplog, message)
    assert "is not in LB_MANAGED_RESOURCE_GROUPS" in caplog.text
    assert not app.arm.requests


def test_a_listed_group_works_in_any_case(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    app = make_app(LB_MANAGED_RESOURCE_GROUPS="RG-WEB")
    app.deliver("lb_pools", golden.build()["scheduled"])
    assert drained(app, world["web-1"]) and drained(app, world["web-2"])


def test_a_nic_outside_the_listed_groups_is_not_touched(
    make_app: Callable[..., App], arm_fake: FakeArm, caplog: pytest.LogCaptureFixture
) -> None:
    """A VM of rg-web whose NIC lives in rg-net: with the allow-list set to rg-web alone, the
    app may not write that NIC, so the message is refused before anything changes."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"])
    pool_a = f"{lb}/backendAddressPools/pool-a"
    web_vm(arm_fake, "web-3", [pool_a])
    web_1 = web_vm(arm_fake, "web-1", [pool_a])
    network = "providers/Microsoft.Network/networkInterfaces/web-1-nic"
    foreign_nic = f"/subscriptions/{SUB}/resourceGroups/rg-net/{network}"
    nic = arm_fake.nic(f"/subscriptions/{SUB}/resourceGroups/{RG}/{network}")
    nic["id"] = foreign_nic
    arm_fake.resources[foreign_nic.lower()] = nic
    arm_fake.resources[web_1.lower()]["properties"]["networkProfile"]["networkInterfaces"] = [
        {"id": foreign_nic}
    ]
    app = make_app(LB_MANAGED_RESOURCE_GROUPS="rg-web")
    app.deliver("lb_pools", envelope("Scheduled", Resources=["web-1"]))
    assert not app.arm.writes() and not app.publisher.published
    assert "outside LB_MANAGED_RESOURCE_GROUPS" in caplog.text and security_events(caplog)


# ---- the ARM reads are cached -------------------------------------------------------------------


def test_scope_reads_are_cached_across_invocations(app: App, world: dict[str, str]) -> None:
    user = envelope("Scheduled", EventType="Freeze", DurationInSeconds=5)
    for _ in range(5):
        app.deliver("approval_gate", user)
    vm_reads = [r for r in app.arm.requests if "/virtualMachines/" in r.path]
    assert len(vm_reads) == 2  # web-1 and web-2, once each
    assert len(app.commands.sent) == 5


def test_an_unreadable_body_type_is_refused_not_raised(app: App, world: dict[str, str]) -> None:
    """Observer fields of the wrong type read as empty: refused, never an exception."""
    message = envelope("Scheduled")
    body = dict(message.body)
    body["data"] = dict(body["data"], observer=dict(body["data"]["observer"], vmId=12))
    raw = json.dumps(body).encode()
    for function in ("teams", "lb_pools", "approval_gate"):
        app.call(function, sb_message(message, body=raw))
    assert not app.arm.writes() and not app.commands.sent
