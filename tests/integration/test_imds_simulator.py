"""The IMDS simulator as a real process, over real HTTP with ``requests`` (loopback only)."""

from __future__ import annotations

import email.utils
import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from emulators.imds.testing import (
    RunningSimulator,
    in_process_simulator,
    running_simulator,
)
from tests.support.waiting import wait_until

API = "api-version=2020-07-01"
H = {"Metadata": "true"}
LIVE_MIGRATION_ID = "661abb8d-8f6c-46e9-9f65-447173353f51"
USER_REBOOT_ID = "614cb437-89a4-491a-a160-bf8dc81fe15a"

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSimulator]:
    with running_simulator("user-reboot", speed=1) as running:
        yield running


@pytest.fixture
def fresh(sim: RunningSimulator) -> RunningSimulator:
    """The shared simulator, restarted on user-reboot at speed 1 with no faults."""
    sim.load_scenario("user-reboot", speed=1)
    return sim


def se_url(sim: RunningSimulator, vm: str | None = None, query: str = API) -> str:
    return sim.url("/metadata/scheduledevents", vm) + (f"?{query}" if query else "")


def approve_body(event_id: str) -> str:
    return json.dumps({"StartRequests": [{"EventId": event_id}]})


# ---------------------------------------------------------------------------------------------
# Protocol checks


def test_listens_on_loopback_only(sim: RunningSimulator) -> None:
    assert sim.base_url == f"http://127.0.0.1:{sim.port}"
    # /proc/net/tcp lists listening sockets (state 0A) as hex addr:port; 0100007F is 127.0.0.1.
    port_hex = f"{sim.port:04X}"
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and local.endswith(f":{port_hex}"):
                listening.append(local)
    assert listening == [f"0100007F:{port_hex}"]


def test_metadata_header_is_required(fresh: RunningSimulator) -> None:
    for method in ("GET", "POST"):
        response = requests.request(method, se_url(fresh), data="{}", timeout=5)
        assert response.status_code == 400
        assert response.json() == {"error": "Bad request. Required metadata header not specified"}
    wrong = requests.get(se_url(fresh), headers={"Metadata": "false"}, timeout=5)
    assert wrong.status_code == 400
    # IMDS treats the header value case-insensitively
    assert requests.get(se_url(fresh), headers={"Metadata": "True"}, timeout=5).status_code == 200


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("", 400),
        ("api-version=", 400),
        ("api-version=2099-01-01", 400),
        ("api-version=latest", 400),
        ("api-version=2019-08-01", 200),
        ("api-version=2020-07-01", 200),
    ],
)
def test_api_version(fresh: RunningSimulator, query: str, status: int) -> None:
    response = requests.get(se_url(fresh, query=query), headers=H, timeout=5)
    assert response.status_code == status
    body = response.json()
    if status == 400:
        assert "api-version" in body["error"] and "2020-07-01" in body["newest-versions"]
    else:
        assert set(body) == {"DocumentIncarnation", "Events"}


def test_keep_alive_serves_many_requests_on_one_connection(fresh: RunningSimulator) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", fresh.port, timeout=5)
    try:
        sockets = set()
        for _ in range(5):
            conn.request("GET", f"/metadata/scheduledevents?{API}", headers=H)
            response = conn.getresponse()
            body = response.read()
            assert response.status == 200 and not response.will_close
            assert int(response.getheader("Content-Length", "-1")) == len(body)
            sockets.add(id(conn.sock))
        # a 400 with a body must not break the connection either
        conn.request("POST", f"/metadata/scheduledevents?{API}", body=b"not json", headers=H)
        response = conn.getresponse()
        response.read()
        assert response.status == 400 and not response.will_close
        sockets.add(id(conn.sock))
        assert len(sockets) == 1
    finally:
        conn.close()


def test_unknown_paths_are_404_json(fresh: RunningSimulator) -> None:
    for path in ("/metadata/other", "/_sim/nothing", "/vm/bad name/metadata/instance"):
        response = requests.get(fresh.base_url + path, headers=H, timeout=5)
        assert response.status_code == 404
        assert "error" in response.json()


# ---------------------------------------------------------------------------------------------
# The document over time


