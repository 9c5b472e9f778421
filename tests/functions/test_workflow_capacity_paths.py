"""One capacity decision for every path that removes capacity or starts maintenance early
(issue 23, findings 1 and 3).

The world of the issue: web-1, web-2 and web-3 share the availability set as-web and pool-a
(probed by rule `http`), LB_MIN_HEALTHY=1. Every path is driven with a forged or racing message
through the real function objects, the loopback ARM (pool changes recorded) and blob storage
(the pools' leases and state), and must keep two promises:

- no pool ever goes below its minimum of healthy members (replaying ARM's own record of pool
  changes, and counting members approved early while still in the pool as gone);
- nothing held is approved early (no approve command, no ARM acknowledge for a held event).

The table names every such path; ``test_the_table_names_every_path`` keeps it complete.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import azure.functions as func
import pytest

from emulators.fakes.arm import FakeArm, simulator_vm_id
from emulators.fakes.eventgrid import notification, scheduled_event_id
from functions.approval_gate import tokens
from functions.eventgrid_ingest.core import Ingestor
from functions.eventgrid_ingest.notification import raw_from_json
from functions.shared import seal
from sebridge.contract.events import Envelope, Observer, prepared_message
from tests.eventgrid.support import T0, FixedClock, MemoryStore, Publisher, properties
from tests.fixtures import golden
from tests.functions.support import (
    NOW,
    RG,
    SIGNING_KEY,
    SUB,
    App,
    at_once,
    envelope,
    event,
    web_vm,
)

pytestmark = pytest.mark.timeout(60)

EVENT_A = "a0a0a0a0-0000-4000-8000-00000000000a"  # drains web-1
EVENT_B = "b0b0b0b0-0000-4000-8000-00000000000b"  # drains web-2
EVENT_C = "c0c0c0c0-0000-4000-8000-00000000000c"  # web-3, the last healthy member: held
APPROVE_ALL = json.dumps({"rules": [], "default": "approve"})
MANUAL = json.dumps({"rules": [], "default": "manual"})
VMS = ("web-1", "web-2", "web-3")


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    return {**{vm: web_vm(arm_fake, vm, [pool]) for vm in VMS}, "pool-a": pool}


def observer(world: dict[str, str], vm: str) -> Observer:
    """The honest observer ``vm`` (its real vmId: a compromised VM knows its own)."""
    vm_id = golden.OBSERVER.vm_id if vm == "web-1" else simulator_vm_id(vm)
    return Observer(
        vm_name=vm,
        vm_id=vm_id,
        resource_id=world[vm],
        subscription_id=SUB,
        resource_group=RG,
        location="westeurope",
    )


def scheduled(event_id: str, vms: list[str], by: Observer | None = None, **fields: Any) -> Envelope:
    return envelope("Scheduled", by, EventId=event_id, Resources=vms, **fields)


def vm_side_prepared(world: dict[str, str], event_id: str, vm: str) -> Envelope:
    """A Prepared from ``vm``'s own forwarder (hooks, drain probe), naming itself."""
    by = observer(world, vm)
    return prepared_message(
        event(EventId=event_id, Resources=[vm]),
        by,
        11,
        golden.OBSERVED_AT,
        source=by.source,
        prepared_vms=[vm],
        cause=f"scheduled|hooks|{vm}",
        prepared_by="hooks",
    )


def http(method: str, token: str, event_id: str) -> func.HttpRequest:
    form = {"token": token, "eventId": event_id}
    return func.HttpRequest(
        method=method,
        url="http://127.0.0.1:7071/api/approve",
        params={},
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        body=urlencode(form).encode(),
    )


def card_token(app: App, message: Envelope) -> str:
    """The Approve link's token from the card Teams gets for ``message``."""
    app.deliver("teams", message)
    (action,) = app.teams.cards[-1]["actions"]
    return parse_qs(urlsplit(action["url"]).query)["token"][0]


def hold_c(app: App) -> None:
    """A drains web-1 and B drains web-2; C (web-3, the last healthy member) is held."""
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    app.deliver("lb_pools", scheduled(EVENT_B, ["web-2"]))
    app.deliver("lb_pools", scheduled(EVENT_C, ["web-3"]))
    assert [m.subject for m in app.publisher.published].count("Held") == 1


@dataclass(frozen=True)
class Path:
    name: str
    settings: dict[str, str]
    drive: Callable[[App, dict[str, str]], None]
    what: str  # the path it drives, in words


