"""The emulator's pure core, without the network: SQL filters, durations, config validation,
and broker timing (locks, sessions, TTL, duplicate window) under a driven clock.

These check the local emulator itself; they run in every mode because they need no namespace.
"""

from __future__ import annotations

import copy
import json
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest

from emulators.servicebus import amqpbytes, decimals
from emulators.servicebus.broker import (
    LockLost,
    Namespace,
    SessionCannotBeLocked,
)
from emulators.servicebus.codec import Sections
from emulators.servicebus.config import (
    ConfigError,
    load_config,
    parse_config,
    with_max_message_size,
)
from emulators.servicebus.durations import DurationError, parse_duration
from emulators.servicebus.frames import FrameRewriter
from emulators.servicebus.sqlfilter import FilterSyntaxError, MessageFacts, compile_sql_filter

CONFIG = Path(__file__).with_name("Config.json")
PROJECT_CONFIG = (
    Path(__file__).resolve().parents[2] / "infra" / "servicebus-emulator" / "Config.json"
)

FACTS = MessageFacts(
    {"transition": "Scheduled", "n": 5, "ratio": 0.5, "flag": True, "vm": "web_01", "pct": "50%"},
    {"subject": "Scheduled", "message_id": "e1:Scheduled", "session_id": "e1", "to": "x"},
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("transition = 'Scheduled'", True),
        ("transition <> 'Scheduled'", False),
        ("transition != 'Started'", True),
        ("n > 4 AND n < 6 AND n >= 5 AND n <= 5", True),
        ("ratio = 0.5", True),
        ("n = 5.0", True),
        ("n > -1", True),
        ("flag = TRUE", True),
        ("flag = FALSE", False),
        ("transition IN ('Started', 'Scheduled')", True),
        ("transition NOT IN ('Started', 'Scheduled')", False),
        ("vm LIKE 'web%'", True),
        ("vm LIKE 'web_01'", True),
        ("vm LIKE 'web!_0_' ESCAPE '!'", True),
        ("vm LIKE 'webx%' ", False),
        ("vm NOT LIKE 'db%'", True),
        ("pct LIKE '50!%' ESCAPE '!'", True),
        ("missing IS NULL", True),
        ("missing IS NOT NULL", False),
        ("missing = 'x'", False),
        ("NOT (missing = 'x')", False),  # unknown stays unknown
        ("missing = 'x' OR n = 5", True),
        ("(transition = 'Started' OR transition = 'Scheduled') AND NOT flag = FALSE", True),
        ("user.transition = 'Scheduled'", True),
        ("[transition] = 'Scheduled'", True),
        ("sys.Label = 'Scheduled' AND sys.MessageId LIKE 'e1:%'", True),
        ("sys.SessionId = 'e1' AND sys.To = 'x' AND sys.ReplyTo IS NULL", True),
        ("sys.CorrelationId IS NULL AND sys.ContentType IS NULL", True),
        ("n = '5'", False),  # no implicit conversion between numbers and strings
        ("1=1", True),
        ("TRUE", True),
        ("transition = 'it''s'", False),
    ],
)
def test_sql_filter_evaluation(expression: str, expected: bool) -> None:
    assert compile_sql_filter(expression).matches(FACTS) is expected


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "n +",
        "n + 1 = 6",
        "EXISTS(n)",
        "n BETWEEN 1 AND 2",
        "sys.Nope = 1",
        "other.n = 1",
        "n = ",
        "(n = 1",
        "n IN ()",
        "n LIKE 5",
        "n = 1 n = 2",
        "vm LIKE 'a' ESCAPE 'ab'",
        "n ~ 1",
    ],
)
def test_sql_filter_rejects_unsupported_syntax(expression: str) -> None:
    with pytest.raises(FilterSyntaxError):
        compile_sql_filter(expression)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT1M", 60),
        ("P1D", 86400),
        ("P7D", 604800),
        ("PT1H", 3600),
        ("PT1H30M", 5400),
        ("PT2S", 2),
        ("PT0.5S", 0.5),
        ("P1W", 604800),
        ("P1DT2H", 93600),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "P", "PT", "1M", "P1M", "P1Y", "PT-1S", "00:01:00", "P1DT"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def test_project_and_contract_configs_load() -> None:
    project = load_config(PROJECT_CONFIG)
    assert [q.name for q in project.queues] == ["approvals", "drain-moments"]
    assert project.queues[0].receiving.requires_session
    assert not project.queues[1].receiving.requires_session  # lb-pools' scheduled drains
    (topic,) = project.topics
    assert {s.name for s in topic.subscriptions} == {
        "teams",
        "lb-pools",
        "approval-gate",
        "webhooks",
        "audit",
        "history",
    }
    assert load_config(CONFIG).queues