@pytest.mark.timeout(20)
def test_scenario_timeline_at_high_speed(fresh: RunningSimulator) -> None:
    fresh.load_scenario("live-migration", speed=10)  # 21 scenario s -> 2.1 s
    seen: list[tuple[int, list[tuple[str, str, str]]]] = []
    deadline = time.monotonic() + 6
    with requests.Session() as session:
        while time.monotonic() < deadline:
            doc = session.get(se_url(fresh), headers=H, timeout=5).json()
            events = [(e["EventId"], e["EventStatus"], e["NotBefore"]) for e in doc["Events"]]
            if not seen or seen[-1] != (doc["DocumentIncarnation"], events):
                seen.append((doc["DocumentIncarnation"], events))
            if seen[-1][0] > 1 and not events:
                break
            time.sleep(0.1)
    statuses = [[status for _, status, _ in events] for _, events in seen]
    assert statuses == [["Scheduled"], ["Started"], []]
    incarnations = [incarnation for incarnation, _ in seen]
    assert incarnations == sorted(set(incarnations)), "one bump per change"
    assert {event_id for _, events in seen for event_id, _, _ in events} == {LIVE_MIGRATION_ID}
    not_before = seen[0][1][0][2]
    parsed = email.utils.parsedate_to_datetime(not_before)
    assert not_before.endswith(" GMT") and parsed.tzinfo is not None
    assert abs(parsed.timestamp() - time.time()) < 5  # 15 s / speed 10, seen at most 2 s ago
    assert seen[1][1][0][2] == ""


def test_advance_jumps_scenario_time(fresh: RunningSimulator) -> None:
    assert fresh.document()["Events"][0]["EventStatus"] == "Scheduled"
    state = fresh.advance(15)
    assert state["elapsed"] >= 15
    assert fresh.document()["Events"][0]["EventStatus"] == "Started"
    fresh.advance(10)
    assert fresh.document()["Events"] == []
    with pytest.raises(RuntimeError, match="400"):
        fresh.advance(-1)


def test_a_held_clock_keeps_the_scenario_still_until_it_runs_again(
    fresh: RunningSimulator,
) -> None:
    fresh.advance(10)
    assert fresh.run_clock()["clockHeld"] is False  # running already: nothing changes
    held = fresh.hold_clock()
    assert held["clockHeld"] is True
    assert fresh.hold_clock()["elapsed"] == held["elapsed"]  # held already: nothing changes
    fresh.advance(4.5)  # a jump still moves a held clock (Started is due at 15)
    before = fresh.state()["elapsed"]
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # scenario time stands still while held
        assert fresh.state()["elapsed"] == before
        assert fresh.document()["Events"][0]["EventStatus"] == "Scheduled"
    assert fresh.run_clock()["clockHeld"] is False
    wait_until(
        lambda: fresh.document()["Events"][0]["EventStatus"] == "Started", 10, "time to run on"
    )
    assert fresh.state()["elapsed"] >= 15
    with pytest.raises(RuntimeError, match="400"):
        fresh._call("POST", "/_sim/clock", {"running": "no"})


# ---------------------------------------------------------------------------------------------
# Approvals


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b"{}",
        b'{"StartRequests": {"EventId": "x"}}',
        b'{"StartRequests": [{"Id": "x"}]}',
        b'{"StartRequests": [{"EventId": 42}]}',
        b"",
    ],
)
def test_malformed_post_is_400_and_changes_nothing(fresh: RunningSimulator, body: bytes) -> None:
    before = fresh.document()
    response = requests.post(se_url(fresh), data=body, headers=H, timeout=5)
    assert response.status_code == 400
    assert "error" in response.json()
    assert fresh.document() == before
    (post,) = fresh.posts()
    assert post["status"] == 400 and post["body"] == body.decode("utf-8", errors="replace")