# ---- the paths ---------------------------------------------------------------------------------
def drain_scheduled(app: App, world: dict[str, str]) -> None:
    """web-1 (compromised) invents a Reboot of the whole availability set."""
    app.deliver("lb_pools", scheduled(EVENT_C, list(VMS)))


def drain_updated(app: App, world: dict[str, str]) -> None:
    app.deliver("lb_pools", scheduled(EVENT_C, ["web-1"]))
    app.deliver("lb_pools", envelope("Updated", EventId=EVENT_C, Resources=list(VMS)))


def drain_started(app: App, world: dict[str, str]) -> None:
    """The issue's finding 1: the guard holds the Scheduled, then a Started of the same event."""
    app.deliver("lb_pools", scheduled(EVENT_C, list(VMS)))
    started = envelope(
        "Started", EventId=EVENT_C, Resources=list(VMS), EventStatus="Started", NotBefore=""
    )
    app.deliver("lb_pools", started)


def approve_by_policy(app: App, world: dict[str, str]) -> None:
    hold_c(app)
    app.deliver("approval_gate", scheduled(EVENT_C, ["web-3"], EventSource="User"))


def approve_by_link(app: App, world: dict[str, str]) -> None:
    """The issue's finding 3: C's Approve link, clicked while C is held."""
    hold_c(app)
    token = card_token(app, scheduled(EVENT_C, ["web-3"]))
    response = app.call("approve", http("POST", token, EVENT_C))
    assert response.status_code == 409
    page = response.get_body().decode()
    assert "held in lb-web/pool-a" in page and "Nothing was sent" in page


def approve_by_an_old_link(app: App, world: dict[str, str]) -> None:
    """A link signed before links named their VMs (v1): only the event's hold can be checked."""
    hold_c(app)
    claims = tokens.ApprovalClaims(EVENT_C, "web-1", NOW.replace(year=2030))
    token = tokens.sign(SIGNING_KEY.encode(), claims)
    response = app.call("approve", http("POST", token, EVENT_C))
    assert response.status_code == 409


def approve_by_link_through_arm(app: App, world: dict[str, str]) -> None:
    hold_c(app)
    token = card_token(app, scheduled(EVENT_C, ["web-3"]))
    assert tokens.verify(SIGNING_KEY.encode(), token, NOW).acknowledge_on
    assert app.call("approve", http("POST", token, EVENT_C)).status_code == 409


def approve_by_vm_side_prepared(app: App, world: dict[str, str]) -> None:
    """web-3 says it prepared itself, but it is the pool's last healthy member."""
    hold_c(app)
    app.deliver("approval_gate", vm_side_prepared(world, EVENT_C, "web-3"))


def acknowledge_through_arm(app: App, world: dict[str, str]) -> None:
    """The gate's ARM acknowledge (agentless by settings) for the same forged Prepared."""
    hold_c(app)
    app.deliver("approval_gate", vm_side_prepared(world, EVENT_C, "web-3"))


def agentless_route(app: App, world: dict[str, str]) -> None:
    """The same event from Event Grid (sealed, the availability set as its observer)."""
    hold_c(app)
    publisher = Publisher()
    ingestor = Ingestor(MemoryStore(), publisher, FixedClock(), sleep=lambda _: None)
    body = notification_for(EVENT_C, ["web-3"])
    ingestor.handle_raw(raw_from_json(body))
    (message,) = publisher.published
    sealed = seal.seal(message, seal.app_key(SIGNING_KEY.encode()))
    app.deliver("lb_pools", sealed)
    app.deliver("approval_gate", sealed)


def notification_for(event_id: str, vms: list[str]) -> dict[str, Any]:
    props = properties(EventId=event_id, Resources=vms)
    return notification(
        props,
        resource_id=scheduled_event_id(SUB, RG, "as-web", event_id, "availabilitySets"),
        event_time=T0,
    )


PATHS = [
    Path("drain-scheduled", {}, drain_scheduled, "lb-pools drains on Scheduled"),
    Path("drain-updated", {}, drain_updated, "lb-pools drains on Updated"),
    Path("drain-started", {}, drain_started, "lb-pools drains on Started"),
    Path("policy", {"APPROVAL_POLICY": APPROVE_ALL}, approve_by_policy, "the gate's policy"),
    Path("link", {"APPROVAL_POLICY": MANUAL}, approve_by_link, "the Approve link (command)"),
    Path("old-link", {}, approve_by_an_old_link, "an Approve link signed without its VMs"),
    Path(
        "link-arm",
        {"APPROVAL_POLICY": MANUAL, "AGENTLESS_RESOURCE_GROUPS": RG},
        approve_by_link_through_arm,
        "the Approve link (ARM acknowledge)",
    ),
    Path(
        "vm-side-prepared",
        {"APPROVAL_POLICY": APPROVE_ALL},
        approve_by_vm_side_prepared,
        "the gate on a VM-side Prepared (command)",
    ),
    Path(
        "arm-acknowledge",
        {"APPROVAL_POLICY": APPROVE_ALL, "AGENTLESS_RESOURCE_GROUPS": RG},
        acknowledge_through_arm,
        "the gate's ARM acknowledge",
    ),
    Path(
        "agentless",
        {"APPROVAL_POLICY": APPROVE_ALL},
        agentless_route,
        "the agentless route (Event Grid)",
    ),
]


