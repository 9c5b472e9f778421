"""Session triggers wait for the next session like the extension: one accept per idle thread.

Issue 17: accepts of 2 s made every idle session thread open a new connection every 2 s
(64 threads for the Function App: ~30 connection set-ups a second), which kept the host busy
and delayed new sessions. Now an accept waits clientRetryOptions.tryTimeout (1 minute by
default) on the broker, a session that gets messages is handed to a waiting accept, and stop()
closes the waiting accepts so the host still stops at once. Against the real emulator.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from apps import sb_app
from apps import sb_blueprint as recorded
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from conftest import HERE

from emulators.functions_host.host import FunctionsHost
from emulators.functions_host.hostconfig import HostConfig, ServiceBusOptions
from tests.support.http_peers import HttpPeer, Style
from tests.support.waiting import wait_until

testing = pytest.importorskip("emulators.servicebus.testing")

CONFIG = HERE / "emulator-config.json"
TOPIC = "fh-events"
SESSIONS = 2
OPTIONS = ServiceBusOptions(
    max_concurrent_calls=1,
    max_concurrent_sessions=SESSIONS,
    session_idle_timeout=dt.timedelta(seconds=1),
)  # try_timeout: the default, 1 minute


@pytest.fixture(scope="module")
def emulator() -> Iterator[Any]:
    with testing.running_emulator(CONFIG) as running:
        yield running


class AcceptCounter:
    """Counts the session receivers the host asks the SDK for (then lets the SDK build them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        real = ServiceBusClient.get_subscription_receiver

        def counting(client: ServiceBusClient, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("session_id") is not None:
                with self.lock:
                    self.calls += 1
            return real(client, *args, **kwargs)

        monkeypatch.setattr(ServiceBusClient, "get_subscription_receiver", counting)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_idle_session_threads_wait_in_one_accept_and_stop_at_once(
    emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    accepts = AcceptCounter(monkeypatch)
    recorded.ordered.clear()
    settings = {"FhServiceBus": emulator.connection_string, "FhTopicName": TOPIC}
    host = FunctionsHost(
        sb_app, settings, host_config=HostConfig(service_bus=OPTIONS), functions=["ordered"]
    ).start()
    stopped_in: float | None = None
    try:
        time.sleep(6.0)  # three of the old 2 s accept periods
        # One waiting accept per thread, none renewed (the old loop: ~3 per thread by now).
        assert accepts.calls == SESSIONS
        with (
            ServiceBusClient.from_connection_string(emulator.connection_string) as client,
            client.get_topic_sender(TOPIC) as sender,
        ):
            sender.send_messages(
                ServiceBusMessage(
                    "new:0", session_id="new", application_properties={"kind": "ordered"}
                )
            )
        # A waiting accept takes the new session (a generous bound: it is ~0.1 s).
        assert recorded.ordered.wait_for(1, timeout=10) == [("new", "new:0")]
    finally:
        started = time.monotonic()
        host.stop()
        stopped_in = time.monotonic() - started
    # Threads waiting up to a minute in an accept do not hold the stop up.
    assert stopped_in < 5.0, f"stop took {stopped_in:.1f} s"


def keep_alive_threads() -> list[threading.Thread]:
    """The SDK's keep-alive threads (pyamqp's AMQPClient._keep_alive) alive now."""
    return [
        t
        for t in threading.enumerate()
        if getattr(getattr(t, "_target", None), "__name__", "") == "_keep_alive"
    ]


@pytest.mark.timeout(60)
def test_released_sessions_leave_no_keep_alive_thread_to_wait_for(emulator: Any) -> None:
    """With prefetch 0 the SDK starts a keep-alive thread per receiver that sleeps in 1 s steps
    and close() joins it: every released session cost its thread up to a second before the
    next accept (the burst benchmark's second round of sessions started ~1 s late). The host's
    receivers run without it, so three sessions on one slot follow each other at the pace of
    sessionIdleTimeout, not a second more each."""
    recorded.ordered.clear()
    settings = {"FhServiceBus": emulator.connection_string, "FhTopicName": TOPIC}
    options = ServiceBusOptions(
        max_concurrent_calls=1,
        max_concurrent_sessions=1,
        session_idle_timeout=dt.timedelta(seconds=0.2),
    )
    before = set(keep_alive_threads())
    host = FunctionsHost(
        sb_app, settings, host_config=HostConfig(service_bus=options), functions=["ordered"]
    ).start()
    try:
        with (
            ServiceBusClient.from_connection_string(emulator.connection_string) as client,
            client.get_topic_sender(TOPIC) as sender,
        ):
            for name in ("k1", "k2", "k3"):
                sender.send_messages(
                    ServiceBusMessage(
                        f"{name}:0", session_id=name, application_properties={"kind": "ordered"}
                    )
                )
        got = recorded.ordered.wait_for(3, timeout=20)
        assert sorted(got) == [("k1", "k1:0"), ("k2", "k2:0"), ("k3", "k3:0")]
        assert set(keep_alive_threads()) - before == set()
    finally:
        host.stop()


@pytest.mark.timeout(60)
def test_stop_does_not_wait_for_accepts_a_silent_broker_holds() -> None:
    """A broker that takes the connection and never speaks (stopped, or a dead proxy): the
    threads waiting in an accept sit in the SDK's handshake, where closing their client does
    not end the read. stop() still returns at once: they hold no message (review a31: 10 s,
    the whole grace, and the threads stuck a minute on)."""
    # Waits for an HTTP request head that an AMQP client never sends: silent, connection held.
    with HttpPeer(lambda request: (200, b""), Style(answer=False)) as silent:
        port = silent.url.rsplit(":", 1)[1]
        settings = {
            "FhServiceBus": f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessKeyName=k;"
            "SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true",
            "FhTopicName": TOPIC,
        }
        host = FunctionsHost(
            sb_app, settings, host_config=HostConfig(service_bus=OPTIONS), functions=["ordered"]
        ).start()
        wait_until(lambda: silent.connections >= SESSIONS, 20, "the accepts to reach the broker")
        time.sleep(0.5)  # in the handshake now
        started = time.monotonic()
        host.stop()
        stopped_in = time.monotonic() - started
    assert stopped_in < 3.0, f"stop took {stopped_in:.1f} s"