def test_valid_approval_starts_the_event_and_is_recorded(fresh: RunningSimulator) -> None:
    before = fresh.document()
    assert before["Events"][0]["EventStatus"] == "Scheduled"
    with requests.Session() as session:
        unknown = session.post(
            se_url(fresh), data=approve_body("00000000-0000-0000-0000-000000000000"), headers=H
        )
        assert unknown.status_code == 200
        assert fresh.document() == before
        # EventIds compare case-insensitively
        ok = session.post(se_url(fresh), data=approve_body(USER_REBOOT_ID.upper()), headers=H)
        assert ok.status_code == 200
        after = fresh.document()
        event = after["Events"][0]
        assert event["EventId"] == USER_REBOOT_ID
        assert (event["EventStatus"], event["NotBefore"]) == ("Started", "")
        assert after["DocumentIncarnation"] == before["DocumentIncarnation"] + 1
        # approving again (another VM did it already) is still 200 and changes nothing
        again = session.post(se_url(fresh), data=approve_body(USER_REBOOT_ID), headers=H)
        assert again.status_code == 200
        assert fresh.document() == after
    posts = fresh.posts()
    assert [p["status"] for p in posts] == [200, 200, 200]
    assert json.loads(posts[1]["body"]) == {"StartRequests": [{"EventId": USER_REBOOT_ID.upper()}]}
    assert posts[1]["headers"]["Metadata"] == "true" and posts[1]["vm"] is None
    # Started lasts as long as without approval (10 s), then the event is gone
    fresh.advance(9)
    assert fresh.document()["Events"]
    fresh.advance(1.5)
    assert fresh.document()["Events"] == []


def test_vm_prefix_shares_the_timeline_and_names_the_vm(fresh: RunningSimulator) -> None:
    plain = fresh.document()
    assert fresh.document(vm="web-1") == plain
    instance = requests.get(
        fresh.url("/metadata/instance?api-version=2021-02-01", vm="web-1"), headers=H, timeout=5
    ).json()
    assert instance["compute"]["name"] == "web-1"
    response = requests.post(
        se_url(fresh, vm="web-1"), data=approve_body(USER_REBOOT_ID), headers=H, timeout=5
    )
    assert response.status_code == 200
    assert fresh.posts()[0]["vm"] == "web-1"
    assert fresh.document()["Events"][0]["EventStatus"] == "Started"  # one fleet, one timeline
    assert fresh.state()["requests"]["post:web-1"] == 1


# ---------------------------------------------------------------------------------------------
# Instance metadata


def test_instance_metadata(fresh: RunningSimulator) -> None:
    url = fresh.url("/metadata/instance?api-version=2021-02-01")
    doc = requests.get(url, headers=H, timeout=5).json()
    compute = doc["compute"]
    for key in ("name", "vmId", "resourceId", "subscriptionId", "resourceGroupName", "location"):
        assert isinstance(compute[key], str) and compute[key]
    assert compute["resourceId"].startswith(f"/subscriptions/{compute['subscriptionId']}/")
    assert compute["resourceId"].endswith(f"/virtualMachines/{compute['name']}")
    assert {"zone", "vmScaleSetName", "osType", "vmSize"} <= set(compute)
    assert doc["network"]["interface"][0]["ipv4"]["ipAddress"][0]["privateIpAddress"]
    assert requests.get(url, timeout=5).status_code == 400
    bare = fresh.url("/metadata/instance")
    assert requests.get(bare, headers=H, timeout=5).status_code == 400


# ---------------------------------------------------------------------------------------------
# Fault injection at run time


def test_429_burst_with_retry_after(fresh: RunningSimulator) -> None:
    fresh.set_faults({"kind": "429", "count": 2, "retryAfter": 3})
    with requests.Session() as session:
        codes = []
        for _ in range(3):
            response = session.get(se_url(fresh), headers=H, timeout=5)
            codes.append(response.status_code)
            if response.status_code == 429:
                assert response.headers["Retry-After"] == "3"
    assert codes == [429, 429, 200]


def test_5xx_by_count_and_by_seeded_probability(fresh: RunningSimulator) -> None:
    fresh.set_faults({"kind": "5xx", "count": 1, "status": 503})
    assert requests.get(se_url(fresh), headers=H, timeout=5).status_code == 503
    assert requests.get(se_url(fresh), headers=H, timeout=5).status_code == 200

    def run() -> list[int]:
        fresh.set_faults({"kind": "5xx", "probability": 0.5, "seed": 3})
        with requests.Session() as session:
            return [session.get(se_url(fresh), headers=H, timeout=5).status_code for _ in range(20)]

    first = run()
    assert set(first) == {200, 500}
    assert run() == first  # the same seed fails the same requests


