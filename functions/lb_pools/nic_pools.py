"""Load balancer backend pool planning on a NIC document (pure).

Draining removes every ``loadBalancerBackendAddressPools`` entry from the NIC's ip
configurations and records what was removed in tags on the same NIC; restoring adds exactly
the recorded pools back and removes the tags. Both are idempotent: draining a drained NIC or
restoring a NIC without a record is a no-op, so replays and duplicate deliveries change nothing.

The record lives with the NIC, where it survives anything the Function App does. An ARM tag
value holds at most 256 characters and a pool's full resource id alone is ~170, so the record
is compact: ``ipconfig=ref,ref;ipconfig=ref`` where a ref is ``lb/pool`` for a load balancer in
the NIC's resource group, ``rg/lb/pool`` in its subscription, else the full id. A record longer
than one tag continues in ``sebridge-removed-pools-2`` .. ``-4`` (1,024 characters in all,
about 40 pools in the NIC's resource group). A record that still does not fit raises
:class:`RecordTooLarge`: the NIC is left untouched (never remove what we could not put back),
the VM counts as not prepared and the gate does not approve early for it.

Several events can have one VM out at once (a Freeze and a Reboot of the same VM, say). So the
NIC also says *for which events* it is out: ``sebridge-removed-for`` (and ``-2``) holds one
claim per event, ``<event>@<until>`` (the event in its verified scope,
``<EventId>.<placement digest>``: functions.shared.verified.scoped_event_key, so that another
scope's end of the same EventId never drops it; and until when, in Unix seconds, the event keeps
the VM down at the latest: functions.lb_pools.held.maintenance_until). A drain claims the NICs it
takes out, and an early approval claims the NICs of its VMs that are out already (for another
event, functions.lb_pools.guard), so that the other event's end does not put them back under it.
A drain adds its event's claim (also to a NIC already out for another event); the end of an
event removes its own claim, and the pools go back only when no other event's claim is still
live. A later drain of the same event pushes its claim later only when its end moved by more
than a quarter of an hour (:data:`CLAIM_SLACK_SECONDS`), so replays write nothing. A claim whose
time has passed is dropped (its event's end was lost: the VM is not kept out for ever). A
record without claims (written before claims existed) is restored by the first end, as before.
Record and claims change in one PUT with the NIC's ETag, so two events' drains and ends never
lose each other's claims.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from functions.shared.event_record import event_of
from sebridge.lifecycle import event_ref

TAG = "sebridge-removed-pools"
TAG_VALUE_LIMIT = 256
MAX_TAGS = 4
TAG_NAMES = (TAG, *(f"{TAG}-{n}" for n in range(2, MAX_TAGS + 1)))
POOL_PROVIDER = "providers/Microsoft.Network/loadBalancers/"
CLAIMS_TAG = "sebridge-removed-for"
CLAIM_TAG_NAMES = (CLAIMS_TAG, f"{CLAIMS_TAG}-2")
OUR_TAGS = (*TAG_NAMES, *CLAIM_TAG_NAMES)
# Half the margin a claim's time has beyond its event's end (held.MAINTENANCE_MARGIN, 30 min).
CLAIM_SLACK_SECONDS = 15 * 60

Record = dict[str, list[str]]  # ip configuration name -> backend pool ids
Claims = dict[str, int]  # event ref -> until when it keeps the VM down (Unix seconds)


class RecordTooLarge(ValueError):
    """The removed pools do not fit in the NIC's tags."""


@dataclass(frozen=True)
class Claim:
    """One event's hold on a drained NIC: the event (any spelling) and until when, at the
    latest, it keeps the VM down."""

    event_id: str
    until: datetime

    @property
    def ref(self) -> str:
        return event_ref(self.event_id)

    @property
    def until_seconds(self) -> int:
        return int(self.until.timestamp())


