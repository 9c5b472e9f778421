"""Disruption budgets: LB_MAX_UNAVAILABLE (a count or a percentage of the pool's size) and
LB_POOL_BUDGETS per pool, decided by the one capacity decision beside LB_MIN_HEALTHY; held
events are released in NotBefore order as capacity returns. Through the function objects,
against the loopback ARM and blob storage."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from emulators.fakes.arm import FakeArm
from functions.lb_pools.capacity import Budget, Budgets, parse_budgets
from functions.shared.settings import SettingsError, load_settings
from tests.functions.support import RG, SUB, App, envelope, web_vm

pytestmark = pytest.mark.timeout(90)

IDS = {
    "x": "0A000000-0000-4000-8000-000000000001",
    "a": "0A000000-0000-4000-8000-000000000002",
    "b": "0A000000-0000-4000-8000-000000000003",
    "c": "0A000000-0000-4000-8000-000000000004",
}


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    """pool-a with eight members (no rule: every member counts as healthy)."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"])
    pool = f"{lb}/backendAddressPools/pool-a"
    vms = {f"web-{i}": web_vm(arm_fake, f"web-{i}", [pool]) for i in range(1, 9)}
    return {**vms, "pool": pool}


def _event(key: str, vm: str, not_before: str, transition: str = "Scheduled") -> object:
    status = "Started" if transition == "Completed" else "Scheduled"
    return envelope(
        transition,
        EventId=IDS[key],
        Resources=[vm],
        NotBefore=not_before if status == "Scheduled" else "",
        EventStatus=status,
    )


def _out(app: App, world: dict[str, str]) -> set[str]:
    return {vm for vm in world if vm.startswith("web-") and not app.arm.vm_pools(world[vm])}