def test_hang_holds_the_response(fresh: RunningSimulator) -> None:
    fresh.set_faults({"kind": "hang", "count": 1, "seconds": 1})
    started = time.monotonic()
    response = requests.get(se_url(fresh), headers=H, timeout=5)
    held = time.monotonic() - started
    assert response.status_code == 200 and held >= 0.95
    started = time.monotonic()
    requests.get(se_url(fresh), headers=H, timeout=5)
    assert time.monotonic() - started < 0.5
    # a client with a shorter timeout sees a timeout
    fresh.set_faults({"kind": "hang", "count": 1, "seconds": 2})
    with pytest.raises(requests.Timeout):
        requests.get(se_url(fresh), headers=H, timeout=0.3)


def test_malformed_bodies(fresh: RunningSimulator) -> None:
    fresh.set_faults(
        {"kind": "malformed", "count": 1, "body": "not-json"},
        {"kind": "malformed", "count": 1, "body": "not-document"},
    )
    first = requests.get(se_url(fresh), headers=H, timeout=5)
    assert first.status_code == 200
    with pytest.raises(ValueError):
        first.json()
    second = requests.get(se_url(fresh), headers=H, timeout=5).json()
    assert not isinstance(second.get("Events"), list)
    assert requests.get(se_url(fresh), headers=H, timeout=5).json()["Events"]


def test_connection_reset(fresh: RunningSimulator) -> None:
    fresh.set_faults({"kind": "reset", "count": 1})
    with requests.Session() as session:
        with pytest.raises(requests.ConnectionError):
            session.get(se_url(fresh), headers=H, timeout=5)
        assert session.get(se_url(fresh), headers=H, timeout=5).status_code == 200
    # a real TCP RST, not a polite close
    fresh.set_faults({"kind": "reset", "count": 1})
    with socket.create_connection(("127.0.0.1", fresh.port), timeout=5) as raw:
        raw.sendall(f"GET /metadata/scheduledevents?{API} HTTP/1.1\r\nHost: x\r\n".encode())
        raw.sendall(b"Metadata: true\r\n\r\n")
        with pytest.raises(ConnectionResetError):
            raw.recv(100)


def test_post_faults_then_recovery(fresh: RunningSimulator) -> None:
    fresh.set_faults({"kind": "5xx", "count": 2, "status": 503, "target": "post"})
    assert requests.get(se_url(fresh), headers=H, timeout=5).status_code == 200  # GET unaffected
    codes = [
        requests.post(
            se_url(fresh), data=approve_body(USER_REBOOT_ID), headers=H, timeout=5
        ).status_code
        for _ in range(3)
    ]
    assert codes == [503, 503, 200]
    assert [p["status"] for p in fresh.posts()] == [503, 503, 200]
    assert fresh.document()["Events"][0]["EventStatus"] == "Started"


def test_4xx_refuses_a_well_formed_post(fresh: RunningSimulator) -> None:
    fresh.set_faults({"kind": "4xx", "target": "post"})
    assert requests.get(se_url(fresh), headers=H, timeout=5).status_code == 200  # GET unaffected
    refused = requests.post(se_url(fresh), data=approve_body(USER_REBOOT_ID), headers=H, timeout=5)
    assert refused.status_code == 400 and "Bad request" in refused.json()["error"]
    assert fresh.document()["Events"][0]["EventStatus"] == "Scheduled"  # nothing started
    ok = requests.post(se_url(fresh), data=approve_body(USER_REBOOT_ID), headers=H, timeout=5)
    assert ok.status_code == 200
    assert [p["status"] for p in fresh.posts()] == [400, 200]
    fresh.set_faults({"kind": "4xx", "status": 404, "target": "post"})
    assert requests.post(se_url(fresh), data=b"{}", headers=H, timeout=5).status_code == 404


def test_first_call_delay_set_at_run_time(fresh: RunningSimulator) -> None:
    fresh.set_faults(first_call_delay=1.0)
    started = time.monotonic()
    assert requests.get(se_url(fresh), headers=H, timeout=5).status_code == 200
    assert time.monotonic() - started >= 0.95
    started = time.monotonic()
    requests.get(se_url(fresh), headers=H, timeout=5)
    assert time.monotonic() - started < 0.5


