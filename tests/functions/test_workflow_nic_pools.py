"""Pool planning on NIC documents and the compact tag record (pure, table-driven)."""

from __future__ import annotations

import copy

import pytest

from functions.lb_pools import nic_pools

SUB = "00000000-0000-4000-8000-000000000001"
NIC = f"/subscriptions/{SUB}/resourceGroups/rg-web/providers/Microsoft.Network/networkInterfaces/n1"


def pool(name: str, lb: str = "lb-web", group: str = "rg-web", sub: str = SUB) -> str:
    return (
        f"/subscriptions/{sub}/resourceGroups/{group}/providers/Microsoft.Network/"
        f"loadBalancers/{lb}/backendAddressPools/{name}"
    )


def nic(*configs: list[str], tags: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "id": NIC,
        "tags": tags if tags is not None else {"owner": "web"},
        "properties": {
            "ipConfigurations": [
                {
                    "name": f"ipconfig{i + 1}",
                    "properties": {"loadBalancerBackendAddressPools": [{"id": p} for p in c]},
                }
                for i, c in enumerate(configs)
            ]
        },
    }


@pytest.mark.parametrize(
    ("pool_id", "ref"),
    [
        (pool("a"), "lb-web/a"),
        (pool("a", group="RG-WEB"), "lb-web/a"),  # ARM ids compare case-insensitively
        (pool("a", group="rg-shared"), "rg-shared/lb-web/a"),
        (
            pool("a", sub="99999999-0000-4000-8000-000000000001"),
            pool("a", sub="99999999-0000-4000-8000-000000000001"),
        ),
    ],
)
def test_compact_refs_round_trip(pool_id: str, ref: str) -> None:
    assert nic_pools.compact_ref(pool_id, NIC) == ref
    assert nic_pools.expand_ref(ref, NIC).lower() == pool_id.lower()


def test_drain_removes_every_pool_and_records_it() -> None:
    before = nic([pool("a"), pool("b", group="rg-shared")], [pool("c")], [])
    change = nic_pools.plan_drain(before, NIC)
    assert change is not None
    assert nic_pools.pools_of(change.body) == {}
    assert change.body["tags"]["owner"] == "web"  # other tags are kept
    assert (
        change.body["tags"][nic_pools.TAG]
        == "ipconfig1=lb-web/a,rg-shared/lb-web/b;ipconfig2=lb-web/c"
    )
    assert nic_pools.decode_record(change.body["tags"], NIC) == nic_pools.pools_of(before)
    assert before["properties"]["ipConfigurations"][0]["properties"][
        "loadBalancerBackendAddressPools"
    ]  # type: ignore[index]


def test_drain_of_a_drained_nic_is_a_no_op() -> None:
    change = nic_pools.plan_drain(nic([pool("a")]), NIC)
    assert change is not None
    assert nic_pools.plan_drain(change.body, NIC) is None


def test_drain_merges_with_an_existing_record() -> None:
    """Someone re-added a pool between drain and restore: both end up recorded."""
    first = nic_pools.plan_drain(nic([pool("a")]), NIC)
    assert first is not None
    again = copy.deepcopy(first.body)
    again["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] = [
        {"id": pool("b")}
    ]
    second = nic_pools.plan_drain(again, NIC)
    assert second is not None
    assert nic_pools.decode_record(second.body["tags"], NIC) == {
        "ipconfig1": [pool("a"), pool("b")]
    }


def test_restore_puts_back_exactly_the_record_and_drops_the_tag() -> None:
    before = nic([pool("a"), pool("b")], [pool("c")])
    drained = nic_pools.plan_drain(before, NIC)
    assert drained is not None
    restored = nic_pools.plan_restore(drained.body, NIC)
    assert restored is not None
    assert nic_pools.pools_of(restored.body) == nic_pools.pools_of(before)
    assert restored.body["tags"] == {"owner": "web"}
    assert nic_pools.plan_restore(restored.body, NIC) is None  # replay: nothing left to do


def test_restore_does_not_duplicate_a_pool_that_is_back_already() -> None:
    drained = nic_pools.plan_drain(nic([pool("a"), pool("b")]), NIC)
    assert drained is not None
    body = copy.deepcopy(drained.body)
    body["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] = [
        {"id": pool("a").upper()}
    ]
    restored = nic_pools.plan_restore(body, NIC)
    assert restored is not None
    assert restored.pools == {"ipconfig1": [pool("b")]}
    assert len(nic_pools.pools_of(restored.body)["ipconfig1"]) == 2


def test_a_long_record_spans_several_tags_within_the_limit() -> None:
    many = [pool(f"pool-{i:02d}", lb=f"loadbalancer-{i:02d}") for i in range(20)]
    change = nic_pools.plan_drain(nic(many), NIC)
    assert change is not None
    record_tags = {k: v for k, v in change.body["tags"].items() if k.startswith(nic_pools.TAG)}
    assert len(record_tags) > 1
    assert all(len(v) <= nic_pools.TAG_VALUE_LIMIT for v in record_tags.values())
    assert nic_pools.decode_record(change.body["tags"], NIC) == {"ipconfig1": many}
    restored = nic_pools.plan_restore(change.body, NIC)
    assert restored is not None and not any(
        k.startswith(nic_pools.TAG) for k in restored.body["tags"]
    )


def test_a_record_too_large_for_the_tags_changes_nothing() -> None:
    other = "99999999-0000-4000-8000-000000000001"
    many = [pool(f"pool-{i:02d}", sub=other) for i in range(12)]  # full ids, ~170 chars each
    with pytest.raises(nic_pools.RecordTooLarge, match="tags hold 1024"):
        nic_pools.plan_drain(nic(many), NIC)


def test_an_unreadable_record_entry_is_skipped() -> None:
    tags = {nic_pools.TAG: "ipconfig1=lb-web/a,x/y/z/w;garbage;=lb/p"}
    assert nic_pools.decode_record(tags, NIC) == {
        "ipconfig1": [pool("a").replace("rg-web", "rg-web")]
    }


# ---- claims: which events have the NIC out ------------------------------------------------------


def test_claims_round_trip_and_overflow_refuses_before_any_change() -> None:
    from datetime import UTC, datetime

    until = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
    drained = nic_pools.plan_drain(nic([pool("a")]), NIC, nic_pools.Claim("A" * 8, until))
    assert drained is not None
    claims = nic_pools.decode_claims(drained.body["tags"])
    assert claims == {"aaaaaaaa": int(until.timestamp())}  # the id as in message ids
    many = {f"{n:08x}-0000-4000-8000-000000000000": 2_000_000_000 for n in range(11)}
    with pytest.raises(nic_pools.RecordTooLarge):
        nic_pools.encode_claims(many)
    # Ten claims fit (two tags), each ending in time: the NIC's own tags stay.
    tags = nic_pools.encode_claims(dict(list(many.items())[:10]))
    assert set(tags) == set(nic_pools.CLAIM_TAG_NAMES)
    assert nic_pools.decode_claims(tags) == dict(list(many.items())[:10])


def test_an_unreadable_claim_is_skipped_not_guessed() -> None:
    tags = {nic_pools.CLAIMS_TAG: "e1@100,garbage,@5,e2@x,e3@300"}
    assert nic_pools.decode_claims(tags) == {"e1": 100, "e3": 300}
    assert nic_pools.decode_claims({"owner": "web"}) is None