def _with(change: Any) -> dict[str, Any]:
    document = json.loads(CONFIG.read_text())
    change(document["UserConfig"]["Namespaces"][0])
    return document


def _queue_props(ns: dict[str, Any]) -> dict[str, Any]:
    return ns["Queues"][0]["Properties"]


def _first_rule(ns: dict[str, Any]) -> dict[str, Any]:
    return ns["Topics"][0]["Subscriptions"][1]["Rules"][0]["Properties"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ns: _queue_props(ns).update(Bogus=1), "unsupported keys ['Bogus']"),
        (lambda ns: _queue_props(ns).update(LockDuration="1 minute"), "LockDuration"),
        (lambda ns: _queue_props(ns).update(ForwardTo="elsewhere"), "ForwardTo is not supported"),
        (lambda ns: _queue_props(ns).update(MaxDeliveryCount=0), "MaxDeliveryCount"),
        (lambda ns: _queue_props(ns).update(RequiresSession="yes"), "RequiresSession"),
        (lambda ns: _first_rule(ns)["SqlFilter"].update(SqlExpression="a +"), "SQL filter"),
        (lambda ns: _first_rule(ns).update(Action={"SqlExpression": "SET x = 1"}), "actions"),
        (lambda ns: _first_rule(ns).update(FilterType="Magic"), "FilterType"),
        (lambda ns: ns["Queues"].append(copy.deepcopy(ns["Queues"][0])), "used twice"),
        (
            lambda ns: _queue_props(ns).update(MaxMessageSizeInKilobytes=2048),
            "MaxMessageSizeInKilobytes needs the Premium tier",
        ),
        (
            lambda ns: (
                ns.update(Tier="Premium") or _queue_props(ns).update(MaxMessageSizeInKilobytes=512)
            ),
            "MaxMessageSizeInKilobytes must be an integer in 1024..102400",
        ),
    ],
)
def test_config_refuses_what_it_cannot_honour(change: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_with(change))
    assert message in str(caught.value)
    # the error names the entity it is about
    assert "contract-" in str(caught.value) or "used twice" in message


def test_tier_decides_the_size_limits_and_the_flag_only_lowers_them() -> None:
    standard = load_config(CONFIG)
    assert standard.tier == "Standard"
    queue = standard.queues[0].sending
    assert (queue.max_message_size, queue.max_batch_size) == (262144, 262144)

    def premium(ns: dict[str, Any]) -> None:
        ns["Tier"] = "Premium"
        _queue_props(ns)["MaxMessageSizeInKilobytes"] = 4096

    config = parse_config(_with(premium))
    big, default = config.queues[0].sending, config.queues[1].sending
    assert (big.max_message_size, big.max_batch_size) == (4096 * 1024, 1024 * 1024)
    assert (default.max_message_size, default.max_batch_size) == (1024 * 1024, 1024 * 1024)
    with pytest.raises(ConfigError, match="Tier"):
        parse_config(_with(lambda ns: ns.update(Tier="Basic")))

    lowered = with_max_message_size(standard, 2048)
    assert {(q.sending.max_message_size, q.sending.max_batch_size) for q in lowered.queues} == {
        (2048, 2048)
    }
    assert lowered.topics[0].sending.max_batch_size == 2048
    for bad in (100, 262145):
        with pytest.raises(ConfigError, match="can only be lowered"):
            with_max_message_size(standard, bad)


