"""/metrics and /healthz of the forwarder (issue 14, item 1), scraped over HTTP.

The loop runs in-process with the real ImdsClient against the IMDS simulator (faults
included), the real outbox, the real approval handler, the telemetry wired by the same
function main() uses, and the metrics server on a loopback port; the broker and the state
store are the recording fakes that can fail on demand. The exposition is parsed with
prometheus-client's own text parser.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from emulators.imds.testing import SimClient, in_process_simulator
from sebridge.contract.commands import approve_command
from sebridge.contract.events import Observer
from sebridge.forwarder.approvals.handler import CommandHandler
from sebridge.forwarder.config import ForwarderConfig
from sebridge.forwarder.delivery.outbox import Outbox
from sebridge.forwarder.imds.client import ImdsClient
from sebridge.forwarder.local.actions import LocalActions, LocalSettings, build_local_actions
from sebridge.forwarder.observability.health import Health
from sebridge.forwarder.observability.metrics import Metrics, MetricsServer
from sebridge.forwarder.observability.observations import Observations
from sebridge.forwarder.observability.telemetry import MetricsError, install_telemetry
from sebridge.forwarder.ports import PublishError
from sebridge.forwarder.service import Forwarder
from tests.forwarder.local_support import (
    OBSERVER,
    Recorder,
    document,
    imds_event,
    root_dir,
    script,
    write_hooks,
)
from tests.support.forwarder_fakes import FakeBroker, FakeStore
from tests.support.root import skip_unless_root
from tests.support.waiting import wait_until

IDLE = str(Path(__file__).resolve().parents[2] / "benchmarks" / "idle-scenario.json")
pytestmark = pytest.mark.timeout(120)


def get(port: int, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(port, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def reboot(event_id: str) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vmss_vm1"],
        "EventStatus": "Scheduled",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


class Rig:
    def __init__(
        self, sim: SimClient, state_dir: Path, port: int, local: LocalActions | None = None
    ) -> None:
        self.sim = sim
        self.stop = threading.Event()
        self.imds = ImdsClient(sim.base_url, cancel=self.stop)
        self.store = FakeStore()
        self.broker = FakeBroker(batch=10)
        self.outbox = Outbox(state_dir)
        self.forwarder = Forwarder(
            imds=self.imds,
            store=self.store,
            outbox=self.outbox,
            publisher=self.broker,
            heartbeat_interval=0,
            stop_event=self.stop,
            fallback_observer=lambda: Observer(vm_name="vmss_vm1"),
        )
        config = replace(
            ForwarderConfig(), state_dir=state_dir, metrics_port=port, poll_interval=1.0
        )
        self.telemetry = install_telemetry(self.forwarder, config, self.stop, local=local)
        workers = self.telemetry.workers + (local.workers(self.stop) if local else ())
        self.threads = [threading.Thread(target=w, daemon=True) for w in workers]
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.imds.close()
        self.outbox.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with in_process_simulator(IDLE) as sim:
        rig = Rig(sim, tmp_path, 0)  # the server binds port 0 and reports the one it got
        try:
            yield rig
        finally:
            rig.close()


def test_each_metric_after_a_scripted_scenario_with_faults(rig: Rig) -> None:
    sim, fw, broker = rig.sim, rig.forwarder, rig.broker
    port = rig.telemetry.server.address[1]  # type: ignore[union-attr]
    first = str(uuid.uuid4())
    second = str(uuid.uuid4())

    assert fw.tick() is None  # ok, empty
    sim.event("add", event=reboot(first), notBeforeIn=600)
    sim.event("add", event=reboot(second), notBeforeIn=600)
    assert fw.tick() is None  # 2 x Scheduled
    assert fw.send_pending() == 2
    sim.set_faults({"kind": "429", "count": 1}, {"kind": "5xx", "count": 1}, append=False)
    assert fw.tick() is not None  # throttled
    assert fw.tick() is not None  # 5xx: unavailable
    sim.event("update", eventId=first, notBeforeIn=900)
    assert fw.tick() is None  # Updated
    broker.fail_next = 1
    with pytest.raises(PublishError):
        fw.send_pending()
    assert fw.send_pending() == 1
    broker.refuse = lambda e: "larger than the entity allows" if e.subject == "Started" else None
    sim.event("start", eventId=first)
    assert fw.tick() is None  # Started
    assert fw.send_pending() == 0  # set aside
    broker.refuse = lambda _: None
    sim.event("remove", eventId=first)
    assert fw.tick() is None  # Completed
    assert fw.send_pending() == 2  # and this VM's Measured

    # Approval commands, as the approvals receiver settles them (approvals.py).
    handler = CommandHandler(fw, rig.imds)
    expires = datetime.now(UTC) + timedelta(minutes=5)
    good = approve_command(second, "ops@example.com", "window", expires)
    outcome = handler.handle(good.body_bytes(), good.message_id)
    assert outcome.action == "complete"
    fw.command_settled(good.message_id, outcome.action, outcome.reason)
    bad = handler.handle(b"{not json", "approve:junk")
    assert bad.action == "dead-letter"
    fw.command_settled("approve:junk", bad.action, bad.reason)
    assert fw.tick() is None  # the gauges follow the poll tick
    sent_before_scrape = len(broker.accepted)
    # The simulator starts an approved event: that tick may have seen it Started.
    pending = [e.subject for _, e in rig.outbox.peek(100)]
    assert pending in (["Approved"], ["Approved", "Started"])

    m = scrape(port)
    assert value(m, "sebridge_forwarder_polls_total", result="ok") == 6
    assert value(m, "sebridge_forwarder_polls_total", result="throttled") == 1
    assert value(m, "sebridge_forwarder_polls_total", result="unavailable") == 1
    assert value(m, "sebridge_forwarder_polls_total", result="refused") == 0
    assert value(m, "sebridge_forwarder_imds_request_seconds_count") == 8
    assert value(m, "sebridge_forwarder_imds_request_seconds_bucket", le="+Inf") == 8
    assert 0 < value(m, "sebridge_forwarder_imds_request_seconds_sum") < 8 * 10
    for transition, count in (
        ("Scheduled", 2),
        ("Updated", 1),
        ("Started", pending.count("Started") + 1),
        ("Completed", 1),
        ("Cancelled", 0),
    ):
        assert value(m, "sebridge_forwarder_transitions_total", transition=transition) == count
    # ok: 2 Scheduled, Updated, [Started refused], Completed with its Measured, Approved (sent
    # by the next send_pending: not yet) -> 3 ok calls (5 messages); 1 failed; 1 refused.
    assert value(m, "sebridge_forwarder_publish_attempts_total", result="ok") == 3
    assert value(m, "sebridge_forwarder_publish_attempts_total", result="failed") == 1
    assert value(m, "sebridge_forwarder_publish_attempts_total", result="refused") == 1
    assert value(m, "sebridge_forwarder_messages_sent_total") == sent_before_scrape == 5
    assert value(m, "sebridge_forwarder_outbox_depth") == len(pending)
    assert value(m, "sebridge_forwarder_messages_set_aside") == 1
    assert value(m, "sebridge_forwarder_approval_commands_total", outcome="complete") == 1
    assert value(m, "sebridge_forwarder_approval_commands_total", outcome="dead-letter") == 1
    assert value(m, "sebridge_forwarder_approval_commands_total", outcome="abandon") == 0
    now = datetime.now(UTC).timestamp()
    last_poll = value(m, "sebridge_forwarder_last_successful_poll_timestamp_seconds")
    last_send = value(m, "sebridge_forwarder_last_successful_send_timestamp_seconds")
    assert now - 30 < last_poll <= now and now - 30 < last_send <= last_poll
    assert value(m, "sebridge_forwarder_healthy") == 1
    info = [k for k in m if k[0] == "sebridge_forwarder_build_info"]
    assert len(info) == 1 and dict(info[0][1])["version"]
    # Bounded label sets: no EventId and no VM name anywhere in the exposition.
    text = get(port, "/metrics")[1].lower()
    assert first not in text and second not in text and "vmss_vm1" not in text


def test_healthz_ok_then_503_with_the_reason_when_the_state_cannot_be_saved(rig: Rig) -> None:
    port = rig.telemetry.server.address[1]  # type: ignore[union-attr]
    status, body = get(port, "/healthz")
    assert status == 503 and "no successful poll" in json.loads(body)["reasons"][0]
    assert rig.forwarder.tick() is None
    status, body = get(port, "/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    rig.store.fail_next = 1000
    rig.sim.event("add", event=reboot(str(uuid.uuid4())), notBeforeIn=600)
    assert rig.forwarder.tick() is None
    status, body = get(port, "/healthz")
    answer = json.loads(body)
    assert status == 503 and answer["status"] == "unhealthy"
    assert any("state file cannot be saved" in r for r in answer["reasons"])
    assert value(scrape(port), "sebridge_forwarder_healthy") == 0
    rig.store.fail_next = 0
    assert rig.forwarder.tick() is None
    assert get(port, "/healthz")[0] == 200
    assert get(port, "/other")[0] == 404


def test_healthz_turns_503_when_the_last_successful_poll_gets_old() -> None:
    moment = [datetime(2026, 1, 1, tzinfo=UTC)]
    observations = Observations(poll_interval=1.0, now=lambda: moment[0])
    server = MetricsServer(Metrics(observations), "127.0.0.1", 0)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        port = server.address[1]
        observations.polled(Health(last_successful_poll=moment[0], polls=1))
        moment[0] += timedelta(seconds=29)
        assert get(port, "/healthz")[0] == 200
        moment[0] += timedelta(seconds=2)
        status, body = get(port, "/healthz")
        assert status == 503
        assert json.loads(body)["reasons"] == ["last successful poll 31 s ago (limit 30 s)"]
        # A sender failing for a short while is absorbed by the outbox; for 5 minutes, not.
        observations.polled(Health(last_successful_poll=moment[0], polls=2))
        observations.publish_attempt("failed", 0)
        moment[0] += timedelta(seconds=20)
        assert get(port, "/healthz")[0] == 200
        observations.polled(Health(last_successful_poll=moment[0] - timedelta(seconds=1)))
        moment[0] += timedelta(seconds=290)
        observations.polled(Health(last_successful_poll=moment[0], polls=3))
        status, body = get(port, "/healthz")
        assert status == 503 and "sending to Service Bus failing" in body
        observations.publish_attempt("ok", 1)
        assert get(port, "/healthz")[0] == 200
    finally:
        stop.set()
        thread.join(5)


def test_a_taken_port_is_a_clear_error_and_other_addresses_are_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(MetricsError, match=f"127.0.0.1:{port}"):
            MetricsServer(Metrics(Observations()), "127.0.0.1", port)
    server = MetricsServer(Metrics(Observations()), "0.0.0.0", 0)
    server.close()
    assert any(
        r.levelname == "WARNING" and "not a loopback address" in r.getMessage()
        for r in caplog.records
    )


def test_hook_runs_and_the_drain_probe_are_counted_when_local_actions_run(tmp_path: Path) -> None:
    """Real hooks (a shell script that exits 0, one that exits 3, one killed at its timeout) and
    the drain probe, wired by install_telemetry as main() wires them; /metrics counts each
    hook's runs by outcome (every outcome has a series from the start) and says when the probe
    drains."""
    skip_unless_root("a hooks file must be root-owned")
    etc = root_dir(tmp_path)
    hooks = write_hooks(
        etc,
        [
            {"name": "ok", "on": ["Scheduled"], "command": [script(etc, "ok.sh", "exit 0")]},
            {"name": "bad", "on": ["Scheduled"], "command": [script(etc, "bad.sh", "exit 3")]},
            {
                "name": "slow",
                "on": ["Scheduled"],
                "command": [script(etc, "slow.sh", "exec sleep 30")],
                "timeoutSeconds": 0.5,
            },
        ],
    )
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    settings = LocalSettings(
        hooks_file=hooks, probe_port=0, probe_address="127.0.0.1", drain_seconds=60
    )
    local = build_local_actions(settings, state_dir, Recorder())
    assert local is not None and local.probe is not None and local.hooks is not None
    with in_process_simulator(IDLE) as sim:
        rig = Rig(sim, state_dir, 0, local)
        try:
            port = rig.telemetry.server.address[1] if rig.telemetry.server else 0
            before = scrape(port)
            for hook in ("ok", "bad", "slow"):
                for outcome in ("succeeded", "failed", "timed-out", "skipped"):
                    assert (
                        value(
                            before, "sebridge_forwarder_hook_runs_total", hook=hook, outcome=outcome
                        )
                        == 0
                    )
            assert value(before, "sebridge_forwarder_drain_probe_draining") == 0
            event = imds_event("aaaaaaaa-0000-4000-8000-00000000000a", event_type="Redeploy")
            now = datetime.now(UTC)
            local.document_observed(document(event), OBSERVER, now)
            probe_port = local.probe.address[1]
            assert get(probe_port, "/")[0] == 503
            wait_until(lambda: local.hooks is not None and local.hooks.pending() == 0, 20, "hooks")
            after = scrape(port)
            assert (
                value(after, "sebridge_forwarder_hook_runs_total", hook="ok", outcome="succeeded")
                == 1
            )
            assert (
                value(after, "sebridge_forwarder_hook_runs_total", hook="bad", outcome="failed")
                == 1
            )
            assert (
                value(after, "sebridge_forwarder_hook_runs_total", hook="slow", outcome="timed-out")
                == 1
            )
            assert (
                value(after, "sebridge_forwarder_hook_runs_total", hook="ok", outcome="failed") == 0
            )
            assert value(after, "sebridge_forwarder_hooks_pending") == 0
            assert value(after, "sebridge_forwarder_drain_probe_draining") == 1
            assert value(after, "sebridge_forwarder_drain_probe_answers_total", status="503") == 1
            local.document_observed(document(), OBSERVER, now)
            assert get(probe_port, "/")[0] == 200
            done = scrape(port)
            assert value(done, "sebridge_forwarder_drain_probe_draining") == 0
            assert value(done, "sebridge_forwarder_drain_probe_answers_total", status="200") == 1
        finally:
            rig.close()
            local.close()
