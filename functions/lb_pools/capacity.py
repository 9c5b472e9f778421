"""The capacity decision: never take a backend pool below its budget (core): ``LB_MIN_HEALTHY``
healthy members, and at most ``LB_MAX_UNAVAILABLE`` members unavailable (a count, or a percentage
of the pool's size), globally or per pool (``LB_POOL_BUDGETS``): :class:`Budgets`.

A budget of maximum unavailable members is a minimum too, once the pool's size is known: the
size is its members now and the members the bridge has out of it (kept in the pool's state,
functions.lb_pools.held ``out``), and a pool may keep ``size - maxUnavailable`` healthy members
at least (a percentage rounded up to whole members, as Kubernetes disruption budgets do). The
decision takes the larger of the two minimums.

Every path that removes capacity or starts maintenance early asks :func:`decide`: lb-pools
before it drains (Scheduled, Updated and Started alike), and the gate, the Approve link, the ARM
acknowledge, the agentless route and a VM-side Prepared before they approve
(functions.lb_pools.guard), each under the pools' leases (functions.adapters.pool_state).

A member of a pool is one NIC ip configuration in the pool's ``backendIPConfigurations``. It is
*healthy* when it is in the pool now (so not taken out by the bridge for another event), the
load balancer's own probe says ``Up`` for it on every load-balancing rule that covers the pool
(``POST .../loadBalancingRules/{rule}/health``, LoadBalancerLoadBalancingRules_Health; a pool
that no rule covers, an outbound-only pool say, counts its members), and no other event approved
early takes it down (the pool's leaving members, functions.lb_pools.held). Letting members go is
refused when it removes healthy ones and leaves fewer than the minimum; a member the probe
already reports Down never counts against the minimum (it serves nothing). An approval is also
refused while the event is held in one of its VMs' pools: it waits for lb-pools to drain it.

Pools given by IP address (``loadBalancerBackendAddresses`` without a NIC) are not counted: the
bridge never changes them, and ARM's pool document lists only NIC members in
``backendIPConfigurations``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from functions.lb_pools import nic_pools
from functions.shared.ports import ArmClient, ArmDocument, PermissionDenied
from functions.shared.vms import ResolvedVm

POOL_SEGMENT = "/backendaddresspools/"
# An LB_POOL_BUDGETS key, exactly as documented: ``load-balancer/pool`` or the pool's ARM id
# (Azure's names: letters, digits, ``_ . -``, starting with a letter or digit).
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.\-]{0,78}[A-Za-z0-9_])?"
_POOL_KEY = re.compile(
    rf"{_NAME}/{_NAME}"
    rf"|/subscriptions/[0-9A-Fa-f\-]{{36}}/resourceGroups/[\w.()\-]{{1,90}}"
    rf"/providers/Microsoft\.Network/loadBalancers/{_NAME}/backendAddressPools/{_NAME}",
    re.IGNORECASE,
)
_UNAVAILABLE = re.compile(r"[0-9]{1,6}%?", re.ASCII)

log = logging.getLogger("sebridge.functions.lb_pools")


@dataclass(frozen=True)
class PoolHealth:
    pool_id: str  # as ARM spells it
    members: frozenset[str]  # lower-case ip configuration ids in the pool now
    up: frozenset[str] | None  # members the probe reports Up on every covering rule; None: no rule
    reserved: frozenset[str] = frozenset()  # members other events approved early take down
    absent: frozenset[str] = frozenset()  # members the bridge has out of the pool (drained)

    @property
    def size(self) -> int:
        """Members now and those the bridge has out: what a percentage budget counts."""
        return len(self.members | self.absent)

    @property
    def healthy(self) -> frozenset[str]:
        serving = self.members if self.up is None else self.members & self.up
        return serving - self.reserved


@dataclass(frozen=True)
class Blocked:
    pool_id: str
    healthy_now: int
    healthy_after: int
    minimum: int

    def describe(self) -> str:
        return (
            f"taking them out would leave {short_pool(self.pool_id)} with {self.healthy_after} "
            f"healthy member(s) ({self.healthy_now} now), fewer than the minimum {self.minimum}"
        )


@dataclass(frozen=True)
class Budget:
    """One pool's disruption budget: a minimum of healthy members, and a maximum of members
    unavailable (None: no maximum), a count or (``percent``) a percentage of the pool's size."""

    min_healthy: int = 0
    max_unavailable: int | None = None
    percent: bool = False

    def minimum(self, size: int) -> int:
        """The fewest healthy members a pool of ``size`` members must keep."""
        floor = self.min_healthy
        if self.max_unavailable is not None:
            allowed = (
                math.ceil(size * self.max_unavailable / 100)
                if self.percent
                else self.max_unavailable
            )
            floor = max(floor, size - allowed)
        return floor

    def describe(self) -> str:
        parts = [f"minHealthy {self.min_healthy}"]
        if self.max_unavailable is not None:
            unit = "%" if self.percent else ""
            parts.append(f"maxUnavailable {self.max_unavailable}{unit}")
        return ", ".join(parts)

    @property
    def active(self) -> bool:
        return self.min_healthy > 0 or self.max_unavailable is not None