def lowest_healthy(arm: FakeArm, pool: str, size: int) -> int:
    """Replay ARM's record of the pool's changes: the fewest members it ever had (every
    member is probed Up in these worlds)."""
    members = lowest = size
    for change in sorted(arm.pool_events, key=lambda c: c.at):
        if change.pool.lower() == pool.lower():
            members += 1 if change.joined else -1
            lowest = min(lowest, members)
    return lowest


def approved(app: App, event_id: str) -> bool:
    commands = [c for c, _ in app.commands.sent if c.event_id == event_id]
    acknowledged = [a for a in app.arm.acknowledged if a[1] == event_id]
    return bool(commands or acknowledged)


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_no_path_takes_a_pool_below_its_minimum_or_approves_a_held_event(
    make_app: Callable[..., App], world: dict[str, str], path: Path
) -> None:
    app = make_app(LB_MIN_HEALTHY="1", **path.settings)
    path.drive(app, world)
    in_pool = [vm for vm in VMS if app.arm.vm_pools(world[vm])]
    assert in_pool, f"{path.what}: the pool was emptied"
    assert lowest_healthy(app.arm, world["pool-a"], len(VMS)) >= 1, path.what
    assert not approved(app, EVENT_C), f"{path.what}: the held event was approved early"


def test_the_table_names_every_path() -> None:
    """Every path the README's Security model lists has a row."""
    assert {p.name for p in PATHS} >= {
        "drain-scheduled",
        "drain-updated",
        "drain-started",
        "policy",
        "link",
        "link-arm",
        "arm-acknowledge",
        "agentless",
        "vm-side-prepared",
    }


def test_an_approval_racing_a_drain_never_lets_both_through(
    make_app: Callable[..., App], world: dict[str, str], arm_fake: FakeArm
) -> None:
    """A drained web-1 (A). At the same moment web-2's own Prepared asks to approve D early
    (web-2 stays in the pool) and E asks to drain web-3: either would leave one healthy member,
    both would leave none. The pool's lease and its leaving members let one through."""
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=APPROVE_ALL)
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    event_d, event_e = EVENT_B, EVENT_C
    arm_fake.slow(0.3, path_contains="/health", times=2)
    errors = at_once(
        lambda: app.deliver("approval_gate", vm_side_prepared(world, event_d, "web-2")),
        lambda: app.deliver("lb_pools", scheduled(event_e, ["web-3"], observer(world, "web-3"))),
    )
    assert not errors, errors
    drained_e = not app.arm.vm_pools(world["web-3"])
    assert approved(app, event_d) != drained_e, "both went through, or neither"
    # And the next decision counts web-2 as gone while its approved maintenance runs.
    if approved(app, event_d):
        held = [m for m in app.publisher.published if m.subject == "Held"]
        assert len(held) == 1


def test_members_approved_early_count_as_gone_for_the_next_drain(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    """The racing test's order made deterministic: D is approved first while web-2 stays in the
    pool (its own Prepared; web-3 can spare it), so E may not drain web-3 while D's maintenance
    runs; once D completes, web-2 serves again and the held E is drained."""
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=APPROVE_ALL)
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    app.deliver("approval_gate", vm_side_prepared(world, EVENT_B, "web-2"))
    assert approved(app, EVENT_B) and app.arm.vm_pools(world["web-2"])
    app.deliver("lb_pools", scheduled(EVENT_C, ["web-3"]))
    assert app.arm.vm_pools(world["web-3"]), "web-3 drained while web-2 was down for B"
    ended = envelope(
        "Completed", EventId=EVENT_B, Resources=["web-2"], EventStatus="Started", NotBefore=""
    )
    app.deliver("lb_pools", ended)
    assert not app.arm.vm_pools(world["web-3"]), "the held event was not tried again"
    prepared = [m for m in app.publisher.published if m.subject == "Prepared"]
    assert EVENT_C in {m.session_id for m in prepared}