def _sections(
    message_id: str | None = None,
    session_id: str | None = None,
    ttl_ms: int | None = None,
    **app: Any,
) -> Sections:
    properties: list[Any] = [None] * 13
    properties[0] = message_id or str(uuid.uuid4())
    properties[10] = session_id
    return Sections(header=[True, None, ttl_ms, None, None], properties=properties, application=app)


@pytest.fixture
def ns() -> Namespace:
    return Namespace(load_config(CONFIG))


def test_lock_expiry_redelivers_then_dead_letters(ns: Namespace) -> None:
    queue = ns.queues["contract-short-lock"]  # PT5S, MaxDeliveryCount 2
    owner = object()
    queue.accept(_sections("m"), now=100.0)
    first = queue.store.acquire(100.0, owner, peek_lock=True)
    assert first is not None and first.locked_until == 105.0
    assert queue.store.acquire(100.5, owner, peek_lock=True) is None  # locked
    queue.store.tick(105.0)
    second = queue.store.acquire(105.1, owner, peek_lock=True)
    assert second is first and second.delivery_count == 1
    with pytest.raises(LockLost):
        queue.store.complete(uuid.uuid4(), 105.2)
    queue.store.tick(110.2)
    assert queue.store.acquire(110.3, owner, peek_lock=True) is None
    dead = queue.store.dead_letter_queue.acquire(110.3, owner, peek_lock=False)
    assert dead is not None and dead.sections.properties[0] == "m"
    assert b"MaxDeliveryCountExceeded" in dead.application_bytes()


def test_renewed_lock_survives_the_original_deadline(ns: Namespace) -> None:
    store = ns.queues["contract-short-lock"].store
    ns.queues["contract-short-lock"].accept(_sections("r"), now=0.0)
    message = store.acquire(0.0, "o", peek_lock=True)
    assert message is not None and message.lock_token is not None
    assert store.renew_lock(message.lock_token, 4.5) == 9.5
    store.tick(6.0)
    store.complete(message.lock_token, 7.0)
    assert store.messages == {}


def test_ttl_sweep_dead_letters_without_a_receiver(ns: Namespace) -> None:
    queue = ns.queues["contract-ttl"]
    queue.accept(_sections("t", ttl_ms=1000), now=10.0)
    queue.store.tick(10.5)
    assert len(queue.store.messages) == 1
    queue.store.tick(11.0)
    assert queue.store.messages == {}
    dead = queue.store.dead_letter_queue.acquire(11.0, "o", peek_lock=False)
    assert dead is not None and b"TTLExpiredException" in dead.application_bytes()


def test_duplicate_window_forgets_after_it_passes(ns: Namespace) -> None:
    queue = ns.queues["contract-dedup"]  # PT20S
    assert queue.accept(_sections("same"), now=0.0) is not None
    assert queue.accept(_sections("same"), now=19.9) is None
    assert queue.accept(_sections("same"), now=20.1) is not None
    assert len(queue.store.messages) == 2


def test_sessions_are_exclusive_and_expire(ns: Namespace) -> None:
    queue = ns.queues["contract-sessions"]  # PT5S
    store = queue.store
    queue.accept(_sections(session_id="a"), now=0.0)
    queue.accept(_sections(session_id="b"), now=0.0)
    first = store.accept_session(None, "r1", 0.0)
    second = store.accept_session(None, "r2", 0.0)
    assert first is not None and second is not None
    assert {first.session_id, second.session_id} == {"a", "b"}
    assert store.accept_session(None, "r3", 0.0) is None  # both locked
    with pytest.raises(SessionCannotBeLocked):
        store.accept_session("a", "r3", 1.0)
    message = store.acquire(1.0, first.owner, peek_lock=True, session_id=first.session_id)
    assert message is not None
    lost = store.tick(5.0)
    assert sorted(sid for _, sid in lost) == ["a", "b"]
    again = store.accept_session(first.session_id, "r3", 5.1)
    assert again is not None
    redelivered = store.acquire(5.1, "r3", peek_lock=True, session_id=first.session_id)
    assert redelivered is message and redelivered.delivery_count == 1