@dataclass(frozen=True)
class Budgets:
    """The budget of every pool: ``default`` (LB_MIN_HEALTHY, LB_MAX_UNAVAILABLE), and those
    LB_POOL_BUDGETS names (by the pool's ARM id, or ``load-balancer/pool``; lower case)."""

    default: Budget = field(default_factory=Budget)
    per_pool: Mapping[str, Budget] = field(default_factory=dict)

    def of(self, pool_id: str) -> Budget:
        """The budget of ``pool_id`` (a pool ARM reports). A pool that falls back to the default
        while an LB_POOL_BUDGETS key that never matched a pool names its load balancer or its
        pool name (``lb-wbe/pool-a`` for ``lb-web/pool-a``) gets a warning for that key, once
        per process."""
        lower = pool_id.lower()
        for key in (lower, short_pool(lower)):
            budget = self.per_pool.get(key)
            if budget is not None:
                _matched.add(key)
                return budget
        if self.per_pool:
            _warn_near_misses(self.per_pool, lower)
        return self.default

    @property
    def active(self) -> bool:
        return self.default.active or any(b.active for b in self.per_pool.values())

    @property
    def sized(self) -> bool:
        """Some budget counts members unavailable: the pools' state keeps what is out."""
        budgets = [self.default, *self.per_pool.values()]
        return any(b.max_unavailable is not None for b in budgets)


_matched: set[str] = set()  # LB_POOL_BUDGETS keys that named a pool ARM reported
_warned: set[str] = set()  # keys warned about (once per process)


def _warn_near_misses(per_pool: Mapping[str, Budget], pool_id: str) -> None:
    lb_name, pool_name = short_pool(pool_id).split("/", 1) if "/" in pool_id else ("", "")
    for key in per_pool:
        if key in _matched or key in _warned:
            continue
        key_lb, key_pool = short_pool(key).split("/", 1)
        near = key_lb == lb_name or key_pool == pool_name
        _warned.add(key)
        # Every key that has matched nothing when a pool falls back is named, a near miss
        # (lb-wbe/pool-a) or not (lbweb/poola): one line per key and process, so a key for a
        # pool not looked up yet costs one line, and a mistyped one is never silent.
        log.warning(
            "LB_POOL_BUDGETS %r has matched no pool ARM reported so far (%s gets the global "
            "budget): check the name%s",
            key,
            short_pool(pool_id),
            " (it looks like this pool's)" if near else "",
            extra={"setting": "LB_POOL_BUDGETS", "pool": pool_id},
        )


def parse_unavailable(text: str, where: str = "LB_MAX_UNAVAILABLE") -> tuple[int | None, bool]:
    """``"2"`` or ``"25%"`` (empty: no maximum); ValueError naming ``where``."""
    value = text.strip()
    if not value:
        return None, False
    percent = value.endswith("%")
    number = value[:-1] if percent else value
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if (
        not _UNAVAILABLE.fullmatch(value)
        or (percent and int(number) > 100)
        or int(number) > 100_000
    ):
        raise ValueError(
            f"{where}: {text!r} is not a count of members or a percentage (e.g. 2 or 25%)"
        )
    return int(number), percent


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (json.loads keeps the last of a repeated
    key silently: a pool named twice with two budgets would get the second)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"LB_POOL_BUDGETS {key!r}: the pool is named twice")
        found[key] = value
    return found