@dataclass(frozen=True)
class NicChange:
    body: dict[str, Any]  # the NIC to PUT
    pools: Record  # what is removed (drain) or added back (restore)
    skipped: Record = field(default_factory=dict)  # restore: recorded pools that are gone
    # restore: recorded ip configurations the NIC no longer has (replaced while it was out)
    vanished: Record = field(default_factory=dict)
    # restore: the NIC stays out, other events still have it out (their refs)
    kept_for: tuple[str, ...] = ()


def _segments(resource_id: str) -> list[str]:
    return resource_id.strip("/").split("/")


def _scope(nic_id: str) -> tuple[str, str]:
    """(subscription, resource group) of an ARM id, lower case."""
    parts = [p.lower() for p in _segments(nic_id)]
    try:
        return parts[parts.index("subscriptions") + 1], parts[parts.index("resourcegroups") + 1]
    except (ValueError, IndexError):
        return "", ""


def compact_ref(pool_id: str, nic_id: str) -> str:
    parts = _segments(pool_id)
    lower = [p.lower() for p in parts]
    if (
        len(parts) == 10
        and lower[0] == "subscriptions"
        and lower[2] == "resourcegroups"
        and lower[4:7] == ["providers", "microsoft.network", "loadbalancers"]
        and lower[8] == "backendaddresspools"
    ):
        subscription, group = _scope(nic_id)
        if lower[1] == subscription and lower[3] == group:
            return f"{parts[7]}/{parts[9]}"
        if lower[1] == subscription:
            return f"{parts[3]}/{parts[7]}/{parts[9]}"
    return "/" + "/".join(parts)


def expand_ref(ref: str, nic_id: str) -> str:
    if ref.startswith("/"):
        return ref
    parts = ref.split("/")
    head = _segments(nic_id)
    subscription, group = head[1], head[3]
    if len(parts) == 2:
        lb, pool = parts
    elif len(parts) == 3:
        group, lb, pool = parts
    else:
        raise ValueError(f"unreadable pool reference {ref!r}")
    return (
        f"/subscriptions/{subscription}/resourceGroups/{group}/{POOL_PROVIDER}{lb}"
        f"/backendAddressPools/{pool}"
    )


def encode_record(record: Record, nic_id: str) -> dict[str, str]:
    """The tags that hold ``record`` (``{}`` for an empty record)."""
    text = ";".join(
        f"{ipc}=" + ",".join(compact_ref(p, nic_id) for p in pools)
        for ipc, pools in sorted(record.items())
        if pools
    )
    if not text:
        return {}
    chunks = [text[i : i + TAG_VALUE_LIMIT] for i in range(0, len(text), TAG_VALUE_LIMIT)]
    if len(chunks) > MAX_TAGS:
        raise RecordTooLarge(
            f"the removed pools need {len(text)} characters; the tags hold "
            f"{TAG_VALUE_LIMIT * MAX_TAGS}"
        )
    return dict(zip(TAG_NAMES, chunks, strict=False))


def decode_record(tags: Mapping[str, Any] | None, nic_id: str) -> Record:
    """The record in a NIC's tags; an unreadable entry is skipped (never guessed)."""
    tags = tags or {}
    text = "".join(str(tags.get(name, "")) for name in TAG_NAMES)
    record: Record = {}
    for entry in filter(None, text.split(";")):
        ipc, sep, refs = entry.partition("=")
        if not sep or not ipc:
            continue
        for ref in filter(None, refs.split(",")):
            try:
                pool_id = expand_ref(ref, nic_id)
            except (ValueError, IndexError):
                continue
            record.setdefault(ipc, []).append(pool_id)
    return record


def encode_claims(claims: Claims) -> dict[str, str]:
    """The tags that hold ``claims`` (``{}`` for none)."""
    text = ",".join(f"{ref}@{until}" for ref, until in sorted(claims.items()))
    if not text:
        return {}
    chunks = [text[i : i + TAG_VALUE_LIMIT] for i in range(0, len(text), TAG_VALUE_LIMIT)]
    if len(chunks) > len(CLAIM_TAG_NAMES):
        raise RecordTooLarge(
            f"{len(claims)} events would have the NIC out at once; its tags hold "
            f"{TAG_VALUE_LIMIT * len(CLAIM_TAG_NAMES)} characters of claims"
        )
    return dict(zip(CLAIM_TAG_NAMES, chunks, strict=False))