def test_topic_routes_by_rules(ns: Namespace) -> None:
    topic = ns.topics["contract-topic"]
    topic.accept(_sections("x", transition="Scheduled", durationInSeconds=60), now=0.0)
    counts = {name: len(sub.store.messages) for name, sub in topic.subscriptions.items()}
    assert counts["all"] == 1 and counts["sql-in"] == 1 and counts["correlation"] == 0


def test_addresses_resolve_case_insensitively(ns: Namespace) -> None:
    assert ns.resolve("amqps://127.0.0.1:5671/Contract-Queue").store is not None
    dlq = ns.resolve("contract-topic/Subscriptions/all/$DeadLetterQueue").store
    assert dlq is not None and dlq.is_dead_letter_queue
    assert ns.resolve("contract-queue/$management").management
    with pytest.raises(Exception, match="could not be found"):
        ns.resolve("contract-topic/Subscriptions/nope")


# -- frames.FrameRewriter: out-of-order delivery-ids from a multi-threaded client ---------------


def _frame(code: int, fields: list[bytes], channel: int = 1, payload: bytes = b"") -> bytes:
    body = bytes([0x00, 0x53, code]) + amqpbytes.encode_list(fields) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def _transfer(
    delivery_id: int, handle: int = 0, more: bool = False, settled: bool = False
) -> bytes:
    flag = [bytes([0x42]), bytes([0x41])]
    fields = [amqpbytes.encode_uint(handle), amqpbytes.encode_uint(delivery_id)]
    fields += [b"\xa0\x01t", amqpbytes.encode_uint(0), flag[settled], flag[more]]
    return _frame(0x14, fields, payload=b"payload")


def _delivery_ids(stream: bytes, code: int) -> list[tuple[int, int | None]]:
    """(field 1, field 2) of every ``code`` performative in a frame stream."""
    found = []
    at = 0
    while at < len(stream):
        size = struct.unpack_from(">I", stream, at)[0]
        frame = stream[at : at + size]
        if frame[10] == code:
            items = [frame[a:b] for a, b in amqpbytes.elements(frame, 11)]
            second = amqpbytes.read_uint(items[2], 0) if code == 0x15 else None
            found.append((amqpbytes.read_uint(items[1], 0), second))
        at += size
    return found


def _opened_rewriter() -> FrameRewriter:
    rewriter = FrameRewriter("test")
    begin = _frame(0x11, [bytes([0x40]), amqpbytes.encode_uint(0), amqpbytes.encode_uint(100)])
    assert rewriter.from_client(b"AMQP\x00\x01\x00\x00" + begin).endswith(begin)
    broker_begin = _frame(0x11, [b"\x60\x00\x01", amqpbytes.encode_uint(0)], channel=0)
    assert rewriter.from_broker(b"AMQP\x00\x01\x00\x00" + broker_begin).endswith(broker_begin)
    return rewriter


def test_out_of_order_transfers_are_renumbered_and_dispositions_mapped_back() -> None:
    rewriter = _opened_rewriter()
    # two threads raced: ids 1, 0, then 1 again (a repeated id), then 3
    sent = b"".join(_transfer(i) for i in (1, 0, 1, 3))
    forwarded = rewriter.from_client(sent)
    assert [first for first, _ in _delivery_ids(forwarded, 0x14)] == [0, 1, 2, 3]
    assert forwarded.count(b"payload") == 4
    # the broker settles 0..3 in one range: the client hears about its own ids
    flag_true = bytes([0x41])
    disposition = _frame(
        0x15,
        [flag_true, amqpbytes.encode_uint(0), amqpbytes.encode_uint(3), flag_true, b"\x40"],
        channel=0,
    )
    back = rewriter.from_broker(disposition)
    assert _delivery_ids(back, 0x15) == [(1, 1), (0, 1), (3, 3)]
    # settled: the mapping is gone, later dispositions pass through untouched
    assert rewriter.from_broker(disposition) == disposition


def test_in_order_multi_frame_transfers_pass_through_byte_for_byte() -> None:
    rewriter = _opened_rewriter()
    frames = [_transfer(0, more=True), _transfer(0), _transfer(1, handle=2)]
    # split at arbitrary points: the rewriter reassembles frames across reads
    stream = b"".join(frames)
    out = b"".join(rewriter.from_client(stream[i : i + 7]) for i in range(0, len(stream), 7))
    assert out == stream
    assert rewriter.renumbered == 0