def parse_budgets(min_healthy: int, max_unavailable: str, per_pool: str) -> Budgets:
    """The budgets from LB_MIN_HEALTHY, LB_MAX_UNAVAILABLE and LB_POOL_BUDGETS (JSON: pool ->
    ``{"minHealthy": n, "maxUnavailable": "25%"}``); ValueError naming the setting."""
    count, percent = parse_unavailable(max_unavailable)
    default = Budget(min_healthy, count, percent)
    pools: dict[str, Budget] = {}
    if per_pool.strip():
        try:
            obj = json.loads(per_pool, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise ValueError(f"LB_POOL_BUDGETS: not JSON: {exc}") from None
        if not isinstance(obj, Mapping):
            raise ValueError("LB_POOL_BUDGETS: expected an object of pool -> budget")
        for key, spec in obj.items():
            where = f"LB_POOL_BUDGETS {key!r}"
            if (
                not isinstance(spec, Mapping)
                or not spec
                or set(spec)
                - {
                    "minHealthy",
                    "maxUnavailable",
                }
            ):
                raise ValueError(f"{where}: expected {{'minHealthy': n, 'maxUnavailable': ...}}")
            if not _POOL_KEY.fullmatch(key):
                raise ValueError(
                    f"{where}: name a pool exactly as 'load-balancer/pool' or by its ARM id "
                    "('/subscriptions/.../loadBalancers/LB/backendAddressPools/POOL'), without "
                    "spaces"
                )
            if key.lower() in pools or (
                # a short name and an ARM id of the same pool: which budget would it get?
                any(
                    short_pool(other) == short_pool(key.lower())
                    and (other.startswith("/") != key.startswith("/"))
                    for other in pools
                )
            ):
                raise ValueError(f"{where}: the pool is named twice")
            least = spec.get("minHealthy", min_healthy)
            if isinstance(least, bool) or not isinstance(least, int) or not 0 <= least <= 1000:
                raise ValueError(f"{where}: minHealthy must be a whole number from 0 to 1000")
            raw = spec.get("maxUnavailable", max_unavailable)
            if "maxUnavailable" in spec and not str(raw).strip():
                raise ValueError(
                    f"{where} maxUnavailable: empty; leave it out for LB_MAX_UNAVAILABLE, or "
                    "say 100% for no maximum"
                )
            count, percent = parse_unavailable(str(raw), f"{where} maxUnavailable")
            pools[key.lower()] = Budget(least, count, percent)
    return Budgets(default, pools)


def short_pool(pool_id: str) -> str:
    parts = pool_id.split("/")
    return f"{parts[-3]}/{parts[-1]}" if len(parts) >= 3 else pool_id


def load_balancer_of(pool_id: str) -> str:
    """The load balancer's id (lower case) from one of its pools' ids."""
    lower = pool_id.lower()
    at = lower.find(POOL_SEGMENT)
    return lower[:at] if at > 0 else ""


def _ids(items: object) -> list[str]:
    if not isinstance(items, list):
        return []
    return [i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str)]