def decode_claims(tags: Mapping[str, Any] | None) -> Claims | None:
    """The events that have the NIC out, or None when the NIC names none (a record written
    before claims, or no record). An unreadable claim is skipped."""
    tags = tags or {}
    if not any(name in tags for name in CLAIM_TAG_NAMES):
        return None
    text = "".join(str(tags.get(name, "")) for name in CLAIM_TAG_NAMES)
    claims: Claims = {}
    for entry in filter(None, text.split(",")):
        ref, sep, until = entry.partition("@")
        if sep and ref and until.isdigit():
            claims[ref] = max(claims.get(ref, 0), int(until))
    return claims


def _ip_configurations(nic: Mapping[str, Any]) -> list[dict[str, Any]]:
    configs = nic.get("properties", {}).get("ipConfigurations", [])
    return [c for c in configs if isinstance(c, dict)]


def pools_of(nic: Mapping[str, Any]) -> Record:
    """The backend pools each ip configuration is in now."""
    record: Record = {}
    for config in _ip_configurations(nic):
        pools = config.get("properties", {}).get("loadBalancerBackendAddressPools") or []
        ids = [p["id"] for p in pools if isinstance(p, dict) and isinstance(p.get("id"), str)]
        if ids:
            record[str(config.get("name", ""))] = ids
    return record


def in_any_pool(nic: Mapping[str, Any]) -> bool:
    return bool(pools_of(nic))


def _merge(first: Record, second: Record) -> Record:
    merged: Record = {k: list(v) for k, v in first.items()}
    for ipc, pools in second.items():
        known = {p.lower() for p in merged.get(ipc, [])}
        merged.setdefault(ipc, []).extend(p for p in pools if p.lower() not in known)
    return merged


def _set_tags(body: dict[str, Any], ours: dict[str, str], keep: tuple[str, ...] = ()) -> None:
    """Replace the bridge's tags (record and claims) with ``ours``, keeping those in ``keep``
    as they are; the NIC's other tags stay."""
    tags = {k: v for k, v in (body.get("tags") or {}).items() if k not in OUR_TAGS or k in keep}
    tags.update(ours)
    body["tags"] = tags


def _has_record(nic: Mapping[str, Any]) -> bool:
    return any(name in (nic.get("tags") or {}) for name in OUR_TAGS)


def plan_drain(nic: Mapping[str, Any], nic_id: str, claim: Claim | None = None) -> NicChange | None:
    """The NIC without pools, with the removal recorded and ``claim`` among its claims;
    ``None`` if nothing changes: in no pool and (without a record, or with the claim already
    there) nothing to claim."""
    current = pools_of(nic)
    claims = decode_claims(nic.get("tags"))
    merged: Claims = dict(claims or {})
    if claim is not None:
        held = merged.get(claim.ref)
        # A claim is pushed later only by more than CLAIM_SLACK_SECONDS (a NotBefore moved by
        # an hour, say), so that an Updated or a Started of the same event writes nothing new.
        if held is None or claim.until_seconds > held + CLAIM_SLACK_SECONDS:
            merged[claim.ref] = claim.until_seconds
    if not current:
        # Out already (for another event, or by hand): this event's claim keeps it out too.
        if claim is None or not _has_record(nic) or merged == (claims or {}):
            return None
        body = copy.deepcopy(dict(nic))
        _set_tags(body, encode_claims(merged), keep=TAG_NAMES)  # raises before any change
        return NicChange(body=body, pools={})
    record = _merge(decode_record(nic.get("tags"), nic_id), current)
    ours = {**encode_record(record, nic_id), **encode_claims(merged)}  # raise before a change
    body = copy.deepcopy(dict(nic))
    for config in _ip_configurations(body):
        props = config.get("properties", {})
        if props.get("loadBalancerBackendAddressPools"):
            props["loadBalancerBackendAddressPools"] = []
    _set_tags(body, ours)
    return NicChange(body=body, pools=current)