# ---- every Approve link asks one capacity check, whatever its token's version ------------------
# (hostile review of issue 23c, break 1: a v1 link, which names no VMs, was checked only for a
# hold, and approved web-3 while it was one of the pool's 3 healthy members it could not spare.)
A_DAY_AHEAD = NOW + timedelta(days=1)
DRAIN_MOMENTS = {"DrainMomentsQueueName": "drain-moments"}


def link_token(app: App, world: dict[str, str], version: str) -> str:
    """C's Approve link as each version signs it: v3 from the card, v1 and v2 (signed before
    links named their VMs; v2 approves through ARM) as an old card had them."""
    if version == "v3":
        return card_token(app, scheduled(EVENT_C, ["web-3"], NotBefore=rfc1123(A_DAY_AHEAD)))
    target = world["web-1"] if version == "v2" else ""
    claims = tokens.ApprovalClaims(EVENT_C, "web-1", A_DAY_AHEAD, acknowledge_on=target)
    return tokens.sign(SIGNING_KEY.encode(), claims)


def rfc1123(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


def seen(app: App, message: Envelope) -> None:
    """What production does with C's Scheduled: lb-pools and the gate (manual) both get it."""
    app.deliver("lb_pools", message)
    app.deliver("approval_gate", message)


def held_state(app: App) -> None:
    hold_c(app)
    app.deliver("approval_gate", scheduled(EVENT_C, ["web-3"]))


def undecided(app: App) -> None:
    """Teams got C's card; lb-pools and the gate have not decided it yet (no claim, no
    record)."""
    app.deliver("teams", scheduled(EVENT_C, ["web-3"], NotBefore=rfc1123(A_DAY_AHEAD)))


def pending(app: App) -> None:
    """C's drain moment is a day ahead: nothing drained, nothing held (the reviewer's row)."""
    seen(app, scheduled(EVENT_C, ["web-3"], NotBefore=rfc1123(A_DAY_AHEAD)))


def drained(app: App) -> None:
    seen(app, scheduled(EVENT_C, ["web-3"]))


@dataclass(frozen=True)
class LinkCase:
    name: str
    settings: dict[str, str]
    state: Callable[[App], None]
    allowed: bool  # would the gate itself approve C early now?


LINK_CASES = [
    LinkCase("held", {"LB_MIN_HEALTHY": "1"}, held_state, False),
    LinkCase("undecided", {"LB_MIN_HEALTHY": "3"}, undecided, False),
    LinkCase("moment-pending", {"LB_MIN_HEALTHY": "3", **DRAIN_MOMENTS}, pending, False),
    LinkCase("drained", {"LB_MIN_HEALTHY": "1"}, drained, True),
    LinkCase("spare", {"LB_MIN_HEALTHY": "1", **DRAIN_MOMENTS}, pending, True),
]


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
@pytest.mark.parametrize("case", LINK_CASES, ids=[c.name for c in LINK_CASES])
def test_every_link_version_approves_only_what_the_gate_would(
    make_app: Callable[..., App], world: dict[str, str], case: LinkCase, version: str
) -> None:
    app = make_app(APPROVAL_POLICY=MANUAL, **case.settings)
    case.state(app)
    token = link_token(app, world, version)
    response = app.call("approve", http("POST", token, EVENT_C))
    page = response.get_body().decode()
    if not case.allowed:
        assert response.status_code == 409, page
        assert "Nothing was sent" in page
        assert not approved(app, EVENT_C), f"{version} link approved C ({case.name})"
        assert app.arm.vm_pools(world["web-3"]) or case.name == "held"
        return
    assert response.status_code == 200, page
    assert approved(app, EVENT_C)
    if case.name == "spare":  # still serving: counted as leaving, so web-2 may not drain now
        soon = rfc1123(NOW + timedelta(minutes=1))  # a short notice: decided at once
        app.deliver("lb_pools", scheduled(EVENT_B, ["web-2", "web-1"], NotBefore=soon))
        assert lowest_healthy(app.arm, world["pool-a"], len(VMS)) == len(VMS), "web-3 ignored"


def test_a_link_clicked_before_the_event_is_decided_says_so(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    app = make_app(APPROVAL_POLICY=MANUAL, LB_MIN_HEALTHY="3")
    undecided(app)
    response = app.call("approve", http("POST", link_token(app, world, "v1"), EVENT_C))
    assert response.status_code == 409
    assert "not decided this event yet" in response.get_body().decode()
    assert not approved(app, EVENT_C)