def test_held_events_are_released_in_not_before_order_not_arrival_order(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    # At most one of the eight out at a time (the minimum of 1 alone would allow seven).
    app = make_app(LB_MAX_UNAVAILABLE="1")
    app.deliver("lb_pools", _event("x", "web-2", "Sun, 22 Nov 2026 01:40:00 GMT"))
    assert _out(app, world) == {"web-2"}
    # Held as they come: a (latest NotBefore), then b, then c (the earliest).
    app.deliver("lb_pools", _event("a", "web-3", "Sun, 22 Nov 2026 03:00:00 GMT"))
    app.deliver("lb_pools", _event("b", "web-4", "Sun, 22 Nov 2026 02:30:00 GMT"))
    app.deliver("lb_pools", _event("c", "web-5", "Sun, 22 Nov 2026 02:00:00 GMT"))
    assert _out(app, world) == {"web-2"}
    held = [m for m in app.publisher.published if m.subject == "Held"]
    assert len(held) == 3
    order = []
    for done, vm in (("x", "web-2"), ("c", "web-5"), ("b", "web-4"), ("a", "web-3")):
        app.deliver("lb_pools", _event(done, vm, "", "Completed"))
        out = _out(app, world)
        assert len(out) <= 1
        order.extend(sorted(out))
    assert order == ["web-5", "web-4", "web-3"]  # c, b, a: NotBefore order


def test_a_percentage_budget_counts_the_members_already_out(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    # 25% of eight: two may be out; the third is held although six healthy members remain.
    app = make_app(LB_MAX_UNAVAILABLE="25%")
    app.deliver("lb_pools", _event("x", "web-2", "Sun, 22 Nov 2026 01:40:00 GMT"))
    app.deliver("lb_pools", _event("a", "web-3", "Sun, 22 Nov 2026 01:40:00 GMT"))
    assert _out(app, world) == {"web-2", "web-3"}
    app.deliver("lb_pools", _event("b", "web-4", "Sun, 22 Nov 2026 01:40:00 GMT"))
    assert _out(app, world) == {"web-2", "web-3"}
    (held,) = [m for m in app.publisher.published if m.subject == "Held"]
    data = json.loads(held.body_bytes())["data"]["held"]
    assert (data["healthy"], data["minimum"]) == (5, 6)


def test_a_pool_budget_overrides_the_global_one(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    app = make_app(
        LB_MAX_UNAVAILABLE="1", LB_POOL_BUDGETS=json.dumps({"lb-web/pool-a": {"maxUnavailable": 3}})
    )
    for key, vm in (("x", "web-2"), ("a", "web-3"), ("b", "web-4"), ("c", "web-5")):
        app.deliver("lb_pools", _event(key, vm, "Sun, 22 Nov 2026 01:40:00 GMT"))
    assert _out(app, world) == {"web-2", "web-3", "web-4"}


@pytest.mark.parametrize(
    ("size", "budget", "minimum"),
    [
        (8, Budget(1, 2, False), 6),
        (8, Budget(1, 25, True), 6),
        (3, Budget(1, 50, True), 1),  # 1.5 rounds up to 2 out: Kubernetes' rounding
        (3, Budget(2, 50, True), 2),  # the larger minimum wins
        (4, Budget(0, 10, False), 0),
        (0, Budget(1, 1, False), 1),
    ],
)
def test_a_budget_is_a_minimum_for_the_pools_size(size: int, budget: Budget, minimum: int) -> None:
    assert budget.minimum(size) == minimum


def test_budgets_are_read_and_refused_by_name() -> None:
    budgets = parse_budgets(1, "25%", '{"lb-web/pool-a": {"maxUnavailable": 2}}')
    assert budgets.of("/x/loadBalancers/LB-WEB/backendAddressPools/Pool-A") == Budget(1, 2, False)
    assert budgets.of("/x/loadBalancers/lb-web/backendAddressPools/pool-b") == Budget(1, 25, True)
    assert Budgets().active is False and budgets.sized
    for bad, problem in (
        (("2.5", ""), "LB_MAX_UNAVAILABLE: '2.5' is not a count"),
        (("120%", ""), "LB_MAX_UNAVAILABLE: '120%'"),
        (("", "[1]"), "LB_POOL_BUDGETS: expected an object"),
        (("", '{"pool-a": {"maxUnavailable": 1}}'), "name a pool exactly as 'load-balancer/pool'"),
        (("", '{"lb/p": {"minHealthy": -1}}'), "minHealthy must be a whole number"),
        (("", '{"lb/p": {"maxUnavailable": "x"}}'), "maxUnavailable: 'x'"),
    ):
        with pytest.raises(ValueError, match=problem):
            parse_budgets(1, *bad)


@pytest.mark.parametrize(
    "key",
    [
        " lb-web/pool-a",
        "lb-web/pool-a ",
        "lb-web/backendAddressPools/pool-a",
        "lb web/pool-a",
        "/subscriptions/x/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/"
        "backendAddressPools/p",
    ],
)
def test_a_budget_key_must_name_a_pool_in_the_documented_form(key: str) -> None:
    # Before: accepted, and the pool silently got the global budget.
    with pytest.raises(ValueError, match=r"LB_POOL_BUDGETS .*name a pool exactly as"):
        parse_budgets(1, "", json.dumps({key: {"maxUnavailable": 0}}))


def test_a_key_that_matches_no_pool_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budgets = parse_budgets(1, "", '{"lb-wbe/pool-a": {"maxUnavailable": 0}}')
    pool = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/loadBalancers/"
    with caplog.at_level("WARNING", logger="sebridge.functions.lb_pools"):
        for _ in range(3):
            assert budgets.of(pool + "lb-web/backendAddressPools/pool-a") == Budget(1)
    warned = [r.getMessage() for r in caplog.records if "LB_POOL_BUDGETS" in r.getMessage()]
    assert len(warned) == 1 and "'lb-wbe/pool-a' has matched no pool" in warned[0]
    assert "looks like this pool's" in warned[0]


def test_a_key_that_names_no_pool_at_all_is_warned_about_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hostile review 29, break 3: a key wrong in both parts shared no name with the pool, and
    the near-miss rule never warned: the budget the operator meant silently never applied."""
    budgets = parse_budgets(1, "", '{"lbweb/poola": {"maxUnavailable": 1}}')
    pool = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/loadBalancers/"
    with caplog.at_level("WARNING", logger="sebridge.functions.lb_pools"):
        assert budgets.of(pool + "lb-web/backendAddressPools/pool-a") == Budget(1)
    warned = [r.getMessage() for r in caplog.records if "LB_POOL_BUDGETS" in r.getMessage()]
    assert len(warned) == 1 and "'lbweb/poola' has matched no pool" in warned[0]


@pytest.mark.parametrize(
    "spec",
    [
        '{"lb-web/pool-a": {"minHealthy": 1}, "LB-WEB/pool-a": {"minHealthy": 3}}',
        # Hostile review 29, break 2: json.loads kept the last of a repeated key silently, and
        # a short name beside the same pool's ARM id gave the pool the id's budget alone.
        '{"lb-web/pool-a": {"maxUnavailable": 1}, "lb-web/pool-a": {"maxUnavailable": "100%"}}',
        '{"lb-web/pool-a": {"maxUnavailable": 1}, '
        f'"/subscriptions/{SUB}/resourceGroups/rg/providers/'
        'Microsoft.Network/loadBalancers/lb-web/backendAddressPools/pool-a": '
        '{"maxUnavailable": "100%"}}',
    ],
)
def test_a_pool_named_twice_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="named twice"):
        parse_budgets(1, "", spec)


def test_two_load_balancers_of_one_name_in_two_groups_are_two_pools() -> None:
    ids = [
        f"/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Network/loadBalancers/lb-web/"
        "backendAddressPools/pool-a"
        for rg in ("rg-1", "rg-2")
    ]
    budgets = parse_budgets(1, "", json.dumps({i: {"minHealthy": n} for n, i in enumerate(ids)}))
    assert [budgets.of(i).min_healthy for i in ids] == [0, 1]


def test_an_empty_max_unavailable_in_a_pools_entry_is_refused() -> None:
    # Left out: the global setting. Empty: it silently meant "no maximum" for that pool.
    with pytest.raises(ValueError, match="maxUnavailable: empty"):
        parse_budgets(1, "1", '{"lb-web/pool-a": {"maxUnavailable": ""}}')
    assert parse_budgets(1, "1", '{"lb-web/pool-a": {"minHealthy": 2}}').per_pool[
        "lb-web/pool-a"
    ] == Budget(2, 1, False)


@pytest.mark.parametrize("value", ["\u00b2", "\uff11", "\u0662%", " 2 %", "2 5", "+2", "2%%"])
def test_max_unavailable_takes_only_ascii_n_or_n_percent(value: str) -> None:
    # Before: "\u00b2".isdigit() let it through to a raw "invalid literal for int()".
    with pytest.raises(ValueError, match=r"LB_MAX_UNAVAILABLE: .* is not a count"):
        parse_budgets(1, value, "")


def test_held_events_across_pools_are_released_in_one_not_before_order(
    make_app: Callable[..., App], arm_fake: FakeArm
) -> None:
    # pool-a: web-1,2,3; pool-b: web-1,2,4. "late" is held in pool-a, "early" in pool-b; when
    # web-1 comes back both pools have room for one: the earlier NotBefore goes first (before:
    # pool by pool, pool-a's "late" first, and "early" stayed held).
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a", "pool-b"])
    a, b = f"{lb}/backendAddressPools/pool-a", f"{lb}/backendAddressPools/pool-b"
    vms = {
        "web-1": web_vm(arm_fake, "web-1", [a, b]),
        "web-2": web_vm(arm_fake, "web-2", [a, b]),
        "web-3": web_vm(arm_fake, "web-3", [a]),
        "web-4": web_vm(arm_fake, "web-4", [b]),
    }
    app = make_app(LB_MIN_HEALTHY="2")
    app.deliver("lb_pools", _event("x", "web-1", "Sun, 22 Nov 2026 01:40:00 GMT"))
    app.deliver("lb_pools", _event("a", "web-2", "Sun, 22 Nov 2026 05:00:00 GMT"))
    app.deliver("lb_pools", _event("c", "web-4", "Sun, 22 Nov 2026 02:00:00 GMT"))
    assert _out(app, vms) == {"web-1"}
    app.deliver("lb_pools", _event("x", "web-1", "", "Completed"))
    assert _out(app, vms) == {"web-4"}


def test_a_bad_budget_stops_the_app_at_start(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch, world: dict[str, str]
) -> None:
    import os

    app = make_app()
    assert app is not None
    env = dict(os.environ, LB_MAX_UNAVAILABLE="most")
    with pytest.raises(SettingsError, match="LB_MAX_UNAVAILABLE: 'most'"):
        load_settings(env)