def out_for(nic: Mapping[str, Any], event_id: str) -> bool:
    """Is the NIC out of every pool *for* ``event_id`` (the event in its verified scope)? In
    no pool, and either never drained (no record: nothing puts it back), or drained with this
    event's claim (or a record from before claims): an early approval never counts on another
    event's drain, which that event's end undoes (hostile review of issue 23, round 2, break 2)."""
    if in_any_pool(nic):
        return False
    if not _has_record(nic):
        return True
    claims = decode_claims(nic.get("tags"))
    if claims is None:
        return True
    return bool({event_ref(event_id), event_ref(event_of(event_id))} & set(claims))


def recorded_pools(nic: Mapping[str, Any], nic_id: str) -> set[str]:
    """Every pool the NIC's record would put it back into (lower case)."""
    return {p.lower() for pools in decode_record(nic.get("tags"), nic_id).values() for p in pools}


def plan_restore(
    nic: Mapping[str, Any],
    nic_id: str,
    gone: Collection[str] = (),
    *,
    event_id: str | None = None,
    now: datetime | None = None,
) -> NicChange | None:
    """The NIC with the recorded pools back and the record gone; ``None`` without a record.
    Pools in ``gone`` (lower-case ids: deleted, with their load balancer or alone) are left out
    and named in ``skipped``: nothing could put the NIC back into them. Entries for an ip
    configuration the NIC no longer has (replaced while it was out) are named in ``vanished``:
    which configuration took its place is not ours to guess.

    ``event_id``: the event that ends. When another event's claim on the NIC is still live (at
    ``now``), the NIC stays out: only this event's claim (and expired ones) are dropped
    (``kept_for`` names the others; ``None`` when not even that changes)."""
    if not _has_record(nic):
        return None
    if event_id is not None:
        claims = decode_claims(nic.get("tags"))
        at = int((now or datetime.now(UTC)).timestamp())
        ending = event_ref(event_id)
        # A claim names its event in its verified scope (``<event>.<placement digest>``); one
        # without a scope (written before claims carried it) is the event's in any scope.
        legacy = event_ref(event_of(event_id))
        others = {
            ref: until for ref, until in (claims or {}).items() if ref not in (ending, legacy)
        }
        live = {ref: until for ref, until in others.items() if until > at}
        if live:
            if live == claims:
                return None
            body = copy.deepcopy(dict(nic))
            _set_tags(body, encode_claims(live), keep=TAG_NAMES)
            return NicChange(body=body, pools={}, kept_for=tuple(sorted(live)))
    record = decode_record(nic.get("tags"), nic_id)
    body = copy.deepcopy(dict(nic))
    added: Record = {}
    skipped: Record = {}
    present = {str(config.get("name", "")) for config in _ip_configurations(body)}
    vanished = {ipc: pools for ipc, pools in record.items() if ipc not in present}
    for config in _ip_configurations(body):
        name = str(config.get("name", ""))
        wanted = [p for p in record.get(name, []) if p.lower() not in gone]
        left_out = [p for p in record.get(name, []) if p.lower() in gone]
        if left_out:
            skipped[name] = left_out
        if not wanted:
            continue
        props = config.setdefault("properties", {})
        pools = props.get("loadBalancerBackendAddressPools") or []
        present = {p.get("id", "").lower() for p in pools if isinstance(p, dict)}
        missing = [p for p in wanted if p.lower() not in present]
        if missing:
            props["loadBalancerBackendAddressPools"] = [*pools, *({"id": p} for p in missing)]
            added[name] = missing
    _set_tags(body, {})
    return NicChange(body=body, pools=added, skipped=skipped, vanished=vanished)