def test_frames_after_the_client_ended_its_session_are_dropped() -> None:
    rewriter = _opened_rewriter()
    end = _frame(0x17, [])
    detach = _frame(0x16, [amqpbytes.encode_uint(0), bytes([0x41])])
    assert rewriter.from_client(end + detach) == end
    close = _frame(0x18, [], channel=0)
    assert rewriter.from_client(close) == close


def test_unparseable_bytes_are_handed_on_untouched() -> None:
    rewriter = FrameRewriter("test")
    garbage = b"AMQP\x00\x01\x00\x00" + b"\x00\x00\x00\x02" + b"\xff" * 40
    assert rewriter.from_client(garbage) == garbage
    assert rewriter.from_client(b"more") == b"more"


@pytest.mark.parametrize(
    ("value", "sent", "delivered"),
    [
        # what azure-servicebus sends (IEEE 754 decimal128) -> what Service Bus delivers
        ("1.5", "94303e000000000000000000000000000f", "940c3e000000000000000000000000000f"),
        ("1.2345", "9430380000000000000000000000003039", "940c380000000000000000000000003039"),
        ("-7.5", "94b03e000000000000000000000000004b", "948c3e000000000000000000000000004b"),
        ("12E+2", "943044000000000000000000000000000c", "940c4000000000000000000000000004b0"),
    ],
)
def test_decimals_are_re_encoded_as_service_bus_does(value: str, sent: str, delivered: str) -> None:
    from decimal import Decimal

    from azure.servicebus._pyamqp._decode import _decode_decimal128
    from azure.servicebus._pyamqp._encode import encode_decimal128

    encoded = bytearray()
    encode_decimal128(encoded, Decimal(value))
    assert bytes(encoded).hex() == sent
    assert decimals.as_servicebus(bytes(encoded)).hex() == delivered
    # and the SDK's own decoder reads the delivered form back as the value that was sent
    _rest, decoded = _decode_decimal128(memoryview(bytes.fromhex(delivered)[1:]))
    assert decoded == Decimal(value)


def test_decimals_service_bus_cannot_hold_are_refused() -> None:
    with pytest.raises(decimals.DecimalError, match="scale"):
        decimals.as_servicebus(bytes.fromhex("94") + bytes.fromhex("2ffe") + bytes(14))
    too_big = bytes.fromhex("94") + bytes.fromhex("3042") + b"\x00\x00" + b"\xff" * 12
    with pytest.raises(decimals.DecimalError, match="overflows"):
        decimals.as_servicebus(too_big)


def test_byte_level_decoder_reads_what_proton_refuses_and_agrees_elsewhere() -> None:
    from proton import UNDESCRIBED, Array, Data, symbol, timestamp

    from emulators.servicebus.codec import decode_value

    token = uuid.uuid4()
    value = {
        "sequence-numbers": Array(UNDESCRIBED, Data.LONG, 1, 300, 2**40),
        "symbol": symbol("com.microsoft:x"),
        "binary": b"\x00\xff",
        "none": None,
        "list": [1, "a", [True, False]],
        "token": token,
        "when": timestamp(1_700_000_000_000),
    }
    data = Data()
    data.put_object(value)
    encoded = data.encode()
    decoded, end = amqpbytes.decode(encoded)
    assert end == len(encoded)
    assert list(decoded["sequence-numbers"].elements) == [1, 300, 2**40]
    assert {k: v for k, v in decoded.items() if k != "sequence-numbers"} == {
        k: v for k, v in value.items() if k != "sequence-numbers"
    }
    # an array of nulls (azure-servicebus's "lock-tokens": [None]): proton cannot, we can
    nulls = bytes.fromhex("c11202a10b6c6f636b2d746f6b656e73e0010140")
    with pytest.raises(Exception):  # noqa: B017 - proton's DataException family
        Data().decode(nulls)
    assert list(decode_value(nulls)[0]["lock-tokens"].elements) == [None]