def test_bad_fault_request_is_400(fresh: RunningSimulator) -> None:
    for body in ('{"rules": [{"kind": "boom"}]}', "[1]", "nope", '{"rulez": []}'):
        response = requests.post(fresh.base_url + "/_sim/faults", data=body, timeout=5)
        assert response.status_code == 400 and "error" in response.json()
    assert requests.get(se_url(fresh), headers=H, timeout=5).status_code == 200


# ---------------------------------------------------------------------------------------------
# Test control


def test_event_injection(fresh: RunningSimulator) -> None:
    new_id = "AbCdEf01-2345-6789-abcd-ef0123456789"
    incarnation = fresh.document()["DocumentIncarnation"]
    fresh.event(
        "add",
        event={"EventId": new_id, "EventType": "Freeze", "Resources": ["vmss_vm1"]},
        notBeforeIn=60,
    )
    doc = fresh.document()
    assert [e["EventId"] for e in doc["Events"]] == [USER_REBOOT_ID, new_id]
    assert doc["DocumentIncarnation"] == incarnation + 1
    fresh.event("update", eventId=new_id.lower(), set={"Resources": ["a", "b"]})
    fresh.event("remove", eventId=new_id)
    assert [e["EventId"] for e in fresh.document()["Events"]] == [USER_REBOOT_ID]
    assert fresh.document()["DocumentIncarnation"] == incarnation + 3
    with pytest.raises(RuntimeError, match="400"):
        fresh.event("start", eventId=new_id)


def test_load_scenario_and_reset(fresh: RunningSimulator) -> None:
    state = fresh.load_scenario("hardware-failure", speed=2)
    assert state["scenario"] == "hardware-failure" and state["speed"] == 2
    assert fresh.document()["Events"][0]["EventStatus"] == "Started"
    requests.post(se_url(fresh), data=approve_body("x"), headers=H, timeout=5)
    assert fresh.posts()
    fresh.set_faults({"kind": "429", "count": 5})
    fresh.reset()
    assert fresh.posts() == [] and fresh.state()["faults"] == []
    with pytest.raises(RuntimeError, match="unknown scenario"):
        fresh.load_scenario("no-such-scenario")
    assert fresh.state()["scenario"] == "hardware-failure"  # a bad load changes nothing


# ---------------------------------------------------------------------------------------------
# Command line


def test_command_line_flags_and_clean_sigterm() -> None:
    args = [
        "--no-instance-metadata",
        "--first-call-delay",
        "0.7",
        "--fault",
        "429:count=1,retryAfter=2",
        "--start-on-first-poll",
    ]
    with running_simulator("terminate", speed=5, extra_args=args) as running:
        url = se_url(running)
        assert running.state()["elapsed"] == 0  # clock waits for the first poll
        started = time.monotonic()
        first = requests.get(url, headers=H, timeout=5)
        assert time.monotonic() - started >= 0.65
        assert first.status_code == 429 and first.headers["Retry-After"] == "2"
        doc = requests.get(url, headers=H, timeout=5).json()
        assert doc["Events"][0]["EventType"] == "Terminate"
        instance = requests.get(
            running.url("/metadata/instance?api-version=2021-02-01"), headers=H, timeout=5
        )
        assert instance.status_code == 404
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=5) == 0
        assert "stopping" in running.stderr_text()


def test_bad_scenario_file_fails_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "name": "bad",
                "description": "x",
                "provenance": "x",
                "events": [],
                "expect": [{"transition": "Started", "eventId": "x"}],
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "sebridge.cli", "imds-sim", "--scenario", str(bad), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "bad scenario" in result.stderr and "does not match" in result.stderr


def test_list_prints_every_scenario() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sebridge.cli", "imds-sim", "--list"],
        capture_output=True,
        text=True,
        timeout=15,
        check=True,
    )
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert "live-migration" in names and "incarnation-reset" in names
    assert "INVALID" not in result.stdout


def test_in_process_variant() -> None:
    with in_process_simulator("canceled-maintenance", speed=4) as client:
        doc: dict[str, Any] = requests.get(
            client.scheduled_events_url + f"?{API}", headers=H, timeout=5
        ).json()
        assert doc["Events"][0]["EventId"] == "42f3aaf6-5f4a-4eb7-9ff4-23b31c28545e"
        client.advance(8)
        assert client.document()["Events"] == []