def _props(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    props = obj.get("properties")
    return props if isinstance(props, Mapping) else {}


def pool_view(lb: Mapping[str, Any], pool_id: str) -> tuple[str, frozenset[str], list[str]]:
    """(pool id as ARM spells it, its members in lower case, the ids of the rules that cover
    it as ARM spells them)."""
    wanted = pool_id.lower()
    spelled, members, rules = pool_id, frozenset[str](), dict[str, str]()
    for pool in _props(lb).get("backendAddressPools") or []:
        if isinstance(pool, Mapping) and str(pool.get("id", "")).lower() == wanted:
            spelled = str(pool["id"])
            members = frozenset(
                i.lower() for i in _ids(_props(pool).get("backendIPConfigurations"))
            )
            rules.update((i.lower(), i) for i in _ids(_props(pool).get("loadBalancingRules")))
    for rule in _props(lb).get("loadBalancingRules") or []:
        if not isinstance(rule, Mapping) or not isinstance(rule.get("id"), str):
            continue
        props = _props(rule)
        single = props.get("backendAddressPool")
        targets = _ids(props.get("backendAddressPools")) + _ids([single] if single else [])
        if wanted in {t.lower() for t in targets}:
            rules[str(rule["id"]).lower()] = str(rule["id"])
    return spelled, members, [rules[key] for key in sorted(rules)]


def pool_exists(lb: Mapping[str, Any], pool_id: str) -> bool:
    """Does the load balancer document list the pool?"""
    wanted = pool_id.lower()
    return any(
        isinstance(pool, Mapping) and str(pool.get("id", "")).lower() == wanted
        for pool in _props(lb).get("backendAddressPools") or []
    )


def gone_pools(arm: ArmClient, pool_ids: Iterable[str]) -> set[str]:
    """The pools (lower case) that no longer exist: their load balancer answers 404, or no
    longer lists them. One GET per load balancer."""
    by_lb: dict[str, list[str]] = {}
    for pool_id in pool_ids:
        by_lb.setdefault(load_balancer_of(pool_id), []).append(pool_id.lower())
    gone: set[str] = set()
    for lb_id, pools in sorted(by_lb.items()):
        document = arm.get_load_balancer(lb_id) if lb_id else None
        gone.update(p for p in pools if document is None or not pool_exists(document.body, p))
    return gone


PROBE_MAX_AGE_SECONDS = 10.0  # a probe verdict older than this is asked for again


@dataclass
class Probes:
    """The load balancer's probe verdicts by rule, each with when it was asked for.

    The one freshness rule of every capacity decision (lb-pools' drains and the guard's early
    approvals alike): a verdict is reused only while it is at most ``max_age`` seconds old;
    an older one is asked for again. Verdicts are asked for before a decision waits for its
    pools' leases (the health API is a long-running call that must not lengthen the time a
    pool is locked), and a wait for a lease can be long (another instance's decision, a slow
    NIC write): a member probed Down during that wait must not still count as healthy."""

    clock: Callable[[], float] = time.monotonic
    max_age: float = PROBE_MAX_AGE_SECONDS
    verdicts: dict[str, dict[str, str]] = field(default_factory=dict)  # lower-case rule id ->
    asked_at: dict[str, float] = field(default_factory=dict)  # ip configuration -> Up/Down

    def of(self, arm: ArmClient, rule_id: str) -> dict[str, str]:
        """The rule's verdicts: the ones held if fresh enough, else ARM's answer now."""
        key = rule_id.lower()
        asked = self.asked_at.get(key)
        if key not in self.verdicts or asked is None or self.clock() - asked > self.max_age:
            asked = self.clock()
            self.verdicts[key] = arm.rule_health(rule_id)
            self.asked_at[key] = asked
        return self.verdicts[key]


@dataclass(frozen=True)
class Unreadable:
    """The pools' health could not be read: ARM refused the load balancer or its rule health
    (403). No retry grants the role, so the decision is "no" and the caller completes."""

    problem: str  # PermissionDenied's text: the missing permission and its scope


def measure(
    arm: ArmClient,
    pool_ids: Iterable[str],
    probes: Probes | None = None,
    reserved: Mapping[str, frozenset[str]] | None = None,
    absent: Mapping[str, frozenset[str]] | None = None,
) -> dict[str, PoolHealth]:
    """Health of each pool (keyed by lower-case id): one GET per load balancer (membership is
    always read now), one health query per covering rule unless ``probes`` holds a fresh enough
    verdict of that rule (:class:`Probes`: what is asked for is added to it). A load balancer
    that is gone leaves its pools empty. Raises PermissionDenied (ARM 403): callers ask
    :func:`measured`, which turns it into :class:`Unreadable`.

    Why the probe verdicts may come from a moment earlier while membership may not: lb-pools and
    the guard ask the (slow, long-running) health API before they wait for the pools' locks,
    and read membership under them. A member drained meanwhile is gone from the fresh
    membership; one put back meanwhile is missing from the older verdicts and counts as not
    healthy (the safe side); a member whose probe turned Down meanwhile is the one thing seen
    late, by at most :data:`PROBE_MAX_AGE_SECONDS` (older verdicts are asked for again).

    ``reserved``: lower-case pool id -> the members other events approved early take down
    (read from the pools' state under their leases); ``absent``: the members the bridge has out
    of each pool (its size for a budget of maximum unavailable members)."""
    probes = Probes() if probes is None else probes
    reserved = reserved or {}
    absent = absent or {}
    by_lb: dict[str, list[str]] = {}
    for pool_id in pool_ids:
        by_lb.setdefault(load_balancer_of(pool_id), []).append(pool_id)
    result: dict[str, PoolHealth] = {}
    for lb_id, pools in sorted(by_lb.items()):
        document = arm.get_load_balancer(lb_id) if lb_id else None
        for pool_id in pools:
            out = absent.get(pool_id.lower(), frozenset())
            if document is None:
                result[pool_id.lower()] = PoolHealth(pool_id, frozenset(), None, absent=out)
                continue
            spelled, members, rules = pool_view(document.body, pool_id)
            up: frozenset[str] | None = None
            for rule_id in rules:
                verdicts = probes.of(arm, rule_id)
                rule_up = frozenset(i for i, s in verdicts.items() if s.lower() == "up")
                up = rule_up if up is None else up & rule_up
            result[pool_id.lower()] = PoolHealth(
                spelled, members, up, reserved.get(pool_id.lower(), frozenset()), out - members
            )
    return result


def measured(
    arm: ArmClient,
    pool_ids: Iterable[str],
    probes: Probes | None = None,
    reserved: Mapping[str, frozenset[str]] | None = None,
    absent: Mapping[str, frozenset[str]] | None = None,
) -> dict[str, PoolHealth] | Unreadable:
    """:func:`measure`, or :class:`Unreadable` when ARM refuses the load balancer or a rule's
    health (a missing role: the README's ARM 403 rule, for every capacity decision)."""
    try:
        return measure(arm, pool_ids, probes, reserved, absent)
    except PermissionDenied as exc:
        return Unreadable(str(exc))


def first_blocked(
    health: Mapping[str, PoolHealth],
    leaving: Mapping[str, Iterable[str]],
    minimum: int | Budgets,
) -> Blocked | None:
    """The first pool (by id) that taking ``leaving`` out of would drain below its minimum
    (``minimum``, or the pool's budget for its size)."""
    for pool_id in sorted(leaving):
        pool = health.get(pool_id)
        if pool is None:
            continue
        going = {i.lower() for i in leaving[pool_id]}
        healthy = pool.healthy
        after = healthy - going
        least = minimum if isinstance(minimum, int) else minimum.of(pool.pool_id).minimum(pool.size)
        if going & healthy and len(after) < least:
            return Blocked(pool.pool_id, len(healthy), len(after), least)
    return None


def after_leaving(
    health: Mapping[str, PoolHealth], leaving: Mapping[str, Iterable[str]]
) -> dict[str, PoolHealth]:
    """``health`` as it will be once ``leaving`` (pool -> ip configurations) is out: how a batch
    of decisions counts the drains decided before the next one."""
    result = dict(health)
    for pool_id, ipcs in leaving.items():
        pool = result.get(pool_id)
        if pool is not None:
            going = {i.lower() for i in ipcs}
            result[pool_id] = PoolHealth(
                pool.pool_id, pool.members - going, pool.up, pool.reserved, pool.absent | going
            )
    return result


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` answered: allowed, or why not."""

    blocked: Blocked | None = None
    held_in: str = ""  # the pool whose held list holds the event (an approval waits for it)
    unreadable: str = ""  # the pools' health could not be read: the missing permission

    @property
    def allowed(self) -> bool:
        return self.blocked is None and not self.held_in and not self.unreadable

    def describe(self) -> str:
        if self.unreadable:
            return f"the pools' health cannot be read, so nothing leaves them: {self.unreadable}"
        if self.blocked is not None:
            return self.blocked.describe()
        if self.held_in:
            return (
                f"the event is held in {short_pool(self.held_in)}: lb-pools drains it once the "
                "pool has room, then it can be approved"
            )
        return "allowed"


def decide(
    health: Mapping[str, PoolHealth] | Unreadable,
    leaving: Mapping[str, Iterable[str]],
    minimum: int | Budgets,
    *,
    held_in: str = "",
) -> Decision:
    """The one capacity decision: may ``leaving`` (lower-case pool id -> ip configurations)
    stop serving now? ``health`` as measured under the pools' leases (:func:`measured`: a pool
    whose health cannot be read lets nothing go); ``held_in``: a pool whose held list names the
    event (for an approval: nothing held is approved early)."""
    if held_in:
        return Decision(held_in=held_in)
    if isinstance(health, Unreadable):
        return Decision(unreadable=health.problem)
    return Decision(blocked=first_blocked(health, leaving, minimum))


def ip_configuration_id(nic_id: str, name: str) -> str:
    return f"{nic_id}/ipConfigurations/{name}".lower()


def memberships(
    arm: ArmClient,
    vms: Iterable[ResolvedVm],
    *,
    skip_forbidden: bool = False,
    read: dict[str, ArmDocument] | None = None,
) -> dict[str, set[str]]:
    """Lower-case pool id -> the ip configurations of ``vms`` in it now (reads the NICs; what
    was read is kept in ``read``, by NIC id). PermissionDenied unless ``skip_forbidden``."""
    members: dict[str, set[str]] = {}
    for vm in vms:
        for nic_id in vm.nic_ids:
            try:
                nic = arm.get_nic(nic_id)
            except PermissionDenied:
                if not skip_forbidden:
                    raise
                continue
            if nic is None:
                continue
            if read is not None:
                read[nic_id] = nic
            for ipc, pools in nic_pools.pools_of(nic.body).items():
                for pool_id in pools:
                    members.setdefault(pool_id.lower(), set()).add(ip_configuration_id(nic_id, ipc))
    return members
